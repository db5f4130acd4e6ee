//! The preload library and memory accounting, against each representative interpreter
//! (common::representatives): programs run unchanged under the library (Python or not), many
//! threads allocating at once neither crash nor deadlock, `run` injects the library without
//! replacing the user's LD_PRELOAD, a forked child keeps working, and a program outlives a
//! killed profiler.

mod common;

use scalene_rs::memory::consumer::PythonAllocator;
use scalene_rs::memory::preload::{preload_env, PreloadFile};
use scalene_rs::memory::ring::{Ring, RING_ENV};
use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_scalene-rs");

fn interpreters() -> Vec<common::Interpreter> {
    let all = common::interpreters();
    assert!(!all.is_empty(), "no Python interpreter found");
    all
}

/// The library and a ring no profiler reads (nobody answers handshakes).
fn library_and_ring() -> (PreloadFile, Ring) {
    let lib = PreloadFile::write(&std::env::temp_dir()).unwrap();
    let ring = Ring::create(&std::env::temp_dir(), 1024, 1 << 20, 1 << 20).unwrap();
    ring.set_handshake(false);
    (lib, ring)
}

fn output(mut cmd: Command) -> (String, i32) {
    let out = cmd.stderr(Stdio::inherit()).output().unwrap();
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        out.status.code().unwrap_or(-1),
    )
}

#[test]
fn programs_that_are_not_python_are_unaffected() {
    let (lib, ring) = library_and_ring();
    // Even when the profiler follows a program's processes, these make no ring of their own.
    ring.set_child_rings(Some(scalene_rs::memory::ring::CHILD_CAPACITY));
    for args in [
        // Files that do not change while the test runs (`ls -la /` did: /proc's link
        // count is the number of processes).
        vec![
            "ls",
            "-la",
            "/etc/passwd",
            "/bin/sh",
            "/usr/bin/env",
            "/usr/lib",
        ],
        vec!["sh", "-c", "echo hi; sort -r /etc/passwd | head -3; exit 3"],
    ] {
        let plain = {
            let mut c = Command::new(args[0]);
            c.args(&args[1..]);
            output(c)
        };
        let mut c = Command::new(args[0]);
        c.args(&args[1..])
            .env("LD_PRELOAD", lib.path())
            .env(RING_ENV, ring.path());
        assert_eq!(output(c), plain, "{args:?}");
    }
    // Not Python: the ring was not claimed, and no ring was made beside it.
    assert_eq!(ring.producer_pid(), 0);
    let own = format!("{}.", ring.path().file_name().unwrap().to_string_lossy());
    let made: Vec<_> = std::fs::read_dir(ring.path().parent().unwrap())
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(&own))
        .collect();
    assert!(made.is_empty(), "{made:?}");
}

#[test]
fn eight_threads_churning_neither_crash_nor_deadlock() {
    for py in common::representatives() {
        let (lib, ring) = library_and_ring();
        let start = Instant::now();
        let mut c = Command::new(&py.path);
        c.arg(common::fixture("memory/churn_threads.py"));
        // What `run --python-allocator malloc` sets (a free-threaded build, which does not
        // start with PYTHONMALLOC=malloc, gets its mimalloc wrapped instead).
        c.envs(preload_env(
            None,
            None,
            lib.path(),
            ring.path(),
            PythonAllocator::Malloc,
        ));
        let (out, code) = output(c);
        assert_eq!(code, 0, "{}: {out}", py.label);
        assert!(out.starts_with("ok 8 "), "{}: {out}", py.label);
        // The Python process claimed the ring and wrote events into it: a small ring that
        // nobody reads fills, and the rest are dropped and counted, never waited for.
        assert_ne!(ring.producer_pid(), 0, "{}", py.label);
        let written = ring
            .header()
            .head
            .load(std::sync::atomic::Ordering::Relaxed);
        assert_eq!(written, 1024, "{}", py.label);
        assert!(ring.dropped() > 0, "{}", py.label);
        eprintln!(
            "{}: {:?}, {} dropped",
            py.label,
            start.elapsed(),
            ring.dropped()
        );
    }
}

#[test]
fn eight_threads_churning_while_profiled() {
    for py in common::representatives() {
        let json = std::env::temp_dir().join(format!("scalene-rs-churn-{}.json", py.label));
        let out = Command::new(BIN)
            .args(["run", "-o"])
            .arg(&json)
            .arg("--")
            .arg(&py.path)
            .arg(common::fixture("memory/churn_threads.py"))
            .arg("200000")
            .stderr(Stdio::inherit())
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{}: {stdout}", py.label);
        assert!(stdout.starts_with("ok 8 "), "{}: {stdout}", py.label);
        let p: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        let m = &p["memory"];
        // 8 threads × 200 allocations of 1 MiB, all freed again.
        let alloc = m["alloc_mb"].as_f64().unwrap();
        assert!(alloc >= 800.0, "{}: {alloc} MB sampled", py.label);
        let _ = std::fs::remove_file(&json);
    }
}

#[test]
fn run_appends_to_the_users_ld_preload_and_cpu_only_injects_nothing() {
    let py = &interpreters()[0];
    // A harmless library of the user's: libc itself.
    let user = "libc.so.6";
    let run = |extra: &[&str]| {
        let out = Command::new(BIN)
            .arg("run")
            .args(extra)
            .args(["--format", "json", "-o", "/dev/null", "--"])
            .arg(&py.path)
            .arg(common::fixture("memory/env_report.py"))
            .env("LD_PRELOAD", user)
            .stderr(Stdio::null())
            .output()
            .unwrap();
        assert!(out.status.success());
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let with = run(&[]);
    let preload = with
        .lines()
        .next()
        .unwrap()
        .strip_prefix("LD_PRELOAD=")
        .unwrap();
    let parts: Vec<&str> = preload.split(':').collect();
    assert_eq!(parts.len(), 2, "{with}");
    assert_eq!(parts[0], user);
    assert!(parts[1].ends_with("libscalene_preload.so"), "{with}");
    // The written library is gone once the run is over.
    assert!(!std::path::Path::new(parts[1]).exists());

    let without = run(&["--cpu-only"]);
    assert!(
        without.contains(&format!("LD_PRELOAD={user}\n")),
        "{without}"
    );
    assert!(without.contains("PYTHONMALLOC=\n"), "{without}");

    // --keep-pymalloc: our library, Python's own allocator.
    let kept = run(&["--keep-pymalloc"]);
    assert!(kept.contains("libscalene_preload.so"), "{kept}");
    assert!(kept.contains("PYTHONMALLOC=\n"), "{kept}");
}

/// What each `--python-allocator` mode gives the program, on each representative interpreter:
/// `wrapped` (the default) keeps pymalloc serving objects and drops `PYTHONMALLOC` on 3.8+ (the
/// library wraps the allocator; that every object is then counted is checked in
/// memory_accuracy), and runs older interpreters with `PYTHONMALLOC=malloc`; `malloc` sends
/// every interpreter's objects to malloc; `pymalloc` leaves Python alone. A PYTHONMALLOC of the
/// user's own stays.
#[test]
fn each_python_allocator_mode_reaches_the_program() {
    for py in common::representatives() {
        let report = |extra: &[&str], env: Option<&str>| {
            let mut c = Command::new(BIN);
            c.arg("run")
                .args(extra)
                .args(["--format", "json", "-o", "/dev/null", "--"])
                .arg(&py.path)
                .arg(common::fixture("memory/env_report.py"))
                .env_remove("PYTHONMALLOC")
                .stderr(Stdio::null());
            if let Some(v) = env {
                c.env("PYTHONMALLOC", v);
            }
            let out = c.output().unwrap();
            assert!(out.status.success(), "{}: {extra:?}", py.label);
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            let get = |k: &str| {
                text.lines()
                    .find_map(|l| l.strip_prefix(k))
                    .unwrap_or_else(|| panic!("{}: no {k} in {text}", py.label))
                    .to_string()
            };
            (get("PYTHONMALLOC="), get("PYMALLOC_SERVES="))
        };
        // 2.7 has neither PYTHONMALLOC nor a way to ask who serves objects (always pymalloc).
        let py3 = !py.is_py2();
        let wrapped = py.version() >= (3, 8);
        let (env, serves) = report(&[], None);
        assert_eq!(
            env,
            if wrapped { "" } else { "malloc" },
            "{}: default",
            py.label
        );
        if py3 {
            let want = if wrapped { "yes" } else { "no" };
            assert_eq!(serves, want, "{}: default", py.label);
        }
        // A free-threaded build refuses PYTHONMALLOC=malloc (its objects must come from
        // mimalloc): the library drops it there and wraps mimalloc instead.
        let (env, serves) = report(&["--python-allocator", "malloc"], None);
        let ft = py.free_threaded;
        assert_eq!(env, if ft { "" } else { "malloc" }, "{}: malloc", py.label);
        if py3 {
            let want = if ft { "yes" } else { "no" };
            assert_eq!(serves, want, "{}: malloc", py.label);
        }
        let (env, serves) = report(&["--python-allocator", "pymalloc"], None);
        assert_eq!(env, "", "{}: pymalloc", py.label);
        if py3 {
            assert_eq!(serves, "yes", "{}: pymalloc", py.label);
        }
        let own = if ft {
            "mimalloc_debug"
        } else {
            "pymalloc_debug"
        };
        let (env, _) = report(&[], Some(own));
        assert_eq!(env, own, "{}: the user's own", py.label);
    }
}

/// `sys._debugmallocstats()` prints pymalloc's statistics under `run` where it does bare:
/// CPython prints them only when the object allocator is pymalloc's own function, and the
/// library puts it back for the call (preload/src/mallocstats.rs), then its wrappers again:
/// the small objects of the line after the call are counted (320 MB of them; none would
/// be without the wrappers). 3.8+ (the wrappers); 3.6 and 3.7 run with PYTHONMALLOC=malloc
/// under `run`, where pymalloc has no statistics to print; 2.7 has no such function.
#[test]
fn debugmallocstats_shows_pymalloc_under_run() {
    const PYMALLOC: &str = "Small block threshold";
    let dir = common::tempdir("scalene-rs-mallocstats");
    let script = dir.join("mallocstats.py");
    std::fs::write(
        &script,
        "import sys\nsys._debugmallocstats()\nfor i in range(3000000): s = str(i)\n",
    )
    .unwrap();
    let json = dir.join("profile.json");
    for py in common::representatives()
        .iter()
        .filter(|py| py.version() >= (3, 8))
    {
        let bare = Command::new(&py.path).arg(&script).output().unwrap();
        let run = Command::new(BIN)
            .args(["run", "--format", "json", "-o"])
            .arg(&json)
            .arg("--")
            .arg(&py.path)
            .arg(&script)
            .output()
            .unwrap();
        assert!(
            bare.status.success() && run.status.success(),
            "{}",
            py.label
        );
        let (bare_err, run_err) = (
            String::from_utf8_lossy(&bare.stderr),
            String::from_utf8_lossy(&run.stderr),
        );
        assert_eq!(
            run_err.contains(PYMALLOC),
            bare_err.contains(PYMALLOC),
            "{}: pymalloc's statistics printed bare: {}, under run: {}",
            py.label,
            bare_err.contains(PYMALLOC),
            run_err.contains(PYMALLOC)
        );
        let profile: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap())
            .unwrap_or_else(|e| panic!("{}: {e}", py.label));
        let mb = common::profile_line(&profile, "mallocstats.py", 3)
            .and_then(|l| l["mem_alloc_mb"].as_f64())
            .unwrap_or(0.0);
        assert!(
            mb > 100.0,
            "{}: {mb} MB allocated on the line after the call",
            py.label
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_forked_child_keeps_working() {
    for py in common::representatives() {
        let out = Command::new(BIN)
            .args(["run", "--format", "json", "-o", "/dev/null", "--"])
            .arg(&py.path)
            .arg(common::fixture("memory/fork_child.py"))
            .stderr(Stdio::null())
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{}: {stdout}", py.label);
        assert!(stdout.contains("child 64"), "{}: {stdout}", py.label);
        assert!(
            stdout.contains("parent 16 child-exit 7"),
            "{}: {stdout}",
            py.label
        );
    }
}

/// The profiler is SIGKILLed while the program allocates: the program finishes with the
/// output and exit status it has unprofiled, and is not held up by the handshake (each
/// wait is bounded, and after a few unanswered ones the library stops waiting).
#[test]
fn the_program_outlives_a_killed_profiler() {
    let py = interpreters().pop().unwrap();
    let script = common::fixture("memory/alloc_loop.py");
    let plain = Command::new(&py.path)
        .arg(&script)
        .arg("0.5")
        .output()
        .unwrap();
    // The program writes its exit status where we can see it after its parent is gone.
    let status_file =
        std::env::temp_dir().join(format!("scalene-rs-killed-{}", std::process::id()));
    let shell = format!(
        "{} {} 2; echo $? > {}",
        py.path.display(),
        script.display(),
        status_file.display()
    );
    let mut prof = Command::new(BIN)
        .args(["run", "-o", "/dev/null", "--", "sh", "-c", &shell])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(700));
    prof.kill().unwrap();
    let killed_at = Instant::now();
    prof.wait().unwrap();
    // The program keeps our stdout pipe open until it ends.
    let mut out = String::new();
    prof.stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    let after_kill = killed_at.elapsed();
    assert_eq!(out.as_bytes(), &plain.stdout[..]);
    let status = std::fs::read_to_string(&status_file).unwrap();
    assert_eq!(status.trim(), plain.status.code().unwrap().to_string());
    let _ = std::fs::remove_file(&status_file);
    // It had about 1.3 s left to run; a program stuck on handshakes would take far longer
    // (each of its ~thousand windows would wait).
    assert!(after_kill < Duration::from_secs(10), "{after_kill:?}");
}

fn wait_for_pid_file(path: &std::path::Path) -> i32 {
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(pid) = std::fs::read_to_string(path)
            .ok()
            .and_then(|s| s.trim().parse().ok())
        {
            return pid;
        }
        assert!(Instant::now() < until, "the program never wrote its pid");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn attach_json(pid: i32, json: &std::path::Path) -> (Value, String) {
    attach_json_with(pid, json, &[])
}

fn attach_json_with(pid: i32, json: &std::path::Path, extra: &[&str]) -> (Value, String) {
    let out = Command::new(BIN)
        .args(["attach", &pid.to_string(), "--duration", "1.5", "-o"])
        .arg(json)
        .args(extra)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stderr}");
    let p = serde_json::from_str(&std::fs::read_to_string(json).unwrap()).unwrap();
    let _ = std::fs::remove_file(json);
    (p, stderr)
}

use serde_json::Value;

/// A process started without us: `attach --cpu-only` loads nothing into it and records no
/// memory; `attach` loads our library and counts from then on, and the report says so
/// (tests/attach_memory.rs checks the figures on each representative interpreter).
#[test]
fn attach_loads_the_library_into_a_process_started_without_it_unless_cpu_only() {
    let py = interpreters()
        .into_iter()
        .rev()
        .find(|p| !p.free_threaded)
        .unwrap();
    let pid_file = std::env::temp_dir().join(format!("scalene-rs-att0-{}", std::process::id()));
    let _ = std::fs::remove_file(&pid_file);
    let mut prog = Command::new(&py.path)
        .arg(common::fixture("memory/pid_alloc_loop.py"))
        .arg(&pid_file)
        .arg("8")
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let pid = wait_for_pid_file(&pid_file);
    let json = pid_file.with_extension("json");
    let (cpu, _) = attach_json_with(pid, &json, &["--cpu-only"]);
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
    let (p, stderr) = attach_json(pid, &json);
    prog.wait().unwrap();
    let _ = std::fs::remove_file(&pid_file);
    let _ = std::fs::remove_file(pid_file.with_extension("log"));
    assert!(cpu.get("memory").is_none());
    assert!(
        !maps.contains("libscalene_preload"),
        "--cpu-only loaded the library"
    );
    assert!(
        stderr.contains("is counted from now on"),
        "{}: {stderr}",
        py.label
    );
    assert_eq!(
        p["memory"]["since_attach"],
        Value::Bool(true),
        "{}",
        py.label
    );
    assert!(
        p["memory"]["alloc_mb"].as_f64().unwrap_or(0.0) > 1.0,
        "{}",
        py.label
    );
}

/// The MiB pid_alloc_loop.py's log says it allocated between two Unix times.
fn mib_allocated_between(log: &str, from: f64, to: f64) -> f64 {
    let points: Vec<(f64, f64)> = log
        .lines()
        .filter_map(|l| {
            let (t, n) = l.split_once(' ')?;
            Some((t.parse().ok()?, n.parse().ok()?))
        })
        .collect();
    let at = |t: f64| points.iter().rev().find(|p| p.0 <= t).map_or(0.0, |p| p.1);
    at(to) - at(from)
}

/// A program started under `run` whose profiler was killed: `attach` takes its ring over,
/// and its allocations are tied to their line again.
#[test]
fn attach_reads_the_ring_of_a_program_whose_profiler_is_gone() {
    let py = interpreters().pop().unwrap();
    let fx = "memory/pid_alloc_loop.py";
    let pid_file = std::env::temp_dir().join(format!("scalene-rs-att1-{}", std::process::id()));
    let _ = std::fs::remove_file(&pid_file);
    let mut run = Command::new(BIN)
        .args(["run", "-o", "/dev/null", "--"])
        .arg(&py.path)
        .arg(common::fixture(fx))
        .arg(&pid_file)
        .arg("6")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = wait_for_pid_file(&pid_file);
    std::thread::sleep(Duration::from_millis(300));
    run.kill().unwrap();
    run.wait().unwrap();
    let json = pid_file.with_extension("json");
    // The truth's stretch: from when attach says the memory is counted to its exit. Not
    // from its start: on a loaded machine its start-up took 1.7 s of the 3.2 s it ran.
    let mut att = Command::new(BIN)
        .args(["attach", &pid.to_string(), "--duration", "1.5", "-o"])
        .arg(&json)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = common::Lines::of(&mut att);
    let mut seen = Vec::new();
    let counted = lines.wait_for("is counted from now on", &mut seen);
    let from = common::unix_now();
    let status = att.wait().unwrap();
    let to = common::unix_now();
    lines.rest(&mut seen);
    let stderr = seen.join("\n");
    assert!(counted && status.success(), "{status}: {stderr}");
    let p: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let _ = std::fs::remove_file(&json);
    let log = pid_file.with_extension("log");
    let truth = mib_allocated_between(&std::fs::read_to_string(&log).unwrap_or_default(), from, to);
    let _ = std::fs::remove_file(&pid_file);
    let _ = std::fs::remove_file(&log);
    let m = &p["memory"];
    assert!(m.is_object(), "{stderr}");
    // The fixture's own count over the stretch memory was counted, sampled every 1 MiB;
    // the end of that stretch includes the detach and the profile's writing.
    let alloc = m["alloc_mb"].as_f64().unwrap();
    assert!(
        truth > 20.0 && alloc >= 0.5 * truth && alloc <= 1.1 * truth + 2.0,
        "{alloc} MB recorded; the program allocated {truth} MiB while attach ran"
    );
    let text = std::fs::read_to_string(common::fixture(fx)).unwrap();
    let line = text.lines().position(|l| l.ends_with("# ALLOC")).unwrap() as u64 + 1;
    let on_line: f64 = p["files"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|f| f["lines"].as_array().unwrap())
        .filter(|l| l["line"].as_u64() == Some(line))
        .filter_map(|l| l["mem_alloc_mb"].as_f64())
        .sum();
    assert!(
        on_line >= 0.9 * alloc,
        "{on_line} of {alloc} MB on line {line}"
    );
}

/// The garbage collector under memory accounting: eight threads make reference cycles,
/// keep objects and collect, profiled with memory (a free-threaded build's collector walks
/// the mimalloc heaps that the library wraps): the program's own checks pass (every kept
/// object still known to `gc.get_objects()`, every cycle collected, the data intact), its
/// output is the unprofiled run's, and its objects were counted.
#[test]
fn the_garbage_collector_finds_every_object_while_memory_is_counted() {
    for py in common::representatives() {
        if py.version() < (3, 6) {
            continue; // the fixture is Python 3 (2.7's collector is the same as 3.6's)
        }
        let fx = common::fixture("memory/gc_stress.py");
        let plain = Command::new(&py.path).arg(&fx).output().unwrap();
        let json = std::env::temp_dir().join(format!("scalene-rs-gc-{}.json", py.label));
        let out = Command::new(BIN)
            .args(["run", "-o"])
            .arg(&json)
            .arg("--")
            .arg(&py.path)
            .arg(&fx)
            .stderr(Stdio::null())
            .output()
            .unwrap();
        let (want, got) = (
            String::from_utf8_lossy(&plain.stdout),
            String::from_utf8_lossy(&out.stdout),
        );
        assert!(plain.status.success(), "{}: unprofiled: {want}", py.label);
        assert!(out.status.success(), "{}: profiled: {got}", py.label);
        assert_eq!(got, want, "{}: output", py.label);
        let p: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        let _ = std::fs::remove_file(&json);
        // 8 threads × 60 rounds × 400 cycles of two nodes, a bytearray and a list: far
        // more than 20 MB, whatever the allocator.
        let alloc = p["memory"]["alloc_mb"].as_f64().unwrap();
        assert!(alloc >= 20.0, "{}: {alloc} MB counted", py.label);
        eprintln!("{}: {} ({alloc:.0} MB counted)", py.label, got.trim());
    }
}

/// A program that cannot see the preload library (here `chroot` into a root of its own,
/// with no bind of our temporary directory) records no memory: the report says so and
/// why, with no memory section (never "peak 0.0 MB"), and the program's own output and
/// exit status are untouched. Runs with every chrooted interpreter of the matrix.
#[test]
fn memory_that_could_not_be_recorded_is_said_not_recorded() {
    let rooted: Vec<_> = interpreters()
        .into_iter()
        .filter(|i| i.root.is_some() && !i.label.ends_with("-shared"))
        .collect();
    if rooted.is_empty() {
        return common::skip_or_fail(
            "memory_that_could_not_be_recorded_is_said_not_recorded",
            "no interpreter runs in a root of its own (tools/pythons.sh makes them)",
        );
    }
    for py in rooted {
        let root = py.root.as_ref().unwrap();
        // The fixture inside the root, where the chrooted program finds it.
        let dir = format!("/tmp/scalene-rs-noring-{}-{}", std::process::id(), py.label);
        let inside = root.join(dir.trim_start_matches('/'));
        std::fs::create_dir_all(&inside).unwrap();
        std::fs::copy(
            common::fixture("memory/alloc_loop.py"),
            inside.join("alloc_loop.py"),
        )
        .unwrap();
        let exe = format!("/usr/bin/python{}.{}", py.major, py.minor);
        let json = std::env::temp_dir().join(format!("scalene-rs-noring-{}.json", py.label));
        let out = Command::new(BIN)
            .args(["run", "-o"])
            .arg(&json)
            .arg("--")
            .arg("chroot")
            .arg(root)
            .args([exe.as_str(), &format!("{dir}/alloc_loop.py"), "0.5"])
            .output()
            .unwrap();
        let _ = std::fs::remove_dir_all(&inside);
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        assert_eq!(out.status.code(), Some(3), "{}: {stderr}", py.label);
        assert_eq!(stdout, "checksum 3145728\n", "{}", py.label);
        assert!(
            stderr.contains("memory not recorded: the preload library is not in the process"),
            "{}: {stderr}",
            py.label
        );
        let p: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        let _ = std::fs::remove_file(&json);
        assert!(
            p.get("memory").is_none_or(|m| m.is_null()),
            "{}: a memory section for memory not recorded: {}",
            py.label,
            p["memory"]
        );
    }
}
