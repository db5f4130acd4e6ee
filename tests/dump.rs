//! `scalene-rs dump` against live processes of every interpreter on the machine.
//!
//! Each test starts a fixture from `fixtures/` (see `fixtures/dump_support.py` for the
//! protocol: the fixture prints `threads {...}` (role -> thread ident, native id),
//! `truth {...}` (every thread's stack as the interpreter itself sees it, through
//! `sys._current_frames()`), then `ready`, and stays put), dumps it with `--json`, and checks:
//!   - the frames the fixture controls, innermost first: exact function names, file names
//!     and lines, the lines found through `# MARK: label` comments in the fixture sources;
//!   - the whole stack of every blocked thread against the interpreter's own `truth`;
//!   - the process-level fields, every thread's `native_id` (one of /proc/PID/task/*, the one
//!     the thread itself reported) and `name` (/proc comm), the GIL (at most one holder, never
//!     a blocked thread) and `idle` (true for every blocked thread);
//!   - that `--nonblocking` gives the same frames for the blocked threads;
//!   - once per interpreter (on dump_shapes.py), the human backtrace.
//!
//! Every test loops over every interpreter, collects failures with the interpreter's label
//! and fails at the end; fixtures that cannot run on an interpreter (async/await and
//! non-ASCII identifiers on 2.7) say which interpreters they skipped and why.
//!
//! The fixture with lines above 70,000 is generated at test time into a temporary directory
//! from `fixtures/dump_big_lineno_template.py` (70,000 comment lines replace each
//! `# PADDING` line), so that no 70,000-line file is checked in.

mod common;

use common::{Interpreter, Run};
use serde::Deserialize;
use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_scalene-rs");
/// How long a fixture may take to print `ready`.
const READY_TIMEOUT: Duration = Duration::from_secs(20);
/// How long one `scalene-rs dump` may take before the test calls it hung.
const DUMP_TIMEOUT: Duration = Duration::from_secs(60);
/// Depth of fixtures/dump_recursion.py.
const RECURSION_DEPTH: usize = 600;
/// Comment lines that replace each `# PADDING` line of the big-line-number template.
const PADDING_LINES: usize = 70_000;

// ---------------------------------------------------------------------------------------
// The JSON the dump prints (only the fields of the contract; others are ignored).

#[derive(Deserialize, Debug, Clone)]
struct Dump {
    pid: i64,
    python_version: String,
    executable: String,
    untested_version: bool,
    threads: Vec<DThread>,
}

#[derive(Deserialize, Debug, Clone)]
struct DThread {
    thread_id: u64,
    native_id: Option<i64>,
    name: Option<String>,
    holds_gil: bool,
    idle: bool,
    frames: Vec<Frame>,
    truncated: bool,
    #[serde(default)]
    error: Option<String>,
}

#[derive(Deserialize, Debug, Clone, PartialEq, Eq)]
struct Frame {
    function: String,
    filename: String,
    line: Option<i64>,
}

impl std::fmt::Display for Frame {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.line {
            Some(l) => write!(f, "{} ({}:{})", self.function, self.filename, l),
            None => write!(f, "{} ({}:?)", self.function, self.filename),
        }
    }
}

fn show_frames(frames: &[Frame]) -> String {
    if frames.is_empty() {
        return "    (no frames)".into();
    }
    frames
        .iter()
        .enumerate()
        .map(|(i, f)| format!("    #{i} {f}"))
        .collect::<Vec<_>>()
        .join("\n")
}

// ---------------------------------------------------------------------------------------
// Running things.

/// Runs `scalene-rs ARGS` with a time limit, draining stdout and stderr.
fn run_bin(args: &[String]) -> Run {
    let mut cmd = Command::new(BIN);
    cmd.args(args);
    common::run_limited(cmd, DUMP_TIMEOUT)
}

/// A fixture process; killed and reaped when dropped, whatever happened in between.
struct Target {
    child: Child,
    pid: i32,
    lines: Receiver<String>,
    stderr: Option<JoinHandle<String>>,
}

impl Target {
    fn spawn(interp: &Interpreter, script: &Path, args: &[OsString]) -> Result<Target, String> {
        let f = common::start_fixture(interp, script, args, false)?;
        Ok(Target {
            child: f.child,
            pid: f.pid,
            lines: f.lines,
            stderr: Some(f.stderr),
        })
    }

    /// The lines printed before `ready`; on a timeout or an early exit, an error with the
    /// fixture's stderr.
    fn wait_ready(&mut self) -> Result<Vec<String>, String> {
        let deadline = Instant::now() + READY_TIMEOUT;
        let mut before = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line == "ready" => return Ok(before),
                Ok(line) => before.push(line),
                Err(RecvTimeoutError::Timeout) => {
                    let err = self.kill_and_stderr();
                    return Err(format!(
                        "fixture did not print `ready` within {READY_TIMEOUT:?}; stdout so far {before:?}; stderr:\n{err}"
                    ));
                }
                Err(RecvTimeoutError::Disconnected) => {
                    let err = self.kill_and_stderr();
                    return Err(format!(
                        "fixture exited before `ready` ({:?}); stdout {before:?}; stderr:\n{err}",
                        self.child.try_wait()
                    ));
                }
            }
        }
    }

    fn kill_and_stderr(&mut self) -> String {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.stderr
            .take()
            .map(|h| h.join().unwrap_or_default())
            .unwrap_or_default()
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `label -> line` for every `# MARK: label` comment of a file (1-based lines).
fn marks_of_text(text: &str, what: &str) -> BTreeMap<String, i64> {
    let mut marks = BTreeMap::new();
    for (i, line) in text.lines().enumerate() {
        if let Some(pos) = line.find("# MARK: ") {
            let label = line[pos + "# MARK: ".len()..].trim().to_string();
            let old = marks.insert(label.clone(), i as i64 + 1);
            assert!(old.is_none(), "{what}: MARK {label:?} twice");
        }
    }
    marks
}

fn marks_of(path: &Path) -> BTreeMap<String, i64> {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    marks_of_text(&text, &path.display().to_string())
}

fn mark(marks: &BTreeMap<String, i64>, label: &str) -> i64 {
    *marks
        .get(label)
        .unwrap_or_else(|| panic!("no `# MARK: {label}` in the fixture"))
}

/// `major.minor.micro` of an interpreter, asked from the interpreter itself (cached).
fn full_version(interp: &Interpreter) -> String {
    use std::sync::Mutex;
    static CACHE: Mutex<BTreeMap<PathBuf, String>> = Mutex::new(BTreeMap::new());
    if let Some(v) = CACHE.lock().unwrap().get(&interp.path) {
        return v.clone();
    }
    let out = Command::new(&interp.path)
        .args(["-c", "import sys; print('%d.%d.%d' % sys.version_info[:3])"])
        .output()
        .expect("run the interpreter");
    let v = String::from_utf8_lossy(&out.stdout).trim().to_string();
    CACHE.lock().unwrap().insert(interp.path.clone(), v.clone());
    v
}

fn read_trim(path: impl AsRef<Path>) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim_end_matches('\n').to_string())
}

fn tasks_of(pid: i32) -> BTreeSet<i64> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str().and_then(|s| s.parse().ok()))
                .collect()
        })
        .unwrap_or_default()
}

/// Runs one case per interpreter (`None` from `skip` runs it), catching panics, and fails at
/// the end with every failure, labelled by interpreter.
fn for_each_interpreter(
    test: &str,
    skip: impl Fn(&Interpreter) -> Option<&'static str>,
    case: impl Fn(&Interpreter) -> Vec<String>,
) {
    let mut failures = Vec::new();
    let mut ran = Vec::new();
    for interp in common::interpreters() {
        if let Some(why) = skip(&interp) {
            // A case that does not apply to this interpreter (not a missing resource).
            common::say(&format!(
                "{test}: not run on {} ({}): {why}",
                interp.label,
                interp.path.display()
            ));
            continue;
        }
        ran.push(interp.label.clone());
        let errs = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| case(&interp))) {
            Ok(errs) => errs,
            Err(p) => {
                let msg = p
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "panic".into());
                vec![format!("test panicked: {msg}")]
            }
        };
        for e in errs {
            failures.push(format!("[{}] {e}", interp.label));
        }
    }
    println!("{test}: ran on {ran:?}");
    assert!(!ran.is_empty(), "{test}: ran on no interpreter");
    assert!(
        failures.is_empty(),
        "{test}: {} failure(s):\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}

// ---------------------------------------------------------------------------------------
// A started fixture and what it printed.

struct Case {
    target: Target,
    interp: Interpreter,
    script: PathBuf,
    /// role -> (thread ident, native id) as the threads reported them.
    roles: BTreeMap<String, (u64, Option<i64>)>,
    /// thread ident -> stack, as sys._current_frames() saw it (the reporter excluded).
    truth: BTreeMap<u64, Vec<Frame>>,
    /// Other lines printed before `ready` (`names ...`).
    other: Vec<String>,
    /// Roles of threads that compute rather than block.
    busy: Vec<&'static str>,
}

/// After `ready` the reporter thread still has to return from `print` and reach its
/// `time.sleep` (MARK reporter); with a busy thread holding the GIL (2.7) it may wait for
/// the GIL a while first, and a dump then finds it on the `print` line. Wait until the
/// kernel shows it blocked in a system call other than a futex wait (the GIL's), at most a
/// few seconds; a fixture whose threads cannot be found by name is not waited for.
fn wait_reporter_asleep(pid: i32) {
    if cfg!(not(target_arch = "x86_64")) {
        std::thread::sleep(Duration::from_millis(200));
        return;
    }
    const FUTEX: &str = "202";
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        let tasks = std::fs::read_dir(format!("/proc/{pid}/task"));
        let reporter = tasks
            .into_iter()
            .flatten()
            .flatten()
            .find(|e| read_trim(e.path().join("comm")).as_deref() == Some("reporter"));
        let Some(task) = reporter else { return };
        let call = read_trim(task.path().join("syscall")).unwrap_or_default();
        let nr = call.split(' ').next().unwrap_or("");
        if nr.parse::<u32>().is_ok() && nr != FUTEX {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn start_case(interp: &Interpreter, script: &Path, args: &[OsString]) -> Result<Case, String> {
    let mut target = Target::spawn(interp, script, args)?;
    let lines = target.wait_ready()?;
    wait_reporter_asleep(target.pid);
    let mut roles = BTreeMap::new();
    let mut truth = BTreeMap::new();
    let mut other = Vec::new();
    for line in lines {
        if let Some(j) = line.strip_prefix("threads ") {
            let m: BTreeMap<String, (u64, Option<i64>)> =
                serde_json::from_str(j).map_err(|e| format!("bad `threads` line {j:?}: {e}"))?;
            roles = m;
        } else if let Some(j) = line.strip_prefix("truth ") {
            let m: BTreeMap<String, Vec<(String, String, Option<i64>)>> =
                serde_json::from_str(j).map_err(|e| format!("bad `truth` line: {e}"))?;
            for (ident, stack) in m {
                let ident: u64 = ident
                    .parse()
                    .map_err(|e| format!("bad ident {ident}: {e}"))?;
                let frames = stack
                    .into_iter()
                    .map(|(function, filename, line)| Frame {
                        function,
                        filename,
                        line,
                    })
                    .collect();
                truth.insert(ident, frames);
            }
        } else {
            other.push(line);
        }
    }
    if roles.is_empty() {
        return Err("the fixture printed no `threads` line".into());
    }
    Ok(Case {
        target,
        interp: interp.clone(),
        script: script.to_path_buf(),
        roles,
        truth,
        other,
        busy: Vec::new(),
    })
}

impl Case {
    fn pid(&self) -> i32 {
        self.target.pid
    }

    /// Waits (bounded) until every blocked role's thread is asleep in the kernel ('S' or
    /// 'D'). A thread is runnable for a moment after each blocking dump detaches from it
    /// (its interrupted system call restarts), and on a loaded machine that moment lasts:
    /// a dump right after one would rightly call it active. What the tests check is how
    /// a dump reports blocked threads, so each dump starts when they are blocked again.
    fn settle(&self) {
        let tids: Vec<i64> = self
            .roles
            .iter()
            .filter(|(role, _)| !self.busy.contains(&role.as_str()))
            .filter_map(|(_, (_, native))| *native)
            .collect();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            let asleep = tids.iter().all(|t| {
                let stat = std::fs::read_to_string(format!("/proc/{}/task/{t}/stat", self.pid()))
                    .unwrap_or_default();
                let state = stat
                    .rfind(')')
                    .and_then(|i| stat[i + 1..].trim_start().chars().next());
                matches!(state, Some('S') | Some('D') | None)
            });
            if asleep {
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// `scalene-rs dump PID --json [extra]`, parsed.
    fn dump(&self, extra: &[&str]) -> Result<Dump, String> {
        self.settle();
        let mut args = vec![
            "dump".to_string(),
            self.pid().to_string(),
            "--json".to_string(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        let run = run_bin(&args);
        check_no_panic(&run, &args)?;
        if run.code != Some(0) {
            return Err(format!(
                "`scalene-rs {}` failed: {}",
                args.join(" "),
                run.describe()
            ));
        }
        serde_json::from_str(&run.stdout).map_err(|e| {
            format!(
                "`scalene-rs {}` printed JSON that does not match the contract: {e}\n{}",
                args.join(" "),
                run.stdout
            )
        })
    }

    fn thread<'d>(&self, dump: &'d Dump, role: &str) -> Option<&'d DThread> {
        let (ident, _) = self.roles.get(role)?;
        dump.threads.iter().find(|t| t.thread_id == *ident)
    }
}

fn check_no_panic(run: &Run, args: &[String]) -> Result<(), String> {
    if run.code == Some(101) || run.stderr.contains("panicked") {
        return Err(format!(
            "`scalene-rs {}` panicked: {}",
            args.join(" "),
            run.describe()
        ));
    }
    if run.timed_out {
        return Err(format!(
            "`scalene-rs {}` hung: {}",
            args.join(" "),
            run.describe()
        ));
    }
    Ok(())
}

/// What one frame must be.
#[derive(Clone, Debug)]
struct Exp {
    /// Qualified name (3.11+); on older versions the last dotted component is expected.
    function: String,
    file: FileExp,
    line: LineExp,
}

#[derive(Clone, Debug)]
enum FileExp {
    Exact(String),
    EndsWith(&'static str),
}

#[derive(Clone, Debug)]
enum LineExp {
    AnyOf(Vec<i64>),
    Any,
}

/// The function name a version reports for a qualified name: itself on 3.11+, its last
/// component (co_name) before.
fn name_for(interp: &Interpreter, qualname: &str) -> String {
    if interp.version() >= (3, 11) {
        qualname.to_string()
    } else {
        qualname.rsplit('.').next().unwrap().to_string()
    }
}

fn at(interp: &Interpreter, qualname: &str, file: &Path, line: i64) -> Exp {
    Exp {
        function: name_for(interp, qualname),
        file: FileExp::Exact(file.to_str().expect("UTF-8 fixture path").to_string()),
        line: LineExp::AnyOf(vec![line]),
    }
}

fn stdlib(interp: &Interpreter, qualname: &str, suffix: &'static str) -> Exp {
    Exp {
        function: name_for(interp, qualname),
        file: FileExp::EndsWith(suffix),
        line: LineExp::Any,
    }
}

fn frame_matches(f: &Frame, e: &Exp) -> bool {
    let file_ok = match &e.file {
        FileExp::Exact(s) => &f.filename == s,
        FileExp::EndsWith(s) => f.filename.ends_with(s),
    };
    let line_ok = match &e.line {
        LineExp::AnyOf(v) => f.line.is_some_and(|l| v.contains(&l)),
        LineExp::Any => f.line.is_some_and(|l| l > 0),
    };
    f.function == e.function && file_ok && line_ok
}

fn show_exp(e: &Exp) -> String {
    let file = match &e.file {
        FileExp::Exact(s) => s.clone(),
        FileExp::EndsWith(s) => format!("...{s}"),
    };
    let line = match &e.line {
        LineExp::AnyOf(v) if v.len() == 1 => v[0].to_string(),
        LineExp::AnyOf(v) => format!("one of {v:?}"),
        LineExp::Any => "any".into(),
    };
    format!("{} ({file}:{line})", e.function)
}

/// The innermost frames of `frames` must be `exps`, in order.
fn check_top(what: &str, frames: &[Frame], exps: &[Exp], errs: &mut Vec<String>) {
    let ok =
        frames.len() >= exps.len() && exps.iter().zip(frames).all(|(e, f)| frame_matches(f, e));
    if !ok {
        errs.push(format!(
            "{what}: innermost frames differ\n  expected (innermost first):\n{}\n  got:\n{}",
            exps.iter()
                .enumerate()
                .map(|(i, e)| format!("    #{i} {}", show_exp(e)))
                .collect::<Vec<_>>()
                .join("\n"),
            show_frames(frames)
        ));
    }
}

/// The outermost frame of a thread started by `threading` is in threading.py.
fn check_thread_bottom(what: &str, frames: &[Frame], errs: &mut Vec<String>) {
    match frames.last() {
        Some(f) if f.filename.ends_with("threading.py") => {}
        _ => errs.push(format!(
            "{what}: outermost frame should be threading's bootstrap (threading.py), got\n{}",
            show_frames(frames)
        )),
    }
}

/// The main thread's outermost frame is the fixture's `<module>` at MARK module_call.
fn check_module_bottom(
    what: &str,
    case: &Case,
    frames: &[Frame],
    module_line: i64,
    errs: &mut Vec<String>,
) {
    let exp = at(&case.interp, "<module>", &case.script, module_line);
    match frames.last() {
        Some(f) if frame_matches(f, &exp) => {}
        _ => errs.push(format!(
            "{what}: outermost frame should be {}, got\n{}",
            show_exp(&exp),
            show_frames(frames)
        )),
    }
}

/// Checks every fixture shares: process fields, the thread list against the roles, native
/// ids, names, GIL, idleness, and the stacks of blocked threads against the interpreter's
/// own view. `busy` roles may be running.
/// Dumps `case` paused and with `--nonblocking`, and checks that each time its main thread's
/// stack is exactly `exp` (innermost first).
fn check_main_is_exactly(case: &Case, exp: &[Exp], errs: &mut Vec<String>) {
    for extra in [&[][..], &["--nonblocking"][..]] {
        let mode = if extra.is_empty() {
            "--json"
        } else {
            "--json --nonblocking"
        };
        let dump = match case.dump(extra) {
            Ok(d) => d,
            Err(e) => {
                errs.push(e);
                continue;
            }
        };
        check_common(case, &dump, &[], mode, errs);
        let Some(t) = case.thread(&dump, "main") else {
            errs.push(format!("{mode}: no main thread"));
            continue;
        };
        check_top(&format!("{mode}: main"), &t.frames, exp, errs);
        if t.frames.len() != exp.len() {
            errs.push(format!(
                "{mode}: main has {} frames, expected {}",
                t.frames.len(),
                exp.len()
            ));
        }
    }
}

fn check_common(case: &Case, dump: &Dump, busy: &[&str], mode: &str, errs: &mut Vec<String>) {
    let pid = case.pid();
    let interp = &case.interp;
    if dump.pid != pid as i64 {
        errs.push(format!("{mode}: pid {} instead of {pid}", dump.pid));
    }
    let version = full_version(interp);
    if dump.python_version != version {
        errs.push(format!(
            "{mode}: python_version {:?}, the interpreter says {version:?}",
            dump.python_version
        ));
    }
    let exe = std::fs::read_link(format!("/proc/{pid}/exe"))
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default();
    if dump.executable != exe {
        errs.push(format!(
            "{mode}: executable {:?}, /proc/{pid}/exe is {exe:?}",
            dump.executable
        ));
    }
    if dump.untested_version {
        errs.push(format!("{mode}: untested_version is true for {version}"));
    }

    // One thread per role, no other.
    let by_ident: BTreeMap<u64, &str> = case
        .roles
        .iter()
        .map(|(r, (i, _))| (*i, r.as_str()))
        .collect();
    let got: BTreeSet<u64> = dump.threads.iter().map(|t| t.thread_id).collect();
    if got.len() != dump.threads.len() {
        errs.push(format!(
            "{mode}: duplicate thread_id in {:?}",
            dump.threads.iter().map(|t| t.thread_id).collect::<Vec<_>>()
        ));
    }
    let want: BTreeSet<u64> = by_ident.keys().copied().collect();
    if got != want {
        errs.push(format!(
            "{mode}: thread_ids {got:?}, the fixture's threads are {:?}",
            case.roles
        ));
    }

    let tasks = tasks_of(pid);
    let mut natives = BTreeSet::new();
    let holders: Vec<&str> = dump
        .threads
        .iter()
        .filter(|t| t.holds_gil)
        .map(|t| by_ident.get(&t.thread_id).copied().unwrap_or("?"))
        .collect();
    if holders.len() > 1 {
        errs.push(format!(
            "{mode}: {} threads hold the GIL: {holders:?}",
            holders.len()
        ));
    }
    for t in &dump.threads {
        let role = by_ident
            .get(&t.thread_id)
            .copied()
            .unwrap_or("<unknown thread>");
        let what = format!("{mode}: thread {role} ({})", t.thread_id);
        match t.native_id {
            None => errs.push(format!("{what}: native_id is null")),
            Some(n) => {
                if !tasks.contains(&n) {
                    errs.push(format!(
                        "{what}: native_id {n} is not in /proc/{pid}/task {tasks:?}"
                    ));
                }
                if !natives.insert(n) {
                    errs.push(format!("{what}: native_id {n} given to two threads"));
                }
                if let Some((_, Some(reported))) = case.roles.get(role) {
                    if *reported != n {
                        errs.push(format!(
                            "{what}: native_id {n}, the thread itself says {reported}"
                        ));
                    }
                }
                let comm = read_trim(format!("/proc/{pid}/task/{n}/comm"));
                if t.name != comm {
                    errs.push(format!(
                        "{what}: name {:?}, /proc/{pid}/task/{n}/comm is {comm:?}",
                        t.name
                    ));
                }
                // Fixture threads name themselves after their role (15 bytes at most).
                if role != "main" && by_ident.contains_key(&t.thread_id) {
                    let want: String = role.chars().take(15).collect();
                    if t.name.as_deref() != Some(want.as_str()) {
                        errs.push(format!(
                            "{what}: name {:?}, the thread named itself {want:?}",
                            t.name
                        ));
                    }
                }
            }
        }
        if t.truncated {
            errs.push(format!("{what}: truncated with {} frames", t.frames.len()));
        }
        if busy.contains(&role) {
            continue;
        }
        if let Some(e) = &t.error {
            errs.push(format!("{what}: error {e:?} for a blocked thread"));
        }
        if t.holds_gil {
            errs.push(format!("{what}: a blocked thread holds the GIL"));
        }
        if !t.idle {
            errs.push(format!("{what}: a blocked thread is not idle"));
        }
        if let Some(truth) = case.truth.get(&t.thread_id) {
            if &t.frames != truth {
                errs.push(format!(
                    "{what}: stack differs from the interpreter's own (sys._current_frames())\n  interpreter:\n{}\n  dump:\n{}",
                    show_frames(truth),
                    show_frames(&t.frames)
                ));
            }
        }
    }

    // The reporter thread of dump_support.py, blocked after printing `ready`.
    if let Some(t) = case.thread(dump, "reporter") {
        let support = common::fixture("dump_support.py");
        let exp = at(
            interp,
            "_report",
            &support,
            mark(&marks_of(&support), "reporter"),
        );
        check_top(&format!("{mode}: thread reporter"), &t.frames, &[exp], errs);
        check_thread_bottom(&format!("{mode}: thread reporter"), &t.frames, errs);
    }
}

/// `--nonblocking` must give the same frames as a blocking dump for every blocked thread.
fn check_nonblocking(case: &Case, blocking: &Dump, busy: &[&str], errs: &mut Vec<String>) {
    let nb = match case.dump(&["--nonblocking"]) {
        Ok(d) => d,
        Err(e) => {
            errs.push(format!("--nonblocking: {e}"));
            return;
        }
    };
    check_common(case, &nb, busy, "--nonblocking", errs);
    for t in &blocking.threads {
        let role = case
            .roles
            .iter()
            .find(|(_, (i, _))| *i == t.thread_id)
            .map(|(r, _)| r.as_str())
            .unwrap_or("?");
        if busy.contains(&role) {
            continue;
        }
        match nb.threads.iter().find(|n| n.thread_id == t.thread_id) {
            None => errs.push(format!("--nonblocking: thread {role} ({}) missing", t.thread_id)),
            Some(n) if n.frames != t.frames => errs.push(format!(
                "--nonblocking: thread {role} frames differ from the blocking dump\n  blocking:\n{}\n  nonblocking:\n{}",
                show_frames(&t.frames),
                show_frames(&n.frames)
            )),
            Some(_) => {}
        }
    }
}

fn fixture_str(p: &Path) -> String {
    p.to_str().expect("fixture paths are UTF-8").to_string()
}

// ---------------------------------------------------------------------------------------
// dump_shapes.py: one blocked thread per kind of frame; also the human output.

fn shapes_expectations(interp: &Interpreter, script: &Path) -> BTreeMap<&'static str, Vec<Exp>> {
    let m = marks_of(script);
    let f = |q: &str, label: &str| at(interp, q, script, mark(&m, label));
    let inlined = interp.version() >= (3, 12); // PEP 709
    let py2 = interp.is_py2(); // list comprehensions never had a frame on 2.x
    let mut e = BTreeMap::new();
    e.insert(
        "nested",
        vec![
            f("outer_func.<locals>.inner_func", "nested_inner"),
            f("outer_func", "nested_outer"),
        ],
    );
    e.insert(
        "method",
        vec![f("Shapes.method", "method"), f("run_method", "run_method")],
    );
    e.insert(
        "classmethod",
        vec![
            f("Shapes.class_method", "classmethod"),
            f("run_classmethod", "run_classmethod"),
        ],
    );
    e.insert(
        "staticmethod",
        vec![
            f("Shapes.static_method", "staticmethod"),
            f("run_staticmethod", "run_staticmethod"),
        ],
    );
    e.insert(
        "innerclass",
        vec![
            f("Shapes.Inner.deep", "innerclass"),
            f("run_innerclass", "run_innerclass"),
        ],
    );
    e.insert(
        "lambda",
        vec![
            f("run_lambda.<locals>.<lambda>", "lambda"),
            f("run_lambda", "run_lambda"),
        ],
    );
    e.insert(
        "listcomp",
        if inlined || py2 {
            vec![f("run_listcomp", "listcomp")]
        } else {
            vec![
                f("run_listcomp.<locals>.<listcomp>", "listcomp"),
                f("run_listcomp", "listcomp"),
            ]
        },
    );
    e.insert(
        "dictcomp",
        if inlined {
            vec![f("run_dictcomp", "dictcomp")]
        } else {
            vec![
                f("run_dictcomp.<locals>.<dictcomp>", "dictcomp"),
                f("run_dictcomp", "dictcomp"),
            ]
        },
    );
    e.insert(
        "setcomp",
        if inlined {
            vec![f("run_setcomp", "setcomp")]
        } else {
            vec![
                f("run_setcomp.<locals>.<setcomp>", "setcomp"),
                f("run_setcomp", "setcomp"),
            ]
        },
    );
    // Generator expressions keep their frame on every version.
    e.insert(
        "genexpr",
        vec![
            f("run_genexpr.<locals>.<genexpr>", "genexpr"),
            f("run_genexpr", "genexpr"),
        ],
    );
    e.insert(
        "generator",
        vec![
            f("gen_blocker", "generator"),
            f("run_generator", "run_generator"),
        ],
    );
    // The wrapper's code object keeps its own qualified name: functools.wraps only changes
    // the function object's __qualname__.
    e.insert(
        "decorator",
        vec![
            f("decorated", "decorated"),
            f("traced.<locals>.wrapper", "wrapper"),
        ],
    );
    e.insert("lock", vec![f("wait_lock", "lock")]);
    e.insert("pipe", vec![f("wait_pipe", "pipe")]);
    e.insert(
        "event",
        vec![
            stdlib(interp, "Condition.wait", "threading.py"),
            stdlib(interp, "Event.wait", "threading.py"),
            f("wait_event", "event"),
        ],
    );
    // 3.13 runs a warmed-up class call's __init__ under an interpreter shim frame
    // (_Py_InitCleanup) that is not Python code and must not appear.
    e.insert(
        "init",
        vec![
            f("Constructed.__init__", "init"),
            f("construct", "construct"),
            f("run_init", "run_init"),
        ],
    );
    e.insert(
        "property",
        vec![
            f("Lazy.value", "property"),
            f("read_value", "read_value"),
            f("run_property", "run_property"),
        ],
    );
    e.insert(
        "main",
        vec![
            f("block_main", "main_block"),
            f("main", "main_call"),
            f("<module>", "module_call"),
        ],
    );
    e
}

#[test]
fn dump_shapes() {
    let script = common::fixture("dump_shapes.py");
    for_each_interpreter(
        "dump_shapes",
        |_| None,
        |interp| {
            let mut errs = Vec::new();
            let case = match start_case(interp, &script, &[]) {
                Ok(c) => c,
                Err(e) => return vec![e],
            };
            let exps = shapes_expectations(interp, &script);
            let dump = match case.dump(&[]) {
                Ok(d) => d,
                Err(e) => return vec![e],
            };
            check_common(&case, &dump, &[], "--json", &mut errs);
            for (role, exp) in &exps {
                let Some(t) = case.thread(&dump, role) else {
                    errs.push(format!("--json: no thread for role {role}"));
                    continue;
                };
                check_top(&format!("--json: thread {role}"), &t.frames, exp, &mut errs);
                if *role == "main" {
                    if t.frames.len() != exp.len() {
                        errs.push(format!(
                            "--json: main thread has {} frames, expected {}:\n{}",
                            t.frames.len(),
                            exp.len(),
                            show_frames(&t.frames)
                        ));
                    }
                } else {
                    check_thread_bottom(&format!("--json: thread {role}"), &t.frames, &mut errs);
                }
            }
            check_nonblocking(&case, &dump, &[], &mut errs);
            check_text(&case, &dump, &mut errs);
            errs
        },
    );
}

/// The human backtrace: a `Process PID: EXE` line, a `Python X.Y.Z` line, then per thread a
/// header `Thread NATIVE_ID "PYTHON NAME" (OS NAME): idle, ...` followed by
/// `#i function (file:line)` lines.
fn check_text(case: &Case, dump: &Dump, errs: &mut Vec<String>) {
    let args = vec!["dump".to_string(), case.pid().to_string()];
    case.settle();
    let run = run_bin(&args);
    if let Err(e) = check_no_panic(&run, &args) {
        errs.push(e);
        return;
    }
    if run.code != Some(0) {
        errs.push(format!("text dump failed: {}", run.describe()));
        return;
    }
    let text = &run.stdout;
    let mut lines = text.lines();
    let first = lines.next().unwrap_or("");
    let want_first = format!("Process {}: {}", case.pid(), dump.executable);
    if first != want_first {
        errs.push(format!(
            "text: first line {first:?}, expected {want_first:?}"
        ));
    }
    let second = lines.next().unwrap_or("");
    if !second.starts_with(&format!("Python {}", dump.python_version)) {
        errs.push(format!(
            "text: second line {second:?} should start with \"Python {}\"",
            dump.python_version
        ));
    }
    // Split into per-thread blocks at the header lines.
    let mut blocks: BTreeMap<i64, (String, Vec<String>)> = BTreeMap::new();
    let mut current: Option<i64> = None;
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("Thread ") {
            let id = rest.split_whitespace().next().and_then(|s| s.parse().ok());
            match id {
                Some(id) => {
                    blocks.insert(id, (line.to_string(), Vec::new()));
                    current = Some(id);
                }
                None => errs.push(format!("text: header without a native id: {line:?}")),
            }
        } else if let Some(id) = current {
            let t = line.trim_start();
            if t.starts_with('#') {
                blocks.get_mut(&id).unwrap().1.push(t.to_string());
            }
        }
    }
    if blocks.len() != dump.threads.len() {
        errs.push(format!(
            "text: {} thread headers for {} threads:\n{text}",
            blocks.len(),
            dump.threads.len()
        ));
    }
    for t in &dump.threads {
        let Some(n) = t.native_id else { continue };
        let Some((header, frames)) = blocks.get(&n) else {
            errs.push(format!("text: no `Thread {n}` header:\n{text}"));
            continue;
        };
        if let Some(name) = &t.name {
            if !header.contains(&format!(" ({name}): ")) {
                errs.push(format!(
                    "text: header {header:?} lacks the OS name {name:?}"
                ));
            }
        }
        if t.idle && !header.contains("idle") {
            errs.push(format!(
                "text: header {header:?} of an idle thread does not say idle"
            ));
        }
        if frames.len() != t.frames.len() {
            errs.push(format!(
                "text: thread {n} has {} frame lines, JSON has {} frames:\n{}",
                frames.len(),
                t.frames.len(),
                frames.join("\n")
            ));
            continue;
        }
        for (i, (line, f)) in frames.iter().zip(&t.frames).enumerate() {
            let body = format!(
                "{} ({}:{})",
                f.function,
                f.filename,
                f.line.map(|l| l.to_string()).unwrap_or("?".into())
            );
            let (index, rest) = line.split_once(char::is_whitespace).unwrap_or((line, ""));
            if index != format!("#{i}") || rest.trim_start() != body {
                errs.push(format!(
                    "text: thread {n} frame line {line:?}, expected \"#{i} {body}\""
                ));
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// dump_busy.py: three blocked threads and one spinning in sorted().

#[test]
fn dump_busy() {
    let script = common::fixture("dump_busy.py");
    for_each_interpreter(
        "dump_busy",
        |_| None,
        |interp| {
            let mut errs = Vec::new();
            let mut case = match start_case(interp, &script, &[]) {
                Ok(c) => c,
                Err(e) => return vec![e],
            };
            case.busy = vec!["spinner"];
            let m = marks_of(&script);
            let f = |q: &str, label: &str| at(interp, q, &script, mark(&m, label));
            let exps: Vec<(&str, Vec<Exp>)> = vec![
                ("sleeper", vec![f("sleep_forever", "sleeper")]),
                ("locker", vec![f("lock_forever", "locker")]),
                ("reader", vec![f("read_forever", "reader")]),
                (
                    "main",
                    vec![
                        f("block_main", "main_block"),
                        f("main", "main_call"),
                        f("<module>", "module_call"),
                    ],
                ),
            ];
            // A busy thread may be caught at the `while` or at the `sorted(...)` line.
            let spin = Exp {
                function: "spin_sorted".into(),
                file: FileExp::Exact(fixture_str(&script)),
                line: LineExp::AnyOf(vec![mark(&m, "spin_loop"), mark(&m, "spin_call")]),
            };
            for mode in ["--json", "--json --nonblocking"] {
                let dump = match case.dump(if mode.contains("nonblocking") {
                    &["--nonblocking"]
                } else {
                    &[]
                }) {
                    Ok(d) => d,
                    Err(e) => {
                        errs.push(e);
                        continue;
                    }
                };
                check_common(&case, &dump, &["spinner"], mode, &mut errs);
                for (role, exp) in &exps {
                    match case.thread(&dump, role) {
                        Some(t) => {
                            check_top(&format!("{mode}: thread {role}"), &t.frames, exp, &mut errs)
                        }
                        None => errs.push(format!("{mode}: no thread for role {role}")),
                    }
                }
                match case.thread(&dump, "spinner") {
                    None => errs.push(format!("{mode}: no thread for the spinner")),
                    Some(t) => {
                        // --nonblocking may give up on a stack that keeps changing (`error`).
                        if !(mode.contains("nonblocking")
                            && t.error.is_some()
                            && t.frames.is_empty())
                        {
                            check_top(
                                &format!("{mode}: thread spinner"),
                                &t.frames,
                                std::slice::from_ref(&spin),
                                &mut errs,
                            );
                            check_thread_bottom(
                                &format!("{mode}: thread spinner"),
                                &t.frames,
                                &mut errs,
                            );
                        }
                        if t.idle {
                            errs.push(format!("{mode}: the spinning thread is reported idle"));
                        }
                    }
                }
                if let Some(t) = case.thread(&dump, "main") {
                    check_module_bottom(
                        &format!("{mode}: main"),
                        &case,
                        &t.frames,
                        mark(&m, "module_call"),
                        &mut errs,
                    );
                }
            }
            errs
        },
    );
}

// ---------------------------------------------------------------------------------------
// dump_recursion.py: 600 levels of recursion.

#[test]
fn dump_recursion() {
    let script = common::fixture("dump_recursion.py");
    for_each_interpreter(
        "dump_recursion",
        |_| None,
        |interp| {
            let mut errs = Vec::new();
            let case = match start_case(interp, &script, &[]) {
                Ok(c) => c,
                Err(e) => return vec![e],
            };
            let m = marks_of(&script);
            let f = |q: &str, label: &str| at(interp, q, &script, mark(&m, label));
            let mut exp = vec![f("recurse", "bottom")];
            exp.extend(std::iter::repeat_n(
                f("recurse", "recurse"),
                RECURSION_DEPTH,
            ));
            exp.push(f("main", "main_call"));
            exp.push(f("<module>", "module_call"));
            let dump = match case.dump(&[]) {
                Ok(d) => d,
                Err(e) => return vec![e],
            };
            check_common(&case, &dump, &[], "--json", &mut errs);
            let Some(t) = case.thread(&dump, "main") else {
                errs.push("no main thread".into());
                return errs;
            };
            if t.frames.len() != exp.len() {
                errs.push(format!(
                    "main thread has {} frames, expected {}",
                    t.frames.len(),
                    exp.len()
                ));
            }
            for (i, (e, fr)) in exp.iter().zip(&t.frames).enumerate() {
                if !frame_matches(fr, e) {
                    errs.push(format!("frame #{i}: expected {}, got {fr}", show_exp(e)));
                    break;
                }
            }
            // --max-depth cuts the stack and says so.
            match case.dump(&["--max-depth", "100"]) {
                Err(e) => errs.push(e),
                Ok(d) => match case.thread(&d, "main") {
                    None => errs.push("--max-depth 100: no main thread".into()),
                    Some(c) => {
                        if !c.truncated
                            || c.frames.len() != 100
                            || c.frames[..] != t.frames[..100.min(t.frames.len())]
                        {
                            errs.push(format!(
                            "--max-depth 100: truncated {} with {} frames; expected truncated with the 100 innermost frames",
                            c.truncated,
                            c.frames.len()
                        ));
                        }
                    }
                },
            }
            check_nonblocking(&case, &dump, &[], &mut errs);
            errs
        },
    );
}

// ---------------------------------------------------------------------------------------
// dump_asyncio.py: coroutines, an async generator, asyncio's loop blocked inside them.

#[test]
fn dump_asyncio() {
    let script = common::fixture("dump_asyncio.py");
    let skip = |i: &Interpreter| i.is_py2().then_some("no async/await on Python 2");
    for_each_interpreter("dump_asyncio", skip, |interp| {
        let mut errs = Vec::new();
        let case = match start_case(interp, &script, &[]) {
            Ok(c) => c,
            Err(e) => return vec![e],
        };
        let m = marks_of(&script);
        let f = |q: &str, label: &str| at(interp, q, &script, mark(&m, label));
        let top = vec![
            f("leaf", "leaf"),
            f("ticker", "ticker"),
            f("middle", "middle"),
            f("Service.handle", "handle"),
        ];
        let run_label = if interp.version() >= (3, 7) {
            "run"
        } else {
            "run36"
        };
        let bottom = [f("main", run_label), f("<module>", "module_call")];
        for extra in [&[][..], &["--nonblocking"][..]] {
            let mode = if extra.is_empty() {
                "--json"
            } else {
                "--json --nonblocking"
            };
            let dump = match case.dump(extra) {
                Ok(d) => d,
                Err(e) => {
                    errs.push(e);
                    continue;
                }
            };
            check_common(&case, &dump, &[], mode, &mut errs);
            let Some(t) = case.thread(&dump, "main") else {
                errs.push(format!("{mode}: no main thread"));
                continue;
            };
            check_top(&format!("{mode}: main"), &t.frames, &top, &mut errs);
            let n = t.frames.len();
            if n < top.len() + bottom.len() {
                errs.push(format!(
                    "{mode}: main has only {n} frames:\n{}",
                    show_frames(&t.frames)
                ));
                continue;
            }
            for (e, fr) in bottom.iter().zip(&t.frames[n - 2..]) {
                if !frame_matches(fr, e) {
                    errs.push(format!(
                        "{mode}: outer frames: expected {}, got {fr}",
                        show_exp(e)
                    ));
                }
            }
            // In between: only asyncio's own frames, run_until_complete among them.
            let middle = &t.frames[top.len()..n - 2];
            if let Some(bad) = middle.iter().find(|fr| !fr.filename.contains("/asyncio/")) {
                errs.push(format!(
                    "{mode}: frame {bad} between the coroutines and main() is not asyncio's:\n{}",
                    show_frames(&t.frames)
                ));
            }
            let ruc = name_for(interp, "BaseEventLoop.run_until_complete");
            if !middle
                .iter()
                .any(|fr| fr.function == ruc && fr.filename.ends_with("base_events.py"))
            {
                errs.push(format!(
                    "{mode}: no {ruc} (base_events.py) frame:\n{}",
                    show_frames(&t.frames)
                ));
            }
        }
        errs
    });
}

// ---------------------------------------------------------------------------------------
// Non-ASCII file and function names.

#[test]
fn dump_unicode_names() {
    let script = common::fixture("dump_unicode_é_中_ж_𝔘_😀.py");
    let skip = |i: &Interpreter| i.is_py2().then_some("Python 2 identifiers are ASCII only");
    for_each_interpreter("dump_unicode_names", skip, |interp| {
        let mut errs = Vec::new();
        let case = match start_case(interp, &script, &[]) {
            Ok(c) => c,
            Err(e) => return vec![e],
        };
        let m = marks_of(&script);
        let f = |q: &str, label: &str| at(interp, q, &script, mark(&m, label));
        // 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 is NFKC-normalised by the parser (PEP 3131) to the ASCII "Unicode";
        // 𐌰𐌱𐌲 (Gothic, astral) is NFKC-stable and stays as written.
        let exp = vec![
            f("Ünïcödé.méthode", "method"),
            f("Unicode", "nfkc"),
            f("𐌰𐌱𐌲", "astral"),
            f("中文_жук", "bmp"),
            f("café", "latin1"),
            f("<module>", "module_call"),
        ];
        // What the interpreter holds must be what we expect (the fixture prints it).
        let names_line = case.other.iter().find_map(|l| l.strip_prefix("names "));
        match names_line.map(serde_json::from_str::<BTreeMap<String, (String, String)>>) {
            Some(Ok(names)) => {
                for (label, e) in ["method", "nfkc", "astral", "bmp", "latin1"]
                    .iter()
                    .zip(&exp)
                {
                    let (co_name, qual) = &names[*label];
                    let held = if interp.version() >= (3, 11) {
                        qual
                    } else {
                        co_name
                    };
                    if held != &e.function {
                        errs.push(format!("fixture check: {label} is {held:?} in the interpreter, the test expects {:?}", e.function));
                    }
                }
            }
            other => errs.push(format!("fixture printed no valid `names` line: {other:?}")),
        }
        check_main_is_exactly(&case, &exp, &mut errs);
        errs
    });
}

#[test]
fn dump_unicode_path() {
    let script = common::fixture("dump_unicode_path_é_中_ж_𝔘_😀.py");
    for_each_interpreter(
        "dump_unicode_path",
        |_| None,
        |interp| {
            let mut errs = Vec::new();
            let case = match start_case(interp, &script, &[]) {
                Ok(c) => c,
                Err(e) => return vec![e],
            };
            let m = marks_of(&script);
            let f = |q: &str, label: &str| at(interp, q, &script, mark(&m, label));
            let exp = vec![
                f("wait_here", "wait"),
                f("main", "main_call"),
                f("<module>", "module_call"),
            ];
            check_main_is_exactly(&case, &exp, &mut errs);
            errs
        },
    );
}

// ---------------------------------------------------------------------------------------
// Lines above 70,000 (generated from fixtures/dump_big_lineno_template.py).

fn generate_big_lineno() -> PathBuf {
    let template = common::fixture("dump_big_lineno_template.py");
    let text = std::fs::read_to_string(&template).expect("read the template");
    let mut out = String::with_capacity(text.len() + 2 * PADDING_LINES * 12);
    for line in text.lines() {
        if line == "# PADDING" {
            for _ in 0..PADDING_LINES {
                out.push_str("# padding\n");
            }
        } else {
            out.push_str(line);
            out.push('\n');
        }
    }
    let dir = std::env::temp_dir().join(format!("scalene-rs-dump-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("create the temporary directory");
    let path = dir.join("dump_big_lineno.py");
    std::fs::write(&path, out).expect("write the generated fixture");
    path
}

#[test]
fn dump_big_line_numbers() {
    let script = generate_big_lineno();
    let m = marks_of(&script);
    assert!(
        mark(&m, "far_sleep") > 70_000,
        "generated fixture: far_sleep at {}",
        mark(&m, "far_sleep")
    );
    assert!(
        mark(&m, "far_call") > 140_000,
        "generated fixture: far_call at {}",
        mark(&m, "far_call")
    );
    let fixtures_dir: OsString = common::repo_root().join("fixtures").into_os_string();
    for_each_interpreter(
        "dump_big_line_numbers",
        |_| None,
        |interp| {
            let mut errs = Vec::new();
            let case = match start_case(interp, &script, std::slice::from_ref(&fixtures_dir)) {
                Ok(c) => c,
                Err(e) => return vec![e],
            };
            let f = |q: &str, label: &str| at(interp, q, &script, mark(&m, label));
            let exp = vec![
                f("far_sleep", "far_sleep"),
                f("far_main", "far_call"),
                f("<module>", "module_call"),
            ];
            check_main_is_exactly(&case, &exp, &mut errs);
            errs
        },
    );
    let _ = std::fs::remove_dir_all(script.parent().unwrap());
}
