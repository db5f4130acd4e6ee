//! `--push` to a Pyroscope push endpoint on the loopback, decoded for real.
//!
//! The receiver (tests/common/pyroscope.rs) answers `POST /push.v1.PusherService/Push` as
//! Pyroscope does (the connect protocol's unary call) and decodes each `PushRequest` with
//! messages declared from Pyroscope's published field numbers (independently of
//! src/export). Every raw profile goes to `go tool pprof` (Debian's Go): the hot lines of
//! fixtures/cpu/split.py carry their share (±5 points of the whole run's) and their split
//! in every full window.
//! Faults: a backend answering 503 at first loses no window; one that refuses (400) or is
//! not there costs the program nothing (its output and exit code), and the drops are
//! counted exactly.

mod common;
#[path = "common/pyroscope.rs"]
mod receiver;

use common::{bin, fixture, mark, tempdir};
use receiver::{flat, pprof_top, proto as pyroscope, Receiver};
use std::net::TcpListener;
use std::process::Command;
use std::time::Duration;

/// The interpreter the push tests run on: the encoding does not depend on it.
fn interpreter() -> common::Interpreter {
    common::interpreters()
        .into_iter()
        .rev()
        .find(|i| !i.is_py2() && i.root.is_none() && !i.free_threaded)
        .expect("a Python 3")
}

/// `scalene-rs run [extra] --push URL -- python split.py SECONDS`: its exit code, stderr
/// and the program's stdout.
fn run_pushing(url: &str, extra: &[&str], seconds: &str) -> common::Run {
    let py = interpreter();
    let mut cmd = Command::new(bin());
    cmd.arg("run")
        .args(["--push", url])
        .args(extra)
        .arg("--")
        .arg(&py.path)
        .arg(fixture("cpu/split.py"))
        .arg(seconds);
    common::run_limited(cmd, Duration::from_secs(120))
}

/// The program ran as without us: exit 0, its truth line printed.
fn unharmed(r: &common::Run) -> Result<(), String> {
    if r.code != Some(0) || !r.stdout.contains("truth ") {
        return Err(format!("the program was harmed: {}", r.describe()));
    }
    Ok(())
}

/// The `truth python=P native=N` line: the python line's share of the two, percent.
fn python_share(stdout: &str) -> f64 {
    let line = stdout.lines().find(|l| l.starts_with("truth ")).unwrap();
    let v: Vec<f64> = line
        .split_whitespace()
        .skip(1)
        .map(|kv| kv.split_once('=').unwrap().1.parse().unwrap())
        .collect();
    100.0 * v[0] / (v[0] + v[1])
}

#[test]
fn windows_reach_a_pyroscope_receiver_with_their_hot_lines_and_split() {
    if !common::have_go("windows_reach_a_pyroscope_receiver") {
        return;
    }
    let rx = Receiver::start(Vec::new());
    let r = run_pushing(&rx.url(), &["--window", "2", "--tag", "env=test"], "9");
    unharmed(&r).unwrap();
    let truth = python_share(&r.stdout);
    let f = fixture("cpu/split.py");
    let (py, nat) = (
        format!("split.py:{}", mark(&f, "python")),
        format!("split.py:{}", mark(&f, "native")),
    );
    let dir = tempdir("scalene-rs-push");
    let reqs = rx.requests();
    assert!(
        reqs.len() >= 4,
        "9 s in 2 s windows: {} requests",
        reqs.len()
    );
    let (mut full, mut with_memory) = (0, 0);
    for (n, q) in reqs.iter().enumerate() {
        assert_eq!(q.path, "/push.v1.PusherService/Push");
        assert_eq!(q.header("content-type"), Some("application/proto"));
        assert_eq!(q.header("content-encoding"), Some("gzip"));
        let push = <pyroscope::PushRequest as prost::Message>::decode(q.body.as_slice())
            .expect("a PushRequest");
        let names: Vec<String> = push
            .series
            .iter()
            .map(|s| {
                s.labels
                    .iter()
                    .find(|l| l.name == "__name__")
                    .map(|l| l.value.clone())
                    .unwrap_or_default()
            })
            .collect();
        assert_eq!(
            names.first().map(String::as_str),
            Some("process_cpu"),
            "window {n}"
        );
        assert!(
            names.len() <= 2 && names[1..].iter().all(|m| m == "memory"),
            "{names:?}"
        );
        with_memory += usize::from(names.len() == 2);
        let cpu = &push.series[0];
        let label = |k: &str| {
            cpu.labels
                .iter()
                .find(|l| l.name == k)
                .map(|l| &l.value[..])
        };
        assert_eq!(label("service_name"), Some("split"));
        assert_eq!(label("env"), Some("test"));
        let raw = &cpu.samples[0].raw_profile;
        let rows = pprof_top(raw, "cpu", &dir, n);
        let (p, q2) = (flat(&rows, &py), flat(&rows, &nat));
        // A full window is one of the middle ones (the first starts with the program's
        // start-up, the last ends with the recording).
        if n == 0 || n + 1 == reqs.len() {
            continue;
        }
        full += 1;
        let share = 100.0 * p / (p + q2).max(1e-9);
        assert!(
            (share - truth).abs() <= 5.0,
            "window {n}: the python line {share:.1}% of the two, the run's truth {truth:.1}%"
        );
        // The split: each line's time is of its own kind.
        let by_python = pprof_top(raw, "python", &dir, n);
        let by_native = pprof_top(raw, "native", &dir, n);
        assert!(flat(&by_python, &py) >= 85.0, "window {n}: {by_python:?}");
        assert!(flat(&by_native, &nat) >= 85.0, "window {n}: {by_native:?}");
        common::say(&format!(
            "window {n}: python line {share:.1}% of the two (truth {truth:.1}%), python-time \
             {:.1}% on it, native-time {:.1}% on the native line",
            flat(&by_python, &py),
            flat(&by_native, &nat)
        ));
    }
    assert!(full >= 2, "{full} full windows");
    assert!(
        with_memory >= 2,
        "{with_memory} windows with a memory series"
    );
    assert!(r.stderr.contains("pushed"), "{}", r.stderr);
}

#[test]
fn a_backend_that_fails_at_first_loses_no_window() {
    // Two 503s: the first window is tried three times, and everything arrives.
    let rx = Receiver::start(vec![503, 503]);
    let r = run_pushing(&rx.url(), &["--cpu-only", "--window", "1"], "4");
    unharmed(&r).unwrap();
    let reqs = rx.requests();
    let sent = reqs.len() - 2;
    let said = format!("pushed {sent} windows to {}", rx.url());
    assert!(
        r.stderr.contains(&said) && !r.stderr.contains("dropped"),
        "expected {said:?} and no drop: {}",
        r.stderr
    );
    assert!(sent >= 4, "{sent} windows");
}

#[test]
fn a_backend_that_refuses_or_is_not_there_costs_the_program_nothing() {
    // 400: each window refused, counted.
    let rx = Receiver::start(vec![400; 100]);
    let r = run_pushing(&rx.url(), &["--cpu-only", "--window", "1"], "3");
    unharmed(&r).unwrap();
    let n = rx.requests().len();
    let said = format!("pushed 0 windows to {} (0 dropped, {n} refused", rx.url());
    assert!(r.stderr.contains(&said), "expected {said:?}: {}", r.stderr);
    // Nobody listening: the windows wait, are retried, and are dropped at the end.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}");
    let began = std::time::Instant::now();
    let r = run_pushing(&url, &["--cpu-only", "--window", "1"], "3");
    let took = began.elapsed();
    unharmed(&r).unwrap();
    assert!(r.stderr.contains("pushed 0 windows"), "{}", r.stderr);
    assert!(r.stderr.contains("dropped"), "{}", r.stderr);
    // The end waits for the backend at most 5 s.
    assert!(took < Duration::from_secs(15), "took {took:?}");
}
