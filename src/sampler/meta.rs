//! The head of a recording's profile: what was sampled, how, and how well.
//!
//! Owns: [`profile_meta`], from the sampler's configuration and totals.
//! Must not: fold samples.

use super::{SamplerConfig, Stats, PAUSED_MAX_HZ};
use crate::profile::{ProfileMeta, TimeMode};
use crate::python::PythonProcess;

/// The facts about a recording that head its profile; `procs`: the Python processes it
/// sampled (their versions, joined, and their kinds of build).
pub(super) fn profile_meta(
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
