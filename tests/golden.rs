//! Golden-file tests of every renderer, plus structural checks of each format.
//!
//! The profiles are built by hand (no live process). Each format's output is compared with
//! `tests/golden/<name>.<ext>`; run with `SCALENE_RS_BLESS=1` to (re)write those files after
//! a deliberate change, and review the diff.

use scalene_rs::profile::{
    FileProfile, FunctionProfile, Leak, LineMemory, LineProfile, MemoryStack, MemorySummary,
    Profile, ProfileMeta, StackProfile, ThreadProfile, TimeMode, PROFILE_SCHEMA_VERSION,
};
use scalene_rs::python::Frame;
use scalene_rs::report::terminal::{self, TerminalOptions};
use scalene_rs::report::{collapsed, flamegraph, profile_json, speedscope};
use std::io::Write as _;
use std::path::PathBuf;

fn frame(function: &str, filename: &str, line: Option<u32>) -> Frame {
    Frame {
        function: function.into(),
        filename: filename.into(),
        line,
    }
}

fn line(line: u32, source: &str, py: f64, native: f64, system: f64) -> LineProfile {
    LineProfile {
        line,
        source: source.into(),
        cpu_python_pct: py,
        cpu_native_pct: native,
        cpu_system_pct: system,
        memory: None,
    }
}

fn function(name: &str, first: Option<u32>, py: f64, native: f64, system: f64) -> FunctionProfile {
    FunctionProfile {
        function: name.into(),
        first_line: first,
        cpu_python_pct: py,
        cpu_native_pct: native,
        cpu_system_pct: system,
    }
}

fn file(name: &str, lines: Vec<LineProfile>, functions: Vec<FunctionProfile>) -> FileProfile {
    FileProfile {
        filename: name.into(),
        cpu_pct: lines.iter().map(LineProfile::total_pct).sum(),
        lines,
        functions,
        context: Vec::new(),
    }
}

fn thread(
    tid: i32,
    name: Option<&str>,
    samples: u64,
    py: f64,
    nat: f64,
    sys: f64,
) -> ThreadProfile {
    ThreadProfile {
        native_id: tid,
        name: name.map(str::to_string),
        samples,
        cpu_python_pct: py,
        cpu_native_pct: nat,
        cpu_system_pct: sys,
    }
}

const MAIN: &str = "/app/main.py";
const MODELE: &str = "/app/données/modèle.py";
const DECODER: &str = "/usr/lib/python3.12/json/decoder.py";
const FROZEN: &str = "<frozen importlib._bootstrap>";

/// CPU mode: two files that matter, one under 1%, a file known only by a function, a line
/// with all three kinds of time, non-ASCII names, a frame with no line, a deep stack.
fn basic() -> Profile {
    let main = file(
        MAIN,
        vec![
            line(3, "import numpy as np", 0.0, 2.0, 0.5),
            line(10, "    for i in range(n):", 5.0, 0.0, 0.0),
            line(11, "        total += compute(i)", 30.0, 10.0, 5.0),
            line(12, "        log(total)", 0.0, 0.0, 0.3),
            line(25, "if __name__ == '__main__':", 0.2, 0.0, 0.0),
            line(26, "    main()", 17.0, 0.0, 0.0),
        ],
        vec![
            function("main", Some(10), 35.0, 10.0, 5.3),
            function("<module>", Some(3), 17.2, 2.0, 0.5),
        ],
    );
    let modele = file(
        MODELE,
        vec![
            line(6, "    return masse * C ** 2  # E = mc²", 20.0, 0.0, 0.0),
            line(
                9,
                "\tvaleurs = [calcul_énergie(m) for m in range(10)]",
                8.0,
                0.0,
                0.0,
            ),
        ],
        vec![
            function("calcul_énergie", Some(6), 20.0, 0.0, 0.0),
            function("<listcomp>", Some(9), 8.0, 0.0, 0.0),
        ],
    );
    let decoder = file(
        DECODER,
        vec![line(
            353,
            "            obj, end = self.scan_once(s, idx)",
            0.0,
            0.6,
            0.0,
        )],
        vec![function("JSONDecoder.raw_decode", Some(353), 0.0, 0.6, 0.0)],
    );
    let frozen = FileProfile {
        filename: FROZEN.into(),
        cpu_pct: 0.0,
        lines: vec![],
        functions: vec![function("_find_and_load", None, 1.4, 0.0, 0.0)],
        context: Vec::new(),
    };
    let module = frame("<module>", MAIN, Some(26));
    let mut deep = vec![frame("fib", MAIN, Some(40))];
    for _ in 0..30 {
        deep.push(frame("fib", MAIN, Some(42)));
    }
    deep.push(frame("main", MAIN, Some(11)));
    deep.push(module.clone());
    let stacks = vec![
        StackProfile {
            frames: vec![frame("main", MAIN, Some(11)), module.clone()],
            samples: 450,
            seconds: 4.5,
        },
        StackProfile {
            frames: vec![
                frame("calcul_énergie", MODELE, Some(6)),
                frame("<listcomp>", MODELE, Some(9)),
                frame("<module>", MODELE, Some(9)),
                frame("main", MAIN, Some(12)),
                module.clone(),
            ],
            samples: 200,
            seconds: 2.0,
        },
        StackProfile {
            frames: deep,
            samples: 170,
            seconds: 1.7,
        },
        StackProfile {
            frames: vec![module.clone()],
            samples: 80,
            seconds: 0.8,
        },
        StackProfile {
            frames: vec![
                frame("<listcomp>", MODELE, Some(9)),
                frame("<module>", MODELE, Some(9)),
                frame("main", MAIN, Some(12)),
                module.clone(),
            ],
            samples: 50,
            seconds: 0.5,
        },
        StackProfile {
            frames: vec![
                frame("_find_and_load", FROZEN, None),
                frame("<module>", MAIN, Some(3)),
            ],
            samples: 14,
            seconds: 0.14,
        },
        StackProfile {
            frames: vec![
                frame("JSONDecoder.raw_decode", DECODER, Some(353)),
                frame("JSONDecoder.decode", DECODER, Some(338)),
                frame("loads", "/usr/lib/python3.12/json/__init__.py", Some(346)),
                frame("<module>", MAIN, Some(3)),
            ],
            samples: 6,
            seconds: 0.06,
        },
        StackProfile {
            frames: vec![frame("<module>", MAIN, Some(3))],
            samples: 30,
            seconds: 0.3,
        },
    ];
    Profile {
        schema_version: PROFILE_SCHEMA_VERSION,
        meta: ProfileMeta {
            program: "python3 app/main.py --size 1000".into(),
            pid: 4242,
            python_version: "3.12.1".into(),
            duration_s: 10.5,
            samples: 1000,
            missed_samples: 0,
            errors: 0,
            paused_reads: 0,
            thinned_samples: 0,
            rate_hz: 99.9,
            requested_rate_hz: 100.0,
            mode: TimeMode::Cpu,
            paused_max_hz: None,
            profile_all: false,
            free_threaded: false,
            split_unavailable: None,
        },
        total_s: 10.0,
        files: vec![main, modele, decoder, frozen],
        stacks,
        threads: vec![
            thread(4242, Some("python3"), 900, 70.0, 12.0, 6.0),
            thread(4250, Some("worker-1 données"), 100, 10.2, 0.6, 0.0),
            thread(4251, None, 3, 0.0, 0.0, 0.2),
        ],
        processes: vec![],
        memory: None,
    }
}

const SERVER: &str = "/srv/app/server.py";
const ODD: &str = "/tmp/odd;name.py";

/// The source of SERVER, for context lines.
fn server_source() -> Vec<String> {
    let mut v: Vec<String> = (1..=60).map(|i| format!("# line {i}")).collect();
    v[19] = "def handle(request):".into();
    v[20] = "    data = request.read()".into();
    v[21] = "    time.sleep(0.5)".into();
    v[22] = "    rows = db.query(\"SELECT * FROM orders WHERE customer_id = %s AND status IN ('open', 'pending', 'held') ORDER BY created_at\", (data.customer,))".into();
    v[23] = "    return render(rows)".into();
    v
}

/// Wall mode: lost samples and errors, a rate below the requested one, a long source line, a
/// sampled line with no source text, a file name with `;`, and `--profile-all`.
fn wall() -> Profile {
    let src = server_source();
    let server = file(
        SERVER,
        vec![
            line(21, &src[20], 2.0, 0.0, 0.0),
            line(22, &src[21], 0.0, 0.0, 55.0),
            line(23, &src[22], 1.0, 14.0, 8.0),
            line(24, "", 0.4, 0.0, 0.0),
        ],
        vec![function("handle", Some(21), 3.4, 14.0, 63.0)],
    );
    let odd = file(
        ODD,
        vec![line(1, "x = [i for i in range(10**6)]", 19.6, 0.0, 0.0)],
        vec![function("<module>", Some(1), 19.6, 0.0, 0.0)],
    );
    let handler = frame("handle", SERVER, Some(22));
    Profile {
        schema_version: PROFILE_SCHEMA_VERSION,
        meta: ProfileMeta {
            program: "python3 -m gunicorn app:server --workers 1".into(),
            pid: 31337,
            python_version: "3.11.9".into(),
            duration_s: 60.25,
            samples: 3689,
            missed_samples: 37,
            errors: 3,
            paused_reads: 41,
            thinned_samples: 0,
            rate_hz: 61.2,
            requested_rate_hz: 100.0,
            mode: TimeMode::Wall,
            paused_max_hz: None,
            profile_all: true,
            free_threaded: false,
            split_unavailable: None,
        },
        total_s: 60.0,
        files: vec![server, odd],
        stacks: vec![
            StackProfile {
                frames: vec![handler.clone(), frame("serve", SERVER, Some(50))],
                samples: 2000,
                seconds: 33.0,
            },
            StackProfile {
                frames: vec![
                    frame("handle", SERVER, Some(23)),
                    frame("serve", SERVER, Some(50)),
                ],
                samples: 1300,
                seconds: 13.8,
            },
            StackProfile {
                frames: vec![frame("<module>", ODD, Some(1))],
                samples: 380,
                seconds: 11.76,
            },
            StackProfile {
                frames: vec![],
                samples: 9,
                seconds: 1.44,
            },
        ],
        threads: vec![thread(
            31337,
            Some("gunicorn: maste"),
            3689,
            23.0,
            14.0,
            63.0,
        )],
        processes: vec![],
        memory: None,
    }
}

/// Nothing recorded.
fn empty() -> Profile {
    Profile {
        schema_version: PROFILE_SCHEMA_VERSION,
        meta: ProfileMeta {
            program: "python3 idle.py".into(),
            pid: 7,
            python_version: "3.8.18".into(),
            duration_s: 0.5,
            samples: 0,
            missed_samples: 0,
            errors: 0,
            paused_reads: 0,
            thinned_samples: 0,
            rate_hz: 0.0,
            requested_rate_hz: 100.0,
            mode: TimeMode::Cpu,
            paused_max_hz: None,
            profile_all: false,
            free_threaded: false,
            split_unavailable: None,
        },
        total_s: 0.0,
        files: vec![],
        stacks: vec![],
        threads: vec![],
        processes: vec![],
        memory: None,
    }
}

/// `basic` recorded with memory: a line that keeps what it allocates (a leak), a line that
/// allocates natively and frees, a line that only copies, and a line that only allocates
/// (no CPU samples).
fn memory() -> Profile {
    let mut p = basic();
    let mem = |alloc: f64, py: f64, peak: f64, avg: f64, timeline: Vec<f64>, copy: f64| {
        Some(LineMemory {
            mem_alloc_mb: alloc,
            mem_python_pct: py,
            mem_peak_mb: peak,
            mem_avg_mb: avg,
            mem_timeline: timeline,
            copy_mb_s: copy,
        })
    };
    for f in &mut p.files {
        for l in &mut f.lines {
            l.memory = Some(LineMemory::default());
        }
    }
    let main = &mut p.files[0];
    main.lines[2].memory = mem(
        200.0,
        99.5,
        200.0,
        100.0,
        (1..=20).map(|i| i as f64 * 10.0).collect(),
        0.0,
    );
    main.lines[3].memory = mem(0.0, 0.0, 0.0, 0.0, vec![], 120.0);
    main.lines[0].memory = mem(
        800.0,
        2.0,
        8.0,
        4.0,
        vec![0.0, 8.0, 4.0, 8.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
        0.0,
    );
    main.lines.push(LineProfile {
        line: 14,
        source: "    cache = [0] * 10**6".into(),
        cpu_python_pct: 0.0,
        cpu_native_pct: 0.0,
        cpu_system_pct: 0.0,
        memory: mem(7.6, 100.0, 7.6, 7.6, vec![7.6; 20], 0.0),
    });
    p.memory = Some(MemorySummary {
        peak_mb: 215.3,
        timeline: (0..=10).map(|i| [i as f64, i as f64 * 21.0]).collect(),
        alloc_mb: 1007.6,
        python_pct: 21.5,
        copy_mb: 1260.0,
        leaks: vec![Leak {
            filename: MAIN.into(),
            line: 11,
            likelihood: 0.995,
            growth_mb_s: 19.4,
            sampled_allocs: 200,
            sampled_frees: 0,
        }],
        window_bytes: 1 << 20,
        copy_window_bytes: 1 << 20,
        dropped_events: 3,
        handshake_timeouts: 1,
        handshakes: 512,
        handshake_wait_ms: 41.5,
        stacks: vec![
            MemoryStack {
                frames: vec![
                    frame("main", MAIN, Some(11)),
                    frame("<module>", MAIN, Some(26)),
                ],
                alloc_kib: 204_800,
            },
            MemoryStack {
                frames: vec![
                    frame(
                        "ones",
                        "/venv/lib/python3.12/site-packages/numpy/core/numeric.py",
                        Some(191),
                    ),
                    frame("<module>", MAIN, Some(3)),
                ],
                alloc_kib: 819_200,
            },
            MemoryStack {
                frames: vec![
                    frame("main", MAIN, Some(14)),
                    frame("<module>", MAIN, Some(26)),
                ],
                alloc_kib: 7_782,
            },
        ],
    });
    p
}

fn profiles() -> Vec<(&'static str, Profile)> {
    vec![
        ("basic", basic()),
        ("wall", wall()),
        ("empty", empty()),
        ("memory", memory()),
    ]
}

fn plain(width: usize, context: usize) -> TerminalOptions {
    TerminalOptions {
        color: false,
        width,
        context,
        threads: true,
    }
}

/// Every rendering compared with a golden file: (file name, text).
fn renderings() -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (name, p) in profiles() {
        out.push((
            format!("{name}.txt"),
            terminal::render_without_source(&p, &plain(100, 2)),
        ));
        out.push((format!("{name}.json"), profile_json::to_json(&p)));
        out.push((format!("{name}.collapsed"), collapsed::render(&p)));
        out.push((
            format!("{name}.speedscope.json"),
            normalize_version(&speedscope::render(&p)),
        ));
        if !p.stacks.is_empty() {
            out.push((format!("{name}.svg"), svg(&p)));
        }
        if let Some(lines) = collapsed::memory_lines(&p) {
            out.push((format!("{name}-alloc.collapsed"), lines.join("\n") + "\n"));
            let svg = flamegraph::render_memory(&p).unwrap();
            out.push((format!("{name}-alloc.svg"), String::from_utf8(svg).unwrap()));
        }
    }
    let b = basic();
    let color = TerminalOptions {
        color: true,
        ..plain(100, 2)
    };
    out.push((
        "basic-color.txt".into(),
        terminal::render_without_source(&b, &color),
    ));
    out.push((
        "basic-narrow.txt".into(),
        terminal::render_without_source(
            &b,
            &TerminalOptions {
                threads: false,
                ..plain(72, 0)
            },
        ),
    ));
    let w = wall();
    out.push((
        "wall-source.txt".into(),
        terminal::render(&w, &plain(100, 3), &mut |f: &str| {
            (f == SERVER).then(server_source)
        }),
    ));
    out
}

/// The exporter string carries the crate version; golden files hold a placeholder.
fn normalize_version(s: &str) -> String {
    s.replace(
        &format!("scalene-rs@{}", env!("CARGO_PKG_VERSION")),
        "scalene-rs@VERSION",
    )
}

fn golden_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

#[test]
fn golden_files() {
    let bless = std::env::var("SCALENE_RS_BLESS").is_ok_and(|v| v == "1");
    let dir = golden_dir();
    let mut failures = Vec::new();
    for (name, text) in renderings() {
        let path = dir.join(&name);
        if bless {
            std::fs::create_dir_all(&dir).unwrap();
            let old = std::fs::read_to_string(&path).ok();
            if old.as_deref() != Some(text.as_str()) {
                std::fs::write(&path, &text).unwrap();
                // Straight to stderr, past the test harness's capture.
                let _ = writeln!(std::io::stderr(), "blessed tests/golden/{name}");
            }
            continue;
        }
        let expected = match std::fs::read_to_string(&path) {
            Ok(e) => e,
            Err(e) => {
                failures.push(format!(
                    "tests/golden/{name}: cannot read ({e}); run with SCALENE_RS_BLESS=1"
                ));
                continue;
            }
        };
        if expected != text {
            let (n, want, got) = expected
                .lines()
                .map(Some)
                .chain(std::iter::repeat(None))
                .zip(text.lines().map(Some).chain(std::iter::repeat(None)))
                .enumerate()
                .find(|(_, (a, b))| a != b)
                .map(|(i, (a, b))| (i + 1, a.unwrap_or("<end>"), b.unwrap_or("<end>")))
                .unwrap_or((0, "<line endings differ>", ""));
            failures.push(format!(
                "tests/golden/{name} differs at line {n}:\n  expected: {want:?}\n  got:      {got:?}"
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{}\n(after a deliberate change: SCALENE_RS_BLESS=1 cargo test --test golden, then review the diff)",
        failures.join("\n")
    );
}

#[test]
fn every_format_is_deterministic() {
    let a = renderings();
    let b = renderings();
    assert_eq!(a, b);
}

#[test]
fn json_round_trips() {
    for (name, p) in profiles() {
        let text = profile_json::to_json(&p);
        assert!(text.ends_with("}\n"), "{name}");
        let back = profile_json::from_json(&text).unwrap();
        assert_eq!(back, p, "{name}");
        assert_eq!(profile_json::to_json(&back), text, "{name}");
    }
}

#[test]
fn json_refuses_other_schema_versions() {
    let text = profile_json::to_json(&basic());
    let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
    for bad in [
        serde_json::json!(PROFILE_SCHEMA_VERSION + 1),
        serde_json::json!(0),
        serde_json::json!("1"),
        serde_json::Value::Null,
    ] {
        v["schema_version"] = bad.clone();
        let err = profile_json::from_json(&v.to_string()).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("schema_version") && msg.contains(&bad.to_string()),
            "{msg}"
        );
    }
    // Schema 1 (before memory) still reads, with no memory.
    v["schema_version"] = serde_json::json!(1);
    let old = profile_json::from_json(&v.to_string()).unwrap();
    assert!(old.memory.is_none());
    assert_eq!(old.files, basic().files);
    v.as_object_mut().unwrap().remove("schema_version");
    let msg = profile_json::from_json(&v.to_string())
        .unwrap_err()
        .to_string();
    assert!(msg.contains("no schema_version"), "{msg}");
    let msg = profile_json::from_json("[1, 2]").unwrap_err().to_string();
    assert!(msg.contains("not a scalene-rs profile"), "{msg}");
    let msg = profile_json::from_json("{").unwrap_err().to_string();
    assert!(msg.contains("invalid JSON"), "{msg}");
    // The right version with a missing field says what is wrong.
    let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v.as_object_mut().unwrap().remove("total_s");
    let msg = profile_json::from_json(&v.to_string())
        .unwrap_err()
        .to_string();
    assert!(msg.contains("total_s"), "{msg}");
}

#[test]
fn terminal_without_color_has_no_escapes() {
    for (name, p) in profiles() {
        for width in [60, 100, 160] {
            let text = terminal::render_without_source(&p, &plain(width, 2));
            assert!(!text.contains('\x1b'), "{name} at {width}");
        }
    }
    let color = TerminalOptions {
        color: true,
        ..plain(100, 2)
    };
    assert!(terminal::render_without_source(&basic(), &color).contains("\x1b[1;31m"));
}

#[test]
fn terminal_fits_the_width() {
    for (name, p) in profiles() {
        for width in [72, 80, 100] {
            let text = terminal::render(&p, &plain(width, 2), &mut |f: &str| {
                (f == SERVER).then(server_source)
            });
            for l in text.lines() {
                assert!(
                    l.chars().count() <= width,
                    "{name} at width {width}: {} chars: {l}",
                    l.chars().count()
                );
            }
        }
    }
}

#[test]
fn terminal_shows_what_matters() {
    let text = terminal::render_without_source(&basic(), &plain(100, 2));
    // Files in order of their share; the one under 1% is summarized, not shown.
    let main = text.find("/app/main.py: 70.0%").unwrap();
    let modele = text.find("/app/données/modèle.py: 28.0%").unwrap();
    assert!(main < modele);
    assert!(!text.contains("json/decoder.py:"));
    assert!(text.contains("1 more file under 1% each (0.6% in all) not shown."));
    // The line with all three kinds of time.
    assert!(text.contains("    11 │         30% │    10% │     5% │         total += compute(i)"));
    // A sliver, and a gap.
    assert!(text.contains("<1%"));
    assert!(text.contains("   ... │"));
    // Threads, including the one without a name.
    assert!(text.contains("worker-1 données"));
    assert!(text.contains("    4251 │        3 │             │        │    <1% │    <1% │ -\n"));
    let wall = terminal::render_without_source(&wall(), &plain(100, 2));
    assert!(wall.contains("37 of 3726 samples missed"));
    assert!(wall.contains("3 thread stacks unreadable"));
    assert!(wall.contains('…'));
    let empty = terminal::render_without_source(&empty(), &plain(100, 2));
    assert!(empty.contains("No time was attributed"));
}

/// A free-threaded build is named in the header; a version with no opcode table has its
/// Python and native time in one column, the native column reading "n/a", never 0%.
#[test]
fn terminal_names_a_free_threaded_build_and_an_unavailable_split() {
    let mut p = basic();
    p.meta.free_threaded = true;
    p.meta.split_unavailable = Some(
        "no table of CALL opcodes for Python 3.16.0a1: time is not split into Python and native"
            .into(),
    );
    let text = terminal::render_without_source(&p, &plain(120, 2));
    assert!(
        text.contains("3.12.1 (free-threaded: no GIL), pid 4242"),
        "{text}"
    );
    assert!(text.contains("Split:"), "{text}");
    assert!(
        text.contains("no table of CALL opcodes for Python 3.16.0a1"),
        "{text}"
    );
    assert!(text.contains("Py + native │ native"), "{text}");
    assert!(
        text.contains("    11 │         30% │    n/a │     5% │"),
        "{text}"
    );
    assert!(!text.contains("Time Python"), "{text}");
    let plain_text = terminal::render_without_source(&basic(), &plain(120, 2));
    assert!(!plain_text.contains("free-threaded") && !plain_text.contains("n/a"));
}

#[test]
fn terminal_with_functions_but_no_lines() {
    // All the time fell on instructions with no line: no line table, but the functions.
    let mut p = empty();
    p.total_s = 1.0;
    p.files = vec![FileProfile {
        filename: FROZEN.into(),
        cpu_pct: 0.0,
        lines: vec![],
        functions: vec![function("_find_and_load", None, 100.0, 0.0, 0.0)],
        context: Vec::new(),
    }];
    let text = terminal::render_without_source(&p, &plain(100, 2));
    assert!(text.contains("No time was attributed to any Python line."));
    assert!(text.contains("       100% │        │        │   100% │ _find_and_load (<frozen"));
}

#[test]
fn terminal_huge_context_is_bounded_by_the_file() {
    let o = TerminalOptions {
        context: usize::MAX,
        ..plain(100, 0)
    };
    let text = terminal::render(&wall(), &o, &mut |f: &str| {
        (f == SERVER).then(server_source)
    });
    // Every line of the 60-line source, and nothing after it.
    assert!(text.contains("    60 │             │        │        │ # line 60\n"));
    assert!(!text.contains("    61 │"));
}

#[test]
fn terminal_context_comes_from_the_source_provider() {
    let mut asked = Vec::new();
    let text = terminal::render(&wall(), &plain(100, 2), &mut |f: &str| {
        asked.push(f.to_string());
        (f == SERVER).then(server_source)
    });
    assert_eq!(asked, vec![SERVER.to_string(), ODD.to_string()]);
    // Line 20 is not sampled: it comes from the provider, two lines above line 22.
    assert!(text.contains("    20 │             │        │        │ def handle(request):"));
    // Line 24 has no source in the profile: the provider fills it in.
    assert!(text.contains("    24 │         <1% │        │        │     return render(rows)"));
}

#[test]
fn collapsed_lines_are_well_formed() {
    for (name, p) in profiles() {
        let text = collapsed::render(&p);
        let mut total = 0;
        for l in text.lines() {
            let (stack, count) = l.rsplit_once(' ').expect(l);
            let n: u64 = count.parse().unwrap_or_else(|_| panic!("{name}: {l}"));
            assert!(n > 0);
            total += n;
            assert!(!stack.is_empty() && !stack.starts_with(' ') && !stack.ends_with(' '));
            for f in stack.split(';') {
                assert!(!f.is_empty(), "{name}: empty frame in {l}");
                assert!(
                    f == collapsed::NO_FRAMES || (f.contains(" (") && f.ends_with(')')),
                    "{name}: {f}"
                );
            }
        }
        assert_eq!(
            total,
            p.stacks.iter().map(|s| s.samples).sum::<u64>(),
            "{name}"
        );
        let mut sorted: Vec<&str> = text.lines().collect();
        sorted.sort_unstable();
        assert_eq!(sorted, text.lines().collect::<Vec<_>>(), "{name}");
    }
    // Root first, and `;` in a file name does not split the frame.
    let text = collapsed::render(&wall());
    assert!(text.contains("serve (/srv/app/server.py:50);handle (/srv/app/server.py:22) 2000\n"));
    assert!(text.contains("<module> (/tmp/odd,name.py:1) 380\n"));
    assert!(text.contains("[no Python frames] 9\n"));
    assert!(collapsed::render(&basic())
        .contains(";_find_and_load (<frozen importlib._bootstrap>) 14\n"));
}

fn svg(p: &Profile) -> String {
    String::from_utf8(flamegraph::render(p).unwrap()).unwrap()
}

fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[test]
fn flamegraph_is_svg_with_every_function() {
    for (name, p) in profiles() {
        if p.stacks.is_empty() {
            let err = flamegraph::render(&p).unwrap_err();
            assert_eq!(err.kind(), std::io::ErrorKind::InvalidData);
            continue;
        }
        let text = svg(&p);
        assert!(text.starts_with("<?xml"), "{name}");
        assert!(text.trim_end().ends_with("</svg>"), "{name}");
        for s in &p.stacks {
            for f in &s.frames {
                assert!(
                    text.contains(&xml_escape(&f.function)),
                    "{name}: {} missing",
                    f.function
                );
            }
        }
        assert!(text.contains(&xml_escape(&p.meta.program)), "{name}: title");
        assert_eq!(text, svg(&p), "{name}: not deterministic");
    }
}

#[test]
fn speedscope_has_the_required_fields() {
    for (name, p) in profiles() {
        let v: serde_json::Value = serde_json::from_str(&speedscope::render(&p)).unwrap();
        assert_eq!(v["$schema"], speedscope::SCHEMA_URL, "{name}");
        assert!(v["name"].is_string());
        assert!(v["exporter"].as_str().unwrap().starts_with("scalene-rs@"));
        let frames = v["shared"]["frames"].as_array().expect("shared.frames");
        for f in frames {
            assert!(f["name"].is_string(), "{name}: {f}");
            assert!(f["file"].is_string(), "{name}: {f}");
            assert!(f.get("line").is_none_or(|l| l.is_u64()), "{name}: {f}");
        }
        let profiles = v["profiles"].as_array().expect("profiles");
        let active = v["activeProfileIndex"].as_u64().unwrap() as usize;
        assert!(active < profiles.len());
        for prof in profiles {
            assert_eq!(prof["type"], "sampled");
            assert!(prof["name"].is_string());
            let unit = prof["unit"].as_str().unwrap();
            assert!([
                "none",
                "nanoseconds",
                "microseconds",
                "milliseconds",
                "seconds",
                "bytes"
            ]
            .contains(&unit));
            let start = prof["startValue"].as_f64().unwrap();
            let end = prof["endValue"].as_f64().unwrap();
            assert!(end >= start);
            let samples = prof["samples"].as_array().unwrap();
            let weights = prof["weights"].as_array().unwrap();
            assert_eq!(samples.len(), weights.len(), "{name}");
            let mut sum = 0.0;
            for w in weights {
                let w = w.as_f64().unwrap();
                assert!(w >= 0.0);
                sum += w;
            }
            assert!((sum - (end - start)).abs() < 1e-9, "{name}");
            for s in samples {
                for i in s.as_array().unwrap() {
                    let i = i.as_u64().expect("frame index") as usize;
                    assert!(i < frames.len(), "{name}: index {i} out of range");
                }
            }
        }
        assert_eq!(
            profiles[0]["samples"].as_array().unwrap().len(),
            p.stacks.len()
        );
    }
    // Root first: the first stack of `basic` is <module> → main.
    let v: serde_json::Value = serde_json::from_str(&speedscope::render(&basic())).unwrap();
    let frames = v["shared"]["frames"].as_array().unwrap();
    let first: Vec<&str> = v["profiles"][0]["samples"][0]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            frames[i.as_u64().unwrap() as usize]["name"]
                .as_str()
                .unwrap()
        })
        .collect();
    assert_eq!(first, ["<module>", "main"]);
    // A frame with no line has no `line` field.
    assert!(frames
        .iter()
        .any(|f| f["name"] == "_find_and_load" && f.get("line").is_none()));
}
