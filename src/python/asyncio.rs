//! Asyncio tasks of a live process: which task each thread's event loop runs, every task's
//! coroutine stack, what it awaits and which tasks await it.
//!
//! CPython 3.14+ describes its tasks for outside readers: the `_asyncio` module carries the
//! offsets of its task object and of the task lists in a section `.AsyncioDebug` (in
//! `_asyncio`'s own shared object on 3.14, in the interpreter's binary on 3.15), every task
//! of a thread is on a list that starts in that thread's state (those of threads that ended
//! on one in the interpreter's state), and a task records who awaits it (`awaited_by`: one
//! task or a set of them, kept by `Task`, `gather` and `TaskGroup`). A suspended coroutine's
//! frame lives inside the coroutine object; what it awaits is the value on top of that
//! frame's stack (one slot below the stack pointer on 3.14, two on 3.15).
//!
//! 3.11–3.13 keep their tasks in containers of the `_asyncio` module instead, and record
//! only what a task waits for: `asyncio_legacy` reads those into the same snapshot.
//!
//! Owns: [`AsyncReader`] (finding the section, once it is loaded, and reading the graph)
//! and [`AsyncSnapshot`] (what `dump --async` prints and what a sample is charged to).
//! Must not: pause threads (the caller reads under its own pause, or says it did not), or
//! format output. Everything read is bounded (task count, chain depth, set size) and
//! checked, so a torn or hostile graph gives an error, never a loop.

mod graph;

use super::stack::{RawThread, Walk};
use super::{PythonProcess, StackWalker};
use crate::elf::{maps, ElfFile};
use crate::error::{Error, Result};
use crate::profile::Frame;
use crate::ptrace::ProcessMemory;
use graph::{offsets, read_list, read_thread, Offsets};
use std::collections::{HashMap, HashSet};

/// Tasks read per thread list at most (a bigger list is cut, and says so).
pub(crate) const MAX_TASKS: usize = 100_000;
/// Tasks read per thread list at most by a sample under `--wall` (each waiting task is
/// charged its wait): what keeps a sample's time bounded with many thousands of tasks.
pub(crate) const MAX_SAMPLED_TASKS: usize = 1_000;
/// Pages of the last read prefetched by the next at most.
const MAX_HINT_RANGES: usize = 128;
/// Coroutines followed in one task's chain at most.
pub(super) const MAX_CHAIN: usize = 1024;
/// Why tasks cannot be shown, for a version that has no way to find them.
pub fn unsupported(version: (u32, u32)) -> Option<String> {
    if version < (3, 11) {
        Some(format!(
            "async stacks need Python 3.11 or later (the target runs {}.{})",
            version.0, version.1
        ))
    } else {
        None
    }
}

/// Every event loop's tasks at one moment.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct AsyncSnapshot {
    /// Threads that run an event loop or own tasks, in the order of the snapshot's threads;
    /// then, with `thread_id` 0, the tasks of threads that ended.
    pub(crate) threads: Vec<LoopTasks>,
    /// Why no task could be read (asyncio not imported yet, a version we cannot read).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) unavailable: Option<String>,
}

/// The tasks of one thread.
#[derive(Debug, Clone, serde::Serialize)]
pub struct LoopTasks {
    /// The thread's `pthread_t` (0: tasks of threads that ended).
    pub(crate) thread_id: u64,
    /// Its kernel id, as the snapshot's threads give it.
    pub(crate) native_id: Option<i32>,
    /// An event loop runs in this thread now.
    pub(crate) loop_running: bool,
    /// The task the loop is running now (its id), if any.
    pub(crate) running_task: Option<u64>,
    pub(crate) tasks: Vec<TaskInfo>,
    /// The list held more than [`MAX_TASKS`] tasks: the rest were not read.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub(crate) truncated: bool,
    /// Cycles of tasks awaiting each other (each a list of ids, in await order).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) cycles: Vec<Vec<u64>>,
    /// Why the list could not be read to its end.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) error: Option<String>,
}

/// One task.
#[derive(Debug, Clone, serde::Serialize)]
pub struct TaskInfo {
    /// The task object's address: unique while the task lives.
    pub(crate) id: u64,
    pub(crate) name: String,
    /// Named by its number (asyncio's default, `Task-N`): a sample names it `Task-*`, so
    /// that the stacks of a thousand short tasks of one kind add up.
    #[serde(skip)]
    pub(crate) numbered: bool,
    /// The loop is running this task now.
    pub(crate) running: bool,
    /// Its coroutines' frames, innermost first (for the running task, the thread's frames
    /// down to the task's own coroutine).
    pub(crate) stack: Vec<Frame>,
    /// What the innermost coroutine awaits when that is not a coroutine: its type's name
    /// (`_asyncio.Future`, `_GatheringFuture`, ...).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) awaiting: Option<String>,
    /// The address of that object (a task's id when it awaits a task).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) awaiting_id: Option<u64>,
    /// Tasks that await this one (ids).
    pub(crate) awaited_by: Vec<u64>,
    /// Tasks this one awaits (ids): the inverse of `awaited_by`.
    pub(crate) awaits: Vec<u64>,
    /// Why its stack or name could not be read whole.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) error: Option<String>,
}

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
    /// The mapped files already searched for the section (the module is loaded late:
    /// files mapped since are searched at the next read).
    searched: HashSet<String>,
    /// When the process's map was last read for that (a sample of a program that has not
    /// imported asyncio must not read its map every time): see [`RESCAN`].
    scanned: Option<std::time::Instant>,
    /// What the last read used, one range per page: the next read prefetches it.
    hint: Vec<(u64, usize)>,
    /// 3.11–3.13, whose tasks are found another way: see `asyncio_legacy`.
    legacy: super::asyncio_legacy::LegacyState,
}

/// How often the map of a process without `_asyncio` loaded is read again: soon while a
/// thread runs asyncio's code (importing it, or running a loop), rarely otherwise.
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

    /// A reader for samples: the running tasks and their awaiters only (see
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
            // Searched once its section is read or known absent: a file that could not be
            // opened, one the loader is still mapping (the module is being imported: its
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
        // found them: one request fetches them all (else each is a system call of its own).
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
            // A sample reads no task of threads that ended: no interpreter's list.
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

pub(super) fn empty_loop(thread_id: u64, native_id: Option<i32>) -> LoopTasks {
    LoopTasks {
        thread_id,
        native_id,
        loop_running: false,
        running_task: None,
        tasks: Vec::new(),
        truncated: false,
        cycles: Vec::new(),
        error: None,
    }
}

impl LoopTasks {
    /// The stack a sample of this thread is charged to under `--async`: the running task's
    /// frames (the thread's, down to the task's coroutine: not the event loop's), its name
    /// as a frame, then each awaiting task's coroutines and name, to the root task;
    /// innermost first. None when the thread runs no task.
    pub(crate) fn task_stack(&self) -> Option<Vec<Frame>> {
        let index = self.index();
        self.stack_from(self.running_task?, &index)
    }

    /// Each waiting task's stack (`--wall`: a task waits at its innermost await), joined
    /// to its awaiters' as [`LoopTasks::task_stack`] joins the running one's.
    pub(crate) fn waiting_stacks(&self) -> Vec<Vec<Frame>> {
        let index = self.index();
        self.tasks
            .iter()
            .filter(|t| !t.running && !t.stack.is_empty())
            .filter_map(|t| self.stack_from(t.id, &index))
            .collect()
    }

    /// Each task's place in `tasks`, by id.
    pub(crate) fn index(&self) -> HashMap<u64, usize> {
        index_of(&self.tasks)
    }

    fn stack_from(&self, task: u64, index: &HashMap<u64, usize>) -> Option<Vec<Frame>> {
        let mut at = *index.get(&task)?;
        let mut out = Vec::new();
        let mut seen = HashSet::new();
        while seen.insert(at) {
            let t = &self.tasks[at];
            out.extend(t.stack.iter().cloned());
            out.push(Frame::of_task(if t.numbered { "Task-*" } else { &t.name }));
            match t.awaited_by.iter().filter_map(|id| index.get(id)).min() {
                Some(&next) => at = next,
                None => break,
            }
        }
        Some(out)
    }
}

/// The running task's stack as its thread's walk has it: the frames from the innermost
/// down to `frame`, the task's own coroutine's (the frames below are the event loop's);
/// None when `frame` is not on the chain (the task is starting or ending).
pub(super) fn frames_down_to(walk: &Walk, frame: u64) -> Option<Vec<Frame>> {
    let mut shown = 0;
    for (i, &addr) in walk.chain.iter().enumerate() {
        shown += usize::from(walk.shown.get(i).copied().unwrap_or(false));
        if addr == frame {
            return Some(walk.frames[..shown.min(walk.frames.len())].to_vec());
        }
    }
    None
}

/// Whether `name` is asyncio's default name, `Task-N` (a `str` before 3.13 and for some
/// tasks after; an `int` until asked for otherwise since).
pub(super) fn is_default_name(name: &str) -> bool {
    name.strip_prefix("Task-")
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// Keeps in each task's `awaited_by` only tasks of the list (a set's deleted slots and
/// plain futures are not tasks), fills `awaits`, and returns the await cycles.
pub(super) fn link(tasks: &mut [TaskInfo]) -> Vec<Vec<u64>> {
    let index = index_of(tasks);
    let mut awaits: Vec<Vec<u64>> = vec![Vec::new(); tasks.len()];
    for t in tasks.iter_mut() {
        t.awaited_by.retain(|id| index.contains_key(id));
        t.awaited_by.sort_unstable();
        t.awaited_by.dedup();
        for by in &t.awaited_by {
            awaits[index[by]].push(t.id);
        }
    }
    for (t, mut a) in tasks.iter_mut().zip(awaits) {
        a.sort_unstable();
        t.awaits = a;
    }
    cycles(tasks, &index)
}

/// Each task's place in `tasks`, by id.
fn index_of(tasks: &[TaskInfo]) -> HashMap<u64, usize> {
    tasks.iter().enumerate().map(|(i, t)| (t.id, i)).collect()
}

/// Every cycle of the "awaits" relation, once each (from its smallest id).
fn cycles(tasks: &[TaskInfo], index: &HashMap<u64, usize>) -> Vec<Vec<u64>> {
    // Colour-marking depth-first search; a back edge closes a cycle.
    let mut colour = vec![0u8; tasks.len()];
    let mut found: Vec<Vec<u64>> = Vec::new();
    for start in 0..tasks.len() {
        if colour[start] != 0 {
            continue;
        }
        let mut path: Vec<usize> = Vec::new();
        let mut stack: Vec<(usize, usize)> = vec![(start, 0)];
        while let Some(top) = stack.len().checked_sub(1) {
            let (node, next) = stack[top];
            if next == 0 {
                colour[node] = 1;
                path.push(node);
            }
            let Some(&child) = tasks[node].awaits.get(next) else {
                colour[node] = 2;
                path.pop();
                stack.pop();
                continue;
            };
            stack[top].1 += 1;
            let c = index[&child];
            match colour[c] {
                0 => stack.push((c, 0)),
                1 => {
                    let from = path.iter().position(|&p| p == c).expect("on the path");
                    let mut cycle: Vec<u64> = path[from..].iter().map(|&p| tasks[p].id).collect();
                    let min = (0..cycle.len()).min_by_key(|&i| cycle[i]).expect("a cycle");
                    cycle.rotate_left(min);
                    if !found.contains(&cycle) {
                        found.push(cycle);
                    }
                }
                _ => {}
            }
        }
    }
    found
}

#[cfg(any(test, feature = "fuzzing"))]
pub(crate) use graph::fuzz_tasks;

#[cfg(test)]
mod tests;
