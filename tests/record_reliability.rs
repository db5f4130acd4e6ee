//! Killing the profiler (SIGKILL) mid-recording leaves the target running normally: it
//! finishes with the same result and exit code as unprofiled, and no thread stays stopped.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::bin;

/// A file name of our own: the tests of this file run in parallel in one process, so every
/// name also carries a sequence number (two tests must never share a file).
fn tmp(name: &str) -> std::path::PathBuf {
    static SEQ: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    std::env::temp_dir().join(format!("scalene-rs-{}-{n}-{name}", std::process::id()))
}

/// No thread of `pid` is in a ptrace/job-control stop, and nobody traces it.
fn assert_not_stopped(pid: u32, what: &str) {
    for e in std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
    {
        let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
        let state = stat
            .rfind(')')
            .and_then(|i| stat[i + 1..].trim_start().chars().next());
        assert!(
            !matches!(state, Some('t') | Some('T')),
            "{what}: thread {:?} of {pid} is stopped ({state:?})",
            e.file_name()
        );
        let status = std::fs::read_to_string(e.path().join("status")).unwrap_or_default();
        let tracer = status
            .lines()
            .find(|l| l.starts_with("TracerPid:"))
            .map(|l| l["TracerPid:".len()..].trim().to_string());
        assert!(
            matches!(tracer.as_deref(), Some("0") | None),
            "{what}: thread {:?} of {pid} is still traced by {tracer:?}",
            e.file_name()
        );
    }
}

fn wait_for_file(path: &Path, timeout: Duration) -> Option<String> {
    let start = Instant::now();
    while start.elapsed() < timeout {
        if let Ok(s) = std::fs::read_to_string(path) {
            if !s.is_empty() {
                return Some(s);
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    None
}

/// The result an unprofiled run writes, and how long that run took.
fn reference(py: &common::Interpreter, fx: &Path) -> (String, Duration) {
    let out = tmp(&format!("ref-{}", py.label));
    let start = Instant::now();
    let st = Command::new(&py.path).arg(fx).arg(&out).status().unwrap();
    let took = start.elapsed();
    assert_eq!(st.code(), Some(5), "{}: the fixture exits with 5", py.label);
    let s = std::fs::read_to_string(&out).unwrap();
    let _ = std::fs::remove_file(&out);
    (s, took)
}

/// When to kill the profiler: a third into the program's unprofiled run time (profiled it
/// runs longer), so the kill lands while it works, on fast and slow interpreters alike.
fn kill_after(unprofiled: Duration) -> Duration {
    (unprofiled / 3).max(Duration::from_millis(200))
}

#[test]
fn killing_run_leaves_the_program_running() {
    let fx = common::fixture("cpu/survivor.py");
    for py in common::representatives() {
        let (expected, took) = reference(&py, &fx);
        let out = tmp(&format!("run-{}", py.label));
        let _ = std::fs::remove_file(&out);
        let mut prof = Command::new(bin())
            .args(["run", "--rate", "1000", "--"])
            .arg(&py.path)
            .arg(&fx)
            .arg(&out)
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(kill_after(took));
        // The program is the profiler's only child.
        let children = std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", prof.id()))
            .unwrap_or_default();
        let target: u32 = children
            .split_whitespace()
            .next()
            .unwrap_or_else(|| panic!("{}: the program finished too early", py.label))
            .parse()
            .unwrap();
        prof.kill().unwrap();
        let _ = prof.wait();
        std::thread::sleep(Duration::from_millis(100));
        if Path::new(&format!("/proc/{target}")).exists() {
            assert_not_stopped(target, &py.label);
        }
        let got = wait_for_file(&out, Duration::from_secs(60))
            .unwrap_or_else(|| panic!("{}: the program never finished its work", py.label));
        assert_eq!(got, expected, "{}: same result as unprofiled", py.label);
        let _ = std::fs::remove_file(&out);
        eprintln!(
            "{}: run killed mid-recording; the program finished: {got}",
            py.label
        );
    }
}

#[test]
fn killing_attach_leaves_the_program_running() {
    let fx = common::fixture("cpu/survivor.py");
    for py in common::representatives() {
        let (expected, took) = reference(&py, &fx);
        let out = tmp(&format!("attach-{}", py.label));
        let _ = std::fs::remove_file(&out);
        let mut target = Command::new(&py.path).arg(&fx).arg(&out).spawn().unwrap();
        std::thread::sleep(kill_after(took) / 2);
        let mut prof = Command::new(bin())
            .args(["attach", "--rate", "1000", &target.id().to_string()])
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(kill_after(took) / 2);
        prof.kill().unwrap();
        let _ = prof.wait();
        std::thread::sleep(Duration::from_millis(100));
        if target.try_wait().unwrap().is_none() {
            assert_not_stopped(target.id(), &py.label);
        }
        let status = target.wait().unwrap();
        assert_eq!(status.code(), Some(5), "{}: exit code unchanged", py.label);
        let got = std::fs::read_to_string(&out).unwrap();
        assert_eq!(got, expected, "{}: same result as unprofiled", py.label);
        let _ = std::fs::remove_file(&out);
        eprintln!(
            "{}: attach killed mid-recording; exit 5 and the same result",
            py.label
        );
    }
}

/// The program killed while the profiler pauses its threads at 1 kHz: `run` ends at once
/// with the program's status. (A thread that dies while we trace it stays a zombie until we
/// reap it, and until then the program's exit cannot be collected: `run` used to wait
/// forever.)
#[test]
fn run_ends_when_the_program_is_killed() {
    let fx = common::fixture("cpu/survivor.py");
    for py in common::representatives() {
        let out = tmp(&format!("killed-{}", py.label));
        let profile = tmp(&format!("killed-{}.json", py.label));
        let mut prof = Command::new(bin())
            .args(["run", "--rate", "1000", "-o"])
            .arg(&profile)
            .arg("--")
            .arg(&py.path)
            .arg(&fx)
            .arg(&out)
            .arg("1000000000")
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(1500));
        let children = std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", prof.id()))
            .unwrap_or_default();
        let target: i32 = children
            .split_whitespace()
            .next()
            .unwrap_or_else(|| panic!("{}: the program is not running", py.label))
            .parse()
            .unwrap();
        // SAFETY: kill(2) on a pid we just read; no memory is involved.
        unsafe { libc::kill(target, libc::SIGTERM) };
        let start = Instant::now();
        let status = loop {
            if let Some(s) = prof.try_wait().unwrap() {
                break s;
            }
            if start.elapsed() > Duration::from_secs(15) {
                let _ = prof.kill();
                let _ = prof.wait();
                panic!(
                    "{}: `run` did not end within 15 s of its program's death",
                    py.label
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        assert_eq!(
            status.code(),
            Some(128 + libc::SIGTERM),
            "{}: `run` exits as its program did (killed by SIGTERM)",
            py.label
        );
        let _ = std::fs::remove_file(&profile);
        let _ = std::fs::remove_file(&out);
        eprintln!(
            "{}: program killed mid-recording; run ended in {:?}",
            py.label,
            start.elapsed()
        );
    }
}

/// A recording ends when its program does, not at the sampler's next tick: at 1 Hz the
/// next tick after the first is a second away, yet `run` of a program of 0.2 s returns
/// (its profile written) and `attach` to a process that exits 0.3 s in returns, each well
/// before it. (Before, `run` took the whole second: a program run by us seemed to take up
/// to one sampling period longer.)
#[test]
fn the_recording_ends_when_the_program_does() {
    let py = common::interpreters()
        .into_iter()
        .rev()
        .find(|p| p.major >= 3 && p.root.is_none())
        .expect("an interpreter");
    let out = tmp("ends.json");
    let start = Instant::now();
    let run = Command::new(bin())
        .args(["run", "--cpu-only", "--rate", "1", "-o"])
        .arg(&out)
        .arg("--")
        .arg(&py.path)
        .args(["-c", "import time; time.sleep(0.2)"])
        .output()
        .unwrap();
    let took = start.elapsed();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(out.exists(), "the profile is written");
    assert!(
        took < Duration::from_millis(800),
        "{}: run of a 0.2 s program at 1 Hz took {took:?}",
        py.label
    );
    let _ = std::fs::remove_file(&out);

    let mut target = Command::new(&py.path)
        .args(["-c", "import time; time.sleep(0.5)"])
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let start = Instant::now();
    let attach = Command::new(bin())
        .args(["attach", "--cpu-only", "--rate", "1", "-o"])
        .arg(&out)
        .arg(target.id().to_string())
        .output()
        .unwrap();
    let took = start.elapsed();
    let _ = target.wait();
    assert!(
        attach.status.success(),
        "{}",
        String::from_utf8_lossy(&attach.stderr)
    );
    assert!(
        took < Duration::from_millis(800),
        "{}: attach to a process exiting 0.3 s in, at 1 Hz, took {took:?}",
        py.label
    );
    let _ = std::fs::remove_file(&out);
    eprintln!("{}: attach returned in {took:?}", py.label);
}

/// The bit of signal `sig` in the kernel's signal masks.
fn bit(sig: libc::c_int) -> u64 {
    1u64 << (sig - 1)
}

/// Starts `cmd` as a script's background job under `nohup` would: SIGINT and SIGHUP
/// ignored, and with `block_usr1`, SIGUSR1 blocked too.
fn ignoring_int_and_hup(cmd: &mut Command, block_usr1: bool) {
    // SAFETY: between fork and exec, only signal(2) and sigprocmask(2) on values of our
    // own: async-signal-safe, no allocation, no lock.
    unsafe {
        use std::os::unix::process::CommandExt;
        cmd.pre_exec(move || {
            libc::signal(libc::SIGINT, libc::SIG_IGN);
            libc::signal(libc::SIGHUP, libc::SIG_IGN);
            if block_usr1 {
                let mut set: libc::sigset_t = std::mem::zeroed();
                libc::sigemptyset(&mut set);
                libc::sigaddset(&mut set, libc::SIGUSR1);
                libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
            }
            Ok(())
        });
    }
}

/// The kernel's signal mask `field` ("SigBlk", "SigIgn", "SigCgt") in `status` lines.
fn signal_mask(status: &str, field: &str) -> u64 {
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .unwrap_or_else(|| panic!("no {field} in {status:?}"))
}

/// A program started by `run` has the signal state it would have without us. Signals its
/// parent ignored stay ignored: our handlers (SIGINT, SIGHUP, ...) used to reach it as the
/// default action, so under `nohup` a hang-up (which we forward) killed it, and CPython's
/// test_signal found SIGINT caught where the bare run had it ignored. Its signal mask is
/// the one we were given (set in the child explicitly: the standard library does not
/// promise it).
#[test]
fn the_program_inherits_the_signal_state_it_would_have_without_us() {
    let fx = common::fixture("procs/signal_state.py");
    common::for_each_representative(|py| {
        let state = |profiler: Option<&[&str]>| -> Result<String, String> {
            let mut cmd = match profiler {
                Some(args) => {
                    let mut c = Command::new(bin());
                    c.args(args).arg("--").arg(&py.path);
                    c
                }
                None => Command::new(&py.path),
            };
            cmd.arg(&fx).stdin(Stdio::null()).stderr(Stdio::null());
            ignoring_int_and_hup(&mut cmd, true);
            let out = cmd.output().map_err(|e| e.to_string())?;
            if !out.status.success() {
                return Err(format!("{profiler:?}: {}", out.status));
            }
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        };
        let bare = state(None)?;
        // The parent's state reached the bare program (else the comparison proves nothing).
        let (ign, blk) = (signal_mask(&bare, "SigIgn"), signal_mask(&bare, "SigBlk"));
        if ign & bit(libc::SIGINT) == 0 || ign & bit(libc::SIGHUP) == 0 {
            return Err(format!("bare: SIGINT and SIGHUP not ignored: {bare:?}"));
        }
        // A chrooted interpreter's wrapper (tools/debian_root.sh: unshare, sh) empties the
        // mask before the interpreter starts, bare or not: there only the dispositions tell.
        let mask_reaches = py.root.is_none();
        if mask_reaches && blk & bit(libc::SIGUSR1) == 0 {
            return Err(format!("bare: SIGUSR1 not blocked: {bare:?}"));
        }
        for args in [&["run", "--cpu-only"][..], &["run"][..]] {
            let got = state(Some(args))?;
            if got != bare {
                return Err(format!("{args:?}: {got:?}, bare {bare:?}"));
            }
        }
        Ok(format!(
            "ignored {ign:#x}, blocked {blk:#x}{}: the same bare and under run",
            if mask_reaches {
                ""
            } else {
                " (the chroot wrapper empties the mask)"
            }
        ))
    });
}

/// Whether `pid` catches signal `sig` (its SigCgt), false once it is gone.
fn catches(pid: u32, sig: libc::c_int) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .map(|s| signal_mask(&s, "SigCgt") & bit(sig) != 0)
        .unwrap_or(false)
}

/// `attach` started with SIGINT and SIGHUP ignored (a script's background job under
/// `nohup`): a hang-up leaves it recording, SIGINT still stops it with its report (it asks
/// us to stop; no program inherits our state there).
#[test]
fn attach_started_ignoring_signals_stops_on_sigint_not_on_a_hang_up() {
    common::for_each_representative(|py| {
        let mut target = Command::new(&py.path)
            .args(["-c", "import sys, time\nsys.stdout.write('up\\n')\nsys.stdout.flush()\nwhile 1: time.sleep(0.01)\n"])
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| e.to_string())?;
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(target.stdout.take().unwrap()),
            &mut line,
        )
        .map_err(|e| e.to_string())?;
        let out = tmp(&format!("attach-signals-{}.json", py.label));
        let mut cmd = Command::new(bin());
        cmd.args(["attach", &target.id().to_string(), "--cpu-only", "-o"])
            .arg(&out)
            .stdin(Stdio::null())
            .stderr(Stdio::null());
        ignoring_int_and_hup(&mut cmd, false);
        let mut prof = cmd.spawn().map_err(|e| e.to_string())?;
        let result = (|| {
            let pid = prof.id();
            let t0 = Instant::now();
            while !catches(pid, libc::SIGINT) {
                if t0.elapsed() > Duration::from_secs(20)
                    || prof.try_wait().ok().flatten().is_some()
                {
                    return Err("attach never caught SIGINT".to_string());
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            if catches(pid, libc::SIGHUP) {
                return Err("attach caught SIGHUP, which it was started ignoring".into());
            }
            // SAFETY: kill(2) on our own child.
            unsafe { libc::kill(pid as i32, libc::SIGHUP) };
            std::thread::sleep(Duration::from_millis(300));
            if let Some(st) = prof.try_wait().map_err(|e| e.to_string())? {
                return Err(format!("a hang-up stopped attach ({st})"));
            }
            // SAFETY: kill(2) on our own child.
            unsafe { libc::kill(pid as i32, libc::SIGINT) };
            let t1 = Instant::now();
            let stopped_in = loop {
                if let Some(st) = prof.try_wait().map_err(|e| e.to_string())? {
                    if !st.success() {
                        return Err(format!("attach stopped by SIGINT exited {st}"));
                    }
                    break t1.elapsed();
                }
                if t1.elapsed() > Duration::from_secs(30) {
                    return Err("SIGINT did not stop attach within 30 s".into());
                }
                std::thread::sleep(Duration::from_millis(20));
            };
            let json = std::fs::read_to_string(&out).map_err(|e| format!("no report: {e}"))?;
            if !json.contains("\"samples\"") {
                return Err(format!("not a profile: {}", &json[..json.len().min(200)]));
            }
            Ok(format!(
                "a hang-up ignored; SIGINT stopped it in {:.2} s, with its report",
                stopped_in.as_secs_f64()
            ))
        })();
        let _ = prof.kill();
        let _ = prof.wait();
        let _ = target.kill();
        let _ = target.wait();
        let _ = std::fs::remove_file(&out);
        result
    });
}
