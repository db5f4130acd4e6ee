//! `--push` to a Pyroscope push endpoint on the loopback, decoded for real.
//!
//! The receiver (tests/common/pyroscope.rs) answers `POST /push.v1.PusherService/Push` as
//! Pyroscope does (the connect protocol's unary call) and decodes each `PushRequest` with
//! messages declared from Pyroscope's published field numbers (independently of
//! src/export). Every raw
//! profile goes to `go tool pprof` (Debian's Go): the hot lines of fixtures/cpu/split.py
//! carry their share (±5 points of the truth of the window's own stretch, at 1 kHz) and
//! their split in every full window.
//! Faults (tests/common/receiver.rs plays the backend):
//! - answering 503 at first, down at start, killed mid-run and back, or stalling for a
//!   minute: no window lost (each window said pushed arrives, once or more);
//! - stalling: sampling keeps its rate while the exporter waits;
//! - https (tests/receivers/https.py, a certificate of a private CA made by `openssl`):
//!   trusted with `SCALENE_RS_PUSH_CA`, refused without it, a missing CA file one line;
//! - refusing (400) or never there: the program's output and exit code unchanged, the
//!   drops counted exactly;
//! - a full queue (`--push-queue 2`, 503s for 7 s): the oldest windows dropped, counted
//!   exactly in the log and in the note of the next window.

mod common;
#[path = "common/pyroscope.rs"]
mod receiver;

use common::{bin, fixture, mark, tempdir};
use receiver::{flat, pprof_comments, pprof_times, pprof_top, proto as pyroscope, Receiver};
use std::net::TcpListener;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

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
    run_pushing_with(url, extra, seconds, &[])
}

/// [`run_pushing`] with `env` set for `scalene-rs`.
/// (The program inherits `env` too: split.py's SPLIT_ROUNDS goes there.)
fn run_pushing_with(url: &str, extra: &[&str], seconds: &str, env: &[(&str, &str)]) -> common::Run {
    let py = interpreter();
    let mut cmd = Command::new(bin());
    cmd.envs(env.iter().copied());
    cmd.arg("run")
        .args(["--push", url])
        .args(extra)
        .arg("--")
        .arg(&py.path)
        .arg(fixture("cpu/split.py"))
        .arg(seconds);
    common::run_limited(cmd, Duration::from_secs(300))
}

/// The program ran as without us: exit 0, its truth line printed.
fn unharmed(r: &common::Run) -> Result<(), String> {
    if r.code != Some(0) || !r.stdout.contains("truth ") {
        return Err(format!("the program was harmed: {}", r.describe()));
    }
    Ok(())
}

#[test]
fn windows_reach_a_pyroscope_receiver_with_their_hot_lines_and_split() {
    if !common::have_go("windows_reach_a_pyroscope_receiver") {
        return;
    }
    let rx = Receiver::start(Vec::new());
    // 1 kHz: a 2 s window holds ~2,000 samples, its share told within ~1 point; each
    // window is held to the truth of its own stretch (split.py's rounds), as in
    // tests/push_otlp.rs. At 100 Hz against the whole run's truth a window's ~170 samples
    // missed by 10-14 points now and then (40 ms rounds against a 10 ms period).
    let r = run_pushing_with(
        &rx.url(),
        &["--window", "2", "--tag", "env=test", "--rate", "1000"],
        "9",
        &[("SPLIT_ROUNDS", "1")],
    );
    unharmed(&r).unwrap();
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
        let t = receiver::pprof_times(raw);
        let from = t.time_nanos as f64 / 1e9;
        let to = from + t.duration_nanos as f64 / 1e9;
        let truth = common::split_truth_between(&r.stdout, from, to).expect("rounds in the window");
        assert!(
            (share - truth).abs() <= 5.0,
            "window {n}: the python line {share:.1}% of the two, its stretch's truth {truth:.1}%"
        );
        // The split: each line's time is of its own kind.
        let by_python = pprof_top(raw, "python", &dir, n);
        let by_native = pprof_top(raw, "native", &dir, n);
        assert!(flat(&by_python, &py) >= 85.0, "window {n}: {by_python:?}");
        assert!(flat(&by_native, &nat) >= 85.0, "window {n}: {by_native:?}");
        common::say(&format!(
            "window {n}: python line {share:.1}% of the two (its stretch {truth:.1}%), python-time \
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
fn a_full_queue_drops_the_oldest_windows_and_counts_them_exactly() {
    // The first window is taken; the next three tries get 503 and wait 1, 2 and 4 s: about
    // 7 s of 1 s windows pile up in a queue of 2, and the oldest go. Windows end at
    // wall-clock multiples of 1 s, so each is told apart by the second it began in and the
    // test finds the missing ones itself, against what scalene-rs says it dropped.
    let rx = Receiver::start(vec![200, 503, 503, 503]);
    let r = run_pushing(
        &rx.url(),
        &["--cpu-only", "--window", "1", "--push-queue", "2"],
        "12",
    );
    unharmed(&r).unwrap();
    let mut windows: Vec<(i64, Vec<String>)> = rx
        .accepted()
        .iter()
        .map(|q| {
            let push = q.push();
            let raw = &push.series[0].samples[0].raw_profile;
            (
                pprof_times(raw).time_nanos.div_euclid(1_000_000_000),
                pprof_comments(raw),
            )
        })
        .collect();
    windows.sort();
    windows.dedup_by_key(|w| w.0);
    let (first, last) = (windows[0].0, windows[windows.len() - 1].0);
    let missing: Vec<i64> = (first..=last)
        .filter(|s| windows.binary_search_by_key(s, |w| w.0).is_err())
        .collect();
    let said = format!(
        "pushed {} windows to {} ({} dropped, 0 refused",
        windows.len(),
        rx.url(),
        missing.len()
    );
    assert!(
        r.stderr.contains(&said),
        "expected {said:?} (missing: the windows of seconds {missing:?}): {}",
        r.stderr
    );
    // 503s for 7 s in a queue of 2: a few dropped, the oldest first (one run of them).
    assert!(missing.len() >= 3, "{} dropped", missing.len());
    assert_eq!(
        missing.last().unwrap() - missing[0] + 1,
        missing.len() as i64,
        "not the oldest first: {missing:?}"
    );
    // Each window says how many were dropped before it was cut: none before the drops,
    // all of them in the last.
    let dropped_before = |w: &(i64, Vec<String>)| -> u64 {
        w.1.iter()
            .find_map(|c| {
                c.strip_prefix("scalene-rs: ")?
                    .strip_suffix(" earlier windows dropped")?
                    .parse()
                    .ok()
            })
            .unwrap_or(0)
    };
    assert_eq!(dropped_before(&windows[0]), 0);
    assert_eq!(
        dropped_before(windows.last().unwrap()),
        missing.len() as u64,
        "the last window's note: {:?}",
        windows.last().unwrap().1
    );
    common::say(&format!(
        "{} windows received, the {} of seconds {missing:?} dropped, as said",
        windows.len(),
        missing.len()
    ));
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

/// The distinct windows among `reqs` (a window sent again after its answer was lost
/// arrives twice, byte for byte).
fn distinct(reqs: &[receiver::Request]) -> usize {
    let mut bodies: Vec<&[u8]> = reqs.iter().map(|r| &r.body[..]).collect();
    bodies.sort();
    bodies.dedup();
    bodies.len()
}

/// How many windows `scalene-rs` says it pushed to `url`, when it dropped none.
fn pushed_without_drops(stderr: &str, url: &str) -> usize {
    let head = "pushed ";
    let line = stderr
        .lines()
        .find(|l| l.contains(head) && l.contains(url))
        .unwrap_or_else(|| panic!("no summary line: {stderr}"));
    assert!(!line.contains("dropped"), "a window was dropped: {line}");
    let after = &line[line.find(head).unwrap() + head.len()..];
    after.split_whitespace().next().unwrap().parse().unwrap()
}

#[test]
fn a_backend_that_stalls_for_a_minute_blocks_nothing_and_loses_no_window() {
    // Every request of the first 60 s gets no answer: each try times out (15 s) and is
    // retried with backoff; the windows wait in the queue (18 of its 60) meanwhile.
    let rx = Receiver::stalling(Duration::from_secs(60));
    let dir = tempdir("scalene-rs-push-stall");
    let out = dir.join("p.json");
    let out_arg = out.to_str().unwrap();
    let began = Instant::now();
    let r = run_pushing(
        &rx.url(),
        &["--cpu-only", "--window", "5", "-o", out_arg],
        "90",
    );
    unharmed(&r).unwrap();
    let reqs = rx.requests();
    let unanswered = reqs.iter().filter(|q| q.status.is_none()).count();
    assert!(
        unanswered >= 3,
        "the stall held {unanswered} tries: {reqs:?}"
    );
    let n = pushed_without_drops(&r.stderr, &rx.url());
    assert_eq!(
        distinct(&rx.accepted()),
        n,
        "windows said pushed and received"
    );
    assert!(n >= 15, "90 s in 5 s windows: {n}");
    // Sampling went on at its rate while the exporter waited.
    let p: serde_json::Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    let (samples, secs, hz) = (
        p["samples"].as_f64().unwrap(),
        p["duration_s"].as_f64().unwrap(),
        p["requested_rate_hz"].as_f64().unwrap(),
    );
    assert!(
        samples >= 0.8 * secs * hz,
        "{samples} samples in {secs:.0} s at {hz} Hz"
    );
    common::say(&format!(
        "stall: {unanswered} tries unanswered, {n} windows pushed, none lost, {:.0} samples/s \
         of {hz}, {:.0} s in all",
        samples / secs,
        began.elapsed().as_secs_f64()
    ));
}

#[test]
fn a_backend_down_at_start_then_killed_mid_run_loses_no_window() {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}");
    let u = url.clone();
    let run = std::thread::spawn(move || run_pushing(&u, &["--cpu-only", "--window", "2"], "24"));
    // Nobody listens for 4 s; then a backend that is killed at 10 s and back at 14 s.
    std::thread::sleep(Duration::from_secs(4));
    let first = Receiver::start_on(port, Vec::new());
    std::thread::sleep(Duration::from_secs(6));
    first.stop();
    let before_kill = first.accepted();
    std::thread::sleep(Duration::from_secs(4));
    let second = Receiver::start_on(port, Vec::new());
    let r = run.join().unwrap();
    unharmed(&r).unwrap();
    let after = second.accepted();
    // The windows cut while nobody listened went when the backend came.
    assert!(
        before_kill.len() >= 2,
        "{} before the kill",
        before_kill.len()
    );
    assert!(!after.is_empty(), "none after the restart");
    let all: Vec<receiver::Request> = before_kill.into_iter().chain(after).collect();
    let n = pushed_without_drops(&r.stderr, &url);
    assert_eq!(distinct(&all), n, "windows said pushed and received");
    assert!(n >= 10, "24 s in 2 s windows: {n}");
    common::say(&format!(
        "down, up, killed, up: {n} windows pushed, none lost"
    ));
}

/// Runs `openssl` with `args` in `dir`.
fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .expect("openssl");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A private CA (ca.pem) and a certificate it signed for 127.0.0.1 (leaf.pem, leaf.key).
fn private_ca(dir: &Path) {
    let subj_ca = "/CN=scalene-rs test CA";
    openssl(
        dir,
        &[
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
        ]
        .iter()
        .copied()
        .chain(["-subj", subj_ca, "-keyout", "ca.key", "-out", "ca.pem"])
        .collect::<Vec<_>>(),
    );
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            "/CN=127.0.0.1",
        ]
        .iter()
        .copied()
        .chain(["-keyout", "leaf.key", "-out", "leaf.csr"])
        .collect::<Vec<_>>(),
    );
    std::fs::write(
        dir.join("leaf.ext"),
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n\
         keyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    openssl(
        dir,
        &[
            "x509", "-req", "-in", "leaf.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
        ]
        .iter()
        .copied()
        .chain([
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            "leaf.ext",
            "-out",
            "leaf.pem",
        ])
        .collect::<Vec<_>>(),
    );
}

/// tests/receivers/https.py, killed when dropped.
struct HttpsReceiver {
    child: std::process::Child,
    port: u16,
    log: std::path::PathBuf,
}

impl HttpsReceiver {
    fn start(dir: &Path) -> HttpsReceiver {
        use std::io::BufRead;
        let log = dir.join("received.log");
        let mut child = Command::new("python3")
            .arg(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/receivers/https.py"))
            .args([dir.join("leaf.pem"), dir.join("leaf.key"), log.clone()])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("python3");
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port = line.trim().parse().expect("the receiver's port");
        HttpsReceiver { child, port, log }
    }

    fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    /// The paths POSTed to it so far.
    fn paths(&self) -> Vec<String> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }
}

impl Drop for HttpsReceiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn an_https_backend_is_trusted_through_its_ca_and_only_so() {
    let dir = tempdir("scalene-rs-push-tls");
    private_ca(&dir);
    let rx = HttpsReceiver::start(&dir);
    let ca = dir.join("ca.pem");
    let ca = ca.to_str().unwrap();
    let args = ["--cpu-only", "--window", "1"];
    // Its CA named: every window arrives, over TLS.
    let r = run_pushing_with(&rx.url(), &args, "3", &[("SCALENE_RS_PUSH_CA", ca)]);
    unharmed(&r).unwrap();
    let n = pushed_without_drops(&r.stderr, &rx.url());
    let paths = rx.paths();
    assert!(n >= 3 && paths.len() >= n, "{n} pushed, received {paths:?}");
    assert!(
        paths.iter().all(|p| p == "/push.v1.PusherService/Push"),
        "{paths:?}"
    );
    // Not named: Mozilla's roots do not know it; nothing is sent, the program unharmed.
    let r = run_pushing(&rx.url(), &args, "2");
    unharmed(&r).unwrap();
    assert!(r.stderr.contains("pushed 0 windows"), "{}", r.stderr);
    assert!(
        r.stderr.to_lowercase().contains("certificate") || r.stderr.contains("UnknownIssuer"),
        "the failure names the certificate: {}",
        r.stderr
    );
    assert_eq!(rx.paths().len(), paths.len(), "sent without trust");
    // A CA file that is not there: one line, a non-zero exit, the program never started.
    let missing = dir.join("nowhere.pem");
    let r = run_pushing_with(
        &rx.url(),
        &args,
        "2",
        &[("SCALENE_RS_PUSH_CA", missing.to_str().unwrap())],
    );
    assert!(r.code.is_some_and(|c| c != 0), "{}", r.describe());
    assert!(
        !r.stdout.contains("truth "),
        "the program ran: {}",
        r.stdout
    );
    let err = r.stderr.trim();
    assert!(
        err.lines().count() == 1 && err.contains("SCALENE_RS_PUSH_CA"),
        "{err}"
    );
    common::say(&format!(
        "https: {n} windows through the private CA, none without it"
    ));
}
