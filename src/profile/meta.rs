//! The facts about a recording that a profile carries beside its figures.
//!
//! Owns: [`ProfileMeta`] (program, rates, sample and read counts), [`NativeMeta`] (how
//! `--native` frames merged) and [`TimeMode`].
//! Must not: hold per-line figures.

use serde::{Deserialize, Serialize};

/// Facts about the recording, filled by the sampler.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ProfileMeta {
    /// The command line that was profiled (or the process's, for attach).
    pub program: String,
    pub pid: i32,
    pub python_version: String,
    pub duration_s: f64,
    /// Sampling ticks taken.
    pub samples: u64,
    /// Ticks that were due but not taken (the profiler fell behind).
    pub missed_samples: u64,
    /// Thread stacks that could not be read consistently, by reason.
    pub errors: u64,
    /// Thread stacks read with the thread paused, after reads without pausing could not be
    /// validated (they changed too fast); 0 in `--blocking` mode, where every read pauses.
    #[serde(default)]
    pub paused_reads: u64,
    /// Sampling ticks left without a sample to keep such pauses at most 200 a second
    /// (stacks that change too fast to read without pausing, at rates above 200 Hz).
    #[serde(default)]
    pub thinned_samples: u64,
    /// The most sampling ticks a second that pause the target (above it, ticks are
    /// thinned, see `thinned_samples`). Absent in profiles recorded before it was kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused_max_hz: Option<f64>,
    pub rate_hz: f64,
    pub requested_rate_hz: f64,
    /// What time counts.
    pub mode: TimeMode,
    /// Whether stdlib and site-packages frames were kept (`--profile-all`).
    pub profile_all: bool,
    /// A free-threaded build (no GIL) ran the program (or one of its processes).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub free_threaded: bool,
    /// Set when time could not be split into Python and native (no table of CALL opcodes
    /// for the interpreter's version), and says why. Lines' time is then all in
    /// `cpu_python_pct`, which means "Python or native" and is shown so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub split_unavailable: Option<String>,
    /// Thread samples of threads that had not run since their last read, and so were not
    /// read again (their stack is that read's).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub unchanged_reads: u64,
    /// Samples whose reading of CPU times read only the threads that ran lately, because the
    /// process's CPU clock showed that no other thread had run (see how-it-works). The
    /// others read every thread's.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub short_cpu_reads: u64,
    /// Thread samples left for a later sample, because more threads ran than a sample walks
    /// (a pool starting or ending at once; see how-it-works).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub deferred_reads: u64,
    /// The sampler gave way to the program (it ran under `SCHED_IDLE` while it read without
    /// stopping it; see how-it-works). This counts how often it took the normal policy back
    /// because it could not run for a while (every CPU busy). Absent when it did not give
    /// way.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gave_way_boosts: Option<u64>,
    /// For a recording with native frames (`--native`), how their merge with the Python
    /// frames went.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub native: Option<NativeMeta>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// How a `--native` recording's thread samples merged their native frames with their
/// Python frames. An unmerged sample keeps its Python frames (and its time); nothing is
/// guessed.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NativeMeta {
    pub merged_samples: u64,
    pub unmerged_samples: u64,
    /// merged / (merged + unmerged), percent (100 when there was no sample).
    pub merge_rate_pct: f64,
    /// Why samples did not merge, with how many each (addresses in the reasons elided).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub unmerged_reasons: std::collections::BTreeMap<String, u64>,
}

/// What time a profile counts (`--wall` or not).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TimeMode {
    /// Time on a CPU only; system is time in the kernel.
    #[default]
    Cpu,
    /// All elapsed time; system also holds time off the CPU.
    Wall,
}

impl std::fmt::Display for TimeMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            TimeMode::Cpu => "cpu",
            TimeMode::Wall => "wall",
        })
    }
}
