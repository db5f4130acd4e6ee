//! `dump --core`: every thread's stack of a process that is gone, from its core file.
//!
//! Owns: [`CoreDumpConfig`], [`dump_core`] (the core opened, its interpreter found, its
//! threads read by the same reader as a live process's), and the core's
//! [`CoreSummary`], the crash's addresses named from the process's files.
//! Must not: format the result (the caller does), or read /proc (the process is gone; a
//! process of the same pid now is another).

use crate::coredump::{Core, CoreOptions, CoreSummary, Place};
use crate::error::Result;
use crate::native::{NativeCache, NativeProcess};
use crate::python::SnapshotOptions;
use crate::python::{LocateOptions, PythonProcess, PythonReader, SavedThread, Snapshot};
use std::path::PathBuf;

/// What `dump --core` reads.
pub struct CoreDumpConfig {
    /// The core file.
    pub core: PathBuf,
    /// Where the process's files are (`--executable`, `--lib-root`).
    pub files: CoreOptions,
    pub locate: LocateOptions,
    /// Python frames per stack at most.
    pub max_depth: usize,
    /// Native frames too (`--native`), merged with the Python ones.
    pub native: bool,
    /// With `native`, native frames per stack at most.
    pub max_native_depth: usize,
    /// Each frame's locals too (`--locals`), read from the core's memory as from a live
    /// process's.
    pub locals: Option<crate::python::locals::LocalsOptions>,
}

/// The result of `dump --core`.
pub struct CoreDump {
    pub snapshot: Snapshot,
    pub core: CoreSummary,
    /// What was said of the process's files: one not found, one whose build id differs
    /// from the core's (never read), one whose build id the core does not hold.
    pub warnings: Vec<String>,
}

/// `dump --core`: the stacks of every thread of the process `cfg.core` is a core of.
pub fn dump_core(cfg: &CoreDumpConfig) -> Result<CoreDump> {
    let core = Core::open(&cfg.core, &cfg.files)?;
    let proc = PythonProcess::from_core(&core, &cfg.locate)?;
    let mut reader = PythonReader::new(proc);
    reader.walker_mut().max_depth = cfg.max_depth;
    let threads: Vec<SavedThread> = core
        .threads
        .iter()
        .map(|t| SavedThread {
            tid: t.tid,
            in_syscall: core.in_syscall(t),
            // The core names the main thread only (`pr_fname`).
            name: (t.tid == core.pid).then(|| core.name.clone()).flatten(),
        })
        .collect();
    let mut captures = Vec::new();
    if cfg.native {
        let mem = core.memory();
        let maps = core.maps_with_code();
        let mut native =
            NativeProcess::from_saved(core.pid, maps, &*mem, &core.files, &mut NativeCache::new());
        native.set_max_frames(cfg.max_native_depth);
        reader.set_native(Some(native));
        captures = core
            .threads
            .iter()
            .map(|t| (t.tid, capture(&core, t, &*mem)))
            .collect();
    }
    let opts = SnapshotOptions {
        locals: cfg.locals,
        ..SnapshotOptions::default()
    };
    let snapshot = reader.snapshot_saved(&threads, &opts, captures)?;
    let mut crash = core.crash();
    if let Some(c) = crash.as_mut() {
        c.pc_place = c.pc.and_then(|a| place(&core, a));
        c.address_place = c.address.and_then(|a| place(&core, a));
    }
    Ok(CoreDump {
        snapshot,
        core: CoreSummary {
            file: core.path.clone(),
            format: core.format,
            name: core.name.clone(),
            command: core.command.clone(),
            crash,
        },
        warnings: core.take_warnings(),
    })
}

/// Thread `t`'s registers and stack as the core saved them.
fn capture(
    core: &Core,
    t: &crate::coredump::ThreadNote,
    mem: &dyn crate::ptrace::ProcessMemory,
) -> std::result::Result<crate::native::Capture, String> {
    #[cfg(target_arch = "x86_64")]
    if core.is_x86_64() {
        return crate::native::saved_capture(&t.regs, mem);
    }
    let _ = (core, t, mem);
    Err("native stacks of this machine's cores are not read yet".into())
}

/// What `addr` is in: the module (a file the process had mapped) and the symbol covering
/// it, from the file found for it (checked by build id); None outside every file.
fn place(core: &Core, addr: u64) -> Option<Place> {
    let m = core
        .maps
        .iter()
        .find(|m| m.start <= addr && addr < m.end && m.path.is_some())?;
    let path = m.path.as_deref()?;
    let module = Some(crate::elf::maps::basename(path).to_string());
    let Ok(file) = core.file(path) else {
        return Some(Place {
            symbol: None,
            module,
            offset: None,
        });
    };
    let named = crate::native::name_in_file(&file.host_path, &core.maps, path, addr);
    Some(Place {
        symbol: named.as_ref().and_then(|(s, _)| s.clone()),
        module,
        offset: named.map(|(_, svma)| svma),
    })
}
