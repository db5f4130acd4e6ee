//! `scalene-rs dump --core` against cores of every interpreter on the machine.
//!
//! - gcore (gdb's) of fixtures/dump_shapes.py, read after the process is gone: the text and
//!   JSON equal `dump` of the live process taken just before, but for what a core does not
//!   hold: the OS names of threads other than the main one (the core has `pr_fname` only),
//!   and the lines and object a core adds (`Core:`, `Command:`, the crash; `core`). The
//!   chrooted interpreters (each in a mount namespace of its own) are dumped by the kernel
//!   instead (SIGABRT, read with `--lib-root`): gdb 13's core of such a process holds zeros
//!   on its threads' stacks where the process had data (measured: ~350 words in the top
//!   32 KiB of each thread stack, Debian's 3.13-3.15), so no reader could match it; gdb's
//!   core of them is read too, and each thread must have the live stack or an error,
//!   never a shorter stack.
//! - A real crash: fixtures/core_crash.py segfaults in C (`ctypes.string_at(0)`) with a core
//!   written by the kernel (the core pattern set for the test and restored after, under the
//!   turn "core-pattern"; RLIMIT_CORE raised for the child only): the signal, the faulting
//!   address, the crashing thread marked, its Python frames at the fixture's marked lines.
//!   A chrooted interpreter (its own mount namespace, like a container's) is read with
//!   `--lib-root` its root, and without it fails with one line that says to pass it.
//! - `--native` of each: the gcore's as the live `dump --native`; the crash's merged stack
//!   from libc down to the fixture's frames.
//! - Compressed and damaged cores: tests/dump_core_damaged.rs.

mod common;

use common::cores::{
    check_one_line_error, crash_core, dump_core, have, json, kernel_core_of_running, marks,
    ok_stdout, run_bin, CORE_PATTERN, LIMIT,
};
use common::Interpreter;
use serde_json::Value;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// How long a fixture may take to print `ready`.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// The reporter of dump_support.py still has to reach its sleep after `ready`: waits
/// until the kernel shows it in a system call other than a futex wait (at most 5 s).
fn wait_reporter_asleep(pid: i32) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        let tasks = std::fs::read_dir(format!("/proc/{pid}/task"));
        let reporter = tasks.into_iter().flatten().flatten().find(|e| {
            std::fs::read_to_string(e.path().join("comm")).is_ok_and(|c| c.trim() == "reporter")
        });
        let Some(task) = reporter else { return };
        let call = std::fs::read_to_string(task.path().join("syscall")).unwrap_or_default();
        let nr = call.split(' ').next().unwrap_or("").trim();
        if nr.parse::<u32>().is_ok() && nr != "202" {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The live dump's JSON made comparable with a core's: the OS names of threads other than
/// the main one, which a core does not hold, left out of both; the core's own object off.
fn comparable(mut v: Value) -> Value {
    let pid = v["pid"].clone();
    if let Some(o) = v.as_object_mut() {
        o.remove("core");
    }
    for t in v["threads"].as_array_mut().into_iter().flatten() {
        if t["native_id"] != pid {
            t["name"] = Value::Null;
        }
    }
    v
}

/// The live dump's text made comparable with a core's: the same names left out (a thread
/// header `Thread TID "python name" (os name): ...` loses ` (os name)`), and the core's
/// lines (`Core:`, `Command:`, the crash's) off.
fn comparable_text(text: &str, pid: i32) -> String {
    let main = format!("Thread {pid} ");
    let mut out = String::new();
    for line in text.lines() {
        if ["Core: ", "Command: ", "Crash: ", "No crash: "]
            .iter()
            .any(|p| line.starts_with(p))
        {
            continue;
        }
        let mut line = line.strip_suffix(", crashed").unwrap_or(line).to_string();
        if line.starts_with("Thread ") && !line.starts_with(&main) {
            if let Some(colon) = line.find(": ") {
                let head = &line[..colon];
                if let (true, Some(open)) = (head.ends_with(')'), head.rfind(" (")) {
                    line = format!("{}{}", &head[..open], &line[colon..]);
                }
            }
        }
        out.push_str(&line);
        out.push('\n');
    }
    out
}

/// The first line where two texts differ, for a failure message.
fn first_difference(a: &str, b: &str) -> String {
    for (i, (x, y)) in a.lines().zip(b.lines()).enumerate() {
        if x != y {
            return format!("line {}: live {x:?}, core {y:?}", i + 1);
        }
    }
    format!(
        "{} lines live, {} in the core",
        a.lines().count(),
        b.lines().count()
    )
}

#[test]
fn gcore_reads_as_the_live_process() {
    if !have("gcore", "gdb", "gcore_reads_as_the_live_process") {
        return;
    }
    let script = common::fixture("dump_shapes.py");
    common::for_each_interpreter(|py| {
        let dir = common::tempdir("scalene-rs-gcore");
        let r = gcore_case(py, &script, &dir);
        let _ = std::fs::remove_dir_all(&dir);
        r
    });
}

fn gcore_case(py: &Interpreter, script: &Path, dir: &Path) -> Result<String, String> {
    let mut f = common::start_fixture(py, script, &[] as &[&str], false)?;
    let pid = f.pid;
    let ready = (|| {
        let deadline = Instant::now() + READY_TIMEOUT;
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            match f.lines.recv_timeout(left) {
                Ok(l) if l == "ready" => return Ok(()),
                Ok(_) => {}
                Err(_) => break,
            }
        }
        Err("the fixture did not print `ready`".to_string())
    })();
    let taken = ready.and_then(|()| {
        wait_reporter_asleep(pid);
        let text = ok_stdout(
            "live dump",
            &run_bin(&["dump".to_string(), pid.to_string()]),
        )?;
        let live = ok_stdout(
            "live dump --json",
            &run_bin(&["dump".to_string(), pid.to_string(), "--json".into()]),
        )?;
        let live_native = ok_stdout(
            "live dump --native --json",
            &run_bin(&[
                "dump".to_string(),
                pid.to_string(),
                "--native".into(),
                "--json".into(),
            ]),
        )?;
        let live_locals = ok_stdout(
            "live dump --locals --json",
            &run_bin(&[
                "dump".to_string(),
                pid.to_string(),
                "--locals".into(),
                "--json".into(),
            ]),
        )?;
        if py.root.is_some() {
            // gdb's core too, first (the kernel's ends the process): its stacks are the
            // live ones or an error, never shorter ones.
            let mut gcore = Command::new("gcore");
            gcore.arg("-o").arg(dir.join("gdb")).arg(pid.to_string());
            let g = common::run_limited(gcore, LIMIT);
            if g.code != Some(0) {
                return Err(format!("gcore: {}", g.describe()));
            }
            kernel_core_of_running(pid, dir)?;
        } else {
            let mut gcore = Command::new("gcore");
            gcore.arg("-o").arg(dir.join("core")).arg(pid.to_string());
            let g = common::run_limited(gcore, LIMIT);
            if g.code != Some(0) {
                return Err(format!("gcore: {}", g.describe()));
            }
        }
        Ok((text, live, live_native, live_locals))
    });
    let _ = f.child.kill();
    let _ = f.child.wait();
    let (live_text, live_json, live_native, live_locals) = taken?;
    let by = if py.root.is_some() {
        "the kernel (SIGABRT)"
    } else {
        "gcore"
    };
    let core = dir.join(format!("core.{pid}"));
    // The process is gone: what follows reads the core alone.
    assert!(
        !Path::new(&format!("/proc/{pid}/exe")).exists() || {
            // A new process may have taken the pid meanwhile: it is not ours.
            std::fs::read_link(format!("/proc/{pid}/exe")).ok() != Some(py.path.clone())
        }
    );
    // gcore's paths are the host's (gdb reads /proc/PID/maps from here): no --lib-root;
    // the kernel's are those the process saw: its root.
    let lib_root = py.root.is_some();
    let core_json = ok_stdout(
        "dump --core --json",
        &dump_core(&core, py, lib_root, &["--json"]),
    )?;
    let core_text = ok_stdout("dump --core", &dump_core(&core, py, lib_root, &[]))?;
    let (live, got) = (
        comparable(json("live", &live_json)?),
        json("core", &core_json)?,
    );
    let crash = &got["core"]["crash"];
    match py.root {
        None if !crash.is_null() => return Err(format!("a crash in gcore's core: {crash}")),
        Some(_) if crash["signal_name"] != "SIGABRT" || crash["sender"] != std::process::id() => {
            return Err(format!("not our SIGABRT: {crash}"))
        }
        _ => {}
    }
    let mut got = comparable(got);
    // The kernel names the files as the process saw them (in its root), /proc/PID/exe
    // from ours: the same file, under the root.
    let mut core_text = core_text;
    if let Some(root) = &py.root {
        let exe = got["executable"].as_str().unwrap_or("").to_string();
        let host = format!("{}{exe}", root.display());
        core_text = core_text.replacen(&format!(": {exe}\n"), &format!(": {host}\n"), 1);
        got["executable"] = Value::from(host);
    }
    if live != got {
        return Err(format!(
            "the core's JSON differs from the live dump's: {}",
            first_difference(
                &serde_json::to_string_pretty(&live).unwrap(),
                &serde_json::to_string_pretty(&got).unwrap()
            )
        ));
    }
    if py.root.is_none() && !core_text.contains("\nNo crash: ") {
        return Err(format!("no `No crash:` line: {core_text:.600}"));
    }
    let (a, b) = (
        comparable_text(&live_text, pid),
        comparable_text(&core_text, pid),
    );
    if a != b {
        return Err(format!(
            "the core's text differs from the live dump's: {}",
            first_difference(&a, &b)
        ));
    }
    // --native: the merged stacks of the live dump, from the core's registers and stacks.
    let core_native = ok_stdout(
        "dump --core --native --json",
        &dump_core(&core, py, lib_root, &["--native", "--json"]),
    )?;
    let (mut want, mut got) = (
        comparable(json("live --native", &live_native)?),
        comparable(json("core --native", &core_native)?),
    );
    if let Some(root) = &py.root {
        got["executable"] = Value::from(format!(
            "{}{}",
            root.display(),
            got["executable"].as_str().unwrap_or("")
        ));
    }
    for v in [&mut want, &mut got] {
        // Threads with no Python thread state: their OS names are not in a core either.
        for t in v["native"]["other_threads"]
            .as_array_mut()
            .into_iter()
            .flatten()
        {
            t["name"] = Value::Null;
        }
    }
    if want != got {
        return Err(format!(
            "the core's --native JSON differs from the live dump's: {}",
            first_difference(
                &serde_json::to_string_pretty(&want).unwrap(),
                &serde_json::to_string_pretty(&got).unwrap()
            )
        ));
    }
    // --locals: every frame's values, read from the core's memory as from the process's.
    let core_locals = ok_stdout(
        "dump --core --locals --json",
        &dump_core(&core, py, lib_root, &["--locals", "--json"]),
    )?;
    let (want_l, mut got_l) = (
        comparable(json("live --locals", &live_locals)?),
        comparable(json("core --locals", &core_locals)?),
    );
    if let Some(root) = &py.root {
        got_l["executable"] = Value::from(format!(
            "{}{}",
            root.display(),
            got_l["executable"].as_str().unwrap_or("")
        ));
    }
    if want_l != got_l {
        return Err(format!(
            "the core's --locals JSON differs from the live dump's: {}",
            first_difference(
                &serde_json::to_string_pretty(&want_l).unwrap(),
                &serde_json::to_string_pretty(&got_l).unwrap()
            )
        ));
    }
    let values: usize = want_l["threads"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|t| t["frames"].as_array().into_iter().flatten())
        .map(|f| f["locals"].as_array().map_or(0, Vec::len))
        .sum();
    if values == 0 {
        return Err("no frame of the fixture has a local to compare".into());
    }
    let merged = got["native"]["merged"].clone();
    let threads = live["threads"].as_array().map_or(0, Vec::len);
    let mut also =
        format!("; --native as live ({merged} merged); --locals as live ({values} values)");
    if py.root.is_some() {
        let gdb = dir.join(format!("gdb.{pid}"));
        let v = json(
            "gdb's core",
            &ok_stdout("gdb's core", &dump_core(&gdb, py, false, &["--json"]))?,
        )?;
        let (kept, refused) = never_shorter(&live, &v)?;
        let _ = std::fs::remove_file(&gdb);
        also += &format!("; gdb's core: {kept} stacks as live, {refused} refused as cut short");
    }
    Ok(format!(
        "{threads} threads, text and JSON as live, core by {by}{also}"
    ))
}

/// Each thread of the core's dump `core` has the live dump's frames or an error: never
/// others (a stack cut short where the core lacks memory). The counts of each.
fn never_shorter(live: &Value, core: &Value) -> Result<(usize, usize), String> {
    let (mut kept, mut refused) = (0, 0);
    for t in core["threads"].as_array().into_iter().flatten() {
        let l = live["threads"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|l| l["thread_id"] == t["thread_id"])
            .ok_or_else(|| format!("thread {} is not in the live dump", t["thread_id"]))?;
        if !t["error"].is_null() {
            refused += 1;
        } else if t["frames"] == l["frames"] {
            kept += 1;
        } else {
            return Err(format!(
                "thread {}: frames {} in the core, {} live",
                t["thread_id"], t["frames"], l["frames"]
            ));
        }
    }
    Ok((kept, refused))
}

/// What the crash core's JSON must say: SIGSEGV at address 0 in the main thread, marked,
/// in libc, with the Python frames the fixture marks; the waiter at its line.
fn check_crash(v: &Value, pid: i32) -> Result<(), String> {
    let script = common::fixture("core_crash.py");
    let m = marks(&script);
    let crash = &v["core"]["crash"];
    let want = [
        ("signal", Value::from(11)),
        ("signal_name", Value::from("SIGSEGV")),
        ("code_name", Value::from("SEGV_MAPERR")),
        ("address", Value::from(0)),
        ("thread", Value::from(pid)),
    ];
    for (k, w) in want {
        if crash[k] != w {
            return Err(format!("crash.{k} is {}, not {w}: {crash}", crash[k]));
        }
    }
    let module = crash["pc_place"]["module"].as_str().unwrap_or("");
    if !module.starts_with("libc") {
        return Err(format!("the crash is not placed in libc: {crash}"));
    }
    let threads = v["threads"].as_array().ok_or("no threads")?;
    let main = threads
        .iter()
        .find(|t| t["native_id"] == pid)
        .ok_or_else(|| format!("no thread {pid}"))?;
    let frames: Vec<(String, String, i64)> = main["frames"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|f| {
            (
                f["function"].as_str().unwrap_or("").to_string(),
                f["filename"].as_str().unwrap_or("").to_string(),
                f["line"].as_i64().unwrap_or(-1),
            )
        })
        .collect();
    let top = frames.first().ok_or("the crashed thread has no frames")?;
    if top.0 != "string_at" || !top.1.ends_with("ctypes/__init__.py") {
        return Err(format!(
            "the crashed thread's top frame is {top:?}, not string_at"
        ));
    }
    let ours: Vec<(&str, i64)> = frames
        .iter()
        .filter(|f| f.1.ends_with("core_crash.py"))
        .map(|f| (f.0.as_str(), f.2))
        .collect();
    let expected = [
        ("crash", m["crash"]),
        ("main", m["call"]),
        ("<module>", m["module"]),
    ];
    if ours != expected {
        return Err(format!(
            "the crashed thread's frames: {ours:?}, expected {expected:?}"
        ));
    }
    let waiter = threads.iter().any(|t| {
        t["frames"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|f| f["function"] == "waiter" && f["line"] == m["waiter"])
    });
    if !waiter {
        return Err("no thread waits at the `waiter` line".into());
    }
    Ok(())
}

#[test]
fn kernel_core_of_a_crash() {
    if !std::path::Path::new(CORE_PATTERN).exists() {
        common::skip_or_fail("kernel_core_of_a_crash", "no /proc/sys/kernel/core_pattern");
        return;
    }
    common::for_each_interpreter(|py| {
        let dir = common::tempdir("scalene-rs-kcore");
        let r = kernel_case(py, &dir);
        let _ = std::fs::remove_dir_all(&dir);
        r
    });
}

fn kernel_case(py: &Interpreter, dir: &Path) -> Result<String, String> {
    let (core, pid) = crash_core(py, dir)?;
    let v = json(
        "dump --core --json",
        &ok_stdout(
            "dump --core --json",
            &dump_core(&core, py, true, &["--json"]),
        )?,
    )?;
    check_crash(&v, pid)?;
    let text = ok_stdout("dump --core", &dump_core(&core, py, true, &[]))?;
    if !text.contains("\nCrash: SIGSEGV (SEGV_MAPERR) at address 0x0, in thread ") {
        return Err(format!("no crash line: {text:.800}"));
    }
    let marked = text
        .lines()
        .any(|l| l.starts_with(&format!("Thread {pid} ")) && l.ends_with(", crashed"));
    if !marked {
        return Err(format!("the crashed thread is not marked: {text:.800}"));
    }
    // --native: the crashed thread's stack merged, innermost a native frame in libc, its
    // Python frames among the native ones.
    let n = json(
        "dump --core --native --json",
        &ok_stdout(
            "--native",
            &dump_core(&core, py, true, &["--native", "--json"]),
        )?,
    )?;
    let main = n["threads"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|t| t["native_id"] == pid)
        .ok_or("no crashed thread under --native")?;
    let stack = main["native"]["stack"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let top = stack.first().cloned().unwrap_or_default();
    let python_in_it = stack
        .iter()
        .any(|f| f["kind"] == "python" && f["function"] == "crash");
    if main["native"]["merged"] != true
        || top["kind"] != "native"
        || !top["module"].as_str().unwrap_or("").starts_with("libc")
        || !python_in_it
    {
        return Err(format!(
            "--native: not a merged stack from libc down to `crash`: {:.600}",
            main["native"]
        ));
    }
    // Inside its own mount namespace the process saw its files at paths the host does not
    // have: without --lib-root, one line that says to pass it.
    if let Some(root) = &py.root {
        let r = dump_core(&core, py, false, &[]);
        check_one_line_error(&r, "--lib-root")?;
        // A static build's interpreter is all in its executable: `--executable` alone
        // reads the same stacks (the other files are missing: said on stderr).
        if !py.label.ends_with("-shared") {
            let exe = v["executable"].as_str().unwrap_or("");
            let given = root.join(exe.trim_start_matches('/'));
            let args = ["--executable", given.to_str().unwrap_or(""), "--json"];
            let alone = json(
                "--executable",
                &ok_stdout("--executable", &dump_core(&core, py, false, &args))?,
            )?;
            if alone["threads"] != v["threads"] {
                return Err("--executable alone: other stacks than with --lib-root".into());
            }
        }
    }
    Ok(format!(
        "SIGSEGV in {}, frames as marked, --native merged{}",
        v["core"]["crash"]["pc_place"]["module"],
        if py.root.is_some() {
            ", read with --lib-root"
        } else {
            ""
        }
    ))
}
