//! Threads at rest: what a caller that reads one process again and again knows of the
//! threads that have not run since their last read.
//!
//! Owns: [`RestTracker`], the one home of that protocol.
//! - Which threads a snapshot may leave unwalked (by `thread_id`, with the frame their last
//!   read started from), and their kernel ids, which a paused read leaves running.
//! - Each resting thread's last read (its frames), what it is charged to meanwhile.
//! - Each thread's kernel id as the last snapshot matched it (before 3.11 a thread state
//!   does not record it).
//! - What changed in that map since the last snapshot ([`ReuseDelta`]), so the thread list
//!   is read only for the threads that did not rest.
//!
//! Must not: decide that a thread has not run. The caller says so (the sampler, from its
//! CPU times and scheduler states); this module only keeps what follows from it.
//!
//! The walker's own cache of the thread list's memory (`stack::KnownStates`) is not kept
//! here, because it caches bytes of the target, checked against [`ReuseDelta::epoch`], and
//! holds no decision about rest.

use super::frame::Frame;
use super::snapshot::Snapshot;
use crate::{IdMap, IdSet};

/// What changed in the resting map since the caller's snapshot before, as the `thread_id`s
/// whose entry was added, removed or changed.
///
/// `epoch` counts the caller's snapshots (one more than that of the map before). A snapshot
/// that missed one, or a read of the list in between, reads the list the whole way.
#[derive(Debug, Clone, Default)]
pub struct ReuseDelta {
    pub epoch: u64,
    pub threads: Vec<u64>,
}

/// A thread's stack as last read, and the frame its thread state named then.
#[derive(Debug)]
pub(crate) struct LastRead {
    /// Its `pthread_t` (what a snapshot knows it by before its kernel id).
    pub(crate) thread_id: u64,
    pub(crate) top_frame: u64,
    pub(crate) frames: Vec<Frame>,
    pub(crate) in_native: Option<bool>,
}

/// How a sample's threads compare with the last sample's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Listing {
    Same,
    /// Only new ones.
    Added,
    /// One or more of the last sample's are gone.
    Left,
}

/// Everything known of the threads at rest, passed by `&mut` to
/// [`super::PythonReader::snapshot_resting`]. An empty tracker (`default()`) knows
/// nothing, so every thread is walked, as `dump` wants.
#[derive(Debug, Default)]
pub struct RestTracker {
    /// Threads that did not run since their last read, by `thread_id` (their `pthread_t`,
    /// which every version records and no PID namespace changes), with the innermost frame
    /// that read found. One whose thread state still names that frame, and that does not
    /// hold the GIL, is not walked again (`ThreadSnapshot::unchanged`).
    pub(super) reuse: IdMap<u64, u64>,
    /// The kernel ids (ours) of the threads of `reuse`. A paused read does not pause them.
    /// One that turns out to have changed (its top frame moved, or it holds the GIL) cannot
    /// be read unpaused. The process is then paused whole and read again. So a thousand
    /// parked threads cost a paused read nothing.
    pub(super) unpaused: IdSet<i32>,
    /// Kernel ids (ours) by `thread_id`, as an earlier snapshot matched them. Before 3.11 a
    /// thread state does not record its kernel id, and a stack to be read again paused
    /// would otherwise pause every thread (waking those that wait).
    pub(super) tids_by_thread: IdMap<u64, i32>,
    /// Leave the threads found unchanged out of the snapshot. A caller that keeps their
    /// last reads and needs nothing of them this time (CPU time only) saves an entry per
    /// thread of a pool at rest at every sample.
    pub(super) omit_unchanged: bool,
    /// Read every thread state of the list, those at rest too. When a thread left, the state
    /// before its own still links to it.
    pub(super) list_whole: bool,
    /// Under `omit_unchanged`, the most threads walked (the GIL holder aside). The others
    /// that need a walk are left out (counted in `walker.deferred`), and the next snapshot
    /// starts where this one stopped.
    pub(super) max_walks: Option<usize>,
    /// What changed in `reuse` since the last snapshot, for this one. None when not known
    /// (the map was made anew).
    pub(super) delta: Option<ReuseDelta>,
    /// Each thread's last read (not of a thread holding the GIL), by kernel id.
    last_read: IdMap<i32, LastRead>,
    /// The `thread_id` of each kernel id in `reuse`.
    reuse_by_tid: IdMap<i32, u64>,
    /// Whether `reuse` and `unpaused` hold for the last sample's state.
    reuse_kept: bool,
    /// The threads the last sample read (to be looked at again).
    touched: Vec<i32>,
    /// The `thread_id`s taken out of or put into `reuse` since the last snapshot (None when
    /// made anew), and the snapshots taken so far.
    changes: Option<Vec<u64>>,
    epoch: u64,
    /// Each thread's kernel id by `thread_id`, as the last snapshot matched them.
    last_tids: IdMap<u64, i32>,
}

impl RestTracker {
    /// Decides which threads the next snapshot may leave unread. They are those `still` says
    /// did not run since their last read (and were not running then), whose last read is
    /// kept.
    ///
    /// - `moved`: the threads whose CPU time changed since the last sample, when the caller
    ///   knows (the process clock). With the same listing as last time, only those and the
    ///   threads the last sample read are looked at again, so a thousand threads at rest
    ///   cost nothing here.
    /// - Otherwise (a new listing, no such knowledge), every kept thread is looked at.
    pub(crate) fn plan(
        &mut self,
        listing: Listing,
        moved: Option<&[i32]>,
        still: &dyn Fn(i32) -> bool,
    ) {
        let moved = match moved {
            Some(m) if listing == Listing::Same && self.reuse_kept => m,
            _ => {
                self.reuse.clear();
                self.unpaused.clear();
                self.reuse_by_tid.clear();
                self.changes = None;
                let tids: Vec<i32> = self.last_read.keys().copied().collect();
                for tid in tids {
                    self.reconsider(tid, still);
                }
                self.reuse_kept = true;
                self.touched.clear();
                return;
            }
        };
        let mut again = std::mem::take(&mut self.touched);
        again.extend_from_slice(moved);
        for &tid in &again {
            self.reconsider(tid, still);
        }
        again.clear();
        self.touched = again;
        #[cfg(debug_assertions)]
        {
            // What the whole would have given (at every sample of the debug build's tests).
            let whole: IdMap<u64, u64> = self
                .last_read
                .iter()
                .filter(|(&tid, _)| still(tid))
                .map(|(_, l)| (l.thread_id, l.top_frame))
                .collect();
            assert_eq!(self.reuse, whole, "the reuse kept from the last sample");
            assert_eq!(self.unpaused.len(), whole.len());
        }
    }

    /// Puts thread `tid` into `reuse` and `unpaused`, or takes it out, as `still` says.
    fn reconsider(&mut self, tid: i32, still: &dyn Fn(i32) -> bool) {
        if let Some(thread) = self.reuse_by_tid.remove(&tid) {
            self.reuse.remove(&thread);
            self.unpaused.remove(&tid);
            if let Some(c) = &mut self.changes {
                c.push(thread);
            }
        }
        let Some(last) = self.last_read.get(&tid).filter(|_| still(tid)) else {
            return;
        };
        let (thread, top) = (last.thread_id, last.top_frame);
        if let Some(c) = &mut self.changes {
            c.push(thread);
        }
        self.reuse.insert(thread, top);
        self.unpaused.insert(tid);
        self.reuse_by_tid.insert(tid, thread);
    }

    /// Sets how the next snapshot treats the threads at rest.
    ///
    /// - `omit_unchanged`: they are left out of it, at most `max_walks` others walked.
    /// - `listing`: a thread left, so the list is read whole.
    /// - `kernel_ids`: thread states do not record their kernel ids (before 3.11), so the
    ///   last snapshot's matches of the threads `listed` are given to it.
    pub(crate) fn prepare(
        &mut self,
        omit_unchanged: bool,
        max_walks: usize,
        listing: Listing,
        kernel_ids: bool,
        listed: &dyn Fn(i32) -> bool,
    ) {
        self.omit_unchanged = omit_unchanged;
        self.max_walks = Some(max_walks);
        self.list_whole = listing == Listing::Left;
        self.tids_by_thread.clear();
        if kernel_ids {
            self.tids_by_thread.extend(
                self.last_tids
                    .iter()
                    .filter(|(_, &tid)| listed(tid))
                    .map(|(&thread, &tid)| (thread, tid)),
            );
        }
        self.epoch += 1;
        let epoch = self.epoch;
        self.delta = self
            .changes
            .replace(Vec::new())
            .map(|threads| ReuseDelta { epoch, threads });
    }

    /// Takes what a snapshot found:
    /// - the room of this snapshot's delta back;
    /// - each thread's kernel id (`tids`: the listing, ascending; `listed_anew`: it changed
    ///   since the last sample);
    /// - which threads were read.
    pub(crate) fn absorb(&mut self, snap: &Snapshot, tids: &[i32], listed_anew: bool) {
        // Nothing changed `reuse` since `prepare`, so the delta's room is the next one's.
        if let Some(mut d) = self.delta.take() {
            d.threads.clear();
            self.changes = Some(d.threads);
        }
        // The same kernel ids as last time for threads that stay (only changes written). A
        // thread left out of the snapshot keeps its entry while it is listed.
        if listed_anew {
            self.last_tids
                .retain(|_, tid| tids.binary_search(tid).is_ok());
        } else if !self.omit_unchanged && self.last_tids.len() > snap.threads.len() {
            self.last_tids.clear();
        }
        for t in &snap.threads {
            if let Some(tid) = t.native_id {
                if self.last_tids.get(&t.thread_id) != Some(&tid) {
                    self.last_tids.insert(t.thread_id, tid);
                }
                if !t.unchanged {
                    self.touched.push(tid);
                }
            }
        }
    }

    /// The kernel id (ours) the last snapshot matched to `thread_id`.
    pub(crate) fn kernel_id(&self, thread_id: u64) -> Option<i32> {
        self.last_tids.get(&thread_id).copied()
    }

    /// Thread `tid`'s last read, while it is kept.
    pub(crate) fn last_read(&self, tid: i32) -> Option<&LastRead> {
        self.last_read.get(&tid)
    }

    /// Keeps thread `tid`'s read as its last (one that holds still only if it rests).
    pub(crate) fn keep(&mut self, tid: i32, read: LastRead) {
        self.last_read.insert(tid, read);
    }

    /// Forgets thread `tid`'s last read (it held the GIL, or failed).
    pub(crate) fn forget(&mut self, tid: i32) {
        self.last_read.remove(&tid);
    }

    /// Forgets what is kept of the threads `listed` no longer names.
    pub(crate) fn retain(&mut self, listed: &dyn Fn(i32) -> bool) {
        self.last_read.retain(|&t, _| listed(t));
    }

    /// The threads the thread list may take as last found (none for a whole read).
    pub(super) fn rested(&self) -> Option<&IdMap<u64, u64>> {
        (!self.list_whole).then_some(&self.reuse)
    }
}
