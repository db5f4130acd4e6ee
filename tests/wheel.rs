//! The binary wheel (`pip install`): `tools/wheel.sh` builds it (manylinux2014, glibc 2.17)
//! into `target/wheels/`, `.ci/run` calls it before `cargo test`. This test pip installs that
//! wheel into fresh venvs of an old and a new interpreter (pyenv's 3.7 and its newest) and of
//! Debian 11 bullseye's own python3 (3.9, glibc 2.31; the root made by `tools/bullseye.sh`,
//! run chrooted), and runs the README's quick start through the installed `scalene-rs`
//! command: `dump` of the demo, then `run` (memory on, the default) of `fixtures/cpu/split.py`.
//!
//! Without a wheel, with one older than the sources, or without the bullseye root, it skips
//! with the reason, and fails in CI (tests/common: `skip_or_fail`).

mod common;

use common::{cache_dir, repo_root, run_limited, say, skip_or_fail, Interpreter};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime};

const TEST: &str = "wheel";

/// The newest modification time of the files the wheel is built from.
fn newest_source() -> SystemTime {
    fn walk(p: &Path, newest: &mut SystemTime) {
        let Ok(meta) = std::fs::metadata(p) else {
            return;
        };
        if meta.is_dir() {
            for e in std::fs::read_dir(p).into_iter().flatten().flatten() {
                walk(&e.path(), newest);
            }
        } else if let Ok(t) = meta.modified() {
            *newest = (*newest).max(t);
        }
    }
    let root = repo_root();
    let mut newest = SystemTime::UNIX_EPOCH;
    for p in [
        "src",
        "preload/src",
        "preload/Cargo.toml",
        "Cargo.toml",
        "Cargo.lock",
        "build.rs",
        "pyproject.toml",
    ] {
        walk(&root.join(p), &mut newest);
    }
    newest
}

/// The wheel `tools/wheel.sh` built, or why there is none to test.
fn wheel() -> Result<PathBuf, String> {
    let dir = repo_root().join("target/wheels");
    let mut wheels: Vec<PathBuf> = std::fs::read_dir(&dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            let name = p.file_name().unwrap_or_default().to_string_lossy();
            name.starts_with("scalene_rs-") && name.ends_with(".whl")
        })
        .collect();
    match wheels.len() {
        0 => {
            return Err(format!(
                "no scalene_rs-*.whl in {}: build it with tools/wheel.sh",
                dir.display()
            ))
        }
        1 => {}
        _ => {
            return Err(format!(
                "several wheels in {} ({wheels:?}): tools/wheel.sh leaves one",
                dir.display()
            ))
        }
    }
    let wheel = wheels.remove(0);
    let built = std::fs::metadata(&wheel)
        .and_then(|m| m.modified())
        .map_err(|e| format!("{}: {e}", wheel.display()))?;
    if built < newest_source() {
        return Err(format!(
            "{} is older than the sources it is built from: rebuild it with tools/wheel.sh",
            wheel.display()
        ));
    }
    Ok(wheel)
}

/// Where the Python runs: on this machine, or chrooted into the bullseye root (through
/// `tools/bullseye.sh`'s wrapper, which binds /tmp and the working directory at their paths).
enum Place {
    Host(PathBuf),
    Bullseye(PathBuf),
}

impl Place {
    /// A `sh -c SCRIPT` there, in the repository, with `VENV` and `PY` in its environment.
    fn sh(&self, script: &str, venv: &Path) -> Command {
        let (sh, py) = match self {
            Place::Host(py) => (PathBuf::from("/bin/sh"), py.as_path()),
            Place::Bullseye(wrapper) => (wrapper.clone(), Path::new("/usr/bin/python3")),
        };
        let mut cmd = Command::new(sh);
        if let Place::Bullseye(_) = self {
            // The venv's directory, bound at its own path in the root (/tmp already is; the
            // temporary directory may be elsewhere).
            if let Some(dir) = venv.parent() {
                cmd.env("SCALENE_RS_ROOT_BIND", dir);
            }
        }
        cmd.current_dir(repo_root())
            .env("VENV", venv)
            .env("PY", py)
            .args(["-c", script]);
        cmd
    }
}

/// Runs one step, and returns its stdout and stderr, or says what failed.
fn step(
    place: &Place,
    venv: &Path,
    what: &str,
    script: &str,
    limit: u64,
) -> Result<(String, String), String> {
    let r = run_limited(place.sh(script, venv), Duration::from_secs(limit));
    if r.code != Some(0) || r.timed_out {
        return Err(format!(
            "{what} failed: {}\n--- stdout:\n{}",
            r.describe(),
            r.stdout.trim_end()
        ));
    }
    Ok((r.stdout, r.stderr))
}

/// Installs the wheel into a fresh venv there and runs the README's quick start with the
/// installed command (the venv's bin first on PATH, as an activated venv has it).
fn check(place: &Place, wheel: &Path) -> Result<String, String> {
    let tmp = std::env::temp_dir().join(format!(
        "scalene-rs-wheel-{}-{}",
        std::process::id(),
        rand_suffix()
    ));
    std::fs::create_dir_all(&tmp).map_err(|e| format!("{}: {e}", tmp.display()))?;
    let venv = tmp.join("venv");
    let result = (|| {
        let install = format!(
            "set -e; \"$PY\" -m venv \"$VENV\"; \
             \"$VENV/bin/python\" -m pip install -q --no-index --disable-pip-version-check '{}'; \
             PATH=\"$VENV/bin:$PATH\"; command -v scalene-rs; \"$VENV/bin/python\" -c 'import sys; print(sys.version.split()[0])'",
            wheel.display()
        );
        let (out, _) = step(
            place,
            &venv,
            "python -m venv + pip install of the wheel",
            &install,
            300,
        )?;
        let mut lines = out.lines();
        let (installed, version) = (lines.next().unwrap_or(""), lines.next().unwrap_or(""));
        if installed != venv.join("bin/scalene-rs").to_string_lossy() {
            return Err(format!(
                "scalene-rs on the venv's PATH is {installed:?}, not the venv's"
            ));
        }
        // The README's quick start: the demo's stacks…
        let (dump, _) = step(
            place,
            &venv,
            "scalene-rs dump of the demo",
            "PATH=\"$VENV/bin:$PATH\"; python3 fixtures/demo.py & sleep 2; scalene-rs dump $!; rc=$?; kill $!; exit $rc",
            120,
        )?;
        for want in [
            "Process ",
            "Thread ",
            "crunch (",
            "serve_forever (",
            "fixtures/demo.py:",
        ] {
            if !dump.contains(want) {
                return Err(format!("dump of the demo has no {want:?}:\n{dump}"));
            }
        }
        // …and a profile of split.py, memory on (the default): the preload library is
        // written out of the installed binary and loaded into this Python.
        let (out, report) = step(
            place,
            &venv,
            "scalene-rs run -- python3 fixtures/cpu/split.py",
            "PATH=\"$VENV/bin:$PATH\"; scalene-rs run -- python3 fixtures/cpu/split.py",
            300,
        )?;
        if !out.contains("truth python=") {
            return Err(format!(
                "split.py's own output is missing from stdout: {out:?}"
            ));
        }
        let rows = |line: u64| {
            report
                .lines()
                .any(|l| l.trim_start().starts_with(&format!("{line} │")))
        };
        // The two hot lines, found by their MARK comments (the fixture's lines move).
        let split = repo_root().join("fixtures/cpu/split.py");
        let (python, native) = (
            common::mark(&split, "python"),
            common::mark(&split, "native"),
        );
        if !report.contains("Memory:    peak")
            || !report.contains("cpu/split.py:")
            || !rows(python)
            || !rows(native)
        {
            return Err(format!(
                "the report lacks the memory summary or split.py's lines {python} and {native}:\n{report}"
            ));
        }
        let memory = report
            .lines()
            .find(|l| l.starts_with("Memory:"))
            .unwrap_or("")
            .to_string();
        Ok(format!(
            "Python {version}: {installed}: dump and run ok; {memory}"
        ))
    })();
    let _ = std::fs::remove_dir_all(&tmp);
    result
}

fn rand_suffix() -> u32 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0)
}

#[test]
fn wheel_installs_and_profiles_in_fresh_venvs() {
    let wheel = match wheel() {
        Ok(w) => w,
        Err(why) => return skip_or_fail(TEST, &why),
    };
    say(&format!("wheel: {}", wheel.display()));
    let pyenv: Vec<Interpreter> = common::interpreters()
        .into_iter()
        .filter(|i| i.label.starts_with("pyenv-") && i.major == 3)
        .collect();
    let mut places = Vec::new();
    match pyenv.iter().find(|i| i.version() == (3, 7)) {
        Some(old) => places.push((old.label.clone(), Place::Host(old.path.clone()))),
        None => return skip_or_fail(TEST, "no pyenv 3.7 (the old interpreter to install into)"),
    }
    match pyenv
        .iter()
        .filter(|i| i.version() > (3, 7))
        .max_by_key(|i| i.version())
    {
        Some(new) => places.push((new.label.clone(), Place::Host(new.path.clone()))),
        None => return skip_or_fail(TEST, "no pyenv interpreter newer than 3.7"),
    }
    let bullseye = cache_dir().join("bin/bullseye-sh");
    if !bullseye.is_file() {
        return skip_or_fail(
            TEST,
            &format!(
                "no Debian 11 bullseye root ({} is missing): make it with tools/bullseye.sh",
                bullseye.display()
            ),
        );
    }
    places.push(("bullseye-python3".into(), Place::Bullseye(bullseye)));
    let mut failures = Vec::new();
    for (label, place) in &places {
        match check(place, &wheel) {
            Ok(summary) => say(&format!("{label}: {summary}")),
            Err(e) => failures.push(format!("{label}: {e}")),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
