//! Golden screens of `top`, the live view, drawn by ratatui's `TestBackend` from recorded
//! frames.
//!
//! The input is `tests/golden/top/<case>/frame-1.json` and `frame-2.json`: the since-start
//! profiles of one program at 5 s and at 6 s (made by `tests/golden/top/make_frames.py`,
//! which derives every figure from the program's stacks, so they agree). Each screen is a
//! terminal size and a sequence of keys after the frames came in; its text (the buffer's
//! characters, trailing blanks dropped) is compared with `<case>/<screen>.txt`.
//!
//! After a deliberate change, `BLESS=1 cargo nextest run --test top_screens` (or
//! `SCALENE_RS_BLESS=1`) writes the screens instead of comparing them; review the diff.

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use ratatui::backend::TestBackend;
use ratatui::Terminal;
use scalene_rs::profile::Profile;
use scalene_rs::report::live::{
    Action, App, LiveFrame, LiveGpu, LiveHeader, LiveOptions, LiveProcess,
};
use scalene_rs::report::profile_json;
use std::io::Write as _;
use std::path::PathBuf;
use std::time::Duration;

const CASE: &str = "server";
/// Samples in which some thread held the GIL, by the frame's ticks: 310 of 500, then 55
/// of the next 98.
const GIL_HELD: [f64; 2] = [310.0, 365.0];

fn case_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden/top")
        .join(CASE)
}

fn profile(n: usize) -> Profile {
    let path = case_dir().join(format!("frame-{n}.json"));
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    profile_json::from_json(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Frame `n` (1 or 2) as the session would hand it over: the profile, and a header made
/// of the profile's facts and the few the profile lacks.
fn frame(n: usize) -> LiveFrame {
    let p = profile(n);
    let m = &p.meta;
    let header = LiveHeader {
        processes: p
            .processes
            .iter()
            .map(|pr| LiveProcess {
                pid: pr.pid,
                command: pr.command.clone(),
                python_version: pr.python_version.clone(),
                cpu_pct: pr.cpu_pct,
            })
            .collect(),
        rate_requested_hz: m.requested_rate_hz,
        samples: m.samples,
        lost: m.missed_samples + m.errors,
        elapsed: Duration::from_secs_f64(m.duration_s),
        gil_pct: Some(100.0 * GIL_HELD[n - 1] / m.samples as f64),
        threads_active: 3,
        threads_idle: 1,
        footprint_mb: p
            .memory
            .as_ref()
            .map(|mem| mem.timeline.iter().map(|t| t[1]).collect())
            .unwrap_or_default(),
        gpu: Some(LiveGpu {
            util_pct: 35.0 + n as f64,
            mem_mb: 1536.0,
        }),
        exited: None,
        note: None,
    };
    LiveFrame { profile: p, header }
}

/// The keys of a screen: each character one key; `\n` is Enter, `\x1b` Esc.
fn keys(text: &str) -> Vec<KeyEvent> {
    text.chars()
        .map(|c| {
            let code = match c {
                '\n' => KeyCode::Enter,
                '\x1b' => KeyCode::Esc,
                c => KeyCode::Char(c),
            };
            KeyEvent::new(code, KeyModifiers::NONE)
        })
        .collect()
}

/// The text of what `app` draws on a `width` × `height` terminal.
fn draw(app: &App, width: u16, height: u16) -> String {
    let mut t = Terminal::new(TestBackend::new(width, height)).unwrap();
    t.draw(|f| app.draw(f)).unwrap();
    buffer_text(t.backend())
}

fn buffer_text(b: &TestBackend) -> String {
    let buf = b.buffer();
    let mut out = String::new();
    for y in 0..buf.area.height {
        let mut line = String::new();
        for x in 0..buf.area.width {
            line.push_str(buf[(x, y)].symbol());
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// An app that took both frames (the second changed by `last`), then `typed`.
fn app_after(typed: &str, last: impl FnOnce(&mut LiveFrame)) -> App {
    let mut app = App::new(LiveOptions::default());
    app.update(frame(1));
    let mut f2 = frame(2);
    last(&mut f2);
    app.update(f2);
    for k in keys(typed) {
        assert_ne!(app.key(k), Action::Quit, "{typed:?}");
    }
    app
}

/// Every screen: (file name, width, height, keys).
const SCREENS: &[(&str, u16, u16, &str)] = &[
    ("wide", 160, 40, ""),
    ("medium", 100, 30, ""),
    ("narrow", 60, 20, ""),
    ("narrow-files", 60, 20, "vv"),
    ("since-start", 160, 40, "w"),
    ("sort-python", 160, 40, "s"),
    ("sort-native", 160, 40, "ss"),
    ("sort-system", 160, 40, "sss"),
    ("sort-alloc", 160, 40, "ssss"),
    ("sort-peak", 160, 40, "sssss"),
    ("sort-copy", 160, 40, "ssssss"),
    ("sort-location", 160, 40, "sssssss"),
    ("sort-function", 160, 40, "ssssssss"),
    ("functions", 160, 40, "v"),
    ("files", 160, 40, "vv"),
    ("thread", 160, 40, "tt"),
    ("thread-functions", 160, 40, "ttv"),
    ("filter", 160, 40, "/render\n"),
    ("filter-typing", 160, 40, "/rend"),
    ("help", 160, 40, "?"),
    ("help-narrow", 60, 20, "?"),
];

/// Whether this run writes the expected files instead of comparing with them.
fn blessing() -> bool {
    ["BLESS", "SCALENE_RS_BLESS"]
        .iter()
        .any(|v| std::env::var(v).is_ok_and(|v| v == "1"))
}

/// Compares `text` with the screen file `name` (or, blessing, writes it); the failure, if
/// any.
fn check(name: &str, text: &str) -> Option<String> {
    let path = case_dir().join(format!("{name}.txt"));
    let shown = format!("tests/golden/top/{CASE}/{name}.txt");
    let expected = std::fs::read_to_string(&path);
    if blessing() {
        if expected.ok().as_deref() != Some(text) {
            std::fs::write(&path, text).unwrap();
            let _ = writeln!(std::io::stderr(), "blessed {shown}");
        }
        return None;
    }
    match expected {
        Err(e) => Some(format!("{shown}: cannot read ({e})")),
        Ok(want) if want != text => Some(format!("{shown} differs:\n{}", diff(&want, text))),
        Ok(_) => None,
    }
}

/// The lines that differ, numbered, `-` expected and `+` drawn.
fn diff(want: &str, got: &str) -> String {
    let (w, g): (Vec<&str>, Vec<&str>) = (want.lines().collect(), got.lines().collect());
    let mut out = String::new();
    for i in 0..w.len().max(g.len()) {
        if w.get(i) != g.get(i) {
            out += &format!("  - {:>3} | {}\n", i + 1, w.get(i).unwrap_or(&"<none>"));
            out += &format!("  + {:>3} | {}\n", i + 1, g.get(i).unwrap_or(&"<none>"));
        }
    }
    out
}

/// Every screen, and the screens that need more than keys (paused, exited).
fn all_screens() -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = SCREENS
        .iter()
        .map(|&(name, w, h, typed)| (name.to_string(), draw(&app_after(typed, |_| {}), w, h)))
        .collect();
    // Paused at frame 1: frame 2 comes in, and the screen still shows frame 1.
    let mut paused = App::new(LiveOptions::default());
    paused.update(frame(1));
    assert_eq!(paused.key(keys("p")[0]), Action::Redraw);
    paused.update(frame(2));
    out.push(("paused".to_string(), draw(&paused, 160, 40)));
    let exited = app_after("", |f| f.header.exited = Some(1));
    out.push(("exited".to_string(), draw(&exited, 160, 40)));
    out.push(("exited-narrow".to_string(), draw(&exited, 60, 20)));
    out
}

#[test]
fn screens_match_their_golden_files() {
    let screens = all_screens();
    let failures: Vec<String> = screens
        .iter()
        .filter_map(|(name, text)| check(name, text))
        .collect();
    // The folder holds the frames and the screens, nothing else.
    for entry in std::fs::read_dir(case_dir()).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        let known =
            name.starts_with("frame-") || screens.iter().any(|(s, _)| format!("{s}.txt") == name);
        assert!(known, "tests/golden/top/{CASE}/{name}: no screen writes it");
    }
    assert!(
        failures.is_empty(),
        "{}\n(after a deliberate change: BLESS=1 cargo nextest run --test top_screens, then \
         review the diff)",
        failures.join("\n")
    );
}

/// What the screen shows of the two frames agrees with the frames themselves.
#[test]
fn the_hottest_line_of_the_interval_leads_with_its_share() {
    let (p1, p2) = (profile(1), profile(2));
    // The line with the most seconds between the frames, and its share of their
    // difference, from the profiles alone.
    let secs = |p: &Profile, file: &str, line: u32| {
        p.files
            .iter()
            .find(|f| f.filename == file)
            .and_then(|f| f.lines.iter().find(|l| l.line == line))
            .map_or(0.0, |l| {
                (l.cpu_python_pct + l.cpu_native_pct + l.cpu_system_pct) / 100.0 * p.total_s
            })
    };
    let mut best = (String::new(), 0, f64::MIN);
    for f in &p2.files {
        for l in &f.lines {
            let d = secs(&p2, &f.filename, l.line) - secs(&p1, &f.filename, l.line);
            if d > best.2 {
                best = (f.filename.clone(), l.line, d);
            }
        }
    }
    let share = 100.0 * best.2 / (p2.total_s - p1.total_s);
    let text = draw(&app_after("", |_| {}), 160, 40);
    let first_row = text
        .lines()
        .skip_while(|l| !l.starts_with("File:line"))
        .nth(1)
        .unwrap();
    assert!(
        first_row.contains(&format!("{}:{}", best.0, best.1))
            && first_row.contains(&format!("{share:.1}")),
        "{first_row} should show {}:{} at {share:.1}%",
        best.0,
        best.1
    );
}

#[test]
fn paused_shows_the_frame_of_the_pause() {
    let mut at_1 = App::new(LiveOptions::default());
    at_1.update(frame(1));
    let mut paused = App::new(LiveOptions::default());
    paused.update(frame(1));
    paused.key(keys("p")[0]);
    paused.update(frame(2));
    let (a, b) = (draw(&at_1, 160, 40), draw(&paused, 160, 40));
    // Only the title differs (the badge), and it says PAUSED.
    let differing: Vec<(&str, &str)> = a.lines().zip(b.lines()).filter(|(x, y)| x != y).collect();
    assert_eq!(differing.len(), 1, "{differing:?}");
    assert!(differing[0].1.contains("PAUSED"));
    // Unpaused, the newest frame shows.
    paused.key(keys("p")[0]);
    assert_eq!(
        draw(&paused, 160, 40),
        draw(&app_after("", |_| {}), 160, 40)
    );
}

#[test]
fn a_resize_draws_the_new_size_at_once() {
    let app = app_after("", |_| {});
    let mut t = Terminal::new(TestBackend::new(160, 40)).unwrap();
    t.draw(|f| app.draw(f)).unwrap();
    t.backend_mut().resize(60, 20);
    t.draw(|f| app.draw(f)).unwrap();
    assert_eq!(buffer_text(t.backend()), draw(&app, 60, 20));
}

#[test]
fn refresh_keys_report_the_new_period() {
    let mut app = app_after("", |_| {});
    let plus = keys("+")[0];
    let minus = keys("-")[0];
    assert_eq!(app.key(plus), Action::Refresh(Duration::from_secs(2)));
    assert_eq!(app.key(minus), Action::Refresh(Duration::from_secs(1)));
    assert_eq!(app.key(minus), Action::Refresh(Duration::from_millis(500)));
    assert_eq!(app.refresh(), Duration::from_millis(500));
    assert!(draw(&app, 160, 40)
        .lines()
        .next()
        .unwrap()
        .contains("refresh 0.5 s"));
}

#[test]
fn quit_keys() {
    for k in [
        KeyEvent::new(KeyCode::Char('q'), KeyModifiers::NONE),
        KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL),
    ] {
        let mut app = app_after("", |_| {});
        assert_eq!(app.key(k), Action::Quit);
    }
    // While a filter is typed, `q` is text; Ctrl-C still quits.
    let mut app = app_after("/", |_| {});
    assert_eq!(app.key(keys("q")[0]), Action::Redraw);
    let ctrl_c = KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL);
    assert_eq!(app.key(ctrl_c), Action::Quit);
    // Once the COMMAND exited, any key leaves.
    let mut app = app_after("", |f| f.header.exited = Some(0));
    assert_eq!(app.key(keys("s")[0]), Action::Quit);
}
