//! The sampling profiler's numbers on fixtures whose truth is known by construction
//! (fixtures/cpu/*.py), on each representative interpreter (common::representatives).
//!
//! Tolerances are the issue's: a line's share within ±5 points, a split ≥90% one way, a
//! syscall line ≥50% system, four equal threads within ±5 points of 25%.

mod common;

use serde_json::Value;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{bin, tempdir};

use common::mark;

/// The `truth name=value ...` line a fixture prints last, as (name, value) pairs.
fn truth(stdout: &str) -> Vec<(String, f64)> {
    let line = stdout
        .lines()
        .find(|l| l.starts_with("truth "))
        .unwrap_or_else(|| panic!("the fixture printed no truth line: {stdout}"));
    line["truth ".len()..]
        .split_whitespace()
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap();
            (k.to_string(), v.parse().unwrap())
        })
        .collect()
}

/// Runs `scalene-rs run [extra] -o out.json -- python fixture args` and returns the profile.
fn profile(py: &common::Interpreter, fixture: &Path, args: &[&str], extra: &[&str]) -> Value {
    profile_and_output(py, fixture, args, extra).0
}

/// Like [`profile`], also returning the program's stdout.
fn profile_and_output(
    py: &common::Interpreter,
    fixture: &Path,
    args: &[&str],
    extra: &[&str],
) -> (Value, String) {
    let dir = tempdir("scalene-rs-test");
    let out = dir.join("p.json");
    let result = Command::new(bin())
        .arg("run")
        .args(extra)
        .arg("-o")
        .arg(&out)
        .arg("--")
        .arg(&py.path)
        .arg(fixture)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&result.stdout);
    assert!(
        result.status.success() && stdout.contains("done"),
        "{}: run failed ({:?}): stdout {stdout} stderr {}",
        py.label,
        result.status,
        String::from_utf8_lossy(&result.stderr)
    );
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    (v, stdout.into_owned())
}

/// (python, native, system) percentages of one line of one file, zeros when absent.
fn line(p: &Value, fixture: &Path, line: u64) -> (f64, f64, f64) {
    let name = fixture.file_name().unwrap().to_string_lossy().to_string();
    for f in p["files"].as_array().unwrap() {
        if !f["filename"].as_str().unwrap().ends_with(&name) {
            continue;
        }
        for l in f["lines"].as_array().unwrap() {
            if l["line"].as_u64() == Some(line) {
                return (
                    l["cpu_python_pct"].as_f64().unwrap(),
                    l["cpu_native_pct"].as_f64().unwrap(),
                    l["cpu_system_pct"].as_f64().unwrap(),
                );
            }
        }
    }
    (0.0, 0.0, 0.0)
}

fn function_total(p: &Value, name: &str) -> f64 {
    p["files"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|f| f["functions"].as_array().unwrap())
        .filter(|f| f["function"].as_str() == Some(name))
        .map(|f| {
            f["cpu_python_pct"].as_f64().unwrap()
                + f["cpu_native_pct"].as_f64().unwrap()
                + f["cpu_system_pct"].as_f64().unwrap()
        })
        .sum()
}

/// Runs `check` for each representative interpreter and fails at the end with every failure.

#[test]
fn python_and_native_lines_get_their_share_and_their_split() {
    let fx = common::fixture("cpu/split.py");
    let (lp, ln) = (mark(&fx, "python"), mark(&fx, "native"));
    // Both ways of reading stacks: the default (without pausing, validated) and --blocking,
    // with CPU accounting only; then `run`'s default, memory on. With memory on, threads
    // wait in the allocation handshake while we read their stacks; the sampler leaves the
    // CPU of a thread caught waiting for its next sample (src/sampler), else a handshake at
    // the native line's first allocation takes the Python line's CPU along (the shares here
    // drifted by 3 points on 2.7, 6 with answers 2 ms slow). The Python line allocates a
    // window every millisecond (ints under PYTHONMALLOC=malloc): the library's handshake
    // budget keeps the waits to a few percent of its time (they took 14% in the debug
    // build before it, and the shares drifted by 2 points, 5.7 once in CI). Same tolerance for all three:
    // the sampling noise of the run is what it must allow. At 3 s (300 samples) the errors
    // of the 30 runs (10 interpreters × 3 modes) spread 1.3-2.3 points, and two CI runs in
    // a row failed one run each by a hair (5.1 and 5.6 points, --blocking on 3.8 and memory
    // on under 3.6), while five runs alone of the second build (memory on, 3.6) read 52-54%
    // against a truth of 53%: 5 s (500 samples) cuts that noise by a fifth.
    common::for_each_representative(|py| {
        let mut summaries = Vec::new();
        for mode in [
            &["--cpu-only"][..],
            &["--cpu-only", "--blocking"][..],
            &[][..],
        ] {
            let label = match mode {
                [] => "memory on",
                [_] => "default",
                [_, m, ..] => m,
            };
            let (p, out) = profile_and_output(py, &fx, &["5"], mode);
            let t = truth(&out);
            let truth_py = 100.0 * t[0].1 / (t[0].1 + t[1].1);
            let a = line(&p, &fx, lp);
            let b = line(&p, &fx, ln);
            let (ta, tb) = (a.0 + a.1 + a.2, b.0 + b.1 + b.2);
            let ours_py = 100.0 * ta / (ta + tb).max(1e-9);
            let summary = format!(
                "{label}: python line {ta:.1}% ({:.0}% Python), native line {tb:.1}% ({:.0}% native); \
                 python line's share of the two: ours {ours_py:.1}%, truth {truth_py:.1}%",
                100.0 * a.0 / ta.max(1e-9),
                100.0 * b.1 / tb.max(1e-9)
            );
            // Each line gets its share within ±5 points of what the fixture measured it took.
            if (ours_py - truth_py).abs() > 5.0 {
                return Err(format!(
                    "shares off the truth by more than 5 points: {summary}"
                ));
            }
            // Together the two lines are the program (start-up and calibration are small).
            if ta + tb < 80.0 {
                return Err(format!(
                    "the two lines hold too little of the time: {summary}"
                ));
            }
            if a.0 < 0.9 * ta || b.1 < 0.9 * tb {
                return Err(format!("split below 90%: {summary}"));
            }
            // Memory on means allocations were sampled (each window waited for us).
            if mode.is_empty() && p["memory"]["alloc_mb"].as_f64().unwrap_or(0.0) <= 0.0 {
                return Err(format!("memory on but nothing recorded: {summary}"));
            }
            summaries.push(summary);
        }
        Ok(summaries.join("; "))
    });
}

/// At 10 kHz with every sample paused (`--blocking`), the two lines of fixtures/cpu/split.py
/// are charged the CPU time the fixture measured they took, within ±20%. A pause wakes a
/// waiting thread, and the CPU that costs it is not counted as running; a thread stopped
/// while it ran is not waiting: before that was told apart, at 10 kHz (where a running
/// thread uses less between two paused samples than a wake-up is allowed) 0.04% of the
/// program's CPU time was charged to it.
#[test]
fn paused_samples_at_10_khz_charge_the_time_the_lines_took() {
    let fx = common::fixture("cpu/split.py");
    let (lp, ln) = (mark(&fx, "python"), mark(&fx, "native"));
    common::for_each_representative(|py| {
        let (p, out) = profile_and_output(
            py,
            &fx,
            &["0.5"],
            &["--cpu-only", "--blocking", "--rate", "10000"],
        );
        let t = truth(&out);
        let took = t[0].1 + t[1].1;
        let (a, b) = (line(&p, &fx, lp), line(&p, &fx, ln));
        let share = (a.0 + a.1 + a.2 + b.0 + b.1 + b.2) / 100.0;
        let charged = share * p["total_s"].as_f64().unwrap_or(0.0);
        let summary = format!(
            "the two lines charged {charged:.3} s, took {took:.3} s ({} samples)",
            p["samples"]
        );
        if (charged - took).abs() > 0.2 * took {
            return Err(summary);
        }
        Ok(summary)
    });
}

/// CPU hogs on every CPU but the program's: no CPU is free, and the default read
/// (`--cpu-only`, which runs the sampler under `SCHED_IDLE`: src/courtesy.rs) must still
/// sample on the clock, the two lines keeping their shares. When the sampler waited for a
/// free CPU up to 50 ms before taking its share, 10-13% of ticks were missed beside two
/// hogs on 2 CPUs, and the ticks taken came when a CPU freed: the Python line's share was 3
/// points off on 2.7 here, 8 in a CI run. (A hog on every CPU, beside other work, missed
/// ticks under the normal policy too: one CPU is left to the program alone.)
#[test]
fn a_busy_neighbour_neither_starves_nor_biases_the_default_read() {
    let _turn = common::turn("alone");
    let fx = common::fixture("cpu/split.py");
    let (lp, ln) = (mark(&fx, "python"), mark(&fx, "native"));
    let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
    let hogs: Vec<std::process::Child> = (0..cpus.saturating_sub(1).max(1))
        .map(|_| {
            Command::new("sh")
                .args(["-c", "while :; do :; done"])
                .spawn()
                .unwrap()
        })
        .collect();
    struct Reap(Vec<std::process::Child>);
    impl Drop for Reap {
        fn drop(&mut self) {
            for h in &mut self.0 {
                let _ = h.kill();
                let _ = h.wait();
            }
        }
    }
    let _hogs = Reap(hogs);
    // Over all the runs: ticks taken and missed, and the Python line's error (ours - truth).
    // - Missed, measured on 9 representatives: the old courtesy missed 13.0-15.6% on
    //   every one; this one 1.2-4.6% over the nine (2026-12-03, 3 runs), one run now and
    //   then 10-19% (the free-threaded 3.13t, the chrooted 3.15).
    // - Error: a 3 s run has ~300 ticks, so a line of share p has a sampling error of
    //   sqrt(p(1-p)/300), 2.9 points at 55%. The errors measured: -3.5 to +6.0 per run.
    //   Their mean over the nine (1 point of noise) tells a bias: the old courtesy's ticks,
    //   taken when a CPU freed, put the line 3-8 points off.
    let totals = std::sync::Mutex::new((0.0f64, 0.0f64, Vec::new()));
    common::for_each_representative(|py| {
        let (p, out) = profile_and_output(py, &fx, &["3"], &["--cpu-only"]);
        let t = truth(&out);
        let truth_py = 100.0 * t[0].1 / (t[0].1 + t[1].1);
        let (a, b) = (line(&p, &fx, lp), line(&p, &fx, ln));
        let (ta, tb) = (a.0 + a.1 + a.2, b.0 + b.1 + b.2);
        let ours_py = 100.0 * ta / (ta + tb).max(1e-9);
        let samples = p["samples"].as_f64().unwrap_or(0.0);
        let missed = p["missed_samples"].as_f64().unwrap_or(0.0);
        let missed_pct = 100.0 * missed / (samples + missed).max(1.0);
        // Four standard errors of the line's share, from the ticks taken.
        let q = truth_py / 100.0;
        let bound = 400.0 * (q * (1.0 - q) / samples.max(1.0)).sqrt();
        let summary = format!(
            "python line's share of the two {ours_py:.1}% (truth {truth_py:.1}%, \
             bound {bound:.1}), {missed_pct:.1}% of {} ticks missed",
            samples + missed
        );
        {
            let mut t = totals.lock().unwrap();
            t.0 += samples;
            t.1 += missed;
            t.2.push(ours_py - truth_py);
        }
        if missed_pct > 30.0 || (ours_py - truth_py).abs() > bound {
            return Err(summary);
        }
        Ok(summary)
    });
    let (taken, missed, errors) = totals.into_inner().unwrap();
    let pct = 100.0 * missed / (taken + missed).max(1.0);
    let bias = errors.iter().sum::<f64>() / errors.len().max(1) as f64;
    let said = format!(
        "busy neighbour: {pct:.1}% of {} ticks missed over the representatives; \
         the Python line {bias:+.1} points off its truth on average (per run: {errors:.1?})",
        taken + missed
    );
    assert!(pct <= 8.0 && bias.abs() <= 3.0, "{said}");
    common::say(&said);
}

#[test]
fn a_syscall_heavy_line_is_mostly_system_time() {
    let fx = common::fixture("cpu/system.py");
    let l = mark(&fx, "system");
    common::for_each_representative(|py| {
        let p = profile(py, &fx, &["1.5"], &[]);
        let (pyt, nat, sys) = line(&p, &fx, l);
        let total = pyt + nat + sys;
        let summary = format!(
            "line {total:.1}% of the time, {:.0}% system",
            100.0 * sys / total.max(1e-9)
        );
        if total < 50.0 || sys < 0.5 * total {
            return Err(summary);
        }
        Ok(summary)
    });
}

#[test]
fn four_equal_threads_get_a_quarter_each() {
    let fx = common::fixture("cpu/threads.py");
    common::for_each_representative(|py| {
        let (p, out) = profile_and_output(py, &fx, &["4000000"], &[]);
        let t = truth(&out);
        let truth_sum: f64 = t.iter().map(|x| x.1).sum();
        let ours: Vec<f64> = t.iter().map(|(f, _)| function_total(&p, f)).collect();
        let ours_sum: f64 = ours.iter().sum();
        let mut summary = String::new();
        let mut bad = false;
        for ((name, secs), share) in t.iter().zip(&ours) {
            let truth_pct = 100.0 * secs / truth_sum;
            let ours_pct = 100.0 * share / ours_sum.max(1e-9);
            summary += &format!("{name} ours {ours_pct:.1}% truth {truth_pct:.1}%; ");
            // Within ±5 points of the thread's real share (its CPU time, measured by the
            // thread itself), which is about 25% by construction on Python 3. On 2.7 it need
            // not be: on 2 cores the old GIL's hand-offs burn CPU unevenly in the threads
            // waiting for it (runs of the fixture alone, under this and the previous build,
            // gave one thread 36-40% of the CPU now and then; the profile matched it, 35.9%
            // against 35.6%), so there the thread's own time is the only truth.
            bad |= (ours_pct - truth_pct).abs() > 5.0
                || (!py.is_py2() && (ours_pct - 25.0).abs() > 10.0);
        }
        if bad || ours_sum < 85.0 {
            return Err(format!("{summary}(the four functions hold {ours_sum:.1}%)"));
        }
        Ok(summary)
    });
}

#[test]
fn a_sleeping_line_counts_only_in_wall_mode() {
    let fx = common::fixture("cpu/sleepy.py");
    let (busy, sleep) = (mark(&fx, "busy"), mark(&fx, "sleep"));
    common::for_each_representative(|py| {
        let cpu = profile(py, &fx, &["2"], &[]);
        let wall = profile(py, &fx, &["2"], &["--wall"]);
        let s_cpu = {
            let (a, b, c) = line(&cpu, &fx, sleep);
            a + b + c
        };
        let s_wall = {
            let (a, b, c) = line(&wall, &fx, sleep);
            a + b + c
        };
        let b_cpu = {
            let (a, b, c) = line(&cpu, &fx, busy);
            a + b + c
        };
        let summary =
            format!("sleep line: cpu {s_cpu:.1}%, wall {s_wall:.1}%; busy line cpu {b_cpu:.1}%");
        // The truth: the sleep is half the wall time and no CPU time. A sample that catches
        // the thread at the instant it enters sleep() may charge it one interval (10 ms of
        // 2 s = 0.5%): allow 2%.
        if s_cpu > 2.0 || !(35.0..=65.0).contains(&s_wall) || b_cpu < 90.0 {
            return Err(summary);
        }
        Ok(summary)
    });
}

/// `--wall` at 1 kHz on fixtures/cpu/split.py (one thread, always on the CPU): the time
/// charged adds up to the time recorded (±10%). A busy thread's CPU time shows a scheduler
/// tick late (4 ms steps, unless the thread itself asks a CPU clock, which brings its own
/// up to date: fixtures/cpu/sleepy.py's busy line does, and hid this): taken interval by
/// interval, the intervals that saw none of it were charged as time off the CPU, and the
/// profile's total came to 128% of the time elapsed in a run (under load the thread is
/// switched out more often, its time shows sooner, and the excess was 3-8%).
#[test]
fn wall_time_adds_up_to_the_time_elapsed_at_1_khz() {
    let fx = common::fixture("cpu/split.py");
    common::for_each_representative(|py| {
        let p = profile(py, &fx, &["0.5"], &["--wall", "--rate", "1000"]);
        let total = p["total_s"].as_f64().unwrap_or(0.0);
        let elapsed = p["duration_s"].as_f64().unwrap_or(0.0);
        let summary = format!("{total:.3} s charged of {elapsed:.3} s recorded");
        if (total - elapsed).abs() > 0.1 * elapsed {
            return Err(summary);
        }
        Ok(summary)
    });
}

/// Under `--wall` each tick observes each thread once, whatever it did since the last:
/// a thread that both computed and slept in an interval gives two charges (its CPU time,
/// its wait) but one sample. Before, 3.13 showed 639 and 647 samples for two threads in
/// 336 ticks. Each thread: at most the ticks, and (both live all along) at least 80%.
#[test]
fn each_thread_is_counted_once_per_tick_under_wall() {
    let fx = common::fixture("cpu/mixed_threads.py");
    common::for_each_representative(|py| {
        let p = profile(py, &fx, &["1.5"], &["--wall", "--rate", "200"]);
        let ticks = p["samples"].as_u64().unwrap_or(0);
        let threads: Vec<u64> = p["threads"]
            .as_array()
            .map(|t| t.iter().filter_map(|t| t["samples"].as_u64()).collect())
            .unwrap_or_default();
        // One process: no `processes` table, its ticks are the profile's.
        let process = p["processes"][0]["samples"].as_u64().unwrap_or(ticks);
        let summary = format!("{ticks} ticks ({process} of the process); threads {threads:?}");
        if threads.len() != 2 || ticks < 100 {
            return Err(format!("expected 2 threads and 100+ ticks: {summary}"));
        }
        if threads
            .iter()
            .any(|&n| n > ticks || n > process || n * 5 < ticks * 4)
        {
            return Err(summary);
        }
        Ok(summary)
    });
}

#[test]
fn attach_finds_the_same_hot_lines_as_run() {
    // The two hot lines, and the python line's share of the two against the fixture's own
    // CPU clock over the stretch `attach` ran (SPLIT_ROUNDS=1 prints it every round).
    // At 1 kHz for 2 s: ~2,000 samples, so a share's sampling error is ~1 point; the
    // fixed "each above 35%" this replaces failed on 3.10 at 34.2% native when the
    // stretch's truth was itself ~60/40.
    let fx = common::fixture("cpu/split.py");
    let (lp, ln) = (mark(&fx, "python"), mark(&fx, "native"));
    common::for_each_representative(|py| {
        let mut child = Command::new(&py.path)
            .arg(&fx)
            .arg("30")
            .env("SPLIT_ROUNDS", "1")
            .env("PYTHONUNBUFFERED", "1")
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        // Let it get past start-up and calibration.
        std::thread::sleep(Duration::from_millis(1500));
        let dir = tempdir("scalene-rs-test");
        let out = dir.join("a.json");
        let from = common::unix_now();
        let r = Command::new(bin())
            .args(["attach", &child.id().to_string(), "--duration", "2"])
            .args(["--rate", "1000", "-o"])
            .arg(&out)
            .output()
            .unwrap();
        let to = common::unix_now();
        let alive = child.try_wait().unwrap().is_none();
        let _ = child.kill();
        let stdout = child
            .wait_with_output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        if !r.status.success() {
            return Err(format!(
                "attach failed: {}",
                String::from_utf8_lossy(&r.stderr)
            ));
        }
        if !alive {
            return Err("the target died while attached".into());
        }
        let p: Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        let a = line(&p, &fx, lp);
        let b = line(&p, &fx, ln);
        let (a, b) = (a.0 + a.1 + a.2, b.0 + b.1 + b.2);
        let want = common::split_truth_between(&stdout, from, to)
            .ok_or_else(|| format!("no rounds between {from} and {to} in {stdout:?}"))?;
        let got = 100.0 * a / (a + b).max(1e-9);
        let summary = format!(
            "python line {a:.1}%, native line {b:.1}%; python's share of the two {got:.1}%, \
             the fixture's clock says {want:.1}%"
        );
        // The same two hot lines as `run`, and the split between them within ±5 points.
        if a + b < 90.0 || (got - want).abs() > 5.0 {
            return Err(summary);
        }
        Ok(summary)
    });
}

#[test]
fn a_stack_that_flips_faster_than_a_read_gets_the_same_split_as_paused_reads() {
    // The flip line's time goes to generator expressions that sum() resumes a few times
    // each: the stack changes every few hundred nanoseconds. Reads without pausing that
    // were retried until one validated favoured the states easiest to read (sum's own
    // frame, at its CALL: native): before the fix the default mode gave the line 28-34%
    // Python where --blocking (every thread paused, no state favoured) gave 55-65%.
    // The default mode must now agree with --blocking. Both at 1 kHz (the default mode
    // pauses at most 200 times a second): ~600 and ~3000 samples of the line, a binomial
    // standard error of about 2.2 points on the difference of the two shares, and the
    // share itself moves a little from one process to the next. Measured (CI, 2026-11-26,
    // 16 interpreters, the suite's other tests running beside): differences of mean +1.9,
    // standard deviation 2.7 points, the largest 10.2 (3.9: 64.9% vs 54.7%), which failed
    // the 10 points first allowed here. Allowed: 13 points, 4 standard deviations above
    // the mean (a false failure about once in 3000 CI runs of 16 interpreters), still well
    // below the gap the bug made (27-44% against 52-67% across interpreters).
    let fx = common::fixture("cpu/flip.py");
    let flip = mark(&fx, "flip");
    common::for_each_representative(|py| {
        let mut shares = Vec::new();
        for mode in [&["--cpu-only"][..], &["--cpu-only", "--blocking"][..]] {
            let mut args = vec!["--rate", "1000"];
            args.extend_from_slice(mode);
            let p = profile(py, &fx, &["3"], &args);
            let (python, native, system) = line(&p, &fx, flip);
            let total = python + native + system;
            if total < 80.0 {
                return Err(format!(
                    "{mode:?}: the flip line holds {total:.1}% of the time, expected most"
                ));
            }
            // Of the line's user time: system time is not what is compared (one
            // --blocking run at 1 kHz in nine, on system-3.11, put 55% of this
            // CPU-bound line in the kernel: the split of /proc's tick-based user and
            // system times, not the stacks).
            shares.push(100.0 * python / (python + native).max(1e-9));
        }
        let summary = format!(
            "flip line Python share of its user time: default {:.1}%, --blocking {:.1}%",
            shares[0], shares[1]
        );
        if (shares[0] - shares[1]).abs() > 13.0 {
            return Err(summary);
        }
        Ok(summary)
    });
}

/// A saved profile is read on its own: `view` shows the source text the profile carries
/// (its lines and the context around them), not whatever the file holds now, and not a
/// file seen through /proc of whatever process has the recorded pid by then. The script
/// is rewritten after the recording; the report must still quote the original lines.
#[test]
fn a_saved_profile_shows_the_source_it_was_recorded_with() {
    let py = common::interpreters()
        .into_iter()
        .filter(|i| !i.is_py2() && i.root.is_none())
        .max_by_key(|i| i.version())
        .expect("a Python 3 interpreter");
    let dir = tempdir("scalene-rs-test");
    let script = dir.join("spin.py");
    let original = "import time\n\
                    # context above: kept by the profile\n\
                    def spin(seconds):\n\
                    \x20   total = 0\n\
                    \x20   end = time.time() + seconds\n\
                    \x20   while time.time() < end:\n\
                    \x20       total += 1  # the hot line\n\
                    \x20   return total\n\
                    # context below: kept by the profile\n\
                    spin(1.0)\n";
    std::fs::write(&script, original).unwrap();
    let out = dir.join("p.json");
    let rec = Command::new(bin())
        .args(["run", "--cpu-only", "-o"])
        .arg(&out)
        .arg("--")
        .arg(&py.path)
        .arg(&script)
        .output()
        .unwrap();
    assert!(
        rec.status.success(),
        "{}: {}",
        py.label,
        String::from_utf8_lossy(&rec.stderr)
    );
    let replaced: String = original
        .lines()
        .map(|_| "# rewritten after the recording\n")
        .collect();
    std::fs::write(&script, replaced).unwrap();
    let view = Command::new(bin())
        .arg("view")
        .arg(&out)
        .env("COLUMNS", "160")
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&view.stdout).into_owned() + &String::from_utf8_lossy(&view.stderr);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(view.status.success(), "{}: view failed: {text}", py.label);
    for quoted in [
        "total += 1  # the hot line",
        "while time.time() < end:",
        "# context below: kept by the profile",
    ] {
        assert!(
            text.contains(quoted),
            "{}: `view` should quote {quoted:?} from the profile:\n{text}",
            py.label
        );
    }
    assert!(
        !text.contains("rewritten after the recording"),
        "{}: `view` read the file as it is now:\n{text}",
        py.label
    );
}
