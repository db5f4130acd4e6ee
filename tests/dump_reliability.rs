//! `scalene-rs dump` must not disturb the process it reads, and must never make frames up.
//!
//! The target is `fixtures/dump_reliability.py`: five threads doing CPU work and I/O with
//! deterministic output, then spinning (recomputing and checking the same values) until the
//! main thread reads `stop` on stdin; it then prints how many recomputed values differed and
//! exits with status 3.
//!
//! `blocking_dumps_do_not_disturb`: 1,000 consecutive `dump --json` (which pause the target)
//! while the threads spin. Every dump exits 0 and is consistent (six threads, the main thread
//! waiting at MARK wait_stop, at most one GIL holder, every frame real: see below); afterwards
//! no thread of the target is stopped or traced; then the target's stdout and exit status
//! must be exactly those of an unprofiled run. This runs on three interpreters, not all:
//! the oldest and the newest found, plus Debian's static /usr/bin/python3.11 (a different
//! build: libpython linked into the executable) — 1,000 dumps each are slow in a debug build.
//!
//! `nonblocking_dumps_are_real`: 200 `dump --json --nonblocking` on every interpreter. Every
//! dump exits 0 (a thread whose stack kept changing may carry an `error` instead of frames)
//! and every frame is real: its file is the fixture or a file of the interpreter's stdlib,
//! its function is the name (3.11+: the qualified name) of a code object compiled from that
//! file (`fixtures/code_names.py` asks the interpreter), its line is within the file. The
//! target's output must again match an unprofiled run.

mod common;

use common::{Interpreter, Run};
use serde::Deserialize;
use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::Path;
use std::process::{Child, ChildStdin, Command};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_scalene-rs");
const BLOCKING_DUMPS: usize = 1000;
const NONBLOCKING_DUMPS: usize = 200;
/// Python threads of the fixture: main and five workers.
const THREADS: usize = 6;
const EXPECTED_EXIT: i32 = 3;
const READY_TIMEOUT: Duration = Duration::from_secs(30);
const EXIT_TIMEOUT: Duration = Duration::from_secs(60);
const DUMP_TIMEOUT: Duration = Duration::from_secs(60);
/// Failures quoted per interpreter (the rest are counted).
const QUOTED: usize = 10;

#[derive(Deserialize, Debug)]
struct Dump {
    pid: i64,
    threads: Vec<DThread>,
}

#[derive(Deserialize, Debug)]
struct DThread {
    thread_id: u64,
    native_id: Option<i64>,
    holds_gil: bool,
    frames: Vec<Frame>,
    #[serde(default)]
    error: Option<String>,
}

#[derive(Deserialize, Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Frame {
    function: String,
    filename: String,
    line: Option<i64>,
}

fn run_bin(args: &[String]) -> Run {
    let mut cmd = Command::new(BIN);
    cmd.args(args);
    common::run_limited(cmd, DUMP_TIMEOUT)
}

/// The fixture process; killed and reaped when dropped.
struct Target {
    child: Child,
    pid: i32,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    stdout: Vec<String>,
    stderr: Option<JoinHandle<String>>,
}

impl Target {
    fn start(interp: &Interpreter) -> Result<Target, String> {
        let script = common::fixture("dump_reliability.py");
        let f = common::start_fixture(interp, &script, &[] as &[&str], true)?;
        let mut t = Target {
            child: f.child,
            pid: f.pid,
            stdin: f.stdin,
            lines: f.lines,
            stdout: Vec::new(),
            stderr: Some(f.stderr),
        };
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            match t
                .lines
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            {
                Ok(line) => {
                    let ready = line == "ready";
                    t.stdout.push(line);
                    if ready {
                        wait_in_read(t.pid);
                        return Ok(t);
                    }
                }
                Err(e) => {
                    let _ = t.child.kill();
                    let _ = t.child.wait();
                    let err = t
                        .stderr
                        .take()
                        .map(|h| h.join().unwrap_or_default())
                        .unwrap_or_default();
                    return Err(format!(
                        "fixture: {} before `ready`; stdout {:?}; stderr:\n{err}",
                        match e {
                            RecvTimeoutError::Timeout => "timed out",
                            RecvTimeoutError::Disconnected => "exited",
                        },
                        t.stdout
                    ));
                }
            }
        }
    }

    /// Sends `stop`, then returns (all stdout lines, exit code, stderr).
    fn stop(mut self) -> Result<(Vec<String>, Option<i32>, String), String> {
        let mut stdin = self.stdin.take().expect("stdin");
        stdin
            .write_all(b"stop\n")
            .and_then(|_| stdin.flush())
            .map_err(|e| format!("cannot write `stop`: {e}"))?;
        drop(stdin);
        let deadline = Instant::now() + EXIT_TIMEOUT;
        loop {
            match self
                .lines
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            {
                Ok(line) => self.stdout.push(line),
                Err(RecvTimeoutError::Disconnected) => break,
                Err(RecvTimeoutError::Timeout) => {
                    return Err(format!(
                        "the fixture did not exit within {EXIT_TIMEOUT:?} of `stop`; stdout {:?}",
                        self.stdout
                    ))
                }
            }
        }
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait().map_err(|e| e.to_string())? {
                let err = self
                    .stderr
                    .take()
                    .map(|h| h.join().unwrap_or_default())
                    .unwrap_or_default();
                return Ok((std::mem::take(&mut self.stdout), status.code(), err));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        Err("the fixture closed stdout but did not exit".into())
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The output and status of a run nobody reads.
fn unprofiled(interp: &Interpreter) -> Result<(Vec<String>, Option<i32>), String> {
    let t = Target::start(interp)?;
    let (out, code, err) = t.stop()?;
    if code != Some(EXPECTED_EXIT) {
        return Err(format!(
            "unprofiled run: exit {code:?}, expected {EXPECTED_EXIT}; stderr:\n{err}"
        ));
    }
    if !out.iter().any(|l| l == "done")
        || out
            .iter()
            .any(|l| l.contains("mismatches") && !l.ends_with("mismatches 0"))
    {
        return Err(format!(
            "unprofiled run: unexpected output {out:?}; stderr:\n{err}"
        ));
    }
    Ok((out, code))
}

/// No thread of `pid` is stopped (t/T) or traced.
fn check_not_stopped(pid: i32) -> Vec<String> {
    let mut errs = Vec::new();
    let tracer = |path: String| -> Option<String> {
        std::fs::read_to_string(&path)
            .ok()?
            .lines()
            .find_map(|l| l.strip_prefix("TracerPid:").map(|v| v.trim().to_string()))
    };
    match tracer(format!("/proc/{pid}/status")) {
        Some(t) if t == "0" => {}
        other => errs.push(format!(
            "/proc/{pid}/status TracerPid: {other:?}, expected 0"
        )),
    }
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| d.flatten().collect::<Vec<_>>())
        .unwrap_or_default();
    if tasks.is_empty() {
        errs.push(format!("/proc/{pid}/task is empty or unreadable"));
    }
    for e in tasks {
        let tid = e.file_name().to_string_lossy().into_owned();
        let stat =
            std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat")).unwrap_or_default();
        let state = stat
            .rfind(')')
            .and_then(|i| stat[i + 1..].trim_start().chars().next());
        if matches!(state, Some('t') | Some('T') | None) {
            errs.push(format!(
                "thread {tid} is in state {state:?} after the dumps"
            ));
        }
        match tracer(format!("/proc/{pid}/task/{tid}/status")) {
            Some(t) if t == "0" => {}
            other => errs.push(format!("thread {tid}: TracerPid {other:?}, expected 0")),
        }
    }
    errs
}

/// What `fixtures/code_names.py` says about the files frames name.
#[derive(Deserialize)]
struct CodeNames {
    stdlib: String,
    files: BTreeMap<String, Option<FileNames>>,
}

#[derive(Deserialize)]
struct FileNames {
    lines: i64,
    names: BTreeSet<String>,
    qualnames: Option<BTreeSet<String>>,
}

/// Every distinct frame seen must be real (see the module doc). Returns failures.
fn check_frames_real(interp: &Interpreter, frames: &BTreeMap<Frame, usize>) -> Vec<String> {
    let fixture = common::fixture("dump_reliability.py");
    let fixture = fixture.to_str().unwrap();
    let files: BTreeSet<&str> = frames.keys().map(|f| f.filename.as_str()).collect();
    let out = Command::new(&interp.path)
        .arg(common::fixture("code_names.py"))
        .args(&files)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("LC_ALL", "C.UTF-8")
        .output()
        .expect("run code_names.py");
    let names: CodeNames = match serde_json::from_slice(&out.stdout) {
        Ok(n) => n,
        Err(e) => {
            return vec![format!(
                "code_names.py: {e}; stderr {}",
                String::from_utf8_lossy(&out.stderr)
            )]
        }
    };
    let stdlib = format!("{}/", names.stdlib.trim_end_matches('/'));
    let mut errs = Vec::new();
    let mut null_lines = 0;
    for (f, count) in frames {
        let what = format!(
            "frame {} ({}:{:?}) seen {count} times",
            f.function, f.filename, f.line
        );
        if f.filename != fixture && !f.filename.starts_with(&stdlib) {
            errs.push(format!(
                "{what}: neither the fixture nor in the stdlib ({stdlib})"
            ));
            continue;
        }
        let Some(Some(info)) = names.files.get(&f.filename) else {
            errs.push(format!("{what}: no such file, or it does not compile"));
            continue;
        };
        let known = if interp.version() >= (3, 11) {
            info.qualnames.as_ref().unwrap_or(&info.names)
        } else {
            &info.names
        };
        if !known.contains(&f.function) {
            errs.push(format!("{what}: no code object of that name in the file"));
        }
        match f.line {
            Some(l) if l >= 1 && l <= info.lines => {}
            // 3.10+ has instructions without a line (the contract allows null).
            None if interp.version() >= (3, 10) => null_lines += count,
            other => errs.push(format!("{what}: line {other:?} outside 1..={}", info.lines)),
        }
    }
    if null_lines > 0 {
        println!("[{}] {null_lines} frames with a null line", interp.label);
    }
    errs
}

/// The oldest and newest interpreters plus Debian's static build, deduplicated.
fn reliability_interpreters() -> Vec<Interpreter> {
    let all = common::interpreters();
    let mut chosen: Vec<Interpreter> = Vec::new();
    let mut push = |i: &Interpreter| {
        if !chosen.iter().any(|c| c.path == i.path) {
            chosen.push(i.clone());
        }
    };
    push(all.first().unwrap());
    push(all.last().unwrap());
    for i in all
        .iter()
        .filter(|i| i.path == Path::new("/usr/bin/python3.11"))
    {
        push(i);
    }
    chosen
}

/// `function (file:line)` per frame, innermost first, repeats collapsed: `fib (x.py:28) x13`.
fn compact(frames: &[Frame]) -> String {
    let mut parts: Vec<(String, usize)> = Vec::new();
    for f in frames {
        let file = f.filename.rsplit('/').next().unwrap_or(&f.filename);
        let line = f.line.map(|l| l.to_string()).unwrap_or_else(|| "?".into());
        let s = format!("{} ({file}:{line})", f.function);
        match parts.last_mut() {
            Some((last, n)) if *last == s => *n += 1,
            _ => parts.push((s, 1)),
        }
    }
    if parts.is_empty() {
        return "(no frames)".into();
    }
    parts
        .into_iter()
        .map(|(s, n)| if n > 1 { format!("{s} x{n}") } else { s })
        .collect::<Vec<_>>()
        .join(" < ")
}

fn main_wait_line() -> i64 {
    let text = std::fs::read_to_string(common::fixture("dump_reliability.py")).unwrap();
    text.lines()
        .position(|l| l.contains("# MARK: wait_stop"))
        .expect("MARK: wait_stop") as i64
        + 1
}

/// One session: the unprofiled run, then `dumps` dumps with `extra` flags, the checks, and
/// the comparison. Returns failures.
fn session(interp: &Interpreter, dumps: usize, extra: &[&str]) -> Vec<String> {
    let mut errs = Vec::new();
    let (base_out, base_code) = match unprofiled(interp) {
        Ok(r) => r,
        Err(e) => return vec![e],
    };
    let target = match Target::start(interp) {
        Ok(t) => t,
        Err(e) => return vec![e],
    };
    let pid = target.pid;
    let nonblocking = extra.contains(&"--nonblocking");
    let wait_line = main_wait_line();
    let fixture = common::fixture("dump_reliability.py")
        .to_str()
        .unwrap()
        .to_string();
    let mut args = vec!["dump".to_string(), pid.to_string(), "--json".to_string()];
    args.extend(extra.iter().map(|s| s.to_string()));
    let mut seen: BTreeMap<Frame, usize> = BTreeMap::new();
    let mut bad = 0usize;
    let mut thread_errors = 0usize;
    let quote = |errs: &mut Vec<String>, bad: &mut usize, msg: String| {
        *bad += 1;
        if *bad <= QUOTED {
            errs.push(msg);
        }
    };
    let started = Instant::now();
    for i in 0..dumps {
        let run = run_bin(&args);
        if run.code != Some(0) || run.timed_out || run.stderr.contains("panicked") {
            quote(
                &mut errs,
                &mut bad,
                format!(
                    "dump {i}: exit {:?}{}, stderr {:?}",
                    run.code,
                    if run.timed_out { " (hung, killed)" } else { "" },
                    run.stderr
                ),
            );
            continue;
        }
        let dump: Dump = match serde_json::from_str(&run.stdout) {
            Ok(d) => d,
            Err(e) => {
                quote(
                    &mut errs,
                    &mut bad,
                    format!("dump {i}: bad JSON ({e}): {}", run.stdout),
                );
                continue;
            }
        };
        if dump.pid != pid as i64 {
            quote(&mut errs, &mut bad, format!("dump {i}: pid {}", dump.pid));
        }
        if dump.threads.len() != THREADS {
            quote(
                &mut errs,
                &mut bad,
                format!(
                    "dump {i}: {} threads, expected {THREADS}",
                    dump.threads.len()
                ),
            );
        }
        let ids: BTreeSet<u64> = dump.threads.iter().map(|t| t.thread_id).collect();
        if ids.len() != dump.threads.len() {
            quote(
                &mut errs,
                &mut bad,
                format!("dump {i}: duplicate thread ids"),
            );
        }
        let holders = dump.threads.iter().filter(|t| t.holds_gil).count();
        if holders > 1 {
            quote(
                &mut errs,
                &mut bad,
                format!("dump {i}: {holders} threads hold the GIL"),
            );
        }
        let mut main_seen = false;
        for t in &dump.threads {
            if t.native_id
                .is_none_or(|n| !Path::new(&format!("/proc/{pid}/task/{n}")).exists())
            {
                quote(
                    &mut errs,
                    &mut bad,
                    format!(
                        "dump {i}: thread {} has native_id {:?}, not a task of {pid}",
                        t.thread_id, t.native_id
                    ),
                );
            }
            if let Some(e) = &t.error {
                thread_errors += 1;
                if !nonblocking {
                    quote(
                        &mut errs,
                        &mut bad,
                        format!(
                            "dump {i}: thread {}: error {e:?} in a blocking dump",
                            t.thread_id
                        ),
                    );
                }
                continue;
            }
            if t.frames.is_empty() {
                quote(
                    &mut errs,
                    &mut bad,
                    format!(
                        "dump {i}: thread {} has no frames and no error",
                        t.thread_id
                    ),
                );
            }
            for f in &t.frames {
                *seen.entry(f.clone()).or_default() += 1;
            }
            // The main thread waits for `stop`: main() at MARK wait_stop, then <module>.
            let is_main = t.frames.last().is_some_and(|f| f.function == "<module>");
            if is_main {
                main_seen = true;
                let want = [("main", wait_line), ("<module>", 0)];
                let ok = t.frames.len() == 2
                    && t.frames.iter().zip(want).all(|(f, (name, line))| {
                        f.function == name
                            && f.filename == fixture
                            && (line == 0 || f.line == Some(line))
                    });
                if !ok {
                    quote(&mut errs, &mut bad, format!("dump {i}: main thread should be main ({fixture}:{wait_line}), <module>: got {}", compact(&t.frames)));
                }
            } else if !t
                .frames
                .last()
                .is_some_and(|f| f.filename.ends_with("threading.py"))
            {
                quote(
                    &mut errs,
                    &mut bad,
                    format!(
                        "dump {i}: worker {}: the outermost frame is not threading's bootstrap \
                         (an incomplete stack reported as complete), innermost first: {}",
                        t.thread_id,
                        compact(&t.frames)
                    ),
                );
            }
        }
        if !main_seen && !nonblocking {
            quote(
                &mut errs,
                &mut bad,
                format!("dump {i}: no main thread (<module> frame)"),
            );
        }
    }
    let elapsed = started.elapsed();
    if bad > QUOTED {
        errs.push(format!("... {} more failures not quoted", bad - QUOTED));
    }
    errs.extend(check_not_stopped(pid));
    errs.extend(check_frames_real(interp, &seen));
    match target.stop() {
        Err(e) => errs.push(format!("profiled run: {e}")),
        Ok((out, code, stderr)) => {
            if code != base_code {
                errs.push(format!(
                    "profiled run exited {code:?}, unprofiled {base_code:?}; stderr:\n{stderr}"
                ));
            }
            if out != base_out {
                errs.push(format!(
                    "profiled run printed something else than the unprofiled run\n  unprofiled: {base_out:?}\n  profiled:   {out:?}\n  stderr: {stderr}"
                ));
            }
        }
    }
    println!(
        "[{}] {dumps} dumps {extra:?} in {elapsed:.1?}: {} distinct frames, {thread_errors} thread stacks not read (error)",
        interp.label,
        seen.len()
    );
    errs
}

fn run_all(test: &str, interps: Vec<Interpreter>, dumps: usize, extra: &[&str]) {
    let mut failures = Vec::new();
    let labels: Vec<String> = interps.iter().map(|i| i.label.clone()).collect();
    for interp in &interps {
        let errs = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            session(interp, dumps, extra)
        })) {
            Ok(e) => e,
            Err(_) => vec!["test panicked".into()],
        };
        failures.extend(errs.into_iter().map(|e| format!("[{}] {e}", interp.label)));
    }
    println!("{test}: ran on {labels:?}");
    assert!(
        failures.is_empty(),
        "{test}: {} failure(s):\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn blocking_dumps_do_not_disturb() {
    // Oldest + newest + Debian's static build: see the module doc.
    run_all(
        "blocking_dumps_do_not_disturb",
        reliability_interpreters(),
        BLOCKING_DUMPS,
        &[],
    );
}

#[test]
fn nonblocking_dumps_are_real() {
    run_all(
        "nonblocking_dumps_are_real",
        common::interpreters(),
        NONBLOCKING_DUMPS,
        &["--nonblocking"],
    );
}

/// After `ready` the main thread still has to return from `print` and reach its
/// `readline` (MARK wait_stop); with workers spinning it may wait a while for the GIL. The
/// checks below expect it there, so wait until the kernel shows it blocked in `read`
/// (x86-64 syscall 0), at most a few seconds.
fn wait_in_read(pid: i32) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        let s =
            std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/syscall")).unwrap_or_default();
        if cfg!(not(target_arch = "x86_64")) || s.is_empty() || s.starts_with("0 ") {
            // Not x86-64, or no access to the syscall file: a fixed grace period instead.
            if !s.starts_with("0 ") {
                std::thread::sleep(Duration::from_millis(500));
            }
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}
