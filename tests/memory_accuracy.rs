//! Memory accuracy against programs whose truth is known by construction (fixtures/memory/), on
//! each representative interpreter (common::representatives): kept bytes and their Python
//! share, native allocations (numpy, where it is installed), copy volume, leaks, and two
//! threads allocating on different lines; small objects (pymalloc's kind) in every `--python-
//! allocator` mode. `SCALENE_RS_ACCURACY_RUN_ARGS` adds options to every `run` (e.g. `--keep-
//! pymalloc`, to check the other mode against the same truths).

mod common;

use serde_json::Value;
use std::process::{Command, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_scalene-rs");

fn interpreters() -> Vec<common::Interpreter> {
    let all = common::interpreters();
    assert!(!all.is_empty(), "no Python interpreter found");
    all
}

/// One profiled run at a time, across test processes (common::turn): each run's profiler
/// must answer its program's handshakes within a few milliseconds, which runs competing for
/// the same cores make harder.
const TURN: &str = "memory-accuracy";

/// Profiles `fixture` with `py` and returns the profile.
fn profile(py: &common::Interpreter, fixture: &str) -> Value {
    profile_with(py, fixture, &[]).0
}

/// Profiles `fixture` with `py`, `extra` options given to `run`; returns the profile and
/// the program's output.
fn profile_with(py: &common::Interpreter, fixture: &str, extra: &[&str]) -> (Value, String) {
    let _turn = common::turn(TURN);
    let from_env = std::env::var("SCALENE_RS_ACCURACY_RUN_ARGS").unwrap_or_default();
    let json = std::env::temp_dir().join(format!(
        "scalene-rs-acc-{}-{}-{}.json",
        std::process::id(),
        py.label,
        fixture.replace('/', "_")
    ));
    let out = Command::new(BIN)
        .arg("run")
        .args(from_env.split_whitespace().filter(|a| !extra.contains(a)))
        .args(extra)
        .arg("-o")
        .arg(&json)
        .arg("--")
        .arg(&py.path)
        .arg(common::fixture(fixture))
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}: {fixture}: {}",
        py.label,
        String::from_utf8_lossy(&out.stderr)
    );
    let p = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let _ = std::fs::remove_file(&json);
    (p, String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The line of `fixture` that carries `# MARKER`.
fn marked_line(fixture: &str, marker: &str) -> u64 {
    let text = std::fs::read_to_string(common::fixture(fixture)).unwrap();
    let tag = format!("# {marker}");
    let i = text
        .lines()
        .position(|l| l.trim_end().ends_with(&tag))
        .unwrap_or_else(|| panic!("{fixture} has no {tag}"));
    i as u64 + 1
}

/// The profile's line `line` of the file named like `fixture`.
fn line<'p>(p: &'p Value, fixture: &str, line: u64) -> Option<&'p Value> {
    let name = fixture.rsplit('/').next().unwrap();
    p["files"]
        .as_array()?
        .iter()
        .filter(|f| f["filename"].as_str().is_some_and(|n| n.ends_with(name)))
        .flat_map(|f| f["lines"].as_array().into_iter().flatten())
        .find(|l| l["line"].as_u64() == Some(line))
}

fn field(l: Option<&Value>, name: &str) -> f64 {
    l.and_then(|l| l[name].as_f64()).unwrap_or(0.0)
}

fn within(got: f64, want: f64, tolerance: f64) -> bool {
    (got - want).abs() <= tolerance * want
}

#[test]
fn kept_bytes_have_their_peak_and_are_python() {
    let fx = "memory/keep_200mb.py";
    let n = marked_line(fx, "KEEP");
    for py in common::representatives() {
        let p = profile(&py, fx);
        let l = line(&p, fx, n);
        let peak = field(l, "mem_peak_mb");
        let python = field(l, "mem_python_pct");
        let late = &p["memory"]["handshake_timeouts"];
        assert!(
            within(peak, 200.0, 0.10),
            "{}: peak {peak} MB ({late} late handshakes)",
            py.label
        );
        assert!(python >= 90.0, "{}: {python}% Python", py.label);
        let total = p["memory"]["peak_mb"].as_f64().unwrap();
        assert!(total >= 0.9 * 200.0, "{}: program peak {total}", py.label);
    }
}

/// The interpreters that must have numpy: `SCALENE_RS_NUMPY_PYTHONS`, labels separated by
/// commas, which tools/setup.sh writes to its settings file (those it installed numpy for;
/// it failed where it could not; see `common::setup_setting`). Unset: none is required,
/// but the test must still run on one.
fn numpy_required() -> Vec<String> {
    common::setup_setting("SCALENE_RS_NUMPY_PYTHONS")
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(String::from)
        .collect()
}

#[test]
fn numpy_allocations_are_native() {
    let fx = "memory/numpy_alloc.py";
    let n = marked_line(fx, "NUMPY");
    let required = numpy_required();
    assert!(
        !(required.is_empty() && common::ci_mode()),
        "CI mode, but SCALENE_RS_NUMPY_PYTHONS (the interpreters tools/setup.sh equipped with \
         numpy) is not set: run tools/setup.sh first"
    );
    let all = interpreters();
    let mut failures = Vec::new();
    // Every interpreter that was equipped must be in the matrix (unless the run keeps only
    // some interpreters on purpose).
    if std::env::var_os("SCALENE_RS_ONLY_PYTHONS").is_none() {
        for label in &required {
            if !all.iter().any(|py| &py.label == label) {
                failures.push(format!(
                    "{label}: listed in SCALENE_RS_NUMPY_PYTHONS but not in the interpreter matrix"
                ));
            }
        }
    }
    let mut ran = Vec::new();
    for py in all {
        let import = Command::new(&py.path)
            .args(["-c", "import numpy"])
            .output()
            .unwrap();
        if !import.status.success() {
            let why = String::from_utf8_lossy(&import.stderr);
            let why = why.trim().lines().last().unwrap_or("").to_string();
            if required.contains(&py.label) {
                failures.push(format!(
                    "{}: tools/setup.sh installed numpy for it (SCALENE_RS_NUMPY_PYTHONS) but \
                     `import numpy` fails: {why}",
                    py.label
                ));
            } else {
                // Not one CI equips (Debian unstable's roots carry no numpy): a case that
                // does not apply, said in the output.
                common::say(&format!(
                    "numpy_allocations_are_native [{}]: not run, no numpy for it and none \
                     required of it: {why}",
                    py.label
                ));
            }
            continue;
        }
        let p = profile(&py, fx);
        let l = line(&p, fx, n);
        let alloc = field(l, "mem_alloc_mb");
        let python = field(l, "mem_python_pct");
        if !within(alloc, 200.0, 0.10) || python > 10.0 {
            failures.push(format!(
                "{}: the numpy line allocated {alloc} MB ({python}% Python); 200 MB native expected",
                py.label
            ));
        }
        ran.push(py.label);
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(
        !ran.is_empty(),
        "numpy_allocations_are_native ran on no interpreter: none has numpy \
         (tools/setup.sh installs it: pip for pyenv's and the free-threaded build, apt's python3-numpy \
         for /usr/bin/python3.11)"
    );
    println!("numpy fixture ran on {} interpreters: {ran:?}", ran.len());
}

#[test]
fn copied_volume_is_measured() {
    let fx = "memory/copy_known.py";
    let n = marked_line(fx, "COPY");
    for py in common::representatives() {
        let p = profile(&py, fx);
        let l = line(&p, fx, n);
        let duration = p["duration_s"].as_f64().unwrap();
        let copied = field(l, "copy_mb_s") * duration;
        assert!(
            within(copied, 320.0, 0.20),
            "{}: {copied} MB copied",
            py.label
        );
    }
}

#[test]
fn a_growing_global_list_leaks_and_a_loop_does_not() {
    let fx = "memory/leak.py";
    let leak = marked_line(fx, "LEAK");
    let noleak = marked_line(fx, "NOLEAK");
    for py in common::representatives() {
        let p = profile(&py, fx);
        let leaks: Vec<u64> = p["memory"]["leaks"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|l| {
                l["filename"]
                    .as_str()
                    .is_some_and(|f| f.ends_with("leak.py"))
            })
            .filter_map(|l| l["line"].as_u64())
            .collect();
        assert!(leaks.contains(&leak), "{}: leaks {leaks:?}", py.label);
        assert!(!leaks.contains(&noleak), "{}: leaks {leaks:?}", py.label);
        // The loop did allocate (it was seen), it just freed.
        assert!(
            field(line(&p, fx, noleak), "mem_alloc_mb") >= 250.0,
            "{}",
            py.label
        );
    }
}

#[test]
fn two_threads_each_get_their_own_bytes() {
    let fx = "memory/two_threads.py";
    let a = marked_line(fx, "THREAD_A");
    let b = marked_line(fx, "THREAD_B");
    for py in common::representatives() {
        let p = profile(&py, fx);
        let (ma, mb) = (
            field(line(&p, fx, a), "mem_alloc_mb"),
            field(line(&p, fx, b), "mem_alloc_mb"),
        );
        let late = &p["memory"]["handshake_timeouts"];
        assert!(
            within(ma, 100.0, 0.20),
            "{}: A {ma} MB ({late} late)",
            py.label
        );
        assert!(
            within(mb, 50.0, 0.20),
            "{}: B {mb} MB ({late} late)",
            py.label
        );
    }
}

#[test]
fn small_objects_are_seen_with_either_allocator() {
    // A line keeps ~100 MiB of 20-character strings, the next makes and drops as many; the
    // fixture measures how much its resident memory grew across the first (the truth: it
    // differs between allocators, glibc's leaves holes between the kept strings).
    let fx = "memory/small_objects.py";
    let (keep, churn) = (
        marked_line(fx, "KEEP_SMALL"),
        marked_line(fx, "CHURN_SMALL"),
    );
    let truth = |out: &str| -> f64 {
        out.lines()
            .find_map(|l| l.strip_prefix("truth kept_mb="))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no truth line in {out:?}"))
    };
    for py in common::representatives() {
        // 2.7 knows no PYTHONMALLOC: it always runs on pymalloc.
        let pymalloc_only = py.major == 2;
        // --keep-pymalloc: the keeping line is charged the arenas its strings filled, which
        // is what they cost: its peak within ±20% of the growth.
        // A free-threaded build has no pymalloc: its mimalloc is wrapped in every mode (its
        // mappings are reservations that say nothing of use), so this mode is checked like
        // the others below.
        if !py.free_threaded {
            let (p, out) = profile_with(&py, fx, &["--keep-pymalloc"]);
            let want = truth(&out);
            let l = line(&p, fx, keep);
            let (peak, python) = (field(l, "mem_peak_mb"), field(l, "mem_python_pct"));
            assert!(
                within(peak, want, 0.20),
                "{}: --keep-pymalloc: peak {peak} MB, grew {want} MB",
                py.label
            );
            assert!(python >= 90.0, "{}: {python}% Python", py.label);
        }
        // Default (pymalloc wrapped on 3.8+, PYTHONMALLOC=malloc before) and `malloc`:
        // every object is counted, so the churn is seen too (each line made ~1.2 M strings
        // of ~70 bytes: ≥ 80 MB); the keeping line's peak is a sampled estimate (the blocks
        // that filled windows and stayed) and its truth includes the allocator's holes,
        // hence only a floor.
        let pymalloc_mode: &[_] = if py.free_threaded {
            &[("pymalloc", &["--keep-pymalloc"][..])]
        } else {
            &[]
        };
        for &(mode, args) in [
            ("default", &[][..]),
            ("malloc", &["--python-allocator", "malloc"][..]),
        ]
        .iter()
        .chain(pymalloc_mode)
        {
            let (p, out) = profile_with(&py, fx, args);
            let want = truth(&out);
            let l = line(&p, fx, keep);
            let (peak, python) = (field(l, "mem_peak_mb"), field(l, "mem_python_pct"));
            assert!(
                peak >= 0.5 * want,
                "{}: {mode}: peak {peak} MB, grew {want} MB",
                py.label
            );
            assert!(python >= 90.0, "{}: {mode}: {python}% Python", py.label);
            if !pymalloc_only {
                let churned = field(line(&p, fx, churn), "mem_alloc_mb");
                assert!(
                    churned >= 80.0,
                    "{}: {mode}: churn line {churned} MB",
                    py.label
                );
            }
        }
    }
}
