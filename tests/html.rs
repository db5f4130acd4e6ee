//! The HTML report (`-o X.html`, `--format html`; docs/html.md), checked in a real browser:
//! Debian's Chromium driven headless by playwright-core (tests/html/check.js), both installed
//! by tools/browser.sh. Without them the browser tests skip with the reason, and fail in CI.
//!
//! Screenshots go to `$CARGO_TARGET_TMPDIR/html/` (target/tmp/html/); the tests print where.

mod common;

use scalene_rs::profile::{
    Frame, Leak, LineMemory, LineProfile, MemoryStack, MemorySummary, ProcessProfile, Profile,
    ProfileMeta, StackProfile, ThreadProfile,
};
use scalene_rs::report::{self, Format, RenderOptions};
use serde_json::Value;
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The text in fixtures/html_report.py that must show as text.
const MARKUP: &str = "</script><b>bold?</b><img src=x onerror=alert(1)>";

use common::bin;

fn out_dir() -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join("html");
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Chromium, node and playwright-core's directory, or why not.
fn browser() -> Result<(PathBuf, PathBuf), String> {
    let chromium = std::env::var_os("SCALENE_RS_CHROMIUM")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/chromium"));
    if !chromium.is_file() {
        return Err(format!(
            "no Chromium at {} (tools/browser.sh installs it)",
            chromium.display()
        ));
    }
    match Command::new("node").arg("--version").output() {
        Ok(o) if o.status.success() => {}
        _ => return Err("no node on PATH (tools/browser.sh installs it)".into()),
    }
    let modules = common::cache_dir().join("browser/node_modules");
    if !modules.join("playwright-core/package.json").is_file() {
        return Err(format!(
            "playwright-core is not installed in {} (tools/browser.sh installs it)",
            modules.display()
        ));
    }
    Ok((chromium, modules))
}

/// Runs tests/html/check.js with `spec` (it adds `chromium`); its "OK ..." line.
fn check_in_browser(test: &str, mut spec: Value) -> Option<String> {
    let (chromium, modules) = match browser() {
        Ok(b) => b,
        Err(why) => {
            common::skip_or_fail(test, &why);
            return None;
        }
    };
    spec["chromium"] = Value::String(chromium.display().to_string());
    let spec_path = out_dir().join(format!("{test}.spec.json"));
    std::fs::write(&spec_path, spec.to_string()).unwrap();
    let mut cmd = Command::new("node");
    cmd.arg(common::repo_root().join("tests/html/check.js"))
        .arg(&spec_path)
        .env("NODE_PATH", &modules);
    let run = common::run_limited(cmd, std::time::Duration::from_secs(180));
    assert!(
        run.code == Some(0) && run.stdout.contains("OK "),
        "{test}: the browser check failed ({}):\n{}\n{}",
        run.describe(),
        run.stdout,
        run.stderr
    );
    Some(run.stdout.trim().to_string())
}

/// A share as the page writes it (the JSON's value to 2 decimals, then as the terminal
/// rounds: blank, `<1%`, whole percent).
fn pct_text(v: f64) -> String {
    let v = (v * 100.0).round() / 100.0;
    if v < 0.005 {
        String::new()
    } else if v < 1.0 {
        "<1%".into()
    } else {
        format!("{}%", v.round())
    }
}

/// `scalene-rs view JSON -o OUT` (the format from OUT's extension), which must succeed.
fn view_as(json: &Path, out: &Path) {
    let r = Command::new(bin())
        .arg("view")
        .arg(json)
        .arg("-o")
        .arg(out)
        .output()
        .unwrap();
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
}

/// An interpreter to record the fixture with: the newest plain CPython 3 of the matrix.
fn python() -> common::Interpreter {
    common::interpreters()
        .into_iter()
        .rfind(|i| i.major == 3 && !i.free_threaded && i.root.is_none())
        .expect("no CPython 3 interpreter in the matrix")
}

#[test]
fn fixture_report_in_a_browser() {
    let py = python();
    let dir = out_dir();
    let json = dir.join("fixture.json");
    let html = dir.join("fixture.html");
    let r = Command::new(bin())
        .args(["run", "-o"])
        .arg(&json)
        .arg("--")
        .arg(&py.path)
        .arg(common::fixture("html_report.py"))
        .output()
        .unwrap();
    assert!(
        r.status.success(),
        "{}: run failed: {}",
        py.label,
        String::from_utf8_lossy(&r.stderr)
    );
    // `view -o X.html` and `--format html` give the same page.
    view_as(&json, &html);
    let other = dir.join("fixture.out");
    let r = Command::new(bin())
        .arg("view")
        .arg(&json)
        .args(["--format", "html", "-o"])
        .arg(&other)
        .output()
        .unwrap();
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let page = std::fs::read_to_string(&html).unwrap();
    assert_eq!(page, std::fs::read_to_string(&other).unwrap());
    assert!(page.starts_with("<!DOCTYPE html>"), "{}", &page[..100]);
    // Our own two script elements end; nothing from the profile does.
    assert_eq!(page.matches("</script>").count(), 2, "a </script> leaked");

    let p: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let fixture = p["files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["filename"].as_str().unwrap().ends_with("html_report.py"))
        .expect("the fixture's file is in the profile");
    assert_eq!(
        p["files"][0]["filename"], fixture["filename"],
        "the fixture is not the busiest file"
    );
    let hottest = fixture["lines"]
        .as_array()
        .unwrap()
        .iter()
        .max_by(|a, b| {
            let t = |l: &Value| {
                ["cpu_python_pct", "cpu_native_pct", "cpu_system_pct"]
                    .iter()
                    .map(|k| l[k].as_f64().unwrap())
                    .sum::<f64>()
            };
            t(a).total_cmp(&t(b))
        })
        .unwrap();
    let cells: Vec<String> = ["cpu_python_pct", "cpu_native_pct", "cpu_system_pct"]
        .iter()
        .map(|k| pct_text(hottest[k].as_f64().unwrap()))
        .collect();
    let shot = dir.join("fixture.png");
    let spec = serde_json::json!({
        "html": html,
        "screenshot": shot,
        "markup": MARKUP,
        "hottest": {
            "file": fixture["filename"], "line": hottest["line"], "cells": cells,
            "source": hottest["source"],
        },
    });
    if let Some(ok) = check_in_browser("fixture_report_in_a_browser", spec) {
        eprintln!(
            "fixture report: {} bytes, {ok}; screenshot {}",
            page.len(),
            shot.display()
        );
    }
}

use common::Rng;

/// A profile of 10,000 profiled lines (20 files of 500, each with its whole text and memory
/// columns) and 100,000 distinct stacks (plus 10,000 allocating stacks), shaped like a
/// big program's: a few hot paths, a long tail.
pub fn synthetic_profile() -> Profile {
    const FILES: usize = 20;
    const LINES: u32 = 500;
    const STACKS: usize = 100_000;
    let mut rng = Rng(0x9e3779b97f4a7c15);
    let names: Vec<String> = (0..FILES)
        .map(|i| format!("/srv/app/pkg_{i}/module_{i}.py"))
        .collect();
    let mut files = Vec::new();
    let total_lines = (FILES as u32 * LINES) as f64;
    for (fi, name) in names.iter().enumerate() {
        let mut f = scalene_rs::profile::FileProfile::new(name);
        let text: Vec<String> = (1..=LINES)
            .map(|n| {
                if n % 20 == 1 {
                    format!("def function_{fi}_{}(data, count=10):", n / 20)
                } else {
                    format!(
                        "    value_{n} = compute(data[{n}], count) + {}",
                        rng.below(1000)
                    )
                }
            })
            .collect();
        for n in 1..=LINES {
            // Shares vary, so that sorting a column reorders the rows.
            let w = 100.0 / total_lines * (0.2 + rng.below(160) as f64 / 100.0);
            f.lines.push(LineProfile {
                line: n,
                source: String::new(),
                cpu_python_pct: w * 0.6,
                cpu_native_pct: w * 0.3,
                cpu_system_pct: w * 0.1,
                memory: Some(LineMemory {
                    mem_alloc_mb: rng.below(100) as f64 / 10.0,
                    mem_python_pct: rng.below(100) as f64,
                    mem_peak_mb: rng.below(500) as f64 / 10.0,
                    mem_avg_mb: 1.0,
                    mem_timeline: (0..10).map(|_| rng.below(50) as f64 / 10.0).collect(),
                    copy_mb_s: rng.below(20) as f64 / 10.0,
                    mem_native_functions: Vec::new(),
                }),
                gpu: None,
                native_functions: Vec::new(),
            });
        }
        f.take_source(&text);
        f.cpu_pct = 100.0 / FILES as f64;
        files.push(f);
    }
    let frame = |fi: usize, n: u32| Frame {
        function: format!("function_{fi}_{}", n / 20).into(),
        filename: names[fi].as_str().into(),
        line: Some(n),
        native: false,
    };
    let mut seen = HashSet::new();
    let mut stacks = Vec::new();
    while stacks.len() < STACKS {
        let depth = 3 + rng.below(10) as usize;
        // Outermost first: a few entry points, then ever more varied calls.
        let mut frames: Vec<Frame> = (0..depth)
            .map(|d| {
                let spread = 1 + (d as u64 * d as u64 * 3).min(FILES as u64 * 25);
                let k = rng.below(spread) as usize;
                frame(k % FILES, 1 + ((k * 37 + d * 11) as u32 % LINES))
            })
            .collect();
        frames.reverse();
        if seen.insert(frames.clone()) {
            let samples = 1 + 1000 / (1 + rng.below(2000));
            stacks.push(StackProfile {
                frames,
                samples,
                seconds: samples as f64 / 100.0,
                split: None,
                native_id: None,
            });
        }
    }
    let mem_stacks = stacks
        .iter()
        .step_by(10)
        .map(|s| MemoryStack {
            frames: s.frames.clone(),
            alloc_kib: 1 + rng.below(4096),
        })
        .collect();
    let total_s = stacks.iter().map(|s| s.seconds).sum();
    Profile {
        schema_version: scalene_rs::profile::PROFILE_SCHEMA_VERSION,
        meta: ProfileMeta {
            program: "python synthetic.py".into(),
            pid: 4242,
            python_version: "3.12.1".into(),
            duration_s: 60.0,
            samples: 6000,
            rate_hz: 100.0,
            requested_rate_hz: 100.0,
            ..ProfileMeta::default()
        },
        total_s,
        files,
        stacks,
        threads: vec![ThreadProfile {
            native_id: 4242,
            name: Some("MainThread".into()),
            python_name: None,
            interpreters: Vec::new(),
            samples: 6000,
            cpu_python_pct: 60.0,
            cpu_native_pct: 30.0,
            cpu_system_pct: 10.0,
        }],
        processes: (0..3)
            .map(|i| ProcessProfile {
                pid: 4242 + i,
                command: format!("python worker.py --id {i}"),
                python_version: "3.12.1".into(),
                samples: 2000,
                cpu_pct: 100.0 / 3.0,
                mem_peak_mb: Some(100.0),
                mem_alloc_mb: Some(1000.0),
                gpu_pct: None,
                gpu_mem_peak_mb: None,
            })
            .collect(),
        memory: Some(MemorySummary {
            peak_mb: 500.0,
            timeline: (0..200)
                .map(|i| [i as f64 * 0.3, 100.0 + (i % 50) as f64 * 8.0])
                .collect(),
            alloc_mb: 10_000.0,
            python_pct: 60.0,
            stacks: mem_stacks,
            since_attach: false,
            window_bytes: 1 << 20,
            // In a file that starts closed: the link must open it and build its table.
            leaks: vec![Leak {
                filename: names[FILES - 1].clone(),
                line: 250,
                likelihood: 0.97,
                growth_mb_s: 1.5,
                sampled_allocs: 40,
                sampled_frees: 0,
            }],
            ..MemorySummary::default()
        }),
        gpu: None,
    }
}

/// Where the page's size goes: the bound is what docs/html.md states.
const SYNTHETIC_MAX_BYTES: usize = 16 << 20;

#[test]
fn synthetic_profile_size_and_load() {
    let p = synthetic_profile();
    assert_eq!(p.files.iter().map(|f| f.lines.len()).sum::<usize>(), 10_000);
    assert_eq!(p.stacks.len(), 100_000);
    let t = std::time::Instant::now();
    let page = report::render(
        &p,
        Format::Html,
        &RenderOptions {
            color: false,
            width: 100,
            threads: false,
            memory: false,
        },
    )
    .unwrap();
    let render_s = t.elapsed().as_secs_f64();
    let json = report::render(
        &p,
        Format::Json,
        &RenderOptions {
            color: false,
            width: 100,
            threads: false,
            memory: false,
        },
    )
    .unwrap();
    eprintln!(
        "synthetic profile (10,000 lines, 100,000 stacks): HTML {} bytes ({:.1} MiB), rendered in {render_s:.2} s; its profile JSON is {} bytes",
        page.len(),
        page.len() as f64 / (1 << 20) as f64,
        json.len()
    );
    assert!(
        page.len() < SYNTHETIC_MAX_BYTES,
        "the page is {} bytes, over {SYNTHETIC_MAX_BYTES}",
        page.len()
    );
    let html = out_dir().join("synthetic.html");
    std::fs::write(&html, &page).unwrap();
    let shot = out_dir().join("synthetic.png");
    let spec = serde_json::json!({
        "html": html, "screenshot": shot, "screenshot_at": "#flame-time",
        "leak": {"file": p.memory.as_ref().unwrap().leaks[0].filename, "line": 250},
        "processes": 3,
    });
    if let Some(ok) = check_in_browser("synthetic_profile_size_and_load", spec) {
        eprintln!(
            "synthetic report in the browser: {ok}; screenshot {}",
            shot.display()
        );
    }
}

#[test]
fn markup_in_names_and_source_stays_inside_the_data() {
    let mut p = synthetic_profile();
    p.stacks.truncate(10);
    p.files.truncate(1);
    p.files[0].filename = "/tmp/</script><b>x.py".into();
    p.files[0].lines[0].source = MARKUP.into();
    p.meta.program = "python </title><script>alert(1)</script>".into();
    let page = String::from_utf8(html(&p)).unwrap();
    assert_eq!(page.matches("</script>").count(), 2, "a </script> leaked");
    assert!(!page.contains("<b>") && !page.contains("</title><script>"));
    assert!(
        page.contains("&lt;/title&gt;&lt;script&gt;"),
        "title not escaped"
    );
}

fn html(p: &Profile) -> Vec<u8> {
    report::render(
        p,
        Format::Html,
        &RenderOptions {
            color: false,
            width: 100,
            threads: false,
            memory: false,
        },
    )
    .unwrap()
}

/// The golden profiles (tests/golden: CPU, wall, memory, empty) each give a page that loads
/// with no error, every file open and the flame graphs drawn.
#[test]
fn golden_profiles_load_in_a_browser() {
    let mut pages = Vec::new();
    for case in ["basic", "empty", "memory", "wall"] {
        let path = common::repo_root().join(format!("tests/golden/{case}/profile.json"));
        let p =
            scalene_rs::report::profile_json::from_json(&std::fs::read_to_string(&path).unwrap())
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let out = out_dir().join(format!("golden-{case}.html"));
        std::fs::write(&out, html(&p)).unwrap();
        pages.push(out);
    }
    if let Some(ok) = check_in_browser(
        "golden_profiles_load_in_a_browser",
        serde_json::json!({"smoke": pages}),
    ) {
        eprintln!("golden profiles in the browser: {ok}");
    }
}

/// MB as the page writes it (the JSON's value to 2 decimals; one decimal under 10).
fn mb_text(v: f64) -> String {
    let v = (v * 100.0).round() / 100.0;
    if v < 0.05 {
        String::new()
    } else if v < 10.0 {
        format!("{v:.1}M")
    } else {
        format!("{}M", v.round())
    }
}

#[test]
fn gpu_columns_charts_and_flame_graph_in_a_browser() {
    let py = python();
    let dir = out_dir();
    let json = dir.join("gpu.json");
    let html = dir.join("gpu.html");
    let script = dir.join("gpu.script");
    let _ = std::fs::remove_file(&script);
    let fx = common::fixture("gpu/phases.py");
    let r = Command::new(bin())
        .args(["run", "--cpu-only", "-o"])
        .arg(&json)
        .arg("--")
        .arg(&py.path)
        .arg(&fx)
        .env("SCALENE_RS_NVML_LIB", common::fake_nvml(None))
        .env("SCALENE_RS_FAKE_NVML_SCRIPT", &script)
        .env("SCALENE_RS_FAKE_NVML_PERIOD_MS", "50")
        .env("GPU_ROUNDS", "1")
        .output()
        .unwrap();
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    view_as(&json, &html);
    let p: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let n = common::mark(&fx, "GPU80");
    let f = p["files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["filename"].as_str().unwrap().ends_with("phases.py"))
        .expect("the fixture's file");
    let l = f["lines"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["line"].as_u64() == Some(n))
        .expect("the GPU80 line");
    let cells = [
        pct_text(l["gpu_pct"].as_f64().unwrap()),
        mb_text(l["gpu_mem_peak_mb"].as_f64().unwrap()),
    ];
    assert!(cells[0].ends_with('%'), "{cells:?}");
    let spec = serde_json::json!({
        "html": html,
        "screenshot": dir.join("gpu.png"),
        "gpu": {"file": f["filename"], "line": n, "cells": cells},
    });
    if let Some(ok) = check_in_browser("gpu_columns_charts_and_flame_graph_in_a_browser", spec) {
        eprintln!("GPU report: {ok}");
    }
}

/// `--native`: the row under a line that had native time names its native functions (the
/// three above a tenth of a percent, most first, "…" for more), and only such lines have one;
/// the line's own source cell is unchanged.
#[test]
fn native_functions_row_in_a_browser() {
    use scalene_rs::profile::NativeFunction;
    let mut p = synthetic_profile();
    let file = p.files[0].filename.clone();
    let l = &mut p.files[0].lines[0];
    let (line, source) = (l.line, l.source.clone());
    l.native_functions = [
        ("deflate_slow", 28.0),
        ("longest_match", 11.0),
        ("adler32_z", 0.4),
        ("crc32_z", 0.05),
    ]
    .iter()
    .map(|(f, pct)| NativeFunction {
        function: f.to_string(),
        module: "libz.so.1".into(),
        pct: *pct,
    })
    .collect();
    let dir = out_dir();
    let out = dir.join("native.html");
    std::fs::write(&out, html(&p)).unwrap();
    let spec = serde_json::json!({
        "html": out,
        "screenshot": dir.join("native.png"),
        "native": {
            "file": file,
            "line": line,
            "text": "↳ native: deflate_slow 28%, longest_match 11%, adler32_z <1%, …",
            "rows": 1,
            "source": source,
        },
    });
    if let Some(ok) = check_in_browser("native_functions_row_in_a_browser", spec) {
        eprintln!("native row: {ok}");
    }
}
