//! uWSGI (Debian's `uwsgi-core` + `uwsgi-plugin-python3`, installed by tools/setup.sh):
//! Python embedded through libpython, workers forked from the master without
//! `PyOS_AfterFork_Child` (uWSGI's default). Each worker's thread state still records the
//! master's thread id, which is no thread of the worker.
//!
//! The truths: the workers' own CPU clocks (/proc/PID/stat) over the recording, and the
//! fixture's marked lines (fixtures/uwsgi/app.py).

mod common;

use common::{bin, fixture, mark, run_limited, skip_or_fail};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A uWSGI master with two workers serving fixtures/uwsgi/app.py, and two clients that keep
/// both workers busy until dropped.
struct Server {
    master: Child,
    workers: Vec<i32>,
    stop: Arc<AtomicBool>,
    served: Arc<AtomicU64>,
    clients: Vec<std::thread::JoinHandle<()>>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for c in self.clients.drain(..) {
            let _ = c.join();
        }
        // --die-on-term: SIGTERM ends the master and its workers.
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.master.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let until = Instant::now() + Duration::from_secs(10);
        while Instant::now() < until {
            if let Ok(Some(_)) = self.master.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.master.kill();
        let _ = self.master.wait();
    }
}

/// Whether uWSGI with its Python 3 plugin is here; says so (or fails, in CI) when not.
fn have_uwsgi(test: &str) -> bool {
    let ok = Command::new("uwsgi")
        .args(["--plugin", "python3", "--version"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        skip_or_fail(
            test,
            "uwsgi with its python3 plugin is not installed (tools/setup.sh installs Debian's \
             uwsgi-core and uwsgi-plugin-python3)",
        );
    }
    ok
}

/// One GET of `/`; true when it was answered 200.
fn get(port: u16) -> bool {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
    if s.write_all(b"GET / HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut answer = Vec::new();
    let _ = s.read_to_end(&mut answer);
    answer.starts_with(b"HTTP/1.1 200") || answer.starts_with(b"HTTP/1.0 200")
}

/// The children of `pid` (its workers), from /proc.
fn children(pid: i32) -> Vec<i32> {
    let path = format!("/proc/{pid}/task/{pid}/children");
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|s| s.parse().ok())
        .collect()
}

fn start() -> Result<Server, String> {
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| format!("no free port: {e}"))?
        .port();
    let app = fixture("uwsgi/app.py");
    let master = Command::new("uwsgi")
        .args(["--plugin", "python3", "--master", "--processes", "2"])
        .args(["--die-on-term", "--disable-logging"])
        .arg("--http-socket")
        .arg(format!("127.0.0.1:{port}"))
        .arg("--wsgi-file")
        .arg(&app)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start uwsgi: {e}"))?;
    let mut server = Server {
        master,
        workers: Vec::new(),
        stop: Arc::new(AtomicBool::new(false)),
        served: Arc::new(AtomicU64::new(0)),
        clients: Vec::new(),
    };
    let until = Instant::now() + Duration::from_secs(20);
    while !get(port) {
        if Instant::now() > until {
            return Err("uwsgi did not answer within 20 s".into());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    server.workers = children(server.master.id() as i32);
    if server.workers.len() != 2 {
        return Err(format!("uwsgi has workers {:?}, not 2", server.workers));
    }
    for _ in 0..2 {
        let (stop, served) = (server.stop.clone(), server.served.clone());
        server.clients.push(std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                if get(port) {
                    served.fetch_add(1, Ordering::SeqCst);
                }
            }
        }));
    }
    Ok(server)
}

fn json(path: &std::path::Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    serde_json::from_str(&text).unwrap_or(serde_json::Value::Null)
}

/// `attach MASTER --subprocesses`: the workers' time is charged to the lines that took it,
/// as much of it as their own clocks say they used; each worker's stale thread id is said.
#[test]
fn attach_to_a_uwsgi_master_charges_its_workers_time_to_their_lines() {
    let test = "attach_to_a_uwsgi_master_charges_its_workers_time_to_their_lines";
    if !have_uwsgi(test) {
        return;
    }
    let _turn = common::turn("alone");
    let server = start().unwrap();
    let app = fixture("uwsgi/app.py");
    let dir = common::tempdir("uwsgi");
    let out = dir.join("cpu.json");
    let before: f64 = server.workers.iter().map(|&w| common::cpu_s(w)).sum();
    let run = run_limited(
        {
            let mut c = Command::new(bin());
            c.arg("attach")
                .arg(server.master.id().to_string())
                .args(["--subprocesses", "--cpu-only", "--duration", "4", "-o"])
                .arg(&out);
            c
        },
        Duration::from_secs(60),
    );
    let after: f64 = server.workers.iter().map(|&w| common::cpu_s(w)).sum();
    assert_eq!(run.code, Some(0), "attach: {}", run.describe());
    let p = json(&out);
    let total = p["total_s"].as_f64().unwrap_or(0.0);
    let burn: f64 = ["burn-test", "burn-add"]
        .iter()
        .filter_map(|m| common::profile_line(&p, "app.py", mark(&app, m)))
        .map(|l| {
            ["cpu_python_pct", "cpu_native_pct", "cpu_system_pct"]
                .iter()
                .map(|k| l[*k].as_f64().unwrap_or(0.0))
                .sum::<f64>()
        })
        .sum();
    let used = after - before;
    common::say(&format!(
        "{test}: {total:.2} s attributed, burn's lines {burn:.1}%, workers' clocks {used:.2} s \
         over the attach (start-up included)"
    ));
    // The workers' clocks also count the attach's start-up, before the first sample.
    assert!(
        total >= 0.75 * used && total <= 1.05 * used + 0.1,
        "{total:.2} s attributed, the workers used {used:.2} s meanwhile\n{}",
        run.stderr
    );
    assert!(burn >= 90.0, "burn's lines have {burn:.1}% of the time");
    for w in &server.workers {
        let said = format!(
            "process {w}: a thread state records thread {}, not a thread of the process",
            server.master.id()
        );
        assert!(
            run.stderr.contains(&said),
            "not said of {w}: {said}\n{}",
            run.stderr
        );
    }

    // With memory: each worker's 4 MiB per request go to the line that allocates them.
    let out = dir.join("mem.json");
    let run = run_limited(
        {
            let mut c = Command::new(bin());
            c.arg("attach")
                .arg(server.master.id().to_string())
                .args(["--subprocesses", "--duration", "5", "-o"])
                .arg(&out);
            c
        },
        Duration::from_secs(60),
    );
    assert_eq!(run.code, Some(0), "attach: {}", run.describe());
    let p = json(&out);
    let alloc = common::profile_line(&p, "app.py", mark(&app, "alloc"))
        .and_then(|l| l["mem_alloc_mb"].as_f64())
        .unwrap_or(0.0);
    let all = p["memory"]["alloc_mb"].as_f64().unwrap_or(0.0);
    let served = server.served.load(Ordering::SeqCst);
    common::say(&format!(
        "{test}: memory {alloc:.0} MB on the allocating line of {all:.0} MB ({served} requests \
         so far)"
    ));
    assert!(
        alloc >= 8.0 && alloc >= 0.9 * all,
        "the allocating line has {alloc:.1} MB of {all:.1} MB\n{}",
        run.stderr
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `dump WORKER`: its one thread under its own id, the stale one said (text and JSON), and
/// with `--native` the native frames merged.
#[test]
fn dump_of_a_uwsgi_worker_names_its_own_thread() {
    let test = "dump_of_a_uwsgi_worker_names_its_own_thread";
    if !have_uwsgi(test) {
        return;
    }
    let server = start().unwrap();
    let master = server.master.id() as i32;
    for &w in &server.workers {
        let dump = |args: &[&str]| {
            let mut c = Command::new(bin());
            c.arg("dump").arg(w.to_string()).args(args);
            let r = run_limited(c, Duration::from_secs(30));
            assert_eq!(r.code, Some(0), "dump {w} {args:?}: {}", r.describe());
            r.stdout
        };
        let p: serde_json::Value = serde_json::from_str(&dump(&["--json"])).unwrap();
        let threads = p["threads"].as_array().cloned().unwrap_or_default();
        assert_eq!(threads.len(), 1, "worker {w}: {p}");
        assert_eq!(threads[0]["native_id"].as_i64(), Some(w as i64), "{p}");
        let stale = &p["stale_thread_ids"][0];
        assert_eq!(stale["recorded"].as_i64(), Some(master as i64), "{p}");
        assert_eq!(stale["actual"].as_i64(), Some(w as i64), "{p}");

        let text = dump(&["--native"]);
        assert!(
            text.contains(&format!("Thread {w} ")),
            "worker {w} not under its own id:\n{text}"
        );
        assert!(
            text.contains(&format!("records thread {master}, which is not a thread")),
            "the stale id not said:\n{text}"
        );
        assert!(
            text.contains("merged with Python's on 1 of 1 threads"),
            "native frames not merged:\n{text}"
        );
        common::say(&format!("{test}: worker {w}: thread {w}, native merged"));
    }
}
