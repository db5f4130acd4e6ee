//! `view` of damaged and hostile profiles (issue 21, part 3): truncated files, flipped bytes,
//! absurd values in every numeric field (negative, 1e308, 2^64), 1 MB strings in every
//! string field, 100,000-deep nesting, a profile of a future schema version. Each is either
//! refused with a one-line error and a non-zero exit, or rendered in every format, within a
//! time bound: never a panic, never an allocation the size of a damaged number.
//!
//! The bulk runs in-process (the library's reader and renderers, as `view` calls them); a
//! sample of each kind also runs through the binary to check its exit and its one line.

mod common;

use scalene_rs::report::{self, Format, RenderOptions};
use serde_json::Value;
use std::process::Command;
use std::time::{Duration, Instant};

const FORMATS: [Format; 7] = [
    Format::Terminal,
    Format::Json,
    Format::Flamegraph,
    Format::Speedscope,
    Format::Collapsed,
    Format::Pprof,
    Format::Html,
];

/// `s` cut to 300 characters, for a failure's message (a case may hold a megabyte).
fn cut(s: &str) -> String {
    s.chars().take(300).collect()
}

/// One render of one format may take this long on a damaged profile (the base renders in
/// milliseconds).
const RENDER_LIMIT: Duration = Duration::from_secs(5);

/// The golden profile with memory (tests/golden/memory), plus GPU figures, so that every
/// part of the schema is there to damage.
fn base() -> Value {
    let text =
        std::fs::read_to_string(common::repo_root().join("tests/golden/memory/profile.json"))
            .unwrap();
    let mut p: Value = serde_json::from_str(&text).unwrap();
    let frames = p["stacks"][0]["frames"].clone();
    p["gpu"] = serde_json::json!({
        "gpu_s": 1.5, "unattributed_s": 0.1, "mem_peak_mb": 4096.0,
        "timeline": [[0.0, 50.0, 100.0], [0.5, 80.0, 4096.0]],
        "devices": [{"index": 0, "name": "GPU", "uuid": "GPU-x", "gpu_s": 1.5,
                     "mem_peak_mb": 4096.0, "device_busy_pct": 60.0}],
        "stacks": [{"frames": frames, "native_id": 1, "gpu_ms": 1500.0}],
        "other_process_samples": 3
    });
    for f in p["files"].as_array_mut().unwrap() {
        for l in f["lines"].as_array_mut().unwrap() {
            l["gpu_pct"] = serde_json::json!(10.0);
            l["gpu_mem_peak_mb"] = serde_json::json!(512.0);
        }
    }
    p
}

/// What reading and rendering `text` in every format gave: Err(the reader's message), or
/// Ok with each format's outcome. Panics (caught) and slow renders are failures.
fn outcome(text: &str) -> Result<Result<(), String>, String> {
    let started = Instant::now();
    let read = std::panic::catch_unwind(|| report::profile_json::from_json(text))
        .map_err(|_| "the reader panicked".to_string())?;
    let profile = match read {
        Ok(p) => p,
        Err(e) => {
            let msg = e.to_string();
            if msg.contains('\n') || msg.is_empty() || msg.chars().count() > 1000 {
                return Err(format!(
                    "the reader's error is not one short line ({} characters): {:?}",
                    msg.chars().count(),
                    cut(&msg)
                ));
            }
            return Ok(Err(msg));
        }
    };
    for format in FORMATS {
        // The memory option changes only the flame graph and the collapsed stacks.
        let both: &[bool] = match format {
            Format::Flamegraph | Format::Collapsed => &[false, true],
            _ => &[false],
        };
        for &memory in both {
            let opts = RenderOptions {
                color: false,
                width: 120,
                threads: true,
                memory,
            };
            let t = Instant::now();
            let r = std::panic::catch_unwind(|| report::render(&profile, format, &opts));
            if r.is_err() {
                return Err(format!("rendering {format:?} (memory {memory}) panicked"));
            }
            if t.elapsed() > RENDER_LIMIT {
                return Err(format!("rendering {format:?} took {:?}", t.elapsed()));
            }
        }
    }
    let _ = started;
    Ok(Ok(()))
}

/// The paths in `v` of every leaf `want` accepts.
fn leaf_paths(v: &Value, want: fn(&Value) -> bool, at: &mut Vec<Step>, out: &mut Vec<Vec<Step>>) {
    match v {
        Value::Array(a) => {
            for (i, x) in a.iter().enumerate() {
                at.push(Step::Index(i));
                leaf_paths(x, want, at, out);
                at.pop();
            }
        }
        Value::Object(o) => {
            for (k, x) in o {
                at.push(Step::Key(k.clone()));
                leaf_paths(x, want, at, out);
                at.pop();
            }
        }
        leaf if want(leaf) => out.push(at.clone()),
        _ => {}
    }
}

#[derive(Clone, Debug)]
enum Step {
    Key(String),
    Index(usize),
}

fn at_mut<'v>(v: &'v mut Value, path: &[Step]) -> &'v mut Value {
    path.iter().fold(v, |v, s| match s {
        Step::Key(k) => &mut v[k.as_str()],
        Step::Index(i) => &mut v[*i],
    })
}

/// Numbers from a damaged file: JSON literals, so 2^64 and -0 stay as written.
const ABSURD: [&str; 4] = ["-1", "1e308", "18446744073709551616", "4294967295"];

#[test]
fn absurd_numbers_and_huge_strings_never_panic_or_hang() {
    let base = base();
    let mut failures = Vec::new();
    let mut refused = 0;
    let mut rendered = 0;
    let started = Instant::now();
    let mut paths = Vec::new();
    leaf_paths(&base, Value::is_number, &mut Vec::new(), &mut paths);
    for path in &paths {
        for lit in ABSURD {
            let mut v = base.clone();
            *at_mut(&mut v, path) = Value::Null;
            // Put the literal in as text: serde_json's Value would turn 2^64 into a float.
            let text = v.to_string().replacen("null", lit, 1);
            let text = if v.to_string().matches("null").count() == 1 {
                text
            } else {
                // More than one null already: set it through the value (as a float).
                let mut v = base.clone();
                *at_mut(&mut v, path) = serde_json::json!(lit.parse::<f64>().unwrap());
                v.to_string()
            };
            match outcome(&text) {
                Ok(Ok(())) => rendered += 1,
                Ok(Err(_)) => refused += 1,
                Err(e) => failures.push(format!("{path:?} = {lit}: {}", cut(&e))),
            }
        }
    }
    let numbers_took = started.elapsed();
    let mut strings = Vec::new();
    leaf_paths(&base, Value::is_string, &mut Vec::new(), &mut strings);
    // One field of each name (a 1 MB string costs every renderer a moment in a debug
    // build): the first `function`, the first `filename`, `program`, ...
    let mut names_seen = std::collections::HashSet::new();
    strings.retain(|path| {
        let name: Vec<String> = path
            .iter()
            .map(|s| match s {
                Step::Key(k) => k.clone(),
                Step::Index(_) => "[]".into(),
            })
            .collect();
        names_seen.insert(name.join("."))
    });
    let huge = "x\u{2028}<>&;\n".repeat(1 << 17);
    for path in &strings {
        let mut v = base.clone();
        *at_mut(&mut v, path) = Value::String(huge.clone());
        match outcome(&v.to_string()) {
            Ok(Ok(())) => rendered += 1,
            Ok(Err(_)) => refused += 1,
            Err(e) => failures.push(format!("{path:?} = 1 MB string: {}", cut(&e))),
        }
    }
    common::say(&format!(
        "{} numeric fields × {} values ({numbers_took:.1?}) and {} string fields ({:.1?}): \
         {rendered} rendered in every format, {refused} refused with one line",
        paths.len(),
        ABSURD.len(),
        strings.len(),
        started.elapsed() - numbers_took
    ));
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn truncated_and_flipped_files_never_panic() {
    let text = base().to_string();
    let bytes = text.as_bytes();
    let mut failures = Vec::new();
    let mut rng = common::Rng(0x5eed_1e55);
    let mut cases: Vec<Vec<u8>> = (0..40)
        .map(|i| bytes[..bytes.len() * i / 40].to_vec())
        .collect();
    for _ in 0..400 {
        let mut b = bytes.to_vec();
        for _ in 0..1 + rng.below(8) {
            let i = rng.below(b.len() as u64) as usize;
            b[i] ^= 1 << rng.below(8);
        }
        cases.push(b);
    }
    let (mut refused, mut rendered) = (0, 0);
    for (i, b) in cases.iter().enumerate() {
        // `view` reads the file as UTF-8 first: invalid UTF-8 is its one-line error.
        let Ok(text) = std::str::from_utf8(b) else {
            refused += 1;
            continue;
        };
        match outcome(text) {
            Ok(Ok(())) => rendered += 1,
            Ok(Err(_)) => refused += 1,
            Err(e) => failures.push(format!("case {i}: {}", cut(&e))),
        }
    }
    common::say(&format!(
        "{} damaged files: {rendered} rendered, {refused} refused",
        cases.len()
    ));
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Through the binary: each kind of damage exits non-zero with one line, or renders.
#[test]
fn view_says_what_is_wrong_in_one_line() {
    let dir = common::tempdir("scalene-rs-view-damaged");
    let base = base();
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    let mut future = base.clone();
    future["schema_version"] = serde_json::json!(99);
    let mut negative = base.clone();
    negative["duration_s"] = serde_json::json!(-5.0);
    negative["total_s"] = serde_json::json!(-1.0);
    let text = base.to_string();
    let cases: Vec<(&str, String, bool)> = vec![
        ("truncated", text[..text.len() / 2].to_string(), false),
        ("not JSON", "{\"schema_version\": 2, NaN}".into(), false),
        ("100,000-deep nesting", deep.clone(), false),
        (
            "deep nesting inside a field",
            text.replacen("\"files\":", &format!("\"nested\":{deep},\"files\":"), 1),
            false,
        ),
        ("a future schema version", future.to_string(), false),
        ("negative durations", negative.to_string(), true),
        ("empty file", String::new(), false),
    ];
    let mut failures = Vec::new();
    for (name, content, renders) in cases {
        let file = dir.join("p.json");
        std::fs::write(&file, &content).unwrap();
        for out in ["", "x.svg", "x.html", "x.pb.gz"] {
            let mut cmd = Command::new(common::bin());
            cmd.arg("view").arg(&file);
            if !out.is_empty() {
                cmd.arg("-o").arg(dir.join(out));
            }
            let r = common::run_limited(cmd, Duration::from_secs(20));
            let lines = r.stderr.lines().count();
            let ok = if renders {
                r.code == Some(0)
            } else {
                r.code.is_some_and(|c| c != 0)
                    && lines == 1
                    && r.stderr.starts_with("error: ")
                    && !r.stderr.contains("panicked")
            };
            if !ok {
                failures.push(format!("{name} -o {out:?}: {}", cut(&r.describe())));
            } else if out.is_empty() {
                common::say(&format!("{name}: {}", r.stderr.trim()));
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
