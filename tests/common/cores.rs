//! Core files for the tests of `dump --core` (tests/dump_core*.rs): running the binary
//! on a core, making a core (the kernel's, with the core pattern set for as long as it
//! takes and restored after, under the turn "core-pattern"), and checking a failure.

use super::{Interpreter, Run};
use serde_json::Value;
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// How long one `scalene-rs dump` (or gcore) may take before the test calls it hung.
pub const LIMIT: Duration = Duration::from_secs(120);

/// `Error::BadCore`'s exit code (README's exit codes).
pub const BAD_CORE: i32 = 8;

pub fn run_bin<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> Run {
    let mut cmd = Command::new(super::bin());
    cmd.args(args);
    super::run_limited(cmd, LIMIT)
}

/// `dump --core CORE ARGS` for `py` (with `--lib-root` its root when `lib_root`).
pub fn dump_core(core: &Path, py: &Interpreter, lib_root: bool, extra: &[&str]) -> Run {
    let mut args: Vec<OsString> = vec!["dump".into(), "--core".into(), core.into()];
    if let (true, Some(root)) = (lib_root, &py.root) {
        args.push("--lib-root".into());
        args.push(root.into());
    }
    args.extend(extra.iter().map(OsString::from));
    run_bin(&args)
}

pub fn ok_stdout(what: &str, r: &Run) -> Result<String, String> {
    if r.code != Some(0) || r.timed_out {
        return Err(format!("{what}: {}", r.describe()));
    }
    Ok(r.stdout.clone())
}

pub fn json(what: &str, text: &str) -> Result<Value, String> {
    serde_json::from_str(text).map_err(|e| format!("{what}: bad JSON ({e}): {text:.400}"))
}

/// `label -> line` of every `# MARK: label` of a fixture.
pub fn marks(path: &Path) -> BTreeMap<String, i64> {
    let text = std::fs::read_to_string(path).unwrap();
    text.lines()
        .enumerate()
        .filter_map(|(i, l)| {
            let at = l.find("# MARK: ")?;
            Some((l[at + 8..].trim().to_string(), i as i64 + 1))
        })
        .collect()
}

pub fn have(tool: &str, package: &str, test: &str) -> bool {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        super::skip_or_fail(test, &format!("no `{tool}` (Debian package {package})"));
    }
    found
}

/// Makes the kernel write a core of the running process `pid` into `dir` (as
/// `core.PID`): RLIMIT_CORE raised, the core pattern set, SIGABRT sent, its end awaited.
pub fn kernel_core_of_running(pid: i32, dir: &Path) -> Result<(), String> {
    let _pattern = CorePattern::set(&format!("{}/core.%p", dir.display()))?;
    let unlimited = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: prlimit with a valid limit to set and no old one asked for.
    if unsafe { libc::prlimit(pid, libc::RLIMIT_CORE, &unlimited, std::ptr::null_mut()) } != 0 {
        return Err(format!("prlimit: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: a signal to our own child.
    unsafe { libc::kill(pid, libc::SIGABRT) };
    let core = dir.join(format!("core.{pid}"));
    let deadline = Instant::now() + LIMIT;
    // The core is written before the process ends (it stays a zombie of ours until then).
    while Instant::now() < deadline {
        let status = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        if status.contains(") Z ") || status.is_empty() {
            return if core.is_file() {
                Ok(())
            } else {
                Err(format!("the kernel wrote no {}", core.display()))
            };
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Err("the process did not end after SIGABRT".into())
}

/// Sets the kernel's core pattern for as long as it lives, then puts the old one back.
pub struct CorePattern {
    old: String,
    _turn: super::Turn,
}

pub const CORE_PATTERN: &str = "/proc/sys/kernel/core_pattern";

impl CorePattern {
    fn set(pattern: &str) -> Result<CorePattern, String> {
        let turn = super::turn("core-pattern");
        let old = std::fs::read_to_string(CORE_PATTERN).map_err(|e| e.to_string())?;
        std::fs::write(CORE_PATTERN, pattern)
            .map_err(|e| format!("writing {CORE_PATTERN}: {e}"))?;
        Ok(CorePattern {
            old: old.trim_end_matches('\n').to_string(),
            _turn: turn,
        })
    }
}

impl Drop for CorePattern {
    fn drop(&mut self) {
        let _ = std::fs::write(CORE_PATTERN, &self.old);
    }
}

/// Runs fixtures/core_crash.py with `py`, RLIMIT_CORE unlimited, the core pattern pointing
/// into `dir`: the core the kernel wrote, and the crashed process's pid.
pub fn crash_core(py: &Interpreter, dir: &Path) -> Result<(PathBuf, i32), String> {
    use std::os::unix::process::CommandExt;
    use std::os::unix::process::ExitStatusExt;
    let _pattern = CorePattern::set(&format!("{}/core.%p", dir.display()))?;
    let mut cmd = Command::new(&py.path);
    cmd.arg(super::fixture("core_crash.py"))
        .current_dir(super::repo_root())
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("LC_ALL", "C.UTF-8")
        .env_remove("PYTHONPATH")
        .env_remove("PYTHONHOME");
    // SAFETY: between fork and exec only setrlimit, async-signal-safe, runs.
    unsafe {
        cmd.pre_exec(|| {
            let unlimited = libc::rlimit {
                rlim_cur: libc::RLIM_INFINITY,
                rlim_max: libc::RLIM_INFINITY,
            };
            if libc::setrlimit(libc::RLIMIT_CORE, &unlimited) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", py.path.display()))?;
    let pid = child.id() as i32;
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    if out.status.signal() != Some(libc::SIGSEGV) || !out.status.core_dumped() {
        return Err(format!(
            "the fixture did not crash with a core: {:?}, stderr {:?}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let core = dir.join(format!("core.{pid}"));
    if !core.is_file() {
        return Err(format!("the kernel wrote no {}", core.display()));
    }
    Ok((core, pid))
}

/// A failed run: a non-zero exit (not a panic's 101), one line on stderr that contains
/// `want`, nothing on stdout.
pub fn check_one_line_error(r: &Run, want: &str) -> Result<(), String> {
    let err = r.stderr.trim_end();
    if r.timed_out || matches!(r.code, Some(0) | Some(101) | None) {
        return Err(format!("not a clean failure: {}", r.describe()));
    }
    if err.lines().count() != 1 || !err.contains(want) || err.contains("panicked") {
        return Err(format!("not one line saying {want:?}: {err:?}"));
    }
    if !r.stdout.is_empty() {
        return Err(format!("output besides the error: {:.200}", r.stdout));
    }
    Ok(())
}

/// The interpreter the one-core tests use: the first of the representatives not run
/// chrooted (its files are the host's).
pub fn one_interpreter() -> Interpreter {
    super::representatives()
        .into_iter()
        .find(|i| i.root.is_none() && !i.is_py2())
        .expect("a representative interpreter that runs on the host")
}
