//! `scalene-rs top` end to end, in a real terminal: tmux (Debian's package) runs it in a
//! pane of its own server, `capture-pane` reads the screen, `send-keys` presses the keys,
//! and `#{alternate_on}` / `#{cursor_flag}` tell whether the terminal was given back.
//!
//! On each representative interpreter (common::representatives):
//! - `top -- COMMAND` on fixtures/cpu/split.py shows its two hot lines with their shares
//!   within 5 s, the keys change the sort and the view, and `q` restores the terminal.
//! - `top PID` shows the same; its since-start figures equal those of the profile `-o`
//!   writes for the same recording (±5 points); SIGTERM to `top` restores the terminal;
//!   the process runs on and ends as it would have (exit 0, its output whole).
//! - A command's child processes show with it (fixtures/procs/subproc.py); a process that
//!   execs is one process (fixtures/procs/execs.py).
//! - Ctrl-C and SIGHUP restore the terminal too (one interpreter of each major version).
//!
//! On one interpreter of each major version: a command that exits leaves its last screen
//! up, saying "exited (code N)", until a key; `--exit-on-end` ends with it; either way
//! `top` exits with the command's code.
//!
//! On one interpreter: `top PID --subprocesses` on a bash script (not Python) says so in
//! its header and shows the hot line of the Python the script starts.

mod common;

use common::{bin, fixture, mark, tempdir, Interpreter};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// How long the hot lines may take to show, from the start of `top` (the issue's bar).
const HOT_LINE_WITHIN: Duration = Duration::from_secs(5);

/// A tmux server of our own (its own socket: tests side by side never share one), with
/// one pane. Its shell runs `top`, then prints `top-exit=CODE` and stays, so the exit code
/// and the terminal's modes can be read afterwards.
struct Pane {
    socket: String,
}

impl Pane {
    /// Starts `top` (a shell command line) in a `width` x `height` pane.
    fn start(top: &str, width: u32, height: u32) -> Result<Pane, String> {
        let socket = format!("scalene-rs-top-{}-{}", std::process::id(), unique());
        let pane = Pane { socket };
        let (w, h) = (width.to_string(), height.to_string());
        let command = format!("{top}; echo top-exit=$?; exec sleep 600");
        pane.tmux(&[
            "-f",
            "/dev/null",
            "new-session",
            "-d",
            "-s",
            "t",
            "-x",
            &w,
            "-y",
            &h,
            &command,
        ])?;
        Ok(pane)
    }

    /// The pid of `top`: the pane's shell's child.
    fn top_pid(&self) -> Result<i32, String> {
        let shell = self.format("#{pane_pid}");
        let children = std::fs::read_to_string(format!("/proc/{shell}/task/{shell}/children"))
            .map_err(|e| format!("the pane's shell {shell}: {e}"))?;
        children
            .split_whitespace()
            .next()
            .and_then(|p| p.parse().ok())
            .ok_or_else(|| format!("the pane's shell {shell} has no child"))
    }

    fn tmux(&self, args: &[&str]) -> Result<String, String> {
        let out = Command::new("tmux")
            .arg("-L")
            .arg(&self.socket)
            .args(args)
            .output()
            .map_err(|e| format!("tmux: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "tmux {args:?}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    fn screen(&self) -> String {
        self.tmux(&["capture-pane", "-p", "-t", "t"])
            .unwrap_or_default()
    }

    fn format(&self, f: &str) -> String {
        self.tmux(&["display-message", "-p", "-t", "t", f])
            .unwrap_or_default()
            .trim()
            .to_string()
    }

    fn keys(&self, keys: &str) -> Result<(), String> {
        self.tmux(&["send-keys", "-t", "t", keys]).map(|_| ())
    }

    /// Waits until `pred` holds for the screen, up to `limit`: the screen it held on.
    fn wait_for(&self, limit: Duration, pred: impl Fn(&str) -> bool) -> Result<String, String> {
        let until = Instant::now() + limit;
        loop {
            let s = self.screen();
            if pred(&s) {
                return Ok(s);
            }
            if Instant::now() >= until {
                return Err(format!("not within {limit:?}; the screen:\n{s}"));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `top`'s exit code once it ended, within `limit`.
    fn exit_status(&self, limit: Duration) -> Result<i32, String> {
        let s = self.wait_for(limit, |s| s.contains("top-exit="))?;
        let code = s
            .split("top-exit=")
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .and_then(|c| c.parse().ok());
        code.ok_or_else(|| format!("no exit code on the screen:\n{s}"))
    }

    /// Whether the terminal was given back: the normal screen, the cursor shown.
    fn restored(&self) -> Result<(), String> {
        let (alt, cursor) = (
            self.format("#{alternate_on}"),
            self.format("#{cursor_flag}"),
        );
        if alt == "0" && cursor == "1" {
            Ok(())
        } else {
            Err(format!("alternate_on={alt} cursor_flag={cursor}"))
        }
    }
}

impl Drop for Pane {
    fn drop(&mut self) {
        let _ = self.tmux(&["kill-server"]);
    }
}

fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

/// Whether tmux is there (tools/setup.sh installs it); if not, says so or fails in CI.
fn have_tmux(test: &str) -> bool {
    match Command::new("tmux").arg("-V").output() {
        Ok(o) if o.status.success() => true,
        _ => {
            common::skip_or_fail(test, "tmux is not installed (tools/setup.sh installs it)");
            false
        }
    }
}

/// A shell word.
fn quote(p: &Path) -> String {
    format!("'{}'", p.display().to_string().replace('\'', r"'\''"))
}

/// The Total% of the row of `file:line` on `screen` (the first number after the file:line
/// and function columns), when that row is there.
fn share(screen: &str, file_line: &str) -> Option<f64> {
    let row = screen.lines().find(|l| {
        l.split_whitespace()
            .next()
            .is_some_and(|w| w.ends_with(file_line))
    })?;
    row.split_whitespace().nth(2)?.parse().ok()
}

/// The lines of fixtures/cpu/split.py: the Python one and the native one.
fn split_lines() -> (PathBuf, String, String) {
    let f = fixture("cpu/split.py");
    let py = format!("split.py:{}", mark(&f, "python"));
    let nat = format!("split.py:{}", mark(&f, "native"));
    (f, py, nat)
}

/// Both hot lines on the screen with a share each between 25% and 75% (the fixture gives
/// each about half: the window of one refresh is noisy, the bar is that they show).
fn both_hot(screen: &str, py: &str, nat: &str) -> bool {
    let ok = |l| share(screen, l).is_some_and(|s| (25.0..=75.0).contains(&s));
    ok(py) && ok(nat)
}

fn command_case(py: &Interpreter) -> Result<String, String> {
    let (f, py_line, nat_line) = split_lines();
    let dir = tempdir("scalene-rs-top");
    let out = dir.join("command.out");
    let cmd = format!(
        "{} top --refresh 0.5 --command-output {} -- {} {} 60",
        bin(),
        quote(&out),
        quote(&py.path),
        quote(&f)
    );
    let began = Instant::now();
    let pane = Pane::start(&cmd, 160, 40)?;
    let s = pane.wait_for(HOT_LINE_WITHIN, |s| both_hot(s, &py_line, &nat_line))?;
    let shown_in = began.elapsed();
    if !s.contains("sort Total%") {
        return Err(format!("the sort is not Total% at first:\n{s}"));
    }
    // `s` sorts by the next column; `v` shows functions.
    pane.keys("s")?;
    pane.wait_for(Duration::from_secs(3), |s| {
        s.contains("sort ") && !s.contains("sort Total%")
    })?;
    pane.keys("v")?;
    pane.wait_for(Duration::from_secs(3), |s| s.contains("view functions"))?;
    pane.keys("q")?;
    let code = pane.exit_status(Duration::from_secs(15))?;
    pane.restored()?;
    if code != 0 {
        return Err(format!("top exited {code} after q"));
    }
    Ok(format!(
        "hot lines in {shown_in:.1?}; q restored the terminal"
    ))
}

fn pid_case(py: &Interpreter) -> Result<String, String> {
    let (f, py_line, nat_line) = split_lines();
    let mut target = common::start_fixture(py, &f, &["12"], false)?;
    // Its interpreter up (a chrooted one starts through a wrapper): `dump` reads it.
    let until = Instant::now() + Duration::from_secs(10);
    while !Command::new(bin())
        .args(["dump", &target.pid.to_string()])
        .output()
        .is_ok_and(|o| o.status.success())
    {
        if Instant::now() >= until {
            let _ = target.child.kill();
            return Err("the fixture's interpreter did not come up within 10 s".into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let dir = tempdir("scalene-rs-top");
    let json = dir.join("top.json");
    let cmd = format!(
        "{} top {} --refresh 0.5 -o {}",
        bin(),
        target.pid,
        quote(&json)
    );
    let result = (|| {
        let began = Instant::now();
        let pane = Pane::start(&cmd, 160, 40)?;
        pane.wait_for(HOT_LINE_WITHIN, |s| both_hot(s, &py_line, &nat_line))?;
        let shown_in = began.elapsed();
        // Since start: the figures the profile written at the end has, short of the last
        // refresh's half second.
        pane.keys("w")?;
        std::thread::sleep(Duration::from_secs(3));
        let s = pane.wait_for(Duration::from_secs(3), |s| s.contains("since start"))?;
        let shown = (share(&s, &py_line), share(&s, &nat_line));
        let top_pid = pane.top_pid()?;
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(top_pid),
            nix::sys::signal::Signal::SIGTERM,
        )
        .map_err(|e| format!("SIGTERM to top: {e}"))?;
        let code = pane.exit_status(Duration::from_secs(20))?;
        pane.restored()?;
        if code != 0 {
            return Err(format!("top exited {code} after SIGTERM"));
        }
        Ok((shown, shown_in))
    })();
    // The target runs on to its end, unharmed.
    let alive = nix::sys::signal::kill(nix::unistd::Pid::from_raw(target.pid), None).is_ok();
    let status = target.child.wait().map_err(|e| e.to_string())?;
    // Every line, to the end of its stdout (the reader thread may still be passing them on).
    let mut stdout = Vec::new();
    while let Ok(l) = target.lines.recv_timeout(Duration::from_secs(5)) {
        stdout.push(l);
    }
    let ((py_shown, nat_shown), shown_in) = result?;
    if !alive {
        return Err("the target did not survive top".into());
    }
    if !status.success() || !stdout.iter().any(|l| l.starts_with("truth ")) {
        return Err(format!("the target ended {status}, its output: {stdout:?}"));
    }
    // The screen against the profile of the same recording.
    let text = std::fs::read_to_string(&json).map_err(|e| format!("{}: {e}", json.display()))?;
    let profile: serde_json::Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
    let line_pct = |fl: &str| -> Option<f64> {
        let (_, n) = fl.rsplit_once(':')?;
        let l = common::profile_line(&profile, "split.py", n.parse().ok()?)?;
        Some(
            ["cpu_python_pct", "cpu_native_pct", "cpu_system_pct"]
                .iter()
                .map(|k| l[*k].as_f64().unwrap_or(0.0))
                .sum(),
        )
    };
    let mut said = Vec::new();
    for (fl, shown) in [(&py_line, py_shown), (&nat_line, nat_shown)] {
        let (Some(shown), Some(saved)) = (shown, line_pct(fl)) else {
            return Err(format!("{fl}: on screen {shown:?}, in the profile none"));
        };
        if (shown - saved).abs() > 5.0 {
            return Err(format!(
                "{fl}: {shown:.1}% on screen, {saved:.1}% in the profile"
            ));
        }
        said.push(format!("{fl} {shown:.1}% ~ {saved:.1}%"));
    }
    Ok(format!(
        "hot lines in {shown_in:.1?}; since start {}; SIGTERM restored the terminal; the \
         target ran on",
        said.join(", ")
    ))
}

#[test]
fn top_of_a_command_shows_its_hot_lines_and_q_restores_the_terminal() {
    if !have_tmux("top_of_a_command") {
        return;
    }
    common::for_each_representative(command_case);
}

#[test]
fn top_of_a_pid_matches_its_profile_and_leaves_it_running() {
    if !have_tmux("top_of_a_pid") {
        return;
    }
    common::for_each_representative(pid_case);
}

/// A script that computes for `secs` seconds, then exits with `code`.
fn exiting_script(dir: &Path, secs: f64, code: i32) -> PathBuf {
    let path = dir.join("exits.py");
    std::fs::write(
        &path,
        format!(
            "import sys, time\nend = time.time() + {secs}\nx = 0\nwhile time.time() < end:\n    \
             x += 1\nsys.exit({code})\n"
        ),
    )
    .unwrap();
    path
}

fn exit_case(py: &Interpreter) -> Result<String, String> {
    let dir = tempdir("scalene-rs-top");
    let script = exiting_script(&dir, 1.5, 3);
    // The last screen stays, saying so, until a key.
    let cmd = format!(
        "{} top --refresh 0.5 -- {} {}",
        bin(),
        quote(&py.path),
        quote(&script)
    );
    let pane = Pane::start(&cmd, 120, 30)?;
    pane.wait_for(Duration::from_secs(15), |s| s.contains("exited (code 3)"))?;
    std::thread::sleep(Duration::from_millis(700));
    if pane.screen().contains("top-exit=") {
        return Err("top ended without waiting for a key".into());
    }
    pane.keys("x")?;
    let code = pane.exit_status(Duration::from_secs(10))?;
    pane.restored()?;
    if code != 3 {
        return Err(format!("top exited {code}, the command 3"));
    }
    // --exit-on-end: at once, with the command's code.
    let cmd = format!(
        "{} top --exit-on-end --refresh 0.5 -- {} {}",
        bin(),
        quote(&py.path),
        quote(&script)
    );
    let pane = Pane::start(&cmd, 120, 30)?;
    let code = pane.exit_status(Duration::from_secs(15))?;
    pane.restored()?;
    if code != 3 {
        return Err(format!("--exit-on-end: top exited {code}, the command 3"));
    }
    Ok("exited (code 3) until a key; --exit-on-end ends with it".into())
}

fn children_case(py: &Interpreter) -> Result<String, String> {
    let parent = fixture("procs/subproc.py");
    let child = fixture("procs/child.py");
    let text = std::fs::read_to_string(&child).map_err(|e| e.to_string())?;
    let line = text
        .lines()
        .position(|l| l.contains("# HOT: child"))
        .ok_or("child.py has no HOT line")?
        + 1;
    let hot = format!("child.py:{line}");
    let cmd = format!(
        "{} top --refresh 0.5 -- {} {} 30",
        bin(),
        quote(&py.path),
        quote(&parent)
    );
    let pane = Pane::start(&cmd, 160, 40)?;
    // The child's line, and both processes in the header.
    let s = pane.wait_for(Duration::from_secs(10), |s| {
        share(s, &hot).is_some() && s.contains("2 processes")
    })?;
    pane.keys("q")?;
    let code = pane.exit_status(Duration::from_secs(15))?;
    pane.restored()?;
    if code != 0 {
        return Err(format!("top exited {code} after q\n{s}"));
    }
    let said = format!(
        "{hot} at {:.1}% with 2 processes",
        share(&s, &hot).unwrap_or(0.0)
    );
    // One process that computes, then execs: one pid, so one process in the header (its
    // image before the exec has samples of its own: 1 s of CPU on execs.py).
    let cmd = format!(
        "{} top --refresh 0.5 -- {} {} 1",
        bin(),
        quote(&py.path),
        quote(&fixture("procs/execs.py"))
    );
    let pane = Pane::start(&cmd, 160, 40)?;
    let s = pane.wait_for(Duration::from_secs(10), |s| share(s, &hot).is_some())?;
    pane.keys("q")?;
    pane.exit_status(Duration::from_secs(15))?;
    pane.restored()?;
    if s.contains(" processes") {
        return Err(format!("one pid that exec'd counted as several:\n{s}"));
    }
    Ok(said)
}

/// One interpreter of each major version is enough for what does not depend on reading it.
fn one_of_each_major() -> Vec<Interpreter> {
    let mut some: Vec<Interpreter> = Vec::new();
    for py in common::representatives() {
        if !some.iter().any(|s| s.major == py.major) {
            some.push(py);
        }
    }
    some
}

#[test]
fn top_of_a_command_that_exits_waits_for_a_key_or_ends_with_it() {
    if !have_tmux("top_of_a_command_that_exits") {
        return;
    }
    let some = one_of_each_major();
    for py in &some {
        match exit_case(py) {
            Ok(said) => eprintln!("{}: {said}", py.label),
            Err(e) => panic!("{}: {e}", py.label),
        }
    }
}

#[test]
fn top_of_a_command_shows_its_child_processes() {
    if !have_tmux("top_of_a_command_shows_its_child_processes") {
        return;
    }
    common::for_each_representative(children_case);
}

/// Whether process `pid` is gone (or a zombie nobody reaped yet).
fn gone(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |s| {
        s.rsplit(')')
            .next()
            .is_some_and(|r| r.trim_start().starts_with('Z'))
    })
}

#[test]
fn top_ends_when_its_terminal_goes_away() {
    if !have_tmux("top_ends_when_its_terminal_goes_away") {
        return;
    }
    let py = one_of_each_major().pop().expect("a Python 3");
    let f = fixture("cpu/split.py");
    let cmd = format!(
        "{} top --refresh 0.5 -- {} {} 60",
        bin(),
        quote(&py.path),
        quote(&f)
    );
    let pane = Pane::start(&cmd, 120, 30).unwrap();
    pane.wait_for(Duration::from_secs(10), |s| s.contains("samples/s"))
        .unwrap();
    let top = pane.top_pid().unwrap();
    // The window closes: the pty hangs up under it.
    pane.tmux(&["kill-server"]).unwrap();
    let until = Instant::now() + Duration::from_secs(15);
    while !gone(top) && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(50));
    }
    let alive = !gone(top);
    let state = std::fs::read_to_string(format!("/proc/{top}/stat")).unwrap_or_default();
    let wchan = std::fs::read_to_string(format!("/proc/{top}/wchan")).unwrap_or_default();
    if alive {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(top),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    assert!(
        !alive,
        "top {top} still runs 15 s after its terminal went away: {state} in {wchan}"
    );
}

/// `top -- python split.py 60` ended by `end` (Ctrl-C, or a signal to `top`): the terminal
/// is restored and `top` exits within 15 s.
fn ended_by(py: &Interpreter, what: &str, end: impl Fn(&Pane) -> Result<(), String>) {
    let cmd = format!(
        "{} top --refresh 0.5 -- {} {} 60",
        bin(),
        quote(&py.path),
        quote(&fixture("cpu/split.py"))
    );
    let pane = Pane::start(&cmd, 120, 30).unwrap();
    pane.wait_for(Duration::from_secs(10), |s| s.contains("samples/s"))
        .unwrap();
    end(&pane).unwrap();
    let code = pane.exit_status(Duration::from_secs(15));
    let restored = pane.restored();
    assert!(
        code.is_ok() && restored.is_ok(),
        "{}: after {what}: {code:?}, {restored:?}",
        py.label
    );
}

#[test]
fn ctrl_c_and_sighup_restore_the_terminal() {
    if !have_tmux("ctrl_c_and_sighup_restore_the_terminal") {
        return;
    }
    for py in one_of_each_major() {
        ended_by(&py, "Ctrl-C", |p| p.keys("C-c"));
        ended_by(&py, "SIGHUP", |p| {
            nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(p.top_pid()?),
                nix::sys::signal::Signal::SIGHUP,
            )
            .map_err(|e| format!("SIGHUP to top: {e}"))
        });
    }
}

/// `top BASH --subprocesses` on fixtures/procs/later.sh, which starts a busy Python after
/// 0.5 s: the header says the script is not Python, the Python's hot line shows, `q` ends
/// with exit 0. One interpreter: the reading of each is `attach`'s, which
/// tests/subprocesses.rs runs on every representative; here, the view's side.
#[test]
fn top_of_a_bash_script_watches_the_python_it_starts() {
    use std::os::unix::process::CommandExt;
    if !have_tmux("top_of_a_bash_script") {
        return;
    }
    let py = one_of_each_major().pop().expect("a Python 3");
    let busy = fixture("procs/busy.py");
    let hot = format!("busy.py:{}", mark(&busy, "hot"));
    let mut script = Command::new("bash")
        .arg(fixture("procs/later.sh"))
        .arg(&py.path)
        .args(["0.5", "60"])
        .stdout(std::process::Stdio::null())
        .process_group(0)
        .spawn()
        .expect("bash");
    let bash = script.id();
    // CPU only: the header's note is then the line about the script (memory would say
    // its own news there).
    let cmd = format!(
        "{} top {bash} --subprocesses --cpu-only --refresh 0.5",
        bin()
    );
    let result = (|| {
        let pane = Pane::start(&cmd, 160, 40)?;
        let said = format!("process {bash} (bash) is not Python: watching its Python descendants");
        let s = pane.wait_for(Duration::from_secs(15), |s| {
            s.contains(&said) && share(s, &hot).is_some_and(|v| v > 50.0)
        })?;
        pane.keys("q")?;
        let code = pane.exit_status(Duration::from_secs(15))?;
        pane.restored()?;
        if code != 0 {
            return Err(format!("top exited {code} after q\n{s}"));
        }
        Ok(format!("{hot} at {:.1}%", share(&s, &hot).unwrap_or(0.0)))
    })();
    // SAFETY: kill(2) on the process group this test made (the script and its Python).
    unsafe { libc::kill(-(bash as i32), libc::SIGKILL) };
    let _ = script.wait();
    match result {
        Ok(said) => eprintln!("{}: {said}", py.label),
        Err(e) => panic!("{}: {e}", py.label),
    }
}

#[test]
fn top_without_a_terminal_says_to_use_attach() {
    let out = Command::new(bin())
        .args(["top", "1"])
        .output()
        .expect("scalene-rs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    assert!(err.contains("attach"), "{err}");
}
