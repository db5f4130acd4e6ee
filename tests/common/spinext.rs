//! fixtures/native/spinext.c, a C extension whose native frames are known by construction,
//! built for one interpreter of the matrix with its own headers (tests/native.rs, and
//! tests/containers.rs for `dump --native` across namespaces, tests/native_debuginfo.rs
//! for its separate debug files), and spin.py running with it.
#![allow(dead_code)]

use super::Interpreter;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::mpsc::Receiver;
use std::time::Duration;

/// What an interpreter says of itself: its include directory (as it sees it) and the file
/// name suffix of its extension modules.
pub fn sysconfig(interp: &Interpreter) -> Result<(String, String), String> {
    let out = Command::new(&interp.path)
        .args([
            "-c",
            "import sysconfig; print(sysconfig.get_paths()['include']); \
             print(sysconfig.get_config_var('EXT_SUFFIX') or sysconfig.get_config_var('SO'))",
        ])
        .output()
        .map_err(|e| format!("cannot run {}: {e}", interp.path.display()))?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut lines = text.lines();
    match (lines.next(), lines.next()) {
        (Some(inc), Some(suffix)) if out.status.success() => {
            Ok((inc.trim().to_string(), suffix.trim().to_string()))
        }
        _ => Err(format!(
            "sysconfig of {}: {}",
            interp.path.display(),
            String::from_utf8_lossy(&out.stderr)
        )),
    }
}

/// `path` as we see it: under the interpreter's root when it runs chrooted.
pub fn on_host(interp: &Interpreter, path: &str) -> PathBuf {
    match &interp.root {
        Some(root) => root.join(path.trim_start_matches('/')),
        None => PathBuf::from(path),
    }
}

/// The directory with `Python.h` for this interpreter's ABI: its own, else that of another
/// interpreter of the matrix with the same version and build kind (Debian's chrooted 3.13
/// ships no headers).
pub fn include_dir(interp: &Interpreter, own: &str) -> Result<PathBuf, String> {
    let dir = on_host(interp, own);
    if dir.join("Python.h").is_file() {
        return Ok(dir);
    }
    for other in super::interpreters() {
        if (other.major, other.minor, other.free_threaded)
            != (interp.major, interp.minor, interp.free_threaded)
            || other.path == interp.path
        {
            continue;
        }
        if let Ok((inc, _)) = sysconfig(&other) {
            let d = on_host(&other, &inc);
            if d.join("Python.h").is_file() {
                return Ok(d);
            }
        }
    }
    Err(format!(
        "no Python.h for {} (looked in {})",
        interp.label,
        dir.display()
    ))
}

/// Builds fixtures/native/spinext.c for `interp` into a new directory under /tmp;
/// `strip`: then strips it of everything but what loading needs (`strip --strip-all`).
/// Returns the directory and the extension's file name.
pub fn build_ext(interp: &Interpreter, strip: bool) -> Result<(PathBuf, String), String> {
    let (inc, suffix) = sysconfig(interp)?;
    let dir = super::tempdir(&format!("scalene-rs-native-{}", interp.label));
    let name = format!("spinext{suffix}");
    compile_ext(interp, &inc, &dir.join(&name), &[])?;
    if strip {
        let s = Command::new("strip")
            .arg("--strip-all")
            .arg(dir.join(&name))
            .status()
            .map_err(|e| format!("cannot run strip: {e}"))?;
        if !s.success() {
            return Err(format!("strip --strip-all {name} failed"));
        }
    }
    Ok((dir, name))
}

/// Compiles fixtures/native/spinext.c into `out` with the extra `flags`.
pub fn compile_ext(
    interp: &Interpreter,
    inc: &str,
    out: &Path,
    flags: &[&str],
) -> Result<(), String> {
    compile_fixture(interp, inc, "native/spinext.c", out, flags)
}

/// Compiles the C extension `fixture` (a path under fixtures/) for `interp`, whose include
/// directory is `inc` as it sees it, into `out` (`-O2 -g`, every call keeping its frame)
/// with the extra `flags`.
pub fn compile_fixture(
    interp: &Interpreter,
    inc: &str,
    fixture: &str,
    out: &Path,
    flags: &[&str],
) -> Result<(), String> {
    let include = include_dir(interp, inc)?;
    let mut cc = Command::new("cc");
    cc.args(flags);
    cc.args([
        "-shared",
        "-fPIC",
        "-O2",
        "-g",
        "-fno-optimize-sibling-calls",
    ])
    .arg("-I")
    .arg(&include);
    if let Some(root) = &interp.root {
        // pyconfig.h of a Debian root includes its multiarch copy from <x86_64-linux-gnu/…>:
        // found there, after our own system headers.
        cc.arg("-idirafter").arg(root.join("usr/include"));
    }
    cc.arg(super::fixture(fixture))
        .arg("-o")
        .arg(out)
        .arg("-lpthread");
    let run = cc.output().map_err(|e| format!("cannot run cc: {e}"))?;
    if !run.status.success() {
        return Err(format!(
            "building {fixture} for {}: {}",
            interp.label,
            String::from_utf8_lossy(&run.stderr)
        ));
    }
    Ok(())
}

/// Compiles fixtures/native/spinext.c for `interp` into `out` (`-O2 -g`, every call keeping
/// its frame) with the extra `flags`.
pub fn compile(interp: &Interpreter, out: &Path, flags: &[&str]) -> Result<(), String> {
    let (inc, _) = sysconfig(interp)?;
    compile_ext(interp, &inc, out, flags)
}

/// Runs a tool (objcopy, strip, nm, xz) and returns its stdout; an error says which
/// command failed and why.
pub fn tool(program: &str, args: &[&std::ffi::OsStr]) -> Result<String, String> {
    let shown = || {
        let mut s = program.to_string();
        for a in args {
            s.push(' ');
            s.push_str(&a.to_string_lossy());
        }
        s
    };
    let out = Command::new(program)
        .args(args)
        .output()
        .map_err(|e| format!("cannot run {program} (binutils, xz-utils): {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{} failed: {}",
            shown(),
            String::from_utf8_lossy(&out.stderr).trim_end()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// How long spin.py may take to say it is ready.
const READY_TIMEOUT: Duration = Duration::from_secs(20);

/// fixtures/native/spin.py running with the extension in `dir`; killed and reaped when
/// dropped.
pub struct Target {
    child: Child,
    pub pid: i32,
    lines: Receiver<String>,
}

impl Target {
    /// Starts spin.py with `args` after the extension's directory, and waits for `ready`.
    pub fn start(interp: &Interpreter, dir: &Path, args: &[&str]) -> Result<Target, String> {
        let script = super::fixture("native/spin.py");
        let mut all = vec![dir.display().to_string()];
        all.extend(args.iter().map(|a| a.to_string()));
        let f = super::start_fixture(interp, &script, &all, false)?;
        let mut t = Target {
            child: f.child,
            pid: f.pid,
            lines: f.lines,
        };
        match t.lines.recv_timeout(READY_TIMEOUT) {
            Ok(line) if line == "ready" => Ok(t),
            other => {
                let _ = t.child.kill();
                let _ = t.child.wait();
                Err(format!(
                    "spin.py did not print `ready` ({other:?}); stderr: {}",
                    f.stderr.join().unwrap_or_default()
                ))
            }
        }
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Builds the C extension `fixture` (under fixtures/, e.g. "native/burnext.c"), named
/// `module`, for `interp` into a new directory under /tmp (where chrooted interpreters see
/// it at the same path); returns the directory (what the fixture puts on `sys.path`).
pub fn build_fixture_ext(
    interp: &Interpreter,
    fixture: &str,
    module: &str,
) -> Result<PathBuf, String> {
    let (inc, suffix) = sysconfig(interp)?;
    let dir = super::tempdir(&format!("scalene-rs-{module}-{}", interp.label));
    compile_fixture(
        interp,
        &inc,
        fixture,
        &dir.join(format!("{module}{suffix}")),
        &[],
    )?;
    Ok(dir)
}
