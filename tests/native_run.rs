//! `run --native` and `attach --native` on each representative interpreter
//! (common::representatives), on a line whose C time is split between two functions in a ratio
//! known by construction.
//!
//! fixtures/native/burnext.c (built by the test with each interpreter's headers) runs 3n
//! turns of a loop in `burn_alpha`, then n turns of the same loop in `burn_beta`; the
//! fixture fixtures/native/burn.py times the two once with the thread's CPU clock and prints
//! the first one's share (`truth`, about 0.75), then alternates the `native` line (that C
//! call, turn counts drawn at random so that no sampling rate falls in step) with the
//! `python` line (bytecode only). The recording must:
//!   - merge native and Python frames in at least 99.5% of its thread samples (a sample
//!     caught as a thread starts or ends a call, or whose kernel id was not matched yet,
//!     cannot be merged: it is counted, not guessed; 100% in most runs);
//!   - list `burn_alpha` and `burn_beta` among the `native` line's native functions; of the
//!     line's native samples, at least 90% in those two, `burn_alpha`'s share of them
//!     within 10 points of the truth (about 300 samples of the two: a binomial standard
//!     error of 2.5 points; measured 73.6–79.3% against 74.1–75.8%, 86.5% against 86.4%
//!     on the free-threaded build);
//!   - list next to nothing under the `python` line (its time is Python's);
//!   - keep stacks that read, innermost first, `burn_alpha`, `burn` (both in the
//!     extension's module), only native frames, then `native_part` at the `native` line;
//!     and the same in collapsed stacks (`view -o x.collapsed`).
//!
//! `attach --native` to the running fixture (two interpreters: the newest plain 3.x and
//! 2.7) gives the same line split; `--native --nonblocking` fails on one line (exit 2).
//! (`attach --native` where threads cannot be stopped: tests/dump_errors.rs, under a seccomp
//! filter.)

mod common;

use common::Interpreter;
use serde_json::Value;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_scalene-rs");
const RUN_TIMEOUT: Duration = Duration::from_secs(90);
/// Seconds the fixture loops for.
const SECONDS: &str = "3";
/// The least share of thread samples merged.
const MIN_MERGE_PCT: f64 = 99.5;
/// Allowed distance, in points, between burn_alpha's measured and true share.
const SHARE_TOLERANCE: f64 = 10.0;

/// burn_alpha's share of the two functions' time, percent: the fixture's last `truth` line.
/// Under `run` that is the loop's own (printed at its end); for an attach, the one before
/// "ready".
fn truth(stdout: &str) -> Result<f64, String> {
    stdout
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("truth "))
        .and_then(|t| t.trim().parse::<f64>().ok())
        .map(|t| 100.0 * t)
        .ok_or_else(|| format!("no `truth` line in the fixture's output: {stdout:?}"))
}

/// The line `n` of burn.py in a profile.
fn line(p: &Value, n: u64) -> Result<&Value, String> {
    common::profile_line(p, "burn.py", n)
        .ok_or_else(|| format!("line {n} of burn.py is not in the profile"))
}

fn pct(v: &Value, key: &str) -> f64 {
    v[key].as_f64().unwrap_or(0.0)
}

/// Checks a `--native` profile of burn.py against `truth` (burn_alpha's true share, %).
fn check_profile(p: &Value, truth: f64) -> Result<String, String> {
    let fixture = common::fixture("native/burn.py");
    let (native_line, python_line) = (
        common::mark(&fixture, "native"),
        common::mark(&fixture, "python"),
    );
    let rate = p["native"]["merge_rate_pct"]
        .as_f64()
        .ok_or("no `native` block in the profile's meta")?;
    if rate < MIN_MERGE_PCT {
        return Err(format!("merge rate {rate:.2}%: {}", p["native"]));
    }
    let l = line(p, native_line)?;
    let native = pct(l, "cpu_native_pct");
    let fns = common::native_function_list(l, "native_functions", "pct");
    let listed = format!("native {native:.1}%: {fns:?}");
    // Both listed, from the extension (their order by seconds is left to the split by
    // samples below: on a loaded machine one late sample can carry tens of milliseconds).
    let listed_from_ext = |name: &str| {
        fns.iter()
            .any(|(f, m, _)| *f == name && m.starts_with("burnext"))
    };
    if !listed_from_ext("burn_alpha") || !listed_from_ext("burn_beta") {
        return Err(format!("the native line's functions: {listed}"));
    }
    // The split by function, in samples: each sample's weight is the CPU time its thread
    // used since the one before, which a busy machine makes lumpy (one late sample carries
    // tens of milliseconds), while where samples land is what is tested here.
    let (alpha, beta, other) = leaf_samples(p, native_line);
    if alpha + beta < 9 * other {
        return Err(format!(
            "of the native line's native samples, {alpha} in burn_alpha, {beta} in burn_beta, \
             {other} elsewhere: {listed}"
        ));
    }
    let share = 100.0 * alpha as f64 / (alpha + beta).max(1) as f64;
    if (share - truth).abs() > SHARE_TOLERANCE {
        return Err(format!(
            "burn_alpha's share {share:.1}% of {} samples, truth {truth:.1}%: {listed}",
            alpha + beta
        ));
    }
    let py = line(p, python_line)?;
    let py_native: f64 = py["native_functions"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|f| pct(f, "pct"))
        .sum();
    if py_native > 0.1 * pct(py, "cpu_python_pct").max(1.0) {
        return Err(format!(
            "the python line lists native time: {}",
            py["native_functions"]
        ));
    }
    check_stacks(p, native_line)?;
    Ok(format!(
        "merge {rate:.2}%, native line {native:.1}% (burn_alpha {share:.1}% of the two, truth {truth:.1}%)"
    ))
}

/// Samples of the native line's native time whose innermost frame is burn_alpha, burn_beta,
/// or something else.
fn leaf_samples(p: &Value, native_line: u64) -> (u64, u64, u64) {
    let (mut alpha, mut beta, mut other) = (0, 0, 0);
    for s in p["stacks"].as_array().into_iter().flatten() {
        let frames = s["frames"].as_array().map(Vec::as_slice).unwrap_or(&[]);
        let charged = frames.iter().find(|f| f["native"].as_bool() != Some(true));
        let on_line = charged.is_some_and(|f| {
            f["function"] == "native_part" && f["line"].as_u64() == Some(native_line)
        });
        if !on_line || s["split"]["native_s"].as_f64().unwrap_or(0.0) <= 0.0 {
            continue;
        }
        let n = s["samples"].as_u64().unwrap_or(0);
        match frames
            .first()
            .map(|f| (f["function"].as_str(), f["native"].as_bool()))
        {
            Some((Some("burn_alpha"), Some(true))) => alpha += n,
            Some((Some("burn_beta"), Some(true))) => beta += n,
            // burn's own timing of its two parts (the thread's CPU clock): about 6% of the
            // line's samples at 200 Hz, the stops meeting it in its system call.
            Some((Some("clock_gettime" | "__vdso_clock_gettime"), Some(true))) => {}
            _ => other += n,
        }
    }
    (alpha, beta, other)
}

/// Some stack reads, innermost first, burn_alpha, burn, native frames only, then
/// native_part at the native line; no stack has a native frame under a Python frame of
/// burn.py's own that is not the innermost Python frame's callee chain's.
fn check_stacks(p: &Value, native_line: u64) -> Result<(), String> {
    let stacks = p["stacks"].as_array().ok_or("no stacks")?;
    let reads_right = |frames: &[Value]| -> bool {
        let is_native = |f: &Value| f["native"].as_bool() == Some(true);
        let name = |f: &Value| f["function"].as_str().unwrap_or("").to_string();
        if frames.len() < 3 || name(&frames[0]) != "burn_alpha" || name(&frames[1]) != "burn" {
            return false;
        }
        let Some(first_py) = frames.iter().position(|f| !is_native(f)) else {
            return false;
        };
        let f = &frames[first_py];
        name(f) == "native_part" && f["line"].as_u64() == Some(native_line)
    };
    let found = stacks
        .iter()
        .filter_map(|s| s["frames"].as_array())
        .any(|f| reads_right(f));
    // burn_beta realigns its stack (its caller is found by a DWARF expression) and is
    // called 0-3 calls of beta_at_depth deeper: burn_beta, beta_at_depth…, burn, …,
    // native_part at the native line.
    let beta_reads_right = |frames: &[Value]| -> bool {
        let name = |f: &Value| f["function"].as_str().unwrap_or("").to_string();
        let depth = frames
            .iter()
            .skip(1)
            .take_while(|f| name(f) == "beta_at_depth")
            .count();
        let first_py = frames
            .iter()
            .position(|f| f["native"].as_bool() != Some(true));
        frames.len() > depth + 2
            && name(&frames[0]) == "burn_beta"
            && (1..=4).contains(&depth)
            && name(&frames[depth + 1]) == "burn"
            && first_py.is_some_and(|i| {
                name(&frames[i]) == "native_part" && frames[i]["line"].as_u64() == Some(native_line)
            })
    };
    let beta_depths: std::collections::BTreeSet<usize> = stacks
        .iter()
        .filter_map(|s| s["frames"].as_array())
        .filter(|f| beta_reads_right(f))
        .map(|f| {
            f.iter()
                .skip(1)
                .take_while(|x| x["function"] == "beta_at_depth")
                .count()
        })
        .collect();
    if beta_depths.len() < 2 {
        return Err(format!(
            "stacks read burn_beta, beta_at_depth × n, burn, …, native_part:{native_line} \
             at depths {beta_depths:?} only (each call picks 1-4 levels)"
        ));
    }
    if !found {
        let sample: Vec<String> = stacks
            .iter()
            .take(3)
            .map(|s| s["frames"].to_string())
            .collect();
        return Err(format!(
            "no stack reads burn_alpha, burn, …, native_part:{native_line}; first stacks: {}",
            sample.join("\n")
        ));
    }
    Ok(())
}

/// Renders a saved profile as collapsed stacks and checks the merged stack is there.
fn check_collapsed(profile: &Path, native_line: u64) -> Result<(), String> {
    let out = profile.with_extension("collapsed");
    let r = Command::new(BIN)
        .arg("view")
        .arg(profile)
        .arg("-o")
        .arg(&out)
        .output()
        .map_err(|e| e.to_string())?;
    if !r.status.success() {
        return Err(format!("view: {}", String::from_utf8_lossy(&r.stderr)));
    }
    let text = std::fs::read_to_string(&out).map_err(|e| e.to_string())?;
    let wanted = format!("burn.py:{native_line});");
    let ok = text.lines().any(|l| {
        l.find(&wanted).is_some_and(|i| {
            l[i..].contains(";burn (burnext") && l.contains(";burn_alpha (burnext")
        })
    });
    if !ok {
        return Err(format!(
            "no collapsed stack goes native_part (…{wanted} … burn (burnext…) … burn_alpha"
        ));
    }
    Ok(())
}

#[test]
fn run_native_splits_a_lines_c_time_by_function() {
    let fixture = common::fixture("native/burn.py");
    let native_line = common::mark(&fixture, "native");
    common::for_each_representative_alone(|py| {
        let dir = common::spinext::build_fixture_ext(py, "native/burnext.c", "burnext")?;
        let out = dir.join("p.json");
        let mut cmd = Command::new(BIN);
        cmd.args(["run", "--native", "--cpu-only", "--rate", "200", "-o"])
            .arg(&out)
            .arg("--")
            .arg(&py.path)
            .arg(&fixture)
            .arg(&dir)
            .arg(SECONDS);
        let r = common::run_limited(cmd, RUN_TIMEOUT);
        if r.code != Some(0) || !r.stdout.contains("done") {
            return Err(format!("run --native: {}", r.describe()));
        }
        let truth = truth(&r.stdout)?;
        let text = std::fs::read_to_string(&out).map_err(|e| e.to_string())?;
        let p: Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
        let summary = check_profile(&p, truth)?;
        check_collapsed(&out, native_line)?;
        let _ = std::fs::remove_dir_all(&dir);
        Ok(summary)
    });
}

/// The newest plain Python 3 and 2.7: attach to the running fixture for two seconds.
#[test]
fn attach_native_splits_a_running_programs_c_time_by_function() {
    let all = common::interpreters();
    let chosen: Vec<&Interpreter> = [
        all.iter()
            .filter(|i| i.major == 3 && i.root.is_none() && !i.free_threaded)
            .max_by_key(|i| i.version()),
        all.iter().find(|i| i.is_py2()),
    ]
    .into_iter()
    .flatten()
    .collect();
    assert!(!chosen.is_empty(), "no interpreter to attach to");
    common::for_each_interpreter_alone_of(&chosen, attach_once);
}

fn attach_once(py: &Interpreter) -> Result<String, String> {
    let dir = common::spinext::build_fixture_ext(py, "native/burnext.c", "burnext")?;
    let fixture = common::fixture("native/burn.py");
    let dir_arg = dir.display().to_string();
    let mut target = common::start_fixture(py, &fixture, &[dir_arg, "8".to_string()], false)?;
    let mut truth_line = None;
    while let Ok(l) = target.lines.recv_timeout(Duration::from_secs(20)) {
        if l.starts_with("truth ") {
            truth_line = Some(l);
        } else if l == "ready" {
            break;
        }
    }
    let truth = truth(truth_line.as_deref().unwrap_or(""))?;
    let out = dir.join("attach.json");
    let mut cmd = Command::new(BIN);
    cmd.args(["attach", "--native", "--cpu-only", "--rate", "200"])
        .args(["--duration", "3", "-o"])
        .arg(&out)
        .arg(target.pid.to_string());
    let r = common::run_limited(cmd, RUN_TIMEOUT);
    let alive = matches!(target.child.try_wait(), Ok(None));
    let _ = target.child.kill();
    let _ = target.child.wait();
    if r.code != Some(0) {
        return Err(format!("attach --native: {}", r.describe()));
    }
    if !alive {
        return Err("the target died while attached".into());
    }
    let text = std::fs::read_to_string(&out).map_err(|e| e.to_string())?;
    let p: Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
    let summary = check_profile(&p, truth)?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(summary)
}

#[test]
fn native_with_nonblocking_is_refused_on_one_line() {
    for sub in [
        &["run", "--native", "--nonblocking", "--", "python3"][..],
        &["attach", "--native", "--nonblocking", "1"],
    ] {
        let r = Command::new(BIN).args(sub).output().unwrap();
        let err = String::from_utf8_lossy(&r.stderr);
        assert_eq!(r.status.code(), Some(2), "{sub:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{sub:?}: {err}");
        assert!(err.contains("--nonblocking"), "{sub:?}: {err}");
    }
}
