//! One read of every thread of a live interpreter, in the way [`SnapshotOptions`] asks.
//!
//! Owns:
//! - [`snapshot`] (the scheduler states first, then the read proper, retried once when the
//!   interpreter is starting or finalizing, then each thread's ids and state);
//! - what every way of reading shares: the interpreter's head and GIL holder, the CALL tag,
//!   the page hints from one snapshot to the next, and the threads at rest left unread.
//!
//! The ways of reading, one module each:
//! - `paused`: every thread stopped for the read (`--blocking`, `dump`, `--native`).
//! - `unpaused`: without pausing, each stack verified by a second look.
//! - `reread`: the auto mode's fallback, the stacks that failed verification read again
//!   with their threads stopped.
//!
//! Its one caller is `PythonReader`; `thread_reader` shares its helpers.
//!
//! Must not: keep state between snapshots (the walker does), or format output.

mod paused;
mod reread;
pub(super) mod still;
mod unpaused;

use crate::error::{Error, Result};
use crate::native::{Captures, NativeProcess};
use crate::ptrace::{self, ProcessMemory};
use crate::python::asyncio::{AsyncReader, AsyncSnapshot};
use crate::python::process::{self, PythonProcess};
use crate::python::rest::RestTracker;
use crate::python::snapshot::{ReadMode, Snapshot, SnapshotOptions, ThreadResult, ThreadSnapshot};
use crate::python::stack::{self, StackWalker};
use crate::python::tids::{self, pthread_to_tid};
use paused::{read_blocking, PausedReads};
use reread::reread_paused;
use std::collections::HashMap;
use unpaused::read_nonblocking;

/// Native captures, taken during the pause of a blocking read: the process's modules and
/// where its threads' captures go.
pub(super) type NativeCapture<'a> = Option<(&'a mut NativeProcess, &'a mut Captures)>;

/// Reads the stacks of every thread of `proc` (those of [`SnapshotOptions::threads`] when
/// given). Also reads, when asked:
/// - `native`: each thread's registers and stack, in a paused read's pause.
/// - `tasks`: every event loop's asyncio tasks, in the same pause (without pausing, right
///   after the stacks).
pub(super) fn snapshot(
    proc: &PythonProcess,
    walker: &mut StackWalker,
    opts: &SnapshotOptions,
    rest: &RestTracker,
    mut native: NativeCapture,
    mut tasks: Option<&mut AsyncReader>,
) -> Result<Snapshot> {
    let pid = proc.pid;
    let known_tids = opts.threads.as_deref();
    // Scheduler states first, because pausing turns every thread into 't'. A caller that lists
    // the threads itself (the sampler) does not need them (only `idle` tells them).
    // Sorted, because a paused read looks threads up in it.
    let mut tids: Vec<i32> = match known_tids {
        Some(t) => t.to_vec(),
        None => crate::proc::threads(pid)?,
    };
    tids.sort_unstable();
    let states: crate::IdMap<i32, char> = match known_tids {
        Some(_) => crate::IdMap::default(),
        None => tids
            .iter()
            .filter_map(|&t| Some((t, crate::proc::thread_state(pid, t)?)))
            .collect(),
    };

    let opcodes = crate::python_bindings::opcodes(proc.version.major, proc.version.minor);
    let nonblocking = opts.mode != ReadMode::Paused;
    walker.strict = nonblocking;
    let mut threads = None;
    let mut async_tasks = None;
    let mut greenlets = None;
    let mut woken = Vec::new();
    for attempt in 0..2 {
        let read = if nonblocking {
            read_nonblocking(proc, walker, opts, rest).and_then(|mut t| {
                if opts.mode == ReadMode::Auto && t.iter().any(|(_, w, _)| w.is_err()) {
                    reread_paused(proc, walker, &tids, &rest.tids_by_thread, &mut t)?;
                }
                tag_native(&proc.mem, opcodes, &mut t);
                if let Some(reader) = tasks.as_deref_mut() {
                    async_tasks = Some(read_tasks(reader, proc, &proc.mem, walker, &t));
                }
                if opts.greenlets {
                    greenlets = read_greenlets(proc, &proc.mem, &proc.mem, walker, &t);
                }
                Ok(t)
            })
        } else {
            let extra = PausedReads {
                native: native.as_mut(),
                tasks: tasks.as_deref_mut().map(|r| (r, &mut async_tasks)),
                greenlets: opts.greenlets.then_some(&mut greenlets),
                woken: &mut woken,
                locals: opts.locals.as_ref(),
            };
            read_blocking(proc, walker, &tids, rest, opcodes, extra)
        };
        match read {
            // Python is starting up or shutting down (no interpreter yet, or no more): wait
            // for it to come up or for the process to go.
            Err(Error::BadState { .. }) if attempt == 0 && matches!(proc.interp_head(), Ok(0)) => {
                settle_uninitialized(proc)?;
            }
            // A process that went during the read exited; it did not fail. A CI run saw a
            // 3.9 finishing 32 ms after start: its head NULL, then unreadable.
            r => {
                threads = Some(process::exited_if_gone(pid, r)?);
                break;
            }
        }
    }
    let mut threads = threads.expect("the second attempt always ends the loop");
    correct_stale_ids(proc, walker, &tids, &mut threads);

    let os_name = |t: i32| {
        opts.thread_names
            .then(|| crate::proc::thread_name(pid, t))
            .flatten()
    };
    let threads = thread_snapshots(proc, &tids, &states, threads, &os_name);
    if let Some(a) = async_tasks.as_mut() {
        // Kernel ids as the snapshot has them (ours, where the target's PID namespace differs).
        for lt in &mut a.threads {
            lt.native_id = threads
                .iter()
                .find(|t| t.thread_id == lt.thread_id && lt.thread_id != 0)
                .and_then(|t| t.native_id);
        }
    }
    Ok(Snapshot {
        pid,
        python_version: proc.version_text.clone(),
        version_source: proc.version_source,
        untested_version: proc.untested,
        free_threaded: proc.layout.free_threaded,
        executable: proc.executable.clone(),
        threads,
        native: None,
        asyncio: async_tasks,
        greenlets,
        python_names_unavailable: None,
        left_out: walker.left_out,
        woken,
        stale_ids: walker.stale_ids.clone(),
    })
}

/// Gives each thread state that records a kernel id no thread of the process has the
/// thread it is ([`tids::stale_ids`]), and keeps the answer in the walker for the reads
/// that follow. States gone from the list are forgotten (when no thread was left out).
/// - One look per thread when none is stale: a search of the sorted listing.
/// - Before 3.11 no state records an id (it comes from `struct pthread`), so there is nothing
///   to do.
pub(super) fn correct_stale_ids(
    proc: &PythonProcess,
    walker: &mut StackWalker,
    tids: &[i32],
    threads: &mut [ThreadResult],
) {
    if proc.layout.thread.native_thread_id.is_none() {
        return;
    }
    let translated: Vec<i32>;
    let inner: &[i32] = if proc.tids.translates() {
        let mut v: Vec<i32> = proc.tids.inner_to_ours(tids).into_keys().collect();
        v.sort_unstable();
        translated = v;
        &translated
    } else {
        tids
    };
    if walker.left_out == 0 && !walker.stale_ids.is_empty() {
        walker
            .stale_ids
            .retain(|s| threads.iter().any(|(t, _, _)| t.tstate == s.tstate));
    }
    let listed = |n: i32| inner.binary_search(&n).is_ok();
    if !threads
        .iter()
        .any(|(t, _, _)| t.native_id.is_some_and(|n| !listed(n)))
    {
        return;
    }
    let raws: Vec<&stack::RawThread> = threads.iter().map(|(t, _, _)| t).collect();
    let found = tids::stale_ids(&proc.mem, inner, &raws);
    for (t, _, _) in threads.iter_mut() {
        if let Some(s) = found.iter().find(|s| s.tstate == t.tstate) {
            t.native_id = Some(s.actual);
        }
    }
    walker.stale_ids.extend(found);
}

/// The tasks of every thread of `threads`.
fn read_tasks(
    reader: &mut AsyncReader,
    proc: &PythonProcess,
    mem: &dyn ProcessMemory,
    walker: &mut StackWalker,
    threads: &[ThreadResult],
) -> AsyncSnapshot {
    let views: Vec<_> = threads
        .iter()
        .map(|(raw, walk, _)| (raw, walk.as_ref().ok()))
        .collect();
    reader.read(proc, mem, walker, &views)
}

/// Every greenlet of the interpreters of `threads` (None: none has imported greenlet),
/// read through `mem`, the collector's lists through `lists`.
fn read_greenlets(
    proc: &PythonProcess,
    mem: &dyn ProcessMemory,
    lists: &dyn ProcessMemory,
    walker: &mut StackWalker,
    threads: &[ThreadResult],
) -> Option<crate::python::GreenletSnapshot> {
    let mut interps: Vec<u64> = threads.iter().map(|(raw, _, _)| raw.interp).collect();
    interps.sort_unstable();
    interps.dedup();
    if interps.is_empty() {
        // No thread state: the main interpreter, from the runtime.
        interps.extend(proc.interp_head_via(mem).ok().filter(|&i| i != 0));
    }
    crate::python::greenlets::read(proc, mem, lists, walker, &interps)
}

/// The threads of a snapshot as reported, each with its id in our PID namespace (and in
/// the target's, when they differ), its state, its stack or why there is none, and the
/// name `os_name` gives its kernel id.
fn thread_snapshots(
    proc: &PythonProcess,
    tids: &[i32],
    states: &crate::IdMap<i32, char>,
    threads: Vec<ThreadResult>,
    os_name: &dyn Fn(i32) -> Option<String>,
) -> Vec<ThreadSnapshot> {
    // Thread states (3.11+ `native_thread_id`) and glibc's `struct pthread` hold the id a
    // thread has in the target's own PID namespace. /proc (`tids`, `states`) has ours.
    let translate = proc.tids.translates();
    let inner_to_ours = if translate {
        proc.tids.inner_to_ours(tids)
    } else {
        HashMap::new()
    };
    let pthread_map = if proc.layout.thread.native_thread_id.is_none() {
        let inner: Vec<i32> = if translate {
            inner_to_ours.keys().copied().collect()
        } else {
            tids.to_vec()
        };
        pthread_to_tid(&proc.mem, &inner, &threads)
    } else {
        HashMap::new()
    };
    threads
        .into_iter()
        .map(|(raw, frames, in_native)| {
            let inner_id = raw
                .native_id
                .or_else(|| pthread_map.get(&raw.thread_id).copied());
            let native_id = if translate {
                inner_id.and_then(|i| inner_to_ours.get(&i).copied())
            } else {
                inner_id
            };
            let running = native_id
                .and_then(|t| states.get(&t))
                .map(|&s| s == 'R')
                .unwrap_or(false);
            let (w, error) = match frames {
                Ok(w) => (w, None),
                Err(e) => (stack::Walk::default(), Some(e)),
            };
            ThreadSnapshot {
                thread_id: raw.thread_id,
                native_id,
                ns_native_id: inner_id.filter(|_| translate),
                name: native_id.and_then(os_name),
                python_name: None,
                holds_gil: raw.holds_gil,
                idle: !running && !raw.holds_gil,
                in_native,
                frames: w.frames,
                locals: w.locals,
                truncated: w.truncated,
                error,
                interpreter: raw.interp_id,
                interp_addr: raw.interp,
                read_paused: w.paused,
                evals: w.evals,
                evals_open: w.evals_open,
                anchors: w.anchors,
                native: None,
                unchanged: w.unchanged,
                top_frame: raw.top_frame,
            }
        })
        .collect()
}

/// Reads the opcode at each thread's innermost instruction and tags CALLs as native.
fn tag_native(
    mem: &dyn ProcessMemory,
    opcodes: Option<&crate::python_bindings::opcodes::Opcodes>,
    threads: &mut [ThreadResult],
) {
    let Some(ops) = opcodes else { return };
    for (_, walk, tag) in threads.iter_mut() {
        let Ok(w) = walk else { continue };
        if let Some(op) = w.top_op {
            *tag = Some(ops.calls.contains(&op));
            continue;
        }
        let Some(addr) = w.top_instr else { continue };
        let mut op = [0u8; 1];
        if mem.read(addr, &mut op).is_ok() {
            *tag = Some(ops.calls.contains(&op[0]));
        }
    }
}

pub(super) fn gil_current(proc: &PythonProcess, mem: &dyn ProcessMemory) -> Result<Option<u64>> {
    let l = &proc.layout;
    if let (Some(off), Some(rt)) = (l.runtime.gilstate_tstate_current, proc.addrs.runtime) {
        return mem.read_u64(rt.wrapping_add(off as u64)).map(Some);
    }
    if l.runtime.interpreters_head.is_none() {
        if let Some(sym) = proc.addrs.tstate_current {
            return mem.read_u64(sym).map(Some);
        }
    }
    Ok(None)
}

/// The interpreter pointer is NULL, so Python is starting up or shutting down. Waits (with
/// the target running, never while paused) up to 200 ms. Returns:
/// - Ok when it comes up;
/// - "exited" when the process goes away meanwhile (a finishing program);
/// - else the not-initialized error.
fn settle_uninitialized(proc: &PythonProcess) -> Result<()> {
    let until = std::time::Instant::now() + std::time::Duration::from_millis(200);
    loop {
        if !crate::proc::process_exists(proc.pid) {
            return Err(Error::ProcessExited(proc.pid));
        }
        if matches!(proc.interp_head(), Ok(h) if h != 0) {
            return Ok(());
        }
        if std::time::Instant::now() >= until {
            return interp_head_checked(proc, &proc.mem).map(|_| ());
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

pub(super) fn interp_head_checked(proc: &PythonProcess, mem: &dyn ProcessMemory) -> Result<u64> {
    let head = proc.interp_head_via(mem)?;
    if head == 0 {
        return Err(Error::BadState {
            pid: proc.pid,
            why: "the interpreter is not initialized (starting up or shutting down)".into(),
        });
    }
    Ok(head)
}

/// Whether thread `t` is one [`RestTracker`]'s `reuse` lets go unread:
/// - it did not run since its last read;
/// - its thread state still names the frame that read started from;
/// - it does not hold the GIL (a thread that holds it is about to run, if it is not
///   running).
///
/// A thread the list took as it was ([`stack::RawThread::rested`]) is one, without a look.
fn is_unchanged(t: &stack::RawThread, reuse: &crate::IdMap<u64, u64>) -> bool {
    t.rested || (!t.holds_gil && reuse.get(&t.thread_id) == Some(&t.top_frame))
}

/// A thread found unchanged: its entry (a walk marked unchanged), or under
/// `omit_unchanged` none, counted in `walker.left_out`.
fn keep_unchanged(
    walker: &mut StackWalker,
    rest: &RestTracker,
    out: &mut Vec<ThreadResult>,
    t: stack::RawThread,
) {
    if rest.omit_unchanged {
        walker.left_out += 1;
    } else {
        out.push((t, Ok(stack::Walk::unchanged()), None));
    }
}

/// Most pages a snapshot's prefetch asks for. That covers a thousand thread states on as many
/// pages, each thread's frames besides (two requests of 1,024 ranges, one page's span each).
const MAX_HINT_PAGES: usize = 2048;

/// What is worth fetching up front next time. That is the bytes `cache` served this time,
/// one range per page (bounded).
pub(super) fn hint_from(cache: &ptrace::PageCache) -> Vec<(u64, usize)> {
    let mut ranges = cache.used_ranges();
    ranges.truncate(MAX_HINT_PAGES);
    ranges
}
