//! `attach PID` with memory to a process whose only thread computes and never waits
//! (fixtures/memory/busy_compute.py), or allocates large buffers in a tight loop and spends
//! almost all its time in the C library and the kernel (fixtures/memory/busy_alloc.py):
//! our library goes in through that thread, stopped (PTRACE_INTERRUPT, no signal) where it
//! runs the interpreter's own code, or caught on its way back into that code. Per-line
//! memory as the fixture says, its output and exit status as without us, on every GIL
//! interpreter of the matrix (a free-threaded one gets time and a reason), and a profiler
//! SIGKILLed with the thread stopped, with a return address of its stack replaced, inside
//! the call or at random moments leaves the target unharmed.

mod common;

use serde_json::Value;
use std::io::{BufRead, BufReader, Read};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

/// A fixture whose only thread never waits, and what it prints after "ready" and its exit
/// status, whether profiled or not.
struct Fixture {
    name: &'static str,
    output: &'static str,
    exit: i32,
}

/// Its thread computes with complex numbers (in the interpreter's own code, mostly).
const COMPUTE: Fixture = Fixture {
    name: "memory/busy_compute.py",
    output: "kept 96 MiB\n0 wrong results\ndone\n",
    exit: 9,
};
/// Its thread allocates 1 MiB buffers in a tight loop (in memset, malloc and page faults,
/// mostly).
const ALLOC: Fixture = Fixture {
    name: "memory/busy_alloc.py",
    output: "counted 256 MiB\n0 wrong results\ndone\n",
    exit: 9,
};
const FIXTURE: &str = COMPUTE.name;
const COUNTING: &str = "is counted from now on";
const TIME_ONLY: &str = "recording time only for process";

/// The fixture, started without us, once it said "ready" (computing since).
struct Target {
    child: Child,
    out: BufReader<ChildStdout>,
    fixture: &'static Fixture,
}

impl Target {
    fn start(py: &common::Interpreter) -> Result<Target, String> {
        Target::start_of(py, &COMPUTE)
    }

    fn start_of(py: &common::Interpreter, fixture: &'static Fixture) -> Result<Target, String> {
        let mut child = Command::new(&py.path)
            .arg(common::fixture(fixture.name))
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
        Ok(Target {
            child,
            out,
            fixture,
        })
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
        let (output, exit) = (self.fixture.output, self.fixture.exit);
        let (out, code, err) = self.finish()?;
        if out != output || code != Some(exit) || !err.is_empty() {
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
    line_field(p, FIXTURE, "KEEP", "mem_peak_mb")
}

/// The column `field` of the line of `fixture` marked `mark` in the profile `p` (0 where
/// it has none).
fn line_field(p: &Value, fixture: &str, mark: &str, field: &str) -> f64 {
    let line = common::mark(&common::fixture(fixture), mark);
    p["files"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|f| f["filename"].as_str().is_some_and(|n| n.ends_with(fixture)))
        .flat_map(|f| f["lines"].as_array().into_iter().flatten())
        .find(|l| l["line"].as_u64() == Some(line))
        .and_then(|l| l[field].as_f64())
        .unwrap_or(0.0)
}

/// Reads the profiler's stderr until it says whether the memory of `pid` is counted
/// (true) or time only is recorded (false); None when it said neither within 60 s.
fn counted_or_not(err: &common::Lines, pid: i32, seen: &mut Vec<String>) -> Option<bool> {
    let about = format!("process {pid}");
    while err.wait_for(&about, seen) {
        let last = seen.last().map(String::as_str).unwrap_or_default();
        if last.contains(COUNTING) {
            return Some(true);
        }
        if last.contains(TIME_ONLY) {
            return Some(false);
        }
    }
    None
}

/// The interpreters of the tight-loop test and its tries on each: pyenv's 3.11, 3.12 and
/// 3.13, where the search for the thread failed 2 to 6 times in 9 (issue 39), ten times
/// each; every other representative three times.
fn tight_loop_interpreters() -> Vec<(common::Interpreter, usize)> {
    const AFFECTED: &[(u32, u32)] = &[(3, 11), (3, 12), (3, 13)];
    let affected = |p: &common::Interpreter| {
        p.label.starts_with("pyenv-") && !p.free_threaded && AFFECTED.contains(&p.version())
    };
    let mut chosen: Vec<(common::Interpreter, usize)> = common::interpreters()
        .into_iter()
        .filter(|p| affected(p))
        .map(|p| (p, 10))
        .collect();
    assert_eq!(
        chosen.len(),
        AFFECTED.len(),
        "pyenv's 3.11, 3.12 and 3.13 are the interpreters of this test: the matrix must \
         not shrink"
    );
    for p in common::representatives() {
        if !chosen.iter().any(|(c, _)| c.label == p.label) {
            chosen.push((p, 3));
        }
    }
    chosen
}

/// A single thread that allocates 1 MiB buffers in a tight loop, attached to again and
/// again: at every try our library goes in (the thread caught on its way back from memset,
/// malloc or a page fault into the interpreter), COUNTED gets its 256 MiB within 10%, and
/// the target's output and exit status are those of a run without us. A free-threaded
/// interpreter gets time only, and says why. (Before the catch, 2 to 6 tries in 9 got no
/// memory at all on pyenv's 3.11-3.13: the stops found the thread in the interpreter's
/// code about once in 600.)
#[test]
fn a_thread_that_allocates_in_a_tight_loop_gets_its_memory_at_every_try() {
    let chosen = tight_loop_interpreters();
    let some: Vec<&common::Interpreter> = chosen.iter().map(|(p, _)| p).collect();
    common::for_each_interpreter_alone_of(&some, |py| {
        let tries = chosen
            .iter()
            .find(|(p, _)| p.label == py.label)
            .map_or(1, |(_, n)| *n);
        let mut figures = Vec::new();
        let mut failures = Vec::new();
        for i in 0..tries {
            match tight_loop_try(py) {
                Ok(f) => figures.push(f),
                Err(e) => failures.push(format!("try {}: {e}", i + 1)),
            }
        }
        if !failures.is_empty() {
            return Err(format!(
                "{} of {tries} tries failed: {}; the others: {figures:?}",
                failures.len(),
                failures.join("; ")
            ));
        }
        Ok(format!(
            "{tries} tries, COUNTED (MB, s to count): {figures:?}"
        ))
    });
}

/// One try of the tight-loop test: COUNTED's MB and how long the attach took to count.
fn tight_loop_try(py: &common::Interpreter) -> Result<String, String> {
    let target = Target::start_of(py, &ALLOC)?;
    let pid = target.pid();
    let dir = common::tempdir("scalene-rs-attach-tight");
    let json = dir.join("p.json");
    let started = Instant::now();
    let mut prof = attach(pid, &json, &[]);
    let err = common::Lines::of(&mut prof);
    let mut seen = Vec::new();
    let counted = counted_or_not(&err, pid, &mut seen);
    let took = started.elapsed().as_secs_f64();
    let finished = target.finish_unharmed();
    let status = prof.wait().map_err(|e| e.to_string())?;
    err.rest(&mut seen);
    finished?;
    if !status.success() {
        return Err(format!("attach failed ({status}): {seen:?}"));
    }
    let p: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap_or_default())
        .map_err(|e| format!("{e}: {seen:?}"))?;
    let _ = std::fs::remove_dir_all(&dir);
    match counted {
        Some(true) if !py.free_threaded => {}
        Some(false) if py.free_threaded => {
            return seen
                .iter()
                .find(|l| l.contains(TIME_ONLY) && l.contains("free-threaded"))
                .cloned()
                .ok_or_else(|| format!("time only, with the reason, expected: {seen:?}"));
        }
        _ => return Err(format!("memory counted: {counted:?}; attach said {seen:?}")),
    }
    let mb = line_field(&p, ALLOC.name, "COUNTED", "mem_alloc_mb");
    let truth = 256.0;
    if (mb - truth).abs() > 0.10 * truth || p["memory"]["since_attach"] != true {
        return Err(format!(
            "COUNTED {mb:.1} MB of {truth} MiB (counted {took:.2} s after the attach \
             began); attach said {seen:?}"
        ));
    }
    Ok(format!("{mb:.0} MB, {took:.2} s"))
}

/// A profiler SIGKILLed while the tight loop's thread runs with a return address of its
/// stack replaced by our catch code (a test hook stalls it there), three times; once with
/// the thread caught and stopped; then at 20 random moments of its first 150 ms. The
/// target goes on each time (the catch code waits 50 ms at most, then returns where the
/// thread was going), and ends with its own output and exit status.
#[test]
fn a_profiler_killed_with_a_return_address_replaced_never_harms_the_target() {
    const RANDOM_KILLS: usize = 20;
    let pythons = kill_test_interpreters();
    assert!(
        !pythons.is_empty(),
        "no interpreter to run the kill test on"
    );
    let some: Vec<&common::Interpreter> = pythons.iter().collect();
    common::for_each_interpreter_alone_of(&some, |py| {
        let mut target = Target::start_of(py, &ALLOC)?;
        let pid = target.pid();
        let dir = common::tempdir("scalene-rs-attach-tight-kills");
        let json = dir.join("k.json");
        let mut stalls = 0;
        for at in ["patched", "patched", "patched", "stopped"] {
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
            stalls += 1;
            std::thread::sleep(Duration::from_millis(200));
            if !target.alive() {
                return Err(format!(
                    "the target died after a kill {at}: {:?}",
                    target.finish()
                ));
            }
        }
        let mut rng = common::Rng(0x7469_6768 ^ pid as u64);
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
            "killed {stalls} times at a stall (3 with a return address replaced) and \
             {RANDOM_KILLS} times at random: the target unharmed"
        ))
    });
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
        if out != COMPUTE.output || code != Some(COMPUTE.exit) || !target_err.is_empty() {
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
