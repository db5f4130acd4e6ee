//! `dump`: one snapshot of every thread of a running process ([`dump`]), or of every
//! Python process of a process tree ([`dump_tree`], `--subprocesses`).
//!
//! Owns: [`DumpConfig`], the reader each read needs (native modules, asyncio), whether
//! greenlets that were required were read, and which processes of a tree are read:
//! - every process among the root and its descendants that runs Python, parents first;
//! - a process that is not Python (a shell, `sleep`, a PyInstaller bootloader) is left
//!   out, and so is one that ends before it is read;
//! - a Python process that cannot be read (no permission, an unsupported version) is
//!   kept, with why.
//!
//! Must not: format the snapshot (the caller does).

use crate::error::{Error, Result};
use crate::native::NativeCache;
use crate::python::{
    self, LocateOptions, ProcessSnapshot, PythonProcess, PythonReader, Snapshot, SnapshotOptions,
    TreeSnapshot,
};

/// What `dump` reads.
pub struct DumpConfig {
    pub pid: i32,
    /// Native frames too (`--native`), so the threads are paused whatever `snapshot.mode`
    /// says.
    pub native: bool,
    /// Every event loop's asyncio tasks too (`--async`; not with `native`).
    pub tasks: bool,
    /// `--greenlets`: every greenlet must be read (an error where greenlet is not imported
    /// or cannot be read). Whether they are read at all is `snapshot.greenlets`.
    pub greenlets_required: bool,
    pub locate: LocateOptions,
    pub snapshot: SnapshotOptions,
    /// Python frames per stack at most.
    pub max_depth: usize,
    /// With `native`, native frames per stack at most.
    pub max_native_depth: usize,
}

/// `dump`: one snapshot of every thread of process `cfg.pid`.
pub fn dump(cfg: &DumpConfig) -> Result<Snapshot> {
    if cfg.pid <= 0 {
        return Err(Error::NoSuchProcess(cfg.pid));
    }
    let proc = PythonProcess::locate(cfg.pid, &cfg.locate)?;
    read(cfg, proc, &mut NativeCache::new()).map(|(s, _)| s)
}

/// One snapshot of `proc` as `cfg` asks, and the reader that took it.
fn read(
    cfg: &DumpConfig,
    proc: PythonProcess,
    cache: &mut NativeCache,
) -> Result<(Snapshot, PythonReader)> {
    let pid = proc.pid;
    let mut reader = PythonReader::new(proc);
    reader.walker_mut().max_depth = cfg.max_depth;
    if cfg.native {
        let mut native = python::native_process(reader.process(), cache)?;
        native.set_max_frames(cfg.max_native_depth);
        reader.set_native(Some(native));
    } else if cfg.tasks {
        if let Some(why) = python::async_unsupported(reader.process().layout.version) {
            return Err(Error::NoAsync { pid, why });
        }
        reader = reader.with_tasks(python::AsyncReader::new());
    }
    let snapshot = reader.snapshot(&cfg.snapshot)?;
    if cfg.greenlets_required {
        match &snapshot.greenlets {
            None => return Err(Error::GreenletNotImported(pid)),
            Some(g) if g.greenlets.is_empty() => {
                if let Some(why) = &g.error {
                    let why = why.clone();
                    return Err(Error::NoGreenlets { pid, why });
                }
            }
            Some(_) => {}
        }
    }
    Ok((snapshot, reader))
}

/// `dump --subprocesses`: a snapshot of each Python process among `cfg.pid` and its
/// descendants (see the module's doc for which). The root need not be Python.
///
/// An error only when there is nothing to show:
/// - no such process;
/// - no Python process in the tree ([`Error::NotPython`]);
/// - or none that could be read (the first one's error).
pub fn dump_tree(cfg: &DumpConfig) -> Result<TreeSnapshot> {
    if cfg.pid <= 0 || !crate::proc::process_exists(cfg.pid) {
        return Err(Error::NoSuchProcess(cfg.pid));
    }
    let pids = crate::proc::descendants(cfg.pid);
    let others = pids.len() - 1;
    let mut cache = NativeCache::new();
    // Readers of the processes read, by image, because a child forked without an exec is its
    // parent's interpreter at the same addresses (no ELF file parsed again per worker).
    let mut located: Vec<(String, PythonReader)> = Vec::new();
    let mut processes = Vec::new();
    let mut root_not_python = None;
    let mut first_error = None;
    let mut root_gone = None;
    for pid in pids {
        // Gone since the listing, or caught mid-exec.
        let Some(image) = crate::proc::image_of(pid) else {
            continue;
        };
        let proc = match located.iter().find(|(i, _)| *i == image) {
            Some((_, parent)) => parent.process().forked(pid),
            None => PythonProcess::locate(pid, &cfg.locate),
        };
        let entry = |read| ProcessSnapshot {
            pid,
            parent: crate::proc::parent(pid),
            command: crate::proc::command_line(pid),
            executable: crate::proc::exe_path(pid).unwrap_or_default(),
            read,
        };
        match proc.and_then(|p| read(cfg, p, &mut cache)) {
            Ok((snapshot, reader)) => {
                processes.push(entry(Ok(snapshot)));
                located.push((image, reader));
            }
            Err(e) if e.is_process_gone() => {
                if pid == cfg.pid {
                    root_gone = Some(e);
                }
            }
            Err(Error::NotPython { exe, .. }) => {
                if pid == cfg.pid {
                    root_not_python = Some(exe);
                }
            }
            Err(e) => {
                processes.push(entry(Err(e.to_string())));
                first_error.get_or_insert(e);
            }
        }
    }
    if processes.iter().all(|p| p.read.is_err()) {
        if let Some(e) = first_error.or(root_gone) {
            return Err(e);
        }
        return Err(match root_not_python {
            Some(exe) => Error::NotPython {
                pid: cfg.pid,
                exe,
                why: match others {
                    0 => "it runs no Python and has no descendants".to_string(),
                    1 => "neither it nor its one descendant runs Python".to_string(),
                    n => format!("neither it nor any of its {n} descendants runs Python"),
                },
            },
            None => Error::ProcessExited(cfg.pid),
        });
    }
    Ok(TreeSnapshot {
        root: cfg.pid,
        root_not_python,
        processes,
    })
}
