//! GPU figures of a recording: the NVML poller, the ledger, what a live view shows.
//!
//! Owns: [`GpuRecording`] (poller and ledger, ticked with the process tree), the live
//! figures of the last poll, and [`merge_gpu`] into the finished profile.
//! Must not: talk to NVML itself (`gpu::monitor` does).

use crate::gpu::ledger::{GpuResult, Ledger};
use crate::gpu::monitor::{Monitor, Report};
use crate::gpu::GpuConfig;
use crate::profile::Profile;
use crate::sampler::tree::ProcessTree;
use std::collections::HashMap;
use std::time::Duration;

/// How long the end of a recording waits for the NVML poller's last poll. A call into the
/// driver that never returns must not hang us.
const GPU_STOP_WAIT: Duration = Duration::from_secs(1);

/// The NVML poller and the ledger that charges what it reads to lines.
pub(super) struct GpuRecording {
    monitor: Monitor,
    ledger: Ledger,
    /// GPU figures were asked for, so no driver is then said ([`GpuConfig::asked`]).
    asked: bool,
    /// The program's GPU use at the last poll (a live view's header).
    pub(super) now: Option<crate::report::live::LiveGpu>,
}

impl GpuRecording {
    pub(super) fn start(cfg: &GpuConfig) -> GpuRecording {
        GpuRecording {
            monitor: Monitor::start(cfg),
            ledger: Ledger::new(crate::timeline::now_us()),
            asked: cfg.asked,
            now: None,
        }
    }

    /// After each tick: the processes sampled, where their threads were, what NVML said.
    /// Positions are kept once NVML watches a GPU.
    pub(super) fn tick(&mut self, tree: &mut ProcessTree) {
        let reports = self.monitor.take();
        let new: Vec<i32> = tree
            .sampling()
            .map(|(pid, _, _)| pid)
            .filter(|&pid| !self.ledger.knows(pid))
            .collect();
        self.ledger.add_ours(
            new.into_iter()
                .map(|pid| (pid, crate::proc::start_time_us(pid))),
        );
        self.ledger.add_positions(tree.take_positions());
        let ours: Vec<u32> = tree.sampling().map(|(pid, _, _)| pid as u32).collect();
        if let Some(now) = live_gpu(&reports, &ours) {
            self.now = Some(now);
        }
        self.ledger.take(reports);
        if self.ledger.wants_positions() {
            tree.keep_positions();
        }
    }

    /// Stops the poller (bounded wait) and settles the figures.
    pub(super) fn finish(mut self, tree: &mut ProcessTree) -> GpuResult {
        let (reports, answered) = self.monitor.stop(GPU_STOP_WAIT);
        self.ledger.add_positions(tree.take_positions());
        self.ledger.take(reports);
        let quiet = !self.asked && self.ledger.no_library();
        let mut result = self.ledger.finish(crate::timeline::now_us(), answered);
        result.summary.quiet = quiet;
        result
    }
}

/// The program's GPU use at the last poll among `reports`: the SM share its processes
/// (`ours`) kept busy, each by its latest sample, summed over devices and processes, and
/// the memory they held (MiB, which the profile calls MB too). None without a poll.
fn live_gpu(reports: &[Report], ours: &[u32]) -> Option<crate::report::live::LiveGpu> {
    let (util, mem) = reports.iter().rev().find_map(|r| match r {
        Report::Poll { util, mem, .. } => Some((util, mem)),
        _ => None,
    })?;
    let mut latest: HashMap<(u32, u32), (u64, u32)> = HashMap::new();
    for u in util.iter().filter(|u| ours.contains(&u.pid)) {
        let e = latest
            .entry((u.device, u.pid))
            .or_insert((u.t_us, u.sm_pct));
        if u.t_us >= e.0 {
            *e = (u.t_us, u.sm_pct);
        }
    }
    Some(crate::report::live::LiveGpu {
        util_pct: latest.values().map(|&(_, pct)| pct as f64).sum(),
        mem_mb: mem
            .iter()
            .filter(|m| ours.contains(&m.pid))
            .map(|m| m.mib)
            .sum(),
    })
}

/// Puts the program's GPU figures into `profile` (sources of lines that only the GPU
/// figures have read as the root process `pid` sees them).
pub(super) fn merge_gpu(profile: &mut Profile, g: GpuResult, pid: i32, cwd: Option<&str>) {
    Ledger::merge(g, profile, &mut |file| {
        crate::sampler::read_source(pid, &crate::sampler::absolute(file, cwd))
    });
}
