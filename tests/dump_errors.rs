//! `scalene-rs dump` when it cannot do its job: the exit code and the one-line message.
//!
//! Exit codes (the contract): 0 ok, 1 other, 2 usage, 3 no such process, 4 not a Python
//! process, 5 permission denied, 6 unsupported Python version, 7 the process exited while
//! being read. An error is exactly one line on stderr starting with `error: `; a Rust panic
//! (exit 101, "panicked") is never acceptable.
//!
//! Cases that need a Python process run against every interpreter; the others (no such
//! process, not Python, usage) need none.

mod common;

use common::{Interpreter, Run};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_scalene-rs");
const READY_TIMEOUT: Duration = Duration::from_secs(20);
const DUMP_TIMEOUT: Duration = Duration::from_secs(60);
/// Dumps of short-lived processes in `exiting_processes`.
const EXITING_ROUNDS: usize = 200;

/// Runs a command with a time limit, draining stdout and stderr.
fn run_cmd(cmd: Command) -> Run {
    common::run_limited(cmd, DUMP_TIMEOUT)
}

fn dump(args: &[&str]) -> Run {
    let mut cmd = Command::new(BIN);
    cmd.args(args);
    run_cmd(cmd)
}

/// The error contract: exit `code`, nothing on stdout, exactly one stderr line that starts
/// with `error: `, no panic. Returns the line.
fn expect_error(what: &str, run: &Run, code: i32) -> Result<String, String> {
    if run.code == Some(101) || run.stderr.contains("panicked") || run.timed_out {
        return Err(format!("{what}: panicked or hung: {}", run.describe()));
    }
    if run.code != Some(code) {
        return Err(format!(
            "{what}: expected exit {code}, got {}",
            run.describe()
        ));
    }
    let lines: Vec<&str> = run.stderr.lines().collect();
    if lines.len() != 1 || !lines[0].starts_with("error: ") || !run.stderr.ends_with('\n') {
        return Err(format!(
            "{what}: stderr should be one line starting with `error: `, got {:?}",
            run.stderr
        ));
    }
    if !run.stdout.is_empty() {
        return Err(format!(
            "{what}: stdout should be empty, got {:?}",
            run.stdout
        ));
    }
    Ok(lines[0].to_string())
}

/// A Python fixture; killed and reaped when dropped.
struct Target {
    /// None once taken by `take_child`.
    child: Option<Child>,
    pid: i32,
    lines: Receiver<String>,
    stderr: Option<JoinHandle<String>>,
}

impl Target {
    fn spawn(interp: &Interpreter, script: &Path, args: &[String]) -> Result<Target, String> {
        let f = common::start_fixture(interp, script, args, false)?;
        Ok(Target {
            child: Some(f.child),
            pid: f.pid,
            lines: f.lines,
            stderr: Some(f.stderr),
        })
    }

    fn wait_ready(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + READY_TIMEOUT;
        let mut before = Vec::new();
        loop {
            match self
                .lines
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            {
                Ok(line) if line == "ready" => return Ok(()),
                Ok(line) => before.push(line),
                Err(e) => {
                    self.kill();
                    let err = self.stderr.take().map(|h| h.join().unwrap_or_default());
                    let why = match e {
                        RecvTimeoutError::Timeout => format!("no `ready` within {READY_TIMEOUT:?}"),
                        RecvTimeoutError::Disconnected => "exited before `ready`".into(),
                    };
                    return Err(format!(
                        "fixture: {why}; stdout {before:?}; stderr:\n{}",
                        err.unwrap_or_default()
                    ));
                }
            }
        }
    }
}

impl Target {
    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Hands the process over (to be waited for elsewhere); dropping the Target then kills
    /// nothing.
    fn take_child(&mut self) -> Child {
        self.child.take().expect("child already taken")
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        self.kill();
    }
}

fn start(interp: &Interpreter, script: &str) -> Result<Target, String> {
    let mut t = Target::spawn(interp, &common::fixture(script), &[])?;
    t.wait_ready()?;
    Ok(t)
}

/// Runs `case` on every interpreter, catching panics; fails at the end with all failures.
fn for_each_interpreter(test: &str, case: impl Fn(&Interpreter) -> Result<(), String>) {
    let mut failures = Vec::new();
    let mut ran = Vec::new();
    for interp in common::interpreters() {
        ran.push(interp.label.clone());
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| case(&interp)));
        match r {
            Ok(Ok(())) => {}
            Ok(Err(e)) => failures.push(format!("[{}] {e}", interp.label)),
            Err(p) => failures.push(format!(
                "[{}] test panicked: {:?}",
                interp.label,
                p.downcast_ref::<String>()
                    .map(String::as_str)
                    .or(p.downcast_ref::<&str>().copied())
            )),
        }
    }
    println!("{test}: ran on {ran:?}");
    assert!(
        failures.is_empty(),
        "{test}: {} failure(s):\n{}",
        failures.len(),
        failures.join("\n")
    );
}

// ---------------------------------------------------------------------------------------

#[test]
fn no_such_process() {
    let mut failures = Vec::new();
    // A PID that existed a moment ago: a `true` that exited and was reaped.
    let mut gone = None;
    for _ in 0..20 {
        let mut c = Command::new("true").spawn().expect("spawn true");
        let pid = c.id() as i32;
        c.wait().expect("wait true");
        if !Path::new(&format!("/proc/{pid}")).exists() {
            gone = Some(pid);
            break;
        }
    }
    let gone = gone.expect("every reaped PID was reused at once");
    // A PID the kernel cannot hand out.
    let pid_max: i64 = std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(4_194_304);
    let mut pids = vec![gone as i64];
    if pid_max < i32::MAX as i64 {
        pids.push(pid_max + 1);
    }
    for pid in pids {
        let run = dump(&["dump", &pid.to_string(), "--json"]);
        match expect_error(&format!("dump {pid}"), &run, 3) {
            Ok(line) if line.contains(&pid.to_string()) => {}
            Ok(line) => failures.push(format!(
                "dump {pid}: the message does not name the PID: {line:?}"
            )),
            Err(e) => failures.push(e),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn not_a_python_process() {
    let mut child = Command::new("sleep")
        .arg("100")
        .spawn()
        .expect("spawn sleep");
    let pid = child.id() as i32;
    // Wait until the child has exec'd sleep (before that it is a copy of this test binary).
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::fs::read_link(format!("/proc/{pid}/exe"))
        .map(|p| !p.to_string_lossy().contains("sleep"))
        .unwrap_or(true)
    {
        assert!(Instant::now() < deadline, "sleep never exec'd");
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut failures = Vec::new();
    for args in [
        vec!["dump", "PID"],
        vec!["dump", "PID", "--json"],
        vec!["dump", "PID", "--nonblocking"],
    ] {
        let pid_s = pid.to_string();
        let args: Vec<&str> = args
            .iter()
            .map(|a| if *a == "PID" { pid_s.as_str() } else { a })
            .collect();
        let run = dump(&args);
        match expect_error(&args.join(" "), &run, 4) {
            Ok(line) if line.contains("not a Python process") && line.contains(&pid_s) => {}
            Ok(line) => failures.push(format!(
                "{}: the message should name the PID and say it is not a Python process: {line:?}",
                args.join(" ")
            )),
            Err(e) => failures.push(e),
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Copies the binary somewhere an unprivileged user may execute it.
fn world_executable_copy() -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let dir = std::env::temp_dir().join(format!("scalene-rs-perm-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let bin = dir.join("scalene-rs");
    std::fs::copy(BIN, &bin).unwrap();
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    bin
}

/// The unprivileged user the permission tests run the profiler as.
fn test_user() -> Result<(String, u32), String> {
    common::users::test_user().map(|(name, uid, _)| (name, uid))
}

use common::users::setpriv_missing;

/// The profiler run by an unprivileged user (through `setpriv`, as root) against a
/// root-owned Python process: the kernel's own EPERM, and the message must say what is
/// missing and how to get it.
#[test]
fn permission_denied() {
    const TEST: &str = "permission_denied";
    if !nix::unistd::geteuid().is_root() {
        return common::skip_or_fail(
            TEST,
            &format!(
                "not running as root (euid {}); the case needs a root-owned Python process and \
                 an unprivileged user to dump it",
                nix::unistd::geteuid()
            ),
        );
    }
    let (user, uid) = match test_user() {
        Ok(u) => u,
        Err(why) => return common::skip_or_fail(TEST, &why),
    };
    if let Some(why) = setpriv_missing() {
        return common::skip_or_fail(TEST, &why);
    }
    let bin = world_executable_copy();
    let bin_s = bin.to_string_lossy().into_owned();
    for_each_interpreter(TEST, |interp| {
        let target = start(interp, "dump_recursion.py")?;
        let pid = target.pid.to_string();
        for sub in ["dump", "attach"] {
            let mut cmd = Command::new("setpriv");
            cmd.args([
                &format!("--reuid={user}"),
                &format!("--regid={user}"),
                "--init-groups",
                "--",
                &bin_s,
                sub,
                &pid,
            ])
            .current_dir("/");
            if sub == "attach" {
                cmd.args(["--duration", "1"]);
            }
            let run = run_cmd(cmd);
            let what = format!("{sub} {pid} as {user} (uid {uid})");
            let line = expect_error(&what, &run, 5)?;
            let names_capability =
                line.contains("CAP_SYS_PTRACE") || line.to_lowercase().contains("ptrace");
            let has_fix =
                line.contains("sudo") || line.contains("root") || line.contains("--cap-add");
            if !line.contains(&pid) || !names_capability || !has_fix {
                return Err(format!(
                    "{what}: the message should name the PID, the missing permission \
                     (CAP_SYS_PTRACE / ptrace) and a fix: {line:?}"
                ));
            }
        }
        Ok(())
    });
    let _ = std::fs::remove_dir_all(bin.parent().unwrap());
}

/// Root without CAP_SYS_PTRACE (as in a container started without `--cap-add SYS_PTRACE`):
/// `setpriv` drops it from the bounding set, so the dump runs with every other capability
/// but that one, against a root-owned target whose capabilities it no longer covers.
#[test]
fn permission_denied_without_cap_sys_ptrace() {
    const TEST: &str = "permission_denied_without_cap_sys_ptrace";
    if !nix::unistd::geteuid().is_root() {
        return common::skip_or_fail(TEST, "not running as root");
    }
    if let Some(why) = setpriv_missing() {
        return common::skip_or_fail(TEST, &format!("cannot drop CAP_SYS_PTRACE: {why}"));
    }
    for_each_interpreter("permission_denied_without_cap_sys_ptrace", |interp| {
        let target = start(interp, "dump_recursion.py")?;
        let pid = target.pid.to_string();
        for sub in ["dump", "attach"] {
            let mut cmd = Command::new("setpriv");
            cmd.args([
                "--inh-caps=-sys_ptrace",
                "--bounding-set=-sys_ptrace",
                "--",
                BIN,
                sub,
                &pid,
            ]);
            if sub == "attach" {
                cmd.args(["--duration", "1"]);
            }
            let run = run_cmd(cmd);
            let line = expect_error(&format!("{sub} {pid} without CAP_SYS_PTRACE"), &run, 5)?;
            if !(line.contains(&pid)
                && line.contains("without CAP_SYS_PTRACE")
                && line.contains("--cap-add SYS_PTRACE")
                && line.contains("from the host"))
            {
                return Err(format!(
                    "the message should say CAP_SYS_PTRACE is missing and how to grant it: {line:?}"
                ));
            }
            if line.contains("sudo") {
                return Err(format!("we are root already; `sudo` is no fix: {line:?}"));
            }
        }
        Ok(())
    });
}

/// Makes `cmd` run under a seccomp filter that answers EPERM to `syscalls`, as a
/// container's profile does to what it does not allow.
#[cfg(target_arch = "x86_64")]
fn deny_with_eperm(cmd: &mut Command, syscalls: &[libc::c_long]) {
    use std::os::unix::process::CommandExt;
    const LD_W_ABS: u16 = 0x20;
    const JEQ_K: u16 = 0x15;
    const RET_K: u16 = 0x06;
    const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;
    const RET_ALLOW: u32 = 0x7fff_0000;
    const RET_ERRNO: u32 = 0x0005_0000;
    let op = |code, jt, jf, k| libc::sock_filter { code, jt, jf, k };
    // seccomp_data: nr at offset 0, arch at 4. Another architecture: allowed untouched.
    let n = syscalls.len() as u8;
    let mut prog = vec![
        op(LD_W_ABS, 0, 0, 4),
        op(JEQ_K, 1, 0, AUDIT_ARCH_X86_64),
        op(RET_K, 0, 0, RET_ALLOW),
        op(LD_W_ABS, 0, 0, 0),
    ];
    for (i, &nr) in syscalls.iter().enumerate() {
        // Equal: jump to the EPERM return after the remaining tests and the ALLOW.
        prog.push(op(JEQ_K, n - i as u8, 0, nr as u32));
    }
    prog.push(op(RET_K, 0, 0, RET_ALLOW));
    prog.push(op(RET_K, 0, 0, RET_ERRNO | libc::EPERM as u32));
    // SAFETY: the closure runs in the child between fork and exec and makes only two prctl
    // calls on memory (`prog`, `fprog`) that the closure owns.
    unsafe {
        cmd.pre_exec(move || {
            let fprog = libc::sock_fprog {
                len: prog.len() as u16,
                filter: prog.as_ptr() as *mut libc::sock_filter,
            };
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
                || libc::prctl(
                    libc::PR_SET_SECCOMP,
                    libc::SECCOMP_MODE_FILTER,
                    &fprog as *const libc::sock_fprog,
                ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Under a seccomp filter (a container's default profile without `--cap-add SYS_PTRACE`):
/// with process_vm_readv refused, memory is read through /proc/PID/mem; with ptrace refused
/// too, pausing fails with exit 5 and a message that names the filter and the fix, while
/// `--nonblocking` (no ptrace) still works; with ptrace alone refused, `attach --native`
/// fails the same way before recording.
#[cfg(target_arch = "x86_64")]
#[test]
fn seccomp_filtered_profiler() {
    for_each_interpreter("seccomp_filtered_profiler", |interp| {
        let target = start(interp, "dump_recursion.py")?;
        let pid = target.pid.to_string();
        let frames = |run: &Run, what: &str| -> Result<(), String> {
            let v: serde_json::Value = serde_json::from_str(&run.stdout)
                .map_err(|e| format!("{what}: {e}; {}", run.describe()))?;
            let any = v["threads"].as_array().is_some_and(|t| {
                t.iter()
                    .any(|t| t["frames"].as_array().is_some_and(|f| !f.is_empty()))
            });
            if run.code != Some(0) || !any {
                return Err(format!("{what}: no stack read; {}", run.describe()));
            }
            Ok(())
        };
        let mut cmd = Command::new(BIN);
        cmd.args(["dump", &pid, "--json"]);
        deny_with_eperm(&mut cmd, &[libc::SYS_process_vm_readv]);
        frames(&run_cmd(cmd), "dump, process_vm_readv refused")?;

        let both = [libc::SYS_process_vm_readv, libc::SYS_ptrace];
        let mut cmd = Command::new(BIN);
        cmd.args(["dump", &pid, "--json", "--nonblocking"]);
        deny_with_eperm(&mut cmd, &both);
        frames(
            &run_cmd(cmd),
            "dump --nonblocking, process_vm_readv and ptrace refused",
        )?;

        let mut cmd = Command::new(BIN);
        cmd.args(["dump", &pid]);
        deny_with_eperm(&mut cmd, &both);
        let run = run_cmd(cmd);
        let line = expect_error("dump, process_vm_readv and ptrace refused", &run, 5)?;
        if !(line.contains("seccomp") && line.contains("--cap-add SYS_PTRACE")) {
            return Err(format!(
                "the message should name the seccomp filter and the fix: {line:?}"
            ));
        }

        // Memory readable, threads not stoppable: `attach --native` is refused before it
        // records (it would stop the threads at every sample), the same way.
        let mut cmd = Command::new(BIN);
        cmd.args(["attach", "--native", "--cpu-only", "--duration", "1", &pid]);
        deny_with_eperm(&mut cmd, &[libc::SYS_ptrace]);
        let run = run_cmd(cmd);
        let line = expect_error("attach --native, ptrace refused", &run, 5)?;
        if !(line.contains("seccomp") && line.contains("--cap-add SYS_PTRACE")) {
            return Err(format!(
                "attach --native: the message should name the seccomp filter and the fix: {line:?}"
            ));
        }
        Ok(())
    });
}

#[test]
fn unsupported_version_override() {
    for_each_interpreter("unsupported_version_override", |interp| {
        let target = start(interp, "dump_recursion.py")?;
        let pid = target.pid.to_string();
        for extra in [&["--json"][..], &[][..]] {
            let mut args = vec!["dump", pid.as_str(), "--python-version", "3.5"];
            args.extend_from_slice(extra);
            let run = dump(&args);
            let line = expect_error(&args.join(" "), &run, 6)?;
            if !(line.contains("3.5") && line.contains("2.7") && line.contains("3.13")) {
                return Err(format!(
                    "the message should name 3.5 and the supported versions (2.7 ... 3.13): {line:?}"
                ));
            }
        }
        Ok(())
    });
}

#[test]
fn usage_errors() {
    let mut failures = Vec::new();
    let cases: &[&[&str]] = &[
        &["dump"],
        &["dump", "--json"],
        &["dump", "abc"],
        &["dump", "12abc"],
        &["dump", "1.5"],
        &["dump", "-5"],
        &["dump", "99999999999999999999"],
        &["dump", "1", "--no-such-option"],
        &["dump", "1", "2"],
        &["dump", "1", "--python-version", "three"],
        &[],
        &["no-such-command"],
    ];
    for args in cases {
        let run = dump(args);
        let what = format!("scalene-rs {}", args.join(" "));
        if run.code == Some(101) || run.stderr.contains("panicked") || run.timed_out {
            failures.push(format!("{what}: panicked or hung: {}", run.describe()));
        } else if run.code != Some(2) {
            failures.push(format!(
                "{what}: expected exit 2 (usage), got {}",
                run.describe()
            ));
        } else if run.stderr.trim().is_empty() {
            failures.push(format!("{what}: exit 2 without a message"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

use common::Rng;

/// Dumps of processes that exit on their own a few to tens of milliseconds after `ready`:
/// each dump must succeed (0), find the process gone (3) or see it exit during the read (7),
/// with a one-line error; never panic, never another code.
#[test]
fn exiting_processes() {
    let interps = common::interpreters();
    let script = common::fixture("dump_short_lived.py");
    let seed = 0x5ca1e_u64;
    let mut rng = Rng(seed);
    let mut failures = Vec::new();
    let mut outcomes: std::collections::BTreeMap<Option<i32>, usize> = Default::default();
    for round in 0..EXITING_ROUNDS {
        let interp = &interps[round % interps.len()];
        let lifetime_ms = rng.below(40);
        let threads = rng.below(4);
        let how = if rng.below(2) == 0 { "exit" } else { "_exit" };
        let delay_us = rng.below(lifetime_ms * 1000 + 1);
        let mode: &[&str] = match rng.below(3) {
            0 => &["--json"],
            1 => &["--json", "--nonblocking"],
            _ => &[],
        };
        let what = format!(
            "round {round} [{}] lifetime {lifetime_ms} ms, {threads} threads, {how}, dump after {delay_us} us, {mode:?}",
            interp.label
        );
        let mut target = match Target::spawn(
            interp,
            &script,
            &[
                lifetime_ms.to_string(),
                threads.to_string(),
                how.to_string(),
            ],
        ) {
            Ok(t) => t,
            Err(e) => {
                failures.push(format!("{what}: {e}"));
                continue;
            }
        };
        if let Err(e) = target.wait_ready() {
            failures.push(format!("{what}: {e}"));
            continue;
        }
        // Reap the process as soon as it exits, so that the dump may find it gone entirely.
        let pid = target.pid;
        let mut child = target.take_child();
        let reaper = std::thread::spawn(move || child.wait());
        std::thread::sleep(Duration::from_micros(delay_us));
        let pid_s = pid.to_string();
        let mut args = vec!["dump", pid_s.as_str()];
        args.extend_from_slice(mode);
        let run = dump(&args);
        *outcomes.entry(run.code).or_default() += 1;
        match run.code {
            Some(0) if !run.timed_out && !run.stderr.contains("panicked") => {
                if mode.contains(&"--json") {
                    if let Err(e) = serde_json::from_str::<serde_json::Value>(&run.stdout) {
                        failures.push(format!(
                            "{what}: exit 0 with invalid JSON ({e}): {:?}",
                            run.stdout
                        ));
                    }
                }
            }
            Some(3) | Some(7) => {
                if let Err(e) = expect_error(&what, &run, run.code.unwrap()) {
                    failures.push(e);
                }
            }
            _ => failures.push(format!(
                "{what}: expected exit 0, 3 or 7, got {}",
                run.describe()
            )),
        }
        // The fixture exits by itself within 40 ms; if it did not, kill it.
        let deadline = Instant::now() + Duration::from_secs(10);
        while !reaper.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        if !reaper.is_finished() {
            failures.push(format!("{what}: the fixture did not exit by itself"));
            // SAFETY: kill takes plain integers; pid is our own child, not reaped yet.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        let _ = reaper.join();
    }
    println!("exiting_processes: seed {seed:#x}, {EXITING_ROUNDS} dumps over {:?}; exit codes: {outcomes:?}",
        interps.iter().map(|i| &i.label).collect::<Vec<_>>());
    assert!(
        failures.is_empty(),
        "{} failure(s):\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// A free-threaded build has no GIL: `attach --gil` is refused with one line naming it (exit
/// 6), `run --gil` runs the program unsampled and says why, and `dump` says what the build
/// is (in its JSON only for such a build).
#[test]
fn gil_questions_to_a_free_threaded_build() {
    let mut free_threaded = 0;
    for_each_interpreter("gil_questions_to_a_free_threaded_build", |interp| {
        let target = start(interp, "dump_recursion.py")?;
        let pid = target.pid.to_string();
        let run = dump(&["dump", pid.as_str(), "--json"]);
        if run.code != Some(0) {
            return Err(format!("dump --json: {}", run.describe()));
        }
        let said = run.stdout.contains("\"free_threaded\": true")
            || run.stdout.contains("\"free_threaded\":true");
        if said != interp.free_threaded {
            return Err(format!(
                "dump --json says free_threaded {said}, the build is {}",
                interp.free_threaded
            ));
        }
        if !interp.free_threaded {
            return Ok(());
        }
        let text = dump(&["dump", pid.as_str()]);
        if !text.stdout.contains("free-threaded build (no GIL)") {
            return Err(format!("dump does not name the build: {}", text.stdout));
        }
        let args = ["attach", pid.as_str(), "--gil", "--duration", "1"];
        let line = expect_error(&args.join(" "), &dump(&args), 6)?;
        if !(line.contains("--gil") && line.contains("free-threaded")) {
            return Err(format!("the message should say why: {line:?}"));
        }
        // `run --gil`: the program runs as it would (its output, its exit status), not
        // sampled, and the report says why.
        let mut cmd = Command::new(BIN);
        cmd.args(["run", "--gil", "--"])
            .arg(&interp.path)
            .args(["-c", "import sys; print('hi'); sys.exit(4)"]);
        let run = run_cmd(cmd);
        if run.code != Some(4) || run.stdout != "hi\n" {
            return Err(format!("run --gil changed the program: {}", run.describe()));
        }
        if !run.stderr.contains("not profiled: --gil") {
            return Err(format!("run --gil does not say why: {:?}", run.stderr));
        }
        Ok(())
    });
    for interp in common::interpreters() {
        free_threaded += usize::from(interp.free_threaded);
    }
    println!("{free_threaded} free-threaded interpreter(s) refused --gil");
}
