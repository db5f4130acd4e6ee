//! Programs that are more than one process (fixtures/procs/*): `run` follows every Python
//! descendant — multiprocessing pools under fork, spawn and forkserver, `subprocess`, an `exec`
//! into another Python program, a shell script that starts Python — and merges them into one
//! profile; `--no-subprocesses` does not; `attach --subprocesses` follows the workers of a
//! running pool. On each representative interpreter (common::representatives) (2.7 has only
//! fork).
mod common;
use serde_json::Value;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::bin;

fn tempfile(tag: &str) -> std::path::PathBuf {
    static SEQ: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    std::env::temp_dir().join(format!(
        "scalene-rs-procs-{}-{}-{tag}.json",
        std::process::id(),
        SEQ.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
    ))
}

/// `scalene-rs run [extra] -o out.json -- argv...`: the profile, after checking that the
/// program ran to its end (its stdout says `done`) with exit 0.
fn run(extra: &[&str], argv: &[&str]) -> Result<Value, String> {
    let out = tempfile("run");
    let r = Command::new(bin())
        .arg("run")
        .args(extra)
        .arg("-o")
        .arg(&out)
        .arg("--")
        .args(argv)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .map_err(|e| e.to_string())?;
    let stdout = String::from_utf8_lossy(&r.stdout);
    if !r.status.success() || !stdout.contains("done") {
        return Err(format!(
            "run {argv:?} failed ({:?}): stdout {stdout} stderr {}",
            r.status,
            String::from_utf8_lossy(&r.stderr)
        ));
    }
    let text = std::fs::read_to_string(&out).map_err(|e| format!("no profile: {e}"))?;
    let _ = std::fs::remove_file(&out);
    serde_json::from_str(&text).map_err(|e| e.to_string())
}

/// Percent of the program's time on the lines of files named `name`.
fn file_pct(p: &Value, name: &str) -> f64 {
    p["files"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["filename"].as_str().unwrap().ends_with(name))
        .map(|f| f["cpu_pct"].as_f64().unwrap())
        .sum()
}

/// (pid, command, cpu_pct) of each process in the profile.
fn processes(p: &Value) -> Vec<(i64, String, f64)> {
    p["processes"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|x| {
                    (
                        x["pid"].as_i64().unwrap(),
                        x["command"].as_str().unwrap().to_string(),
                        x["cpu_pct"].as_f64().unwrap(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The children of every thread of `pid` (a pool's handler thread forks replacements).
fn all_children(pid: u32) -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|text| {
            text.split_whitespace()
                .filter_map(|c| c.parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect()
}

fn fx(name: &str) -> String {
    common::fixture(&format!("procs/{name}"))
        .to_string_lossy()
        .into_owned()
}

/// The 4 workers' shares (each burns the same CPU time, one task per worker): each within
/// ±10 points of 25% of the workers' total, and the pool's work most of the program's time.
fn check_pool(p: &Value, what: &str) -> Result<String, String> {
    let procs = processes(p);
    let mut shares: Vec<f64> = procs.iter().map(|x| x.2).collect();
    shares.sort_by(|a, b| b.total_cmp(a));
    let work = file_pct(p, "pool.py");
    let summary = format!(
        "{what}: {} processes, shares {:?}, pool.py {work:.0}%",
        procs.len(),
        shares.iter().map(|s| s.round()).collect::<Vec<_>>()
    );
    if procs.len() < 5 {
        return Err(format!("expected the parent and 4 workers: {summary}"));
    }
    let workers: f64 = shares[..4].iter().sum();
    // The rest is the parent's and the pool's own processes (start-up, imports).
    if work < 70.0 || workers < 70.0 {
        return Err(format!("the workers' work is missing: {summary}"));
    }
    if shares[..4]
        .iter()
        .any(|s| (100.0 * s / workers - 25.0).abs() > 10.0)
    {
        return Err(format!("unequal shares for equal work: {summary}"));
    }
    Ok(summary)
}

#[test]
fn a_pool_of_workers_under_every_start_method() {
    common::for_each_representative_alone(|py| {
        let methods: &[&str] = if py.is_py2() {
            &["fork"]
        } else {
            &["fork", "spawn", "forkserver"]
        };
        let mut out = Vec::new();
        for m in methods {
            let path = py.path.to_string_lossy();
            let p = run(&[], &[&path, &fx("pool.py"), m, "1.2"])?;
            out.push(check_pool(&p, m)?);
        }
        Ok(out.join("; "))
    });
}

#[test]
fn subprocess_exec_and_shell_script() {
    common::for_each_representative_alone(|py| {
        let path = py.path.to_string_lossy().into_owned();
        // subprocess: the parent waits, the child works.
        let p = run(&[], &[&path, &fx("subproc.py"), "0.8"])?;
        let child = file_pct(&p, "child.py");
        let n = processes(&p).len();
        if child < 60.0 || n < 2 {
            return Err(format!(
                "subprocess: child.py {child:.0}%, {n} processes (want ≥60%, ≥2)"
            ));
        }
        // exec: the same process, two programs, each about half of the time.
        let p = run(&[], &[&path, &fx("execs.py"), "0.6"])?;
        let (before, after) = (file_pct(&p, "execs.py"), file_pct(&p, "child.py"));
        let procs = processes(&p);
        let same_pid = procs.windows(2).any(|w| w[0].0 == w[1].0);
        if before < 10.0 || after < 10.0 || !same_pid {
            return Err(format!(
                "exec: execs.py {before:.0}%, child.py {after:.0}%, processes {procs:?}"
            ));
        }
        // A shell script that runs Python, then other programs.
        let p = run(&[], &["sh", &fx("script.sh"), &path, "0.8"])?;
        let script = file_pct(&p, "child.py");
        if script < 60.0 {
            return Err(format!("shell script: child.py {script:.0}% (want ≥60%)"));
        }
        // --no-subprocesses: the child is not profiled.
        let p = run(&["--no-subprocesses"], &[&path, &fx("subproc.py"), "0.5"])?;
        let alone = file_pct(&p, "child.py");
        if alone > 0.0 || !processes(&p).is_empty() {
            return Err(format!(
                "--no-subprocesses still shows the child ({alone:.0}%)"
            ));
        }
        Ok(format!(
            "subprocess child {child:.0}%; exec {before:.0}% + {after:.0}%; script {script:.0}%"
        ))
    });
}

#[test]
fn attach_follows_the_workers_of_a_running_pool() {
    common::for_each_representative_alone(|py| {
        let mut target = Command::new(&py.path)
            .args([&fx("pool.py"), "fork", "4"])
            .stdout(Stdio::null())
            // Its workers complain on stderr when the test kills the pool under them.
            .stderr(Stdio::null())
            // A group of its own: the pool and its workers are killed together (orphaned
            // workers went on burning their task's CPU under the next tests).
            .process_group(0)
            .spawn()
            .map_err(|e| e.to_string())?;
        let pool = target.id() as i32;
        let mut kill_pool = move || {
            // SAFETY: kill(2) on the process group we made; no memory is touched.
            unsafe { libc::kill(-pool, libc::SIGKILL) };
            let _ = target.wait();
        };
        // Attach once the 4 workers are running. A free-threaded 3.13 can take its time to
        // start them when the machine is busy (its start-up thread hand-off spins on
        // sched_yield: ~10 s with three busy loops on two cores, no profiler involved), so
        // the wait is long, and a pool that did not get there says so instead of making a
        // profile of its parent alone look like a failure to follow it.
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        let mut workers = 0;
        while workers < 4 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
            workers = all_children(pool as u32).len();
        }
        if workers < 4 {
            kill_pool();
            return Err(format!("the pool had {workers} workers after 120 s"));
        }
        let out = tempfile("attach");
        let r = Command::new(bin())
            .args(["attach", &pool.to_string(), "--subprocesses"])
            .args(["--duration", "1.5", "-o"])
            .arg(&out)
            .output();
        kill_pool();
        let r = r.map_err(|e| e.to_string())?;
        if !r.status.success() {
            return Err(format!(
                "attach failed: {}",
                String::from_utf8_lossy(&r.stderr)
            ));
        }
        let text = std::fs::read_to_string(&out).map_err(|e| e.to_string())?;
        let _ = std::fs::remove_file(&out);
        let p: Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
        // A window of a running pool: every worker found and its work there (their shares
        // over a window depend on the scheduler, unlike the whole run's).
        let procs = processes(&p);
        let work = file_pct(&p, "pool.py");
        let summary = format!("{} processes, pool.py {work:.0}%", procs.len());
        if procs.len() < 5 || work < 70.0 {
            return Err(format!(
                "attach --subprocesses: {summary}; attach said: {}",
                String::from_utf8_lossy(&r.stderr).trim_end()
            ));
        }
        Ok(summary)
    });
}
