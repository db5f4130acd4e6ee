//! `--push` to an OTLP profiles receiver on the loopback, decoded by PyPI's generated code.
//!
//! tests/receivers/otlp_receiver.py serves `ProfilesService/Export` (grpcio) or
//! `POST /v1development/profiles` and decodes each request with opentelemetry-proto's own
//! messages (1.45.2, from opentelemetry-proto v1.10.0, the revision we send), checks what
//! the proto cannot (every table's index 0 its zero value, every index in bounds,
//! `service.name` set) and writes each request as JSON. Here, on fixtures/cpu/split.py:
//! the hot lines carry their share (±5 points of the truth of the window's own stretch) and their split in every
//! full window, the resource names the process (pid, service, runtime version), and a
//! receiver that refuses costs the program nothing, each window counted refused. Faults,
//! over both transports: UNAVAILABLE / 503 at first and a partial success (retried, then
//! counted refused, as the specification says), and a receiver down at start: no window
//! lost, each told apart by the wall-clock second it began in.
//! One interpreter (the newest Python 3), as tests/push.rs: the encoding does not depend
//! on it. The receiver's packages come from tools/setup.sh ($CACHE/otlp-venv).

mod common;

use common::{bin, fixture, mark, tempdir};
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// One recording at a time: each compares a window's shares with the fixture's truth, which
/// another recording running beside it on a small machine would skew.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

/// The receiver's Python, when tools/setup.sh made its venv.
fn receiver_python(test: &str) -> Option<PathBuf> {
    let cache = std::env::var_os("SCALENE_RS_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap()).join(".cache/scalene-rs")
        });
    let py = cache.join("otlp-venv/bin/python");
    let ok = Command::new(&py)
        .args([
            "-c",
            "import grpc, opentelemetry.proto.collector.profiles.v1development.profiles_service_pb2_grpc",
        ])
        .output()
        .is_ok_and(|o| o.status.success());
    if ok {
        Some(py)
    } else {
        common::skip_or_fail(
            test,
            &format!(
                "no {} with opentelemetry-proto and grpcio (tools/setup.sh)",
                py.display()
            ),
        );
        None
    }
}

/// A receiver process, ended when dropped.
struct Receiver {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl Receiver {
    fn start(py: &Path, transport: &str, refuse: bool) -> Receiver {
        Receiver::start_with(py, transport, if refuse { &["--refuse"] } else { &[] })
    }

    /// A receiver with the options of otlp_receiver.py (`--answers`, `--port`).
    fn start_with(py: &Path, transport: &str, options: &[&str]) -> Receiver {
        let dir = tempdir(&format!("scalene-rs-otlp-{transport}"));
        let mut cmd = Command::new(py);
        cmd.arg(common::repo_root().join("tests/receivers/otlp_receiver.py"))
            .arg(transport)
            .arg(&dir)
            .args(options)
            .stdout(Stdio::piped());
        let mut child = cmd.spawn().expect("the receiver");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port = line
            .trim()
            .strip_prefix("port ")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("the receiver said {line:?}"));
        Receiver { child, port, dir }
    }

    /// The requests received so far, in arrival order.
    fn requests(&self) -> Vec<Value> {
        let mut files: Vec<PathBuf> = std::fs::read_dir(&self.dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "json"))
            .collect();
        files.sort();
        files
            .iter()
            .map(|f| serde_json::from_str(&std::fs::read_to_string(f).unwrap()).unwrap())
            .collect()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The interpreter the tests run on: the encoding does not depend on it.
fn interpreter() -> common::Interpreter {
    common::interpreters()
        .into_iter()
        .rev()
        .find(|i| !i.is_py2() && i.root.is_none() && !i.free_threaded)
        .expect("a Python 3")
}

/// A stand-in for `python split.py SECONDS` that prints its pid and Python version first.
const WRAPPER: &str = "import os, platform, runpy, sys\n\
print('pid %d python %s' % (os.getpid(), platform.python_version()), flush=True)\n\
sys.argv = sys.argv[1:]\n\
runpy.run_path(sys.argv[0], run_name='__main__')\n";

/// `scalene-rs run --push URL [extra] -- python [wrapper] split.py SECONDS`.
fn run_pushing(url: &str, extra: &[&str], wrapped: bool, seconds: &str) -> common::Run {
    let py = interpreter();
    let mut cmd = Command::new(bin());
    // 1 kHz: a 2 s window holds ~2,000 samples, its share told within ~1 point (one
    // sigma). At 100 Hz, ~170 samples: ~4 points, and deviations of 10-14 points from the
    // truth of the window's stretch were seen in one window of three (40 ms rounds
    // against a 10 ms period: the samples fall on the rounds' phases together).
    cmd.arg("run")
        .args(["--push", url, "--rate", "1000"])
        .args(extra)
        .arg("--")
        .arg(&py.path);
    if wrapped {
        cmd.args(["-c", WRAPPER])
            .env("OTEL_SERVICE_NAME", "checkout");
    } else {
        cmd.env_remove("OTEL_SERVICE_NAME");
    }
    // Each round's totals: the truth of each window's own stretch of time.
    cmd.env("SPLIT_ROUNDS", "1");
    cmd.arg(fixture("cpu/split.py")).arg(seconds);
    common::run_limited(cmd, Duration::from_secs(120))
}

fn unharmed(r: &common::Run) {
    assert!(
        r.code == Some(0) && r.stdout.contains("truth "),
        "the program was harmed: {}",
        r.describe()
    );
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

/// The profile of sample type `kind` in a request, if any.
fn profile<'a>(req: &'a Value, kind: &str) -> Option<&'a Value> {
    req["resources"][0]["profiles"]
        .as_array()?
        .iter()
        .find(|p| p["type"] == kind)
}

/// The value on leaf line `file_line` (`split.py:24`) of a profile, and its whole.
fn flat(p: Option<&Value>, file_line: &str) -> (f64, f64) {
    let (mut on, mut all) = (0.0, 0.0);
    for (at, v) in leaves(p) {
        all += v;
        if at.ends_with(file_line) {
            on += v;
        }
    }
    (on, all)
}

/// Each sample of profile `p` (none when absent): its leaf as `file:line`, its value.
fn leaves(p: Option<&Value>) -> Vec<(String, f64)> {
    let Some(p) = p else { return Vec::new() };
    p["samples"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            let leaf = &s["stack"][0];
            let at = format!("{}:{}", leaf["file"].as_str().unwrap_or(""), leaf["line"]);
            (at, s["value"].as_f64().unwrap())
        })
        .collect()
}

/// The leaves of profile `p` that hold the most of its value, at most `n`, as
/// `file:line value%`: what a failed share names.
fn top_leaves(p: Option<&Value>, n: usize) -> Vec<String> {
    let mut by: std::collections::BTreeMap<String, f64> = Default::default();
    let mut all = 0.0;
    for (at, v) in leaves(p) {
        all += v;
        *by.entry(at).or_default() += v;
    }
    let mut v: Vec<(String, f64)> = by.into_iter().collect();
    v.sort_by(|a, b| b.1.total_cmp(&a.1));
    v.into_iter()
        .take(n)
        .map(|(at, x)| format!("{at} {:.1}%", 100.0 * x / f64::max(all, 1.0)))
        .collect()
}

/// What every OTLP push must hold: each request well formed and named, the hot lines'
/// share and split in every full window. Gives the number of full windows.
fn check_windows(reqs: &[Value], r: &common::Run, transport: &str, service: &str) -> usize {
    let truth = python_share(&r.stdout);
    let f = fixture("cpu/split.py");
    let (py, nat) = (
        format!("split.py:{}", mark(&f, "python")),
        format!("split.py:{}", mark(&f, "native")),
    );
    assert!(
        reqs.len() >= 4,
        "9 s in 2 s windows: {} requests",
        reqs.len()
    );
    let version = format!("{}.{}", interpreter().major, interpreter().minor);
    let mut full = 0;
    for (n, q) in reqs.iter().enumerate() {
        assert_eq!(q["transport"], transport);
        assert_eq!(
            q["problems"],
            serde_json::json!([]),
            "window {n}: {}",
            q["problems"]
        );
        let unnumbered = q["unnumbered"].as_array().unwrap();
        // Every location has the line CPython has for its instruction. CPython has none
        // for a few (its `f_lineno` is None there: seen at start-up, in importlib's
        // `<module>` and zipimport's `_read_directory`, at 1 kHz); those go as line 0. The
        // fixture's own frames always have theirs.
        assert!(
            unnumbered.iter().all(|f| {
                let f = f.as_str().unwrap_or("?");
                f.ends_with(":[no Python frames]") || (f != "?" && !f.contains("split.py:"))
            }),
            "window {n}: locations without a line number: {unnumbered:?}"
        );
        assert_eq!(q["metadata"]["otlp-profiles-development-version"], "1");
        let res = &q["resources"][0]["attributes"];
        assert_eq!(res["service.name"], service, "window {n}: {res}");
        assert_eq!(res["env"], "test");
        assert_eq!(res["process.runtime.name"], "cpython");
        let rt = res["process.runtime.version"].as_str().unwrap_or("");
        assert!(
            rt.starts_with(&version),
            "window {n}: runtime {rt}, expected {version}"
        );
        assert!(
            res["process.executable.name"]
                .as_str()
                .is_some_and(|e| e.starts_with("python")),
            "window {n}: {res}"
        );
        let cpu = profile(q, "cpu").expect("a cpu profile");
        assert_eq!(cpu["unit"], "nanoseconds");
        assert!(cpu["time_unix_nano"].as_u64().unwrap() > 1_600_000_000_000_000_000);
        assert!(cpu["duration_nano"].as_u64().unwrap() > 0);
        // A full window is one of the middle ones (the first starts with the program's
        // start-up, the last ends with the recording).
        if n == 0 || n + 1 == reqs.len() {
            continue;
        }
        full += 1;
        let (p, _) = flat(Some(cpu), &py);
        let (q2, _) = flat(Some(cpu), &nat);
        let share = 100.0 * p / (p + q2).max(1e-9);
        // The truth of the window's own stretch of time.
        let from = cpu["time_unix_nano"].as_u64().unwrap() as f64 / 1e9;
        let to = from + cpu["duration_nano"].as_u64().unwrap() as f64 / 1e9;
        let own = common::split_truth_between(&r.stdout, from, to).expect("rounds in the window");
        common::say(&format!(
            "{transport} window {n}: python line {share:.1}% of the two, its stretch's truth \
             {own:.1}%, {:.0} samples",
            flat(profile(q, "samples"), &py).1
        ));
        assert!(
            (share - own).abs() <= 5.0,
            "window {n}: the python line {share:.1}% of the two, the truth of its stretch \
             {own:.1}% (the run's {truth:.1}%)"
        );
        let (py_on, py_all) = flat(profile(q, "python"), &py);
        let (nat_on, nat_all) = flat(profile(q, "native"), &nat);
        let (py_pct, nat_pct) = (
            100.0 * py_on / py_all.max(1.0),
            100.0 * nat_on / nat_all.max(1.0),
        );
        assert!(
            py_pct >= 85.0,
            "window {n}: {py_pct:.1}% of the Python time on the python line; its leaves: {:?}",
            top_leaves(profile(q, "python"), 5)
        );
        assert!(
            nat_pct >= 85.0,
            "window {n}: {nat_pct:.1}% of the native time on the native line; its leaves: {:?}",
            top_leaves(profile(q, "native"), 5)
        );
        // The samples are the profile of one thread: it is named on them.
        assert!(
            cpu["samples"]
                .as_array()
                .unwrap()
                .iter()
                .all(|s| s["attributes"]["thread.id"].is_i64()),
            "window {n}: a sample without its thread"
        );
        common::say(&format!(
            "{transport} window {n}: python line {share:.1}% of the two (truth {truth:.1}%), \
             python-time {py_pct:.1}% on it, native-time {nat_pct:.1}% on the native line"
        ));
    }
    assert!(full >= 2, "{full} full windows");
    assert!(r.stderr.contains("pushed"), "{}", r.stderr);
    full
}

#[test]
fn windows_reach_an_otlp_grpc_receiver_whole() {
    let _alone = one_at_a_time();
    let Some(py) = receiver_python("windows_reach_an_otlp_grpc_receiver_whole") else {
        return;
    };
    let rx = Receiver::start(&py, "grpc", false);
    let url = format!("http://127.0.0.1:{}", rx.port);
    let r = run_pushing(
        &url,
        &[
            "--push-format",
            "otlp-grpc",
            "--window",
            "2",
            "--tag",
            "env=test",
        ],
        true,
        "9",
    );
    unharmed(&r);
    let reqs = rx.requests();
    check_windows(&reqs, &r, "grpc", "checkout");
    // The pid and version the program printed are the resource's.
    let head = r.stdout.lines().find(|l| l.starts_with("pid ")).unwrap();
    let words: Vec<&str> = head.split_whitespace().collect();
    let res = &reqs[1]["resources"][0]["attributes"];
    assert_eq!(res["process.pid"].as_i64(), words[1].parse().ok(), "{res}");
    assert_eq!(res["process.runtime.version"], words[3], "{res}");
    // With memory (the default), the allocations travel too.
    assert!(
        reqs.iter().any(|q| profile(q, "alloc_space").is_some()),
        "no alloc_space profile in any window"
    );
    let said = format!("pushed {} windows to {url}", reqs.len());
    assert!(r.stderr.contains(&said), "expected {said:?}: {}", r.stderr);
}

#[test]
fn windows_reach_an_otlp_http_receiver_whole() {
    let _alone = one_at_a_time();
    let Some(py) = receiver_python("windows_reach_an_otlp_http_receiver_whole") else {
        return;
    };
    let rx = Receiver::start(&py, "http", false);
    // Port 4318 is not ours: the path tells the protocol here.
    let url = format!("http://127.0.0.1:{}/v1development/profiles", rx.port);
    let r = run_pushing(
        &url,
        // With memory, the default. --cpu-only at 1 kHz took 680-1,600 samples a window
        // of the 2,000 asked, and one window in three put the python line 8-14 points off
        // the truth of its stretch (an open bug of the sampler's, not of the transport:
        // see the note of 2026-12-02); with memory, ~1,980 and within 0.5.
        &["--window", "2", "--tag", "env=test"],
        false,
        "9",
    );
    unharmed(&r);
    let reqs = rx.requests();
    check_windows(&reqs, &r, "http", "split");
    for q in &reqs {
        let md = &q["metadata"];
        assert_eq!(md[":path"], "/v1development/profiles");
        assert_eq!(md["content-type"], "application/x-protobuf");
        assert_eq!(md["content-encoding"], "gzip");
        assert!(
            q["resources"][0]["attributes"]["process.pid"]
                .as_i64()
                .unwrap()
                > 0
        );
    }
}

#[test]
fn a_receiver_that_refuses_costs_the_program_nothing() {
    let _alone = one_at_a_time();
    let Some(py) = receiver_python("a_receiver_that_refuses_costs_the_program_nothing") else {
        return;
    };
    for transport in ["grpc", "http"] {
        let rx = Receiver::start(&py, transport, true);
        let url = format!("http://127.0.0.1:{}", rx.port);
        let r = one_second_windows(&url, transport, "3");
        unharmed(&r);
        // INVALID_ARGUMENT and 400 are for good: each window tried once, refused, counted.
        let n = rx.requests().len();
        assert!(n >= 2, "{transport}: {n} requests");
        let said = format!("pushed 0 windows to {url} (0 dropped, {n} refused");
        assert!(
            r.stderr.contains(&said),
            "{transport}: expected {said:?}: {}",
            r.stderr
        );
    }
}

/// `run --cpu-only --window 1 --push-format otlp-TRANSPORT --push URL` of split.py for
/// `seconds`: the fault tests' recording (many short windows, each tried on its own).
fn one_second_windows(url: &str, transport: &str, seconds: &str) -> common::Run {
    let format = format!("otlp-{transport}");
    run_pushing(
        url,
        &["--cpu-only", "--window", "1", "--push-format", &format],
        false,
        seconds,
    )
}

/// The distinct windows among `reqs`, by the instant (Unix ns) their CPU profile began
/// (a window tried again arrives more than once), each with its length (ns) and the
/// answers it got.
fn windows_by_start(reqs: &[Value]) -> std::collections::BTreeMap<u64, (u64, Vec<String>)> {
    let mut by = std::collections::BTreeMap::<u64, (u64, Vec<String>)>::new();
    for q in reqs {
        let cpu = profile(q, "cpu").expect("a request without a CPU profile");
        let (t, d) = (
            cpu["time_unix_nano"].as_u64(),
            cpu["duration_nano"].as_u64(),
        );
        let (t, d) = (t.expect("no start"), d.expect("no length"));
        let w = by.entry(t).or_insert((d, Vec::new()));
        w.1.push(q["answer"].as_str().unwrap_or("").to_string());
    }
    by
}

/// The stretches (start ms, end ms, from the first window's start) between one window's
/// end and the next one's start longer than [`GAP`]: time no window covers.
/// - Windows are cut at the first tick after each second: a late tick makes a window
///   longer, never leaves time out; a lost window leaves about a second out.
fn gaps(by: &std::collections::BTreeMap<u64, (u64, Vec<String>)>) -> Vec<(u64, u64)> {
    const GAP: u64 = 100_000_000;
    let Some(first) = by.keys().next().copied() else {
        return Vec::new();
    };
    let ms = |t: u64| (t - first) / 1_000_000;
    by.iter()
        .zip(by.iter().skip(1))
        .filter_map(|((t, (d, _)), (next, _))| {
            let end = t + d;
            (*next > end + GAP).then(|| (ms(end), ms(*next)))
        })
        .collect()
}

#[test]
fn unavailable_then_partial_success_is_retried_then_counted_refused() {
    let _alone = one_at_a_time();
    let test = "unavailable_then_partial_success_is_retried_then_counted_refused";
    let Some(py) = receiver_python(test) else {
        return;
    };
    for transport in ["grpc", "http"] {
        let rx = Receiver::start_with(
            &py,
            transport,
            &["--answers", "unavailable,unavailable,partial"],
        );
        let url = format!("http://127.0.0.1:{}", rx.port);
        let r = one_second_windows(&url, transport, "6");
        unharmed(&r);
        let by = windows_by_start(&rx.requests());
        // The first window: UNAVAILABLE (503) twice, tried again each time, then taken in
        // part: not tried again (a partial success is final), counted refused.
        let first = &by.values().next().expect("no request").1;
        assert_eq!(
            first,
            &["unavailable", "unavailable", "partial"],
            "{transport}: the first window's answers"
        );
        assert!(
            by.values().skip(1).all(|(_, a)| a == &["ok"]),
            "{transport}: {by:?}"
        );
        assert!(
            gaps(&by).is_empty(),
            "{transport}: windows missing: {:?}",
            gaps(&by)
        );
        let said = format!(
            "pushed {} windows to {url} (0 dropped, 1 refused",
            by.len() - 1
        );
        assert!(
            r.stderr.contains(&said) && r.stderr.contains("rejected 1"),
            "{transport}: expected {said:?} and the rejection said: {}",
            r.stderr
        );
        common::say(&format!(
            "{transport}: {} windows, the first refused in part after two tries",
            by.len()
        ));
    }
}

#[test]
fn a_receiver_down_at_start_loses_no_window() {
    let _alone = one_at_a_time();
    let Some(py) = receiver_python("a_receiver_down_at_start_loses_no_window") else {
        return;
    };
    for transport in ["grpc", "http"] {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let url = format!("http://127.0.0.1:{port}");
        let pushing = {
            let url = url.clone();
            std::thread::spawn(move || one_second_windows(&url, transport, "8"))
        };
        // Nobody listens for the first 3 s: the windows wait and are tried with backoff.
        std::thread::sleep(Duration::from_secs(3));
        let rx = Receiver::start_with(&py, transport, &["--port", &port.to_string()]);
        let r = pushing.join().unwrap();
        unharmed(&r);
        let by = windows_by_start(&rx.requests());
        assert!(by.len() >= 8, "{transport}: {} windows: {by:?}", by.len());
        assert!(
            gaps(&by).is_empty(),
            "{transport}: windows missing: {:?}",
            gaps(&by)
        );
        let said = format!("pushed {} windows to {url}", by.len());
        let line = r.stderr.lines().find(|l| l.contains(&said));
        assert!(
            line.is_some_and(|l| !l.contains("dropped")),
            "{transport}: expected {said:?}, nothing dropped: {}",
            r.stderr
        );
        common::say(&format!(
            "{transport}: {} windows, none lost while the receiver was down",
            by.len()
        ));
    }
}
