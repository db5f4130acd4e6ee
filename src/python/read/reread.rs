//! The auto mode's fallback: the stacks a read without pausing could not verify, read
//! again with their threads stopped.
//!
//! Owns: [`reread_paused`] (which threads to stop, at most [`MAX_REREADS`], by kernel id
//! where known, else all) and the page hint it leaves the next snapshot ([`with_hint`]).
//! Must not: stop a thread whose stack was verified, or one that is no longer the
//! target's.

use super::{hint_from, MAX_HINT_PAGES};
use crate::error::Result;
use crate::ptrace::{self, pause::PausedThreads, ProcessMemory};
use crate::python::process::PythonProcess;
use crate::python::snapshot::{ThreadError, ThreadResult};
use crate::python::stack::{self, StackWalker};
use crate::python::tids::KernelIds;
use std::collections::HashMap;

/// Most threads a snapshot re-reads paused (see [`reread_paused`]). A pool whose threads
/// all wake at once (to end, say) fails hundreds of reads without pausing in one sample,
/// and pausing each would cost the target and us a millisecond per twenty. The others
/// are lost (counted) for that sample.
const MAX_REREADS: usize = 16;

/// Most pages a paused re-read fetches up front (see [`reread_paused`]).
const REREAD_PREFETCH_PAGES: usize = 64;

/// Reads again, with the threads paused, the stacks that a read without pausing could not
/// validate (they kept changing). Paused, nothing is torn, so the strict checks (meant to
/// catch torn reads) are off, as in `--blocking`. They would reject the transitional states
/// a thread can be stopped in (a generator marked suspended one instruction before its
/// frame leaves the chain). A failure to pause leaves the results as they were (unreadable).
pub(super) fn reread_paused(
    proc: &PythonProcess,
    walker: &mut StackWalker,
    tids: &[i32],
    tids_by_thread: &crate::IdMap<u64, i32>,
    threads: &mut [ThreadResult],
) -> Result<()> {
    // Only a thread itself changes its stack, so pausing the threads to re-read is enough
    // when their kernel ids are known (recorded in the thread state on 3.11+, else as an
    // earlier snapshot matched them). Else every thread is paused.
    //
    // 3.11+ records every thread's kernel id once it runs. A thread state without one
    // (0) belongs to a thread not started yet (or ending), with no frame to read. It is
    // left unread rather than pausing every thread for it (a thousand threads starting
    // would each cost a pause of them all).
    let reread = |t: &stack::RawThread, w: &std::result::Result<stack::Walk, ThreadError>| {
        w.is_err() && (t.native_id.is_some() || walker.layout.thread.native_thread_id.is_none())
    };
    let mut marks: Vec<bool> = threads.iter().map(|(t, w, _)| reread(t, w)).collect();
    if !marks.contains(&true) {
        return Ok(());
    }
    let ids = KernelIds::new(proc, tids, tids_by_thread);
    // A kernel id read from the target's memory is paused only when it is one of the
    // target's threads, that is, listed (`tids` is sorted), or new since and in its task
    // list.
    let of_target = |t: &i32| {
        tids.binary_search(t).is_ok()
            || std::path::Path::new(&format!("/proc/{}/task/{t}", proc.pid)).exists()
    };
    // A thread whose kernel id is known but no longer the target's has exited, so there is
    // nothing to read (a pool of threads ending together once paused every thread for it, a
    // thousand at a time). Past [`MAX_REREADS`] the others are left unread too.
    let mut only = Some(Vec::new());
    let mut kept = 0;
    for ((t, _, _), m) in threads.iter().zip(marks.iter_mut()).filter(|(_, m)| **m) {
        match ids.of(t) {
            Some(id) if !of_target(&id) => *m = false,
            _ if kept >= MAX_REREADS => *m = false,
            Some(id) => {
                kept += 1;
                if let Some(o) = only.as_mut() {
                    o.push(id);
                }
            }
            None => {
                kept += 1;
                only = None;
            }
        }
    }
    if kept == 0 {
        return Ok(());
    }
    // Two thread states can name one thread, because 3.11 starts a new thread's state with
    // the id of the thread that creates it, until the new thread runs. A thread is paused
    // once.
    let only = only.map(|mut ours| {
        ours.sort_unstable();
        ours.dedup();
        ours
    });
    let paused = match &only {
        Some(ours) => PausedThreads::pause_threads(proc.pid, ours),
        None => PausedThreads::pause_from(proc.pid, tids),
    };
    let _paused = match paused {
        Ok(p) => p,
        Err(e) if e.is_process_gone() => return Err(e),
        Err(_) => return Ok(()),
    };
    // What the reads without pausing needed is fetched in one request, unless that is
    // mostly other threads' (a thread list of hundreds). Then the few threads re-read
    // fetch their pages as they go.
    let cache = ptrace::PageCache::new(&proc.mem);
    let earlier = std::mem::take(&mut walker.reread_hint);
    if walker.page_hint.len() + earlier.len() <= REREAD_PREFETCH_PAGES {
        cache.prefetch(&walker.page_hint);
        cache.prefetch(&earlier);
    }
    let strict = std::mem::replace(&mut walker.strict, false);
    let result = reread_each(walker, &cache, threads, &marks);
    walker.strict = strict;
    drop(_paused);
    // The next snapshot's prefetch is what this paused read used as well as what the read
    // without pausing did. For a thread read paused without a try, the latter is only the
    // thread list, and the next paused read would fetch every frame page on its own, one
    // system call each, while the thread waits. What neither used is left out.
    let kept = std::mem::take(&mut walker.page_hint);
    walker.page_hint = with_hint(hint_from(&cache), kept);
    result
}

/// The paused re-read proper of [`reread_paused`].
fn reread_each(
    walker: &mut StackWalker,
    cache: &ptrace::PageCache,
    threads: &mut [ThreadResult],
    marks: &[bool],
) -> Result<()> {
    for ((t, walk, _), _) in threads.iter_mut().zip(marks).filter(|(_, &m)| m) {
        let read = walker
            .current_top_frame(cache, t.tstate)
            .and_then(|top| {
                t.top_frame = top;
                walker.walk_still(cache, t.tstate, top)
            })
            .map(|mut w| {
                // The opcode too, while the thread cannot move on.
                if let Some(at) = w.top_instr {
                    let mut op = [0u8; 1];
                    if cache.read(at, &mut op).is_ok() {
                        w.top_op = Some(op[0]);
                    }
                }
                w.paused = true;
                w
            });
        match read {
            Ok(w) => *walk = Ok(w),
            Err(e) if e.is_process_gone() => return Err(e),
            Err(e) => {
                *walk = Err(ThreadError::from_error(
                    "unreadable even with the thread paused",
                    &e,
                ))
            }
        }
    }
    Ok(())
}

/// `hint` and `more` together, one range per page as each of them is (on a page both
/// name, the span covering both ranges), bounded.
fn with_hint(mut hint: Vec<(u64, usize)>, more: Vec<(u64, usize)>) -> Vec<(u64, usize)> {
    let page = |a: u64| a & !(ptrace::CACHE_PAGE - 1);
    let mut at: HashMap<u64, usize> = hint
        .iter()
        .enumerate()
        .map(|(i, h)| (page(h.0), i))
        .collect();
    for (addr, len) in more {
        let end = addr + len as u64;
        if let Some(h) = at.get(&page(addr)).map(|&i| &mut hint[i]) {
            let start = h.0.min(addr);
            h.1 = ((h.0 + h.1 as u64).max(end) - start) as usize;
            h.0 = start;
        } else if hint.len() < MAX_HINT_PAGES {
            at.insert(page(addr), hint.len());
            hint.push((addr, len));
        }
    }
    hint
}
