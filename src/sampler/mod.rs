//! The sampling loop: every thread of a Python process, at a steady rate, from outside.
//!
//! Owns: [`Sampler`], which is
//! - timing (deadline-based, missed ticks counted, never invented);
//! - the per-thread CPU time. It is the scheduler's count, from a BPF program's records where
//!   one may be loaded (see [`bpf`]), else /proc. User vs system is measured by the kernel.
//! - the Python-vs-native tag (the innermost frame's current instruction is a CALL of some
//!   form);
//! - idle and GIL state;
//! - folding library frames into the user's calling line;
//! - feeding the [`Aggregator`].
//!
//! Must not: format output, or keep samples one by one (memory stays bounded).
//!
//! The files:
//! - `mod.rs`: [`Sampler`], its configuration and totals, and one sample's charges.
//! - `observe.rs`: what one sample sees (listing, CPU times, the snapshot, observations).
//! - `drive.rs`: the schedule of ticks.
//! - `charge.rs`: a charge folded into the aggregate.
//! - `meta.rs`: the profile's head.
//! - `tree.rs`: a process and its children.
//! - `attribution.rs`, `cputime.rs`, `ran.rs`, `bpf.rs`, `pauses.rs`, `native.rs`: the
//!   rules and readings each names.
//! - `labels.rs`: what the report calls each thread.
//! - What is known of threads at rest is kept by [`python::RestTracker`], not here.

mod attribution;
pub(crate) mod bpf;
mod charge;
pub mod cputime;
mod drive;
mod labels;
mod meta;
pub(crate) mod native;
mod observe;
mod pauses;
mod ran;
pub(crate) mod tree;

use crate::error::Result;
use crate::profile::Aggregator;
pub use crate::python::ReadMode;
use crate::python::{self, PythonProcess, PythonReader, Unread};
use crate::{IdMap, IdSet};
use attribution::{Attribution, Charge};
pub(crate) use charge::{absolute, read_source};
use charge::{charge, mapping_of, record_positions};
use cputime::CpuTracker;
pub(crate) use drive::{drive, Ticker};
use meta::profile_meta;
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
    /// The memory ring file (see `memory`). A thread blocked in a futex on it is waiting for
    /// us to read its stack (the allocation handshake), not sleeping in the program, so its
    /// CPU time is charged to where it is.
    pub handshake_file: Option<std::path::PathBuf>,
    /// Read native frames too (`--native`). Every sample then pauses the threads, and their
    /// stacks are merged native and Python frames.
    pub native: bool,
    /// Charge a thread that runs an asyncio task to the task's stack joined to those of
    /// the tasks awaiting it (`--async`, Python 3.11+).
    pub tasks: bool,
}

impl SamplerConfig {
    /// Whether the sampler may give way to the program (see [`crate::courtesy`]). It may when
    /// it reads without stopping the program as a rule (not `--blocking`, not `--native`),
    /// and no memory handshake makes the program wait for it. `memory`: whether this
    /// recording reads a memory ring, whose consumer runs in the sampler's ticks.
    pub(crate) fn courteous(&self, memory: bool) -> bool {
        !memory && !self.native && self.handshake_file.is_none() && self.mode != ReadMode::Paused
    }

    /// Whether every sample stops the threads that ran (`--blocking`, `--native`). Then a
    /// sample is followed by at least as long with the program running (see [`drive()`]).
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
    /// Thread samples of threads that had not run since their last read, which are not read
    /// again (their stack is that read's).
    pub unchanged: u64,
    /// Samples that read the CPU time of only the threads that ran lately, the process's
    /// CPU clock showing that no other thread ran (see `ran`).
    pub short_cpu_reads: u64,
    /// Thread samples of threads that ran but were left for a later sample, past the
    /// most walks a sample makes ([`observe::MAX_WALKS`]; their CPU time waits for that read).
    pub deferred: u64,
    pub elapsed: Duration,
    /// Samples that could see a GIL (not of a free-threaded build), and those of them in
    /// which some thread held it. Together they give the GIL's share of the time (a live
    /// view's header).
    pub gil_samples: u64,
    pub gil_held: u64,
    /// The sampler gave way to the program (ran under `SCHED_IDLE` while reading without
    /// stopping it, see `courtesy`). This counts how often it took the normal policy back
    /// because it could not run (a machine whose CPUs were all busy). None: it did not give way.
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
    /// /proc/PID/task, open. Its link count tells how many threads the process has (see
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
    /// What is known of the threads at rest: their last reads, which the next snapshot
    /// may leave unwalked (see [`python::RestTracker`]).
    rest: python::RestTracker,
    /// Paused reads (`--blocking`, `--native`): CPU seconds of each thread that our own
    /// pauses account for.
    /// - A pause wakes a waiting thread for a moment. It leaves its wait and enters it
    ///   again whenever the scheduler lets it, maybe after the next sample.
    /// - Its CPU time moves by that much, which is ours, not a sign that it ran.
    /// - Each pause that stops a thread in a wait (`Snapshot::woken`) adds
    ///   [`observe::WOKEN_S`]. At most three pauses' worth are kept. CPU time it covers is
    ///   spent from it.
    /// - A thread stopped while it ran gets none. At 10 kHz it runs less than
    ///   [`observe::WOKEN_S`] between two paused samples, and all its time went as wake-ups
    ///   (the profile's total was 1% of the CPU time the program used).
    wake_credit: IdMap<i32, f64>,
    /// The threads listed by the last sample (ascending). While they stay the same,
    /// nothing kept per thread needs forgetting.
    alive_list: Vec<i32>,
    /// Each listed thread's CPU time (nanoseconds), as the last sample read it. It is kept
    /// from one sample to the next, where only the threads that ran change (see `ran`).
    run_ns: IdMap<i32, u64>,
    /// The outcome of a sample's reads, for [`PauseSchedule::update`] (room kept likewise).
    outcome: Vec<(u64, bool)>,
    /// Whether the last CPU reading was a short one (see `ran`), meaning no thread outside
    /// the listing ran.
    cpu_short: bool,
    /// The Python threads (by `thread_id`) that ran since a live view last asked, and how
    /// many the last snapshot had (see [`Sampler::take_threads`]).
    threads_ran: IdSet<u64>,
    threads_seen: usize,
    /// Whether the last snapshot had a Python thread without a kernel id (before 3.11 a
    /// new thread's is found through the listing, so one is due soon).
    unmapped: bool,
    /// Thread states found to record a stale kernel id, said once each (a note in `stats`).
    stale_said: Vec<u64>,
    /// What the per-thread report calls each thread (names, interpreters).
    labels: labels::ThreadLabels,
}

impl Sampler {
    pub fn new(proc: PythonProcess, cfg: SamplerConfig) -> Sampler {
        let mut reader = PythonReader::new(proc);
        if cfg.tasks {
            // `--async`: finds each thread's running task and its awaiters.
            reader = reader.with_tasks(python::AsyncReader::for_samples(cfg.wall));
        }
        let pid = reader.process().pid;
        let cwd = crate::proc::cwd(pid);
        // Opt-in (`SCALENE_RS_BPF=1`) until its gain is measured on a quiet machine. It
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
            rest: python::RestTracker::default(),
            wake_credit: IdMap::default(),
            alive_list: Vec::new(),
            run_ns: IdMap::default(),
            outcome: Vec::new(),
            cpu_short: false,
            unmapped: false,
            stale_said: Vec::new(),
            threads_ran: IdSet::default(),
            threads_seen: 0,
            labels: labels::ThreadLabels::default(),
        }
        .with_handshake_range()
    }

    /// Reads native frames too, with images from `cache` (shared by a run's processes).
    pub(crate) fn with_native(mut self, cache: native::SharedCache) -> Self {
        self.native = Some(native::NativeSampling::new(cache));
        self
    }

    /// Takes one sample of every thread. Errors that lose only this sample are counted, not
    /// returned. An error is returned only when the process is gone.
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
                // The loop's thread was counted by its own observation.
                counts: false,
            };
            charge(agg, sources, proc, cwd.as_deref(), cfg.profile_all, c);
        }
        self.attribution.retain(&tids);
        Ok(())
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
    /// mapping, from /proc/PID/task/TID/syscall). It is then waiting for us, on its way
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

    /// The Python threads that ran since the last call, and those that did not (of the
    /// last snapshot's).
    pub(crate) fn take_threads(&mut self) -> (usize, usize) {
        let ran = self.threads_ran.len().min(self.threads_seen);
        self.threads_ran.clear();
        (ran, self.threads_seen - ran)
    }

    /// Sources read while sampling (a target with its own files), by file name.
    fn sources(&self) -> &IdMap<String, Option<Vec<String>>> {
        &self.sources
    }
}
