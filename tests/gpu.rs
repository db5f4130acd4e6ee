//! GPU figures per line, through a stand-in NVML library that the tests build
//! (tests/support/fake_nvml.c) and name with SCALENE_RS_NVML_LIB: CI has no GPU. The fixture
//! (fixtures/gpu/phases.py) tells the stand-in how busy it keeps the GPU on each line, so the
//! truth is known: on each representative interpreter (common::representatives), each line's
//! share of the program's GPU time within ±5 points, another process's utilization never
//! charged, the memory peak on the line that holds it. Then NVML failing in every way we know
//! (no library, no driver, no device, lost mid-run, hung mid-run, functions missing, no
//! permission), on one interpreter: a clear header line, the rest of the profile intact, the
//! exit code passed through, never a hang.

mod common;

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// One GPU test at a time, across test processes (common::turn): their shares are measured
/// against the truth, and runs competing for the two cores of a CI machine make the
/// samplers late.
fn turn() -> common::Turn {
    common::turn("gpu")
}

/// One profiled run of the fixture and what came of it.
struct Recorded {
    run: common::Run,
    profile: Value,
    took: Duration,
}

/// Profiles fixtures/gpu/phases.py with `py` under the stand-in NVML `lib`, whose script is
/// `script` (the other process's line already in it), with `env` added and `args` given to
/// `run`.
fn record(
    py: &common::Interpreter,
    lib: &Path,
    script: &Path,
    env: &[(&str, &str)],
    args: &[&str],
) -> Recorded {
    let dir = common::tempdir("scalene-rs-gpu");
    let json = dir.join("profile.json");
    let mut cmd = Command::new(common::bin());
    cmd.arg("run")
        .arg("--cpu-only")
        .args(args)
        .arg("-o")
        .arg(&json)
        .arg("--")
        .arg(&py.path)
        .arg(common::fixture("gpu/phases.py"))
        .env("SCALENE_RS_NVML_LIB", lib)
        .env("SCALENE_RS_FAKE_NVML_SCRIPT", script)
        .env("SCALENE_RS_FAKE_NVML_PERIOD_MS", "50");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let start = Instant::now();
    let run = common::run_limited(cmd, Duration::from_secs(60));
    let took = start.elapsed();
    let profile = std::fs::read_to_string(&json)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or(Value::Null);
    let _ = std::fs::remove_dir_all(&dir);
    Recorded { run, profile, took }
}

/// A process outside the program, busy on the same GPU all along (in the script at 100% and
/// 8000 MiB): it must never be charged.
struct Other {
    child: std::process::Child,
}

impl Other {
    fn start(script: &Path) -> Other {
        let child = Command::new("sleep").arg("120").spawn().expect("sleep");
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_micros();
        std::fs::write(script, format!("{now} 0 {} 100 8000\n", child.id())).unwrap();
        Other { child }
    }
}

impl Drop for Other {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The profile's line `n` of the fixture.
fn line(p: &Value, n: u64) -> Option<&Value> {
    p["files"]
        .as_array()?
        .iter()
        .filter(|f| f["filename"].as_str().unwrap_or("").ends_with("phases.py"))
        .flat_map(|f| f["lines"].as_array().into_iter().flatten())
        .find(|l| l["line"].as_u64() == Some(n))
}

fn num(v: Option<&Value>, key: &str) -> f64 {
    v.and_then(|l| l[key].as_f64()).unwrap_or(0.0)
}

/// Truth (fixtures/gpu/phases.py): GPU80 2/3 of the GPU time, GPU40 1/3, CPU none.
const TOLERANCE_PTS: f64 = 5.0;

#[test]
fn each_line_gets_its_share_of_the_gpu_and_no_other_process_is_charged() {
    let _turn = turn();
    let lib = common::fake_nvml(None);
    let fx = common::fixture("gpu/phases.py");
    let (gpu80, gpu40, cpu, alloc) = (
        common::mark(&fx, "GPU80"),
        common::mark(&fx, "GPU40"),
        common::mark(&fx, "CPU"),
        common::mark(&fx, "ALLOC"),
    );
    common::for_each_representative(|py| {
        let dir = common::tempdir("scalene-rs-gpu-script");
        let script = dir.join("script");
        let log = dir.join("calls");
        let other = Other::start(&script);
        let r = record(
            py,
            &lib,
            &script,
            &[
                ("GPU_EXIT", "3"),
                ("SCALENE_RS_FAKE_NVML_LOG", log.to_str().unwrap()),
            ],
            &[],
        );
        drop(other);
        let calls = std::fs::read_to_string(&log).unwrap_or_default();
        let _ = std::fs::remove_dir_all(&dir);
        if r.run.code != Some(3) || !r.run.stdout.contains("phases done") {
            return Err(format!(
                "the program's exit or output changed: {}",
                r.run.describe()
            ));
        }
        let p = &r.profile;
        let g = &p["gpu"];
        if g.is_null() || !g["unavailable"].is_null() {
            return Err(format!("no GPU figures: {g}; {}", r.run.describe()));
        }
        let share = |n| num(line(p, n), "gpu_pct");
        let peak = |n| num(line(p, n), "gpu_mem_peak_mb");
        let (s80, s40, scpu) = (share(gpu80), share(gpu40), share(cpu));
        let mut bad = Vec::new();
        if (s80 - 200.0 / 3.0).abs() > TOLERANCE_PTS {
            bad.push(format!("GPU80 line {s80:.1}% (truth 66.7)"));
        }
        if (s40 - 100.0 / 3.0).abs() > TOLERANCE_PTS {
            bad.push(format!("GPU40 line {s40:.1}% (truth 33.3)"));
        }
        if scpu > TOLERANCE_PTS {
            bad.push(format!("CPU line {scpu:.1}% (truth 0)"));
        }
        // Had the other process (100% all along) been charged, the program's GPU seconds
        // would be about twice the truth: 0.8·0.5 + 0.4·0.5 per round, 2 rounds.
        let gpu_s = g["gpu_s"].as_f64().unwrap_or(0.0);
        if (gpu_s - 1.2).abs() > 0.15 {
            bad.push(format!("the program's GPU time {gpu_s:.3} s (truth 1.2)"));
        }
        if g["other_process_samples"].as_u64().unwrap_or(0) == 0 {
            bad.push("the other process's samples were not seen".into());
        }
        if peak(alloc) < 4096.0 {
            bad.push(format!("ALLOC line's GPU memory peak {} MB", peak(alloc)));
        }
        for (name, n) in [("GPU80", gpu80), ("GPU40", gpu40), ("CPU", cpu)] {
            if peak(n) != 512.0 {
                bad.push(format!(
                    "{name} line's GPU memory peak {} MB (truth 512)",
                    peak(n)
                ));
            }
        }
        let mem_peak = g["mem_peak_mb"].as_f64().unwrap_or(0.0);
        if mem_peak != 4096.0 {
            bad.push(format!(
                "the program's GPU memory peak {mem_peak} MB (truth 4096)"
            ));
        }
        if g["devices"][0]["name"] != "Fake GPU 0" {
            bad.push(format!("devices {}", g["devices"]));
        }
        // Only NVML's read-only functions were called.
        let writes: Vec<&str> = calls
            .lines()
            .filter(|c| {
                !(c.starts_with("nvmlInit")
                    || c.starts_with("nvmlShutdown")
                    || c.starts_with("nvmlErrorString")
                    || c.starts_with("nvmlSystemGet")
                    || c.starts_with("nvmlDeviceGet"))
            })
            .collect();
        if calls.is_empty() || !writes.is_empty() {
            bad.push(format!(
                "NVML calls besides reads: {writes:?} (log {} bytes)",
                calls.len()
            ));
        }
        if bad.is_empty() {
            Ok(format!(
                "GPU80 {s80:.1}%, GPU40 {s40:.1}%, CPU {scpu:.1}%, {gpu_s:.2} GPU-s, ALLOC \
                 peak {} MB",
                peak(alloc)
            ))
        } else {
            Err(bad.join("; "))
        }
    });
}

/// The interpreter the failure cases run on: NVML's failures are the profiler's, not the
/// interpreter's.
fn one_interpreter() -> common::Interpreter {
    let all = common::interpreters();
    all.iter()
        .find(|p| p.root.is_none() && !p.is_py2() && !p.free_threaded)
        .or(all.first())
        .cloned()
        .expect("no Python interpreter found")
}

/// Runs the fixture (one short round) under a failing NVML and checks the profile is whole.
fn failing(
    name: &str,
    lib: &Path,
    env: &[(&str, &str)],
    args: &[&str],
) -> Result<(Value, String), String> {
    let py = one_interpreter();
    let dir = common::tempdir("scalene-rs-gpu-fail");
    let script = dir.join("script");
    let other = Other::start(&script);
    let mut env = env.to_vec();
    env.extend([
        ("GPU_ROUNDS", "1"),
        ("GPU_PHASE_S", "0.4"),
        ("GPU_EXIT", "5"),
    ]);
    let r = record(&py, lib, &script, &env, args);
    drop(other);
    let _ = std::fs::remove_dir_all(&dir);
    let p = r.profile;
    // The fixture spins ~1.7 s; the profiler may add its bounded waits, never a hang.
    if r.took > Duration::from_secs(15) || r.run.timed_out {
        return Err(format!("{name}: took {:?}: {}", r.took, r.run.describe()));
    }
    if r.run.code != Some(5) || !r.run.stdout.contains("phases done") {
        return Err(format!("{name}: exit/output changed: {}", r.run.describe()));
    }
    let fx = common::fixture("gpu/phases.py");
    let cpu_pct = |n| {
        let l = line(&p, n);
        num(l, "cpu_python_pct") + num(l, "cpu_native_pct") + num(l, "cpu_system_pct")
    };
    let spun: f64 = ["GPU80", "GPU40", "CPU", "ALLOC"]
        .iter()
        .map(|m| cpu_pct(common::mark(&fx, m)))
        .sum();
    if spun < 80.0 {
        return Err(format!(
            "{name}: the CPU profile is not intact: the spinning lines have {spun:.0}%"
        ));
    }
    Ok((p, r.run.stderr))
}

#[test]
fn nvml_failures_say_why_and_leave_the_profile_intact() {
    let _turn = turn();
    let full = common::fake_nvml(None);
    let no_v3 = common::fake_nvml(Some("FAKE_NVML_NO_V3"));
    let no_util = common::fake_nvml(Some("FAKE_NVML_NO_PROCESS_UTILIZATION"));
    let missing = Path::new("/nonexistent/libnvidia-ml.so.1");
    let fx = common::fixture("gpu/phases.py");
    let alloc = common::mark(&fx, "ALLOC");
    let mut failures = Vec::new();
    let mut check = |name: &str,
                     lib: &Path,
                     env: &[(&str, &str)],
                     want: &dyn Fn(&Value) -> Result<(), String>| {
        match failing(name, lib, env, &[]).and_then(|(p, stderr)| {
            want(&p["gpu"]).map_err(|e| format!("{name}: {e}; gpu = {}", p["gpu"]))?;
            // The terminal report's header says it in one line.
            let _ = stderr;
            Ok(p)
        }) {
            Ok(p) => common::say(&format!(
                "{name}: {}",
                p["gpu"]["unavailable"]
                    .as_str()
                    .map(str::to_string)
                    .unwrap_or_else(|| p["gpu"]["notes"].to_string())
            )),
            Err(e) => failures.push(e),
        }
    };
    let unavailable = |needle: &'static str| {
        move |g: &Value| -> Result<(), String> {
            let why = g["unavailable"].as_str().unwrap_or("");
            if why.contains(needle) {
                Ok(())
            } else {
                Err(format!("expected the reason to say {needle:?}"))
            }
        }
    };
    let noted = |needle: &'static str, data: bool| {
        move |g: &Value| -> Result<(), String> {
            let notes = g["notes"].to_string();
            if !notes.contains(needle) {
                return Err(format!("expected a note saying {needle:?}"));
            }
            if data && !g["unavailable"].is_null() {
                return Err("expected the figures up to the failure".into());
            }
            Ok(())
        }
    };
    check(
        "no library",
        missing,
        &[],
        &unavailable("NVML could not be loaded"),
    );
    check(
        "driver not loaded",
        &full,
        &[("SCALENE_RS_FAKE_NVML_FAIL", "init")],
        &unavailable("driver is not loaded"),
    );
    check(
        "no device",
        &full,
        &[("SCALENE_RS_FAKE_NVML_FAIL", "no_device")],
        &unavailable("found no GPU"),
    );
    check(
        "GPU lost mid-run",
        &full,
        &[("SCALENE_RS_FAKE_NVML_FAIL", "lost_after:900")],
        &noted("NVML failed", true),
    );
    check(
        "NVML hangs mid-run",
        &full,
        &[("SCALENE_RS_FAKE_NVML_FAIL", "hang_after:900")],
        &noted("did not answer", true),
    );
    check(
        "no per-process utilization (permission)",
        &full,
        &[("SCALENE_RS_FAKE_NVML_FAIL", "permission")],
        &noted("no permission", true),
    );
    check(
        "no per-process utilization function",
        &no_util,
        &[],
        &move |g: &Value| {
            noted("per-process GPU utilization", true)(g)?;
            if g["gpu_s"].as_f64() != Some(0.0) || g["mem_peak_mb"].as_f64() != Some(4096.0) {
                return Err("expected memory figures alone".into());
            }
            Ok(())
        },
    );
    // An older driver (no _v3 process list): the _v2 one gives the memory.
    match failing("no _v3 process list", &no_v3, &[], &[]) {
        Ok((p, _)) => {
            let peak = num(line(&p, alloc), "gpu_mem_peak_mb");
            if peak < 4096.0 || !p["gpu"]["unavailable"].is_null() {
                failures.push(format!("no _v3: ALLOC peak {peak}; gpu = {}", p["gpu"]));
            }
        }
        Err(e) => failures.push(e),
    }
    // --no-gpu: NVML is not even loaded.
    let dir = common::tempdir("scalene-rs-gpu-off");
    let log = dir.join("calls");
    match failing(
        "--no-gpu",
        &full,
        &[("SCALENE_RS_FAKE_NVML_LOG", log.to_str().unwrap())],
        &["--no-gpu"],
    ) {
        Ok((p, _)) => {
            if !p["gpu"].is_null() || log.exists() {
                failures.push(format!(
                    "--no-gpu: gpu = {}, NVML called: {}",
                    p["gpu"],
                    log.exists()
                ));
            }
        }
        Err(e) => failures.push(e),
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn the_terminal_report_shows_gpu_columns_or_says_why_not() {
    let _turn = turn();
    let py = one_interpreter();
    let full = common::fake_nvml(None);
    let fx = common::fixture("gpu/phases.py");
    let dir = common::tempdir("scalene-rs-gpu-term");
    for (lib, fail) in [(full.as_path(), ""), (full.as_path(), "init")] {
        let script = dir.join(format!("script{fail}"));
        let other = Other::start(&script);
        let mut cmd = Command::new(common::bin());
        cmd.args(["run", "--cpu-only", "--"])
            .arg(&py.path)
            .arg(&fx)
            .env("SCALENE_RS_NVML_LIB", lib)
            .env("SCALENE_RS_FAKE_NVML_SCRIPT", &script)
            .env("SCALENE_RS_FAKE_NVML_PERIOD_MS", "50")
            .env("SCALENE_RS_FAKE_NVML_FAIL", fail)
            .env("GPU_ROUNDS", "1")
            .env("COLUMNS", "160");
        let r = common::run_limited(cmd, Duration::from_secs(60));
        drop(other);
        let gpu_lines: Vec<&str> = r.stderr.lines().filter(|l| l.starts_with("GPU:")).collect();
        assert_eq!(
            gpu_lines.len(),
            1,
            "one GPU line in the header: {}",
            r.stderr
        );
        let header = r
            .stderr
            .lines()
            .find(|l| l.contains("│ source"))
            .unwrap_or_else(|| panic!("no file table: {}", r.stderr));
        if fail.is_empty() {
            assert!(header.contains("GPU │ GPU mem"), "{header}");
            assert!(gpu_lines[0].contains("Fake GPU 0"), "{}", gpu_lines[0]);
        } else {
            assert!(!header.contains("GPU"), "{header}");
            assert!(gpu_lines[0].contains("no GPU columns"), "{}", gpu_lines[0]);
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Writes `p` to a file and renders it again with `view` as pprof; returns that file.
fn as_pprof(p: &Value, dir: &Path) -> PathBuf {
    let json = dir.join("p.json");
    std::fs::write(&json, serde_json::to_vec(p).unwrap()).unwrap();
    let pb = dir.join("p.pb.gz");
    let mut cmd = Command::new(common::bin());
    cmd.arg("view").arg(&json).arg("-o").arg(&pb);
    let r = common::run_limited(cmd, Duration::from_secs(60));
    assert_eq!(r.code, Some(0), "view: {}", r.describe());
    pb
}

#[test]
fn go_tool_pprof_reads_the_gpu_time_per_line() {
    let _turn = turn();
    if !common::have_go("go_tool_pprof_reads_the_gpu_time_per_line") {
        return;
    }
    let py = one_interpreter();
    let dir = common::tempdir("scalene-rs-gpu-pprof");
    let script = dir.join("script");
    let other = Other::start(&script);
    let r = record(&py, &common::fake_nvml(None), &script, &[], &[]);
    drop(other);
    assert_eq!(r.run.code, Some(0), "{}", r.run.describe());
    let pb = as_pprof(&r.profile, &dir);
    let mut cmd = Command::new("go");
    cmd.args(["tool", "pprof", "-top", "-lines", "-sample_index=gpu"])
        .arg(&pb);
    let out = common::run_limited(cmd, Duration::from_secs(120));
    assert_eq!(out.code, Some(0), "go tool pprof: {}", out.describe());
    let fx = common::fixture("gpu/phases.py");
    // `-top -lines` rows: flat flat% sum% cum cum% function file:line. The flat column is
    // the line's GPU time ("0.76s", "40ms"); flat% is of the GPU time charged to stacks,
    // while the JSON's gpu_pct is of all the program's GPU time (some of which a busy
    // machine leaves with no stack: a missed sample), so the times are compared.
    let seconds = |v: &str| -> Option<f64> {
        if let Some(ms) = v.strip_suffix("ms") {
            return ms.parse::<f64>().ok().map(|x| x / 1e3);
        }
        if let Some(us) = v.strip_suffix("us").or_else(|| v.strip_suffix("µs")) {
            return us.parse::<f64>().ok().map(|x| x / 1e6);
        }
        v.strip_suffix('s')?.parse().ok()
    };
    let column = |label: &str, col: usize| -> f64 {
        let place = format!("phases.py:{}", common::mark(&fx, label));
        out.stdout
            .lines()
            .filter(|l| l.trim_end().ends_with(&place))
            .filter_map(|l| {
                let v = l.split_whitespace().nth(col)?;
                if col == 1 {
                    v.strip_suffix('%')?.parse::<f64>().ok()
                } else {
                    seconds(v)
                }
            })
            .sum()
    };
    let flat = |label: &str| column(label, 1);
    let (s80, s40, scpu) = (flat("GPU80"), flat("GPU40"), flat("CPU"));
    let gpu_s = r.profile["gpu"]["gpu_s"].as_f64().unwrap_or(0.0);
    let json_s =
        |label: &str| num(line(&r.profile, common::mark(&fx, label)), "gpu_pct") / 100.0 * gpu_s;
    for label in ["GPU80", "GPU40", "CPU"] {
        let (got, want) = (column(label, 0), json_s(label));
        // pprof prints two or three significant digits: 10 ms, or 2%, whichever is more.
        assert!(
            (got - want).abs() <= (0.01f64).max(0.02 * want),
            "{label}: pprof {got} s vs the JSON's {want} s: {}",
            out.stdout
        );
    }
    // The shares of the GPU time charged to lines: the fixture's truth.
    assert!((s80 - 200.0 / 3.0).abs() < TOLERANCE_PTS, "{}", out.stdout);
    assert!((s40 - 100.0 / 3.0).abs() < TOLERANCE_PTS, "{}", out.stdout);
    assert!(scpu < TOLERANCE_PTS, "{}", out.stdout);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn every_process_of_the_program_is_charged_its_own_gpu_time() {
    let _turn = turn();
    let py = one_interpreter();
    let dir = common::tempdir("scalene-rs-gpu-procs");
    let script = dir.join("script");
    let other = Other::start(&script);
    let json = dir.join("p.json");
    let fx = common::fixture("gpu/phases.py");
    let both = format!(
        "{py} {fx} & {py} {fx}; wait",
        py = py.path.display(),
        fx = fx.display()
    );
    let mut cmd = Command::new(common::bin());
    cmd.args(["run", "--cpu-only", "-o"])
        .arg(&json)
        .args(["--", "sh", "-c", &both])
        .env("SCALENE_RS_NVML_LIB", common::fake_nvml(None))
        .env("SCALENE_RS_FAKE_NVML_SCRIPT", &script)
        .env("SCALENE_RS_FAKE_NVML_PERIOD_MS", "50")
        .env("GPU_ROUNDS", "1");
    let r = common::run_limited(cmd, Duration::from_secs(60));
    drop(other);
    assert_eq!(r.code, Some(0), "{}", r.describe());
    let p: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let procs: Vec<(f64, f64)> = p["processes"]
        .as_array()
        .unwrap_or(&Vec::new())
        .iter()
        .filter(|q| q["command"].as_str().unwrap_or("").contains("phases.py"))
        .map(|q| {
            (
                q["gpu_pct"].as_f64().unwrap_or(-1.0),
                q["gpu_mem_peak_mb"].as_f64().unwrap_or(-1.0),
            )
        })
        .collect();
    assert_eq!(procs.len(), 2, "two Python processes: {}", p["processes"]);
    for (pct, peak) in &procs {
        // Each ran the same phases: half the program's GPU time, 4096 MiB at its peak.
        assert!((pct - 50.0).abs() < 10.0, "{procs:?}");
        assert_eq!(*peak, 4096.0, "{procs:?}");
    }
    // Together they held 8192 MiB when both allocated at once (they run in step).
    let total = p["gpu"]["mem_peak_mb"].as_f64().unwrap_or(0.0);
    assert!((4096.0..=8192.0).contains(&total), "{total}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn attach_charges_the_gpu_time_of_a_running_process() {
    let _turn = turn();
    let py = one_interpreter();
    let dir = common::tempdir("scalene-rs-gpu-attach");
    let script = dir.join("script");
    let other = Other::start(&script);
    let lib = common::fake_nvml(None);
    // The stand-in answers in the profiler's process: the program only writes the script.
    let mut target = Command::new(&py.path)
        .arg(common::fixture("gpu/phases.py"))
        .env("SCALENE_RS_FAKE_NVML_SCRIPT", &script)
        .env("GPU_ROUNDS", "4")
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(700));
    let json = dir.join("p.json");
    let mut cmd = Command::new(common::bin());
    cmd.args(["attach", "--cpu-only", "--duration", "2.5", "-o"])
        .arg(&json)
        .arg(target.id().to_string())
        .env("SCALENE_RS_NVML_LIB", &lib)
        .env("SCALENE_RS_FAKE_NVML_SCRIPT", &script)
        .env("SCALENE_RS_FAKE_NVML_PERIOD_MS", "50");
    let r = common::run_limited(cmd, Duration::from_secs(60));
    let status = target.wait().unwrap();
    drop(other);
    assert_eq!(r.code, Some(0), "{}", r.describe());
    assert!(status.success(), "the target: {status:?}");
    let p: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let fx = common::fixture("gpu/phases.py");
    let share = |label: &str| num(line(&p, common::mark(&fx, label)), "gpu_pct");
    let gpu_s = p["gpu"]["gpu_s"].as_f64().unwrap_or(0.0);
    // 2.5 s of a program that is busy on the GPU two thirds of the time, at 80% or 40%.
    assert!(gpu_s > 0.5 && gpu_s < 1.6, "{}", p["gpu"]);
    assert!(share("GPU80") + share("GPU40") > 90.0, "{}", p["gpu"]);
    assert!(share("CPU") < TOLERANCE_PTS, "{}", p["gpu"]);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Whether the machine's dynamic loader knows NVML's default library (a driver installed).
fn nvml_installed() -> bool {
    Command::new("ldconfig")
        .arg("-p")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("libnvidia-ml.so.1"))
}

/// Most machines have no NVIDIA driver: there the report says nothing of GPUs unless
/// `--gpu` asks (the JSON keeps the reason, marked quiet). Where a driver is installed,
/// NVML answers and the report has its GPU line either way.
#[test]
fn no_driver_is_said_only_when_gpu_figures_are_asked_for() {
    let py = one_interpreter();
    let dir = common::tempdir("scalene-rs-gpu-quiet");
    let driver = nvml_installed();
    for asked in [false, true] {
        let json = dir.join(format!("asked-{asked}.json"));
        let mut cmd = Command::new(common::bin());
        cmd.env_remove("SCALENE_RS_NVML_LIB")
            .env("COLUMNS", "160")
            .args(["run", "--cpu-only", "-o"])
            .arg(&json)
            .args(asked.then_some("--gpu"))
            .arg("--")
            .arg(&py.path)
            .args(["-c", "sum(range(3000000))"]);
        let r = common::run_limited(cmd, Duration::from_secs(60));
        assert_eq!(r.code, Some(0), "{}", r.describe());
        // The terminal report of the saved profile, as `view` prints it.
        let mut view = Command::new(common::bin());
        view.env("COLUMNS", "160").arg("view").arg(&json);
        let v = common::run_limited(view, Duration::from_secs(60));
        assert_eq!(v.code, Some(0), "{}", v.describe());
        let report = format!("{}{}", v.stdout, v.stderr);
        let said: Vec<&str> = report.lines().filter(|l| l.starts_with("GPU:")).collect();
        let p: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        let g = &p["gpu"];
        if driver {
            assert_eq!(said.len(), 1, "a driver is installed: {report}");
            assert!(g["quiet"].is_null(), "{g}");
            continue;
        }
        let why = g["unavailable"].as_str().unwrap_or("");
        assert!(
            why.contains("NVML could not be loaded"),
            "the JSON keeps the reason: {g}"
        );
        if asked {
            assert!(
                said.len() == 1 && said[0].contains("no GPU columns"),
                "--gpu: the header says why: {report}"
            );
            assert!(g["quiet"].is_null(), "{g}");
        } else {
            assert!(
                said.is_empty(),
                "no driver, not asked: not a word: {report}"
            );
            assert_eq!(g["quiet"], Value::Bool(true), "{g}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
