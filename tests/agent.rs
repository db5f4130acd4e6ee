//! `scalene-rs agent`, started before any of the processes it must find, pushing to a
//! loopback Pyroscope receiver (tests/common/pyroscope.rs) decoded for real.
//!
//! After the agent, three Python processes start (fixtures/agent/app.py):
//! - one in a Docker container (its own PID and mount namespaces and cgroup), named by
//!   `OTEL_SERVICE_NAME=inventory` in its environment;
//! - one that exits early, with code 3 (named `early-exit` by its environment);
//! - a multiprocessing parent (start method fork) with one worker (both named `app`, their
//!   script).
//!
//! Each is pushed with its pid as the host sees it, its service name, and (the container's)
//! the container's id as Docker gives it; all its windows together, read by `go tool
//! pprof`, put most of its time on the line it burns. The early one's exit code and output
//! are its own, and the agent says it ended. Then SIGTERM: the agent exits 0 within the
//! flush's 5 s, and the window open at that moment (the container's, which still runs)
//! arrives, ending when the signal came, not at a window's boundary.
//!
//! Interpreters: the host's processes run on the newest shared-libpython build of the
//! matrix with a GIL, the container's on the static one (Debian's, under /usr, bound
//! read-only into the container): the two ways the interpreter is found (libpython in the
//! maps, the executable itself). Reading stacks is tested over the whole matrix elsewhere;
//! here what is tested is finding, labelling, letting go and flushing.
//! `--match` takes only this test's processes (a token on their command lines): the agent
//! must not touch the other Python processes of a shared machine.

mod common;
#[path = "common/pyroscope.rs"]
mod receiver;

use common::{bin, fixture, mark, tempdir, Interpreter, Lines};
use receiver::{flat, pprof_times, proto::RawProfileSeries, Receiver};
use std::collections::BTreeMap;
use std::io::BufRead;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

fn docker(args: &[&str]) -> Result<String, String> {
    let o = Command::new("docker")
        .args(args)
        .output()
        .map_err(|e| e.to_string())?;
    if !o.status.success() {
        return Err(format!(
            "docker {args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&o.stdout).trim().to_string())
}

/// An image of mount points only: the host's /usr is bound into it read-only (as are
/// /bin, /lib, /lib64 where they are directories; where they are links into /usr, the
/// image has the same links). Removed when dropped.
struct Image {
    name: String,
    /// `-v` options its containers need.
    binds: Vec<String>,
}

impl Image {
    fn import(d: &Path) -> Result<Image, String> {
        let root = d.join("rootfs");
        for sub in ["usr", "app", "tmp", "etc", "proc", "sys", "dev"] {
            std::fs::create_dir_all(root.join(sub)).map_err(|e| e.to_string())?;
        }
        let mut binds = vec!["/usr:/usr:ro".to_string()];
        for top in ["bin", "sbin", "lib", "lib64"] {
            let host = Path::new("/").join(top);
            match std::fs::read_link(&host) {
                Ok(to) => {
                    std::os::unix::fs::symlink(to, root.join(top)).map_err(|e| e.to_string())?
                }
                Err(_) if host.is_dir() => {
                    std::fs::create_dir_all(root.join(top)).map_err(|e| e.to_string())?;
                    binds.push(format!("/{top}:/{top}:ro"));
                }
                Err(_) => {}
            }
        }
        let tar = d.join("rootfs.tar");
        let ok = Command::new("tar")
            .arg("-C")
            .arg(&root)
            .arg("-cf")
            .arg(&tar)
            .arg(".")
            .status()
            .map_err(|e| e.to_string())?
            .success();
        if !ok {
            return Err("tar of the root failed".into());
        }
        let name = format!("scalene-rs-agent-test:{}", std::process::id());
        docker(&["import", &tar.to_string_lossy(), &name])?;
        Ok(Image { name, binds })
    }
}

impl Drop for Image {
    fn drop(&mut self) {
        let _ = docker(&["rmi", "-f", &self.name]);
    }
}

/// A container, removed when dropped.
struct Container(String);

impl Drop for Container {
    fn drop(&mut self) {
        let _ = docker(&["rm", "-f", &self.0]);
    }
}

/// A child killed (and reaped) when dropped: the agent, if a check fails first.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The host's interpreter: the newest pyenv-style build with a shared libpython, a GIL,
/// and the `flush=True` of print (3.3+).
fn host_interpreter() -> Option<Interpreter> {
    common::interpreters().into_iter().rev().find(|i| {
        i.major == 3
            && i.root.is_none()
            && !i.free_threaded
            && i.path.parent().and_then(Path::parent).is_some_and(|p| {
                std::fs::read_dir(p.join("lib")).is_ok_and(|d| {
                    d.flatten()
                        .any(|e| e.file_name().to_string_lossy().starts_with("libpython3"))
                })
            })
    })
}

/// The container's: a static build under /usr (bound into the container as it is).
fn static_interpreter() -> Option<Interpreter> {
    common::interpreters().into_iter().find(|i| {
        i.major == 3
            && i.root.is_none()
            && i.path.starts_with("/usr/")
            && Command::new("ldd")
                .arg(&i.path)
                .output()
                .is_ok_and(|o| !String::from_utf8_lossy(&o.stdout).contains("libpython"))
    })
}

fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as i64
}

/// A host process of the fixture: its stdout's lines as they come, then its exit.
struct HostProcess {
    child: std::process::Child,
    lines: std::sync::mpsc::Receiver<String>,
}

impl HostProcess {
    fn start(py: &Interpreter, args: &[&str], service: Option<&str>) -> HostProcess {
        let mut cmd = Command::new(&py.path);
        cmd.arg(fixture("agent/app.py"))
            .args(args)
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .env_remove("OTEL_SERVICE_NAME")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(s) = service {
            cmd.env("OTEL_SERVICE_NAME", s);
        }
        let mut child = cmd.spawn().expect("python");
        let out = std::io::BufReader::new(child.stdout.take().unwrap());
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for l in out.lines().map_while(Result::ok) {
                let _ = tx.send(l);
            }
        });
        HostProcess { child, lines }
    }

    /// The next line it prints that starts with `word`: the number after it.
    fn number_after(&self, word: &str) -> i32 {
        loop {
            let l = self
                .lines
                .recv_timeout(Duration::from_secs(30))
                .unwrap_or_else(|_| panic!("no `{word}` line"));
            if let Some(n) = l.strip_prefix(word) {
                return n.trim().parse().unwrap();
            }
        }
    }

    /// Its exit code, its remaining stdout and its stderr (at most 60 s).
    fn finish(mut self) -> (Option<i32>, Vec<String>, String) {
        let err = common::drain(self.child.stderr.take().unwrap());
        let deadline = Instant::now() + Duration::from_secs(60);
        let status = loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                break s;
            }
            assert!(Instant::now() < deadline, "a fixture did not end");
            std::thread::sleep(Duration::from_millis(20));
        };
        let rest = self.lines.iter().collect();
        (status.code(), rest, err.join().unwrap())
    }
}

/// Every series received, by the pid label.
fn series_by_pid(rx: &Receiver) -> BTreeMap<i32, Vec<RawProfileSeries>> {
    let mut out: BTreeMap<i32, Vec<RawProfileSeries>> = BTreeMap::new();
    for q in rx.requests() {
        assert_eq!(q.path, "/push.v1.PusherService/Push");
        for s in q.push().series {
            let pid = s.label("pid").expect("a pid label").parse().unwrap();
            out.entry(pid).or_default().push(s);
        }
    }
    out
}

/// What one process's series must carry.
struct Expect<'a> {
    what: &'a str,
    pid: i32,
    service: &'a str,
    /// Some: this container id; None: not the test's container's.
    container: Option<&'a str>,
    not_container: &'a str,
    /// `file:line` of the line it burns.
    hot: String,
}

/// Checks process `e.pid`'s series: labels, and its hot line's share of all its windows.
fn check(
    by_pid: &BTreeMap<i32, Vec<RawProfileSeries>>,
    e: &Expect,
    dir: &Path,
) -> Result<String, String> {
    let Some(all) = by_pid.get(&e.pid) else {
        return Err(format!(
            "{}: no window with pid {} (pids seen: {:?})",
            e.what,
            e.pid,
            by_pid.keys()
        ));
    };
    for s in all {
        let (name, service, env) = (s.label("__name__"), s.label("service_name"), s.label("env"));
        if name != Some("process_cpu") || service != Some(e.service) || env != Some("test") {
            return Err(format!(
                "{}: a series named {name:?}, service {service:?}, env {env:?}: expected \
                 process_cpu, {}, test",
                e.what, e.service
            ));
        }
        let cid = s.label("container_id");
        match e.container {
            Some(want) if cid != Some(want) => {
                return Err(format!("{}: container_id {cid:?}, expected {want}", e.what))
            }
            None if cid == Some(e.not_container) => {
                return Err(format!("{}: labelled with the test container's id", e.what))
            }
            _ => {}
        }
    }
    let raws: Vec<&[u8]> = all.iter().map(|s| &s.samples[0].raw_profile[..]).collect();
    let rows = receiver::pprof_top_merged(&raws, "cpu", dir, &e.pid.to_string());
    let share = flat(&rows, &e.hot);
    let top = rows.iter().map(|(_, p)| *p).fold(0.0, f64::max);
    if share < 50.0 || share < top {
        return Err(format!(
            "{}: {} has {share:.1}% of its {} windows' CPU time (the top line {top:.1}%): {rows:?}",
            e.what,
            e.hot,
            all.len()
        ));
    }
    let others: Vec<String> = rows
        .iter()
        .filter(|(l, p)| !l.ends_with(&e.hot) && *p >= 1.0)
        .map(|(l, p)| format!("{l} {p:.1}%"))
        .collect();
    Ok(format!(
        "{}: {} windows, {} {share:.1}% (other lines of 1% or more: {others:?})",
        e.what,
        all.len(),
        e.hot
    ))
}

/// Whether Go (for `go tool pprof`) and a Docker engine are there; if not, the test is
/// skipped or, under CI, failed, saying which is missing.
fn go_and_docker(test: &str) -> bool {
    if !common::have_go(test) {
        return false;
    }
    if let Err(e) = docker(&["info"]) {
        common::skip_or_fail(
            test,
            &format!("no Docker engine answers (tools/docker.sh starts one): {e}"),
        );
        return false;
    }
    true
}

#[test]
fn the_agent_finds_labels_and_lets_go_every_python_process_started_after_it() {
    let test = "agent";
    if !go_and_docker(test) {
        return;
    }
    let (Some(host_py), Some(static_py)) = (host_interpreter(), static_interpreter()) else {
        return common::skip_or_fail(
            test,
            "no shared-libpython build, or no static build under /usr",
        );
    };
    let token = format!("scalene-agent-test-{}", std::process::id());
    let dir = tempdir("scalene-rs-agent");
    let image = Image::import(&dir).unwrap();
    let rx = Receiver::start(Vec::new());
    let mut agent = Command::new(bin())
        .args([
            "agent",
            "--push",
            &rx.url(),
            "--window",
            "2",
            "--tag",
            "env=test",
        ])
        .args(["--match", &token])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let log = Lines::of(&mut agent);
    let mut agent = KillOnDrop(agent);
    let mut said = Vec::new();
    assert!(
        log.wait_for("profiling the host's Python processes", &mut said),
        "{said:?}"
    );

    // The container: runs until the test ends it, after the agent's SIGTERM.
    let app_dir = fixture("agent");
    let mut args = vec![
        "run",
        "-d",
        "--network",
        "none",
        "-e",
        "PYTHONDONTWRITEBYTECODE=1",
    ];
    args.extend(["-e", "OTEL_SERVICE_NAME=inventory"]);
    let app_bind = format!("{}:/app:ro", app_dir.display());
    args.extend(["-v", &app_bind]);
    for b in &image.binds {
        args.extend(["-v", b]);
    }
    let py = static_py.path.to_string_lossy().into_owned();
    args.extend([&image.name[..], &py, "/app/app.py", "steady", "120", &token]);
    let container = Container(docker(&args).unwrap());
    let early = HostProcess::start(&host_py, &["early", "2.5", &token], Some("early-exit"));
    let mp = HostProcess::start(&host_py, &["mp", "6", &token], None);
    let early_pid = early.number_after("ready ");
    let (mp_pid, worker_pid) = (mp.number_after("ready "), mp.number_after("worker "));
    let (code, rest, err) = early.finish();
    assert_eq!(
        (code, rest.clone(), err.as_str()),
        (Some(3), vec!["early done".to_string()], ""),
        "the early one's exit code and output are its own"
    );
    let (code, _, err) = mp.finish();
    assert_eq!(code, Some(0), "the multiprocessing parent: {err}");
    for pid in [early_pid, mp_pid, worker_pid] {
        let ended = format!("process {pid} ended");
        let seen = said.iter().any(|l| l.contains(&ended)) || log.wait_for(&ended, &mut said);
        assert!(seen, "no {ended:?}: {said:?}");
    }
    let c_pid: i32 = docker(&["inspect", "-f", "{{.State.Pid}}", &container.0])
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        said.iter()
            .any(|l| l.contains(&format!("profiling process {c_pid} "))
                && l.contains("service inventory")),
        "the container's process was not found: {said:?}"
    );

    // SIGTERM in the middle of a window (an odd second: windows end at even ones).
    while (now_ns() / 1_000_000) % 2000 < 1000 {
        std::thread::sleep(Duration::from_millis(10));
    }
    while (now_ns() / 1_000_000) % 2000 < 1100 {
        std::thread::sleep(Duration::from_millis(5));
    }
    let term_ns = now_ns();
    let began = Instant::now();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(agent.0.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = loop {
        if let Some(s) = agent.0.try_wait().unwrap() {
            break s;
        }
        assert!(
            began.elapsed() < Duration::from_secs(10),
            "the agent did not end on SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    let took = began.elapsed();
    log.rest(&mut said);
    // `docker run -d` gives the full id: the one the cgroup path is named after.
    let cid = container.0.clone();
    drop(container);
    assert_eq!(
        status.code(),
        Some(0),
        "the agent's exit on SIGTERM: {said:?}"
    );
    assert!(
        took < Duration::from_secs(6),
        "SIGTERM to exit took {took:?}"
    );

    let by_pid = series_by_pid(&rx);
    let app = fixture("agent/app.py");
    let line = |m: &str| format!("app.py:{}", mark(&app, m));
    let checks = [
        Expect {
            what: "container",
            pid: c_pid,
            service: "inventory",
            container: Some(&cid),
            not_container: &cid,
            hot: line("hot"),
        },
        Expect {
            what: "early",
            pid: early_pid,
            service: "early-exit",
            container: None,
            not_container: &cid,
            hot: line("hot"),
        },
        Expect {
            what: "mp parent",
            pid: mp_pid,
            service: "app",
            container: None,
            not_container: &cid,
            hot: line("hot"),
        },
        Expect {
            what: "mp worker",
            pid: worker_pid,
            service: "app",
            container: None,
            not_container: &cid,
            hot: line("worker"),
        },
    ];
    let mut notes = Vec::new();
    let mut failures = Vec::new();
    for e in &checks {
        match check(&by_pid, e, &dir) {
            Ok(n) => notes.push(n),
            Err(f) => failures.push(f),
        }
    }
    // The window open at SIGTERM: the container's, ending when the signal came.
    let last_end = by_pid
        .get(&c_pid)
        .into_iter()
        .flatten()
        .map(|s| {
            let t = pprof_times(&s.samples[0].raw_profile);
            t.time_nanos + t.duration_nanos
        })
        .max();
    match last_end {
        Some(end) if end >= term_ns && end - term_ns < 500_000_000 => notes.push(format!(
            "the last window ended {:.0} ms after SIGTERM",
            (end - term_ns) as f64 / 1e6
        )),
        other => failures.push(format!(
            "the container's last window ended at {other:?}, SIGTERM at {term_ns}: the open window was not flushed"
        )),
    }
    let _ = std::fs::remove_dir_all(&dir);
    common::say(&format!("agent: {}", notes.join("; ")));
    assert!(
        failures.is_empty(),
        "{}\nagent said: {said:#?}",
        failures.join("\n")
    );
}

/// The deployments of docs/agent.md, as far as one machine plays them. Each agent must
/// find a Python process of another user (the test user), started after it, and push
/// its hot line:
/// - the DaemonSet's container: the node's PID namespace (`--pid host`), every
///   capability dropped but SYS_PTRACE, a read-only root, no new privileges, root;
/// - the systemd unit's process: root with its capabilities bounded to CAP_SYS_PTRACE
///   and no new privileges (`setpriv`, as the unit's CapabilityBoundingSet and
///   NoNewPrivileges make it), and the unit itself, from the page, read by
///   `systemd-analyze verify` without a complaint.
#[test]
fn the_daemonset_and_the_systemd_unit_of_the_docs_are_enough() {
    let test = "the_daemonset_and_the_systemd_unit_of_the_docs_are_enough";
    if !go_and_docker(test) {
        return;
    }
    if let Some(why) = common::users::setpriv_missing() {
        return common::skip_or_fail(test, &why);
    }
    let (_, uid, gid) = match common::users::test_user() {
        Ok(u) => u,
        Err(why) => return common::skip_or_fail(test, &why),
    };
    let Some(py) = static_interpreter() else {
        return common::skip_or_fail(test, "no static build under /usr (the other user's Python)");
    };
    let dir = tempdir("scalene-rs-agent-deploy");
    // The unit of the page, pointed at this build.
    let page = std::fs::read_to_string(common::repo_root().join("docs/agent.md")).unwrap();
    let unit = page
        .split("```ini\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("docs/agent.md has no ```ini unit");
    let unit_file = dir.join("scalene-rs-agent.service");
    std::fs::write(&unit_file, unit.replace("/usr/local/bin/scalene-rs", bin())).unwrap();
    match Command::new("systemd-analyze")
        .arg("verify")
        .arg(&unit_file)
        .output()
    {
        Ok(o) => {
            let said = format!(
                "{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            );
            assert!(
                o.status.success() && said.trim().is_empty(),
                "systemd-analyze verify of the page's unit: {said}"
            );
        }
        Err(e) => return common::skip_or_fail(test, &format!("no systemd-analyze: {e}")),
    }
    // The other user's program, where it can read it.
    let app = dir.join("app.py");
    std::fs::copy(fixture("agent/app.py"), &app).unwrap();
    let hot = format!("app.py:{}", mark(&app, "hot"));
    let image = Image::import(&dir).unwrap();
    let rx = Receiver::start(Vec::new());
    let mut failures = Vec::new();
    for deployment in ["daemonset", "systemd"] {
        let token = format!("scalene-agent-{deployment}-{}", std::process::id());
        let agent_args = [
            "agent",
            "--push",
            &rx.url(),
            "--window",
            "1",
            "--tag",
            "env=test",
            "--match",
            &token,
        ];
        let mut cmd;
        if deployment == "daemonset" {
            cmd = Command::new("docker");
            let bind = format!("{}:/scalene-rs:ro", bin());
            cmd.args(["run", "--rm", "-i", "--pid", "host", "--network", "host"])
                .args([
                    "--cap-drop",
                    "ALL",
                    "--cap-add",
                    "SYS_PTRACE",
                    "--read-only",
                ])
                .args(["--user", "0", "--security-opt", "no-new-privileges"])
                .args(["-v", &bind]);
            for b in &image.binds {
                cmd.args(["-v", b]);
            }
            cmd.arg(&image.name).arg("/scalene-rs").args(agent_args);
        } else {
            cmd = Command::new("setpriv");
            cmd.args(["--bounding-set", "-all,+sys_ptrace", "--no-new-privs", "--"])
                .arg(bin())
                .args(agent_args);
        }
        let mut agent = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let log = Lines::of(&mut agent);
        let mut agent = KillOnDrop(agent);
        let mut said = Vec::new();
        if !log.wait_for("profiling the host's Python processes", &mut said) {
            failures.push(format!("{deployment}: the agent did not start: {said:?}"));
            continue;
        }
        let target = Command::new("setpriv")
            .args(["--reuid", &uid.to_string(), "--regid", &gid.to_string()])
            .args(["--clear-groups", "--"])
            .arg(&py.path)
            .arg(&app)
            .args(["steady", "4", &token])
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .env_remove("OTEL_SERVICE_NAME")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let pid = target.id() as i32;
        let out = target.wait_with_output().unwrap();
        let ended = format!("process {pid} ended");
        let seen = said.iter().any(|l| l.contains(&ended)) || log.wait_for(&ended, &mut said);
        // SIGTERM, as Kubernetes and systemd stop it (docker passes it on to the agent).
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(agent.0.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = agent.0.wait();
        log.rest(&mut said);
        if !out.status.success() {
            failures.push(format!("{deployment}: the program was harmed: {out:?}"));
            continue;
        }
        if !seen {
            failures.push(format!("{deployment}: no {ended:?}: {said:?}"));
            continue;
        }
        // `--match` leaves every other process out, unread and unmentioned.
        if let Some(l) = said.iter().find(|l| l.contains("not profiled")) {
            failures.push(format!(
                "{deployment}: a process --match leaves out was said: {l}"
            ));
        }
        let e = Expect {
            what: deployment,
            pid,
            service: "app",
            container: None,
            not_container: "",
            hot: hot.clone(),
        };
        match check(&series_by_pid(&rx), &e, &dir) {
            Ok(n) => common::say(&format!("{deployment}: {n}")),
            Err(f) => failures.push(format!("{f}\nthe agent said: {said:#?}")),
        }
    }
    drop(image);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A PyInstaller one-file app started after the agent (tools/frozen.sh builds it): what
/// starts is its bootloader, not Python; its child maps libpython only once it unpacked
/// it, without an exec. The agent profiles the child all the same, and its windows put
/// the app's time on its burning line. (A finder that looked at a new non-Python process
/// once left the child alone when its first look came before libpython was mapped.)
#[test]
fn the_agent_finds_a_frozen_apps_python_child() {
    let test = "agent (frozen app)";
    if !common::have_go(test) {
        return;
    }
    let app = common::cache_dir().join("frozen/app");
    if !app.exists() {
        return common::skip_or_fail(test, "no frozen app (tools/setup.sh runs tools/frozen.sh)");
    }
    let token = format!("scalene-agent-frozen-{}", std::process::id());
    let rx = Receiver::start(Vec::new());
    let mut agent = Command::new(bin())
        .args(["agent", "--push", &rx.url(), "--window", "2"])
        .args(["--match", &token])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let log = Lines::of(&mut agent);
    let mut agent = KillOnDrop(agent);
    let mut said = Vec::new();
    assert!(
        log.wait_for("profiling the host's Python processes", &mut said),
        "{said:?}"
    );
    let mut boot = Command::new(&app)
        .args(["5", &token])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(boot.stdout.take().unwrap());
    let mut first = String::new();
    out.read_line(&mut first).unwrap();
    let child: i32 = first
        .trim()
        .strip_prefix("ready ")
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("the app's first line: {first:?}"));
    let mut boot = KillOnDrop(boot);
    let profiling = format!("profiling process {child} ");
    let found = log.wait_for(&profiling, &mut said);
    let status = boot.0.wait().unwrap();
    assert!(
        found,
        "the frozen app's child {child} was not found: {said:?}"
    );
    assert!(status.success(), "the app: {status:?}");
    let ended = format!("process {child} ended");
    assert!(
        said.iter().any(|l| l.contains(&ended)) || log.wait_for(&ended, &mut said),
        "no {ended:?}: {said:?}"
    );
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(agent.0.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let _ = agent.0.wait();
    let src = fixture("frozen/app.py");
    let hot = [
        format!("app.py:{}", mark(&src, "frozen-test")),
        format!("app.py:{}", mark(&src, "frozen-body")),
    ];
    let series = series_by_pid(&rx);
    let windows = series.get(&child).map_or(&[][..], |s| &s[..]);
    assert!(!windows.is_empty(), "no window of the child {child}");
    let raws: Vec<&[u8]> = windows
        .iter()
        .map(|s| &s.samples[0].raw_profile[..])
        .collect();
    let dir = tempdir("scalene-rs-agent-frozen");
    let rows = receiver::pprof_top_merged(&raws, "cpu", &dir, &child.to_string());
    let share: f64 = hot.iter().map(|h| flat(&rows, h)).sum();
    common::say(&format!(
        "{test}: child {child}: {} windows, {share:.1}% on burn's lines",
        windows.len()
    ));
    assert!(share >= 80.0, "the child's windows: {rows:?}");
    let _ = std::fs::remove_dir_all(&dir);
}
