//! `scalene-rs dump --async` against live asyncio programs, on each representative interpreter
//! (common::representatives).
//!
//! Each fixture writes its own truth (fixtures/asyncio/shapes.py `describe()`: every task's
//! coroutines as `cr_await` links them, whether it was the running one, its thread's native
//! id and the tasks that await it as asyncio itself can know it: on 3.14+ as the task records
//! it, before that the tasks whose `_fut_waiter` it is or is a `gather` child of), then stays
//! put. The dump must give, for every task: its name, its coroutine chain (function and line,
//! exactly), its thread, who awaits it; the running task's stack from the thread's own
//! frames; await cycles reported as cycles. Tasks are read from 3.11 on (3.11–3.13 through
//! the `_asyncio` module's containers, 3.14+ as CPython describes them); older versions get
//! a one-line error and exit code 6.

mod common;

use common::{Interpreter, Run};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;
use std::time::{Duration, Instant};

/// How long a fixture may take to write its truth.
const TRUTH_TIMEOUT: Duration = Duration::from_secs(30);
const DUMP_TIMEOUT: Duration = Duration::from_secs(60);
/// `exit::UNSUPPORTED_VERSION`.
const EXIT_UNSUPPORTED: i32 = 6;

fn reads_tasks(py: &Interpreter) -> bool {
    py.version() >= (3, 11)
}

fn dump(pid: i32, extra: &[&str]) -> Run {
    let mut cmd = Command::new(common::bin());
    cmd.args(["dump", "--async"])
        .args(extra)
        .arg(pid.to_string());
    common::run_limited(cmd, DUMP_TIMEOUT)
}

/// Starts `script` (under fixtures/asyncio) with the truth file as its first argument and
/// waits for that truth.
fn start(
    py: &Interpreter,
    script: &str,
    args: &[&str],
) -> Result<(common::Fixture, Value), String> {
    let dir = common::tempdir("scalene-rs-asyncio");
    let truth = dir.join("truth.json");
    let mut all = vec![truth.to_string_lossy().into_owned()];
    all.extend(args.iter().map(|s| s.to_string()));
    let mut fx = common::start_fixture(
        py,
        &common::fixture(&format!("asyncio/{script}")),
        &all,
        false,
    )?;
    let deadline = Instant::now() + TRUTH_TIMEOUT;
    loop {
        if let Ok(text) = std::fs::read_to_string(&truth) {
            let _ = std::fs::remove_dir_all(&dir);
            let v = serde_json::from_str(&text).map_err(|e| format!("truth: {e}: {text}"))?;
            return Ok((fx, v));
        }
        if let Ok(Some(status)) = fx.child.try_wait() {
            let err = fx.stderr.join().unwrap_or_default();
            return Err(format!("{script} ended ({status}) before its truth: {err}"));
        }
        if Instant::now() > deadline {
            let _ = fx.child.kill();
            let _ = fx.child.wait();
            return Err(format!("{script} wrote no truth in {TRUTH_TIMEOUT:?}"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn stop(mut fx: common::Fixture) {
    let _ = fx.child.kill();
    let _ = fx.child.wait();
}

/// The dump's tasks by name: (thread's native id, task).
fn tasks_by_name(d: &Value) -> Result<BTreeMap<String, (i64, Value)>, String> {
    let a = &d["asyncio"];
    if let Some(why) = a.get("unavailable") {
        return Err(format!("no tasks read: {why}"));
    }
    let mut out = BTreeMap::new();
    for lt in a["threads"].as_array().ok_or("no threads")? {
        for t in lt["tasks"].as_array().ok_or("no tasks")? {
            if let Some(e) = t.get("error") {
                return Err(format!("task {}: {e}", t["name"]));
            }
            let name = t["name"]
                .as_str()
                .ok_or("a task without a name")?
                .to_string();
            let tid = lt["native_id"].as_i64().unwrap_or(-1);
            if out.insert(name.clone(), (tid, t.clone())).is_some() {
                return Err(format!("two tasks named {name}"));
            }
        }
    }
    Ok(out)
}

/// (function, line) of a JSON array of frames, in its order.
fn frames_of(frames: &Value) -> Vec<(String, i64)> {
    frames
        .as_array()
        .map(|a| {
            a.iter()
                .map(|f| {
                    (
                        f["function"].as_str().unwrap_or("?").to_string(),
                        f["line"].as_i64().unwrap_or(-1),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// (function, line) of frames, outermost first (the dump's stacks are innermost first).
fn outermost_first(stack: &Value) -> Vec<(String, i64)> {
    let mut v = frames_of(stack);
    v.reverse();
    v
}

/// The program's truth of a task's coroutines, outermost first.
fn truth_chain(t: &Value) -> Vec<(String, i64)> {
    frames_of(&t["chain"])
}

/// Names of the tasks with ids `ids`.
fn names_of(ids: &Value, by_id: &BTreeMap<u64, String>) -> BTreeSet<String> {
    ids.as_array()
        .map(|a| {
            a.iter()
                .map(|i| {
                    by_id
                        .get(&i.as_u64().unwrap_or(0))
                        .cloned()
                        .unwrap_or_else(|| format!("unknown {i}"))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Every task of the truth against the dump: same names, chains (suspended tasks), threads
/// and awaiters. Returns the dump's tasks.
fn compare(d: &Value, truth: &Value) -> Result<BTreeMap<String, (i64, Value)>, String> {
    let tasks = tasks_by_name(d)?;
    let truth = truth.as_object().ok_or("truth is not an object")?;
    let want: BTreeSet<&String> = truth.keys().collect();
    let got: BTreeSet<&String> = tasks.keys().collect();
    if want != got {
        return Err(format!("tasks {got:?}, the program has {want:?}"));
    }
    let by_id: BTreeMap<u64, String> = tasks
        .iter()
        .map(|(n, (_, t))| (t["id"].as_u64().unwrap_or(0), n.clone()))
        .collect();
    for (name, t) in truth {
        let (tid, got) = &tasks[name];
        if t["thread"].as_i64() != Some(*tid) {
            return Err(format!(
                "{name}: in thread {tid}, the program says {}",
                t["thread"]
            ));
        }
        if !t["running"].as_bool().unwrap_or(false) {
            let (g, w) = (outermost_first(&got["stack"]), truth_chain(t));
            if g != w {
                return Err(format!("{name}: coroutines {g:?}, the program has {w:?}"));
            }
        }
        if let Some(by) = t.get("awaited_by") {
            let w: BTreeSet<String> = by
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|s| s.as_str().map(String::from))
                        .collect()
                })
                .unwrap_or_default();
            let g = names_of(&got["awaited_by"], &by_id);
            if g != w {
                return Err(format!("{name}: awaited by {g:?}, the program says {w:?}"));
            }
        }
    }
    Ok(tasks)
}

fn json_dump(pid: i32) -> Result<Value, String> {
    let run = dump(pid, &["--json"]);
    if run.code != Some(0) {
        return Err(format!("dump --async --json: {}", run.describe()));
    }
    serde_json::from_str(&run.stdout).map_err(|e| format!("dump's JSON: {e}"))
}

/// Versions whose tasks are not read: the one-line error, exit code 6.
fn refused(py: &Interpreter) -> Result<String, String> {
    let script = "import time; time.sleep(120)";
    let mut child = Command::new(&py.path)
        .args(["-c", script])
        .spawn()
        .map_err(|e| e.to_string())?;
    std::thread::sleep(Duration::from_millis(300));
    let run = dump(child.id() as i32, &[]);
    let _ = child.kill();
    let _ = child.wait();
    let want = "async stacks need Python 3.11 or later";
    let lines: Vec<&str> = run.stderr.lines().collect();
    if run.code != Some(EXIT_UNSUPPORTED) || lines.len() != 1 || !lines[0].contains(want) {
        return Err(format!(
            "expected exit 6 and one line saying {want:?}: {}",
            run.describe()
        ));
    }
    Ok(format!("refused: {}", lines[0]))
}

#[test]
fn a_chain_of_five_tasks_reads_whole() {
    let fixture = common::fixture("asyncio/chain.py");
    let (burn, leaf_call) = (
        common::mark(&fixture, "burn") as i64,
        common::mark(&fixture, "leaf_call") as i64,
    );
    common::for_each_representative(|py| {
        if !reads_tasks(py) {
            return refused(py);
        }
        let (fx, truth) = start(py, "chain.py", &["120"])?;
        let pid = fx.pid;
        let result = (|| {
            let d = json_dump(pid)?;
            let tasks = compare(&d, &truth)?;
            let (_, leaf) = &tasks["leaf"];
            if leaf["running"] != Value::Bool(true) {
                return Err("the leaf task is not the running one".into());
            }
            let stack = outermost_first(&leaf["stack"]);
            let want = vec![("level".to_string(), leaf_call), ("burn".to_string(), burn)];
            if stack != want {
                return Err(format!(
                    "the running leaf's stack {stack:?}, expected {want:?}"
                ));
            }
            let lt = &d["asyncio"]["threads"][0];
            if lt["running_task"] != leaf["id"] || lt["loop_running"] != Value::Bool(true) {
                return Err(format!("the loop's running task: {}", lt["running_task"]));
            }
            // The chain, root first: Task-1 → outer → t2 → t3 → t4 → leaf.
            let names = ["Task-1", "outer", "t2", "t3", "t4", "leaf"];
            for w in names.windows(2) {
                let (_, parent) = &tasks[w[0]];
                let (_, child) = &tasks[w[1]];
                if parent["awaits"] != serde_json::json!([child["id"]]) {
                    return Err(format!(
                        "{} awaits {}, not {}",
                        w[0], parent["awaits"], w[1]
                    ));
                }
            }
            let text = dump(pid, &[]);
            let t = text.stdout.as_str();
            let order: Vec<Option<usize>> = names
                .iter()
                .map(|n| t.find(&format!("task \"{n}\"")))
                .collect();
            if order.iter().any(Option::is_none) || !order.windows(2).all(|w| w[0] < w[1]) {
                return Err(format!("the text does not show the chain root first:\n{t}"));
            }
            Ok(format!(
                "{} tasks, the leaf running in burn:{burn}",
                tasks.len()
            ))
        })();
        stop(fx);
        result
    });
}

#[test]
fn diamond_gather_cycle_and_two_loops() {
    common::for_each_representative(|py| {
        if !reads_tasks(py) {
            return Ok("tasks not read (see a_chain_of_five_tasks_reads_whole)".into());
        }
        let (fx, truth) = start(py, "shapes.py", &[])?;
        let result = (|| {
            let d = json_dump(fx.pid)?;
            let tasks = compare(&d, &truth)?;
            let threads = d["asyncio"]["threads"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            let cycles: Vec<BTreeSet<String>> = threads
                .iter()
                .flat_map(|lt| lt["cycles"].as_array().cloned().unwrap_or_default())
                .map(|c| {
                    c.as_array()
                        .unwrap_or(&Vec::new())
                        .iter()
                        .filter_map(|id| tasks.iter().find(|(_, (_, t))| t["id"] == *id))
                        .map(|(n, _)| n.clone())
                        .collect()
                })
                .collect();
            let want: BTreeSet<String> = ["cyc_a", "cyc_b"].map(String::from).into();
            if cycles != vec![want] {
                return Err(format!(
                    "cycles {cycles:?}, expected one of cyc_a and cyc_b"
                ));
            }
            if threads
                .iter()
                .filter(|lt| lt["loop_running"] == Value::Bool(true))
                .count()
                != 2
            {
                return Err("expected two threads running a loop".into());
            }
            // What asyncio can know of the edges: a gather's children are linked to the task
            // awaiting the gather on every version (before 3.14 through the gather's own
            // list of children); a TaskGroup's children to the task in its `async with` only
            // from 3.14 on (before, nothing records them: no edge is made up).
            let by_id: BTreeMap<u64, String> = tasks
                .iter()
                .map(|(n, (_, t))| (t["id"].as_u64().unwrap_or(0), n.clone()))
                .collect();
            let awaits = |name: &str| names_of(&tasks[name].1["awaits"], &by_id);
            let set = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
            if awaits("gatherer") != set(&["g1", "g2"]) {
                return Err(format!("gatherer awaits {:?}", awaits("gatherer")));
            }
            let group = if py.version() >= (3, 14) {
                set(&["left", "right"])
            } else {
                set(&[])
            };
            if awaits("group") != group {
                return Err(format!(
                    "group awaits {:?}, expected {group:?}",
                    awaits("group")
                ));
            }
            let text = dump(fx.pid, &[]).stdout;
            for want in ["an await cycle", "shown above", "awaiting _GatheringFuture"] {
                if !text.contains(want) {
                    return Err(format!("the text lacks {want:?}:\n{text}"));
                }
            }
            Ok(format!(
                "{} tasks in {} threads",
                tasks.len(),
                threads.len()
            ))
        })();
        stop(fx);
        result
    });
}

#[test]
fn a_program_without_asyncio_has_no_tasks() {
    common::for_each_representative(|py| {
        if !reads_tasks(py) {
            return Ok("tasks not read".into());
        }
        // Dumped once it says it runs: a fixed wait was too short for a chroot wrapper's
        // chain of execs on a loaded machine (debian-3.14-shared was still /usr/bin/dash
        // after 500 ms at load 8).
        let mut child = Command::new(&py.path)
            .args([
                "-c",
                "import sys, time; sys.stdout.write('ready\\n'); sys.stdout.flush(); time.sleep(120)",
            ])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .map_err(|e| e.to_string())?;
        let mut ready = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.take().unwrap()),
            &mut ready,
        )
        .map_err(|e| e.to_string())?;
        let run = dump(child.id() as i32, &[]);
        let _ = child.kill();
        let _ = child.wait();
        let ok = run.code == Some(0)
            && (run.stdout.contains("is not loaded yet")
                || run.stdout.contains("Asyncio tasks: none"));
        if !ok {
            return Err(format!("{}\n{}", run.describe(), run.stdout));
        }
        let line = run
            .stdout
            .lines()
            .find(|l| l.starts_with("Asyncio"))
            .unwrap_or("");
        Ok(line.to_string())
    });
}

#[test]
fn run_async_charges_the_leaf_to_the_whole_task_chain() {
    let fixture = common::fixture("asyncio/chain.py");
    let file = fixture.to_string_lossy().into_owned();
    let line = |label: &str| common::mark(&fixture, label);
    // Root first, as collapsed stacks read.
    let chain = [
        // asyncio's own numbered name (Task-1): Task-* in samples, where such tasks add up.
        "task Task-* (<asyncio>)".to_string(),
        format!("main ({file}:{})", line("main_await")),
        "task outer (<asyncio>)".into(),
        format!("level ({file}:{})", line("await_child")),
        "task t2 (<asyncio>)".into(),
        format!("level ({file}:{})", line("await_child")),
        "task t3 (<asyncio>)".into(),
        format!("level ({file}:{})", line("await_child")),
        "task t4 (<asyncio>)".into(),
        format!("level ({file}:{})", line("await_child")),
        "task leaf (<asyncio>)".into(),
        format!("level ({file}:{})", line("leaf_call")),
        format!("burn ({file}:{})", line("burn")),
    ]
    .join(";");
    let burn = format!("burn ({file}:{})", line("burn"));
    common::for_each_representative(|py| {
        if !reads_tasks(py) {
            let mut cmd = Command::new(common::bin());
            cmd.args(["run", "--cpu-only", "--async", "--"])
                .arg(&py.path)
                .args(["-c", "import time; time.sleep(1.5)"]);
            let run = common::run_limited(cmd, DUMP_TIMEOUT);
            let said = run
                .stderr
                .lines()
                .find(|l| l.contains("--async"))
                .unwrap_or("");
            return if said.contains("async stacks") {
                Ok(format!("refused: {said}"))
            } else {
                Err(format!(
                    "--async on {:?} was not refused: {}",
                    py.version(),
                    run.describe()
                ))
            };
        }
        let dir = common::tempdir("scalene-rs-asyncio-run");
        let out = dir.join("p.json");
        let mut cmd = Command::new(common::bin());
        cmd.current_dir(common::repo_root())
            .args(["run", "--cpu-only", "--async", "-o"])
            .arg(&out)
            .arg("--")
            .arg(&py.path)
            .arg(&fixture)
            .arg(dir.join("truth.json"))
            .arg("2.5")
            .arg(dir.join("cpu.json"));
        let run = common::run_limited(cmd, DUMP_TIMEOUT);
        if run.code != Some(0) {
            let _ = std::fs::remove_dir_all(&dir);
            return Err(run.describe());
        }
        // The burning line's CPU seconds, against the program's own CPU clock: the truth,
        // ±8% (at 100 Hz the line holds ~250 samples: ~2% sampling error). Seconds, not the
        // line's share: the share's other part is start-up, which a profile that begins a
        // moment late never sees (3.15 under load: 100.0% against 91.4% of all CPU time).
        let cpu: Value = serde_json::from_str(
            &std::fs::read_to_string(dir.join("cpu.json")).unwrap_or_default(),
        )
        .map_err(|e| format!("the program's CPU truth: {e}"))?;
        let want_s = cpu["burn_cpu_s"].as_f64().unwrap_or(0.0);
        let profile: Value =
            serde_json::from_str(&std::fs::read_to_string(&out).unwrap_or_default())
                .map_err(|e| format!("the profile: {e}"))?;
        let burn_line = common::mark(&fixture, "burn");
        let got_pct = common::profile_line(&profile, "chain.py", burn_line)
            .map(|l| {
                ["cpu_python_pct", "cpu_native_pct", "cpu_system_pct"]
                    .iter()
                    .map(|k| l[*k].as_f64().unwrap_or(0.0))
                    .sum::<f64>()
            })
            .unwrap_or(0.0);
        let got_s = got_pct / 100.0 * profile["total_s"].as_f64().unwrap_or(0.0);
        if (got_s - want_s).abs() > 0.08 * want_s {
            let _ = std::fs::remove_dir_all(&dir);
            return Err(format!(
                "the burning line has {got_s:.2} s of CPU time ({got_pct:.1}%), the program says {want_s:.2} s"
            ));
        }
        // Every output shows the tasks: the profile rendered again in each format.
        let mut text = String::new();
        for format in ["collapsed", "flamegraph", "speedscope", "html", "pprof"] {
            let file = dir.join(format!("p.{format}"));
            let mut view = Command::new(common::bin());
            view.arg("view")
                .arg(&out)
                .args(["--format", format, "-o"])
                .arg(&file);
            let r = common::run_limited(view, DUMP_TIMEOUT);
            let bytes = std::fs::read(&file).unwrap_or_default();
            let shown = if format == "pprof" {
                use std::io::Read;
                let mut s = String::new();
                let mut raw = Vec::new();
                let _ = flate2::read::GzDecoder::new(&bytes[..]).read_to_end(&mut raw);
                s.push_str(&String::from_utf8_lossy(&raw));
                s
            } else {
                String::from_utf8_lossy(&bytes).into_owned()
            };
            if r.code != Some(0) || !shown.contains("task leaf") {
                let _ = std::fs::remove_dir_all(&dir);
                return Err(format!(
                    "view --format {format}: no task frame: {}",
                    r.describe()
                ));
            }
            if format == "collapsed" {
                text = shown;
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
        let (mut total, mut burning, mut whole) = (0u64, 0u64, 0u64);
        for l in text.lines() {
            let Some((stack, n)) = l.rsplit_once(' ') else {
                continue;
            };
            let n: u64 = n.parse().map_err(|_| format!("bad line {l:?}"))?;
            total += n;
            if stack.ends_with(&burn) {
                burning += n;
                if stack == chain {
                    whole += n;
                }
            }
        }
        // The leaf burns from its start to the end (2.5 s); startup and imports are the rest.
        if burning * 2 < total || whole * 100 < burning * 95 {
            return Err(format!(
                "{whole} of {burning} samples in burn carry the whole chain ({total} in all):\n{text}"
            ));
        }
        Ok(format!(
            "{whole} of {burning} samples in burn carry the 5-task chain ({total} in all); \
             the line {got_s:.2} s of CPU time, {want_s:.2} s by the program's clock"
        ))
    });
}

/// Collapsed stacks (`stack count`), summed by `key` of each stack (None: left out).
fn collapsed_by(text: &str, key: impl Fn(&str) -> Option<String>) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for l in text.lines() {
        let Some((stack, n)) = l.rsplit_once(' ') else {
            continue;
        };
        let (Some(k), Ok(n)) = (key(stack), n.parse::<u64>()) else {
            continue;
        };
        *out.entry(k).or_insert(0) += n;
    }
    out
}

/// The innermost task of a collapsed stack (root first).
fn innermost_task(stack: &str) -> Option<String> {
    stack
        .split(';')
        .filter_map(|f| f.strip_prefix("task ")?.strip_suffix(" (<asyncio>)"))
        .next_back()
        .map(String::from)
}

fn attach(pid: i32, args: &[&str], out: &std::path::Path) -> Run {
    let mut cmd = Command::new(common::bin());
    cmd.args(["attach", "--cpu-only", "--async"])
        .args(args)
        .arg("-o")
        .arg(out)
        .arg(pid.to_string());
    common::run_limited(cmd, DUMP_TIMEOUT)
}

#[test]
fn wall_charges_every_waiting_task_its_wait() {
    common::for_each_representative(|py| {
        if !reads_tasks(py) {
            return Ok("tasks not read".into());
        }
        let (fx, truth) = start(py, "shapes.py", &[])?;
        let dir = common::tempdir("scalene-rs-asyncio-wall");
        let out = dir.join("p.collapsed");
        let run = attach(fx.pid, &["--wall", "--duration", "1.5"], &out);
        let text = std::fs::read_to_string(&out).unwrap_or_default();
        let _ = std::fs::remove_dir_all(&dir);
        stop(fx);
        if run.code != Some(0) {
            return Err(run.describe());
        }
        // Every task waits the whole time (none runs once the truth is written): each is
        // the innermost task of as many samples as the others, within 10%.
        // Tasks asyncio numbered itself (Task-N) are Task-* in samples: they add up.
        let by_task = collapsed_by(&text, innermost_task);
        let mut names: BTreeMap<String, u64> = BTreeMap::new();
        for n in truth.as_object().ok_or("truth")?.keys() {
            let numbered = n
                .strip_prefix("Task-")
                .is_some_and(|d| d.bytes().all(|b| b.is_ascii_digit()));
            *names
                .entry(if numbered { "Task-*".into() } else { n.clone() })
                .or_insert(0) += 1;
        }
        let want: BTreeSet<&String> = names.keys().collect();
        let got: BTreeSet<&String> = by_task.keys().collect();
        if want != got {
            return Err(format!("waiting tasks {got:?}, the program has {want:?}"));
        }
        let per_task: Vec<u64> = by_task.iter().map(|(n, c)| c / names[n]).collect();
        let max = *per_task.iter().max().unwrap_or(&0);
        let min = *per_task.iter().min().unwrap_or(&0);
        if max == 0 || min * 10 < max * 9 {
            return Err(format!(
                "samples per waiting task {by_task:?}: not all alike"
            ));
        }
        Ok(format!(
            "{} waiting tasks, {min}–{max} samples each",
            by_task.len()
        ))
    });
}

#[test]
fn attach_finds_the_tasks_of_asyncio_imported_after_it() {
    let fixture = common::fixture("asyncio/chain.py");
    let burn = format!(
        "burn ({}:{})",
        fixture.display(),
        common::mark(&fixture, "burn")
    );
    common::for_each_representative(|py| {
        if !reads_tasks(py) {
            return Ok("tasks not read".into());
        }
        let dir = common::tempdir("scalene-rs-asyncio-late");
        let truth = dir.join("truth.json");
        let fx = common::start_fixture(
            py,
            &common::fixture("asyncio/late.py"),
            &[
                "1.0".to_string(),
                truth.to_string_lossy().into_owned(),
                "2.0".into(),
            ],
            false,
        )?;
        std::thread::sleep(Duration::from_millis(200));
        let out = dir.join("p.collapsed");
        let run = attach(fx.pid, &["--duration", "3.5"], &out);
        let text = std::fs::read_to_string(&out).unwrap_or_default();
        let _ = std::fs::remove_dir_all(&dir);
        stop(fx);
        if run.code != Some(0) {
            return Err(run.describe());
        }
        let burning = collapsed_by(&text, |s| {
            s.ends_with(&burn)
                .then(|| innermost_task(s).unwrap_or_default())
        });
        let in_leaf = burning.get("leaf").copied().unwrap_or(0);
        let all: u64 = burning.values().sum();
        if in_leaf < 50 || in_leaf * 100 < all * 95 {
            return Err(format!("samples in burn by innermost task: {burning:?}"));
        }
        Ok(format!(
            "{in_leaf} of {all} samples in burn under task leaf"
        ))
    });
}

#[test]
fn ten_thousand_tasks_churning_are_read_without_harm() {
    // A few interpreters: the load is the point, not the version (each task list is the
    // same structure on 3.14 and 3.15).
    let all = common::interpreters();
    let some: Vec<&Interpreter> = all.iter().filter(|p| reads_tasks(p)).take(2).collect();
    if some.is_empty() {
        common::skip_or_fail("ten_thousand_tasks", "no interpreter whose tasks are read");
        return;
    }
    common::for_each_interpreter_alone_of(&some, |py| {
        // Dumps while tasks come and go: every one succeeds, in bounded time.
        let fx = common::start_fixture(
            py,
            &common::fixture("asyncio/churn.py"),
            &["10000", "600"],
            false,
        )?;
        std::thread::sleep(Duration::from_millis(700));
        let mut most = 0;
        let mut slowest = Duration::ZERO;
        for _ in 0..5 {
            let t0 = Instant::now();
            let run = dump(fx.pid, &["--json"]);
            slowest = slowest.max(t0.elapsed());
            if run.code != Some(0) {
                stop(fx);
                return Err(format!("dump --async during churn: {}", run.describe()));
            }
            let v: Value = serde_json::from_str(&run.stdout).map_err(|e| e.to_string())?;
            let n = v["asyncio"]["threads"][0]["tasks"]
                .as_array()
                .map_or(0, |a| a.len());
            most = most.max(n);
        }
        // SAFETY: kill with a valid signal number and our child's pid.
        unsafe { libc::kill(fx.pid, libc::SIGUSR1) };
        let mut fx = fx;
        let status = fx.child.wait().map_err(|e| e.to_string())?;
        let said: String = fx.lines.try_iter().collect::<Vec<_>>().join("\n");
        if !status.success() || !said.starts_with("rounds ") {
            return Err(format!(
                "the program after the dumps: {status}, said {said:?}"
            ));
        }
        if most < 5_000 || slowest > Duration::from_secs(20) {
            return Err(format!(
                "at most {most} tasks read, slowest dump {slowest:?}"
            ));
        }
        // A recording that reads every task at every sample (--wall) of the same churn.
        let dir = common::tempdir("scalene-rs-asyncio-churn");
        let out = dir.join("p.collapsed");
        let mut cmd = Command::new(common::bin());
        cmd.current_dir(common::repo_root())
            .args(["run", "--cpu-only", "--async", "--wall", "-o"])
            .arg(&out)
            .arg("--")
            .arg(&py.path)
            .arg(common::fixture("asyncio/churn.py"))
            .args(["10000", "3"]);
        let run = common::run_limited(cmd, DUMP_TIMEOUT);
        let text = std::fs::read_to_string(&out).unwrap_or_default();
        let _ = std::fs::remove_dir_all(&dir);
        if run.code != Some(0) || !run.stdout.contains("rounds ") {
            return Err(format!(
                "run --async --wall of the churn: {}, stdout {:?}",
                run.describe(),
                run.stdout
            ));
        }
        let tiny = collapsed_by(&text, |s| s.contains("tiny (").then(|| "tiny".to_string()));
        if tiny.get("tiny").copied().unwrap_or(0) == 0 {
            return Err("no sample in the churning tasks".into());
        }
        Ok(format!("up to {most} tasks per dump, slowest {slowest:?}; collapsed weight {} in the tasks under --wall", tiny["tiny"]))
    });
}

#[test]
fn eager_tasks_caught_in_their_first_step() {
    let fixture = common::fixture("asyncio/eager.py");
    let (burn, e2_call) = (
        common::mark(&fixture, "eager_burn") as i64,
        common::mark(&fixture, "e2_call") as i64,
    );
    common::for_each_representative(|py| {
        if !reads_tasks(py) {
            return Ok("tasks not read (see a_chain_of_five_tasks_reads_whole)".into());
        }
        if py.version() < (3, 12) {
            return Ok("no eager tasks before 3.12".into());
        }
        let (fx, truth) = start(py, "eager.py", &["120"])?;
        let result = (|| {
            let d = json_dump(fx.pid)?;
            // Every task, the eager ones still in their first step included (3.12/3.13:
            // listed in `_eager_tasks` only), with chains and awaiters as the program has them.
            let tasks = compare(&d, &truth)?;
            let running: Vec<&String> = truth
                .as_object()
                .map(|o| {
                    o.iter()
                        .filter(|(_, t)| t["running"] == Value::Bool(true))
                        .map(|(n, _)| n)
                        .collect()
                })
                .unwrap_or_default();
            let [name] = running[..] else {
                return Err(format!("the program has running tasks {running:?}"));
            };
            let (_, t) = &tasks[name];
            let lt = &d["asyncio"]["threads"][0];
            if lt["running_task"] != t["id"] || t["running"] != Value::Bool(true) {
                return Err(format!(
                    "the loop runs {}, the program says {name}",
                    lt["running_task"]
                ));
            }
            let stack = outermost_first(&t["stack"]);
            let want = vec![("e2".to_string(), e2_call), ("burn".to_string(), burn)];
            if stack != want {
                return Err(format!(
                    "the running task's stack {stack:?}, expected {want:?}"
                ));
            }
            Ok(format!(
                "{} tasks, {name} running eagerly in burn:{burn}",
                tasks.len()
            ))
        })();
        stop(fx);
        result
    });
}
