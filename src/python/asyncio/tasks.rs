//! The tasks of a snapshot, as both readers fill them (3.14+'s graph, 3.11–3.13's
//! containers in `asyncio_legacy`).
//!
//! Owns:
//! - [`AsyncSnapshot`], [`LoopTasks`] and [`TaskInfo`];
//! - the links between tasks ([`link`]: awaits, awaiters and cycles);
//! - the stack a sample is charged to ([`LoopTasks::task_stack`]);
//! - the limits both readers keep.
//!
//! Must not: read the target (the readers do) or format output.

use crate::python::frame::Frame;
use crate::python::stack::Walk;
use std::collections::{HashMap, HashSet};

/// Tasks read per thread list at most (a bigger list is cut, and says so).
pub(crate) const MAX_TASKS: usize = 100_000;
/// Coroutines followed in one task's chain at most.
pub(in crate::python) const MAX_CHAIN: usize = 1024;

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
    /// The list held more than [`MAX_TASKS`] tasks, so the rest were not read.
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
    /// The task object's address, unique while the task lives.
    pub(crate) id: u64,
    pub(crate) name: String,
    /// Named by its number (asyncio's default, `Task-N`). A sample names it `Task-*`, so
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
    /// Tasks this one awaits (ids), the inverse of `awaited_by`.
    pub(crate) awaits: Vec<u64>,
    /// Why its stack or name could not be read whole.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) error: Option<String>,
}

pub(in crate::python) fn empty_loop(thread_id: u64, native_id: Option<i32>) -> LoopTasks {
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
    /// The stack a sample of this thread is charged to under `--async`, innermost first:
    /// - the running task's frames (the thread's, down to the task's coroutine, not the
    ///   event loop's);
    /// - its name as a frame;
    /// - then each awaiting task's coroutines and name, to the root task.
    ///
    /// None when the thread runs no task.
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

/// The running task's stack as its thread's walk has it. That is the frames from the
/// innermost down to `frame`, the task's own coroutine's (the frames below are the event
/// loop's). None when `frame` is not on the chain (the task is starting or ending).
pub(in crate::python) fn frames_down_to(walk: &Walk, frame: u64) -> Option<Vec<Frame>> {
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
pub(in crate::python) fn is_default_name(name: &str) -> bool {
    name.strip_prefix("Task-")
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// Keeps in each task's `awaited_by` only tasks of the list (a set's deleted slots and
/// plain futures are not tasks), fills `awaits`, and returns the await cycles.
pub(in crate::python) fn link(tasks: &mut [TaskInfo]) -> Vec<Vec<u64>> {
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
