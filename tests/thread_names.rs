//! The names a program gave its threads, beside the OS names, in `dump` on every
//! interpreter of the matrix (fixtures/thread_names.py): each thread's `python_name` in the
//! JSON is the name `threading` has for it (a plain one, a non-ASCII one, one renamed after
//! the thread started, the main thread's, dump_support's reporter), on the thread state
//! whose stack is that thread's own, and the text header says
//! `Thread TID "PYTHON NAME" (OS NAME): …` with the OS name /proc has. And a recording's
//! per-thread table (`run --threads`, on the representative interpreters) gives each thread
//! that ran the name its program gave it (fixtures/named_workers.py), beside its OS name.

mod common;

use common::Killed as Target;

use common::Interpreter;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

/// How long the fixture may take to print `ready`.
const READY: Duration = Duration::from_secs(20);

#[derive(Deserialize)]
struct Dump {
    threads: Vec<DThread>,
    python_names_unavailable: Option<String>,
}

#[derive(Deserialize)]
struct DThread {
    thread_id: u64,
    native_id: Option<i64>,
    name: Option<String>,
    python_name: Option<String>,
    frames: Vec<DFrame>,
}

#[derive(Deserialize)]
struct DFrame {
    function: String,
    line: Option<i64>,
}

fn dump(pid: i32, json: bool) -> Result<String, String> {
    let mut cmd = Command::new(common::bin());
    cmd.arg("dump").arg(pid.to_string());
    if json {
        cmd.arg("--json");
    }
    let r = common::run_limited(cmd, Duration::from_secs(60));
    if r.code != Some(0) {
        return Err(format!("dump: {}", r.describe()));
    }
    Ok(r.stdout)
}

/// The OS name of thread `tid` of `pid`, as /proc has it.
fn os_name(pid: i32, tid: i64) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm"))
        .ok()
        .map(|s| s.trim_end_matches('\n').to_string())
}

fn check(py: &Interpreter) -> Result<String, String> {
    let script = common::fixture("thread_names.py");
    let t = Target(common::start_fixture(py, &script, &[] as &[&str], false)?);
    let pid = t.0.pid;
    let lines = t.0.lines_until_ready(READY)?;
    let json_of = |prefix: &str| {
        lines
            .iter()
            .find_map(|l| l.strip_prefix(prefix))
            .ok_or(format!("no `{prefix}` line in {lines:?}"))
    };
    let names: BTreeMap<String, String> =
        serde_json::from_str(json_of("names ")?).map_err(|e| e.to_string())?;
    let roles: BTreeMap<String, (u64, Option<i64>)> =
        serde_json::from_str(json_of("threads ")?).map_err(|e| e.to_string())?;
    let d: Dump = serde_json::from_str(&dump(pid, true)?).map_err(|e| e.to_string())?;
    let mut errs = Vec::new();
    if let Some(why) = &d.python_names_unavailable {
        errs.push(format!("names said unavailable: {why}"));
    }
    // Each role: its thread by ident, its name, and its own stack beside it.
    let expect = [
        ("plain", "wait_plain"),
        ("unicode", "wait_unicode"),
        ("renamed", "wait_renamed"),
        ("main", "block_main"),
        ("reporter", "_report"),
    ];
    for (role, function) in expect {
        let (ident, _) = roles[role];
        let want = match role {
            "reporter" => "reporter",
            r => &names[r],
        };
        let Some(th) = d.threads.iter().find(|th| th.thread_id == ident) else {
            errs.push(format!("{role}: no thread {ident:#x} in the dump"));
            continue;
        };
        if th.python_name.as_deref() != Some(want) {
            errs.push(format!(
                "{role}: python_name {:?}, want {want:?}",
                th.python_name
            ));
        }
        let top = th.frames.first().map(|f| f.function.as_str());
        if top != Some(function) {
            errs.push(format!("{role}: innermost frame {top:?}, want {function}"));
        }
        if role != "reporter" {
            let line = common::mark(&script, role) as i64;
            if th.frames.first().and_then(|f| f.line) != Some(line) {
                errs.push(format!("{role}: not on line {line}"));
            }
        }
    }
    if names["renamed"] != "x" || names["main"] != "MainThread" {
        errs.push(format!(
            "the fixture's own names are not as it says: {names:?}"
        ));
    }
    // The text: the program's name in quotes, then the OS's in parentheses.
    let text = dump(pid, false)?;
    for th in &d.threads {
        let (Some(tid), Some(py_name)) = (th.native_id, &th.python_name) else {
            continue;
        };
        let os = os_name(pid, tid).unwrap_or_default();
        if th.name.as_deref() != Some(os.as_str()) {
            errs.push(format!(
                "thread {tid}: OS name {:?}, /proc says {os:?}",
                th.name
            ));
        }
        let header = format!("Thread {tid} \"{py_name}\" ({os}): ");
        if !text.lines().any(|l| l.starts_with(&header)) {
            errs.push(format!("no header {header:?} in:\n{text}"));
        }
    }
    if errs.is_empty() {
        Ok(format!("{} threads named", roles.len()))
    } else {
        Err(errs.join("\n"))
    }
}

#[test]
fn dump_shows_the_names_threads_were_given() {
    common::for_each_interpreter(check);
}

/// `run --threads` of fixtures/named_workers.py: each worker's entry of the per-thread
/// table, by kernel id, has the name the fixture says `threading` gave it.
fn check_profile(py: &Interpreter) -> Result<String, String> {
    let fixture = "named_workers.py";
    let (stdout, p) = common::record_cpu_profile(py, fixture, &["0.6"], &["--threads"])?;
    let workers: BTreeMap<String, String> = stdout
        .lines()
        .find_map(|l| l.strip_prefix("workers "))
        .ok_or("no `workers` line")
        .and_then(|j| serde_json::from_str(j).map_err(|_| "a bad `workers` line"))?;
    let threads = p["threads"].as_array().cloned().unwrap_or_default();
    let mut errs = Vec::new();
    for (tid, name) in &workers {
        let entry = threads
            .iter()
            .find(|t| t["native_id"].as_i64().map(|n| n.to_string()).as_ref() == Some(tid));
        match entry {
            Some(t) if t["python_name"].as_str() == Some(name.as_str()) => {}
            Some(t) => errs.push(format!(
                "thread {tid}: python_name {}, want {name:?}",
                t["python_name"]
            )),
            None => errs.push(format!("thread {tid} ({name}) is not in the table")),
        }
    }
    if workers.len() != 2 {
        errs.push(format!("the fixture named {workers:?}"));
    }
    if errs.is_empty() {
        Ok(format!("{} workers named", workers.len()))
    } else {
        Err(errs.join("\n"))
    }
}

#[test]
fn profiles_name_the_threads_that_ran() {
    common::for_each_representative(check_profile);
}
