//! Asyncio tasks of a live process: which task each thread's event loop runs, every task's
//! coroutine stack, what it awaits and which tasks await it.
//!
//! CPython 3.14+ describes its tasks for outside readers:
//! - the `_asyncio` module carries the offsets of its task object and of the task lists in
//!   a section `.AsyncioDebug` (in `_asyncio`'s own shared object on 3.14, in the
//!   interpreter's binary on 3.15);
//! - every task of a thread is on a list that starts in that thread's state (those of
//!   threads that ended on one in the interpreter's state);
//! - a task records who awaits it (`awaited_by`: one task or a set of them, kept by `Task`,
//!   `gather` and `TaskGroup`).
//!
//! A suspended coroutine's frame lives inside the coroutine object. What it awaits is the
//! value on top of that frame's stack (one slot below the stack pointer on 3.14, two on
//! 3.15).
//!
//! 3.11–3.13 keep their tasks in containers of the `_asyncio` module instead, and record
//! only what a task waits for. `asyncio_legacy` reads those into the same snapshot.
//!
//! Owns: [`AsyncReader`] (finding the section, once it is loaded, and reading the graph).
//! The snapshot it fills, [`AsyncSnapshot`] (what `dump --async` prints and what a sample
//! is charged to), lives in `tasks`, shared with `asyncio_legacy`.
//! Must not: pause threads (the caller reads under its own pause, or says it did not), or
//! format output. Everything read is bounded (task count, chain depth, set size) and
//! checked, so a torn or hostile graph gives an error, never a loop.

mod graph;
pub(super) mod tasks;

pub use tasks::unsupported;

use super::stack::{RawThread, Walk};
use super::{PythonProcess, StackWalker};
use crate::elf::{maps, ElfFile};
use crate::error::{Error, Result};
use crate::ptrace::ProcessMemory;
use graph::{offsets, read_list, read_thread, Offsets};
use std::collections::HashSet;
use tasks::{empty_loop, link, MAX_TASKS};
pub use tasks::{AsyncSnapshot, LoopTasks, TaskInfo};

/// Tasks read per thread list at most by a sample under `--wall` (each waiting task is
/// charged its wait). It keeps a sample's time bounded with many thousands of tasks.
pub(crate) const MAX_SAMPLED_TASKS: usize = 1_000;
/// Pages of the last read prefetched by the next at most.
const MAX_HINT_RANGES: usize = 128;
/// Finds and reads a process's tasks; keeps what it found for the next read (a profile
/// reads at every sample).
#[derive(Debug, Default)]
pub struct AsyncReader {
    /// Read only what a sample needs: each thread's running task and the chain of tasks
    /// that await it (not every task of every list).
    running_only: bool,
    /// Tasks read per list at most.
    limit: usize,
    offsets: Option<Offsets>,
    /// The mapped files already searched for the section (the module is loaded late, so
    /// files mapped since are searched at the next read).
    searched: HashSet<String>,
    /// When the process's map was last read for that (a sample of a program that has not
    /// imported asyncio must not read its map every time). See [`RESCAN`].
    scanned: Option<std::time::Instant>,
    /// What the last read used, one range per page. The next read prefetches it.
    hint: Vec<(u64, usize)>,
    /// 3.11–3.13, whose tasks are found another way (see `asyncio_legacy`).
    legacy: super::asyncio_legacy::LegacyState,
}

/// How often the map of a process without `_asyncio` loaded is read again. It is soon while
/// a thread runs asyncio's code (importing it, or running a loop), rarely otherwise.
const RESCAN: [std::time::Duration; 2] = [
    std::time::Duration::from_millis(5),
    std::time::Duration::from_secs(1),
];

impl AsyncReader {
    pub fn new() -> AsyncReader {
        AsyncReader {
            limit: MAX_TASKS,
            ..AsyncReader::default()
        }
    }

    /// A reader for samples. It reads the running tasks and their awaiters only (see
    /// [`AsyncReader::running_only`]), or with `waiting` (`--wall`) every task, up to
    /// [`MAX_SAMPLED_TASKS`] a thread.
    pub fn for_samples(waiting: bool) -> AsyncReader {
        AsyncReader {
            running_only: !waiting,
            limit: MAX_SAMPLED_TASKS,
            ..AsyncReader::default()
        }
    }

    /// Looks for `.AsyncioDebug` in the interpreter's binary and in `_asyncio`'s shared
    /// object, among the files mapped now that were not searched before.
    fn locate(
        &mut self,
        proc: &PythonProcess,
        mem: &dyn ProcessMemory,
        threads: &[(&RawThread, Option<&Walk>)],
    ) -> Result<()> {
        if self.offsets.is_some() {
            return Ok(());
        }
        let in_asyncio = threads.iter().any(|(_, w)| {
            w.is_some_and(|w| w.frames.iter().any(|f| f.filename.contains("/asyncio/")))
        });
        let every = RESCAN[usize::from(!in_asyncio)];
        if self.scanned.is_some_and(|t| t.elapsed() < every) {
            return Ok(());
        }
        self.scanned = Some(std::time::Instant::now());
        let maps = crate::proc::read_maps(proc.pid)?;
        let paths = maps
            .iter()
            .filter_map(|m| m.path.as_deref())
            .filter(|p| *p == proc.binary || maps::basename(p).starts_with("_asyncio."));
        for path in paths {
            if self.searched.contains(path) {
                continue;
            }
            let (file, name) = maps::open_target_file(proc.pid, path, &maps, proc.namespaces)?;
            let elf = ElfFile::from_file(&file, &name)?;
            // Searched once its section is read or known absent. A file that could not be
            // opened, one the loader is still mapping (the module is being imported, and its
            // section's address shows other bytes, or none) or whose section could not be
            // read is tried again at the next scan.
            let (avma, size) = match maps::section_place(&maps, path, &elf, ".AsyncioDebug") {
                maps::SectionPlace::Absent => {
                    self.searched.insert(path.to_string());
                    continue;
                }
                maps::SectionPlace::NotMapped => continue,
                maps::SectionPlace::At(avma, size) => (avma, size),
            };
            let section = mem.read_vec(avma, (size as usize).min(4096))?;
            self.searched.insert(path.to_string());
            self.offsets = Some(offsets(proc, mem, &section).map_err(|why| Error::BadState {
                pid: proc.pid,
                why: format!("{path}: .AsyncioDebug: {why}"),
            })?);
            return Ok(());
        }
        Ok(())
    }

    /// The tasks of every thread of `threads` (as a read of the process found them, with
    /// their walks), read through `mem`.
    pub(crate) fn read(
        &mut self,
        proc: &PythonProcess,
        mem: &dyn ProcessMemory,
        walker: &mut StackWalker,
        threads: &[(&RawThread, Option<&Walk>)],
    ) -> AsyncSnapshot {
        // The tasks, coroutines and names one sample reads are mostly where the last one
        // found them, so one request fetches them all (else each is a system call of its
        // own).
        let cache = crate::ptrace::PageCache::new(mem);
        cache.prefetch(&self.hint);
        let out = self.read_through(proc, &cache, walker, threads);
        self.hint = cache.used_ranges();
        self.hint.truncate(MAX_HINT_RANGES);
        out
    }

    fn read_through(
        &mut self,
        proc: &PythonProcess,
        mem: &dyn ProcessMemory,
        walker: &mut StackWalker,
        threads: &[(&RawThread, Option<&Walk>)],
    ) -> AsyncSnapshot {
        let version = proc.layout.version;
        if let Some(why) = unsupported(version) {
            return AsyncSnapshot {
                threads: Vec::new(),
                unavailable: Some(why),
            };
        }
        if version < (3, 14) {
            let legacy = &mut self.legacy;
            return super::asyncio_legacy::read(
                legacy,
                self.running_only,
                proc,
                mem,
                walker,
                threads,
            );
        }
        if let Err(e) = self.locate(proc, mem, threads) {
            return AsyncSnapshot {
                threads: Vec::new(),
                unavailable: Some(format!("the asyncio module's offsets are unreadable: {e}")),
            };
        }
        let Some(o) = self.offsets else {
            return AsyncSnapshot {
                threads: Vec::new(),
                unavailable: Some("asyncio's C module (_asyncio) is not loaded yet".into()),
            };
        };
        let mut out = AsyncSnapshot::default();
        let mut interps = Vec::new();
        for &(raw, walk) in threads {
            let mut lt = read_thread(&o, mem, walker, raw, walk, self.running_only, self.limit);
            // A sample reads no task of threads that ended, so no interpreter's list.
            if !self.running_only {
                if let Ok(interp) = mem.read_u64(raw.tstate.wrapping_add(o.ts_interp)) {
                    if !interps.contains(&interp) {
                        interps.push(interp);
                    }
                }
            }
            if lt.loop_running || !lt.tasks.is_empty() || lt.error.is_some() {
                lt.cycles = link(&mut lt.tasks);
                out.threads.push(lt);
            }
        }
        // Tasks of threads that ended move to their interpreter's list.
        for interp in interps {
            let head = interp.wrapping_add(o.interp_tasks_head);
            let mut lt = empty_loop(0, None);
            read_list(&o, mem, walker, head, &mut lt, None, self.limit);
            if !lt.tasks.is_empty() || lt.error.is_some() {
                lt.cycles = link(&mut lt.tasks);
                out.threads.push(lt);
            }
        }
        out
    }
}

#[cfg(any(test, feature = "fuzzing"))]
pub(crate) use graph::fuzz_tasks;

#[cfg(test)]
mod tests;
