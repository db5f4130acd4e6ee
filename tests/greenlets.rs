//! `dump` shows every greenlet of a gevent program (fixtures/dump_gevent.py), against the
//! truth the fixture prints: each greenlet it made by its address, its state, and, for a
//! suspended one, its own stack at the line it waits on; the one running (gevent's hub) is
//! listed once, its stack being its thread's. On every interpreter of the matrix that has
//! gevent: tools/setup.sh installs it wherever PyPI has a wheel, and says which
//! (`SCALENE_RS_GEVENT_PYTHONS`); where greenlets are not read (free-threaded builds, if
//! one had gevent), the dump says so and `--greenlets` is refused. And a process without greenlet is dumped
//! as before, with nothing said of greenlets (`--greenlets`: one line, exit 1).

mod common;

use common::Killed as Target;

use common::Interpreter;
use serde_json::Value;
use std::process::Command;
use std::time::Duration;

/// How long a fixture may take to print `ready` (a chrooted 3.15 importing gevent).
const READY: Duration = Duration::from_secs(30);
const FIXTURE: &str = "dump_gevent.py";

fn dump(pid: i32, args: &[&str]) -> common::Run {
    let mut cmd = Command::new(common::bin());
    cmd.arg("dump").arg(pid.to_string()).args(args);
    common::run_limited(cmd, Duration::from_secs(60))
}

fn dump_ok(pid: i32, args: &[&str]) -> Result<String, String> {
    let r = dump(pid, args);
    if r.code != Some(0) {
        return Err(format!("dump {args:?}: {}", r.describe()));
    }
    Ok(r.stdout)
}

/// The interpreters tools/setup.sh installed gevent for (`SCALENE_RS_GEVENT_PYTHONS`).
fn gevent_required() -> Vec<String> {
    common::setup_labels("SCALENE_RS_GEVENT_PYTHONS")
}

/// Why `py` cannot import gevent (None: it can).
fn no_gevent(py: &Interpreter) -> Option<String> {
    let out = Command::new(&py.path)
        .args(["-c", "import gevent"])
        .output()
        .map_err(|e| e.to_string());
    match out {
        Ok(o) if o.status.success() => None,
        Ok(o) => {
            let why = String::from_utf8_lossy(&o.stderr);
            Some(why.trim().lines().last().unwrap_or("").to_string())
        }
        Err(e) => Some(e),
    }
}

/// Where greenlets are read: builds with the GIL (the collector's lists).
fn greenlets_read(py: &Interpreter) -> bool {
    !py.free_threaded
}

/// One greenlet the fixture made: its address, state, function and mark.
struct Made {
    id: u64,
    state: String,
    function: String,
    mark: Option<String>,
}

fn made(lines: &[String]) -> Result<Vec<Made>, String> {
    let mut out = Vec::new();
    for l in lines {
        let Some(rest) = l.strip_prefix("greenlet ") else {
            continue;
        };
        let f: Vec<&str> = rest.split_whitespace().collect();
        let [id, state, function, mark] = f[..] else {
            return Err(format!("a bad line {l:?}"));
        };
        out.push(Made {
            id: u64::from_str_radix(id, 16).map_err(|e| format!("{l:?}: {e}"))?,
            state: state.to_string(),
            function: function.to_string(),
            mark: (mark != "-").then(|| mark.to_string()),
        });
    }
    if out.len() < 10 {
        return Err(format!(
            "the fixture named {} greenlets: {lines:?}",
            out.len()
        ));
    }
    Ok(out)
}

/// A frame's function without its class (3.11+ names methods `Class.method`).
fn bare(function: &str) -> &str {
    function.rsplit('.').next().unwrap_or(function)
}

/// What is wrong with greenlet `g` of the dump, against what the fixture made it.
fn check_one(script: &std::path::Path, m: &Made, g: &Value) -> Vec<String> {
    let mut errs = Vec::new();
    let who = format!("greenlet {:#x} ({})", m.id, m.function);
    if g["state"].as_str() != Some(m.state.as_str()) {
        errs.push(format!("{who}: state {}, want {}", g["state"], m.state));
    }
    if let Some(e) = g["error"].as_str() {
        errs.push(format!("{who}: stack not read: {e}"));
    }
    let frames = g["frames"].as_array().cloned().unwrap_or_default();
    let ours: Vec<&Value> = frames
        .iter()
        .filter(|f| f["filename"].as_str().is_some_and(|n| n.ends_with(FIXTURE)))
        .collect();
    let Some(mark) = &m.mark else {
        if !frames.is_empty() {
            errs.push(format!("{who}: not started, yet has frames {frames:?}"));
        }
        return errs;
    };
    let line = common::mark(script, mark) as i64;
    match ours.first() {
        Some(f)
            if bare(f["function"].as_str().unwrap_or("")) == m.function
                && f["line"].as_i64() == Some(line) => {}
        other => errs.push(format!(
            "{who}: innermost frame of the fixture {other:?}, want {} at line {line} \
             (frames {frames:?})",
            m.function
        )),
    }
    if m.function == "keyed" {
        // Called from C (sorted's key): the chain goes on past an entry frame of the C
        // stack (3.12+) that greenlet keeps in its copy of this greenlet's stack.
        let call = common::mark(script, "through_c") as i64;
        match ours.get(1) {
            Some(f) if f["function"] == "through_c" && f["line"].as_i64() == Some(call) => {}
            other => errs.push(format!(
                "{who}: the frame that called from C is {other:?}, want through_c at line \
                 {call}: {frames:?}"
            )),
        }
    }
    if m.function == "deep" {
        // Three calls of deep() on the way down, each at its call.
        let call = common::mark(script, "deep_call") as i64;
        let calls = ours
            .iter()
            .skip(1)
            .take_while(|f| f["function"] == "deep" && f["line"].as_i64() == Some(call))
            .count();
        if calls != 3 {
            errs.push(format!(
                "{who}: {calls} outer calls of deep, want 3: {frames:?}"
            ));
        }
    }
    errs
}

fn check(py: &Interpreter, required: &[String]) -> Result<String, String> {
    if let Some(why) = no_gevent(py) {
        if required.contains(&py.label) {
            return Err(format!(
                "tools/setup.sh installed gevent for it (SCALENE_RS_GEVENT_PYTHONS) but \
                 `import gevent` fails: {why}"
            ));
        }
        common::say(&format!(
            "greenlets [{}]: not run, no gevent for it and none required of it: {why}",
            py.label
        ));
        return Ok("no gevent (not equipped)".into());
    }
    let script = common::fixture(FIXTURE);
    let t = Target(common::start_fixture(py, &script, &[] as &[&str], false)?);
    let pid = t.0.pid;
    let lines = t.0.lines_until_ready(READY)?;
    let want = made(&lines)?;
    let d: Value = serde_json::from_str(&dump_ok(pid, &["--json"])?).map_err(|e| e.to_string())?;
    let g = &d["greenlets"];
    if !greenlets_read(py) {
        // Said, not guessed: no greenlet listed, why in the dump; --greenlets refused.
        let why = g["error"].as_str().unwrap_or("");
        let listed = g["greenlets"].as_array().map_or(0, |v| v.len());
        if !why.contains("not read") || listed != 0 {
            return Err(format!("greenlets of this build: {g}"));
        }
        let r = dump(pid, &["--greenlets"]);
        let err = r.stderr.trim();
        if r.code != Some(6) || err.lines().count() != 1 || !err.contains("not read") {
            return Err(format!("--greenlets here: {}", r.describe()));
        }
        return Ok(format!("greenlets not read, as said: {why}"));
    }
    let all = g["greenlets"].as_array().cloned().unwrap_or_default();
    let mut errs = Vec::new();
    if let Some(e) = g["error"].as_str() {
        errs.push(format!("the dump says: {e}"));
    }
    let mut ids: Vec<u64> = all.iter().filter_map(|g| g["id"].as_u64()).collect();
    ids.sort_unstable();
    ids.dedup();
    if ids.len() != all.len() {
        errs.push(format!("a greenlet listed twice: {all:?}"));
    }
    let mut shown = 0;
    for m in &want {
        match all.iter().find(|g| g["id"].as_u64() == Some(m.id)) {
            Some(g) => {
                let e = check_one(&script, m, g);
                shown += usize::from(e.is_empty());
                errs.extend(e);
            }
            None => errs.push(format!(
                "greenlet {:#x} ({}) not in the dump",
                m.id, m.function
            )),
        }
    }
    // The hub runs (the thread's stack is its loop): listed once, without a stack.
    let running: Vec<&Value> = all.iter().filter(|g| g["state"] == "running").collect();
    let hub_on_thread = d["threads"].as_array().is_some_and(|ts| {
        ts.iter().any(|t| {
            t["frames"].as_array().is_some_and(|fs| {
                fs.iter().any(|f| {
                    f["filename"]
                        .as_str()
                        .is_some_and(|n| n.ends_with("gevent/hub.py"))
                })
            })
        })
    });
    match running[..] {
        [r] if r["frames"].as_array().is_some_and(|f| f.is_empty()) && hub_on_thread => {}
        _ => errs.push(format!(
            "want one running greenlet without frames, the hub on the thread's stack \
             ({hub_on_thread}): {running:?}"
        )),
    }
    // The text names each greenlet, its state and where a suspended one waits.
    let text = dump_ok(pid, &[])?;
    for m in &want {
        let state = if m.state == "unstarted" {
            "not started"
        } else {
            &m.state
        };
        let head = format!("Greenlet {:#x} (", m.id);
        if !text
            .lines()
            .any(|l| l.starts_with(&head) && l.ends_with(&format!(": {state}")))
        {
            errs.push(format!("no line {head}…: {state} in the text:\n{text}"));
        }
    }
    if errs.is_empty() {
        Ok(format!(
            "{shown} of {} greenlets shown at their lines, and the running hub",
            want.len()
        ))
    } else {
        Err(errs.join("\n"))
    }
}

#[test]
fn dump_shows_every_greenlet_of_a_gevent_program() {
    let required = gevent_required();
    assert!(
        !(required.is_empty() && common::ci_mode()),
        "CI mode, but SCALENE_RS_GEVENT_PYTHONS (the interpreters tools/setup.sh equipped \
         with gevent) is not set: run tools/setup.sh first"
    );
    let all = common::interpreters();
    if std::env::var_os("SCALENE_RS_ONLY_PYTHONS").is_none() {
        for label in &required {
            assert!(
                all.iter().any(|py| &py.label == label),
                "{label}: listed in SCALENE_RS_GEVENT_PYTHONS but not in the interpreter matrix"
            );
        }
    }
    let ran = std::sync::Mutex::new(0);
    common::for_each_interpreter(|py| {
        let r = check(py, &required)?;
        if r.contains("greenlets shown") {
            *ran.lock().unwrap() += 1;
        }
        Ok(r)
    });
    let ran = *ran.lock().unwrap();
    if ran == 0 {
        common::skip_or_fail(
            "dump_shows_every_greenlet_of_a_gevent_program",
            "no interpreter whose greenlets are read has gevent (tools/setup.sh installs it)",
        );
    }
}

/// A process that never imported greenlet: its dump says nothing of greenlets, in JSON or
/// text; `--greenlets` is one line, exit 1.
fn check_without(py: &Interpreter) -> Result<String, String> {
    let script = common::fixture("thread_names.py");
    let t = Target(common::start_fixture(py, &script, &[] as &[&str], false)?);
    let pid = t.0.pid;
    t.0.lines_until_ready(READY)?;
    let d: Value = serde_json::from_str(&dump_ok(pid, &["--json"])?).map_err(|e| e.to_string())?;
    if d.get("greenlets").is_some() {
        return Err(format!(
            "greenlets in a dump without greenlet: {}",
            d["greenlets"]
        ));
    }
    let text = dump_ok(pid, &[])?;
    if text.contains("Greenlet") {
        return Err(format!("the text speaks of greenlets:\n{text}"));
    }
    let r = dump(pid, &["--greenlets"]);
    let err = r.stderr.trim();
    if r.code != Some(1) || err.lines().count() != 1 || !err.contains("has not imported greenlet") {
        return Err(format!("--greenlets without greenlet: {}", r.describe()));
    }
    Ok("nothing said of greenlets; --greenlets refused".into())
}

#[test]
fn a_dump_without_greenlet_says_nothing_of_greenlets() {
    common::for_each_representative(check_without);
}
