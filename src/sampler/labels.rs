//! What the per-thread report calls each thread: its OS name, the name the program gave it
//! (`threading`), and the interpreters it ran in.
//!
//! Owns: [`ThreadLabels`].
//! - The names are read when a thread the recording has not named yet appears in a sample,
//!   soon again while one has no Python name yet, and every [`REFRESH`] for renames.
//! - They are never read closer together than their reading's cost allows (see
//!   [`COST_SHARE`]).
//! - The interpreters come from the thread states each sample charges.
//!
//! Must not: read names at every sample, or charge time.

use crate::profile::{Aggregator, ThreadLabel};
use crate::python::{PythonReader, Snapshot};
use crate::IdMap;
use std::time::{Duration, Instant};

/// How often the names are read again though every thread was named before, because a
/// program renames a thread (`t.name = ...`, or the OS name with `prctl`) now and then.
const REFRESH: Duration = Duration::from_secs(2);

/// A thread found without a Python name is looked for again this soon, this many times. A
/// thread enters `threading`'s list only once it runs (its state is made before, by the
/// thread that starts it, so the first look at a new thread often comes too early), and a
/// program may import `threading` late. A thread of C code that never has one costs these
/// few reads, over its first half second.
const SOON: Duration = Duration::from_millis(50);
const SOON_TRIES: u8 = 10;

/// The least time between two reads of the names, so a pool starting a thread a millisecond
/// is named twenty times a second, not at each of a 1 kHz recording's samples.
const MIN_GAP: Duration = Duration::from_millis(50);

/// The most of the sampler's time the names may take. The next read waits at least this
/// many times as long as the last one took (ten thousand threads named in 100 ms are read
/// again after 1 s at the soonest).
const COST_SHARE: u32 = 10;

/// Interpreters kept per thread at most (a thread that enters a thousand subinterpreters
/// is listed with the first of them).
const MAX_INTERPRETERS: usize = 64;

/// Each thread's label, by kernel id, the thread states it was seen with, and when the
/// names were last read.
#[derive(Debug, Default)]
pub(super) struct ThreadLabels {
    by_tid: IdMap<i32, ThreadLabel>,
    /// Every thread state seen, by (interpreter address, `thread_id`): its kernel id and
    /// its interpreter's id. Threads at rest are in no snapshot, so their names are
    /// read through this.
    states: IdMap<(u64, u64), (i32, i64)>,
    /// Reads that found no Python name for a thread, while it has none.
    misses: IdMap<i32, u8>,
    /// A thread state came that the names were not read for since.
    new: bool,
    read_at: Option<Instant>,
    /// The CPU time the last read of the names took (ours, because wall time would count
    /// the while a loaded machine ran others).
    cost: Duration,
}

impl ThreadLabels {
    /// Takes the thread states of `snap` (all of them, before one per kernel thread is
    /// kept) and, when one is new or the names are due, reads every known thread's Python
    /// name and the OS names of the threads that have none (on a refresh, every
    /// [`REFRESH`], those of `snap`'s threads too). Tells `agg` of each label that changed.
    /// A kernel thread with states in several interpreters takes the name of its state in
    /// the lowest-numbered one that has a name (a thread that runs a subinterpreter's code
    /// is its main interpreter's thread). A name that cannot be read leaves the last one.
    pub(super) fn name(
        &mut self,
        snap: &Snapshot,
        reader: &mut PythonReader,
        agg: &mut Aggregator,
    ) {
        for t in &snap.threads {
            let Some(tid) = t.native_id else { continue };
            let key = (t.interp_addr, t.thread_id);
            if self.states.get(&key) != Some(&(tid, t.interpreter)) {
                self.states.insert(key, (tid, t.interpreter));
                self.new = true;
            }
        }
        // A refresh reads the OS names of the threads that ran again too (else only those
        // of threads that have none yet are read).
        let mut refresh = true;
        if let Some(since) = self.read_at.map(|t| t.elapsed()) {
            let gap = |least: Duration| since >= least.max(self.cost * COST_SHARE);
            let soon = gap(SOON) && self.misses.values().any(|&n| n < SOON_TRIES);
            refresh = gap(REFRESH);
            if !((self.new && gap(MIN_GAP)) || soon || refresh) {
                return;
            }
        }
        self.read_at = Some(Instant::now());
        let began = super::cputime::own_thread_cpu();
        self.new = false;
        let wanted: Vec<(u64, u64)> = self.states.keys().copied().collect();
        let read = reader.python_names(&wanted);
        let mut python: IdMap<i32, (i64, &str)> = IdMap::default();
        for (key, &(tid, interp)) in &self.states {
            let Some(name) = read.names.get(key) else {
                continue;
            };
            match python.get(&tid) {
                Some((lowest, _)) if *lowest <= interp => {}
                _ => {
                    python.insert(tid, (interp, name));
                }
            }
        }
        let pid = reader.process().pid;
        let sampled: crate::IdSet<i32> = snap.threads.iter().filter_map(|t| t.native_id).collect();
        let mut tids: Vec<i32> = self.states.values().map(|s| s.0).collect();
        tids.sort_unstable();
        tids.dedup();
        for tid in tids {
            let label = self.by_tid.entry(tid).or_default();
            let before = label.clone();
            if label.os_name.is_none() || (refresh && sampled.contains(&tid)) {
                if let Some(os) = crate::proc::thread_name(pid, tid) {
                    label.os_name = Some(os);
                }
            }
            match python.get(&tid) {
                Some((_, name)) => {
                    if label.python_name.as_deref() != Some(name) {
                        label.python_name = Some(name.to_string());
                    }
                    self.misses.remove(&tid);
                }
                None if label.python_name.is_none() => {
                    let n = self.misses.entry(tid).or_insert(0);
                    *n = n.saturating_add(1);
                }
                None => {}
            }
            if *label != before {
                agg.label_thread(tid, label);
            }
        }
        self.cost = super::cputime::own_thread_cpu().saturating_sub(began);
    }

    /// Thread `tid` was sampled in interpreter `interp`.
    pub(super) fn ran_in(&mut self, tid: i32, interp: i64, agg: &mut Aggregator) {
        let label = self.by_tid.entry(tid).or_default();
        let list = &mut label.interpreters;
        if let Err(at) = list.binary_search(&interp) {
            if list.len() < MAX_INTERPRETERS {
                list.insert(at, interp);
                agg.label_thread(tid, label);
            }
        }
    }

    /// Forgets the threads `listed` no longer names (the aggregate keeps their labels).
    pub(super) fn retain(&mut self, listed: &dyn Fn(i32) -> bool) {
        self.by_tid.retain(|&t, _| listed(t));
        self.states.retain(|_, s| listed(s.0));
        self.misses.retain(|&t, _| listed(t));
    }
}
