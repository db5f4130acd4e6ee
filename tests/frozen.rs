//! A PyInstaller one-file app (fixtures/frozen/app.py, built by tools/frozen.sh with real
//! PyInstaller): what `pgrep app` lists first is its bootloader, which is not Python; it
//! unpacks the app and starts it as its child, which loads libpython from the unpacked
//! files.
//! - `attach BOOTLOADER --subprocesses` says the bootloader is not Python and profiles the
//!   child: its hot line gets the time its own CPU clock says it used.
//! - `dump --subprocesses BOOTLOADER` shows the child's stack.
//!
//! The truths: the child's CPU clock (/proc/PID/stat) over the recording; the fixture's
//! marked lines.

mod common;

use common::{bin, fixture, mark, run_limited, skip_or_fail};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The app tools/frozen.sh built, when it is there and was built from the fixture as it is.
/// - Freshness is the fixture's sha256 against the one tools/frozen.sh kept beside the app.
/// - Not mtimes: a fresh clone gives every file a new mtime, older caches look stale.
fn app(test: &str) -> Option<std::path::PathBuf> {
    let dir = common::cache_dir().join("frozen");
    let app = dir.join("app");
    if !app.is_file() {
        skip_or_fail(
            test,
            "no frozen app (tools/setup.sh builds it with tools/frozen.sh)",
        );
        return None;
    }
    let kept = std::fs::read_to_string(dir.join("app.sha256")).unwrap_or_default();
    let now = Command::new("sha256sum")
        .arg(fixture("frozen/app.py"))
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    let now = now.split_whitespace().next().unwrap_or("");
    if now.is_empty() || kept.trim() != now {
        skip_or_fail(
            test,
            "the frozen app was built from another fixtures/frozen/app.py (run tools/frozen.sh)",
        );
        return None;
    }
    Some(app)
}

/// The bootloader, killed (with its child) when dropped.
struct Running {
    boot: Child,
    child: i32,
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child),
            nix::sys::signal::Signal::SIGKILL,
        );
        let _ = self.boot.kill();
        let _ = self.boot.wait();
    }
}

/// Starts `app SECONDS` and waits for its child's "ready PID" line.
fn start(app: &std::path::Path, seconds: &str) -> Result<Running, String> {
    use std::io::BufRead;
    let mut boot = Command::new(app)
        .arg(seconds)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", app.display()))?;
    let out = boot.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(l) => {
                if let Some(pid) = l.strip_prefix("ready ").and_then(|p| p.parse().ok()) {
                    return Ok(Running { boot, child: pid });
                }
            }
            Err(_) => {
                let _ = boot.kill();
                let _ = boot.wait();
                return Err("the app printed no ready line within 30 s".into());
            }
        }
    }
}

#[test]
fn attach_to_a_frozen_apps_bootloader_profiles_its_python_child() {
    let test = "attach_to_a_frozen_apps_bootloader_profiles_its_python_child";
    let Some(app) = app(test) else { return };
    let running = start(&app, "30").unwrap();
    let boot = running.boot.id() as i32;
    assert_ne!(
        boot, running.child,
        "the app runs as the bootloader's child"
    );
    let dir = common::tempdir("frozen");
    let out = dir.join("p.json");
    let before = common::cpu_s(running.child);
    let mut cmd = Command::new(bin());
    cmd.arg("attach")
        .arg(boot.to_string())
        .args(["--subprocesses", "--cpu-only", "--duration", "2", "-o"])
        .arg(&out);
    let r = run_limited(cmd, Duration::from_secs(60));
    let used = common::cpu_s(running.child) - before;
    assert_eq!(r.code, Some(0), "attach: {}", r.describe());
    assert!(
        r.stderr.contains(&format!(
            "process {boot} (app) is not Python: profiling its Python descendants"
        )),
        "not said that the bootloader is not Python: {}",
        r.stderr
    );
    let p: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let src = fixture("frozen/app.py");
    let hot: f64 = ["frozen-test", "frozen-body"]
        .iter()
        .filter_map(|m| common::profile_line(&p, "app.py", mark(&src, m)))
        .map(|l| {
            ["cpu_python_pct", "cpu_native_pct", "cpu_system_pct"]
                .iter()
                .map(|k| l[*k].as_f64().unwrap_or(0.0))
                .sum::<f64>()
        })
        .sum();
    let total = p["total_s"].as_f64().unwrap_or(0.0);
    common::say(&format!(
        "{test}: {total:.2} s attributed, burn's lines {hot:.1}%, the child's clock {used:.2} s \
         over the attach (start-up included)"
    ));
    assert!(hot >= 90.0, "burn's lines have {hot:.1}% of the time");
    // The child's clock also counts the attach's start-up, before its first sample.
    assert!(
        total >= 0.75 * used && total <= 1.05 * used + 0.1,
        "{total:.2} s attributed, the child used {used:.2} s meanwhile"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn dump_of_a_frozen_apps_bootloader_shows_its_python_child() {
    let test = "dump_of_a_frozen_apps_bootloader_shows_its_python_child";
    let Some(app) = app(test) else { return };
    let running = start(&app, "30").unwrap();
    let boot = running.boot.id() as i32;
    let mut cmd = Command::new(bin());
    cmd.arg("dump")
        .arg(boot.to_string())
        .args(["--subprocesses", "--json"]);
    let r = run_limited(cmd, Duration::from_secs(60));
    assert_eq!(r.code, Some(0), "dump: {}", r.describe());
    let d: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    let text = r.stdout.clone();
    let procs = d["processes"].as_array().cloned().unwrap_or_default();
    let child = procs
        .iter()
        .find(|p| p["pid"].as_i64() == Some(running.child as i64))
        .unwrap_or_else(|| panic!("the child {} not in the dump: {text}", running.child));
    let functions: Vec<&str> = child["threads"][0]["frames"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|f| f["function"].as_str())
        .collect();
    assert_eq!(
        functions.first(),
        Some(&"burn"),
        "the child's stack: {child}"
    );
    assert!(functions.contains(&"main"), "the child's stack: {child}");
    common::say(&format!("{test}: child {}: {functions:?}", running.child));
}
