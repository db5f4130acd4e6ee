//! Subinterpreters (3.12+: `_xxsubinterpreters`, `_interpreters`, `concurrent.interpreters`;
//! fixtures/subinterpreters.py): a thread named "sub-runner" makes one and runs code in it.
//! - `dump`: the subinterpreter's thread state is labelled with the subinterpreter's own id
//!   (the one Python reports), the main interpreter's with 0; each has its own stack and
//!   the name its own interpreter's `threading` gives it; the text says `interpreter N`.
//! - `run` and `attach`: the subinterpreter's lines are charged like any other's (its busy
//!   loop has at least 85% of the time, the main interpreter's side of the fixture at most
//!   5%), and the per-thread table says which interpreters the thread ran in.
//!
//! - `dump --native` of three interpreters nested on one thread
//!   (fixtures/nested_subinterpreters.py, 3.8+ through `_xxsubinterpreters`): every state
//!   merged with its part of the one native stack, its own Python frames in it.
//!
//! Interpreters before 3.12 have no subinterpreters to make from Python: each is named as
//! left out, with that reason; none of 3.12+ in the matrix is a failure in CI. (The nested
//! case needs 3.8+ only.)

mod common;

use common::Killed as Target;

use common::Interpreter;
use serde::Deserialize;
use std::process::Command;
use std::time::{Duration, Instant};

/// How long the fixture may take to start its subinterpreter.
const READY: Duration = Duration::from_secs(20);
/// Seconds the subinterpreter spins for the profile.
const SPIN_S: &str = "1.0";
/// Seconds `attach` records it.
const ATTACH_S: &str = "1";

#[derive(Deserialize)]
struct Started {
    id: i64,
    native_id: i64,
}

#[derive(Deserialize)]
struct Sub {
    name: String,
}

#[derive(Deserialize)]
struct Dump {
    threads: Vec<DThread>,
}

#[derive(Deserialize)]
struct DThread {
    native_id: Option<i64>,
    python_name: Option<String>,
    interpreter: i64,
    frames: Vec<DFrame>,
}

#[derive(Deserialize)]
struct DFrame {
    function: String,
    filename: String,
    line: Option<i64>,
}

/// The interpreters with subinterpreters; the others are named as left out.
fn with_subinterpreters(of: Vec<Interpreter>, test: &str) -> Vec<Interpreter> {
    let (yes, no): (Vec<_>, Vec<_>) = of.into_iter().partition(|i| i.version() >= (3, 12));
    for i in &no {
        common::say(&format!(
            "{test}: {}: left out: no subinterpreters before Python 3.12",
            i.label
        ));
    }
    if yes.is_empty() {
        common::skip_or_fail(test, "no Python 3.12+ in the matrix");
    }
    yes
}

/// The JSON of the fixture's first line that starts with `prefix`.
fn line_of<T: serde::de::DeserializeOwned>(t: &Target, prefix: &str) -> Result<T, String> {
    let deadline = Instant::now() + READY;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let line =
            t.0.lines
                .recv_timeout(left)
                .map_err(|_| format!("no `{prefix}` line in {READY:?}"))?;
        if let Some(j) = line.strip_prefix(prefix) {
            return serde_json::from_str(j).map_err(|e| format!("{line:?}: {e}"));
        }
    }
}

/// Waits until thread `tid` of `pid` sleeps in the kernel (the subinterpreter's code has
/// printed its line and entered `time.sleep`).
fn wait_asleep(pid: i32, tid: i64) -> Result<(), String> {
    let deadline = Instant::now() + READY;
    while Instant::now() < deadline {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat"))
            .map_err(|e| e.to_string())?;
        let state = stat.rsplit_once(") ").and_then(|(_, r)| r.chars().next());
        if matches!(state, Some('S' | 'D')) {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Err(format!("thread {tid} never slept"))
}

fn dump_text_and_json(pid: i32) -> Result<(String, Dump), String> {
    let mut out = Vec::new();
    for json in [false, true] {
        let mut cmd = Command::new(common::bin());
        cmd.arg("dump").arg(pid.to_string());
        if json {
            cmd.arg("--json");
        }
        let r = common::run_limited(cmd, Duration::from_secs(60));
        if r.code != Some(0) {
            return Err(format!("dump: {}", r.describe()));
        }
        out.push(r.stdout);
    }
    let d = serde_json::from_str(&out[1]).map_err(|e| e.to_string())?;
    Ok((out.swap_remove(0), d))
}

fn check_dump(py: &Interpreter) -> Result<String, String> {
    let script = common::fixture("subinterpreters.py");
    let t = Target(common::start_fixture(py, &script, &["wait"], false)?);
    let started: Started = line_of(&t, "interp ")?;
    let sub: Sub = line_of(&t, "sub ")?;
    wait_asleep(t.0.pid, started.native_id)?;
    let (text, d) = dump_text_and_json(t.0.pid)?;
    let mut errs = Vec::new();
    if started.id == 0 {
        errs.push("the subinterpreter has the main one's id".to_string());
    }
    // The subinterpreter's one thread state: its id, its stack, its own name for it.
    let in_sub: Vec<&DThread> = d
        .threads
        .iter()
        .filter(|th| th.interpreter == started.id)
        .collect();
    let line = common::mark(&common::fixture("subinterp_work.py"), "sub_wait") as i64;
    match in_sub[..] {
        [th] => {
            let top = th.frames.first();
            let at = top.map(|f| (f.function.as_str(), f.line));
            if at != Some(("sub_wait", Some(line)))
                || !top.is_some_and(|f| f.filename.ends_with("subinterp_work.py"))
            {
                errs.push(format!("the subinterpreter's stack starts at {at:?}"));
            }
            if th.native_id != Some(started.native_id) {
                errs.push(format!("its kernel id is {:?}", th.native_id));
            }
            if th.python_name.as_deref() != Some(sub.name.as_str()) {
                errs.push(format!(
                    "its name {:?}, want {:?}",
                    th.python_name, sub.name
                ));
            }
        }
        _ => errs.push(format!(
            "{} thread states in interpreter {}",
            in_sub.len(),
            started.id
        )),
    }
    // Every other state is the main interpreter's: the runner's, waiting in its call
    // into the subinterpreter, and the main thread.
    if let Some(th) = d
        .threads
        .iter()
        .find(|th| th.interpreter != started.id && th.interpreter != 0)
    {
        errs.push(format!("a thread state in interpreter {}", th.interpreter));
    }
    let main_of = |tid: Option<i64>| {
        d.threads
            .iter()
            .find(|th| th.interpreter == 0 && (tid.is_none() || th.native_id == tid))
    };
    match main_of(Some(started.native_id)) {
        Some(th) if th.python_name.as_deref() == Some("sub-runner") => {}
        other => errs.push(format!(
            "the runner's main state: {:?}",
            other.map(|th| &th.python_name)
        )),
    }
    if !d
        .threads
        .iter()
        .any(|th| th.interpreter == 0 && th.python_name.as_deref() == Some("MainThread"))
    {
        errs.push("no MainThread in interpreter 0".into());
    }
    // The text labels the subinterpreter's thread by its id, the others not at all.
    let labelled: Vec<&str> = text.lines().filter(|l| l.starts_with("Thread ")).collect();
    let with_id = format!(", interpreter {}", started.id);
    if labelled.iter().filter(|l| l.ends_with(&with_id)).count() != 1
        || labelled
            .iter()
            .filter(|l| l.contains("interpreter"))
            .count()
            != 1
    {
        errs.push(format!("headers: {labelled:?}"));
    }
    if errs.is_empty() {
        Ok(format!("subinterpreter {} labelled", started.id))
    } else {
        Err(errs.join("\n"))
    }
}

/// `run` of the fixture spinning in its subinterpreter: the profile checked by [`charged`].
fn check_run(py: &Interpreter) -> Result<String, String> {
    let dir = common::tempdir("scalene-rs-subinterp");
    let out = dir.join("p.json");
    let mut cmd = Command::new(common::bin());
    cmd.args(["run", "--cpu-only", "--threads", "-o"])
        .arg(&out)
        .arg("--")
        .arg(&py.path)
        .arg(common::fixture("subinterpreters.py"))
        .args(["spin", SPIN_S]);
    let r = common::run_limited(cmd, Duration::from_secs(60));
    if r.code != Some(0) || !r.stdout.contains("done") {
        return Err(format!("run: {}", r.describe()));
    }
    let started: Started = r
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("interp "))
        .ok_or("no `interp` line")
        .and_then(|j| serde_json::from_str(j).map_err(|_| "a bad `interp` line"))?;
    let p = read_profile(&out);
    let _ = std::fs::remove_dir_all(&dir);
    charged(&p?, &started)
}

/// `attach` for [`ATTACH_S`] to the fixture once its subinterpreter spins (for longer):
/// the profile checked by [`charged`].
fn check_attach(py: &Interpreter) -> Result<String, String> {
    let script = common::fixture("subinterpreters.py");
    let t = Target(common::start_fixture(py, &script, &["spin", "30"], false)?);
    let started: Started = line_of(&t, "interp ")?;
    let _: Sub = line_of(&t, "sub ")?;
    let dir = common::tempdir("scalene-rs-subinterp");
    let out = dir.join("a.json");
    let mut cmd = Command::new(common::bin());
    cmd.args(["attach", &t.0.pid.to_string(), "--cpu-only", "--threads"])
        .args(["--duration", ATTACH_S, "-o"])
        .arg(&out);
    let r = common::run_limited(cmd, Duration::from_secs(60));
    if r.code != Some(0) {
        return Err(format!("attach: {}", r.describe()));
    }
    let p = read_profile(&out);
    let _ = std::fs::remove_dir_all(&dir);
    charged(&p?, &started)
}

fn read_profile(path: &std::path::Path) -> Result<serde_json::Value, String> {
    let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    serde_json::from_str(&text).map_err(|e| e.to_string())
}

/// The subinterpreter's lines have at least 85% of the time, the main interpreter's side
/// of the fixture at most 5%; the runner's entry of the per-thread table has its name and
/// the subinterpreter among its interpreters.
fn charged(p: &serde_json::Value, started: &Started) -> Result<String, String> {
    let total = |l: &serde_json::Value| {
        ["cpu_python_pct", "cpu_native_pct", "cpu_system_pct"]
            .iter()
            .map(|k| l[*k].as_f64().unwrap_or(0.0))
            .sum::<f64>()
    };
    let file_pct = |name: &str| {
        p["files"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|f| f["filename"].as_str().is_some_and(|n| n.ends_with(name)))
            .flat_map(|f| f["lines"].as_array().into_iter().flatten())
            .map(total)
            .fold(0.0, |a, b| a + b)
    };
    // The main interpreter's side: its lines (the call into the subinterpreter, a lambda
    // of the fixture's or, folded into it, `concurrent.interpreters`' exec).
    let runner = file_pct("/subinterpreters.py");
    let sub = file_pct("subinterp_work.py");
    let mut errs = Vec::new();
    // All but startup and the making of the subinterpreter is its loop.
    if sub < 85.0 || runner > 5.0 {
        errs.push(format!(
            "the subinterpreter's lines have {sub:.1}% of the time, the main interpreter's \
             side of the fixture {runner:.1}%"
        ));
    }
    let thread = p["threads"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|t| t["native_id"].as_i64() == Some(started.native_id));
    match thread {
        Some(t) => {
            let ids: Vec<i64> = t["interpreters"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|v| v.as_i64())
                .collect();
            if !ids.contains(&started.id) {
                errs.push(format!(
                    "the runner ran in interpreters {ids:?}, not {}",
                    started.id
                ));
            }
            if t["python_name"] != "sub-runner" {
                errs.push(format!("the runner's python_name is {}", t["python_name"]));
            }
        }
        None => errs.push(format!("no thread {} in the profile", started.native_id)),
    }
    if errs.is_empty() {
        Ok(format!(
            "{sub:.1}% in the subinterpreter, {runner:.1}% on the main side"
        ))
    } else {
        Err(errs.join("\n"))
    }
}

#[test]
fn dump_labels_each_thread_state_by_its_interpreter() {
    let pythons = with_subinterpreters(common::interpreters(), "dump (subinterpreters)");
    let all: Vec<&Interpreter> = pythons.iter().collect();
    common::for_each_interpreter_alone_of(&all, check_dump);
}

#[test]
fn profiles_charge_a_subinterpreters_lines() {
    let pythons = with_subinterpreters(common::representatives(), "run (subinterpreters)");
    let all: Vec<&Interpreter> = pythons.iter().collect();
    common::for_each_interpreter_alone_of(&all, check_run);
}

#[test]
fn attach_charges_a_subinterpreters_lines() {
    let pythons = with_subinterpreters(common::representatives(), "attach (subinterpreters)");
    let all: Vec<&Interpreter> = pythons.iter().collect();
    common::for_each_interpreter_alone_of(&all, check_attach);
}

/// The interpreters whose Python can make subinterpreters (`_xxsubinterpreters`, 3.8+);
/// the others are named as left out.
fn with_private_subinterpreters(of: Vec<Interpreter>, test: &str) -> Vec<Interpreter> {
    let (yes, no): (Vec<_>, Vec<_>) = of.into_iter().partition(|i| i.version() >= (3, 8));
    for i in &no {
        common::say(&format!(
            "{test}: {}: left out: no _xxsubinterpreters before Python 3.8",
            i.label
        ));
    }
    if yes.is_empty() {
        common::skip_or_fail(test, "no Python 3.8+ in the matrix");
    }
    yes
}

/// The Python functions of a merged native stack (JSON), innermost first.
fn python_functions(stack: &serde_json::Value) -> Vec<String> {
    stack
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["kind"] == "python")
        .filter_map(|e| e["function"].as_str().map(str::to_string))
        .collect()
}

/// `dump --native` of three interpreters nested on one thread: every state merged, each
/// with its own Python frames, and the native frames between them shared out.
fn check_nested(py: &Interpreter) -> Result<String, String> {
    let script = common::fixture("nested_subinterpreters.py");
    let t = Target(common::start_fixture(py, &script, &[] as &[&str], false)?);
    let pid = t.0.pid;
    let deadline = Instant::now() + READY;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let line =
            t.0.lines
                .recv_timeout(left)
                .map_err(|_| format!("no `innermost` line in {READY:?}"))?;
        if line == "innermost" {
            break;
        }
    }
    wait_asleep(pid, pid as i64)?;
    let mut cmd = Command::new(common::bin());
    cmd.arg("dump")
        .arg(pid.to_string())
        .args(["--native", "--json"]);
    let r = common::run_limited(cmd, Duration::from_secs(60));
    if r.code != Some(0) {
        return Err(format!("dump --native: {}", r.describe()));
    }
    let d: serde_json::Value = serde_json::from_str(&r.stdout).map_err(|e| e.to_string())?;
    let states: Vec<&serde_json::Value> = d["threads"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|s| s["native_id"].as_i64() == Some(pid as i64))
        .collect();
    if states.len() != 3 {
        return Err(format!(
            "{} thread states on thread {pid}, not 3",
            states.len()
        ));
    }
    let want: [&[&str]; 3] = [
        &["innermost", "<module>"],
        &["middle_frame", "<module>"],
        &["run", "outer", "<module>"],
    ];
    let mut said = Vec::new();
    for s in &states {
        let own: Vec<String> = s["frames"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|f| f["function"].as_str().map(str::to_string))
            .collect();
        if !want.iter().any(|w| own == *w) {
            return Err(format!("a state with the frames {own:?}"));
        }
        if s["native"]["merged"] != true {
            return Err(format!(
                "the state of {} not merged: {}",
                own[0], s["native"]["unmerged"]
            ));
        }
        let merged = python_functions(&s["native"]["stack"]);
        if merged != own {
            return Err(format!("{}: merged Python frames {merged:?}", own[0]));
        }
        let natives = s["native"]["stack"]
            .as_array()
            .map_or(0, |a| a.iter().filter(|e| e["kind"] == "native").count());
        // Each state's part starts with the C code it runs in: time.sleep's, or the call
        // that runs the next interpreter's code.
        if s["native"]["stack"][0]["kind"] != "native" {
            return Err(format!("{}: no native frame inner to its frames", own[0]));
        }
        said.push(format!("{} ({natives} native)", own[0]));
    }
    Ok(format!(
        "3 states merged on one thread: {}",
        said.join(", ")
    ))
}

#[test]
fn nested_interpreters_on_one_thread_share_its_native_stack() {
    let pythons = with_private_subinterpreters(
        common::interpreters(),
        "dump --native (nested subinterpreters)",
    );
    let all: Vec<&Interpreter> = pythons.iter().collect();
    common::for_each_interpreter_alone_of(&all, check_nested);
}
