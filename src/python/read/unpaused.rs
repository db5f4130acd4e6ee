//! The read without pausing. Nothing is stopped, and a stack is kept only when a second
//! look at its frames, right after the walk, finds them the same.
//!
//! Owns:
//! - [`read_nonblocking`] (the thread list, every walk from one pre-filled page cache, each
//!   walk verified);
//! - [`thread_list`] (the list, retried afresh when it tears);
//! - [`Recheck`] (what the next snapshot's second look reads).
//!
//! Must not: pause a thread (a stack that fails verification is retried, or left for
//! `reread`), or guess a stack it could not verify.

use super::{gil_current, hint_from, interp_head_checked, is_unchanged, keep_unchanged};
use crate::error::{Error, Result};
use crate::ptrace::{self, ProcessMemory};
use crate::python::process::PythonProcess;
use crate::python::rest::RestTracker;
use crate::python::snapshot::{ReadMode, SnapshotOptions, ThreadError, ThreadResult, Unread};
use crate::python::stack::{self, StackWalker, Walk};

/// The interpreter's threads, read without pausing from `cache` first, then afresh, in up to
/// `tries` tries. With them:
/// - whether the first try found everything in the cache (then `verify` may check a walk
///   against the cache's second look);
/// - how many threads at rest were left out (under `omit_unchanged`, see
///   [`StackWalker::threads_in_sample`]).
fn thread_list(
    proc: &PythonProcess,
    walker: &mut StackWalker,
    cache: &ptrace::PageCache,
    opts: &SnapshotOptions,
    rest: &RestTracker,
) -> Result<(Vec<stack::RawThread>, bool, usize)> {
    let delta = rest.delta.as_ref().filter(|_| rest.omit_unchanged);
    let mut last_err = None;
    for attempt in 0..opts.retries.max(1) {
        let fresh = ptrace::PageCache::new(&proc.mem);
        // A try after a failed one reads every state (see `stack::KnownStates`), the
        // states as last found, in one request (not one system call each).
        if attempt > 0 {
            if let Some(states) = walker.list_hint(true) {
                fresh.prefetch(&states);
            }
        }
        let mem = first_then_fresh(attempt, cache, &fresh);
        let read = interp_head_checked(proc, mem).and_then(|head| {
            let gil = gil_current(proc, mem)?;
            walker.threads_in_sample(mem, head, gil, rest.rested(), delta)
        });
        match read {
            Ok((r, left_out)) => return Ok((r, attempt == 0 && cache.misses() == 0, left_out)),
            Err(e) if e.is_process_gone() => return Err(e),
            Err(e) => last_err = Some(e),
        }
    }
    Err(last_err.expect("at least one try"))
}

/// Reads without pausing. A thread's stack is accepted only when, after the walk:
/// - every frame of its chain read again (in one request) gives the same frame, line and
///   link;
/// - then the thread's innermost frame is still the one the walk started from.
///
/// That is what a second walk would show, at the cost of one system call. (An unchanged top
/// pointer alone proves nothing. ≤3.10 reuses a function's frame object at the same address
/// for its next call, and 3.11+ reuses the same slots of the frame stack.) Otherwise it is
/// read again, and after `retries` tries reported as unreadable. It is never guessed.
pub(super) fn read_nonblocking(
    proc: &PythonProcess,
    walker: &mut StackWalker,
    opts: &SnapshotOptions,
    rest: &RestTracker,
) -> Result<Vec<ThreadResult>> {
    // One page cache for the thread list and every thread's first walk, filled at once
    // with the pages the last snapshot needed. What it holds is checked by `verify`. The
    // same request reads the last snapshot's frames and top-frame fields a second time
    // (`second`). A first walk that found everything in the cache is verified against that,
    // microseconds after what it read, without another system call.
    let cache = ptrace::PageCache::new(&proc.mem);
    // A whole read of the thread list is due. The states of the threads at rest come in
    // one request (once a second; no hint has them).
    if let Some(states) = walker
        .list_hint(rest.list_whole)
        .or_else(|| rest.rested().and_then(|r| walker.ran_hint(r)))
    {
        cache.prefetch(&states);
    }
    let second = cache.prefetch_with_second_look(&walker.page_hint, &walker.recheck_hint);
    let (raw, clean, left_out) = thread_list(proc, walker, &cache, opts, rest)?;
    walker.left_out = left_out;
    let auto = opts.mode == ReadMode::Auto;
    walker.deferred = 0;
    // Under a bound on walks, from where the last snapshot stopped (in list order).
    let bound = rest.max_walks.filter(|_| rest.omit_unchanged);
    let mut raw = raw;
    let start = match bound {
        Some(_) if !raw.is_empty() => walker.walk_cursor % raw.len(),
        _ => 0,
    };
    raw.rotate_left(start);
    // The innermost frames of the threads to walk, in one request. Those of threads new
    // or back from a rest are in no hint (one system call each otherwise; a pool of a
    // thousand threads starting, or woken at once, has hundreds of them in a sample).
    let fetched = cache.fetches();
    let tops: Vec<(u64, usize)> = raw
        .iter()
        .filter(|t| {
            t.top_frame != 0
                && !is_unchanged(t, &rest.reuse)
                && !(auto && opts.pause_these.contains(&t.thread_id))
        })
        .take(bound.map_or(usize::MAX, |b| b + 1))
        // A busy thread's frames came with the first request (the last snapshot's pages).
        .filter(|t| !cache.holds(t.top_frame, walker.layout.frame.size))
        .map(|t| walker.top_span(t.top_frame))
        .collect();
    cache.prefetch(&tops);
    // That request came after the second look. A walk may hold bytes read after it, and
    // is then verified by a read of its own.
    let late = cache.fetches() > fetched;
    let mut recheck = Recheck::default();
    let mut out = Vec::with_capacity(raw.len());
    let stack_tries = if auto { 1 } else { opts.retries.max(1) };
    let mut skipped = false;
    let (n, mut walks, mut stopped_at) = (raw.len(), 0, None);
    for (k, mut t) in raw.into_iter().enumerate() {
        if is_unchanged(&t, &rest.reuse) {
            keep_unchanged(walker, rest, &mut out, t);
            continue;
        }
        if let Some(most) = bound {
            if walks >= most && !t.holds_gil {
                walker.deferred += 1;
                stopped_at.get_or_insert((start + k) % n);
                continue;
            }
            walks += 1;
        }
        if auto && opts.pause_these.contains(&t.thread_id) {
            skipped = true;
            out.push((
                t,
                Err(ThreadError::new(Unread::Deferred, "to be read paused")),
                None,
            ));
            continue;
        }
        let mut result = Err(ThreadError::new(Unread::Other, "not read"));
        for attempt in 0..stack_tries {
            if attempt > 0 {
                match walker.current_top_frame(&proc.mem, t.tstate) {
                    Ok(top) => t.top_frame = top,
                    Err(e) if e.is_process_gone() => return Err(e),
                    Err(e) => {
                        result = Err(ThreadError::new(
                            Unread::ThreadState,
                            format!("thread state unreadable: {e}"),
                        ));
                        break;
                    }
                }
            }
            let tries = attempt + 1;
            // A retry reads afresh, because the shared cache may hold what changed.
            let fresh = ptrace::PageCache::new(&proc.mem);
            let mem = first_then_fresh(attempt, &cache, &fresh);
            let misses = cache.misses();
            let walk = walker.walk(mem, t.top_frame).and_then(|mut w| {
                // Everything this walk read came from the prefetch, so the second look, taken
                // after it, can verify it. Otherwise (a miss was read after the second look)
                // the process is read again now.
                let early = attempt == 0 && clean && !late && cache.misses() == misses;
                let again: &dyn ProcessMemory = if early { &second } else { &proc.mem };
                let same = walker.verify(again, t.tstate, &mut w, Some(mem))?;
                Ok((w, same))
            });
            match walk {
                Ok((w, true)) => {
                    recheck.add(walker, t.tstate, &w);
                    result = Ok(w);
                    break;
                }
                Ok((_, false)) => {
                    result = Err(ThreadError::new(
                        Unread::Changed,
                        format!("the stack changed while being read ({tries} tries)"),
                    ))
                }
                Err(e) if e.is_process_gone() || !crate::proc::process_exists(proc.pid) => {
                    return Err(Error::ProcessExited(proc.pid))
                }
                Err(e) => {
                    result = Err(ThreadError::from_error(
                        &format!("the stack changed while being read ({tries} tries)"),
                        &e,
                    ))
                }
            }
        }
        out.push((t, result, None));
    }
    walker.walk_cursor = stopped_at.unwrap_or(0);
    // A thread left to be read paused used nothing here. The pages it needs are in the
    // last hint, kept for that read, right after. They are kept only for it, because merged
    // into the next hint, the pages of threads read once would stay in every hint after.
    let hint = hint_from(&cache);
    let last = std::mem::replace(&mut walker.page_hint, hint);
    walker.reread_hint = if skipped { last } else { Vec::new() };
    // Into the last hint's room (it was read by the prefetch above).
    recheck.ranges_into(&mut walker.recheck_hint);
    Ok(out)
}

/// What the next snapshot's second look reads: every verified thread's frames (the ranges
/// its verification read), then the fields that name its innermost frame, in that order
/// (verification reads the frames before the field). Bounded.
#[derive(Default)]
struct Recheck {
    frames: Vec<(u64, usize)>,
    fields: Vec<(u64, usize)>,
}

impl Recheck {
    const MAX_RANGES: usize = 64;
    const MAX_BYTES: usize = 64 * 1024;

    fn add(&mut self, walker: &StackWalker, tstate: u64, w: &Walk) {
        let l = &walker.layout;
        let size = l.frame.size as u64;
        // 3.11+ keeps frames side by side in a frame stack that grows upwards. A little
        // room above the innermost one covers a stack one or two calls deeper next time.
        let room = if matches!(
            l.frame.model,
            crate::python_bindings::FrameModel::Interpreter
        ) {
            4 * size
        } else {
            0
        };
        // The ranges verification read the chain in (`stack::spans` of it).
        for &(start, end) in &w.spans {
            self.frames.push((start, (end - start + room) as usize));
        }
        self.fields
            .push((tstate.wrapping_add(l.thread.frame as u64), 8));
        if let (Some(off), Some(cframe)) = (l.thread.cframe_current_frame, w.top_field) {
            if cframe != 0 {
                self.fields.push((cframe.wrapping_add(off as u64), 8));
            }
        }
    }

    /// The ranges, bounded, in place of what `out` held.
    fn ranges_into(self, out: &mut Vec<(u64, usize)>) {
        out.clear();
        let mut bytes = 0;
        for r in self.frames.into_iter().chain(self.fields) {
            if out.len() >= Self::MAX_RANGES || bytes + r.1 > Self::MAX_BYTES {
                break;
            }
            bytes += r.1;
            out.push(r);
        }
    }
}

/// The shared, pre-filled cache for a first attempt; an empty one for a retry (the shared
/// one may hold what changed). An unused cache costs nothing, because pages are read on demand.
fn first_then_fresh<'a>(
    attempt: usize,
    shared: &'a ptrace::PageCache<'a>,
    fresh: &'a ptrace::PageCache<'a>,
) -> &'a dyn ProcessMemory {
    if attempt == 0 {
        shared
    } else {
        fresh
    }
}
