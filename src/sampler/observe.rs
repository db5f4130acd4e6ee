//! One sample's look at the target: the thread listing, every thread's CPU time, the
//! snapshot of their stacks, and each thread's observation for the attribution.
//!
//! Owns: [`Sampler::observe`] and its parts (the listing, CPU times, which threads rest,
//! our own pauses' wake-ups, the per-thread `stat` reads), and the constants that bound
//! them.
//! Must not: charge time to lines (`attribution` and [`charge`](fn@super::charge) do) or keep
//! what is known of threads at rest (the [`python::RestTracker`] does).

use super::attribution::Observation;
use super::cputime::CpuReading;
use super::{ReadMode, Sampler};
use crate::error::Result;
use crate::profile::Activity;
use crate::python::{self, LastRead, Listing, SnapshotOptions, Unread};
use crate::IdSet;
use std::time::{Duration, Instant};

/// How many threads process `pid` has, from the link count of its /proc/PID/task (two plus
/// one per thread). It takes one `fstat` of the directory held open in `dir`, whatever the
/// number of threads, where a listing costs a millisecond for a thousand. None when it
/// cannot be read.
fn thread_count(dir: &mut Option<std::fs::File>, pid: i32) -> Option<usize> {
    use std::os::unix::fs::MetadataExt;
    if dir.is_none() {
        *dir = std::fs::File::open(format!("/proc/{pid}/task")).ok();
    }
    let links = dir.as_ref()?.metadata().ok()?.nlink();
    usize::try_from(links.checked_sub(2)?).ok()
}

/// How long a thread's user/system tick counts are reused. They advance in whole clock
/// ticks (10 ms with the usual USER_HZ of 100), so reading them more often shows nothing new.
const STAT_REFRESH: Duration = Duration::from_millis(10);

/// The most CPU a waiting thread spends on being paused and let go (leaving its wait and
/// entering it again, about 20 µs of schedstat time a pause on the development machine). A
/// thread the last sample paused that used no more counts as not having run.
pub(super) const WOKEN_S: f64 = 100e-6;

/// How long a listing of the target's threads is reused, at least. Threads that Python
/// knows are matched by their kernel id at once (3.11+); this bounds how late another new
/// thread's CPU time starts being read.
const RELIST_INTERVAL: Duration = Duration::from_millis(50);
/// At rates under 60 Hz, a listing is reused for this many samples instead. At 19 Hz (the
/// agent's), 50 ms is less than one period and every sample listed the threads again (an
/// open, a directory read and a close; a fifth of a sample of an idle process).
const RELIST_SAMPLES: f64 = 3.0;

/// How long a listing is reused while the process clock shows that no thread outside it
/// ran (the last CPU reading was a short one, see `ran`). A thread started since that has
/// not run yet has nothing to be charged. One that runs breaks the clock's sum (the next
/// reading is a full one, and the listing after it is taken anew). A listing of a thousand
/// threads costs a millisecond.
const RELIST_AT_REST: Duration = Duration::from_secs(1);

/// The most stacks a CPU-only sample walks (the thread holding the GIL aside; see
/// `RestTracker`'s `max_walks`). A pool of a thousand threads starting, or woken at once
/// to end, made each sample walk hundreds (15 µs each). The threads left over are walked
/// at the next samples (round the list), their CPU time charged then, as to a thread
/// sampled less often for that while. A thread that ends before has its last moments
/// uncharged. A sample at 100 Hz meets this many threads that ran only in such bursts.
pub(super) const MAX_WALKS: usize = 64;

/// The most threads kept as having run between two looks of a live view.
const THREADS_RAN_MAX: usize = 1 << 16;

/// What [`Sampler::observe`] saw.
type Observed = (
    Vec<Observation>,
    Vec<i32>,
    Vec<(i32, Vec<crate::profile::Frame>)>,
);

impl Sampler {
    /// What one sample sees:
    /// - each thread's stack, activity and CPU time since its last sample (threads not to
    ///   be charged left out; unreadable ones are counted as errors);
    /// - the target's threads;
    /// - under `--async --wall`, the stacks of the tasks that wait, by kernel id of their
    ///   loop's thread (each is charged the interval off the CPU).
    ///
    /// None when the sample was lost (counted).
    pub(super) fn observe(
        &mut self,
        now: Instant,
        wall_s: f64,
        pause_these: Vec<u64>,
    ) -> Result<Option<Observed>> {
        let pid = self.reader.process().pid;
        let tids = match self.thread_list(pid) {
            Ok(t) => t,
            Err(e) if e.is_process_gone() || !crate::proc::process_exists(pid) => {
                return Err(crate::Error::ProcessExited(pid))
            }
            Err(e) => {
                self.count_error(Unread::of(&e));
                return Ok(None);
            }
        };
        let listing = self.cpu_times(&tids);
        let listed_anew = listing != Listing::Same;
        self.absorb_wake_ups();
        self.reusable(listing);
        // Threads at rest are left out of the snapshot when nothing needs where they rest:
        // CPU time only (no time off the CPU to charge), no GPU positions, no tasks, no
        // native merge.
        let omit_unchanged = !self.cfg.wall
            && self.positions.is_none()
            && !self.reader.reads_tasks()
            && self.native.is_none();
        // Before 3.11 a thread state lacks the kernel id: the last snapshot's matches.
        let kernel_ids = self
            .reader
            .process()
            .layout
            .thread
            .native_thread_id
            .is_none();
        let run_ns = &self.run_ns;
        self.rest
            .prepare(omit_unchanged, MAX_WALKS, listing, kernel_ids, &|tid| {
                run_ns.contains_key(&tid)
            });
        let opts = SnapshotOptions {
            mode: self.cfg.mode,
            pause_these,
            thread_names: false,
            python_names: false,
            threads: Some(tids),
            ..Default::default()
        };
        let snap = match &mut self.native {
            Some(n) => n.snapshot(&mut self.reader, &opts, &mut self.rest),
            None => self.reader.snapshot_resting(&opts, &mut self.rest),
        };
        let tids = opts.threads.expect("given above");
        let mut snap = match snap {
            Ok(s) => s,
            Err(e) if e.is_process_gone() => return Err(e),
            Err(e) => {
                self.count_error(Unread::of(&e));
                return Ok(None);
            }
        };
        // `--async`: each thread that runs a task is charged to the task's stack; under
        // `--wall`, every task that waits to its own.
        let mut waiting = Vec::new();
        snap.use_task_stacks(self.cfg.wall.then_some(&mut waiting));
        // Names before one state per thread is kept, because a thread's name is its main
        // interpreter's. Its time goes to the state it runs in now.
        self.labels.name(&snap, &mut self.reader, &mut self.agg);
        snap.one_state_per_thread();
        self.stats.samples += 1;
        self.stats.unchanged += snap.left_out as u64;
        if !self.reader.process().layout.free_threaded {
            self.stats.gil_samples += 1;
            self.stats.gil_held += snap.threads.iter().any(|t| t.holds_gil) as u64;
        }
        // A thread ran since the last sample when its CPU time moved (for a thread without
        // a kernel id yet, by its scheduler state). Those left out rest. Kept until a live
        // view takes them ([`Sampler::take_threads`]), because one sample alone misses a
        // thread that waited for a CPU those 10 ms.
        let (run_ns, cpu) = (&self.run_ns, &self.cpu);
        let ran = snap.threads.iter().filter(|t| {
            t.native_id
                .and_then(|tid| Some(!cpu.unchanged(tid, *run_ns.get(&tid)?)))
                .unwrap_or(!t.idle)
        });
        self.threads_ran.extend(ran.map(|t| t.thread_id));
        // Nobody takes them without a live view; they are bounded all the same.
        if self.threads_ran.len() > THREADS_RAN_MAX {
            self.threads_ran.clear();
        }
        self.threads_seen = snap.threads.len() + snap.left_out;
        for t in &snap.woken {
            let c = self.wake_credit.entry(*t).or_insert(0.0);
            *c = (*c + WOKEN_S).min(3.0 * WOKEN_S);
        }
        self.stats.deferred += self.reader.walker().deferred as u64;
        if let Some(n) = &mut self.native {
            n.merge_into(&mut snap, &mut self.stats.native);
        }
        for id in &snap.stale_ids {
            if !self.stale_said.contains(&id.tstate) {
                self.stale_said.push(id.tstate);
                self.stats.notes.push(format!(
                    "process {}: a thread state records thread {}, not a thread of the process \
                     (forked without PyOS_AfterFork_Child, as uWSGI's workers are by default); \
                     its samples are charged to thread {}, the one it is",
                    snap.pid, id.recorded, id.actual
                ));
            }
        }
        // With a Python thread with no kernel id yet (before 3.11 its id is matched through
        // the listing), the listing is not kept for long.
        self.unmapped = snap.threads.iter().any(|t| t.native_id.is_none());
        // For a Python thread whose kernel thread we have not listed yet, list again next
        // time.
        // (In another PID namespace, such a thread has its own id but none of ours yet.)
        if snap.threads.iter().any(|t| {
            t.native_id.is_some_and(|n| tids.binary_search(&n).is_err())
                || (t.native_id.is_none() && t.ns_native_id.is_some())
        }) {
            self.tids_listed = None;
        }
        if self.cfg.mode == ReadMode::Auto {
            self.outcome.clear();
            self.outcome.extend(
                snap.threads
                    .iter()
                    .filter(|t| !t.unchanged)
                    .map(|t| (t.thread_id, t.read_paused)),
            );
            self.pauses.update(&self.outcome, now);
            if listed_anew {
                let present: IdSet<u64> = snap.threads.iter().map(|t| t.thread_id).collect();
                self.pauses.retain(|id| present.contains(&id));
            }
        }
        self.rest.absorb(&snap, &tids, listed_anew);
        let waiting = waiting
            .into_iter()
            .filter_map(|(thread, frames)| Some((self.rest.kernel_id(thread)?, frames)))
            .collect();
        let mut seen = Vec::with_capacity(snap.threads.len());
        for mut t in snap.threads {
            self.stats.paused_reads += t.read_paused as u64;
            let Some(tid) = t.native_id else { continue };
            if t.unchanged {
                self.stats.unchanged += 1;
                let Some(last) = self.rest.last_read(tid) else {
                    continue;
                };
                // It used no CPU, so only time off the CPU (wall mode) or the GPU ledger's
                // positions need where it is.
                if !self.cfg.wall && self.positions.is_none() {
                    continue;
                }
                t.frames = last.frames.clone();
                t.in_native = last.in_native;
            } else if t.error.is_none() && !t.holds_gil {
                self.rest.keep(
                    tid,
                    LastRead {
                        thread_id: t.thread_id,
                        top_frame: t.top_frame,
                        frames: t.frames.clone(),
                        in_native: t.in_native,
                    },
                );
            } else {
                self.rest.forget(tid);
            }
            let Some(&ns) = self.run_ns.get(&tid) else {
                continue;
            };
            let interp = t.interpreter;
            if let Some(o) = self.observation(t, tid, ns, now, wall_s) {
                self.labels.ran_in(tid, interp, &mut self.agg);
                seen.push(o);
            }
        }
        Ok(Some((seen, tids, waiting)))
    }

    /// Spends the credit our pauses left (see `wake_credit`) on what each thread used
    /// since its last sample. CPU it covers is ours, not counted (the thread did not run).
    fn absorb_wake_ups(&mut self) {
        let run_ns = &self.run_ns;
        self.wake_credit
            .retain(|t, c| *c > 0.0 && run_ns.contains_key(t));
        for (tid, credit) in self.wake_credit.iter_mut() {
            let ns = run_ns[tid];
            let Some(used) = self.cpu.pending_s(*tid, ns) else {
                continue;
            };
            if used <= *credit {
                *credit -= used;
                self.cpu.absorb(*tid, ns);
            } else {
                *credit = 0.0;
            }
        }
    }

    /// Decides which threads the next snapshot may leave unread (see
    /// [`python::RestTracker::plan`]): those whose CPU time has not moved since their last
    /// sample (our own pauses' wake-ups aside; see `absorb_wake_ups`) and that were not
    /// running when last looked at.
    ///
    /// The process clock says which threads' times changed. With BPF, or while our pauses'
    /// wake-ups move the CPU tracker outside the threads read, that is not known, so every
    /// thread is looked at again.
    fn reusable(&mut self, listing: Listing) {
        let moved = match &self.bpf {
            None if self.wake_credit.is_empty() => self.clock.moved(),
            _ => None,
        };
        let (run_ns, cpu, stat_cache) = (&self.run_ns, &self.cpu, &self.stat_cache);
        let still = |tid: i32| {
            run_ns.get(&tid).is_some_and(|&ns| cpu.unchanged(tid, ns))
                && stat_cache.get(&tid).is_some_and(|s| s.1 != 'R')
        };
        self.rest.plan(listing, moved, &still);
    }

    /// Reads every listed thread's total CPU time into `run_ns`, nanoseconds:
    /// - from the BPF records where the program is loaded (a thread that did not run costs
    ///   no read);
    /// - else from schedstat (precise and cheap, one read a thread, and only of the threads
    ///   that ran lately while the process clock shows no other did).
    ///
    /// A thread that exited is missing (and the threads are listed again next time). Says
    /// how the threads compare with the last sample's (what is kept of threads gone is then
    /// forgotten).
    fn cpu_times(&mut self, tids: &[i32]) -> Listing {
        let pid = self.reader.process().pid;
        match self.bpf.as_mut() {
            Some(b) => {
                b.drain();
                self.run_ns.clear();
                let files = &mut self.files;
                self.run_ns.extend(
                    tids.iter()
                        .filter_map(|&t| Some((t, b.total(pid, t, files)?))),
                );
            }
            None => {
                let short = self.clock.short_reads;
                self.clock.times(tids, &mut self.files, &mut self.run_ns);
                self.cpu_short = self.clock.short_reads > short;
                self.stats.short_cpu_reads = self.clock.short_reads;
            }
        }
        if self.run_ns.len() != tids.len() {
            self.tids_listed = None;
        }
        if self.alive_list == tids {
            return Listing::Same;
        }
        let left = self
            .alive_list
            .iter()
            .any(|t| tids.binary_search(t).is_err());
        self.alive_list.clear();
        self.alive_list.extend_from_slice(tids);
        let alive = &self.alive_list[..];
        let listed = |t: &i32| alive.binary_search(t).is_ok();
        if let Some(b) = self.bpf.as_mut() {
            b.retain(alive);
        }
        self.cpu.retain(alive);
        self.files.retain(alive);
        self.stat_cache.retain(|t, _| listed(t));
        self.rest.retain(&|t| listed(&t));
        self.labels.retain(&|t| listed(&t));
        if left {
            Listing::Left
        } else {
            Listing::Added
        }
    }

    /// One thread of a snapshot as an observation, with its CPU time since its last
    /// sample (`ns`: its total now). None when it is not to be charged:
    /// - its stack was not read (counted as an error);
    /// - it waits in the memory handshake;
    /// - it does not hold the GIL under `--gil`;
    /// - or its /proc entry is gone.
    fn observation(
        &mut self,
        t: python::ThreadSnapshot,
        tid: i32,
        ns: u64,
        now: Instant,
        wall_s: f64,
    ) -> Option<Observation> {
        // `stat` (state, user/system ticks) costs four times `schedstat`. Read it when the
        // state is needed (a thread without the GIL may be asleep or may compute in native
        // code) or when its ticks are older than one tick's worth of time (they change no
        // faster). A thread holding the GIL is on a CPU or about to be.
        let fresh = self
            .stat_cache
            .get(&tid)
            .is_some_and(|s| now.duration_since(s.0) < STAT_REFRESH);
        // A thread that was not running when last looked at and has used no CPU since is
        // still where it was, and so are its state and tick counts.
        let still =
            self.cpu.unchanged(tid, ns) && self.stat_cache.get(&tid).is_some_and(|s| s.1 != 'R');
        if !still && (!t.holds_gil || !fresh) {
            let (state, u, st) = self.files.read_stat(self.reader.process().pid, tid)?;
            self.stat_cache.insert(tid, (now, state, u, st));
        }
        let &(_, state, utime, stime) = self.stat_cache.get(&tid)?;
        // A thread blocked in the memory handshake waits for us to read its stack. It uses
        // no CPU there. The CPU it used since its last sample was used where it ran
        // before it blocked, not necessarily on the line it waits on (a handshake at a
        // line's first allocation would take the previous line's CPU along, a few points of
        // fixtures/cpu/split.py's split). That CPU is left for the thread's next sample that
        // finds it off the handshake. Such samples fall evenly over its CPU time, so no line
        // gains. Only a thread that used less CPU than the interval can have blocked, so the
        // others cost no read of /proc.
        if self.handshake_range.is_some()
            && self
                .cpu
                .pending_s(tid, ns)
                .is_some_and(|cpu| cpu < 0.95 * wall_s)
            && self.in_handshake(tid)
        {
            return None;
        }
        let reading = CpuReading {
            run_ns: ns,
            utime,
            stime,
            state,
        };
        let delta = self.cpu.delta(tid, reading);
        if let Some(err) = &t.error {
            self.count_error(err.kind);
            return None;
        }
        if self.cfg.gil_only && !t.holds_gil {
            return None;
        }
        let idle_s = if self.cfg.wall {
            self.cpu
                .off_cpu_s(tid, wall_s, delta.user_s + delta.system_s)
        } else {
            0.0
        };
        let activity = if t.in_native == Some(true) {
            Activity::Native
        } else {
            Activity::Python
        };
        // Running means holding the GIL, or on a CPU right after its stack was read. A thread
        // that went to sleep must not have its CPU charged to the line it sleeps on.
        let running = t.holds_gil || state == 'R' || self.in_handshake(tid);
        Some(Observation {
            tid,
            frames: t.frames,
            activity,
            running,
            user_s: delta.user_s,
            system_s: delta.system_s,
            idle_s,
            wall_s,
        })
    }

    /// The target's threads. They are listed again from /proc when:
    /// - the last listing is older than [`RELIST_INTERVAL`] or [`RELIST_SAMPLES`] periods
    ///   (or, while the last CPU reading was a short one and every Python thread had its
    ///   kernel id, older than [`RELIST_AT_REST`]);
    /// - a thread was found missing or new;
    /// - the process has another number of threads than the listing (checked at each sample
    ///   once it has [`super::ran::CLOCK_FROM_THREADS`]). A pool that starts is listed as it
    ///   grows, so that its new threads are read with the ones that ran lately instead of
    ///   breaking the process clock's sum, which costs a read of every thread.
    ///
    /// Else the last listing is used.
    fn thread_list(&mut self, pid: i32) -> Result<Vec<i32>> {
        if let Some((at, tids)) = &self.tids_listed {
            let age = at.elapsed();
            let at_rest = self.cpu_short && !self.unmapped;
            let every = RELIST_INTERVAL.max(Duration::from_secs_f64(
                RELIST_SAMPLES / self.cfg.rate_hz.max(0.1),
            ));
            let recent = age < every || (at_rest && age < RELIST_AT_REST);
            if recent
                && (tids.len() < super::ran::CLOCK_FROM_THREADS
                    || thread_count(&mut self.task_dir, pid).is_none_or(|n| n == tids.len()))
            {
                return Ok(tids.clone());
            }
        }
        let tids = crate::proc::threads(pid)?;
        self.tids_listed = Some((Instant::now(), tids.clone()));
        Ok(tids)
    }

    pub(super) fn count_error(&mut self, kind: Unread) {
        self.stats.errors += 1;
        *self.stats.error_kinds.entry(kind).or_insert(0) += 1;
    }
}
