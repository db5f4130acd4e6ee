//! `attach PID` with memory to a process whose only thread computes and never waits
//! (fixtures/memory/busy_compute.py): our library goes in through that thread, stopped
//! (PTRACE_INTERRUPT, no signal) where it runs the interpreter's own code. Per-line memory
//! as the fixture says, its output and exit status as without us, on every GIL interpreter
//! of the matrix (a free-threaded one gets time and a reason), and a profiler SIGKILLed
//! with the thread stopped, inside the call or at random moments leaves the target
//! unharmed.

mod common;

use serde_json::Value;
use std::io::{BufRead, BufReader, Read};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

const FIXTURE: &str = "memory/busy_compute.py";
/// What the fixture prints after "ready", and its exit status, whether profiled or not.
const OUTPUT: &str = "kept 96 MiB\n0 wrong results\ndone\n";
const EXIT: i32 = 9;
const COUNTING: &str = "is counted from now on";
const TIME_ONLY: &str = "recording time only for process";

/// The fixture, started without us, once it said "ready" (computing since).
struct Target {
    child: Child,
    out: BufReader<ChildStdout>,
}

impl Target {
    fn start(py: &common::Interpreter) -> Result<Target, String> {
        let mut child = Command::new(&py.path)
            .arg(common::fixture(FIXTURE))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| e.to_string())?;
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).map_err(|e| e.to_string())?;
        if line != "ready\n" {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("the target said {line:?} instead of ready"));
        }
        Ok(Target { child, out })
    }

    fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Tells it to go on (SIGUSR1); its output after "ready", its exit status and its
    /// stderr (within 60 s).
    fn finish(mut self) -> Result<(String, Option<i32>, String), String> {
        // SAFETY: kill with a valid signal number and our child's pid.
        unsafe { libc::kill(self.pid(), libc::SIGUSR1) };
        let deadline = Instant::now() + Duration::from_secs(60);
        let status = loop {
            if let Some(s) = self.child.try_wait().map_err(|e| e.to_string())? {
                break s;
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                return Err("the target did not end within 60 s".into());
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        let mut out = String::new();
        self.out
            .read_to_string(&mut out)
            .map_err(|e| e.to_string())?;
        let mut err = String::new();
        let _ = self.child.stderr.take().unwrap().read_to_string(&mut err);
        if let Some(sig) = std::os::unix::process::ExitStatusExt::signal(&status) {
            err.push_str(&format!("[killed by signal {sig}]"));
        }
        Ok((out, status.code(), err))
    }

    /// [`Target::finish`], checked against an unprofiled run's output and status.
    fn finish_unharmed(self) -> Result<(), String> {
        let (out, code, err) = self.finish()?;
        if out != OUTPUT || code != Some(EXIT) || !err.is_empty() {
            return Err(format!(
                "the target printed {out:?}, exited {code:?}, said {err:?}"
            ));
        }
        Ok(())
    }
}

fn attach(pid: i32, json: &std::path::Path, env: &[(&str, &str)]) -> Child {
    let mut cmd = Command::new(common::bin());
    cmd.args(["attach", &pid.to_string(), "-o"])
        .arg(json)
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.spawn().expect("starting scalene-rs attach")
}

/// KEEP's peak (MB) in the profile `p`.
fn keep_peak(p: &Value) -> f64 {
    let keep = common::mark(&common::fixture(FIXTURE), "KEEP");
    p["files"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|f| f["filename"].as_str().is_some_and(|n| n.ends_with(FIXTURE)))
        .flat_map(|f| f["lines"].as_array().into_iter().flatten())
        .find(|l| l["line"].as_u64() == Some(keep))
        .and_then(|l| l["mem_peak_mb"].as_f64())
        .unwrap_or(0.0)
}

/// Attached while it computes: memory counted from then on, KEEP's peak within 10% of what
/// the fixture kept, its output and exit status unchanged. A free-threaded interpreter
/// gets time only, and says why.
#[test]
fn a_thread_that_only_computes_gets_its_memory_counted() {
    common::for_each_representative_alone(|py| {
        let target = Target::start(py)?;
        let dir = common::tempdir("scalene-rs-attach-busy");
        let json = dir.join("p.json");
        let mut prof = attach(target.pid(), &json, &[]);
        let err = common::Lines::of(&mut prof);
        let mut seen = Vec::new();
        let want = if py.free_threaded {
            TIME_ONLY
        } else {
            COUNTING
        };
        let said = err.wait_for(want, &mut seen);
        let started = Instant::now();
        let finished = target.finish();
        let status = prof.wait().map_err(|e| e.to_string())?;
        err.rest(&mut seen);
        if !said {
            return Err(format!("attach never said {want:?}: {seen:?}"));
        }
        let (out, code, target_err) = finished?;
        if out != OUTPUT || code != Some(EXIT) || !target_err.is_empty() {
            return Err(format!(
                "the target printed {out:?}, exited {code:?}, said {target_err:?}"
            ));
        }
        if !status.success() {
            return Err(format!("attach failed ({status}): {seen:?}"));
        }
        let p: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap_or_default())
            .map_err(|e| format!("{e}: {seen:?}"))?;
        let _ = std::fs::remove_dir_all(&dir);
        if py.free_threaded {
            let reason = seen.iter().find(|l| l.contains(TIME_ONLY)).cloned();
            if !reason
                .as_deref()
                .is_some_and(|l| l.contains("free-threaded"))
            {
                return Err(format!("time only, with the reason, expected: {seen:?}"));
            }
            return Ok(format!("time only: {}", reason.unwrap_or_default()));
        }
        let truth: f64 = out
            .strip_prefix("kept ")
            .and_then(|r| r.split(' ').next())
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| format!("no truth in {out:?}"))?;
        let peak = keep_peak(&p);
        let summary = format!(
            "KEEP peak {peak:.1} MB (kept {truth} MiB), the target ran {:.1} s after the go",
            started.elapsed().as_secs_f64()
        );
        if (peak - truth).abs() > 0.10 * truth || p["memory"]["since_attach"] != true {
            return Err(format!("{summary}; attach said {seen:?}"));
        }
        Ok(summary)
    });
}

/// The interpreters of the kill test: the newest CPython 3 of this root, 2.7, and the
/// static builds (Debian's own, and a chrooted one).
fn kill_test_interpreters() -> Vec<common::Interpreter> {
    let all = common::interpreters();
    let newest = all
        .iter()
        .rev()
        .find(|p| !p.free_threaded && p.root.is_none() && !p.is_py2() && p.label.contains("pyenv"));
    let py2 = all.iter().find(|p| p.is_py2());
    let system = all.iter().find(|p| p.label.starts_with("system-"));
    let chrooted = all
        .iter()
        .rev()
        .find(|p| p.root.is_some() && !p.free_threaded && !p.label.contains("shared"));
    [newest, py2, system, chrooted]
        .into_iter()
        .flatten()
        .cloned()
        .collect()
}

/// A profiler SIGKILLed at the worst moments on purpose (a test hook stalls it there):
/// with the thread stopped in the interpreter's code, just before it is let run into
/// `dlopen` (its registers ours) and inside the call; then at 30 random moments of its
/// first 150 ms. The target finishes every time with its own output and exit status.
#[test]
fn a_profiler_killed_around_a_computing_thread_never_harms_the_target() {
    const RANDOM_KILLS: usize = 30;
    let pythons = kill_test_interpreters();
    assert!(
        !pythons.is_empty(),
        "no interpreter to run the kill test on"
    );
    let some: Vec<&common::Interpreter> = pythons.iter().collect();
    common::for_each_interpreter_alone_of(&some, |py| {
        let mut target = Target::start(py)?;
        let pid = target.pid();
        let dir = common::tempdir("scalene-rs-attach-busy-kills");
        let json = dir.join("k.json");
        for at in ["stopped", "before", "after"] {
            let mut prof = attach(pid, &json, &[("SCALENE_RS_TEST_STALL_CALL", at)]);
            let err = common::Lines::of(&mut prof);
            let mut seen = Vec::new();
            let stalled = err.wait_for("test stall", &mut seen);
            let _ = prof.kill();
            let _ = prof.wait();
            common::remove_attach_leftovers(prof.id());
            if !stalled {
                let _ = target.finish();
                return Err(format!("the profiler never stalled {at}: {seen:?}"));
            }
            std::thread::sleep(Duration::from_millis(200));
            if !target.alive() {
                return Err(format!(
                    "the target died after a kill {at}: {:?}",
                    target.finish()
                ));
            }
        }
        let mut rng = common::Rng(0x6275_7379 ^ pid as u64);
        for i in 0..RANDOM_KILLS {
            let wait = rng.below(150);
            let mut prof = attach(pid, &json, &[]);
            std::thread::sleep(Duration::from_millis(wait));
            let _ = prof.kill();
            let _ = prof.wait();
            common::remove_attach_leftovers(prof.id());
            if !target.alive() {
                return Err(format!(
                    "the target died after random kill {i} (at {wait} ms): {:?}",
                    target.finish()
                ));
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
        target.finish_unharmed()?;
        Ok(format!(
            "killed with the thread stopped, before and inside a call, and {RANDOM_KILLS} \
             times at random: the target unharmed"
        ))
    });
}
