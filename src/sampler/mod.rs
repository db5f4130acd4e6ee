//! The sampling loop: every thread of a Python process, at a steady rate, from outside.
//!
//! Owns: [`Sampler`] — timing (deadline-based, missed ticks counted, never invented), the
//! per-thread CPU time (the scheduler's count: from a BPF program's records where one may be
//! loaded, see [`bpf`], else /proc; user vs system measured by the kernel), the Python-vs-native
//! tag (the innermost frame's current instruction is a CALL of some form), idle and GIL state,
//! folding library frames into the user's calling line, and feeding the [`Aggregator`].
//! Must not: format output, or keep samples one by one (memory stays bounded).

mod attribution;
pub(crate) mod bpf;
pub mod cputime;
pub(crate) mod native;
mod pauses;
mod ran;
pub(crate) mod tree;

use crate::error::Result;
use crate::profile::{Activity, Aggregator, ProfileMeta, ThreadSample, TimeMode};
pub use crate::python::ReadMode;
use crate::python::{self, PythonProcess, PythonReader, SnapshotOptions, Unread};
use crate::{IdMap, IdSet};
use attribution::{Attribution, Charge, Observation};
use cputime::{CpuReading, CpuTracker};
use pauses::PauseSchedule;
pub use pauses::PAUSED_MAX_HZ;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// What to record.
#[derive(Debug, Clone)]
pub struct SamplerConfig {
    /// Samples per second.
    pub rate_hz: f64,
    /// Count time threads spend off the CPU (sleeping, waiting) too.
    pub wall: bool,
    /// Count only the thread holding the GIL.
    pub gil_only: bool,
    /// How stacks are read.
    pub mode: ReadMode,
    /// Keep stdlib / site-packages lines instead of charging them to the calling user line.
    pub profile_all: bool,
    /// The memory ring file (see `memory`): a thread blocked in a futex on it is waiting for
    /// us to read its stack (the allocation handshake), not sleeping in the program, so its
    /// CPU time is charged to where it is.
    pub handshake_file: Option<std::path::PathBuf>,
    /// Read native frames too (`--native`): every sample pauses the threads, and their
    /// stacks are merged native and Python frames.
    pub native: bool,
    /// Charge a thread that runs an asyncio task to the task's stack joined to those of
    /// the tasks awaiting it (`--async`, Python 3.11+).
    pub tasks: bool,
}

impl SamplerConfig {
    /// Whether the sampler may give way to the program (see [`crate::courtesy`]): it reads
    /// without stopping the program as a rule (not `--blocking`, not `--native`), and no
    /// memory handshake makes the program wait for it (`memory`: whether this recording
    /// reads a memory ring, whose consumer runs in the sampler's ticks).
    pub(crate) fn courteous(&self, memory: bool) -> bool {
        !memory && !self.native && self.handshake_file.is_none() && self.mode != ReadMode::Paused
    }

    /// Whether every sample stops the threads that ran (`--blocking`, `--native`): then a
    /// sample is followed by at least as long with the program running (see [`drive`]).
    pub(crate) fn pauses_every_tick(&self) -> bool {
        self.native || self.mode == ReadMode::Paused
    }
}

impl Default for SamplerConfig {
    fn default() -> Self {
        SamplerConfig {
            rate_hz: 100.0,
            wall: false,
            gil_only: false,
            mode: ReadMode::Auto,
            profile_all: false,
            handshake_file: None,
            native: false,
            tasks: false,
        }
    }
}

/// Running totals, shown live and in the report.
#[derive(Debug, Clone, Default)]
pub struct Stats {
    pub samples: u64,
    pub missed: u64,
    pub errors: u64,
    /// `--native`: thread samples whose native frames merged with their Python frames, and
    /// why the others did not.
    pub native: native::MergeCounts,
    /// Error messages (first line) and how often each happened.
    pub error_kinds: BTreeMap<Unread, u64>,
    /// Thread stacks read with the thread paused because reads without pausing could not
    /// be validated (the default "auto" mode's fallback).
    pub paused_reads: u64,
    /// Ticks left without a sample to keep pauses at most [`PAUSED_MAX_HZ`] a second
    /// (default mode, while stacks change too fast to be read without pausing).
    pub thinned: u64,
    /// Thread samples of threads that had not run since their last read: not read again
    /// (their stack is that read's).
    pub unchanged: u64,
    /// Samples that read the CPU time of only the threads that ran lately, the process's
    /// CPU clock showing that no other thread ran (see `ran`).
    pub short_cpu_reads: u64,
    /// Thread samples of threads that ran but were left for a later sample, past the
    /// most walks a sample makes ([`MAX_WALKS`]; their CPU time waits for that read).
    pub deferred: u64,
    pub elapsed: Duration,
    /// The sampler gave way to the program (ran under `SCHED_IDLE` while reading without
    /// stopping it, see `courtesy`): how often it took the normal policy back because it
    /// could not run (a machine whose CPUs were all busy). None: it did not give way.
    pub gave_way: Option<u64>,
    /// Where per-thread CPU time came from (the first process's; said once).
    pub cpu_times_from: Option<String>,
    /// Things the user should know about the recording (e.g. why there is no memory data).
    pub notes: Vec<String>,
}

/// Samples one process.
pub struct Sampler {
    /// The process, its walker and, under `--async`, the reader of its tasks (`--native`:
    /// its modules, which `native` reads).
    reader: PythonReader,
    cpu: CpuTracker,
    /// /proc files of the threads, open between samples.
    files: cputime::ThreadFiles,
    /// The scheduler's records of the target's threads (see `bpf`); None: read /proc.
    bpf: Option<bpf::BpfCpu>,
    /// Without BPF: the target's process CPU clock, which tells when only the threads
    /// that ran lately ran (see `ran`).
    clock: ran::ProcessClock,
    cfg: SamplerConfig,
    agg: Aggregator,
    pub stats: Stats,
    last_wall: Option<Instant>,
    /// The target's working directory when we started, for relative file names.
    cwd: Option<String>,
    /// Where each thread's time goes, given what each sample saw.
    attribution: Attribution,
    /// Source lines read while sampling, by code file name (targets in another mount
    /// namespace only; others are read at the end).
    sources: IdMap<String, Option<Vec<String>>>,
    /// The last listing of the target's threads and when it was taken.
    tids_listed: Option<(Instant, Vec<i32>)>,
    /// /proc/PID/task, open: its link count tells how many threads the process has (see
    /// [`Sampler::thread_list`]). None until first needed, or when it cannot be opened.
    task_dir: Option<std::fs::File>,
    /// Each thread's last `stat` reading: when, state, user and system ticks.
    stat_cache: IdMap<i32, (Instant, char, u64, u64)>,
    /// Where the memory ring is mapped in the target (see [`SamplerConfig::handshake_file`]).
    handshake_range: Option<(u64, u64)>,
    /// Default mode: which threads are read paused, and how often.
    pauses: PauseSchedule,
    /// Where each thread was at each tick, kept for the GPU ledger once a GPU is watched
    /// (None: not kept).
    positions: Option<Vec<crate::timeline::Position>>,
    /// `--native`: when the process's modules are read, and the merge counts.
    native: Option<native::NativeSampling>,
    /// Each thread's last stack read (not of a thread holding the GIL), by kernel id: what a
    /// thread that has not run since is charged to without reading it again.
    last_read: IdMap<i32, LastRead>,
    /// Paused reads (`--blocking`, `--native`): CPU seconds of each thread that our own
    /// pauses account for. A pause wakes a waiting thread for a moment (it leaves its wait
    /// and enters it again, whenever the scheduler lets it: maybe after the next sample):
    /// its CPU time moves by that much, which is ours, not a sign that it ran. Each pause
    /// that stops a thread in a wait (`Snapshot::woken`) adds [`WOKEN_S`] (at most three
    /// pauses' worth are kept); CPU time it covers is spent from it. A thread stopped while
    /// it ran gets none: at 10 kHz it runs less than [`WOKEN_S`] between two paused
    /// samples, and all its time went as wake-ups (the profile's total was 1% of the CPU
    /// time the program used).
    wake_credit: IdMap<i32, f64>,
    /// Each thread's kernel id by `thread_id`, as the last snapshot matched them (see
    /// `SnapshotOptions::tids_by_thread`).
    last_tids: IdMap<u64, i32>,
    /// The threads listed by the last sample (ascending): while they stay the same,
    /// nothing kept per thread needs forgetting.
    alive_list: Vec<i32>,
    /// Each listed thread's CPU time (nanoseconds), as the last sample read it: kept from
    /// one sample to the next, where only the threads that ran change (see `ran`).
    run_ns: IdMap<i32, u64>,
    /// The snapshot's `reuse`, `unpaused` and `tids_by_thread` (see [`SnapshotOptions`]),
    /// their room kept from one sample to the next.
    reuse: IdMap<u64, u64>,
    unpaused: IdSet<i32>,
    /// The `thread_id` of each kernel id in `reuse`; whether `reuse` and `unpaused` hold
    /// for the last sample's state (see [`Sampler::reusable`]); the threads the last
    /// sample read (to be looked at again).
    reuse_by_tid: IdMap<i32, u64>,
    reuse_kept: bool,
    touched: Vec<i32>,
    /// What changed in `reuse` since the last snapshot (the `thread_id`s of the entries
    /// taken out or put in; None: it was made anew), and the snapshots taken so far: see
    /// [`python::ReuseDelta`].
    reuse_changes: Option<Vec<u64>>,
    reuse_epoch: u64,
    tids_by_thread: IdMap<u64, i32>,
    /// The outcome of a sample's reads, for [`PauseSchedule::update`] (room kept likewise).
    outcome: Vec<(u64, bool)>,
    /// Whether the last CPU reading was a short one (see `ran`): no thread outside the
    /// listing ran.
    cpu_short: bool,
    /// Whether the last snapshot had a Python thread without a kernel id (before 3.11 a
    /// new thread's is found through the listing, so one is due soon).
    unmapped: bool,
}

/// A thread's stack as last read, and the frame its thread state named then.
#[derive(Debug)]
struct LastRead {
    /// Its `pthread_t` (what a snapshot knows it by before its kernel id).
    thread_id: u64,
    top_frame: u64,
    frames: Vec<crate::profile::Frame>,
    in_native: Option<bool>,
}

/// How many threads process `pid` has: the link count of its /proc/PID/task (two plus
/// one per thread; one `fstat` of the directory held open in `dir`, whatever the number
/// of threads, where a listing costs a millisecond for a thousand). None when it cannot
/// be read.
fn thread_count(dir: &mut Option<std::fs::File>, pid: i32) -> Option<usize> {
    use std::os::unix::fs::MetadataExt;
    if dir.is_none() {
        *dir = std::fs::File::open(format!("/proc/{pid}/task")).ok();
    }
    let links = dir.as_ref()?.metadata().ok()?.nlink();
    usize::try_from(links.checked_sub(2)?).ok()
}

/// How long a thread's user/system tick counts are reused: they advance in whole clock
/// ticks (10 ms with the usual USER_HZ of 100), so reading them more often shows nothing new.
const STAT_REFRESH: Duration = Duration::from_millis(10);

/// The most CPU a waiting thread spends on being paused and let go (leaving its wait and
/// entering it again: about 20 µs of schedstat time a pause on the development machine): a
/// thread the last sample paused that used no more counts as not having run.
const WOKEN_S: f64 = 100e-6;

/// How long a listing of the target's threads is reused. Threads that Python knows are
/// matched by their kernel id at once (3.8+); this bounds how late another new thread's
/// CPU time starts being read.
const RELIST_INTERVAL: Duration = Duration::from_millis(50);

/// How long a listing is reused while the process clock shows that no thread outside it
/// ran (the last CPU reading was a short one, see `ran`): a thread started since that has
/// not run yet has nothing to be charged, and one that runs breaks the clock's sum (the
/// next reading is a full one, and the listing after it is taken anew). A listing of a
/// thousand threads costs a millisecond.
const RELIST_AT_REST: Duration = Duration::from_secs(1);

/// The most stacks a CPU-only sample walks (the thread holding the GIL aside: see
/// `SnapshotOptions::max_walks`): a pool of a thousand threads starting, or woken at once
/// to end, made each sample walk hundreds (15 µs each). The threads left over are walked
/// at the next samples (round the list), their CPU time charged then, as to a thread
/// sampled less often for that while; a thread that ends before has its last moments
/// uncharged. A sample at 100 Hz meets this many threads that ran only in such bursts.
const MAX_WALKS: usize = 64;

/// The threads of a sample against the last sample's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Listing {
    Same,
    /// Only new ones.
    Added,
    /// One or more of the last sample's are gone.
    Left,
}

/// What [`Sampler::observe`] saw.
type Observed = (
    Vec<Observation>,
    Vec<i32>,
    Vec<(i32, Vec<crate::profile::Frame>)>,
);

impl Sampler {
    pub fn new(proc: PythonProcess, cfg: SamplerConfig) -> Sampler {
        let mut reader = PythonReader::new(proc);
        if cfg.tasks {
            // `--async`: finds each thread's running task and its awaiters.
            reader = reader.with_tasks(python::AsyncReader::for_samples(cfg.wall));
        }
        let pid = reader.process().pid;
        let cwd = crate::proc::cwd(pid);
        // Opt-in (`SCALENE_RS_BPF=1`) until its gain is measured on a quiet machine: it
        // costs the profiler ~20% less CPU with 1,000 parked threads, but the overhead
        // figures so far were drowned in noise, and every test of the suite runs through it.
        let (bpf, cpu_times_from) = if std::env::var_os("SCALENE_RS_BPF").is_some_and(|v| v == "1")
        {
            match bpf::BpfCpu::attach(pid) {
                Ok(b) => (Some(b), "the scheduler (BPF on sched_switch)".to_string()),
                Err(why) => (None, format!("/proc schedstat (no BPF: {why})")),
            }
        } else {
            (
                None,
                "/proc schedstat (SCALENE_RS_BPF=1 asks for BPF)".to_string(),
            )
        };
        let mut clock = ran::ProcessClock::new(pid);
        let cpu_times_from = match &bpf {
            None if clock.works() => format!(
                "{cpu_times_from}, of the threads that ran lately when the process's CPU clock \
                 shows no other thread ran"
            ),
            _ => cpu_times_from,
        };
        let stats = Stats {
            cpu_times_from: Some(cpu_times_from),
            ..Stats::default()
        };
        Sampler {
            reader,
            cpu: CpuTracker::new(),
            files: cputime::ThreadFiles::new(),
            bpf,
            clock,
            cfg,
            agg: Aggregator::new(),
            stats,
            last_wall: None,
            cwd,
            attribution: Attribution::new(),
            sources: IdMap::default(),
            tids_listed: None,
            task_dir: None,
            stat_cache: IdMap::default(),
            handshake_range: None,
            pauses: PauseSchedule::new(),
            positions: None,
            native: None,
            last_read: IdMap::default(),
            wake_credit: IdMap::default(),
            last_tids: IdMap::default(),
            alive_list: Vec::new(),
            run_ns: IdMap::default(),
            reuse: IdMap::default(),
            unpaused: IdSet::default(),
            reuse_by_tid: IdMap::default(),
            reuse_kept: false,
            touched: Vec::new(),
            reuse_changes: None,
            reuse_epoch: 0,
            tids_by_thread: IdMap::default(),
            outcome: Vec::new(),
            cpu_short: false,
            unmapped: false,
        }
        .with_handshake_range()
    }

    /// Reads native frames too, with images from `cache` (shared by a run's processes).
    pub(crate) fn with_native(mut self, cache: native::SharedCache) -> Self {
        self.native = Some(native::NativeSampling::new(cache));
        self
    }

    /// Takes one sample of every thread. Errors that lose only this sample are counted, not
    /// returned; an error is returned only when the process is gone.
    pub fn sample_once(&mut self) -> Result<()> {
        let now = Instant::now();
        let auto = self.cfg.mode == ReadMode::Auto;
        let pause_these = if auto {
            self.pauses.pause_these(now)
        } else {
            Vec::new()
        };
        let pausing = !pause_these.is_empty();
        if self.pauses.thin(pausing, now) {
            self.stats.thinned += 1;
            return Ok(());
        }
        let wall_s = self
            .last_wall
            .map(|t| now.duration_since(t).as_secs_f64())
            .unwrap_or(0.0);
        self.last_wall = Some(now);
        if pausing {
            self.pauses.paused_at(now);
        }
        let Some((seen, tids, waiting)) = self.observe(now, wall_s, pause_these)? else {
            return Ok(());
        };
        if let Some(buf) = self.positions.as_mut() {
            record_positions(
                buf,
                &seen,
                self.reader.process().pid,
                self.cfg.profile_all,
                wall_s,
            );
        }
        let Sampler {
            attribution,
            agg,
            sources,
            reader,
            cwd,
            cfg,
            ..
        } = self;
        let proc = reader.process();
        for o in seen {
            attribution.observe(o, &mut |c| {
                charge(agg, sources, proc, cwd.as_deref(), cfg.profile_all, c)
            });
        }
        // `--async --wall`: every waiting task waits the whole interval at its await.
        for (tid, frames) in waiting {
            let c = Charge {
                tid,
                frames: &frames,
                activity: crate::profile::Activity::Python,
                user_s: 0.0,
                system_s: 0.0,
                idle_s: wall_s,
            };
            charge(agg, sources, proc, cwd.as_deref(), cfg.profile_all, c);
        }
        self.attribution.retain(&tids);
        Ok(())
    }

    /// What one sample sees: each thread's stack, activity and CPU time since its last
    /// sample (threads not to be charged left out: unreadable ones are counted as errors),
    /// the target's threads, and under `--async --wall` the stacks of the tasks that wait,
    /// by kernel id of their loop's thread (each is charged the interval off the CPU).
    /// None: the sample was lost (counted).
    fn observe(
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
        // Before 3.8 a thread state lacks the kernel id: the last snapshot's matches.
        self.tids_by_thread.clear();
        if self
            .reader
            .process()
            .layout
            .thread
            .native_thread_id
            .is_none()
        {
            let run_ns = &self.run_ns;
            self.tids_by_thread.extend(
                self.last_tids
                    .iter()
                    .filter(|(_, tid)| run_ns.contains_key(tid))
                    .map(|(&thread, &tid)| (thread, tid)),
            );
        }
        // Threads at rest are left out of the snapshot when nothing needs where they rest:
        // CPU time only (no time off the CPU to charge), no GPU positions, no tasks, no
        // native merge.
        let omit_unchanged = !self.cfg.wall
            && self.positions.is_none()
            && !self.reader.reads_tasks()
            && self.native.is_none();
        let opts = SnapshotOptions {
            mode: self.cfg.mode,
            pause_these,
            thread_names: false,
            omit_unchanged,
            // A thread left: the state before its own in the list still links to it.
            list_whole: listing == Listing::Left,
            max_walks: Some(MAX_WALKS),
            reuse_delta: self.reuse_delta(),
            reuse: std::mem::take(&mut self.reuse),
            tids_by_thread: std::mem::take(&mut self.tids_by_thread),
            unpaused: std::mem::take(&mut self.unpaused),
            threads: Some(tids),
            ..Default::default()
        };
        let snap = match &mut self.native {
            Some(n) => n.snapshot(&mut self.reader, &opts),
            None => self.reader.snapshot(&opts),
        };
        let tids = opts.threads.expect("given above");
        // The maps' room, for the next sample.
        (self.reuse, self.tids_by_thread, self.unpaused) =
            (opts.reuse, opts.tids_by_thread, opts.unpaused);
        if let Some(mut d) = opts.reuse_delta {
            d.threads.clear();
            self.reuse_changes = Some(d.threads);
        }
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
        self.stats.samples += 1;
        self.stats.unchanged += snap.left_out as u64;
        for t in &snap.woken {
            let c = self.wake_credit.entry(*t).or_insert(0.0);
            *c = (*c + WOKEN_S).min(3.0 * WOKEN_S);
        }
        self.stats.deferred += self.reader.walker().deferred as u64;
        if let Some(n) = &mut self.native {
            n.merge_into(&mut snap, &mut self.stats.native);
        }
        // A Python thread with no kernel id yet (before 3.11 its id is matched through the
        // listing): the listing is not kept for long.
        self.unmapped = snap.threads.iter().any(|t| t.native_id.is_none());
        // A Python thread whose kernel thread we have not listed yet: list again next time.
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
        // Each thread's kernel id by `thread_id`: the same as last time for threads that
        // stay (only changes are written).
        // (A thread left out of the snapshot keeps its entry while it is listed.)
        if listed_anew {
            self.last_tids
                .retain(|_, tid| tids.binary_search(tid).is_ok());
        } else if !omit_unchanged && self.last_tids.len() > snap.threads.len() {
            self.last_tids.clear();
        }
        for t in &snap.threads {
            if let Some(tid) = t.native_id {
                if self.last_tids.get(&t.thread_id) != Some(&tid) {
                    self.last_tids.insert(t.thread_id, tid);
                }
            }
        }
        let waiting = waiting
            .into_iter()
            .filter_map(|(thread, frames)| Some((*self.last_tids.get(&thread)?, frames)))
            .collect();
        let mut seen = Vec::with_capacity(snap.threads.len());
        for mut t in snap.threads {
            self.stats.paused_reads += t.read_paused as u64;
            let Some(tid) = t.native_id else { continue };
            if !t.unchanged {
                self.touched.push(tid);
            }
            if t.unchanged {
                self.stats.unchanged += 1;
                let Some(last) = self.last_read.get(&tid) else {
                    continue;
                };
                // It used no CPU: only time off the CPU (wall mode) or the GPU ledger's
                // positions need where it is.
                if !self.cfg.wall && self.positions.is_none() {
                    continue;
                }
                t.frames = last.frames.clone();
                t.in_native = last.in_native;
            } else if t.error.is_none() && !t.holds_gil {
                self.last_read.insert(
                    tid,
                    LastRead {
                        thread_id: t.thread_id,
                        top_frame: t.top_frame,
                        frames: t.frames.clone(),
                        in_native: t.in_native,
                    },
                );
            } else {
                self.last_read.remove(&tid);
            }
            let Some(&ns) = self.run_ns.get(&tid) else {
                continue;
            };
            if let Some(o) = self.observation(t, tid, ns, now, wall_s) {
                seen.push(o);
            }
        }
        Ok(Some((seen, tids, waiting)))
    }

    /// Spends the credit our pauses left (see `wake_credit`) on what each thread used
    /// since its last sample: CPU it covers is ours, not counted (the thread did not run).
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

    /// The threads a snapshot may leave unread (see `SnapshotOptions::reuse`), into
    /// `reuse` and `unpaused`: those whose CPU time has not moved since their last sample
    /// (our own pauses' wake-ups aside: see `absorb_wake_ups`), that were not running when
    /// last looked at, and whose last read we keep; by `thread_id`, with the frame that
    /// read started from; and their kernel ids (`SnapshotOptions::unpaused`).
    /// Kept from one sample to the next where it can be: when the listing is the last
    /// one and the CPU reading says which threads' times changed, only those and the
    /// threads the last sample read are looked at again (what decides is changed by
    /// nothing else); a thousand threads at rest cost nothing here.
    fn reusable(&mut self, listing: Listing) {
        let moved = match (&self.bpf, self.clock.moved()) {
            // Our pauses' wake-ups (paused reads) move the CPU tracker outside the threads
            // read: the whole again.
            (None, Some(m))
                if listing == Listing::Same && self.reuse_kept && self.wake_credit.is_empty() =>
            {
                m
            }
            _ => {
                self.reuse.clear();
                self.unpaused.clear();
                self.reuse_by_tid.clear();
                self.reuse_changes = None;
                let tids: Vec<i32> = self.last_read.keys().copied().collect();
                for tid in tids {
                    self.reconsider(tid);
                }
                self.reuse_kept = true;
                self.touched.clear();
                return;
            }
        };
        let mut again = std::mem::take(&mut self.touched);
        again.extend_from_slice(moved);
        for &tid in &again {
            self.reconsider(tid);
        }
        again.clear();
        self.touched = again;
        #[cfg(debug_assertions)]
        {
            // What the whole would have given (at every sample of the debug build's tests).
            let whole: IdMap<u64, u64> = self
                .last_read
                .keys()
                .filter_map(|&tid| self.still(tid))
                .collect();
            assert_eq!(self.reuse, whole, "the reuse kept from the last sample");
            assert_eq!(self.unpaused.len(), whole.len());
        }
    }

    /// What changed in `reuse` since the last snapshot, for this one (see
    /// [`python::ReuseDelta`]); from now on, what changes after it.
    fn reuse_delta(&mut self) -> Option<python::ReuseDelta> {
        self.reuse_epoch += 1;
        let delta = self.reuse_changes.take().map(|threads| python::ReuseDelta {
            epoch: self.reuse_epoch,
            threads,
        });
        self.reuse_changes = Some(Vec::new());
        delta
    }

    /// Puts thread `tid` into `reuse` and `unpaused`, or takes it out, as
    /// [`Sampler::reusable`] decides.
    fn reconsider(&mut self, tid: i32) {
        if let Some(thread) = self.reuse_by_tid.remove(&tid) {
            self.reuse.remove(&thread);
            self.unpaused.remove(&tid);
            if let Some(c) = &mut self.reuse_changes {
                c.push(thread);
            }
        }
        if let Some((thread, top)) = self.still(tid) {
            if let Some(c) = &mut self.reuse_changes {
                c.push(thread);
            }
            self.reuse.insert(thread, top);
            self.unpaused.insert(tid);
            self.reuse_by_tid.insert(tid, thread);
        }
    }

    /// Thread `tid`'s `thread_id` and the frame its last read started from, when that read
    /// still holds: it used no CPU since, and was not running then.
    fn still(&self, tid: i32) -> Option<(u64, u64)> {
        let last = self.last_read.get(&tid)?;
        let still = self
            .run_ns
            .get(&tid)
            .is_some_and(|&ns| self.cpu.unchanged(tid, ns))
            && self.stat_cache.get(&tid).is_some_and(|s| s.1 != 'R');
        still.then_some((last.thread_id, last.top_frame))
    }

    /// Reads every listed thread's total CPU time into `run_ns`, nanoseconds: from the BPF
    /// records where the program is loaded (a thread that did not run costs no read), else
    /// from schedstat (precise and cheap, one read a thread, and only of the threads that
    /// ran lately while the process clock shows no other did); a thread that exited is
    /// missing (and the threads are listed again next time). Says how the threads compare
    /// with the last sample's (what is kept of threads gone is then forgotten).
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
        self.last_read.retain(|t, _| listed(t));
        if left {
            Listing::Left
        } else {
            Listing::Added
        }
    }

    /// One thread of a snapshot as an observation, with its CPU time since its last
    /// sample (`ns`: its total now); None when it is not to be charged: its stack was not
    /// read (counted as an error), it waits in the memory handshake, it does not hold the
    /// GIL under `--gil`, or its /proc entry is gone.
    fn observation(
        &mut self,
        t: python::ThreadSnapshot,
        tid: i32,
        ns: u64,
        now: Instant,
        wall_s: f64,
    ) -> Option<Observation> {
        // `stat` (state, user/system ticks) costs four times `schedstat`: read it when the
        // state is needed (a thread without the GIL may be asleep or may compute in native
        // code) or when its ticks are older than one tick's worth of time (they change no
        // faster). A thread holding the GIL is on a CPU or about to be.
        let fresh = self
            .stat_cache
            .get(&tid)
            .is_some_and(|s| now.duration_since(s.0) < STAT_REFRESH);
        // A thread that was not running when last looked at and has used no CPU since is
        // still where it was: its state and tick counts too.
        let still =
            self.cpu.unchanged(tid, ns) && self.stat_cache.get(&tid).is_some_and(|s| s.1 != 'R');
        if !still && (!t.holds_gil || !fresh) {
            let (state, u, st) = self.files.read_stat(self.reader.process().pid, tid)?;
            self.stat_cache.insert(tid, (now, state, u, st));
        }
        let &(_, state, utime, stime) = self.stat_cache.get(&tid)?;
        // A thread blocked in the memory handshake waits for us to read its stack: it uses
        // no CPU there, and the CPU it used since its last sample was used where it ran
        // before it blocked, not necessarily on the line it waits on (a handshake at a
        // line's first allocation would take the previous line's CPU along, a few points of
        // fixtures/cpu/split.py's split). That CPU is left for the thread's next sample that
        // finds it off the handshake; such samples fall evenly over its CPU time, so no line
        // gains. Only a thread that used less CPU than the interval can have blocked: the
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
        // Holding the GIL, or on a CPU right after its stack was read: a thread that went to
        // sleep must not have its CPU charged to the line it sleeps on.
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

    /// The target's threads: listed again from /proc when the last listing is older than
    /// [`RELIST_INTERVAL`] (or, while the last CPU reading was a short one and every
    /// Python thread had its kernel id, older than [`RELIST_AT_REST`]), when a thread was
    /// found missing or new, or when the process has another number of threads than the
    /// listing (checked at each sample once it has [`ran::CLOCK_FROM_THREADS`]: a pool
    /// that starts is listed as it grows, so that its new threads are read with the ones
    /// that ran lately instead of breaking the process clock's sum, which costs a read of
    /// every thread); else the last listing.
    fn thread_list(&mut self, pid: i32) -> Result<Vec<i32>> {
        if let Some((at, tids)) = &self.tids_listed {
            let age = at.elapsed();
            let at_rest = self.cpu_short && !self.unmapped;
            let recent = age < RELIST_INTERVAL || (at_rest && age < RELIST_AT_REST);
            if recent
                && (tids.len() < ran::CLOCK_FROM_THREADS
                    || thread_count(&mut self.task_dir, pid).is_none_or(|n| n == tids.len()))
            {
                return Ok(tids.clone());
            }
        }
        let tids = crate::proc::threads(pid)?;
        self.tids_listed = Some((Instant::now(), tids.clone()));
        Ok(tids)
    }

    fn count_error(&mut self, kind: Unread) {
        self.stats.errors += 1;
        *self.stats.error_kinds.entry(kind).or_insert(0) += 1;
    }

    /// Samples until `stop()` says so or the process exits. `progress` is called about
    /// four times a second.
    pub fn run(
        &mut self,
        stop: &mut dyn FnMut() -> bool,
        progress: &mut dyn FnMut(&Stats),
    ) -> Result<()> {
        let rate = self.cfg.rate_hz;
        let pid = self.reader.process().pid;
        let courteous = self.cfg.courteous(false);
        let pauses = self.cfg.pauses_every_tick();
        drive(self, rate, stop, progress, Some(pid), courteous, pauses)
    }

    /// The memory ring of this process, known once it has one (see
    /// [`SamplerConfig::handshake_file`]).
    fn set_handshake_file(&mut self, file: std::path::PathBuf) {
        self.handshake_range = mapping_of(self.reader.process().pid, &file);
        self.cfg.handshake_file = Some(file);
    }

    fn with_handshake_range(mut self) -> Self {
        if let Some(file) = &self.cfg.handshake_file {
            self.handshake_range = mapping_of(self.reader.process().pid, file);
        }
        self
    }

    /// Whether thread `tid` is blocked in the memory handshake (a futex wait on the ring
    /// mapping, from /proc/PID/task/TID/syscall): it is then waiting for us, on its way
    /// through an allocation of the line it is on.
    fn in_handshake(&self, tid: i32) -> bool {
        let Some((lo, hi)) = self.handshake_range else {
            return false;
        };
        crate::proc::blocked_syscall(self.reader.process().pid, tid)
            .is_some_and(|(nr, addr)| nr == libc::SYS_futex && (lo..hi).contains(&addr))
    }

    /// From now on keeps where each thread is at each tick, for the GPU ledger.
    pub(crate) fn keep_positions(&mut self) {
        self.positions.get_or_insert_with(Vec::new);
    }

    /// The positions kept since the last call.
    pub(crate) fn take_positions(&mut self) -> Vec<crate::timeline::Position> {
        self.positions
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// What has been folded so far.
    fn aggregator(&self) -> &Aggregator {
        &self.agg
    }

    /// The target's working directory when sampling began.
    pub(crate) fn cwd(&self) -> Option<&str> {
        self.cwd.as_deref()
    }

    /// Sources read while sampling (a target with its own files), by file name.
    fn sources(&self) -> &IdMap<String, Option<Vec<String>>> {
        &self.sources
    }
}

/// The facts about a recording that head its profile; `procs`: the Python processes it
/// sampled (their versions, joined, and their kinds of build).
fn profile_meta(
    cfg: &SamplerConfig,
    program: String,
    pid: i32,
    procs: &[&PythonProcess],
    stats: &Stats,
) -> ProfileMeta {
    let secs = stats.elapsed.as_secs_f64();
    let mut versions: Vec<String> = Vec::new();
    let mut no_split: Vec<String> = Vec::new();
    for p in procs {
        let v = p.version.to_string();
        let has_opcodes =
            crate::python_bindings::opcodes(p.version.major, p.version.minor).is_some();
        if !has_opcodes && !no_split.contains(&v) {
            no_split.push(v.clone());
        }
        if !versions.contains(&v) {
            versions.push(v);
        }
    }
    ProfileMeta {
        program,
        pid,
        python_version: versions.join(", "),
        free_threaded: procs.iter().any(|p| p.layout.free_threaded),
        split_unavailable: (!no_split.is_empty()).then(|| {
            format!(
                "no table of CALL opcodes for Python {}: time is not split into Python and native",
                no_split.join(", ")
            )
        }),
        duration_s: secs,
        samples: stats.samples,
        missed_samples: stats.missed,
        errors: stats.errors,
        paused_reads: stats.paused_reads,
        thinned_samples: stats.thinned,
        rate_hz: if secs > 0.0 {
            stats.samples as f64 / secs
        } else {
            0.0
        },
        requested_rate_hz: cfg.rate_hz,
        mode: if cfg.wall {
            TimeMode::Wall
        } else {
            TimeMode::Cpu
        },
        paused_max_hz: Some(PAUSED_MAX_HZ),
        profile_all: cfg.profile_all,
        unchanged_reads: stats.unchanged,
        short_cpu_reads: stats.short_cpu_reads,
        deferred_reads: stats.deferred,
        gave_way_boosts: stats.gave_way,
        native: cfg.native.then(|| {
            let n = &stats.native;
            let all = n.merged + n.unmerged;
            crate::profile::NativeMeta {
                merged_samples: n.merged,
                unmerged_samples: n.unmerged,
                merge_rate_pct: if all > 0 {
                    100.0 * n.merged as f64 / all as f64
                } else {
                    100.0
                },
                unmerged_reasons: n.reasons.clone(),
            }
        }),
    }
}

impl Ticker for Sampler {
    fn tick(&mut self) -> Result<bool> {
        match self.sample_once() {
            Ok(()) => Ok(true),
            Err(e) if e.is_process_gone() => Ok(false),
            Err(e) => Err(e),
        }
    }
    fn stats_mut(&mut self) -> &mut Stats {
        &mut self.stats
    }
}

/// Something sampled on a schedule: one process ([`Sampler`]) or a tree of them.
pub(crate) trait Ticker {
    /// Takes one sample; Ok(false) when there is nothing left to sample.
    fn tick(&mut self) -> Result<bool>;
    fn stats_mut(&mut self) -> &mut Stats;
}

/// Ticks are this much closer together than `1 / rate`. At exactly the period asked for
/// (1 ms, 10 ms), every tick falls at the same few phases of the kernel's clock tick (4 ms
/// at HZ=250), and the kernel charges CPU time by what a thread is doing at its tick: a
/// paused read at 1 kHz on fixtures/cpu/flip.py (`--blocking`, system-3.11) reported the
/// CPU-bound line 51% and 64% system time in 2 runs of 20 and 0.0% in 15 (the pauses' own
/// kernel time, ~1-3%, either always or never caught). 97/98 of the period is on no
/// kernel's tick grid (HZ 100, 250, 300, 1000): the phase sweeps the whole tick within
/// ~100 ticks, with every interval equal (random intervals would add variance to the
/// CPU-time weights). The achieved rate is reported as such: 1% over the rate asked, so
/// that a sampler that keeps up takes at least the rate asked (98/97, the other side of
/// the period, capped every run at 99% of it).
const OFF_GRID: f64 = 97.0 / 98.0;

/// Ticks `t` at `rate_hz` until `stop()` says so or `t` has nothing left to sample.
///
/// - `progress` is called about four times a second.
/// - `ends` is a process whose exit ends the recording (the program run, or the process
///   attached to). The wait between ticks ends when it exits, so the end is seen at once,
///   not at the next tick. That tick would come a tenth of a second later at 10 Hz, and
///   on average half a period later at any rate. A program run by us would seem to take
///   that much longer.
/// - `courteous` says the recording reads without stopping the program as a rule. This
///   thread may then give way to the program (see [`crate::courtesy`]).
/// - `pauses` says every tick stops the program's threads that ran (`--blocking`,
///   `--native`). After a tick ends, the next one waits at least as long as that tick
///   took. So the program runs at least half the time, whatever the rate. The ticks that
///   fall in that while are missed. (Ticks back to back starved the program. At 20 kHz,
///   where a paused sample takes longer than the period, julia's 3 s took over 90 s.)
#[allow(clippy::too_many_arguments)]
pub(crate) fn drive(
    t: &mut dyn Ticker,
    rate_hz: f64,
    stop: &mut dyn FnMut() -> bool,
    progress: &mut dyn FnMut(&Stats),
    ends: Option<i32>,
    courteous: bool,
    pauses: bool,
) -> Result<()> {
    let mut exit = ends.and_then(ExitWatch::open);
    let courtesy = courteous.then(crate::courtesy::Courtesy::begin).flatten();
    let period = Duration::from_secs_f64(1.0 / rate_hz.max(0.001)).mul_f64(OFF_GRID);
    // Sleeps of tens of microseconds: the default timer slack (50 µs) would stretch
    // each one by up to that much, halving a 20 kHz rate.
    // SAFETY: PR_SET_TIMERSLACK only changes this thread's timer slack.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong, 0, 0, 0) };
    let start = Instant::now();
    let mut next = start;
    let mut last_progress = start;
    let mut last_stop_check: Option<Instant> = None;
    loop {
        // `stop` costs system calls (a wait for the program, say): at most once a
        // millisecond, whatever the rate.
        if last_stop_check.is_none_or(|t| t.elapsed() >= Duration::from_millis(1)) {
            last_stop_check = Some(Instant::now());
            if stop() {
                break;
            }
        }
        if let Some(c) = &courtesy {
            c.tick_begins();
        }
        let began = Instant::now();
        if !t.tick()? {
            break;
        }
        next += period;
        let now = Instant::now();
        // The earliest the next tick may come: at once, or after a paused one as long again.
        let ready = if pauses {
            now + now.duration_since(began)
        } else {
            now
        };
        let fell_behind = ready > next;
        if fell_behind {
            // Fell behind. Ticks stay on their schedule (start + k·period): every tick
            // whose successor is also already due is missed and counted; the latest due
            // one is taken as soon as it may be. (Restarting the schedule from `now` would
            // drop the fraction of a period lost on every late sample: a sampler needing
            // 130 µs at 10 kHz would take 7.7 kHz while counting almost nothing as missed.)
            let behind = ready.duration_since(next).as_secs_f64() / period.as_secs_f64();
            let skipped = behind.floor() as u64;
            t.stats_mut().missed += skipped;
            next += period.mul_f64(skipped as f64);
        }
        // When the next tick comes.
        let at = next.max(ready);
        if let Some(c) = &courtesy {
            c.tick_ends(at);
        }
        if at <= now {
            // The latest tick due is taken at once.
        } else if let Some(e) = &exit {
            if e.wait(at) {
                // It exited: `stop` says so now (a tick would find it gone). Watched no
                // more: a process that stays a zombie (its parent not ours, not waiting)
                // would end every wait at once.
                last_stop_check = None;
                exit = None;
            }
        } else {
            std::thread::sleep(at - now);
        }
        t.stats_mut().elapsed = start.elapsed();
        if last_progress.elapsed() >= Duration::from_millis(250) {
            last_progress = Instant::now();
            progress(t.stats_mut());
        }
    }
    t.stats_mut().elapsed = start.elapsed();
    if let Some(c) = &courtesy {
        t.stats_mut().gave_way = Some(c.boosts());
    }
    Ok(())
}

/// A process's exit, as a file descriptor that becomes readable when it has exited
/// (`pidfd_open`, Linux 5.3+).
struct ExitWatch(std::os::fd::OwnedFd);

impl ExitWatch {
    /// None where pidfds are not available (an older kernel) or the process is gone.
    fn open(pid: i32) -> Option<ExitWatch> {
        use std::os::fd::FromRawFd;
        // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        // SAFETY: a descriptor the call just made, owned by nothing else.
        (fd >= 0).then(|| ExitWatch(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as i32) }))
    }

    /// Sleeps until `until`, or until the process exits: true when it has.
    fn wait(&self, until: Instant) -> bool {
        use std::os::fd::AsRawFd;
        let mut fds = [libc::pollfd {
            fd: self.0.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }];
        loop {
            let d = until.saturating_duration_since(Instant::now());
            if d.is_zero() {
                return false;
            }
            let ts = libc::timespec {
                tv_sec: d.as_secs() as libc::time_t,
                tv_nsec: d.subsec_nanos() as libc::c_long,
            };
            // SAFETY: one pollfd we own, a timeout we own, no signal mask.
            let n = unsafe { libc::ppoll(fds.as_mut_ptr(), 1, &ts, std::ptr::null()) };
            if n > 0 {
                return fds[0].revents != 0;
            }
            if n == 0 || std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
                return false;
            }
        }
    }
}

/// Folds one charge into `agg` (nothing when it carries no time), charged to the frame
/// the attribution rule picks. A target with its own files (a container's): a source is
/// read while the process is there to show it, not at the end (it may have exited, taking
/// its files' view along).
fn charge(
    agg: &mut Aggregator,
    sources: &mut IdMap<String, Option<Vec<String>>>,
    proc: &PythonProcess,
    cwd: Option<&str>,
    profile_all: bool,
    c: Charge<'_>,
) {
    if c.user_s + c.system_s + c.idle_s <= 0.0 {
        return;
    }
    let sample = ThreadSample {
        frames: c.frames,
        activity: c.activity,
        user_s: c.user_s,
        system_s: c.system_s,
        idle_s: c.idle_s,
        native_id: Some(c.tid),
        thread_name: None,
    };
    let attribution = crate::profile::charged_frame(c.frames, profile_all);
    if !proc.namespaces.same_files {
        if let Some(f) = attribution {
            if !sources.contains_key(&*f.filename) {
                let text = read_source(proc.pid, &absolute(&f.filename, cwd));
                sources.insert(f.filename.to_string(), text);
            }
        }
    }
    agg.add(&sample, attribution);
}

/// Positions not taken by the GPU ledger past this many are dropped (it takes them every
/// tick; this only bounds a buffer nobody drains).
const POSITIONS_MAX: usize = 1 << 16;

/// Adds where each thread of one sample is, with the sample's wall-clock time.
fn record_positions(
    buf: &mut Vec<crate::timeline::Position>,
    seen: &[Observation],
    pid: i32,
    profile_all: bool,
    wall_s: f64,
) {
    if buf.len() + seen.len() > POSITIONS_MAX {
        return;
    }
    let t_us = crate::timeline::now_us();
    for o in seen {
        buf.push(crate::timeline::Position {
            t_us,
            pid,
            tid: o.tid,
            frames: std::sync::Arc::from(o.frames.as_slice()),
            charged: crate::profile::charged_frame(&o.frames, profile_all).cloned(),
            cpu_s: o.user_s + o.system_s,
            interval_us: (wall_s * 1e6) as u64,
        });
    }
}

/// The address range where `pid` maps `file` (all its mappings together).
fn mapping_of(pid: i32, file: &std::path::Path) -> Option<(u64, u64)> {
    let maps = crate::proc::read_maps(pid).ok()?;
    crate::proc::maps::range_of(&maps, &file.to_string_lossy())
}

/// `file` made absolute against `cwd` when it is relative (`python app.py` records "app.py").
pub(crate) fn absolute(file: &str, cwd: Option<&str>) -> String {
    match cwd {
        Some(dir) if !file.starts_with('/') && !file.starts_with('<') => {
            format!("{}/{file}", dir.trim_end_matches('/'))
        }
        _ => file.to_string(),
    }
}

/// A source file's lines, read as the target sees the file (inside its root, symbolic links
/// included) while the process is there. Our own file of that path only when the target
/// shares our mounts, or is gone (a finished `run`, a saved profile).
pub(crate) fn read_source(pid: i32, file: &str) -> Option<Vec<String>> {
    use std::io::Read;
    if !file.starts_with('/') {
        return None;
    }
    let ours = || std::fs::read(file).ok();
    let bytes = if crate::proc::ns::Namespaces::of(pid).same_files {
        ours()?
    } else {
        match crate::proc::ns::open_in_root(pid, file) {
            Ok(mut f) => {
                let mut bytes = Vec::new();
                f.read_to_end(&mut bytes).ok()?;
                bytes
            }
            Err(_) if !crate::proc::process_exists(pid) => ours()?,
            Err(_) => return None,
        }
    };
    Some(
        String::from_utf8_lossy(&bytes)
            .lines()
            .map(|l| l.to_string())
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records when each tick came.
    struct Clock {
        ticks: Vec<Instant>,
        want: usize,
        stats: Stats,
    }

    impl Ticker for Clock {
        fn tick(&mut self) -> Result<bool> {
            self.ticks.push(Instant::now());
            Ok(self.ticks.len() < self.want)
        }
        fn stats_mut(&mut self) -> &mut Stats {
            &mut self.stats
        }
    }

    /// At 1 kHz the ticks fall at every phase of a 4 ms grid (the kernel's clock tick at
    /// HZ=250), not at the same four: their offsets from the first tick, modulo 4 ms, fill
    /// most of its forty 0.1 ms bins. (Exact 1 ms ticks fill four, and a few beside them
    /// by wake-up delay.)
    #[test]
    fn ticks_sweep_the_phase_of_a_kernel_tick() {
        let mut c = Clock {
            ticks: Vec::new(),
            want: 400,
            stats: Stats::default(),
        };
        drive(
            &mut c,
            1000.0,
            &mut || false,
            &mut |_| {},
            None,
            false,
            false,
        )
        .unwrap();
        let first = c.ticks[0];
        let mut bins = [0u32; 40];
        for t in &c.ticks {
            let us = t.duration_since(first).as_micros() as u64 % 4000;
            bins[(us / 100) as usize] += 1;
        }
        let filled = bins.iter().filter(|&&b| b > 0).count();
        assert!(filled >= 30, "{filled} of 40 phase bins: {bins:?}");
    }

    /// Takes 2 ms a tick (as a paused sample might), recording when each began and ended.
    struct Slow {
        spans: Vec<(Instant, Instant)>,
        stats: Stats,
    }

    impl Ticker for Slow {
        fn tick(&mut self) -> Result<bool> {
            let began = Instant::now();
            std::thread::sleep(Duration::from_millis(2));
            self.spans.push((began, Instant::now()));
            Ok(self.spans.len() < 50)
        }
        fn stats_mut(&mut self) -> &mut Stats {
            &mut self.stats
        }
    }

    /// Ticks that stop the program (`pauses`) and take longer than the period (2 ms at
    /// 1 kHz) are not taken back to back: after each, the program has at least as long
    /// again, and the ticks that fall in it are counted as missed. Without `pauses` the
    /// latest tick due is taken at once.
    #[test]
    fn ticks_that_pause_the_program_leave_it_as_long_to_run() {
        for pauses in [true, false] {
            let mut s = Slow {
                spans: Vec::new(),
                stats: Stats::default(),
            };
            drive(
                &mut s,
                1000.0,
                &mut || false,
                &mut |_| {},
                None,
                false,
                pauses,
            )
            .unwrap();
            let gaps: Vec<Duration> = s
                .spans
                .windows(2)
                .map(|w| w[1].0.duration_since(w[0].1))
                .collect();
            let held = |i: usize| s.spans[i].1.duration_since(s.spans[i].0);
            if pauses {
                for (i, g) in gaps.iter().enumerate() {
                    assert!(*g >= held(i), "tick {i}: {g:?} to run after {:?}", held(i));
                }
                // 50 ticks of ~4 ms where 1 ms ones were asked: ~3 missed each.
                assert!(s.stats.missed >= 100, "missed {}", s.stats.missed);
            } else {
                let short = gaps
                    .iter()
                    .filter(|g| **g < Duration::from_millis(1))
                    .count();
                assert!(short >= 40, "{short} of 49 ticks back to back: {gaps:?}");
            }
        }
    }
}
