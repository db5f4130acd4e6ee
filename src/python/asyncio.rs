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

use super::stack::{RawThread, Walk};
use super::{PythonProcess, StackWalker};
use crate::elf::{maps, ElfFile};
use crate::error::{Error, Result};
use crate::profile::Frame;
use crate::ptrace::{field_u64, field_u8, ProcessMemory};
use crate::python_bindings::debug_offsets;
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
/// Slots of an `awaited_by` set read at most.
const MAX_SET_SLOTS: u64 = 1 << 20;

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

/// Offsets of the task graph: `.AsyncioDebug`'s and those of `_Py_DebugOffsets` it needs.
#[derive(Debug, Clone, Copy)]
struct Offsets {
    task_size: usize,
    task_name: usize,
    task_awaited_by: usize,
    task_is_task: usize,
    task_awaited_by_is_set: usize,
    task_coro: usize,
    task_node: u64,
    interp_tasks_head: u64,
    ts_running_loop: u64,
    ts_running_task: u64,
    ts_tasks_head: u64,
    ts_interp: u64,
    ob_type: u64,
    /// `sizeof(PyObject)`: where a small object's first field is.
    object_size: u64,
    tp_flags: u64,
    tp_name: u64,
    gi_iframe: u64,
    gi_frame_state: u64,
    frame_owner: usize,
    frame_stackpointer: usize,
    set_used: u64,
    set_mask: u64,
    set_table: u64,
    llist_next: u64,
    long_lv_tag: u64,
    long_digit: u64,
    states: FrameStates,
}

/// A generator frame's states, numbered per version.
#[derive(Debug, Clone, Copy)]
struct FrameStates {
    /// Suspended in a `yield from` / `await`: the awaited object is on its stack.
    yield_from: &'static [i8],
    cleared: i8,
    /// Bytes below the frame's stack pointer where the awaited object is.
    await_slot: u64,
}

impl FrameStates {
    fn of(minor: u32) -> FrameStates {
        if minor >= 15 {
            // FRAME_SUSPENDED_YIELD_FROM = 2, FRAME_SUSPENDED_YIELD_FROM_LOCKED = 3,
            // FRAME_CLEARED = 5 (3.15 `pycore_frame.h`).
            FrameStates {
                yield_from: &[2, 3],
                cleared: 5,
                await_slot: 16,
            }
        } else {
            // FRAME_SUSPENDED_YIELD_FROM = -1, FRAME_CLEARED = 4 (3.14).
            FrameStates {
                yield_from: &[-1],
                cleared: 4,
                await_slot: 8,
            }
        }
    }
}

/// `PyTypeObject.tp_flags` bits.
const TPFLAGS_LONG_SUBCLASS: u64 = 1 << 24;
const TPFLAGS_UNICODE_SUBCLASS: u64 = 1 << 28;
const FRAME_OWNED_BY_GENERATOR: u8 = 1;

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
        in_asyncio: bool,
    ) -> Result<()> {
        let every = RESCAN[usize::from(!in_asyncio)];
        if self.offsets.is_some() || self.scanned.is_some_and(|t| t.elapsed() < every) {
            return Ok(());
        }
        self.scanned = Some(std::time::Instant::now());
        let maps = crate::proc::read_maps(proc.pid)?;
        let mut paths: Vec<&str> = maps
            .iter()
            .filter_map(|m| m.path.as_deref())
            .filter(|p| *p == proc.binary || maps::basename(p).starts_with("_asyncio."))
            .collect();
        paths.dedup();
        for path in paths {
            if !self.searched.insert(path.to_string()) {
                continue;
            }
            let (file, name) = maps::open_target_file(proc.pid, path, &maps, proc.namespaces)?;
            let elf = ElfFile::from_file(&file, &name)?;
            let Some((svma, size)) = elf.section(".AsyncioDebug") else {
                continue;
            };
            let Some(bias) = maps::load_bias(&maps, path, &elf) else {
                continue;
            };
            let section = mem.read_vec(svma.wrapping_add(bias), (size as usize).min(4096))?;
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
        let in_asyncio = threads.iter().any(|(_, w)| {
            w.is_some_and(|w| w.frames.iter().any(|f| f.filename.contains("/asyncio/")))
        });
        if let Err(e) = self.locate(proc, mem, in_asyncio) {
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
            if let Ok(interp) = mem.read_u64(raw.tstate.wrapping_add(o.ts_interp)) {
                if !interps.contains(&interp) {
                    interps.push(interp);
                }
            }
            if lt.loop_running || !lt.tasks.is_empty() || lt.error.is_some() {
                lt.cycles = link(&mut lt.tasks);
                out.threads.push(lt);
            }
        }
        // Tasks of threads that ended move to their interpreter's list.
        for interp in interps.into_iter().filter(|_| !self.running_only) {
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

/// The offsets from `.AsyncioDebug`'s bytes and the interpreter's debug offsets, checked.
fn offsets(
    proc: &PythonProcess,
    mem: &dyn ProcessMemory,
    section: &[u8],
) -> std::result::Result<Offsets, String> {
    if section.len() < 13 * 8 {
        return Err(format!("{} bytes, 104 expected", section.len()));
    }
    let s = |i: usize| field_u64(section, i * 8);
    let (task_size, interp_size, ts_size) = (s(0), s(7), s(9));
    if !(64..=4096).contains(&task_size) {
        return Err(format!("a task object of {task_size} bytes"));
    }
    for (i, what) in [
        (1, "name"),
        (2, "awaited_by"),
        (5, "coro"),
        (6, "task_node"),
    ] {
        if s(i) + 8 > task_size {
            return Err(format!(
                "the task's {what} at {} of {task_size} bytes",
                s(i)
            ));
        }
    }
    if s(3) >= task_size || s(4) >= task_size {
        return Err("the task's flags lie outside it".into());
    }
    if s(8) + 16 > interp_size || [s(10), s(11), s(12)].iter().any(|&f| f + 8 > ts_size) {
        return Err("a task list head lies outside its state".into());
    }
    let rt = proc
        .addrs
        .runtime
        .ok_or_else(|| "no _PyRuntime symbol".to_string())?;
    let bytes = mem
        .read_vec(rt, super::process::DEBUG_OFFSETS_READ)
        .map_err(|e| e.to_string())?;
    let d = |name: &str| {
        debug_offsets::field(&bytes, name).ok_or_else(|| format!("no {name} in _Py_DebugOffsets"))
    };
    let l = &proc.layout;
    let frame_stackpointer = d("interpreter_frame.stackpointer")? as usize;
    if frame_stackpointer + 8 > l.frame.size {
        return Err("the frame's stack pointer lies outside the frame read".into());
    }
    Ok(Offsets {
        task_size: task_size as usize,
        task_name: s(1) as usize,
        task_awaited_by: s(2) as usize,
        task_is_task: s(3) as usize,
        task_awaited_by_is_set: s(4) as usize,
        task_coro: s(5) as usize,
        task_node: s(6),
        interp_tasks_head: s(8),
        ts_running_loop: s(10),
        ts_running_task: s(11),
        ts_tasks_head: s(12),
        ts_interp: l.thread.interp as u64,
        ob_type: l.string.ob_type as u64,
        object_size: d("pyobject.size")?,
        tp_flags: d("type_object.tp_flags")?,
        tp_name: d("type_object.tp_name")?,
        gi_iframe: d("gen_object.gi_iframe")?,
        gi_frame_state: d("gen_object.gi_frame_state")?,
        frame_owner: l.frame.owner.ok_or("no frame owner")?,
        frame_stackpointer,
        set_used: d("set_object.used")?,
        set_mask: d("set_object.mask")?,
        set_table: d("set_object.table")?,
        llist_next: d("llist_node.next")?,
        long_lv_tag: d("long_object.lv_tag")?,
        long_digit: d("long_object.ob_digit")?,
        states: FrameStates::of(l.version.1),
    })
}

/// One thread's loop and tasks.
fn read_thread(
    o: &Offsets,
    mem: &dyn ProcessMemory,
    walker: &mut StackWalker,
    raw: &RawThread,
    walk: Option<&Walk>,
    running_only: bool,
    limit: usize,
) -> LoopTasks {
    let mut lt = empty_loop(raw.thread_id, raw.native_id);
    let ts = raw.tstate;
    let (running_loop, running_task) = match (
        mem.read_u64(ts.wrapping_add(o.ts_running_loop)),
        mem.read_u64(ts.wrapping_add(o.ts_running_task)),
    ) {
        (Ok(l), Ok(t)) => (l, t),
        (Err(e), _) | (_, Err(e)) => {
            lt.error = Some(format!("its thread state is unreadable: {e}"));
            return lt;
        }
    };
    lt.loop_running = running_loop != 0;
    let running = (running_loop != 0 && running_task != 0).then_some(running_task);
    lt.running_task = running;
    if running_only {
        if let Some(task) = running {
            read_awaiters(o, mem, walker, task, walk, &mut lt);
        }
    } else {
        let head = ts.wrapping_add(o.ts_tasks_head);
        read_list(o, mem, walker, head, &mut lt, running.zip(walk), limit);
    }
    lt
}

/// The running task `task` and the tasks that await it, up to a root (the first awaiter
/// of each, where several await one task).
fn read_awaiters(
    o: &Offsets,
    mem: &dyn ProcessMemory,
    walker: &mut StackWalker,
    task: u64,
    walk: Option<&Walk>,
    lt: &mut LoopTasks,
) {
    let Some(walk) = walk else { return };
    let mut info = read_task(o, mem, walker, task, Some(walk));
    let mut seen = HashSet::from([task]);
    loop {
        let next = info.awaited_by.iter().copied().min();
        lt.tasks.push(info);
        match next {
            Some(by) if seen.insert(by) && lt.tasks.len() < MAX_CHAIN => {
                info = read_task(o, mem, walker, by, None);
            }
            _ => return,
        }
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

    fn index(&self) -> HashMap<u64, usize> {
        self.tasks
            .iter()
            .enumerate()
            .map(|(i, t)| (t.id, i))
            .collect()
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

/// Reads the circular task list at `head` into `lt`; `running`: the running task and the
/// walk of its thread (its stack is the thread's, down to the task's coroutine).
fn read_list(
    o: &Offsets,
    mem: &dyn ProcessMemory,
    walker: &mut StackWalker,
    head: u64,
    lt: &mut LoopTasks,
    running: Option<(u64, &Walk)>,
    limit: usize,
) {
    let mut node = match mem.read_u64(head.wrapping_add(o.llist_next)) {
        Ok(n) => n,
        Err(e) => {
            lt.error = Some(format!("its task list is unreadable: {e}"));
            return;
        }
    };
    let mut seen = HashSet::new();
    while node != head {
        if node == 0 || !seen.insert(node) {
            lt.error = Some("its task list is broken (changed while read?)".into());
            return;
        }
        if lt.tasks.len() >= limit {
            lt.truncated = true;
            return;
        }
        let task = node.wrapping_sub(o.task_node);
        let walk = running.and_then(|(r, w)| (r == task).then_some(w));
        lt.tasks.push(read_task(o, mem, walker, task, walk));
        node = match mem.read_u64(node.wrapping_add(o.llist_next)) {
            Ok(n) => n,
            Err(e) => {
                lt.error = Some(format!("its task list is unreadable: {e}"));
                return;
            }
        };
    }
}

/// One task; `running`: the walk of the thread that runs it now.
fn read_task(
    o: &Offsets,
    mem: &dyn ProcessMemory,
    walker: &mut StackWalker,
    task: u64,
    running: Option<&Walk>,
) -> TaskInfo {
    let mut info = TaskInfo {
        id: task,
        name: String::new(),
        numbered: false,
        running: running.is_some(),
        stack: Vec::new(),
        awaiting: None,
        awaiting_id: None,
        awaited_by: Vec::new(),
        awaits: Vec::new(),
        error: None,
    };
    let buf = match mem.read_vec(task, o.task_size) {
        Ok(b) => b,
        Err(e) => {
            info.name = format!("Task at {task:#x}");
            info.error = Some(format!("unreadable: {e}"));
            return info;
        }
    };
    let mut errors = Vec::new();
    (info.name, info.numbered) = task_name(o, mem, walker, field_u64(&buf, o.task_name))
        .unwrap_or_else(|e| {
            errors.push(format!("its name: {e}"));
            (format!("Task at {task:#x}"), true)
        });
    let coro = field_u64(&buf, o.task_coro);
    let chain = match running {
        Some(w) => running_stack(o, mem, walker, coro, w),
        None => coro_chain(o, mem, walker, coro),
    };
    match chain {
        Ok((stack, awaiting)) => {
            info.stack = stack;
            if let Some((what, at)) = awaiting {
                info.awaiting = Some(what);
                info.awaiting_id = Some(at);
            }
        }
        Err(e) => errors.push(format!("its coroutines: {e}")),
    }
    let by = field_u64(&buf, o.task_awaited_by);
    if by != 0 {
        if field_u8(&buf, o.task_awaited_by_is_set) != 0 {
            match set_items(o, mem, by) {
                Ok(items) => info.awaited_by = items,
                Err(e) => errors.push(format!("who awaits it: {e}")),
            }
        } else {
            info.awaited_by = vec![by];
        }
    }
    if field_u8(&buf, o.task_is_task) == 0 {
        errors.push("not flagged as a task".into());
    }
    if !errors.is_empty() {
        info.error = Some(errors.join("; "));
    }
    info
}

/// A task's name: a `str`, or an `int` (a task named by its number, `Task-N`: then true).
fn task_name(
    o: &Offsets,
    mem: &dyn ProcessMemory,
    walker: &StackWalker,
    name: u64,
) -> Result<(String, bool)> {
    if name == 0 {
        return Err(Error::Inconsistent {
            addr: name,
            why: "no name object",
        });
    }
    let ty = mem.read_u64(name.wrapping_add(o.ob_type))?;
    let flags = mem.read_u64(ty.wrapping_add(o.tp_flags))?;
    if flags & TPFLAGS_LONG_SUBCLASS != 0 {
        return Ok((format!("Task-{}", small_int(o, mem, name)?), true));
    }
    if flags & TPFLAGS_UNICODE_SUBCLASS != 0 {
        let text = walker.read_text(mem, name)?;
        let numbered = is_default_name(&text);
        return Ok((text, numbered));
    }
    Err(Error::Inconsistent {
        addr: name,
        why: "a task name that is neither str nor int",
    })
}

/// Whether `name` is asyncio's default name, `Task-N` (a `str` before 3.13 and for some
/// tasks after; an `int` until asked for otherwise since).
pub(super) fn is_default_name(name: &str) -> bool {
    name.strip_prefix("Task-")
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// An `int` of at most two 30-bit digits (3.12+ layout: `lv_tag` holds the digit count
/// above 3 bits of sign).
fn small_int(o: &Offsets, mem: &dyn ProcessMemory, addr: u64) -> Result<i64> {
    let tag = mem.read_u64(addr.wrapping_add(o.long_lv_tag))?;
    let ndigits = tag >> 3;
    if ndigits > 2 {
        return Err(Error::Inconsistent {
            addr,
            why: "a task number of more than 60 bits",
        });
    }
    let mut digits = [0u8; 8];
    mem.read(addr.wrapping_add(o.long_digit), &mut digits)?;
    let d0 = u32::from_le_bytes(digits[..4].try_into().expect("4 bytes")) as i64;
    let d1 = u32::from_le_bytes(digits[4..].try_into().expect("4 bytes")) as i64;
    let value = match ndigits {
        0 => 0,
        1 => d0,
        _ => d0 | (d1 << 30),
    };
    Ok(if tag & 3 == 2 { -value } else { value })
}

/// What a task awaits: its type's name and address. `await future` awaits the future's
/// iterator (`_asyncio.FutureIter`, which holds the future after its object header): the
/// future itself is what the user awaited.
type Awaited = (String, u64);

/// The coroutines of a suspended task, from its own down the awaits, innermost first, and
/// what the innermost awaits when that is not a coroutine.
fn coro_chain(
    o: &Offsets,
    mem: &dyn ProcessMemory,
    walker: &mut StackWalker,
    coro: u64,
) -> Result<(Vec<Frame>, Option<Awaited>)> {
    let mut outer_first = Vec::new();
    let mut awaiting = None;
    let mut at = coro;
    let mut seen = HashSet::new();
    while at != 0 && outer_first.len() < MAX_CHAIN {
        if !seen.insert(at) {
            return Err(Error::Inconsistent {
                addr: at,
                why: "a coroutine awaits itself",
            });
        }
        let mut state = [0u8; 1];
        mem.read(at.wrapping_add(o.gi_frame_state), &mut state)?;
        let state = state[0] as i8;
        if state == o.states.cleared {
            break;
        }
        let coro_type = mem.read_u64(at.wrapping_add(o.ob_type))?;
        let (frame, buf) = walker.frame_at(mem, at.wrapping_add(o.gi_iframe))?;
        outer_first.extend(frame);
        if !o.states.yield_from.contains(&state) {
            break;
        }
        if buf[o.frame_owner] != FRAME_OWNED_BY_GENERATOR {
            return Err(Error::Inconsistent {
                addr: at,
                why: "a coroutine that does not own its frame",
            });
        }
        let sp = field_u64(&buf, o.frame_stackpointer) & !7;
        if sp == 0 {
            break;
        }
        // A stack reference: the low bits are tags; 0b11 tags an int, never awaited.
        let value = mem.read_u64(sp.wrapping_sub(o.states.await_slot))?;
        if value & 3 == 3 || value & !7 == 0 {
            break;
        }
        let awaited = value & !7;
        let ty = mem.read_u64(awaited.wrapping_add(o.ob_type))?;
        if ty == coro_type {
            at = awaited;
        } else {
            let mut what = type_name(o, mem, ty)?;
            let mut at = awaited;
            if what == "_asyncio.FutureIter" {
                let future = mem.read_u64(awaited.wrapping_add(o.object_size))?;
                if future != 0 {
                    let ty = mem.read_u64(future.wrapping_add(o.ob_type))?;
                    what = type_name(o, mem, ty)?;
                    at = future;
                }
            }
            awaiting = Some((what, at));
            break;
        }
    }
    outer_first.reverse();
    Ok((outer_first, awaiting))
}

/// The running task's stack: the thread's frames from the innermost down to the task's
/// own coroutine (the frames below are the event loop's).
fn running_stack(
    o: &Offsets,
    mem: &dyn ProcessMemory,
    walker: &mut StackWalker,
    coro: u64,
    walk: &Walk,
) -> Result<(Vec<Frame>, Option<Awaited>)> {
    let frame = coro.wrapping_add(o.gi_iframe);
    let mut shown = 0;
    for (i, &addr) in walk.chain.iter().enumerate() {
        shown += usize::from(walk.shown.get(i).copied().unwrap_or(false));
        if addr == frame {
            return Ok((walk.frames[..shown.min(walk.frames.len())].to_vec(), None));
        }
    }
    // Not on the thread's chain (the task is starting or ending): its own frames.
    coro_chain(o, mem, walker, coro)
}

/// The objects in a set (its table's keys), bounded.
fn set_items(o: &Offsets, mem: &dyn ProcessMemory, set: u64) -> Result<Vec<u64>> {
    let used = mem.read_u64(set.wrapping_add(o.set_used))?;
    let mask = mem.read_u64(set.wrapping_add(o.set_mask))?;
    let table = mem.read_u64(set.wrapping_add(o.set_table))?;
    if mask >= MAX_SET_SLOTS || used > mask + 1 || (mask + 1) & mask != 0 {
        return Err(Error::Inconsistent {
            addr: set,
            why: "a set of implausible size",
        });
    }
    // Each slot: the key, then its hash.
    let slots = mem.read_vec(table, ((mask + 1) * 16) as usize)?;
    Ok(slots
        .chunks_exact(16)
        .map(|s| field_u64(s, 0))
        .filter(|&k| k != 0)
        .collect())
}

/// A type's `tp_name`.
fn type_name(o: &Offsets, mem: &dyn ProcessMemory, ty: u64) -> Result<String> {
    let at = mem.read_u64(ty.wrapping_add(o.tp_name))?;
    let mut buf = [0u8; 96];
    mem.read(at, &mut buf)?;
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    Ok(String::from_utf8_lossy(&buf[..end]).into_owned())
}

/// Keeps in each task's `awaited_by` only tasks of the list (a set's deleted slots and
/// plain futures are not tasks), fills `awaits`, and returns the await cycles.
pub(super) fn link(tasks: &mut [TaskInfo]) -> Vec<Vec<u64>> {
    let index: HashMap<u64, usize> = tasks.iter().enumerate().map(|(i, t)| (t.id, i)).collect();
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

#[cfg(test)]
mod tests {
    use super::*;

    fn task(id: u64, awaited_by: &[u64]) -> TaskInfo {
        TaskInfo {
            id,
            name: format!("t{id}"),
            numbered: false,
            running: false,
            stack: Vec::new(),
            awaiting: None,
            awaiting_id: None,
            awaited_by: awaited_by.to_vec(),
            awaits: Vec::new(),
            error: None,
        }
    }

    #[test]
    fn links_a_diamond_and_finds_no_cycle() {
        // 1 awaits 2 and 3; both await 4.
        let mut t = vec![
            task(1, &[]),
            task(2, &[1]),
            task(3, &[1]),
            task(4, &[2, 3, 99]),
        ];
        assert!(link(&mut t).is_empty());
        assert_eq!(t[0].awaits, vec![2, 3]);
        assert_eq!(t[3].awaited_by, vec![2, 3], "99 is no task of the list");
        assert_eq!(t[1].awaits, vec![4]);
    }

    #[test]
    fn reports_each_cycle_once() {
        // 1 → 2 → 3 → 1 and 4 → 4; 5 awaits into the cycle without being in it.
        let mut t = vec![
            task(1, &[3]),
            task(2, &[1]),
            task(3, &[2]),
            task(4, &[4]),
            task(5, &[]),
            task(6, &[5]),
        ];
        t[0].awaited_by.push(5);
        let mut c = link(&mut t);
        c.sort();
        assert_eq!(c, vec![vec![1, 2, 3], vec![4]]);
    }

    /// Bytes for [`fuzz_tasks`] (after the fuzz target's layout byte) holding a thread that
    /// runs task B (`Task-7`), awaited by task A (`Task-5`): both on its list.
    /// Where the fuzz target's memory lies (`fuzzing::STACK_BASE`).
    const BASE: u64 = 0x5500_0000_0000;

    fn two_task_graph() -> Vec<u8> {
        let base = BASE;
        // Offsets, as fuzz_tasks derives them from each byte (twice the byte, most of them
        // modulo 64): task of 168 bytes, name at 16, awaited_by 24, is_task 32, its set flag
        // 34, coro 40, list node 48; thread state: loop 16, running task 24, list head 32;
        // ob_type 8, tp_flags 16, tp_name 24; generator frame at 64, its state at 48.
        let mut head = [0u8; 26];
        for (i, v) in [52, 8, 12, 16, 17, 20, 24, 0, 8, 12, 16, 0, 4, 8, 12, 32, 24]
            .into_iter()
            .enumerate()
        {
            head[i] = v;
        }
        head[24..26].copy_from_slice(&0x100u16.to_le_bytes());
        let mut mem = vec![0u8; 0x800];
        let mut put =
            |at: u64, v: u64| mem[at as usize..at as usize + 8].copy_from_slice(&v.to_le_bytes());
        let (ts, a, b, int_type, n5, n7) = (0x100u64, 0x400u64, 0x600u64, 0x200, 0x280, 0x2c0);
        put(ts + 16, base + 0x10); // a running loop
        put(ts + 24, base + b); // running task B
        put(ts + 32, base + a + 48); // list: head → A → B → head
        put(a + 48, base + b + 48);
        put(b + 48, base + ts + 32);
        put(int_type + 16, 1 << 24); // an int type's tp_flags
        for (n, v) in [(n5, 5), (n7, 7)] {
            put(n + 8, base + int_type);
            put(n + 16, 1 << 3); // one digit
            put(n + 24, v);
        }
        put(a + 16, base + n5);
        put(b + 16, base + n7);
        put(b + 24, base + a); // B awaited by A
        mem[a as usize + 32] = 1;
        mem[b as usize + 32] = 1;
        let mut out = head.to_vec();
        out.extend(mem);
        out
    }

    fn fuzz_walker() -> StackWalker {
        let layout = crate::python_bindings::generated(3, 14, false).expect("3.14's table");
        StackWalker::new(*layout, super::super::strings::TypeAddrs::default())
    }

    #[test]
    fn reads_a_running_task_and_its_awaiter_from_memory() {
        let base = BASE;
        let got = fuzz_tasks(&two_task_graph(), base, &mut fuzz_walker());
        let [all, running] = &got[..] else {
            panic!("two reads");
        };
        let names: Vec<&str> = all.tasks.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["Task-5", "Task-7"]);
        assert_eq!(all.running_task, Some(base + 0x600));
        assert_eq!(all.tasks[1].awaited_by, vec![base + 0x400]);
        assert_eq!(all.tasks[0].awaits, vec![base + 0x600]);
        let stack: Vec<String> = running
            .task_stack()
            .expect("a running task")
            .iter()
            .map(|f| f.function.to_string())
            .collect();
        assert_eq!(
            stack,
            ["task Task-*", "task Task-*"],
            "B, then A that awaits it"
        );
    }

    /// Writes the async_tasks fuzz target's seed (`cargo test --lib write_async_tasks_seed
    /// -- --ignored`).
    #[test]
    #[ignore]
    fn write_async_tasks_seed() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/fuzz/corpus/async_tasks");
        std::fs::create_dir_all(dir).unwrap();
        let mut seed = vec![0u8]; // 3.14's layout
        seed.extend(two_task_graph());
        std::fs::write(format!("{dir}/two_tasks"), seed).unwrap();
    }

    #[test]
    fn says_which_versions_have_no_tasks_to_read() {
        assert!(unsupported((3, 10)).unwrap().contains("3.11 or later"));
        assert!(unsupported((2, 7)).is_some());
        assert!(unsupported((3, 11)).is_none());
        assert!(unsupported((3, 13)).is_none());
        assert!(unsupported((3, 14)).is_none());
        assert!(unsupported((3, 15)).is_none());
    }
}

/// The task-graph reader over the fuzzer's bytes (`fuzz/fuzz_targets/async_tasks.rs`):
/// bytes 0–23 are the offsets (of `.AsyncioDebug`'s and those taken from the debug
/// offsets, each small), bytes 24–25 the thread state's place; the rest is the address
/// space at `base`. Reads the thread's list (every task) and its running task's awaiters,
/// links them, builds the samples' stacks; returns what a dump would render.
#[cfg(any(test, feature = "fuzzing"))]
pub(crate) fn fuzz_tasks(data: &[u8], base: u64, walker: &mut StackWalker) -> Vec<LoopTasks> {
    use crate::ptrace::BufferMemory;
    let mut head = [0u8; 26];
    let n = data.len().min(head.len());
    head[..n].copy_from_slice(&data[..n]);
    let memory = &data[n..];
    let small = |i: usize| usize::from(head[i]) * 2;
    let o = Offsets {
        task_size: 64 + small(0),
        task_name: small(1) % 64,
        task_awaited_by: small(2) % 64,
        task_is_task: small(3) % 64,
        task_awaited_by_is_set: small(4) % 64,
        task_coro: small(5) % 64,
        task_node: (small(6) % 64) as u64,
        interp_tasks_head: small(7) as u64,
        ts_running_loop: small(8) as u64,
        ts_running_task: small(9) as u64,
        ts_tasks_head: small(10) as u64,
        ts_interp: small(11) as u64,
        ob_type: small(12) as u64 % 32,
        object_size: 16,
        tp_flags: small(13) as u64,
        tp_name: small(14) as u64,
        gi_iframe: small(15) as u64,
        gi_frame_state: small(16) as u64,
        frame_owner: small(17) % walker.layout.frame.size.max(1),
        frame_stackpointer: small(18) % walker.layout.frame.size.saturating_sub(8).max(1),
        set_used: small(19) as u64,
        set_mask: small(20) as u64,
        set_table: small(21) as u64,
        llist_next: small(22) as u64 % 16,
        long_lv_tag: 16,
        long_digit: 24,
        states: FrameStates::of(14 + u32::from(head[23] & 1)),
    };
    let mem = BufferMemory {
        base,
        bytes: memory.to_vec(),
    };
    let raw = RawThread {
        tstate: base + u64::from(u16::from_le_bytes([head[24], head[25]])),
        thread_id: 1,
        native_id: Some(1),
        top_frame: 0,
        interp_index: 0,
        holds_gil: false,
    };
    let walk = Walk::default();
    let mut out = Vec::new();
    for running_only in [false, true] {
        let mut lt = read_thread(&o, &mem, walker, &raw, Some(&walk), running_only, 64);
        lt.cycles = link(&mut lt.tasks);
        let _ = lt.task_stack();
        let _ = lt.waiting_stacks();
        out.push(lt);
    }
    out
}
