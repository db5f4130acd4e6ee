//! `scalene-rs dump --core` of compressed and damaged cores (the cores themselves:
//! tests/common/cores.rs; the cores of every interpreter: tests/dump_core.rs).
//! - The kernel's core of fixtures/core_crash.py compressed (gzip, zstd, lz4, xz): the
//!   same output as the plain core.
//! - Damaged cores (truncated, not a core, empty, segments removed, files of another
//!   build): one line on stderr, a non-zero exit, no panic, within the time limit.

mod common;

use common::cores::{
    check_one_line_error, crash_core, dump_core, have, json, ok_stdout, one_interpreter, BAD_CORE,
};
use common::Interpreter;
use serde_json::Value;
use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

#[test]
fn compressed_cores_read_as_the_core() {
    let test = "compressed_cores_read_as_the_core";
    let tools = [
        ("gzip", "gzip"),
        ("zstd", "zstd"),
        ("lz4", "lz4"),
        ("xz", "xz-utils"),
    ];
    if !tools.iter().all(|(t, p)| have(t, p, test)) {
        return;
    }
    let py = one_interpreter();
    let dir = common::tempdir("scalene-rs-zcore");
    let r = (|| -> Result<String, String> {
        let (core, _) = crash_core(&py, &dir)?;
        let plain = json(
            "plain",
            &ok_stdout("plain", &dump_core(&core, &py, false, &["--json"]))?,
        )?;
        let mut done = Vec::new();
        for (tool, format) in [
            ("gzip", "gzip"),
            ("zstd", "zstd"),
            ("lz4", "lz4"),
            ("xz", "xz"),
        ] {
            let packed = dir.join(format!("packed.{tool}"));
            let out = std::fs::File::create(&packed).map_err(|e| e.to_string())?;
            let st = Command::new(tool)
                .args(["-c", "-1"])
                .arg(&core)
                .stdout(out)
                .status()
                .map_err(|e| format!("{tool}: {e}"))?;
            if !st.success() {
                return Err(format!("{tool} failed: {st:?}"));
            }
            let mut got = json(
                tool,
                &ok_stdout(tool, &dump_core(&packed, &py, false, &["--json"]))?,
            )?;
            if got["core"]["format"] != format {
                return Err(format!("{tool}: format {}", got["core"]["format"]));
            }
            let mut want = plain.clone();
            for v in [&mut got, &mut want] {
                v["core"]["format"] = Value::Null;
                v["core"]["file"] = Value::Null;
            }
            if got != want {
                return Err(format!("{tool}: not the plain core's output"));
            }
            done.push(tool);
        }
        Ok(format!("{done:?} read as the plain core"))
    })();
    let _ = std::fs::remove_dir_all(&dir);
    match r {
        Ok(s) => common::say(&format!("{}: {s}", py.label)),
        Err(e) => panic!("{}: {e}", py.label),
    }
}

/// The shared libpython `py` loads, where it has one (its real path, as mapped).
fn libpython_of(py: &Interpreter) -> Option<PathBuf> {
    let out = Command::new(&py.path)
        .args([
            "-c",
            "import sysconfig as s; print('%s/%s' % (s.get_config_var('LIBDIR'), s.get_config_var('INSTSONAME')))",
        ])
        .output()
        .ok()?;
    let p = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    std::fs::canonicalize(p).ok().filter(|p| p.is_file())
}

/// The core's bytes with every writable `PT_LOAD` made `PT_NULL`: the process's data gone.
fn without_writable_segments(core: &[u8]) -> Vec<u8> {
    let mut b = core.to_vec();
    let u = |b: &[u8], at: usize, n: usize| -> u64 {
        let mut v = [0u8; 8];
        v[..n].copy_from_slice(&b[at..at + n]);
        u64::from_le_bytes(v)
    };
    let (phoff, phnum) = (u(&b, 32, 8) as usize, u(&b, 56, 2) as usize);
    for i in 0..phnum {
        let at = phoff + i * 56;
        if u(&b, at, 4) == 1 && u(&b, at + 4, 4) & 2 != 0 {
            b[at..at + 4].copy_from_slice(&0u32.to_le_bytes());
        }
    }
    b
}

#[test]
fn damaged_cores_fail_in_one_line() {
    let py = one_interpreter();
    let dir = common::tempdir("scalene-rs-dcore");
    let r = (|| -> Result<String, String> {
        let (core, _) = crash_core(&py, &dir)?;
        let bytes = std::fs::read(&core).map_err(|e| e.to_string())?;
        let write = |name: &str, b: &[u8]| {
            let p = dir.join(name);
            std::fs::write(&p, b).unwrap();
            p
        };
        let cases: Vec<(&str, PathBuf, &str, Option<i32>)> = vec![
            (
                "truncated",
                write("half", &bytes[..bytes.len() / 2]),
                "truncated",
                Some(BAD_CORE),
            ),
            (
                "headers only",
                write("head", &bytes[..100]),
                "cut short",
                Some(BAD_CORE),
            ),
            ("empty", write("empty", b""), "empty", Some(BAD_CORE)),
            (
                "a script",
                common::fixture("core_crash.py"),
                "not a core file",
                Some(BAD_CORE),
            ),
            ("a program", py.path.clone(), "not a core", Some(BAD_CORE)),
            (
                "damaged gzip",
                write("bad.gz", &[0x1f, 0x8b, 8, 0, 1, 2, 3]),
                "damaged gzip",
                Some(BAD_CORE),
            ),
            (
                "no such file",
                dir.join("absent"),
                "cannot open it",
                Some(BAD_CORE),
            ),
            (
                "data segments removed",
                write("nodata", &without_writable_segments(&bytes)),
                "not in the core",
                None,
            ),
        ];
        let mut said = Vec::new();
        for (what, path, want, code) in cases {
            let start = Instant::now();
            let r = dump_core(&path, &py, false, &[]);
            check_one_line_error(&r, want).map_err(|e| format!("{what}: {e}"))?;
            if code.is_some() && r.code != code {
                return Err(format!("{what}: exit {:?}, not {code:?}", r.code));
            }
            said.push(format!("{what} ({:.1} s)", start.elapsed().as_secs_f64()));
        }
        // Another build's files under --lib-root (the executable and libpython replaced
        // by /bin/true): named, never read.
        let root = dir.join("root");
        let v = json(
            "plain",
            &ok_stdout("plain", &dump_core(&core, &py, false, &["--json"]))?,
        )?;
        let exe = v["executable"].as_str().ok_or("no executable")?.to_string();
        let mut replaced = vec![PathBuf::from(exe)];
        replaced.extend(libpython_of(&py));
        for file in &replaced {
            let stand_in = root.join(file.strip_prefix("/").unwrap_or(file));
            std::fs::create_dir_all(stand_in.parent().unwrap()).unwrap();
            std::fs::copy("/bin/true", &stand_in).map_err(|e| e.to_string())?;
        }
        let root_arg = root.display().to_string();
        let r = dump_core(&core, &py, false, &["--lib-root", &root_arg]);
        check_one_line_error(&r, "build id").map_err(|e| format!("another build: {e}"))?;
        if !r.stderr.contains(&root_arg) {
            return Err(format!(
                "another build: the file is not named: {:?}",
                r.stderr
            ));
        }
        said.push("another build under --lib-root".into());
        Ok(said.join(", "))
    })();
    let _ = std::fs::remove_dir_all(&dir);
    match r {
        Ok(s) => common::say(&format!("{}: {s}", py.label)),
        Err(e) => panic!("{}: {e}", py.label),
    }
}
