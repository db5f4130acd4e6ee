//! The sampler gives way to the program (src/courtesy.rs): while it reads without stopping
//! anything it runs under SCHED_IDLE, and the program is never touched. On every
//! interpreter of the matrix, fixtures/cpu/policy.py (work on the main thread and on a
//! thread started mid-run, then each thread's scheduling policy as the kernel reports it):
//!   - `run --cpu-only`: the profile says the sampler gave way (`gave_way_boosts` present:
//!     this test runs as root, where the sampler can leave SCHED_IDLE again), and every
//!     thread of the program, the one started under the sampler included, has the normal
//!     policy (SCHED_OTHER);
//!   - `run --cpu-only --blocking` (every sample stops the program): the sampler does not
//!     give way (`gave_way_boosts` absent); the program's policy is the normal one.

mod common;

use serde_json::Value;

fn record(py: &common::Interpreter, extra: &[&str]) -> Result<Value, String> {
    let (stdout, profile) = common::record_cpu_profile(py, "cpu/policy.py", &[], extra)?;
    let policies: Vec<&str> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("policy "))
        .collect();
    if policies.len() < 2 || policies.iter().any(|p| !p.ends_with(" 0")) {
        return Err(format!(
            "run {extra:?}: the program's threads (tid policy) should all be 0 (SCHED_OTHER): {policies:?}"
        ));
    }
    Ok(profile)
}

#[test]
fn the_sampler_gives_way_and_leaves_the_program_s_policy_alone() {
    // SAFETY: geteuid has no arguments and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        common::skip_or_fail(
            "the_sampler_gives_way_and_leaves_the_program_s_policy_alone",
            "not root: the sampler gives way only where it can leave SCHED_IDLE again",
        );
        return;
    }
    common::for_each_representative_alone(|py| {
        let p = record(py, &[])?;
        let Some(boosts) = p["gave_way_boosts"].as_u64() else {
            return Err("run --cpu-only: no gave_way_boosts in the profile".into());
        };
        let p = record(py, &["--blocking"])?;
        if !p["gave_way_boosts"].is_null() {
            return Err(format!(
                "run --cpu-only --blocking gave way: {}",
                p["gave_way_boosts"]
            ));
        }
        Ok(format!(
            "gave way ({boosts} boosts), not with --blocking; the program's threads SCHED_OTHER"
        ))
    });
}
