//! Asyncio tasks of CPython 3.11–3.13, which describe their tasks for no outside reader.
//!
//! There the C module `_asyncio` keeps its tasks in containers it also exports to
//! `asyncio.tasks` (the very same objects):
//! - `_all_tasks` (3.11) / `_scheduled_tasks` (3.12+), a `WeakSet` of every task not yet
//!   done (its `data` attribute is a set of weak references);
//! - `_eager_tasks` (3.12+), a set of the tasks that run their first step eagerly right now;
//! - `_current_tasks`, a dict from each event loop to the task it runs now.
//!
//! They are found from the interpreter's `sys.modules` → `_asyncio` → the module's dict,
//! once, and checked (by their types) at every read.
//!
//! A task records what it waits for (`fut_waiter`), not who waits for it. A task awaits
//! another when that one is its `fut_waiter`, or is one of the children of the
//! `_GatheringFuture` it waits for (`gather`). Nothing else links tasks. The children of a
//! `TaskGroup` are not linked to the task that waits in the group's `async with` (3.14 adds
//! that), and no edge is made up for them.
//!
//! A task's event loop is its `_loop`. A loop runs:
//! - in the thread whose id it keeps in `_thread_id` (`BaseEventLoop.run_forever`);
//! - or, when it has none, in the thread whose stack holds the coroutine of the task the
//!   loop runs now.
//!
//! Tasks of a loop that runs in no thread go in an entry of their own (thread 0) that says
//! so.
//!
//! The task object (`TaskObj` of `Modules/_asynciomodule.c`) is in no header. Its layout
//! is taken from the sources' declarations (see [`TaskLayout::of`]) and checked against the
//! `_asyncio.Task` type found in the module (its `tp_basicsize`, and on 3.11/3.12 its
//! `tp_dictoffset`). Every object is checked to be of that type (or a subclass) before it is
//! read as a task. The other layouts are generated from the headers
//! ([`LegacyAsyncLayout`](crate::python_bindings::LegacyAsyncLayout)).
//!
//! Owns: [`LegacyState`] (what was found, kept for the next read) and [`read`].
//! Must not: pause threads or format output (as `asyncio`). Everything read is bounded (dict
//! entries, set slots, task count, chain depth) and checked.

use super::asyncio::tasks::{
    empty_loop, frames_down_to, is_default_name, link, AsyncSnapshot, LoopTasks, TaskInfo,
    MAX_CHAIN, MAX_TASKS,
};
use super::frame::Frame;
use super::stack::{RawThread, Walk};
use super::{PythonProcess, StackWalker};
use crate::error::{Error, Result};
use crate::ptrace::{field_u64, ProcessMemory};
use crate::python_bindings::{debug_offsets, legacy_async};
use objects::{bad, Head, Rd, TaskLayout};
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

mod objects;

/// Nested `gather`s followed at most.
const MAX_GATHER_DEPTH: usize = 8;
/// How often `sys.modules` is read again while `_asyncio` is not found. It is soon while a
/// thread runs asyncio's code, rarely otherwise (a sample must not read it every time).
const RESCAN: [Duration; 2] = [Duration::from_millis(5), Duration::from_secs(1)];

/// What was found in the process, kept while its objects keep their types.
#[derive(Debug, Default)]
pub(super) struct LegacyState {
    found: Option<Found>,
    /// When `sys.modules` was last read for `_asyncio`.
    scanned: Option<Instant>,
}

/// The `_asyncio` module's containers and the types they are checked by.
#[derive(Debug, Clone, Copy)]
struct Found {
    dict_type: u64,
    set_type: u64,
    task_type: u64,
    /// `_current_tasks`: a dict, loop → task.
    current: u64,
    /// The `data` of `_all_tasks` / `_scheduled_tasks`: a set of weak references.
    all: u64,
    /// `_eager_tasks` (3.12+): a set of tasks.
    eager: Option<u64>,
}

/// Every event loop's tasks (or, for samples, each running task and those awaiting it), as
/// [`super::AsyncReader::read`] returns them, for 3.11–3.13.
pub(super) fn read(
    state: &mut LegacyState,
    running_only: bool,
    proc: &PythonProcess,
    mem: &dyn ProcessMemory,
    walker: &mut StackWalker,
    threads: &[(&RawThread, Option<&Walk>)],
) -> AsyncSnapshot {
    let unavailable = |why: String| AsyncSnapshot {
        threads: Vec::new(),
        unavailable: Some(why),
    };
    let (major, minor) = proc.layout.version;
    let Some(l) = legacy_async(major, minor, proc.layout.free_threaded) else {
        return unavailable(format!(
            "async stacks of this build of Python {major}.{minor} are not read (no layout of \
             its asyncio objects)"
        ));
    };
    let mut rd = Rd {
        l,
        t: TaskLayout::of(l),
        mem,
        task_types: HashMap::new(),
        names: HashMap::new(),
    };
    if let Some(f) = state.found {
        if !still_there(&mut rd, &f) {
            state.found = None;
        }
    }
    if state.found.is_none() {
        let in_asyncio = threads.iter().any(|(_, w)| {
            w.is_some_and(|w| w.frames.iter().any(|f| f.filename.contains("/asyncio/")))
        });
        let every = RESCAN[usize::from(!in_asyncio)];
        if state.scanned.is_some_and(|t| t.elapsed() < every) {
            return unavailable("asyncio's C module (_asyncio) is not loaded yet".into());
        }
        state.scanned = Some(Instant::now());
        let Some(&(raw, _)) = threads.first() else {
            return unavailable("no thread to find the interpreter by".into());
        };
        match locate(&mut rd, proc, walker, raw) {
            Ok(Some(f)) => state.found = Some(f),
            Ok(None) => {
                return unavailable("asyncio's C module (_asyncio) is not loaded yet".into())
            }
            Err(e) => return unavailable(format!("asyncio's task containers are unreadable: {e}")),
        }
    }
    let f = state.found.expect("found above");
    match read_found(&mut rd, &f, running_only, walker, threads) {
        Ok(s) => s,
        Err(e) => unavailable(format!("asyncio's tasks are unreadable: {e}")),
    }
}

/// The containers found before are still what they were.
fn still_there(rd: &mut Rd, f: &Found) -> bool {
    let is = |rd: &Rd, obj: u64, ty: u64| rd.ty(obj).is_ok_and(|t| t == ty);
    is(rd, f.current, f.dict_type)
        && is(rd, f.all, f.set_type)
        && f.eager.is_none_or(|e| is(rd, e, f.set_type))
        && rd
            .word(f.task_type, rd.l.tp_basicsize)
            .is_ok_and(|s| s == rd.t.size)
}

/// `sys.modules["_asyncio"]`'s containers (None while it is not imported).
fn locate(
    rd: &mut Rd,
    proc: &PythonProcess,
    walker: &StackWalker,
    raw: &RawThread,
) -> Result<Option<Found>> {
    let l = rd.l;
    let interp = rd
        .mem
        .read_u64(raw.tstate.wrapping_add(proc.layout.thread.interp as u64))?;
    // 3.13 says where `sys.modules` is in its debug offsets, and that wins over the
    // headers'.
    let mut modules_at = l.interp_modules;
    if let Some(rt) = proc.addrs.runtime.filter(|_| l.version >= (3, 13)) {
        if let Ok(bytes) = rd.mem.read_vec(rt, super::process::DEBUG_OFFSETS_READ) {
            if let Some(at) = debug_offsets::field(&bytes, "interpreter_state.imports_modules") {
                modules_at = at as i64;
            }
        }
    }
    let modules = rd.word(interp, modules_at)?;
    let dict_type = rd.ty(modules)?;
    if rd.type_name(dict_type)? != "dict" {
        return Err(bad(modules, "sys.modules is not a dict"));
    }
    let items = rd.dict_items(modules)?;
    let Some(module) = rd.find(walker, &items, "_asyncio") else {
        return Ok(None);
    };
    let mty = rd.ty(module)?;
    if rd.type_name(mty)? != "module" {
        return Err(bad(module, "sys.modules['_asyncio'] is not a module"));
    }
    let md = rd.word(module, l.md_dict)?;
    if rd.ty(md)? != dict_type {
        return Err(bad(md, "the _asyncio module's dict is not a dict"));
    }
    let names = rd.dict_items(md)?;
    let get = |rd: &Rd, name: &'static str| {
        rd.find(walker, &names, name)
            .ok_or(bad(md, "a name missing from the _asyncio module"))
    };
    let task_type = get(rd, "Task")?;
    let size = rd.word(task_type, l.tp_basicsize)?;
    let dict_off = rd.word(task_type, l.tp_dictoffset)? as i64;
    if rd.type_name(task_type)? != "_asyncio.Task"
        || size != rd.t.size
        || rd.t.dict.is_some_and(|d| d != dict_off)
    {
        return Err(Error::BadState {
            pid: proc.pid,
            why: format!(
                "_asyncio.Task has {size} bytes (dict at {dict_off}), not the {} this build \
                 of scalene-rs knows for {}.{}",
                rd.t.size, l.version.0, l.version.1
            ),
        });
    }
    let current = get(rd, "_current_tasks")?;
    if rd.ty(current)? != dict_type {
        return Err(bad(current, "_current_tasks is not a dict"));
    }
    let weakset = if l.version >= (3, 12) {
        get(rd, "_scheduled_tasks")?
    } else {
        get(rd, "_all_tasks")?
    };
    let all = rd
        .attr(walker, weakset, "data")?
        .ok_or(bad(weakset, "the tasks' WeakSet has no data"))?;
    let set_type = rd.ty(all)?;
    if rd.type_name(set_type)? != "set" {
        return Err(bad(all, "the tasks' WeakSet's data is not a set"));
    }
    let eager = if l.version >= (3, 12) {
        let e = get(rd, "_eager_tasks")?;
        if rd.ty(e)? != set_type {
            return Err(bad(e, "_eager_tasks is not a set"));
        }
        Some(e)
    } else {
        None
    };
    Ok(Some(Found {
        dict_type,
        set_type,
        task_type,
        current,
        all,
        eager,
    }))
}

/// The tasks, in the containers found.
fn read_found(
    rd: &mut Rd,
    f: &Found,
    running_only: bool,
    walker: &mut StackWalker,
    threads: &[(&RawThread, Option<&Walk>)],
) -> Result<AsyncSnapshot> {
    let (tasks, truncated) = all_tasks(rd, f, walker)?;
    let mut heads: Vec<Head> = Vec::with_capacity(tasks.len());
    let mut gone = 0;
    for &t in &tasks {
        match rd.head(t) {
            Ok(h) => heads.push(h),
            Err(e) if e.is_process_gone() => return Err(e),
            // Freed since it was listed.
            Err(_) => gone += 1,
        }
    }
    let mut current: Vec<(u64, u64)> = rd.dict_items(f.current)?;
    current.retain(|&(_, t)| rd.is_task(f.task_type, t));
    for &(_, t) in &current {
        if !heads.iter().any(|h| h.task == t) {
            heads.push(rd.head(t)?);
        }
    }
    let by_task: HashMap<u64, usize> = heads.iter().enumerate().map(|(i, h)| (h.task, i)).collect();
    let awaiters = awaiters(rd, f, walker, &heads, &by_task);
    // Each running task runs in the thread whose stack holds its coroutine's frame.
    let on_thread = |coro: u64| {
        let frame = coro.wrapping_add_signed(rd.l.gi_iframe);
        threads
            .iter()
            .position(|(_, w)| w.is_some_and(|w| w.chain.contains(&frame)))
    };
    let mut out = AsyncSnapshot::default();
    if running_only {
        for &(_, task) in &current {
            let h = heads[by_task[&task]];
            let Some(i) = on_thread(h.coro) else { continue };
            let (raw, walk) = threads[i];
            let mut lt = empty_loop(raw.thread_id, raw.native_id);
            lt.loop_running = true;
            lt.running_task = Some(task);
            let mut at = h;
            let mut seen = HashSet::from([task]);
            loop {
                let by = awaiters.get(&at.task).cloned().unwrap_or_default();
                let mut info = read_task(rd, walker, &at, walk.filter(|_| at.task == task));
                info.awaited_by = by.clone();
                lt.tasks.push(info);
                match by.iter().copied().min() {
                    Some(next) if seen.insert(next) && lt.tasks.len() < MAX_CHAIN => {
                        at = heads[by_task[&next]];
                    }
                    _ => break,
                }
            }
            lt.cycles = link(&mut lt.tasks);
            out.threads.push(lt);
        }
        return Ok(out);
    }
    // Each loop's thread is its `_thread_id`, else where its running task runs.
    let mut loop_thread: HashMap<u64, Option<usize>> = HashMap::new();
    for ev in heads
        .iter()
        .map(|h| h.event_loop)
        .chain(current.iter().map(|c| c.0))
    {
        if ev == 0 || loop_thread.contains_key(&ev) {
            continue;
        }
        let mut at = None;
        if let Some(id_obj) = rd.attr(walker, ev, "_thread_id").ok().flatten() {
            if let Ok(Some(id)) = rd.small_uint(id_obj) {
                at = threads.iter().position(|(r, _)| r.thread_id == id);
            }
        }
        if at.is_none() {
            at = current
                .iter()
                .find(|c| c.0 == ev)
                .and_then(|&(_, t)| on_thread(heads[by_task[&t]].coro));
        }
        loop_thread.insert(ev, at);
    }
    let mut per_thread: Vec<LoopTasks> = threads
        .iter()
        .map(|(raw, _)| empty_loop(raw.thread_id, raw.native_id))
        .collect();
    let mut nowhere = empty_loop(0, None);
    for (&ev, &at) in &loop_thread {
        if let Some(i) = at {
            per_thread[i].loop_running = true;
            if let Some(&(_, t)) = current.iter().find(|c| c.0 == ev) {
                per_thread[i].running_task = Some(t);
            }
        }
    }
    for h in &heads {
        let at = loop_thread.get(&h.event_loop).copied().flatten();
        let lt = match at {
            Some(i) => &mut per_thread[i],
            None => &mut nowhere,
        };
        let walk = at
            .filter(|_| lt.running_task == Some(h.task))
            .and_then(|i| threads[i].1);
        let mut info = read_task(rd, walker, h, walk);
        info.awaited_by = awaiters.get(&h.task).cloned().unwrap_or_default();
        lt.tasks.push(info);
    }
    let mut notes = Vec::new();
    if truncated {
        notes.push(format!(
            "more than {MAX_TASKS} tasks: the rest were not read"
        ));
    }
    if gone > 0 {
        notes.push(format!("{gone} task(s) ended while read"));
    }
    for mut lt in per_thread.into_iter().chain([nowhere]) {
        if lt.thread_id == 0 {
            if lt.tasks.is_empty() {
                continue;
            }
            lt.error = Some(
                "the event loop of these tasks runs in no thread now (or its thread could \
                 not be told): their thread is not known"
                    .into(),
            );
        } else if !lt.loop_running && lt.tasks.is_empty() {
            continue;
        }
        lt.truncated = truncated;
        if !notes.is_empty() {
            let all = notes.join("; ");
            lt.error = Some(match lt.error.take() {
                Some(e) => format!("{e}; {all}"),
                None => all,
            });
        }
        lt.cycles = link(&mut lt.tasks);
        out.threads.push(lt);
    }
    Ok(out)
}

/// Every task of the containers, once each, in their order (the set's, then the eager
/// ones), and whether there were more than [`MAX_TASKS`].
fn all_tasks(rd: &mut Rd, f: &Found, walker: &StackWalker) -> Result<(Vec<u64>, bool)> {
    let _ = walker;
    let mut out = Vec::new();
    let mut seen = HashSet::new();
    let mut weakref_type = None;
    for r in rd.set_items(f.all)? {
        // A set's deleted slots hold a dummy key, so only weak references count.
        let Ok(ty) = rd.ty(r) else { continue };
        if weakref_type != Some(ty) {
            if weakref_type.is_some()
                || rd.type_name(ty).ok().as_deref() != Some("weakref.ReferenceType")
            {
                continue;
            }
            weakref_type = Some(ty);
        }
        // A dead reference points at None.
        let Ok(task) = rd.word(r, rd.l.wr_object) else {
            continue;
        };
        if rd.is_task(f.task_type, task) && seen.insert(task) {
            if out.len() >= MAX_TASKS {
                return Ok((out, true));
            }
            out.push(task);
        }
    }
    if let Some(e) = f.eager {
        for task in rd.set_items(e)? {
            if rd.is_task(f.task_type, task) && seen.insert(task) {
                if out.len() >= MAX_TASKS {
                    return Ok((out, true));
                }
                out.push(task);
            }
        }
    }
    Ok((out, false))
}

/// Who awaits each task: the tasks whose `fut_waiter` it is, or whose `fut_waiter` is a
/// `gather` it is a child of (nested gathers followed).
fn awaiters(
    rd: &mut Rd,
    f: &Found,
    walker: &StackWalker,
    heads: &[Head],
    by_task: &HashMap<u64, usize>,
) -> HashMap<u64, Vec<u64>> {
    let mut out: HashMap<u64, Vec<u64>> = HashMap::new();
    // What waiting for each future means (several tasks may wait for one gather).
    let mut known: HashMap<u64, Vec<u64>> = HashMap::new();
    for h in heads {
        if h.fut_waiter == 0 {
            continue;
        }
        let awaited = known.entry(h.fut_waiter).or_insert_with(|| {
            let mut v = Vec::new();
            gathered(rd, f, walker, h.fut_waiter, 0, &mut v);
            v
        });
        for &t in awaited.iter() {
            if by_task.contains_key(&t) && t != h.task {
                out.entry(t).or_default().push(h.task);
            }
        }
    }
    for v in out.values_mut() {
        v.sort_unstable();
        v.dedup();
    }
    out
}

/// The tasks that waiting for `fut` waits for: `fut` itself if a task, else the children of
/// a `gather` (`_GatheringFuture._children`), bounded.
fn gathered(
    rd: &mut Rd,
    f: &Found,
    walker: &StackWalker,
    fut: u64,
    depth: usize,
    out: &mut Vec<u64>,
) {
    if rd.is_task(f.task_type, fut) {
        out.push(fut);
        return;
    }
    if depth >= MAX_GATHER_DEPTH || out.len() >= MAX_TASKS {
        return;
    }
    let Ok(ty) = rd.ty(fut) else { return };
    if rd.type_name(ty).ok().as_deref() != Some("_GatheringFuture") {
        return;
    }
    let Ok(Some(children)) = rd.attr(walker, fut, "_children") else {
        return;
    };
    let is_list = rd
        .ty(children)
        .and_then(|t| rd.type_name(t))
        .is_ok_and(|n| n == "list");
    if !is_list {
        return;
    }
    for c in rd.list_items(children).unwrap_or_default() {
        if out.len() >= MAX_TASKS {
            return;
        }
        gathered(rd, f, walker, c, depth + 1, out);
    }
}

/// One task; `running`: the walk of the thread that runs it now.
fn read_task(rd: &mut Rd, walker: &mut StackWalker, h: &Head, running: Option<&Walk>) -> TaskInfo {
    let mut info = TaskInfo {
        id: h.task,
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
    let mut errors = Vec::new();
    info.name = task_name(rd, walker, h.name).unwrap_or_else(|e| {
        errors.push(format!("its name: {e}"));
        format!("Task at {:#x}", h.task)
    });
    info.numbered = is_default_name(&info.name);
    let chain = match running {
        Some(w) => running_stack(rd, walker, h.coro, w),
        None => coro_chain(rd, walker, h.coro),
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
    if !errors.is_empty() {
        info.error = Some(errors.join("; "));
    }
    info
}

/// A task's name: a `str`, or an `int` (a task named by its number, `Task-N`).
fn task_name(rd: &Rd, walker: &StackWalker, name: u64) -> Result<String> {
    let flags = rd.flags(rd.ty(name)?)?;
    if flags & rd.l.flag_unicode as u64 != 0 {
        return walker.read_text(rd.mem, name);
    }
    match rd.small_uint(name)? {
        Some(n) => Ok(format!("Task-{n}")),
        None => Err(bad(name, "a task name that is neither str nor int")),
    }
}

/// What a task awaits when that is not a coroutine: its type's name and address.
type Awaited = (String, u64);

/// The object a suspended coroutine awaits (`_PyGen_yf`):
/// - 3.13: in the state "suspended in yield from";
/// - 3.11/3.12: suspended with its next instruction a RESUME (or a form of it) whose
///   argument is 2 or more (after `yield from` / `await`).
///
/// It is on top of its stack.
fn awaited_by_frame(rd: &Rd, frame: u64, buf: &[u8], state: i64) -> Result<Option<u64>> {
    let l = rd.l;
    let yield_from = match l.frame_suspended_yield_from {
        Some(s) => state == s,
        None => {
            if state == l.frame_created || state >= 0 {
                return Ok(None);
            }
            let prev = field_u64(buf, l.frame_instr as usize);
            let mut next = [0u8; 2];
            rd.mem.read(prev.wrapping_add(2), &mut next)?;
            let resume = [
                Some(l.op_resume),
                l.op_resume_quick,
                l.op_resume_instrumented,
            ];
            resume.contains(&Some(next[0] as i64)) && next[1] >= 2
        }
    };
    if !yield_from {
        return Ok(None);
    }
    let mut top = [0u8; 4];
    rd.mem
        .read(frame.wrapping_add_signed(l.frame_stacktop), &mut top)?;
    let top = i32::from_le_bytes(top) as i64;
    if !(1..=1 << 16).contains(&top) {
        return Err(bad(frame, "a suspended frame's stack of implausible depth"));
    }
    let value = rd.word(frame, l.frame_localsplus + (top - 1) * 8)?;
    Ok((value != 0).then_some(value))
}

/// The coroutines of a suspended task, from its own down the awaits, innermost first, and
/// what the innermost awaits when that is not a coroutine.
fn coro_chain(
    rd: &mut Rd,
    walker: &mut StackWalker,
    coro: u64,
) -> Result<(Vec<Frame>, Option<Awaited>)> {
    let l = rd.l;
    let mut outer_first = Vec::new();
    let mut awaiting = None;
    let mut at = coro;
    let mut seen = HashSet::new();
    while at != 0 && outer_first.len() < MAX_CHAIN {
        if !seen.insert(at) {
            return Err(bad(at, "a coroutine awaits itself"));
        }
        let state = rd.byte(at, l.gi_frame_state)? as i8 as i64;
        if state >= l.frame_cleared {
            break;
        }
        let coro_type = rd.ty(at)?;
        let frame = at.wrapping_add_signed(l.gi_iframe);
        let (shown, buf) = walker.frame_at(rd.mem, frame)?;
        outer_first.extend(shown);
        if buf[l.frame_owner as usize] as i64 != l.owned_by_generator {
            return Err(bad(at, "a coroutine that does not own its frame"));
        }
        let Some(awaited) = awaited_by_frame(rd, frame, &buf, state)? else {
            break;
        };
        let ty = rd.ty(awaited)?;
        if ty == coro_type {
            at = awaited;
            continue;
        }
        let mut what = rd.type_name(ty)?;
        let mut target = awaited;
        if what == "_asyncio.FutureIter" {
            // `await future` awaits the future's iterator, which holds the future right
            // after its object header. The future is what the user awaited.
            let future = rd.word(awaited, l.object_size)?;
            if future != 0 {
                what = rd.type_name(rd.ty(future)?)?;
                target = future;
            }
        }
        awaiting = Some((what, target));
        break;
    }
    outer_first.reverse();
    Ok((outer_first, awaiting))
}

/// The running task's stack: the thread's frames down to the task's own coroutine
/// (`asyncio::tasks::frames_down_to`), or, off the thread's chain, its own frames.
fn running_stack(
    rd: &mut Rd,
    walker: &mut StackWalker,
    coro: u64,
    walk: &Walk,
) -> Result<(Vec<Frame>, Option<Awaited>)> {
    match frames_down_to(walk, coro.wrapping_add_signed(rd.l.gi_iframe)) {
        Some(frames) => Ok((frames, None)),
        None => coro_chain(rd, walker, coro),
    }
}
