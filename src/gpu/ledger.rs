//! Charging GPU time and memory to lines. NVML's per-process samples meet the samplers'
//! positions of each thread.
//!
//! Owns: [`Ledger`].
//!
//! GPU time:
//! - A utilization sample of process P gives the SM % over NVML's sampling period ending at
//!   its timestamp. It stands for `sm% × window` GPU-seconds.
//! - The window runs from P's previous sample on that device, at most one period back.
//! - Those seconds go to P's positions inside the window (every sampling tick of every
//!   thread). Each position is weighted by the CPU time its thread used there. A thread
//!   that drives a GPU launches kernels or spins in a synchronize. A pool thread that wakes
//!   now and then uses next to nothing.
//! - When P's threads hardly used a CPU in the window (a synchronize that blocks), the main
//!   thread's positions share the seconds (see [`weigh`]).
//!
//! GPU memory:
//! - Each poll's reading of P's GPU memory goes to the line each thread ran right after the
//!   reading, weighed the same way. The memory was allocated before the reading. So it
//!   never goes to a line that ran before the allocation.
//! - A line's peak is the most it saw, which is the memory held while the line ran.
//!
//! Samples of other processes are counted, never charged. NVML's timestamps are checked
//! against our clock (see [`Ledger::check_clock`]).
//!
//! Must not: talk to NVML or read the target. Its inputs are plain values, so it is tested
//! over made-up samples.

use super::monitor::{DeviceInfo, MemReading, Report, UtilSample};
use crate::profile::{Frame, GpuDevice, GpuStack, GpuSummary, LineGpu, Profile};
use crate::timeline::Position;
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;

/// Positions older than this (behind the newest) are dropped, because NVML's samples arrive
/// within a second or so of their window.
const KEEP_US: u64 = 30_000_000;
/// NVML's per-process sampling period until one is measured (about 1/6 to 1/5 s).
const DEFAULT_PERIOD_US: u64 = 200_000;
/// Gaps seen on a device before its shortest one is taken for its period.
const PERIOD_TRUSTED_AFTER: u32 = 3;
/// Deltas between a device's samples shorter than this are not taken for its period.
const MIN_PERIOD_US: u64 = 20_000;
/// A sample of ours may be this much older than its process's start (known to the second),
/// or this much newer than our clock, before NVML's clock is taken to differ from ours.
const CLOCK_BEHIND_US: i64 = 2_000_000;
const CLOCK_AHEAD_US: i64 = 2_000_000;
/// With no position inside a window, a thread's latest position this recent still counts.
const STALE_US: u64 = 1_000_000;
/// At most this many slices in the timeline.
const TIMELINE_SLICES: u64 = 100;
/// Raw timeline points kept before they are thinned (a long run stays bounded).
const POINTS_MAX: usize = 100_000;

/// How far NVML got.
#[derive(Debug, Clone, PartialEq)]
enum State {
    /// Nothing heard yet.
    Waiting,
    Running,
    Unavailable(String),
    /// Failed at (our clock, µs), why.
    Failed(u64, String),
}

#[derive(Debug, Default, Clone, Copy)]
struct DeviceAcc {
    gpu_s: f64,
    mem_peak_mib: f64,
    busy_sum: f64,
    busy_n: u64,
}

/// Folds NVML's reports and the samplers' positions into GPU figures.
#[derive(Debug)]
pub(crate) struct Ledger {
    start_us: u64,
    /// NVML could not be loaded at all (no driver installed).
    no_library: bool,
    state: State,
    devices: Vec<DeviceInfo>,
    driver: Option<String>,
    notes: Vec<String>,
    /// Processes of the program (sampled now or before).
    ours: HashSet<u32>,
    /// When each of them started, µs since the epoch.
    started: HashMap<u32, u64>,
    positions: HashMap<i32, VecDeque<Position>>,
    /// Each (device, pid)'s newest sample timestamp (our clock).
    last_ts: HashMap<(u32, u32), u64>,
    /// Each device's shortest gap between samples, and how many gaps were seen.
    period_us: HashMap<u32, (u64, u32)>,
    /// (device, pid) pairs whose first sample the clock check has passed over.
    clock_pairs: HashSet<(u32, u32)>,
    polls: u64,
    /// NVML's clock minus ours, once checked (None until then).
    clock_offset_us: Option<i64>,
    /// Samples held until the clock is checked.
    pending: Vec<UtilSample>,
    /// Memory readings (pid, read by, MiB) waiting for a position after them.
    pending_mem: Vec<(u32, u64, f64)>,
    /// GPU time of a process from before its first position (pid, window start, end,
    /// GPU-seconds). A program starts on the GPU before the sampler's first reading of it
    /// (seen: 0.1-0.35 s of the first phase of fixtures/gpu/phases.py on 3.7 on a loaded
    /// machine, charged to no line). Each is charged where the threads were first seen
    /// after it, within [`STALE_US`]; else to no line.
    early: Vec<(i32, u64, u64, f64)>,
    last_at_us: u64,
    lines: HashMap<(crate::profile::Name, u32), (f64, f64)>,
    stacks: HashMap<(Arc<[Frame]>, i32), f64>,
    procs: HashMap<u32, (f64, f64)>,
    device_acc: HashMap<u32, DeviceAcc>,
    gpu_s: f64,
    unattributed_s: f64,
    mem_peak_mib: f64,
    /// (window start, end, GPU-seconds), our clock.
    util_windows: Vec<(u64, u64, f64)>,
    /// (poll time, the program's GPU memory MiB).
    mem_points: Vec<(u64, f64)>,
    other_samples: u64,
}

/// The ledger's result: the summary, and the per-line and per-process figures.
#[derive(Debug, Clone, Default)]
pub(crate) struct GpuResult {
    pub(crate) summary: GpuSummary,
    /// (file, line) → the line's figures.
    pub(crate) lines: HashMap<(crate::profile::Name, u32), LineGpu>,
    /// pid → (share of the program's GPU time %, peak MB).
    pub(crate) procs: HashMap<i32, (f64, f64)>,
}

impl Ledger {
    /// Whether NVML could not be loaded at all (no NVIDIA driver installed).
    pub(crate) fn no_library(&self) -> bool {
        self.no_library
    }

    /// A ledger for a recording that started at `start_us` (µs since the epoch).
    pub(crate) fn new(start_us: u64) -> Ledger {
        Ledger {
            start_us,
            state: State::Waiting,
            no_library: false,
            devices: Vec::new(),
            driver: None,
            notes: Vec::new(),
            ours: HashSet::new(),
            started: HashMap::new(),
            positions: HashMap::new(),
            last_ts: HashMap::new(),
            period_us: HashMap::new(),
            clock_pairs: HashSet::new(),
            polls: 0,
            clock_offset_us: None,
            pending: Vec::new(),
            pending_mem: Vec::new(),
            early: Vec::new(),
            last_at_us: start_us,
            lines: HashMap::new(),
            stacks: HashMap::new(),
            procs: HashMap::new(),
            device_acc: HashMap::new(),
            gpu_s: 0.0,
            unattributed_s: 0.0,
            mem_peak_mib: 0.0,
            util_windows: Vec::new(),
            mem_points: Vec::new(),
            other_samples: 0,
        }
    }

    /// Whether positions are worth recording (NVML answered with a device).
    pub(crate) fn wants_positions(&self) -> bool {
        self.state == State::Running
    }

    /// Whether process `pid` is known to be the program's.
    pub(crate) fn knows(&self, pid: i32) -> bool {
        pid > 0 && self.ours.contains(&(pid as u32))
    }

    /// Processes of the program (called each tick with those sampled), each with when it
    /// started (µs since the epoch) when known. None of its samples can be older.
    pub(crate) fn add_ours(&mut self, pids: impl IntoIterator<Item = (i32, Option<u64>)>) {
        for (pid, start) in pids.into_iter().filter(|p| p.0 > 0) {
            self.ours.insert(pid as u32);
            if let Some(s) = start {
                self.started.insert(pid as u32, s);
            }
        }
    }

    /// Positions recorded by the samplers since the last call, oldest first per thread.
    pub(crate) fn add_positions(&mut self, new: Vec<Position>) {
        let mut newest = 0;
        for p in new {
            newest = newest.max(p.t_us);
            self.ours.insert(p.pid as u32);
            self.positions.entry(p.pid).or_default().push_back(p);
        }
        if newest > KEEP_US {
            let cut = newest - KEEP_US;
            for q in self.positions.values_mut() {
                while q.front().is_some_and(|p| p.t_us < cut) {
                    q.pop_front();
                }
            }
        }
        if !self.early.is_empty() {
            self.settle_early(false);
        }
    }

    /// Charges the GPU time from before a process's first position (see `early`) where its
    /// threads were first seen after it, once they were. At the end (`all`), or when none
    /// was within [`STALE_US`], it goes to no line.
    fn settle_early(&mut self, all: bool) {
        for (pid, start, end, gpu_s) in std::mem::take(&mut self.early) {
            let q = self.positions.get(&pid);
            let after = q.map(|q| first_per_thread(q, end)).unwrap_or_default();
            let newest = q.and_then(|q| q.back()).map_or(0, |p| p.t_us);
            if !after.is_empty() {
                let chosen = weigh(after, pid, end.saturating_sub(start));
                self.charge(chosen, gpu_s);
            } else if all || newest > end + STALE_US {
                self.unattributed_s += gpu_s;
            } else {
                self.early.push((pid, start, end, gpu_s));
            }
        }
    }

    /// Charges `gpu_s` to the positions `chosen`, each by its weight.
    fn charge(&mut self, chosen: Vec<(Position, f64)>, gpu_s: f64) {
        for (p, w) in chosen {
            let share = gpu_s * w;
            if let Some(f) = &p.charged {
                if let Some(line) = f.line {
                    self.lines.entry((f.filename, line)).or_default().0 += share;
                }
            }
            *self.stacks.entry((p.frames.clone(), p.tid)).or_default() += share;
        }
    }

    /// Takes what the poller sent.
    pub(crate) fn take(&mut self, reports: Vec<Report>) {
        for r in reports {
            match r {
                Report::Started { devices, driver } => {
                    self.devices = devices;
                    self.driver = driver;
                    if self.state == State::Waiting {
                        self.state = State::Running;
                    }
                }
                Report::Unavailable(why) => self.state = State::Unavailable(why),
                Report::NoLibrary(why) => {
                    self.no_library = true;
                    self.state = State::Unavailable(why);
                }
                Report::Note(n) => self.notes.push(n),
                Report::Failed { at_us, why } => self.state = State::Failed(at_us, why),
                Report::Poll {
                    at_us,
                    util,
                    mem,
                    device_busy,
                } => self.poll(at_us, util, mem, device_busy),
                Report::Stopped => {}
            }
        }
    }

    fn poll(
        &mut self,
        at_us: u64,
        util: Vec<UtilSample>,
        mem: Vec<MemReading>,
        device_busy: Vec<(u32, u32)>,
    ) {
        self.polls += 1;
        self.last_at_us = self.last_at_us.max(at_us);
        if self.clock_offset_us.is_none() {
            self.check_clock(at_us, &util);
        }
        self.pending.extend(util);
        if self.clock_offset_us.is_some() {
            self.settle_pending();
        }
        for (dev, busy) in device_busy {
            let d = self.device_acc.entry(dev).or_default();
            d.busy_sum += busy as f64;
            d.busy_n += 1;
        }
        self.memory(at_us, &mem);
    }

    /// Decides, at the second sample of one of the program's processes, whether NVML's
    /// timestamps are on our clock. A sample of ours from the future, or from before its
    /// process started, cannot be (NVML may answer with seconds of history at any time, so
    /// a sample's age alone tells nothing). Such a clock is corrected by the newest sample
    /// taken as made now.
    fn check_clock(&mut self, at_us: u64, util: &[UtilSample]) {
        let mut ours: Vec<&UtilSample> =
            util.iter().filter(|s| self.ours.contains(&s.pid)).collect();
        ours.sort_by_key(|s| s.t_us);
        // A process's first sample may carry an old time (see `utilization`), so it is not
        // judged.
        ours.retain(|s| !self.clock_pairs.insert((s.device, s.pid)));
        let Some(newest) = ours.iter().map(|s| s.t_us).max() else {
            return;
        };
        let ahead = newest as i64 - at_us as i64 > CLOCK_AHEAD_US;
        let behind = ours.iter().any(|s| {
            self.started
                .get(&s.pid)
                .is_some_and(|&st| (s.t_us as i64) < st as i64 - CLOCK_BEHIND_US)
        });
        let offset = if ahead || behind {
            let off = newest as i64 - at_us as i64;
            self.notes.push(format!(
                "NVML's timestamps differ from this machine's clock by {:.1} s: corrected",
                -off as f64 / 1e6
            ));
            off
        } else {
            0
        };
        self.clock_offset_us = Some(offset);
    }

    /// Charges the samples held for the clock check.
    fn settle_pending(&mut self) {
        let offset = self.clock_offset_us.unwrap_or(0);
        let mut pending = std::mem::take(&mut self.pending);
        pending.sort_by_key(|s| s.t_us);
        for mut s in pending {
            s.t_us = (s.t_us as i64 - offset).max(0) as u64;
            self.utilization(s);
        }
    }

    /// One utilization sample (timestamp on our clock).
    fn utilization(&mut self, s: UtilSample) {
        // NVML samples each device on one grid, so any process's consecutive samples measure
        // its period.
        let key = (s.device, s.pid);
        let prev = self.last_ts.get(&key).copied();
        if prev.is_some_and(|p| s.t_us <= p) {
            return;
        }
        if let Some(p) = prev {
            let delta = s.t_us - p;
            if delta >= MIN_PERIOD_US {
                let e = self.period_us.entry(s.device).or_insert((u64::MAX, 0));
                e.0 = e.0.min(delta);
                e.1 += 1;
            }
        }
        self.last_ts.insert(key, s.t_us);
        if !self.ours.contains(&s.pid) {
            self.other_samples += 1;
            return;
        }
        // A process's first sample on a device carries the time of the device's previous
        // sample, which may be from before the process existed (seen on an H200, driver
        // 580: 8 s before, with 44% SM). It stands for nothing of ours.
        let started = self.started.get(&s.pid).copied().unwrap_or(0);
        if prev.is_none() && s.t_us < started {
            return;
        }
        // NVML's period is the shortest gap between a device's samples, once a few were seen
        // (the first gaps may span idle stretches), never more than the default before.
        let period = match self.period_us.get(&s.device) {
            Some(&(min, n)) if n >= PERIOD_TRUSTED_AFTER => min,
            Some(&(min, _)) => min.min(DEFAULT_PERIOD_US),
            None => DEFAULT_PERIOD_US,
        };
        let start = prev
            .unwrap_or(0)
            .max(s.t_us.saturating_sub(period))
            .max(self.start_us);
        let end = s.t_us;
        if end <= start || s.sm_pct == 0 {
            return;
        }
        let gpu_s = s.sm_pct.min(100) as f64 / 100.0 * (end - start) as f64 / 1e6;
        self.gpu_s += gpu_s;
        self.device_acc.entry(s.device).or_default().gpu_s += gpu_s;
        self.procs.entry(s.pid).or_default().0 += gpu_s;
        self.util_windows.push((start, end, gpu_s));
        if self.util_windows.len() > POINTS_MAX {
            self.util_windows = thin_windows(&self.util_windows);
        }
        let pid = s.pid as i32;
        let chosen = self.chosen(pid, start, end);
        if chosen.is_empty() {
            // Before the process's first position: where it goes next (see `early`).
            let first = self.positions.get(&pid).and_then(|q| q.front());
            if first.is_none_or(|p| p.t_us > end) {
                self.early.push((pid, start, end, gpu_s));
                self.settle_early(false);
            } else {
                self.unattributed_s += gpu_s;
            }
            return;
        }
        self.charge(chosen, gpu_s);
    }

    /// Process `pid`'s positions in the window (start, end], each with its weight (they
    /// add up to 1; see [`weigh`]). With none in the window, each thread's latest position
    /// before `end`, if recent.
    fn chosen(&self, pid: i32, start: u64, end: u64) -> Vec<(Position, f64)> {
        let Some(q) = self.positions.get(&pid) else {
            return Vec::new();
        };
        let mut inside: Vec<Position> = q
            .iter()
            .filter(|p| p.t_us > start && p.t_us <= end)
            .cloned()
            .collect();
        if inside.is_empty() {
            inside = latest_per_thread(q, end);
        }
        weigh(inside, pid, end.saturating_sub(start))
    }

    /// One poll's memory readings.
    fn memory(&mut self, at_us: u64, mem: &[MemReading]) {
        let mut per_pid: HashMap<u32, f64> = HashMap::new();
        let mut per_dev: HashMap<u32, f64> = HashMap::new();
        for m in mem.iter().filter(|m| self.ours.contains(&m.pid)) {
            *per_pid.entry(m.pid).or_default() += m.mib;
            *per_dev.entry(m.device).or_default() += m.mib;
        }
        // Folded from +0.0, because an empty f64 sum is -0.0.
        let total = per_pid.values().fold(0.0, |a, b| a + b);
        self.mem_peak_mib = self.mem_peak_mib.max(total);
        self.mem_points.push((at_us, total));
        if self.mem_points.len() > POINTS_MAX {
            self.mem_points = thin_points(&self.mem_points);
        }
        for (dev, mib) in per_dev {
            let d = self.device_acc.entry(dev).or_default();
            d.mem_peak_mib = d.mem_peak_mib.max(mib);
        }
        for (pid, mib) in per_pid {
            let e = self.procs.entry(pid).or_default();
            e.1 = e.1.max(mib);
            self.pending_mem.push((pid, at_us, mib));
        }
        self.settle_memory(false);
    }

    /// Charges the memory readings that can be:
    /// - each to the line each thread of its process ran right after it was read, once a
    ///   position after it exists. The memory a reading shows was allocated before it, so
    ///   that line is the allocating one or a later one, never one that ran before the
    ///   allocation;
    /// - at the end (`all`), or when none came within [`STALE_US`], to the latest line
    ///   before it.
    fn settle_memory(&mut self, all: bool) {
        let pending = std::mem::take(&mut self.pending_mem);
        for (pid, at_us, mib) in pending {
            let q = self.positions.get(&(pid as i32));
            let after = q.map(|q| first_per_thread(q, at_us)).unwrap_or_default();
            let newest = q.and_then(|q| q.back()).map_or(0, |p| p.t_us);
            let seen = if !after.is_empty() {
                after
            } else if all || newest > at_us + STALE_US {
                q.map(|q| latest_per_thread(q, at_us)).unwrap_or_default()
            } else {
                self.pending_mem.push((pid, at_us, mib));
                continue;
            };
            let interval = seen.iter().map(|p| p.interval_us).max().unwrap_or(0);
            // Threads with a real share of the CPU then (not a pool thread waking).
            for (p, _) in weigh(seen, pid as i32, interval)
                .into_iter()
                .filter(|(_, w)| *w >= MEMORY_MIN_WEIGHT)
            {
                if let Some((f, line)) = p.charged.as_ref().and_then(|f| f.line.map(|l| (f, l))) {
                    let e = self.lines.entry((f.filename, line)).or_default();
                    e.1 = e.1.max(mib);
                }
            }
        }
    }

    /// The figures, at the end of a recording that ended at `end_us`. `answered_stop`:
    /// whether the poller answered the request to stop in time.
    pub(crate) fn finish(mut self, end_us: u64, answered_stop: bool) -> GpuResult {
        if self.clock_offset_us.is_none() {
            self.clock_offset_us = Some(0);
        }
        self.settle_pending();
        self.settle_early(true);
        self.settle_memory(true);
        let end_us = end_us.max(self.start_us + 1);
        let mut summary = GpuSummary {
            notes: std::mem::take(&mut self.notes),
            driver: self.driver.clone(),
            gpu_s: self.gpu_s,
            unattributed_s: self.unattributed_s,
            mem_peak_mb: self.mem_peak_mib,
            other_process_samples: self.other_samples,
            ..Default::default()
        };
        let secs = |t: u64| t.saturating_sub(self.start_us) as f64 / 1e6;
        match &self.state {
            State::Waiting => {
                summary.unavailable =
                    Some("NVML did not answer (loading it or nvmlInit did not return)".to_string());
            }
            State::Unavailable(why) => summary.unavailable = Some(why.clone()),
            State::Failed(at, why) => {
                let msg = format!(
                    "{why} {:.1} s into the recording: GPU figures cover it up to then",
                    secs(*at)
                );
                if self.polls == 0 || !(self.gpu_s > 0.0 || self.mem_peak_mib > 0.0) {
                    summary.unavailable = Some(msg);
                } else {
                    summary.notes.push(msg);
                }
            }
            State::Running => {
                if !answered_stop {
                    summary.notes.push(format!(
                        "NVML did not answer at the end (a call into the driver hung): GPU \
                         figures stop at its last answer, {:.1} s in",
                        secs(self.last_at_us)
                    ));
                }
            }
        }
        if summary.unavailable.is_none() && !(self.gpu_s > 0.0 || self.mem_peak_mib > 0.0) {
            let names: Vec<String> = self.devices.iter().map(|d| d.name.clone()).collect();
            let others = if self.other_samples > 0 {
                "; other processes used it, never charged"
            } else {
                ""
            };
            summary.unavailable = Some(format!(
                "the program used no GPU (NVML watched {}: {}{others})",
                names.len(),
                names.join(", ")
            ));
        }
        let total = self.gpu_s;
        let pct = |s: f64| if total > 0.0 { 100.0 * s / total } else { 0.0 };
        summary.devices = self
            .devices
            .iter()
            .map(|d| {
                let acc = self.device_acc.get(&d.index).copied().unwrap_or_default();
                GpuDevice {
                    index: d.index,
                    name: d.name.clone(),
                    uuid: d.uuid.clone(),
                    gpu_s: acc.gpu_s,
                    mem_peak_mb: acc.mem_peak_mib,
                    device_busy_pct: (acc.busy_n > 0).then(|| acc.busy_sum / acc.busy_n as f64),
                }
            })
            .collect();
        if summary.unavailable.is_none() {
            summary.timeline = self.timeline(end_us);
        }
        let mut stacks: Vec<GpuStack> = self
            .stacks
            .iter()
            .map(|((frames, tid), s)| GpuStack {
                frames: frames.to_vec(),
                native_id: Some(*tid),
                gpu_ms: s * 1e3,
            })
            .collect();
        stacks.sort_by(|a, b| {
            b.gpu_ms
                .total_cmp(&a.gpu_ms)
                .then_with(|| a.frames.cmp(&b.frames))
        });
        summary.stacks = stacks;
        let lines = self
            .lines
            .iter()
            .map(|(k, &(s, mib))| {
                (
                    *k,
                    LineGpu {
                        gpu_pct: pct(s),
                        gpu_mem_peak_mb: mib,
                    },
                )
            })
            .collect();
        let procs = self
            .procs
            .iter()
            .map(|(&pid, &(s, mib))| (pid as i32, (pct(s), mib)))
            .collect();
        GpuResult {
            summary,
            lines,
            procs,
        }
    }

    /// The program's utilization and memory in equal slices of the recording.
    fn timeline(&self, end_us: u64) -> Vec<[f64; 3]> {
        let span = end_us - self.start_us;
        let n = (span / DEFAULT_PERIOD_US).clamp(1, TIMELINE_SLICES);
        let width = span as f64 / n as f64;
        let mut busy = vec![0.0; n as usize];
        for &(s, e, g) in &self.util_windows {
            if e <= s {
                continue;
            }
            let len = (e - s) as f64;
            let (a, b) = (
                (s.saturating_sub(self.start_us)) as f64,
                (e.saturating_sub(self.start_us)) as f64,
            );
            let first = ((a / width) as usize).min(n as usize - 1);
            let last = ((b / width) as usize).min(n as usize - 1);
            for (i, slot) in busy.iter_mut().enumerate().take(last + 1).skip(first) {
                let lo = a.max(i as f64 * width);
                let hi = b.min((i + 1) as f64 * width);
                if hi > lo {
                    *slot += g * (hi - lo) / len;
                }
            }
        }
        let mut mem = vec![f64::NAN; n as usize];
        for &(t, mib) in &self.mem_points {
            let i = ((t.saturating_sub(self.start_us)) as f64 / width) as usize;
            let i = i.min(n as usize - 1);
            mem[i] = if mem[i].is_nan() {
                mib
            } else {
                mem[i].max(mib)
            };
        }
        let mut carried = 0.0;
        (0..n as usize)
            .map(|i| {
                if !mem[i].is_nan() {
                    carried = mem[i];
                }
                [
                    i as f64 * width / 1e6,
                    100.0 * busy[i] / (width / 1e6),
                    carried,
                ]
            })
            .collect()
    }

    /// Puts the figures into `profile`. Lines gain their GPU columns (lines that had GPU
    /// time and no CPU time are added, with their source), processes theirs.
    pub(crate) fn merge(
        result: GpuResult,
        profile: &mut Profile,
        source: &mut dyn FnMut(&str) -> Option<Vec<String>>,
    ) {
        let data = result.summary.has_data();
        if data {
            for l in profile.files.iter_mut().flat_map(|f| f.lines.iter_mut()) {
                l.gpu.get_or_insert_with(LineGpu::default);
            }
            let mut grown = std::collections::BTreeSet::new();
            let with_memory = profile.memory.is_some();
            for ((file, line), g) in &result.lines {
                let (l, added) = profile.line_mut(file, *line);
                l.gpu = Some(g.clone());
                if with_memory {
                    l.memory.get_or_insert_with(Default::default);
                }
                grown.extend(added);
            }
            profile.take_sources(grown, source);
            for p in &mut profile.processes {
                let (pct, peak) = result.procs.get(&p.pid).copied().unwrap_or_default();
                p.gpu_pct = Some(pct);
                p.gpu_mem_peak_mb = Some(peak);
            }
        }
        profile.gpu = Some(result.summary);
    }
}

/// A window's CPU use under which its threads are taken to wait (for the GPU, say), as a
/// share of the window. Then CPU time says nothing of who drives the GPU.
const WAITING_CPU_SHARE: f64 = 0.1;

/// Weights of process `pid`'s `positions` in a window of `window_us`:
/// - each by the CPU time its thread used just before it. Threads that drive a GPU launch
///   kernels or spin in a synchronize, so they use a CPU; an idle pool thread that wakes now
///   and then does not;
/// - when the process's threads used under [`WAITING_CPU_SHARE`] of the window (a thread
///   blocked in a synchronize), the main thread's positions equally, or every position
///   equally when the main thread was not seen.
fn weigh(positions: Vec<Position>, pid: i32, window_us: u64) -> Vec<(Position, f64)> {
    if positions.is_empty() {
        return Vec::new();
    }
    let cpu: f64 = positions.iter().map(|p| p.cpu_s).sum();
    if cpu > 0.0 && cpu >= WAITING_CPU_SHARE * window_us as f64 / 1e6 {
        return positions
            .into_iter()
            .map(|p| {
                let w = p.cpu_s / cpu;
                (p, w)
            })
            .filter(|(_, w)| *w > 0.0)
            .collect();
    }
    let main = positions.iter().filter(|p| p.tid == pid).count();
    let n = if main > 0 { main } else { positions.len() };
    positions
        .into_iter()
        .filter(|p| main == 0 || p.tid == pid)
        .map(|p| (p, 1.0 / n as f64))
        .collect()
}

/// A thread's weight (see [`weigh`]) under which a memory reading is not charged to its line.
const MEMORY_MIN_WEIGHT: f64 = 0.1;

/// Each thread's first position after `at`, if no later than [`STALE_US`] after it.
fn first_per_thread(q: &VecDeque<Position>, at: u64) -> Vec<Position> {
    let mut first: HashMap<i32, &Position> = HashMap::new();
    for p in q.iter().rev().filter(|p| p.t_us > at) {
        first.insert(p.tid, p);
    }
    first
        .into_values()
        .filter(|p| p.t_us - at <= STALE_US)
        .cloned()
        .collect()
}

/// Each thread's latest position at or before `end`, if no older than [`STALE_US`].
fn latest_per_thread(q: &VecDeque<Position>, end: u64) -> Vec<Position> {
    let mut latest: HashMap<i32, &Position> = HashMap::new();
    for p in q.iter().filter(|p| p.t_us <= end) {
        latest.insert(p.tid, p);
    }
    latest
        .into_values()
        .filter(|p| end - p.t_us <= STALE_US)
        .cloned()
        .collect()
}

/// Every two neighbouring windows made one (their GPU-seconds added).
fn thin_windows(w: &[(u64, u64, f64)]) -> Vec<(u64, u64, f64)> {
    w.chunks(2)
        .map(|c| {
            let s = c.iter().map(|x| x.0).min().unwrap_or(0);
            let e = c.iter().map(|x| x.1).max().unwrap_or(0);
            (s, e, c.iter().map(|x| x.2).sum())
        })
        .collect()
}

/// Every two neighbouring points made one (the later time, the larger value).
fn thin_points(p: &[(u64, f64)]) -> Vec<(u64, f64)> {
    p.chunks(2)
        .map(|c| {
            let t = c.iter().map(|x| x.0).max().unwrap_or(0);
            (t, c.iter().map(|x| x.1).fold(0.0, f64::max))
        })
        .collect()
}

#[cfg(test)]
mod tests;
