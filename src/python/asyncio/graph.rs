//! Reading the task graph of CPython 3.14+ from its memory:
//! - the offsets of `.AsyncioDebug` and `_Py_DebugOffsets` checked ([`offsets`]);
//! - a thread's running loop and task;
//! - its task list;
//! - each task's name, coroutine chain and awaiters.
//!
//! Owns: the memory layout of tasks, coroutines and their awaited objects per version.
//! Must not: decide which tasks to read (the reader in `asyncio.rs` does), or format.

use super::tasks::{empty_loop, is_default_name, LoopTasks, TaskInfo, MAX_CHAIN};
use crate::error::{Error, Result};
use crate::ptrace::{field_u64, field_u8, ProcessMemory};
use crate::python::frame::Frame;
use crate::python::stack::{RawThread, Walk};
use crate::python::{PythonProcess, StackWalker};
use crate::python_bindings::debug_offsets;
use std::collections::HashSet;

/// Slots of an `awaited_by` set read at most.
const MAX_SET_SLOTS: u64 = 1 << 20;

/// Offsets of the task graph: `.AsyncioDebug`'s and those of `_Py_DebugOffsets` it needs.
#[derive(Debug, Clone, Copy)]
pub(super) struct Offsets {
    task_size: usize,
    task_name: usize,
    task_awaited_by: usize,
    task_is_task: usize,
    task_awaited_by_is_set: usize,
    task_coro: usize,
    task_node: u64,
    pub(super) interp_tasks_head: u64,
    ts_running_loop: u64,
    ts_running_task: u64,
    ts_tasks_head: u64,
    pub(super) ts_interp: u64,
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
    /// Suspended in a `yield from` / `await`, with the awaited object on its stack.
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

/// The offsets from `.AsyncioDebug`'s bytes and the interpreter's debug offsets, checked.
pub(super) fn offsets(
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
        if s(i).saturating_add(8) > task_size {
            return Err(format!(
                "the task's {what} at {} of {task_size} bytes",
                s(i)
            ));
        }
    }
    if s(3) >= task_size || s(4) >= task_size {
        return Err("the task's flags lie outside it".into());
    }
    // The section is the target's memory and may hold any value at all (a sum must not
    // overflow).
    if s(8).saturating_add(16) > interp_size
        || [s(10), s(11), s(12)]
            .iter()
            .any(|&f| f.saturating_add(8) > ts_size)
    {
        return Err("a task list head lies outside its state".into());
    }
    let rt = proc
        .addrs
        .runtime
        .ok_or_else(|| "no _PyRuntime symbol".to_string())?;
    let bytes = mem
        .read_vec(rt, crate::python::process::DEBUG_OFFSETS_READ)
        .map_err(|e| e.to_string())?;
    let d = |name: &str| {
        debug_offsets::field(&bytes, name).ok_or_else(|| format!("no {name} in _Py_DebugOffsets"))
    };
    let l = &proc.layout;
    let frame_stackpointer = d("interpreter_frame.stackpointer")? as usize;
    if frame_stackpointer.saturating_add(8) > l.frame.size {
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
pub(super) fn read_thread(
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

/// Reads the circular task list at `head` into `lt`; `running`: the running task and the
/// walk of its thread (its stack is the thread's, down to the task's coroutine).
pub(super) fn read_list(
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

/// A task's name: a `str`, or an `int` (a task named by its number, `Task-N`; then true).
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
/// iterator (`_asyncio.FutureIter`, which holds the future after its object header). The
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
        // A stack reference, whose low bits are tags. 0b11 tags an int, never awaited.
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

/// The running task's stack: the thread's frames down to the task's own coroutine
/// ([`super::tasks::frames_down_to`]), or, off the thread's chain, its own frames.
fn running_stack(
    o: &Offsets,
    mem: &dyn ProcessMemory,
    walker: &mut StackWalker,
    coro: u64,
    walk: &Walk,
) -> Result<(Vec<Frame>, Option<Awaited>)> {
    match super::tasks::frames_down_to(walk, coro.wrapping_add(o.gi_iframe)) {
        Some(frames) => Ok((frames, None)),
        None => coro_chain(o, mem, walker, coro),
    }
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
    // Each slot holds the key, then its hash. A deleted key's slot keeps the set's dummy
    // object with hash -1 (no object hashes to -1). It is not an awaiter, and a sample that
    // follows the first awaiter must not take it for one.
    let slots = mem.read_vec(table, ((mask + 1) * 16) as usize)?;
    Ok(slots
        .chunks_exact(16)
        .filter(|s| field_u64(s, 8) != u64::MAX)
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

/// The task-graph reader over the fuzzer's bytes (`fuzz/fuzz_targets/async_tasks.rs`):
/// - bytes 0–23 are the offsets (of `.AsyncioDebug`'s and those taken from the debug
///   offsets, each small);
/// - bytes 24–25 the thread state's place;
/// - the rest is the address space at `base`.
///
/// Reads the thread's list (every task) and its running task's awaiters, links them, and
/// builds the samples' stacks. Returns what a dump would render.
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
        interp: 0,
        interp_id: 0,
        holds_gil: false,
        rested: false,
    };
    let walk = Walk::default();
    let mut out = Vec::new();
    for running_only in [false, true] {
        let mut lt = read_thread(&o, &mem, walker, &raw, Some(&walk), running_only, 64);
        lt.cycles = super::tasks::link(&mut lt.tasks);
        let _ = lt.task_stack();
        let _ = lt.waiting_stacks();
        out.push(lt);
    }
    out
}
