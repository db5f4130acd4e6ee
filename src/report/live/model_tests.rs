//! Unit tests of the live view's rows: hand-built frames whose truth is known.

use super::super::app::{App, LiveOptions};
use super::super::columns::{columns_of, fit, Column, Extras, DROP_ORDER, GAP};
use super::super::frame::{LiveFrame, LiveHeader};
use super::super::tally::Tally;
use super::*;
use crate::profile::{
    FileProfile, FunctionProfile, LineMemory, LineProfile, Profile, ProfileMeta, StackProfile,
    PROFILE_SCHEMA_VERSION,
};
use crate::python::Frame;
use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use std::time::Duration;

/// One stack of a hand-built frame: the thread, its frames (innermost first) and its
/// seconds (Python, native, system).
struct S {
    tid: i32,
    frames: Vec<Frame>,
    secs: [f64; 3],
}

fn py(function: &str, file: &str, line: u32) -> Frame {
    Frame {
        function: function.into(),
        filename: file.into(),
        line: Some(line),
        native: false,
    }
}

fn stack(tid: i32, frames: Vec<Frame>, secs: [f64; 3]) -> S {
    S { tid, frames, secs }
}

/// A since-start frame at `elapsed_s` made of `stacks`, as the aggregator would make it. It
/// has lines, functions and the total from the stacks' charged frames (here, their innermost
/// Python frame, since there are no library files).
fn frame_of(elapsed_s: f64, stacks: &[S]) -> LiveFrame {
    let total: f64 = stacks.iter().map(|s| s.secs.iter().sum::<f64>()).sum();
    let pct = |s: f64| 100.0 * s / total;
    let mut files: Vec<FileProfile> = Vec::new();
    let mut out_stacks = Vec::new();
    for s in stacks {
        let c = s.frames.iter().find(|f| !f.native && !f.is_task()).unwrap();
        let file = c.filename.to_string();
        let fi = match files.iter().position(|f| f.filename == file) {
            Some(i) => i,
            None => {
                files.push(FileProfile::new(&file));
                files.len() - 1
            }
        };
        let fp = &mut files[fi];
        let line = c.line.unwrap();
        match fp.lines.iter_mut().find(|l| l.line == line) {
            Some(l) => {
                l.cpu_python_pct += pct(s.secs[0]);
                l.cpu_native_pct += pct(s.secs[1]);
                l.cpu_system_pct += pct(s.secs[2]);
            }
            None => fp.lines.push(LineProfile {
                line,
                source: format!("source of {file}:{line}"),
                cpu_python_pct: pct(s.secs[0]),
                cpu_native_pct: pct(s.secs[1]),
                cpu_system_pct: pct(s.secs[2]),
                memory: None,
                gpu: None,
                native_functions: Vec::new(),
            }),
        }
        let name = c.function.to_string();
        match fp.functions.iter_mut().find(|f| f.function == name) {
            Some(f) => {
                f.cpu_python_pct += pct(s.secs[0]);
                f.cpu_native_pct += pct(s.secs[1]);
                f.cpu_system_pct += pct(s.secs[2]);
                f.first_line = f.first_line.min(Some(line));
            }
            None => fp.functions.push(FunctionProfile {
                function: name,
                first_line: Some(line),
                cpu_python_pct: pct(s.secs[0]),
                cpu_native_pct: pct(s.secs[1]),
                cpu_system_pct: pct(s.secs[2]),
            }),
        }
        out_stacks.push(StackProfile {
            frames: s.frames.clone(),
            samples: 1,
            seconds: s.secs.iter().sum(),
            split: Some(Split {
                python_s: s.secs[0],
                native_s: s.secs[1],
                system_s: s.secs[2],
            }),
            native_id: Some(s.tid),
        });
    }
    let profile = Profile {
        schema_version: PROFILE_SCHEMA_VERSION,
        meta: ProfileMeta {
            duration_s: elapsed_s,
            ..ProfileMeta::default()
        },
        total_s: total,
        files,
        stacks: out_stacks,
        threads: Vec::new(),
        processes: Vec::new(),
        memory: None,
        gpu: None,
    };
    LiveFrame {
        profile,
        header: LiveHeader {
            elapsed: Duration::from_secs_f64(elapsed_s),
            ..LiveHeader::default()
        },
    }
}

fn window(base: Option<&LiveFrame>, cur: &LiveFrame) -> Tally {
    Tally::of(cur).since(base.map(Tally::of).as_ref())
}

fn lines(w: &Tally) -> Vec<Row> {
    rows(w, &Query::default())
}

fn key(c: char) -> KeyEvent {
    KeyEvent::new(KeyCode::Char(c), KeyModifiers::NONE)
}

const A: &str = "/app/a.py";
const B: &str = "/app/b.py";

#[test]
fn interval_shares_are_the_difference_of_two_frames() {
    // A and B take 1 s each by 1 s; by 2 s, A has taken 2 s more and B nothing more.
    let f1 = frame_of(
        1.0,
        &[
            stack(1, vec![py("fa", A, 10)], [1.0, 0.0, 0.0]),
            stack(1, vec![py("fb", B, 20)], [0.5, 0.25, 0.25]),
        ],
    );
    let f2 = frame_of(
        2.0,
        &[
            stack(1, vec![py("fa", A, 10)], [2.5, 0.5, 0.0]),
            stack(1, vec![py("fb", B, 20)], [0.5, 0.25, 0.25]),
        ],
    );
    let interval = window(Some(&f1), &f2);
    assert!((interval.total_s - 2.0).abs() < 1e-9);
    assert!((interval.elapsed_s - 1.0).abs() < 1e-9);
    let r = lines(&interval);
    // Only A had time in the interval, so it has all of it, 1.5 s Python and 0.5 s native of
    // 2 s.
    assert_eq!(r.len(), 1, "{r:?}");
    assert_eq!((r[0].file.as_str(), r[0].line), (A, Some(10)));
    assert!((r[0].total_pct - 100.0).abs() < 1e-9);
    assert!((r[0].python_pct - 100.0 * 1.5 / 2.0).abs() < 1e-9);
    assert!((r[0].native_pct - 100.0 * 0.5 / 2.0).abs() < 1e-9);
    // Since start, the shares are of the 4 s in all.
    let since = lines(&window(None, &f2));
    let share = |rows: &[Row], f: &str| rows.iter().find(|r| r.file == f).unwrap().total_pct;
    assert!((share(&since, A) - 100.0 * 3.0 / 4.0).abs() < 1e-9);
    assert!((share(&since, B) - 100.0 * 1.0 / 4.0).abs() < 1e-9);
    // The app's interval is the same window; `w` switches to since start.
    let mut app = App::new(LiveOptions::default());
    app.update(f1);
    app.update(f2);
    assert_eq!(app.rows(), r);
    app.key(key('w'));
    assert_eq!(app.rows(), since);
}

#[test]
fn no_share_exceeds_100_with_8_threads() {
    // 8 threads, each busy all the time on a line of its own, make 8 CPU-s each second.
    let at = |t: f64| {
        let stacks: Vec<S> = (0..8)
            .map(|i| stack(100 + i, vec![py("work", A, 10 + i as u32)], [t, 0.0, 0.0]))
            .collect();
        frame_of(t, &stacks)
    };
    let (f1, f2) = (at(1.0), at(2.0));
    let mut app = App::new(LiveOptions::default());
    app.update(f1);
    app.update(f2);
    let threads: Vec<i32> = (100..108).collect();
    for view in [View::Lines, View::Functions, View::Files] {
        for thread in std::iter::once(None).chain(threads.iter().map(|t| Some(*t))) {
            for w in [app.window.clone().unwrap(), window(None, &at(2.0))] {
                let q = Query {
                    view,
                    thread,
                    ..Query::default()
                };
                let r = rows(&w, &q);
                assert!(!r.is_empty(), "{view:?} {thread:?}");
                let sum: f64 = r.iter().map(|r| r.total_pct).sum();
                assert!(sum <= 100.0 + 1e-9, "{view:?} {thread:?}: {sum}");
                for row in &r {
                    assert!(row.total_pct <= 100.0 + 1e-9, "{row:?}");
                }
                // Each thread's line is an eighth of the window, not a whole CPU's 100%.
                if view == View::Lines {
                    for row in &r {
                        assert!((row.total_pct - 100.0 / 8.0).abs() < 1e-9, "{row:?}");
                    }
                }
            }
        }
    }
}

#[test]
fn filter_and_thread_view_select_the_right_rows() {
    let f = frame_of(
        1.0,
        &[
            stack(1, vec![py("render_page", A, 10)], [0.4, 0.0, 0.0]),
            stack(1, vec![py("parse", B, 5)], [0.2, 0.0, 0.0]),
            stack(2, vec![py("parse", B, 5)], [0.1, 0.0, 0.0]),
            stack(2, vec![py("helper", "/app/Render.py", 3)], [0.3, 0.0, 0.0]),
        ],
    );
    let w = window(None, &f);
    let q = |thread, filter: &str| Query {
        thread,
        filter: filter.to_string(),
        ..Query::default()
    };
    let place = |r: &[Row]| -> Vec<(String, Option<u32>)> {
        let mut v: Vec<_> = r.iter().map(|r| (r.file.clone(), r.line)).collect();
        v.sort();
        v
    };
    // By function name (render_page) or by file name (Render.py), whatever the case.
    assert_eq!(
        place(&rows(&w, &q(None, "RENDER"))),
        vec![("/app/Render.py".into(), Some(3)), (A.into(), Some(10))]
    );
    assert!(rows(&w, &q(None, "nothing like it")).is_empty());
    // Thread 2 shows its own two lines, with its own seconds of the shared line.
    let t2 = rows(&w, &q(Some(2), ""));
    assert_eq!(
        place(&t2),
        vec![("/app/Render.py".into(), Some(3)), (B.into(), Some(5))]
    );
    let shared = t2.iter().find(|r| r.file == B).unwrap();
    assert!((shared.split.python_s - 0.1).abs() < 1e-9);
    assert!((shared.total_pct - 100.0 * 0.1 / 1.0).abs() < 1e-9);
    // Both at once.
    assert_eq!(
        place(&rows(&w, &q(Some(1), "parse"))),
        vec![(B.into(), Some(5))]
    );
    // The app's `t` goes through all threads, then each by id, then all again.
    let mut app = App::new(LiveOptions::default());
    app.update(f);
    let mut seen = vec![app.query.thread];
    for _ in 0..3 {
        app.key(key('t'));
        seen.push(app.query.thread);
    }
    assert_eq!(seen, vec![None, Some(1), Some(2), None]);
}

#[test]
fn sort_orders_rows() {
    let mut f = frame_of(
        2.0,
        &[
            stack(1, vec![py("zeta", A, 3)], [0.1, 0.6, 0.0]),
            stack(1, vec![py("alpha", B, 9)], [0.5, 0.0, 0.3]),
            stack(1, vec![py("mid", A, 1)], [0.2, 0.1, 0.2]),
        ],
    );
    // Memory on two of the lines: B:9 allocates most, A:3 peaks highest and copies most.
    for fp in &mut f.profile.files {
        for l in &mut fp.lines {
            let (alloc, peak, copy) = match (fp.filename.as_str(), l.line) {
                (B, 9) => (40.0, 2.0, 0.5),
                (A, 3) => (10.0, 8.0, 3.0),
                _ => continue,
            };
            l.memory = Some(LineMemory {
                mem_alloc_mb: alloc,
                mem_peak_mb: peak,
                copy_mb_s: copy,
                ..LineMemory::default()
            });
        }
    }
    let w = window(None, &f);
    for k in SORT_CYCLE {
        let r = rows(
            &w,
            &Query {
                sort: k,
                ..Query::default()
            },
        );
        assert_eq!(r.len(), 3);
        for pair in r.windows(2) {
            let (a, b) = (&pair[0], &pair[1]);
            let ordered = match k {
                SortKey::Location => (&a.file, a.line) <= (&b.file, b.line),
                SortKey::Function => a.function <= b.function,
                _ => a.figure(k) >= b.figure(k),
            };
            assert!(ordered, "{k:?}: {a:?} before {b:?}");
        }
    }
    let first = |k| {
        let r = rows(
            &w,
            &Query {
                sort: k,
                ..Query::default()
            },
        );
        (r[0].file.clone(), r[0].line)
    };
    assert_eq!(first(SortKey::Total), (B.to_string(), Some(9)));
    assert_eq!(first(SortKey::Native), (A.to_string(), Some(3)));
    assert_eq!(first(SortKey::Alloc), (B.to_string(), Some(9)));
    assert_eq!(first(SortKey::Peak), (A.to_string(), Some(3)));
    assert_eq!(first(SortKey::Function), (B.to_string(), Some(9)));
    assert_eq!(first(SortKey::Location), (A.to_string(), Some(1)));
    // Rates are of the window: 40 MB over 2 s.
    let b9 = lines(&w).into_iter().find(|r| r.file == B).unwrap();
    assert!((b9.alloc_mb_s.unwrap() - 40.0 / 2.0).abs() < 1e-9);
}

#[test]
fn narrow_widths_drop_source_first() {
    let x = Extras {
        memory: true,
        native: true,
        tasks: true,
        unsplit: false,
    };
    let all = columns_of(View::Lines, x);
    let natural = |_: Column| 30;
    let kept = |width: usize| -> Vec<Column> {
        fit(&all, View::Lines, x, width, &natural)
            .into_iter()
            .map(|(c, _)| c)
            .collect()
    };
    // The width every column needs at its fewest characters.
    let full = fit(&all, View::Lines, x, 10_000, &natural);
    assert_eq!(full.len(), all.len());
    let least: usize = all
        .iter()
        .map(|c| c.bounds(View::Lines, x).0)
        .sum::<usize>()
        + GAP * (all.len() - 1);
    let one_short = kept(least - 1);
    assert!(!one_short.contains(&Column::Source), "{one_short:?}");
    assert!(one_short.contains(&Column::Function), "{one_short:?}");
    // Narrowing further, columns go in DROP_ORDER, and only those.
    let mut dropped: Vec<Column> = Vec::new();
    let mut before = kept(least);
    for width in (1..least).rev() {
        let now = kept(width);
        for c in &before {
            if !now.contains(c) {
                dropped.push(*c);
            }
        }
        // The columns kept never exceed the width, but for Location and Total alone.
        let used: usize = fit(&all, View::Lines, x, width, &natural)
            .iter()
            .map(|(_, w)| w)
            .sum::<usize>()
            + GAP * (now.len() - 1);
        assert!(
            used <= width || now.len() == 2,
            "{width}: {now:?} use {used}"
        );
        before = now;
    }
    assert_eq!(dropped, DROP_ORDER.to_vec());
    assert_eq!(before, vec![Column::Location, Column::Total]);
}

#[test]
fn reset_starts_every_window_at_the_frame_shown() {
    let at = |t: f64| frame_of(t, &[stack(1, vec![py("f", A, 1)], [t, 0.0, 0.0])]);
    let mut app = App::new(LiveOptions::default());
    app.update(at(1.0));
    app.update(at(2.0));
    app.key(key('r'));
    // Right after the reset, nothing is counted yet, in either window.
    assert!(app.rows().is_empty());
    app.key(key('w'));
    assert!(app.rows().is_empty());
    app.update(at(4.0));
    // Since the reset: 2 s of the 2 s.
    let w = app.window.clone().unwrap();
    assert!((w.total_s - 2.0).abs() < 1e-9 && (w.elapsed_s - 2.0).abs() < 1e-9);
}

#[test]
fn paused_keeps_the_frames_shown_but_sees_the_exit() {
    let at = |t: f64| frame_of(t, &[stack(1, vec![py("f", A, 1)], [t, 0.0, 0.0])]);
    let mut app = App::new(LiveOptions::default());
    app.update(at(1.0));
    app.key(key('p'));
    let mut last = at(3.0);
    last.header.exited = Some(3);
    app.update(last);
    assert!((app.window.as_ref().unwrap().elapsed_s - 1.0).abs() < 1e-9);
    assert_eq!(app.exited(), Some(3));
}

#[test]
fn the_exit_frame_ends_the_last_interval_instead_of_being_one() {
    let at = |t: f64| frame_of(t, &[stack(1, vec![py("f", A, 1)], [t, 0.0, 0.0])]);
    let mut app = App::new(LiveOptions::default());
    app.update(at(1.0));
    app.update(at(2.0));
    // The exit comes 10 ms after the last frame, with nothing sampled since.
    let mut last = frame_of(2.01, &[stack(1, vec![py("f", A, 1)], [2.0, 0.0, 0.0])]);
    last.header.exited = Some(0);
    app.update(last);
    let w = app.window.clone().unwrap();
    assert!((w.elapsed_s - 1.01).abs() < 1e-9, "{}", w.elapsed_s);
    assert!(!app.rows().is_empty());
    assert_eq!(app.exited(), Some(0));
}

#[test]
fn tasks_native_functions_and_names_of_lines() {
    let task = Frame::of_task("fetch-7");
    let zlib = Frame::of_native("deflate".into(), Some("libz.so.1"));
    let f = frame_of(
        1.0,
        &[
            stack(1, vec![py("get", A, 4), task.clone()], [0.3, 0.0, 0.0]),
            stack(1, vec![zlib, py("pack", A, 8)], [0.0, 0.5, 0.0]),
        ],
    );
    let w = window(None, &f);
    let r = lines(&w);
    let of = |line| r.iter().find(|r| r.line == Some(line)).unwrap();
    assert_eq!(of(4).task.as_deref(), Some("fetch-7"));
    assert_eq!(of(4).function.as_deref(), Some("get"));
    // Thread 1's view names the native function from its own stacks.
    let t1 = rows(
        &w,
        &Query {
            thread: Some(1),
            ..Query::default()
        },
    );
    let pack = t1.iter().find(|r| r.line == Some(8)).unwrap();
    assert_eq!(pack.native_top.as_deref(), Some("deflate (libz.so.1)"));
    // Without stacks, a line is named after the function that starts nearest above it.
    let mut bare = f.clone();
    bare.profile.stacks.clear();
    bare.profile.files[0].functions = vec![
        FunctionProfile {
            function: "outer".into(),
            first_line: Some(2),
            cpu_python_pct: 0.0,
            cpu_native_pct: 0.0,
            cpu_system_pct: 0.0,
        },
        FunctionProfile {
            function: "inner".into(),
            first_line: Some(6),
            cpu_python_pct: 0.0,
            cpu_native_pct: 0.0,
            cpu_system_pct: 0.0,
        },
    ];
    let t = Tally::of(&bare);
    assert_eq!(t.function_of(&(A.into(), 4)).as_deref(), Some("outer"));
    assert_eq!(t.function_of(&(A.into(), 8)).as_deref(), Some("inner"));
    assert_eq!(t.function_of(&(A.into(), 1)), None);
}
