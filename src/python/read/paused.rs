//! The paused read: every thread stopped while its stack is read (`--blocking`, `dump`'s
//! default, `--native`), with what else is read in the same pause.
//!
//! Owns: [`read_blocking`] (up to [`BLOCKING_PAUSES`] pauses, the threads caught half way
//! given time to run between them), [`read_all`] (the read inside one pause),
//! [`PausedReads`] (native captures and asyncio tasks taken in the same pause) and
//! [`woke_from_wait`] (which threads our pause woke).
//! Must not: read without every thread it walks stopped (a thread left running that moved
//! is an error of its own).

use super::{
    gil_current, hint_from, interp_head_checked, is_unchanged, keep_unchanged, read_greenlets,
    read_tasks, tag_native,
};
use crate::error::Result;
use crate::native::{Captures, NativeProcess};
use crate::ptrace::{self, pause::PausedThreads, ProcessMemory};
use crate::python::asyncio::{AsyncReader, AsyncSnapshot};
use crate::python::locals::{self, LocalsLayout, LocalsOptions};
use crate::python::native;
use crate::python::process::PythonProcess;
use crate::python::rest::RestTracker;
use crate::python::snapshot::{ThreadError, ThreadResult, Unread};
use crate::python::stack::{self, StackWalker};
use crate::python::tids::KernelIds;

/// Whether `tid`, held stopped by `paused`, was stopped in the middle of a wait. A wait here
/// is a system call that had blocked (a lock, a sleep, a read that waits), which the stop
/// interrupts and the thread restarts when let go. Such a thread was woken by the pause. One
/// stopped while it ran its own code, or between a quick system call's entry and exit, was
/// not.
pub(super) fn woke_from_wait(paused: &PausedThreads, pid: i32, tid: i32) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        // Interrupted in a system call that had blocked, the thread stops with the call's
        // number in `orig_rax` and one of the kernel's "restart" codes in `rax` (they are
        // replaced only after the stop, to restart the call). In its own code, `orig_rax`
        // is -1, and after a quick call `rax` holds the call's result.
        const RESTART_CODES: std::ops::RangeInclusive<i64> = -516..=-512;
        paused
            .registers(pid, tid)
            .is_ok_and(|r| (r.orig_rax as i64) >= 0 && RESTART_CODES.contains(&(r.rax as i64)))
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = paused;
        crate::proc::blocked_syscall(pid, tid).is_some_and(|(nr, _)| nr >= 0)
    }
}

/// What a blocking read reads besides the stacks, while the threads are paused: native
/// registers and stacks, asyncio tasks (and where each goes).
pub(super) struct PausedReads<'a, 'b> {
    pub(super) native: Option<&'a mut (&'b mut NativeProcess, &'b mut Captures)>,
    pub(super) tasks: Option<(&'a mut AsyncReader, &'a mut Option<AsyncSnapshot>)>,
    /// Where every greenlet goes, when they are asked for.
    pub(super) greenlets: Option<&'a mut Option<crate::python::GreenletSnapshot>>,
    /// The threads the pause found waiting (see [`Snapshot::woken`]).
    ///
    /// [`Snapshot::woken`]: crate::python::Snapshot::woken
    pub(super) woken: &'a mut Vec<i32>,
    /// Each shown frame's locals (`dump --locals`), kept in its thread's walk.
    pub(super) locals: Option<&'a LocalsOptions>,
}

/// How many times a blocking snapshot pauses the process at most (see [`read_blocking`]).
const BLOCKING_PAUSES: usize = 3;

/// How long a blocking snapshot waits at most, before it pauses the process again, for the
/// threads it could not read to run (see [`read_blocking`]).
const RUN_AGAIN_WAIT: std::time::Duration = std::time::Duration::from_millis(20);

/// Pauses every thread and reads them all. `tids` is sorted.
///
/// A thread can be stopped where its own frame pointers are half written:
/// - 3.11's evaluation loop stores `tstate->cframe` (pointing at its new C frame) eight
///   instructions before it fills that C frame's `current_frame` and `previous`;
/// - seen in Debian's static 3.11 under load: one dump in ~1,500 read a stale stack word
///   as a frame;
/// - no memory says where the stack was then.
///
/// Such a thread has no stack to report at that instant. So the process runs again and is
/// paused anew, up to [`BLOCKING_PAUSES`] times in all. What still fails after that is
/// reported as the thread's error.
///
/// The first pause leaves out the threads of [`RestTracker`]'s `unpaused`. One that turns
/// out to have changed is an error of this kind, and the next pause takes every thread.
pub(super) fn read_blocking(
    proc: &PythonProcess,
    walker: &mut StackWalker,
    tids: &[i32],
    rest: &RestTracker,
    opcodes: Option<&crate::python_bindings::opcodes::Opcodes>,
    mut extra: PausedReads,
) -> Result<Vec<ThreadResult>> {
    let mut pauses = 0;
    let mut leave_out = !rest.unpaused.is_empty();
    loop {
        pauses += 1;
        let paused_tids: Vec<i32> = if leave_out {
            tids.iter()
                .copied()
                .filter(|t| !rest.unpaused.contains(t))
                .collect()
        } else {
            tids.to_vec()
        };
        // A thread left running is one of `unpaused`, or one not listed (it appeared since).
        // (By our kernel id, because the one a thread state records is the target's, which
        // in a PID namespace of its own is another.)
        let ids = KernelIds::new(proc, tids, &rest.tids_by_thread);
        let not_paused = |t: &stack::RawThread| -> bool {
            leave_out
                && ids.of(t).is_none_or(|tid| {
                    rest.unpaused.contains(&tid) || tids.binary_search(&tid).is_err()
                })
        };
        let read = {
            // Left out, the threads expected unchanged are not stopped, nor is any thread
            // that appears meanwhile (read unpaused, it is an error of its own). When none
            // is left to stop, the read is made with none stopped.
            let _paused = match (leave_out, paused_tids.is_empty()) {
                (false, _) => Some(PausedThreads::pause_from(proc.pid, &paused_tids)?),
                (true, false) => Some(PausedThreads::pause_threads(proc.pid, &paused_tids)?),
                (true, true) => None,
            };
            // Nothing changes while paused, so one page cache serves the whole snapshot,
            // starting with the pages the last snapshot needed, fetched in one request.
            let cache = ptrace::PageCache::new(&proc.mem);
            if let Some(states) = walker.list_hint(rest.list_whole) {
                cache.prefetch(&states);
            }
            cache.prefetch(&walker.page_hint);
            let mut read = read_all(proc, &cache, walker, rest, &not_paused).map(|mut t| {
                tag_native(&cache, opcodes, &mut t);
                t
            });
            walker.page_hint = hint_from(&cache);
            if let (Some(opts), Ok(t)) = (extra.locals, &mut read) {
                read_locals(proc, &cache, opts, t);
            }
            if let (Some((reader, out)), Ok(t)) = (extra.tasks.as_mut(), &read) {
                **out = Some(read_tasks(reader, proc, &cache, walker, t));
            }
            // `sys.modules` through the snapshot's cache (a look per dump, greenlet or
            // not); the collector's lists through a cache of their own (they visit many
            // more pages than the snapshot's keeps).
            if let (Some(out), Ok(t)) = (extra.greenlets.as_mut(), &read) {
                **out = read_greenlets(proc, &cache, &proc.mem, walker, t);
            }
            // Which of the threads stopped were waiting, and so were woken by the pause
            // (each pause of a snapshot that pauses again does).
            if let Some(p) = &_paused {
                let waited = |&tid: &i32| woke_from_wait(p, proc.pid, tid);
                extra.woken.extend(p.tids().iter().filter(|t| waited(t)));
            }
            // Registers and stacks, straight from the process (not the page cache).
            if let Some((process, out)) = extra.native.as_mut() {
                **out = match &_paused {
                    Some(p) => process.capture_all(p, &proc.mem),
                    None => Vec::new(),
                };
            }
            // The CPU time of each thread that could not be read while it ran its own code
            // (stopped outside any system call), taken while it cannot run.
            let torn: Vec<(i32, u64)> = match &read {
                Ok(t) if pauses < BLOCKING_PAUSES => {
                    let failed = t.iter().filter(|(_, w, _)| w.is_err());
                    failed.filter_map(|(r, _, _)| ids.of(r)).collect()
                }
                _ => Vec::new(),
            }
            .into_iter()
            .filter(|&tid| {
                crate::proc::blocked_syscall(proc.pid, tid).is_some_and(|(nr, _)| nr < 0)
            })
            .filter_map(|tid| Some((tid, crate::proc::thread_run_ns(proc.pid, tid)?)))
            .collect();
            (read, torn)
            // `_paused` drops here, so every thread runs again before we do anything else.
        };
        match read {
            (Ok(t), torn) if pauses < BLOCKING_PAUSES && t.iter().any(|(_, w, _)| w.is_err()) => {
                leave_out = false;
                // Caught mid-way (a frame half linked), a thread needs to run a few
                // instructions before it can be read. On a loaded machine it may wait for a
                // CPU longer than we take to pause again (seen: three pauses in a row found
                // the same thread at the same instant).
                crate::proc::wait_until_ran(proc.pid, &torn, RUN_AGAIN_WAIT);
            }
            (r, _) => return r,
        }
    }
}

/// Reads everything while the threads are paused (one pause), or in memory that cannot
/// change (a core's, with `still`).
pub(super) fn read_all(
    proc: &PythonProcess,
    mem: &dyn ProcessMemory,
    walker: &mut StackWalker,
    rest: &RestTracker,
    not_paused: &dyn Fn(&stack::RawThread) -> bool,
) -> Result<Vec<ThreadResult>> {
    let reuse = &rest.reuse;
    let head = interp_head_checked(proc, mem)?;
    let raw = walker.threads(mem, head, gil_current(proc, mem)?, rest.rested())?;
    let mut out = Vec::with_capacity(raw.len());
    walker.left_out = 0;
    for t in raw {
        if is_unchanged(&t, reuse) {
            keep_unchanged(walker, rest, &mut out, t);
            continue;
        }
        if not_paused(&t) {
            // Expected unchanged, left running, yet it moved, so it is not to be walked
            // unpaused.
            let e = ThreadError::new(Unread::Changed, "it ran while it was not paused");
            out.push((t, Err(e), None));
            continue;
        }
        let walk = match walker
            .walk_still(mem, t.tstate, t.top_frame)
            .and_then(|mut w| {
                if walker.want_anchors && w.anchors.is_empty() {
                    w.anchors = native::cframe_anchors(walker, mem, t.tstate)?;
                }
                Ok(w)
            }) {
            Ok(w) => Ok(w),
            Err(e) if e.is_process_gone() => return Err(e),
            Err(e) => Err(ThreadError::from_error("", &e)),
        };
        out.push((t, walk, None));
    }
    Ok(out)
}

/// Every shown frame's locals of each thread read, through `mem` (the pause's page cache),
/// under one budget for the whole snapshot.
pub(super) fn read_locals(
    proc: &PythonProcess,
    mem: &dyn ProcessMemory,
    opts: &LocalsOptions,
    threads: &mut [ThreadResult],
) {
    let (major, minor) = proc.layout.version;
    let objects = crate::python_bindings::object_layout(major, minor, proc.layout.free_threaded);
    let budgeted = locals::Budgeted::new(mem, opts.budget);
    for (_, walk, _) in threads.iter_mut() {
        let Ok(w) = walk else { continue };
        let frames: Vec<u64> = w
            .chain
            .iter()
            .zip(&w.shown)
            .filter(|(_, &shown)| shown)
            .map(|(&a, _)| a)
            .take(w.frames.len())
            .collect();
        w.locals = match objects {
            Some(o) => {
                let l = LocalsLayout {
                    layout: &proc.layout,
                    objects: o,
                    types: &proc.addrs.types,
                };
                locals::read_frames(&l, &budgeted, &frames, opts.bounds)
            }
            None => {
                let why = format!("no layout of the objects of Python {major}.{minor}");
                frames.iter().map(|_| Err(why.clone())).collect()
            }
        };
    }
}
