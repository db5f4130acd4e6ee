//! Threads that do not run cost no stack read: fixtures/cpu/parked.py starts 50 threads that
//! wait on an Event beside a busy main thread. On each representative interpreter
//! (common::representatives):
//!   - `run --cpu-only`: the `work` line gets most of the time, and when the parked threads
//!     used (next to) no CPU (the `park` line under 1%), at least 80% of their samples were
//!     not read again (`unchanged_reads`): they had not run since their last read. (On 3.6
//!     and 3.7 they do run: a stack read that fails validation is read again with every
//!     thread paused, as their thread states do not say which kernel thread is whose, and
//!     each pause wakes the parked threads for a moment; their CPU shows on the `park`
//!     line, and they are read.)
//!   - `run --cpu-only --blocking` (every sample paused): the threads that did not run are
//!     not paused at all (a pause would wake them): the `park` line under 1%, at least 80%
//!     of their samples not read again, on each representative interpreter.
//!   - `run --cpu-only --wall`: the parked threads' waiting is still charged to the line
//!     they wait on, from the stacks read when they parked: the `park` line holds at least
//!     80% of the time (50 of 51 threads wait all along).
//!   - 400 parked threads that start together: a sample walks at most 64 stacks, the
//!     rest wait for the next samples (`deferred_reads` > 0), every thread is read in the
//!     end (at least 80% of the parked threads' samples not read again) and the `work`
//!     line still gets most of the time.
//!   - fixtures/cpu/pool_grows.py (a pool that grows by one parked thread every 25 ms
//!     beside a busy main thread): at least 75% of the samples read only the threads that
//!     ran lately (`short_cpu_reads`): a new thread is listed at the first sample after it
//!     starts and read with those, not by a read of every thread (about half of the
//!     samples before it was).

mod common;

use serde_json::Value;

const THREADS: &str = "50";

fn line_total(p: &Value, line: u64) -> f64 {
    common::profile_line(p, "parked.py", line).map_or(0.0, |l| {
        ["cpu_python_pct", "cpu_native_pct", "cpu_system_pct"]
            .iter()
            .map(|k| l[*k].as_f64().unwrap_or(0.0))
            .sum()
    })
}

fn record(py: &common::Interpreter, extra: &[&str]) -> Result<Value, String> {
    record_fixture(py, "cpu/parked.py", &[THREADS, "2"], extra)
}

fn record_fixture(
    py: &common::Interpreter,
    fixture: &str,
    args: &[&str],
    extra: &[&str],
) -> Result<Value, String> {
    common::record_cpu_profile(py, fixture, args, extra).map(|(_, p)| p)
}

#[test]
fn threads_that_did_not_run_are_not_read_again() {
    let fx = common::fixture("cpu/parked.py");
    let (work, park) = (common::mark(&fx, "work"), common::mark(&fx, "park"));
    let threads: u64 = THREADS.parse().unwrap();
    common::for_each_representative_alone(|py| {
        let p = record(py, &[])?;
        let samples = p["samples"].as_u64().unwrap_or(0);
        let unchanged = p["unchanged_reads"].as_u64().unwrap_or(0);
        let parked_samples = threads * samples;
        let share = unchanged as f64 / parked_samples.max(1) as f64;
        let (w, k) = (line_total(&p, work), line_total(&p, park));
        let mut summary = format!(
            "cpu: work line {w:.1}%, park line {k:.1}%, {unchanged} of {parked_samples} parked thread samples not read again"
        );
        if w < 50.0 || (k < 1.0 && share < 0.8) {
            return Err(summary);
        }
        // Paused reads (`--blocking`, and `--native`, which pauses the same way) leave
        // the threads that did not run out of the pause: not woken, not read.
        let p = record(py, &["--blocking"])?;
        let samples = p["samples"].as_u64().unwrap_or(0);
        let unchanged = p["unchanged_reads"].as_u64().unwrap_or(0);
        let share = unchanged as f64 / (threads * samples).max(1) as f64;
        let (w, k) = (line_total(&p, work), line_total(&p, park));
        summary.push_str(&format!(
            "; blocking: work line {w:.1}%, park line {k:.1}%, {:.0}% of parked thread samples not read again",
            100.0 * share
        ));
        if w < 50.0 || k >= 1.0 || share < 0.8 {
            return Err(summary);
        }
        let p = record(py, &["--wall"])?;
        let k = line_total(&p, park);
        summary.push_str(&format!("; wall: park line {k:.1}%"));
        if k < 80.0 {
            return Err(summary);
        }
        Ok(summary)
    });
}

#[test]
fn a_growing_pool_is_read_in_the_threads_that_ran() {
    common::for_each_representative_alone(|py| {
        let p = record_fixture(py, "cpu/pool_grows.py", &[], &[])?;
        let samples = p["samples"].as_u64().unwrap_or(0);
        let short = p["short_cpu_reads"].as_u64().unwrap_or(0);
        let share = short as f64 / samples.max(1) as f64;
        let summary = format!("{short} of {samples} samples read the threads that ran lately only");
        if samples < 50 || share < 0.75 {
            return Err(summary);
        }
        Ok(summary)
    });
}

#[test]
fn a_pool_that_starts_at_once_is_read_over_a_few_samples() {
    let fx = common::fixture("cpu/parked.py");
    let (work, park) = (common::mark(&fx, "work"), common::mark(&fx, "park"));
    let threads = 400u64;
    common::for_each_representative_alone(|py| {
        let p = record_fixture(py, "cpu/parked.py", &["400", "1.5"], &[])?;
        let samples = p["samples"].as_u64().unwrap_or(0);
        let unchanged = p["unchanged_reads"].as_u64().unwrap_or(0);
        let deferred = p["deferred_reads"].as_u64().unwrap_or(0);
        let share = unchanged as f64 / (threads * samples).max(1) as f64;
        let (w, k) = (line_total(&p, work), line_total(&p, park));
        let summary = format!(
            "{deferred} thread samples deferred, {:.1}% of parked thread samples not read again, work line {w:.1}%, park line {k:.2}%",
            100.0 * share
        );
        if deferred == 0 || share < 0.8 || w < 50.0 {
            return Err(summary);
        }
        Ok(summary)
    });
}
