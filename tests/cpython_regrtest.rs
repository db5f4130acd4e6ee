//! CPython's own regression tests under `run` with memory accounting (the preload library,
//! pymalloc wrapped) give the results they give bare: the target never pays for the
//! profiler. A selection of the modules that exercise what the library touches — threads,
//! signals, child processes, mmap, the garbage collector, tracemalloc (its hooks sit on
//! ours), faulthandler (crashing children), asyncio's child processes, ctypes and sys
//! (`sys._debugmallocstats()`: `mallocstats.rs`) — run with `python -m test`, each module
//! bare and then under `scalene-rs run`, and every test case's outcome (ok, skipped,
//! failure, error; from the runner's JUnit file) must be the same; a test case in one run
//! and not in the other is a difference too. Timings are never compared.
//!
//! On two interpreters: the oldest and the newest of the matrix whose wrappers are in
//! (3.8+, not free-threaded) and that have CPython's test package (pyenv's builds; Debian's
//! lack it). Here that is 3.8 and 3.13: the first and the last allocator and frame layouts
//! the wrappers meet with a test suite to run.
//!
//! Bounded: the slow modules run a subset (`-m` patterns, below, with the reason), every
//! run has the runner's per-test `--timeout` and is killed after [`LIMIT`]; 140 s in all
//! on a 2-core machine (the profiled runs take 1.1-3× their bare time).
mod common;

use common::{bin, run_limited, Interpreter};
use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

/// One module of the selection, with the runner's arguments that pick its test cases.
struct Module {
    name: &'static str,
    select: &'static [&'static str],
}

/// The selection. Whole modules where they take a few seconds; otherwise the classes or
/// tests named, chosen for what the library touches and to leave out those that only sleep
/// or time themselves (they prove nothing here and would make the run long and flaky).
const MODULES: &[Module] = &[
    // Threads started, joined, forked from (ThreadJoinOnShutdown forks from threads and
    // exits): the per-thread state and the handshake.
    Module {
        name: "test_threading",
        select: &["-m", "ThreadTests", "-m", "ThreadJoinOnShutdown"],
    },
    // Handlers, wake-up fds, pending and blocked signals, signals arriving in a loop.
    Module {
        name: "test_signal",
        select: &[
            "-m",
            "PosixTests",
            "-m",
            "WakeupFDTests",
            "-m",
            "WakeupSignalTests",
            "-m",
            "PendingSignalsTests",
        ],
    },
    // fork/exec with every option (each child is Python, profiled too).
    Module {
        name: "test_subprocess",
        select: &["-m", "POSIXProcessTestCase"],
    },
    Module {
        name: "test_mmap",
        select: &[],
    },
    Module {
        name: "test_gc",
        select: &[],
    },
    Module {
        name: "test_tracemalloc",
        select: &[],
    },
    // Children that crash (SIGSEGV, SIGABRT, SIGFPE, fatal errors) and dump their stacks;
    // not the `dump_traceback_later` tests, which wait for timers.
    Module {
        name: "test_faulthandler",
        select: &[
            "-m",
            "test_sig*",
            "-m",
            "test_read_null",
            "-m",
            "test_fatal_error*",
            "-m",
            "test_dump_traceback",
            "-m",
            "test_dump_traceback_threads",
            "-m",
            "test_register*",
        ],
    },
    // asyncio is large: its child processes (pipes, the child watcher's thread), with the
    // watcher that is the default on 3.8-3.13 (the others repeat the same tests).
    Module {
        name: "test_asyncio.test_subprocess",
        select: &[
            "-m",
            "SubprocessThreadedWatcherTests",
            "-m",
            "SubprocessTransportTests",
        ],
    },
    Module {
        name: "test_ctypes",
        select: &[],
    },
    Module {
        name: "test_sys",
        select: &[],
    },
];

/// The most one module's run may take (bare or profiled) before it is killed.
const LIMIT: Duration = Duration::from_secs(180);
/// The runner's own limit per test case (it then dumps the stacks and stops).
const TEST_TIMEOUT: &str = "120";

/// Each test case's outcome in one run of a module.
type Outcomes = BTreeMap<String, String>;

/// Whether `py` has CPython's test package (its regression test runner).
fn has_regrtest(py: &Interpreter) -> bool {
    Command::new(&py.path)
        .args(["-c", "import test.libregrtest"])
        .env_remove("PYTHONPATH")
        .env_remove("PYTHONHOME")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Runs `module` with `py`'s regression test runner, under `scalene-rs run` (memory
/// accounting on, as by default) when `profiled`; the outcome of each of its test cases
/// and how long it took.
fn outcomes(py: &Interpreter, module: &Module, profiled: bool) -> Result<(Outcomes, f64), String> {
    let dir = common::tempdir("scalene-rs-regrtest");
    let junit = dir.join("junit.xml");
    let mut cmd = if profiled {
        let mut c = Command::new(bin());
        c.arg("run")
            .arg("-o")
            .arg(dir.join("profile.json"))
            .arg("--")
            .arg(&py.path);
        c
    } else {
        Command::new(&py.path)
    };
    cmd.args(["-m", "test", "--timeout", TEST_TIMEOUT, "--junit-xml"])
        .arg(&junit)
        .arg(module.name)
        .args(module.select)
        .current_dir(&dir)
        .env("LC_ALL", "C.UTF-8")
        .env_remove("PYTHONPATH")
        .env_remove("PYTHONHOME");
    let started = Instant::now();
    let run = run_limited(cmd, LIMIT);
    let took = started.elapsed().as_secs_f64();
    let how = if profiled { "under run" } else { "bare" };
    let tail = |s: &str| {
        let lines: Vec<&str> = s.lines().collect();
        lines[lines.len().saturating_sub(15)..].join("\n")
    };
    if run.timed_out || !junit.is_file() {
        return Err(format!(
            "{} {how}: no results (exit {:?}{}); its output ends:\n{}\n{}",
            module.name,
            run.code,
            if run.timed_out {
                ", killed after the limit"
            } else {
                ""
            },
            tail(&run.stdout),
            tail(&run.stderr)
        ));
    }
    let read = Command::new(&py.path)
        .arg(common::repo_root().join("tests/support/junit_outcomes.py"))
        .arg(&junit)
        .output()
        .map_err(|e| format!("cannot read {}: {e}", junit.display()))?;
    if !read.status.success() {
        return Err(format!(
            "{} {how}: unreadable results: {}",
            module.name,
            String::from_utf8_lossy(&read.stderr)
        ));
    }
    let found: Outcomes = String::from_utf8_lossy(&read.stdout)
        .lines()
        .filter_map(|l| l.split_once('\t'))
        .map(|(id, outcome)| (id.to_string(), outcome.to_string()))
        .collect();
    if found.is_empty() {
        return Err(format!(
            "{} {how}: no test case ran; its output ends:\n{}",
            module.name,
            tail(&run.stdout)
        ));
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok((found, took))
}

/// "ok 208, skipped 1": the number of test cases of each outcome.
fn counts(o: &Outcomes) -> String {
    let mut n: BTreeMap<&str, usize> = BTreeMap::new();
    for outcome in o.values() {
        *n.entry(outcome).or_default() += 1;
    }
    n.iter()
        .map(|(k, v)| format!("{k} {v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The test cases whose outcome differs, one per line; empty when none does.
fn differences(bare: &Outcomes, profiled: &Outcomes) -> Vec<String> {
    let mut ids: Vec<&String> = bare.keys().chain(profiled.keys()).collect();
    ids.sort();
    ids.dedup();
    ids.into_iter()
        .filter_map(|id| {
            let (a, b) = (bare.get(id), profiled.get(id));
            (a != b).then(|| {
                let show = |o: Option<&String>| o.map_or("not run", |s| s.as_str()).to_string();
                format!("  {id}: bare {}, under run {}", show(a), show(b))
            })
        })
        .collect()
}

/// Every module of the selection on `py`: a summary, or every module's difference.
fn check(py: &Interpreter) -> Result<String, String> {
    let mut failures = Vec::new();
    for module in MODULES {
        let both = outcomes(py, module, false)
            .and_then(|bare| outcomes(py, module, true).map(|profiled| (bare, profiled)));
        let ((bare, bare_s), (profiled, profiled_s)) = match both {
            Ok(b) => b,
            Err(e) => {
                failures.push(e);
                continue;
            }
        };
        common::say(&format!(
            "{} {}: bare: {} ({bare_s:.1} s); under run: {} ({profiled_s:.1} s)",
            py.label,
            module.name,
            counts(&bare),
            counts(&profiled)
        ));
        let diff = differences(&bare, &profiled);
        if !diff.is_empty() {
            failures.push(format!(
                "{}: {} test case(s) differ under `scalene-rs run`:\n{}",
                module.name,
                diff.len(),
                diff.join("\n")
            ));
        }
    }
    if failures.is_empty() {
        Ok(format!("{} modules give the same results", MODULES.len()))
    } else {
        Err(failures.join("\n"))
    }
}

#[test]
fn cpython_regression_tests_give_the_same_results_under_run() {
    let all = common::interpreters();
    let mut eligible: Vec<&Interpreter> = all
        .iter()
        .filter(|py| py.version() >= (3, 8) && !py.free_threaded && py.root.is_none())
        .filter(|py| has_regrtest(py))
        .collect();
    eligible.sort_by_key(|py| py.version());
    let narrowed = std::env::var_os("SCALENE_RS_ONLY_PYTHONS").is_some();
    if eligible.is_empty() || (eligible.len() < 2 && !narrowed) {
        common::skip_or_fail(
            "cpython_regrtest",
            &format!(
                "two interpreters (3.8+, not free-threaded) with CPython's test package are \
                 needed, found {:?} (tools/setup.sh installs pyenv's)",
                eligible.iter().map(|p| &p.label).collect::<Vec<_>>()
            ),
        );
        return;
    }
    let chosen: Vec<&Interpreter> = if eligible.len() > 2 {
        vec![eligible[0], eligible[eligible.len() - 1]]
    } else {
        eligible
    };
    let started = Instant::now();
    common::for_each_interpreter_alone_of(&chosen, check);
    common::say(&format!(
        "cpython_regrtest: {:.0} s on {:?}",
        started.elapsed().as_secs_f64(),
        chosen.iter().map(|p| &p.label).collect::<Vec<_>>()
    ));
}
