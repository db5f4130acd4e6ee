//! Memory of programs of several processes (fixtures/memory/mp_keep.py, subproc_alloc.py,
//! fork_child.py, mp_churn.py), on each representative interpreter (common::representatives)
//! (2.7 has only fork): each Python process under `run` has its own ring, read with its own
//! stacks; the report charges each process's bytes to its own lines and keeps a per-process
//! breakdown; `--no-subprocesses` makes no rings for children; a killed profiler harms no
//! worker and its rings are cleaned by the next run.
mod common;

use serde_json::Value;
use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_scalene-rs");

fn fx(name: &str) -> String {
    common::fixture(&format!("memory/{name}"))
        .to_string_lossy()
        .into_owned()
}

/// `scalene-rs run [extra] -o out.json -- argv...`: (profile, program's stdout), after
/// checking the program's exit status is `code`.
fn run(extra: &[&str], argv: &[&str], code: i32) -> Result<(Value, String), String> {
    static SEQ: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let out = std::env::temp_dir().join(format!(
        "scalene-rs-memkids-{}-{}.json",
        std::process::id(),
        SEQ.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
    ));
    let r = Command::new(BIN)
        .arg("run")
        .args(extra)
        .arg("-o")
        .arg(&out)
        .arg("--")
        .args(argv)
        .output()
        .map_err(|e| e.to_string())?;
    let stdout = String::from_utf8_lossy(&r.stdout).into_owned();
    if r.status.code() != Some(code) {
        return Err(format!(
            "run {argv:?}: exit {:?}, want {code}: stdout {stdout} stderr {}",
            r.status,
            String::from_utf8_lossy(&r.stderr)
        ));
    }
    let text = std::fs::read_to_string(&out).map_err(|e| format!("no profile: {e}"))?;
    let _ = std::fs::remove_file(&out);
    Ok((
        serde_json::from_str(&text).map_err(|e| e.to_string())?,
        stdout,
    ))
}

/// The line of fixture `name` that carries `# MARKER`.
fn marked_line(name: &str, marker: &str) -> u64 {
    let text = std::fs::read_to_string(fx(name)).unwrap();
    let tag = format!("# {marker}");
    text.lines()
        .position(|l| l.trim_end().ends_with(&tag))
        .unwrap_or_else(|| panic!("{name} has no {tag}")) as u64
        + 1
}

/// Field `field` of line `line` of the file named `name` (0 when absent).
fn line_field(p: &Value, name: &str, line: u64, field: &str) -> f64 {
    p["files"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|f| f["filename"].as_str().is_some_and(|n| n.ends_with(name)))
        .flat_map(|f| f["lines"].as_array().into_iter().flatten())
        .filter(|l| l["line"].as_u64() == Some(line))
        .filter_map(|l| l[field].as_f64())
        .sum()
}

/// (file, line, value) of every line whose `field` is over `floor`: where memory went.
fn lines_with(p: &Value, field: &str, floor: f64) -> Vec<(String, u64, f64)> {
    p["files"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|f| {
            let name = f["filename"].as_str().unwrap_or("?").to_string();
            f["lines"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(move |l| {
                    let v = l[field].as_f64()?;
                    (v > floor).then(|| (name.clone(), l["line"].as_u64().unwrap_or(0), v))
                })
        })
        .collect()
}

/// (pid, command, mem_peak_mb, mem_alloc_mb) of each process of the breakdown.
fn processes(p: &Value) -> Vec<(i64, String, f64, f64)> {
    p["processes"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|x| {
            (
                x["pid"].as_i64().unwrap(),
                x["command"].as_str().unwrap_or("").to_string(),
                x["mem_peak_mb"].as_f64().unwrap_or(-1.0),
                x["mem_alloc_mb"].as_f64().unwrap_or(-1.0),
            )
        })
        .collect()
}

fn within(got: f64, want: f64, tolerance: f64) -> bool {
    (got - want).abs() <= tolerance * want
}

/// Four workers each keep 96 MiB on the WORKER line (a Pool, or Process objects): the merged
/// report charges that line the workers' 384 MiB (±10%), ≥90% of it by the interpreter,
/// and the per-process breakdown has four processes whose own peak is 96 MiB (±15%: a
/// spawned worker's start-up keeps a few MB of its own).
fn check_workers(py: &common::Interpreter, method: &str, kind: &str) -> Result<String, String> {
    let path = py.path.to_string_lossy();
    let (p, out) = run(&[], &[&path, &fx("mp_keep.py"), method, kind, "96"], 0)?;
    if !out.contains("done [96, 96, 96, 96]") {
        return Err(format!("{method} {kind}: output {out}"));
    }
    let n = marked_line("mp_keep.py", "WORKER");
    let alloc = line_field(&p, "mp_keep.py", n, "mem_alloc_mb");
    let python = line_field(&p, "mp_keep.py", n, "mem_python_pct");
    let procs = processes(&p);
    let peaks: Vec<f64> = procs.iter().map(|x| (x.2 * 10.0).round() / 10.0).collect();
    let late = &p["memory"]["handshake_timeouts"];
    let summary = format!(
        "{method} {kind}: WORKER line {alloc:.1} MB ({python:.0}% Python), peaks {peaks:?}, {late} late"
    );
    if !within(alloc, 4.0 * 96.0, 0.10) || python < 90.0 {
        return Err(format!(
            "the workers' bytes are not on their line: {summary}"
        ));
    }
    let workers = procs.iter().filter(|x| within(x.2, 96.0, 0.15)).count();
    if workers != 4 {
        return Err(format!(
            "want 4 processes with a 96 MiB peak: {summary}; {procs:?}"
        ));
    }
    Ok(summary)
}

#[test]
fn workers_under_every_start_method_have_their_own_memory() {
    common::for_each_representative_alone(|py| {
        let runs: &[(&str, &str)] = if py.is_py2() {
            &[("fork", "pool"), ("fork", "process")]
        } else {
            &[
                ("fork", "pool"),
                ("spawn", "process"),
                ("forkserver", "pool"),
            ]
        };
        let mut out = Vec::new();
        for (method, kind) in runs {
            out.push(check_workers(py, method, kind)?);
        }
        Ok(out.join("; "))
    });
}

/// `subprocess` starts a child that keeps 48 MiB on its CHILD line: the child's line gets
/// them, the child had a ring of its own while it ran, and the parent's ring carries none
/// of them (its own figure stays at its start-up's few MB). With `--no-subprocesses` the
/// child makes no ring and is not in the report.
#[test]
fn a_subprocess_has_its_own_ring_unless_not_followed() {
    common::for_each_representative_alone(|py| {
        let path = py.path.to_string_lossy();
        let n = marked_line("child_alloc.py", "CHILD");
        let (p, out) = run(&[], &[&path, &fx("subproc_alloc.py")], 0)?;
        if !out.contains("child 48 own-ring yes") || !out.contains("parent done 5") {
            return Err(format!("followed: output {out}"));
        }
        let child_line = line_field(&p, "child_alloc.py", n, "mem_alloc_mb");
        let procs = processes(&p);
        let parent = procs.iter().find(|x| x.1.contains("subproc_alloc.py"));
        let child = procs.iter().find(|x| x.1.contains("child_alloc.py"));
        let (Some(parent), Some(child)) = (parent, child) else {
            return Err(format!("parent and child not both in {procs:?}"));
        };
        let summary = format!(
            "child line {child_line:.1} MB, child {:.1} MB, parent {:.1} MB",
            child.3, parent.3
        );
        if !within(child_line, 48.0, 0.10) || child.3 < 0.9 * 48.0 || parent.3 >= 24.0 {
            return Err(summary);
        }

        let (p, out) = run(&["--no-subprocesses"], &[&path, &fx("subproc_alloc.py")], 0)?;
        if !out.contains("child 48 own-ring no") || !out.contains("parent done 5") {
            return Err(format!("--no-subprocesses: output {out}"));
        }
        let unfollowed = line_field(&p, "child_alloc.py", n, "mem_alloc_mb");
        if unfollowed > 0.0 || !processes(&p).is_empty() {
            return Err(format!(
                "--no-subprocesses still shows the child ({unfollowed} MB, {:?})",
                processes(&p)
            ));
        }
        Ok(summary)
    });
}

/// The parent keeps 16 MiB, forks, and the child allocates 64 MiB while the parent waits:
/// the child's line has the 64 MiB, the parent's line its 16 and none of the child's.
#[test]
fn a_forked_child_does_not_write_into_its_parents_ring() {
    common::for_each_representative_alone(|py| {
        let path = py.path.to_string_lossy();
        let (p, out) = run(&[], &[&path, &fx("fork_child.py")], 0)?;
        if !out.contains("child 64") || !out.contains("parent 16 child-exit 7") {
            return Err(format!("output {out}"));
        }
        let parent = line_field(
            &p,
            "fork_child.py",
            marked_line("fork_child.py", "PARENT"),
            "mem_alloc_mb",
        );
        let child = line_field(
            &p,
            "fork_child.py",
            marked_line("fork_child.py", "FORKED"),
            "mem_alloc_mb",
        );
        let summary = format!("parent line {parent:.1} MB, child line {child:.1} MB");
        if !(12.0..=20.0).contains(&parent) || !within(child, 64.0, 0.10) {
            return Err(summary);
        }
        Ok(summary)
    });
}

/// This process's rings in the ring directory made for the profiler `pid` (its own and
/// its program's processes').
fn rings_of(profiler: u32) -> Vec<String> {
    let prefix = format!("scalene-rs-ring-{profiler}-");
    std::fs::read_dir(scalene_rs::memory::ring::ring_dir())
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(&prefix))
                .collect()
        })
        .unwrap_or_default()
}

/// The profiler is SIGKILLed while a pool's workers allocate (and more workers are still to
/// start): the program ends with the output and exit status it has unprofiled, in bounded
/// time (no worker waits on the dead profiler), and the rings left behind go at the next
/// run.
#[test]
fn a_killed_profiler_harms_no_worker_and_its_rings_are_cleaned() {
    common::for_each_representative_alone(|py| {
        let method = if py.is_py2() { "fork" } else { "spawn" };
        let script = fx("mp_churn.py");
        let started = Instant::now();
        let plain = Command::new(&py.path)
            .args([&script, method, "0.4"])
            .output()
            .map_err(|e| e.to_string())?;
        let plain_took = started.elapsed();
        let status_file = std::env::temp_dir().join(format!(
            "scalene-rs-memkids-killed-{}-{}",
            std::process::id(),
            py.label
        ));
        let shell = format!(
            "{} {script} {method} 0.4; echo $? > {}",
            py.path.display(),
            status_file.display()
        );
        let mut prof = Command::new(BIN)
            .args(["run", "-o", "/dev/null", "--", "sh", "-c", &shell])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| e.to_string())?;
        // Kill it once workers have rings of their own (each makes one at its first event).
        let profiler = prof.id();
        let deadline = Instant::now() + Duration::from_secs(30);
        while rings_of(profiler).len() < 2 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        let rings_seen = rings_of(profiler).len();
        prof.kill().map_err(|e| e.to_string())?;
        let killed_at = Instant::now();
        prof.wait().map_err(|e| e.to_string())?;
        // The program and its workers keep our stdout pipe open until they end.
        let mut out = String::new();
        prof.stdout
            .take()
            .unwrap()
            .read_to_string(&mut out)
            .map_err(|e| e.to_string())?;
        let after_kill = killed_at.elapsed();
        let status = std::fs::read_to_string(&status_file).unwrap_or_default();
        let _ = std::fs::remove_file(&status_file);
        if rings_seen < 2 {
            return Err(format!("no worker made a ring within 30 s ({rings_seen})"));
        }
        if out.as_bytes() != &plain.stdout[..]
            || status.trim() != plain.status.code().unwrap_or(-1).to_string()
        {
            return Err(format!(
                "output {out:?} exit {status:?}, unprofiled {:?} exit {:?}",
                String::from_utf8_lossy(&plain.stdout),
                plain.status.code()
            ));
        }
        // 8 tasks of 0.4 s on 4 workers: about a second left; waiting on the dead profiler
        // would cost each of hundreds of windows up to 5 ms, and each new worker 2 s. What is
        // left can take no longer than the whole unprofiled run, plus 10 s: start-ups are
        // slow on a busy machine (a free-threaded 3.13's take seconds there, as it spins on
        // sched_yield), unprofiled as well.
        if after_kill > plain_took + Duration::from_secs(10) {
            return Err(format!(
                "the program took {after_kill:?} after the kill, {plain_took:?} in all unprofiled"
            ));
        }
        let left = rings_of(profiler);
        // The next run cleans up the rings of the dead profiler's dead processes.
        let r = Command::new(BIN)
            .args(["run", "-o", "/dev/null", "--"])
            .arg(&py.path)
            .args(["-c", "pass"])
            .output()
            .map_err(|e| e.to_string())?;
        if !r.status.success() {
            return Err(format!("the next run failed: {r:?}"));
        }
        let still = rings_of(profiler);
        if left.is_empty() || !still.is_empty() {
            return Err(format!(
                "rings after the kill {left:?}, after the next run {still:?}"
            ));
        }
        Ok(format!(
            "{method}: ended {after_kill:?} after the kill; {} rings cleaned",
            left.len()
        ))
    });
}

/// `attach --subprocesses` to a pool started under `run` whose profiler was killed: every
/// process's ring (the profiler's, which the pool's parent claimed, and each worker's own)
/// is taken over, and the workers' allocations are tied to their line again.
#[test]
fn attach_takes_over_the_ring_of_every_process() {
    common::for_each_representative_alone(|py| {
        let method = if py.is_py2() { "fork" } else { "spawn" };
        let mut prof = Command::new(BIN)
            .args(["run", "-o", "/dev/null", "--"])
            .arg(&py.path)
            .args([&fx("mp_churn.py"), method, "6", "4"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| e.to_string())?;
        let profiler = prof.id();
        // The profiler's ring and the 4 workers' own (not counting the resource tracker's
        // that a spawning pool starts too).
        let dir = scalene_rs::memory::ring::ring_dir();
        let ours = || {
            rings_of(profiler)
                .into_iter()
                .filter(|r| {
                    let producer = scalene_rs::memory::ring::producer_of(&dir.join(r));
                    let cmd = std::fs::read(format!("/proc/{}/cmdline", producer.unwrap_or(0)))
                        .unwrap_or_default();
                    !String::from_utf8_lossy(&cmd).contains("_tracker")
                })
                .collect::<Vec<_>>()
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while ours().len() < 5 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        // And until every worker churns: a free-threaded 3.13 on a busy machine may make its
        // ring during start-up and get to its task seconds later (its start-up spins on
        // sched_yield), and an attach window before that would find it allocating nothing.
        let churning = |r: &String| {
            r.ends_with(".ring")
                || scalene_rs::memory::ring::events_of(&dir.join(r)).is_some_and(|n| n >= 50)
        };
        let ready = |rings: &Vec<String>| rings.len() >= 5 && rings.iter().all(churning);
        let deadline = Instant::now() + Duration::from_secs(60);
        while !ready(&ours()) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        let rings = ours();
        if !ready(&rings) {
            let _ = prof.kill();
            let _ = prof.wait();
            return Err(format!("workers not allocating after 60 s: {rings:?}"));
        }
        let main = rings.iter().find(|r| r.ends_with(".ring")).cloned();
        prof.kill().map_err(|e| e.to_string())?;
        prof.wait().map_err(|e| e.to_string())?;
        let (Some(main), 5..) = (main, rings.len()) else {
            return Err(format!("rings before the kill: {rings:?}"));
        };
        let main = dir.join(main);
        let root = scalene_rs::memory::ring::producer_of(&main).unwrap_or(0);
        let json = std::env::temp_dir().join(format!(
            "scalene-rs-memkids-attach-{}-{}.json",
            std::process::id(),
            py.label
        ));
        let r = Command::new(BIN)
            .args([
                "attach",
                &root.to_string(),
                "--subprocesses",
                "--duration",
                "1.5",
            ])
            .arg("-o")
            .arg(&json)
            .output()
            .map_err(|e| e.to_string())?;
        // The program runs to its end (a few seconds) whatever happened.
        let deadline = Instant::now() + Duration::from_secs(30);
        while scalene_rs::proc::process_exists(root) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        if !r.status.success() {
            return Err(format!(
                "attach {root} failed: {}",
                String::from_utf8_lossy(&r.stderr)
            ));
        }
        let p: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap_or_default())
            .map_err(|e| e.to_string())?;
        let _ = std::fs::remove_file(&json);
        let line = line_field(
            &p,
            "mp_churn.py",
            marked_line("mp_churn.py", "CHURN"),
            "mem_alloc_mb",
        );
        let total = p["memory"]["alloc_mb"].as_f64().unwrap_or(0.0);
        let workers = processes(&p).iter().filter(|x| x.3 > 10.0).count();
        let summary =
            format!("CHURN line {line:.0} of {total:.0} MB, {workers} processes with memory");
        // Each worker allocates ~1 MiB per iteration the whole time.
        if workers < 4 || line < 100.0 || line < 0.9 * total {
            return Err(format!(
                "{summary}; the rest: {:?}; processes (pid, command, peak, alloc): {:?}; attach said: {}",
                lines_with(&p, "mem_alloc_mb", 1.0),
                processes(&p),
                String::from_utf8_lossy(&r.stderr)
            ));
        }
        Ok(summary)
    });
}
