//! Golden-file tests of every renderer, plus structural checks of each format.
//!
//! Each case is a folder, `tests/golden/<case>/`, and a test of its own, `case::<case>`
//! (the cases are listed in `golden!` below). Its input is `profile.json`: a profile
//! as `--json` writes it and `scalene-rs view` reads it. Every rendering of that profile
//! ([`renderings`]) is compared with the file of the same name beside it; `profile.json`
//! is itself the expected output of the JSON writer (read, then written again, it must come
//! back byte for byte). A folder holds nothing else but `sources/`: the text of the source
//! files the profile names, `/<path>` at `sources/<path>`, for context lines.
//!
//! Nothing depends on the machine: the profiles hold fixed paths, pids and times, source
//! text comes from the case's `sources/` (never from the file system's `/`), and the one
//! value that changes between builds, the crate version in speedscope's `exporter`, is
//! written as `scalene-rs@VERSION`.
//!
//! After a deliberate change, `BLESS=1 cargo test --test golden` (or `SCALENE_RS_BLESS=1`)
//! writes the renderings into the folders instead of comparing them (`profile.json` too, in
//! the writer's current form); review the diff. A new case: a folder with a `profile.json`,
//! a line in `golden!`, then bless.

use scalene_rs::profile::{FileProfile, FunctionProfile, Profile, PROFILE_SCHEMA_VERSION};
use scalene_rs::report::terminal::{self, TerminalOptions};
use scalene_rs::report::{collapsed, flamegraph, profile_json, speedscope};
use std::io::Write as _;
use std::path::PathBuf;

/// File names in the profiles, for the assertions below.
const SERVER: &str = "/srv/app/server.py";
const ODD: &str = "/tmp/odd;name.py";
const FROZEN: &str = "<frozen importlib._bootstrap>";

/// What a case renders beyond what every case does.
#[derive(Debug, Clone, Copy)]
enum Extra {
    /// `terminal-color.txt`: the terminal report with ANSI colors.
    Color,
    /// `terminal-narrow.txt`: 72 columns, no context lines, no thread table.
    Narrow,
    /// `terminal-source.txt`: three lines of context around each line, from `sources/`.
    Source,
}

/// Declares the cases: `name: Extra, ...;` (a case with no extras is just `name;`). Gives
/// [`CASES`] and one test per case, `case::<name>`.
macro_rules! golden {
    ($($case:ident $(: $($extra:ident),+)?;)+) => {
        /// Every case: its name (its folder) and what it renders beyond what all do.
        const CASES: &[(&str, &[Extra])] = &[$((stringify!($case), &[$($(Extra::$extra),+)?])),+];

        /// One test per case, named after it.
        mod case {
            $(
                #[test]
                fn $case() {
                    super::check_case(stringify!($case), &[$($(super::Extra::$extra),+)?]);
                }
            )+
        }
    };
}

golden! {
    // CPU mode: two files that matter, one under 1%, a file known only by a function, a
    // line with all three kinds of time, non-ASCII names, a frame with no line, a deep
    // stack.
    basic: Color, Narrow;
    // Wall mode: lost samples and errors, a rate below the requested one, a long source
    // line, a sampled line with no source text, a file name with `;`, `--profile-all`.
    wall: Source;
    // Nothing recorded.
    empty;
    // `basic` recorded with memory: a line that keeps what it allocates (a leak), a line
    // that allocates natively and frees, a line that only copies, and a line that only
    // allocates (no CPU samples).
    memory;
}

fn golden_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

fn case_dir(case: &str) -> PathBuf {
    golden_dir().join(case)
}

/// The input profile of a case.
fn load(case: &str) -> Profile {
    let path = case_dir(case).join("profile.json");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    profile_json::from_json(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every case's input profile.
fn profiles() -> Vec<(&'static str, Profile)> {
    CASES.iter().map(|&(name, _)| (name, load(name))).collect()
}

/// A case's source provider: the lines of `sources/<path>` for the file `/<path>`, None
/// when the case has no such file.
fn source_of(case: &str) -> impl FnMut(&str) -> Option<Vec<String>> {
    let root = case_dir(case).join("sources");
    move |path: &str| {
        let text = std::fs::read_to_string(root.join(path.strip_prefix('/')?)).ok()?;
        Some(text.lines().map(str::to_string).collect())
    }
}

fn plain(width: usize, context: usize) -> TerminalOptions {
    TerminalOptions {
        color: false,
        width,
        context,
        threads: true,
    }
}

/// Every rendering of a case's profile `p`, each compared with the file of its folder:
/// (file name, text).
fn renderings(case: &str, p: &Profile, extras: &[Extra]) -> Vec<(&'static str, String)> {
    let mut out = vec![
        (
            "terminal.txt",
            terminal::render_without_source(p, &plain(100, 2)),
        ),
        ("profile.json", profile_json::to_json(p)),
        ("stacks.collapsed", collapsed::render(p)),
        ("speedscope.json", normalize_version(&speedscope::render(p))),
    ];
    if !p.stacks.is_empty() {
        out.push(("flamegraph.svg", svg(p)));
    }
    if let Some(lines) = collapsed::memory_lines(p) {
        out.push(("alloc.collapsed", lines.join("\n") + "\n"));
        let svg = flamegraph::render_memory(p).unwrap();
        out.push(("alloc.svg", String::from_utf8(svg).unwrap()));
    }
    for extra in extras {
        out.push(match extra {
            Extra::Color => (
                "terminal-color.txt",
                terminal::render_without_source(
                    p,
                    &TerminalOptions {
                        color: true,
                        ..plain(100, 2)
                    },
                ),
            ),
            Extra::Narrow => (
                "terminal-narrow.txt",
                terminal::render_without_source(
                    p,
                    &TerminalOptions {
                        threads: false,
                        ..plain(72, 0)
                    },
                ),
            ),
            Extra::Source => (
                "terminal-source.txt",
                terminal::render(p, &plain(100, 3), &mut source_of(case)),
            ),
        });
    }
    out
}

/// The exporter string carries the crate version; golden files hold a placeholder.
fn normalize_version(s: &str) -> String {
    s.replace(
        &format!("scalene-rs@{}", env!("CARGO_PKG_VERSION")),
        "scalene-rs@VERSION",
    )
}

/// Whether this run writes the expected files instead of comparing with them.
fn blessing() -> bool {
    ["BLESS", "SCALENE_RS_BLESS"]
        .iter()
        .any(|v| std::env::var(v).is_ok_and(|v| v == "1"))
}

/// Compares every rendering of `case` with its file (or, blessing, writes the files), and
/// checks that the folder holds no file that no rendering writes.
fn check_case(case: &str, extras: &[Extra]) {
    let dir = case_dir(case);
    let p = load(case);
    let bless = blessing();
    let outputs = renderings(case, &p, extras);
    let mut failures = Vec::new();
    for (file, text) in &outputs {
        let path = dir.join(file);
        let shown = format!("tests/golden/{case}/{file}");
        let expected = std::fs::read_to_string(&path);
        if bless {
            if expected.ok().as_deref() != Some(text.as_str()) {
                std::fs::write(&path, text).unwrap();
                // Straight to stderr, past the test harness's capture.
                let _ = writeln!(std::io::stderr(), "blessed {shown}");
            }
            continue;
        }
        match expected {
            Err(e) => failures.push(format!("{shown}: cannot read ({e})")),
            Ok(expected) if expected != *text => failures.push(format!(
                "{shown} differs from the rendering:\n{}",
                first_difference(&expected, text)
            )),
            Ok(_) => {}
        }
    }
    for entry in std::fs::read_dir(&dir).unwrap() {
        let name = entry.unwrap().file_name();
        let name = name.to_string_lossy();
        if name != "sources" && !outputs.iter().any(|(file, _)| *file == name) {
            failures.push(format!(
                "tests/golden/{case}/{name}: no rendering of the case writes it (delete it?)"
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{}\n(after a deliberate change: BLESS=1 cargo test --test golden, then review the diff)",
        failures.join("\n")
    );
}

/// Where `got` first departs from `expected`: a few lines of each from there, numbered,
/// with control characters (color escapes) written out as escapes.
fn first_difference(expected: &str, got: &str) -> String {
    const SHOWN: usize = 4;
    let want: Vec<&str> = expected.lines().collect();
    let have: Vec<&str> = got.lines().collect();
    let Some(i) = (0..want.len().max(have.len())).find(|&i| want.get(i) != have.get(i)) else {
        return format!(
            "  the same lines, but the line endings or the final newline differ \
             ({} bytes expected, {} got)",
            expected.len(),
            got.len()
        );
    };
    // In a long line (an SVG's), show it from a little before its first differing character.
    let column = match (want.get(i), have.get(i)) {
        (Some(a), Some(b)) => a.chars().zip(b.chars()).take_while(|(x, y)| x == y).count(),
        _ => 0,
    };
    // Long lines (an SVG's) are cut to 160 characters; the first differing one is shown
    // from a little before where it differs.
    let show = |n: usize, l: &str| -> String {
        let from = if n == i { column.saturating_sub(40) } else { 0 };
        let mut text = String::new();
        if from > 0 {
            text.push('…');
        }
        for c in l.chars().skip(from).take(160) {
            if c.is_control() {
                text.extend(c.escape_default());
            } else {
                text.push(c);
            }
        }
        if l.chars().count() > from + 160 {
            text.push('…');
        }
        text
    };
    let mut out = format!(
        "  first difference at line {} (- expected, {} lines; + got, {} lines):\n",
        i + 1,
        want.len(),
        have.len()
    );
    if i > 0 {
        out += &format!("    {:>5} | {}\n", i, show(i - 1, want[i - 1]));
    }
    for (mark, side) in [('-', &want), ('+', &have)] {
        for (n, l) in side.iter().enumerate().skip(i).take(SHOWN) {
            out += &format!("  {mark} {:>5} | {}\n", n + 1, show(n, l));
        }
        if side.len() <= i {
            out += &format!("  {mark}       | <end of file>\n");
        }
    }
    out
}

/// Every folder under tests/golden is a case with a test, and every case has a folder.
/// `top/` is not a case of these renderers: tests/top_screens.rs checks the live view's
/// screens there.
#[test]
fn every_case_folder_is_tested() {
    let mut folders: Vec<String> = std::fs::read_dir(golden_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name != "top")
        .collect();
    folders.sort();
    let mut cases: Vec<String> = CASES.iter().map(|(c, _)| c.to_string()).collect();
    cases.sort();
    assert_eq!(folders, cases);
}

#[test]
fn every_format_is_deterministic() {
    for &(case, extras) in CASES {
        let p = load(case);
        assert_eq!(
            renderings(case, &p, extras),
            renderings(case, &p, extras),
            "{case}"
        );
    }
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
    let text = profile_json::to_json(&load("basic"));
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
    assert_eq!(old.files, load("basic").files);
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
    assert!(terminal::render_without_source(&load("basic"), &color).contains("\x1b[1;31m"));
}

#[test]
fn terminal_fits_the_width() {
    for (name, p) in profiles() {
        for width in [72, 80, 100] {
            let text = terminal::render(&p, &plain(width, 2), &mut source_of(name));
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
    let text = terminal::render_without_source(&load("basic"), &plain(100, 2));
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
    // Threads: the name the program gave one beside the OS's, the one without a name,
    // and (one of them ran in a subinterpreter) the interpreters each ran in.
    assert!(text.contains("│ pool-ü1 (worker-1 données) · interp 0\n"));
    assert!(text.contains(
        "    4251 │        3 │             │        │    <1% │    <1% │ - · interp 0,1\n"
    ));
    let wall = terminal::render_without_source(&load("wall"), &plain(100, 2));
    assert!(wall.contains("37 of 3726 samples missed"));
    assert!(wall.contains("3 thread stacks unreadable"));
    assert!(wall.contains('…'));
    let empty = terminal::render_without_source(&load("empty"), &plain(100, 2));
    assert!(empty.contains("No time was attributed"));
}

/// A free-threaded build is named in the header; a version with no opcode table has its
/// Python and native time in one column, the native column reading "n/a", never 0%.
#[test]
fn terminal_names_a_free_threaded_build_and_an_unavailable_split() {
    let mut p = load("basic");
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
    let plain_text = terminal::render_without_source(&load("basic"), &plain(120, 2));
    assert!(!plain_text.contains("free-threaded") && !plain_text.contains("n/a"));
}

#[test]
fn terminal_with_functions_but_no_lines() {
    // All the time fell on instructions with no line: no line table, but the functions.
    let mut p = load("empty");
    p.total_s = 1.0;
    p.files = vec![FileProfile {
        filename: FROZEN.into(),
        cpu_pct: 0.0,
        lines: vec![],
        functions: vec![FunctionProfile {
            function: "_find_and_load".into(),
            first_line: None,
            cpu_python_pct: 100.0,
            cpu_native_pct: 0.0,
            cpu_system_pct: 0.0,
        }],
        context: Vec::new(),
        full_source: Vec::new(),
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
    let text = terminal::render(&load("wall"), &o, &mut source_of("wall"));
    // Every line of the 60-line source, and nothing after it.
    assert!(text.contains("    60 │             │        │        │ # line 60\n"));
    assert!(!text.contains("    61 │"));
}

#[test]
fn terminal_context_comes_from_the_source_provider() {
    let mut asked = Vec::new();
    let mut from_files = source_of("wall");
    let text = terminal::render(&load("wall"), &plain(100, 2), &mut |f: &str| {
        asked.push(f.to_string());
        from_files(f)
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
    let text = collapsed::render(&load("wall"));
    assert!(text.contains("serve (/srv/app/server.py:50);handle (/srv/app/server.py:22) 2000\n"));
    assert!(text.contains("<module> (/tmp/odd,name.py:1) 380\n"));
    assert!(text.contains("[no Python frames] 9\n"));
    assert!(collapsed::render(&load("basic"))
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
    let v: serde_json::Value = serde_json::from_str(&speedscope::render(&load("basic"))).unwrap();
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
