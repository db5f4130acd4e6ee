//! Unit tests of the aggregator and of the source text a profile keeps.

use super::*;

fn frame(f: &str, line: u32) -> Frame {
    Frame {
        function: f.into(),
        filename: "/app/main.py".into(),
        line: Some(line),
        native: false,
    }
}

#[test]
fn percentages_are_of_the_total() {
    let mut agg = Aggregator::new();
    let a = [frame("a", 3), frame("<module>", 10)];
    let b = [frame("b", 7), frame("<module>", 11)];
    for (frames, act, user, sys) in [
        (&a[..], Activity::Python, 0.03, 0.0),
        (&b[..], Activity::Native, 0.01, 0.0),
    ] {
        let s = ThreadSample {
            frames,
            activity: act,
            user_s: user,
            system_s: sys,
            idle_s: 0.0,
            native_id: Some(1),
            thread_name: None,
            counts: true,
        };
        agg.add(&s, frames.first());
    }
    // A sample that stands for no time is not counted.
    agg.add(
        &ThreadSample {
            frames: &a,
            activity: Activity::Python,
            user_s: 0.0,
            system_s: 0.0,
            idle_s: 0.0,
            native_id: Some(1),
            thread_name: None,
            counts: true,
        },
        a.first(),
    );
    let p = agg.finish(ProfileMeta::default(), &mut |_| None);
    let f = &p.files[0];
    let l3 = f.lines.iter().find(|l| l.line == 3).unwrap();
    let l7 = f.lines.iter().find(|l| l.line == 7).unwrap();
    assert!((l3.cpu_python_pct - 75.0).abs() < 1e-9);
    assert!((l7.cpu_native_pct - 25.0).abs() < 1e-9);
    assert_eq!(p.stacks.len(), 2);
    assert_eq!(p.stacks.iter().map(|s| s.samples).sum::<u64>(), 2);
    // Each stack keeps its own split, adding up to its seconds.
    let sa = p.stacks.iter().find(|s| s.frames == a).unwrap();
    let sb = p.stacks.iter().find(|s| s.frames == b).unwrap();
    let (ja, jb) = (sa.split.unwrap(), sb.split.unwrap());
    assert!((ja.python_s - 0.03).abs() < 1e-12 && ja.native_s == 0.0);
    assert!((jb.native_s - 0.01).abs() < 1e-12 && jb.python_s == 0.0);
    assert!((ja.total() - sa.seconds).abs() < 1e-12);
    assert!((f.cpu_pct - 100.0).abs() < 1e-9);
}

#[test]
fn a_lines_native_time_is_listed_by_its_innermost_native_function() {
    let line = frame("work", 7);
    let alpha = Frame::of_native("burn_alpha".into(), Some("burnext.so"));
    let beta = Frame::of_native("burn_beta".into(), Some("burnext.so"));
    let burn = Frame::of_native("burn".into(), Some("burnext.so"));
    let in_alpha = [alpha, burn.clone(), line.clone()];
    let in_beta = [beta, burn, line.clone()];
    let python = [line];
    let sample = |frames, activity, user_s| ThreadSample {
        frames,
        activity,
        user_s,
        system_s: 0.001,
        idle_s: 0.0,
        native_id: Some(1),
        thread_name: None,
        counts: true,
    };
    let mut aggs = [Aggregator::new(), Aggregator::new()];
    for (i, frames, activity, user_s) in [
        (0, &in_alpha[..], Activity::Native, 0.03),
        (1, &in_alpha[..], Activity::Native, 0.03),
        (0, &in_beta[..], Activity::Native, 0.02),
        // Python time of the line, and a native frame sampled as Python (the CALL
        // heuristic decides): neither is a native function's time.
        (0, &python[..], Activity::Python, 0.01),
        (1, &in_beta[..], Activity::Python, 0.01),
    ] {
        let s = sample(frames, activity, user_s);
        aggs[i].add(&s, crate::profile::charged_frame(frames, false));
    }
    let [mut one, other] = aggs;
    one.absorb(&other);
    let p = one.finish(ProfileMeta::default(), &mut |_| None);
    let l = &p.files[0].lines[0];
    assert_eq!(l.line, 7);
    let total = 0.03 + 0.03 + 0.02 + 0.01 + 0.01 + 5.0 * 0.001;
    let listed: Vec<(&str, &str, f64)> = l
        .native_functions
        .iter()
        .map(|n| (n.function.as_str(), n.module.as_str(), n.pct))
        .collect();
    assert_eq!(listed.len(), 2, "{listed:?}");
    assert_eq!((listed[0].0, listed[0].1), ("burn_alpha", "burnext.so"));
    assert!((listed[0].2 - 100.0 * 0.06 / total).abs() < 1e-9);
    assert_eq!(listed[1].0, "burn_beta");
    assert!((listed[1].2 - 100.0 * 0.02 / total).abs() < 1e-9);
    // They add up to the line's native share.
    assert!((listed[0].2 + listed[1].2 - l.cpu_native_pct).abs() < 1e-9);
}

#[test]
fn stacks_are_kept_by_thread() {
    let mut agg = Aggregator::new();
    let a = [frame("a", 3)];
    for (tid, user) in [
        (Some(1), 0.01),
        (Some(2), 0.02),
        (Some(1), 0.03),
        (None, 0.04),
    ] {
        agg.add(
            &ThreadSample {
                frames: &a,
                activity: Activity::Python,
                user_s: user,
                system_s: 0.0,
                idle_s: 0.0,
                native_id: tid,
                thread_name: None,
                counts: true,
            },
            a.first(),
        );
    }
    let mut other = Aggregator::new();
    other.add(
        &ThreadSample {
            frames: &a,
            activity: Activity::Native,
            user_s: 0.05,
            system_s: 0.0,
            idle_s: 0.0,
            native_id: Some(2),
            thread_name: None,
            counts: true,
        },
        a.first(),
    );
    agg.absorb(&other);
    let p = agg.finish(ProfileMeta::default(), &mut |_| None);
    let got: Vec<(Option<i32>, u64, f64, f64)> = p
        .stacks
        .iter()
        .map(|s| {
            let sp = s.split.unwrap();
            (s.native_id, s.samples, sp.python_s, sp.native_s)
        })
        .collect();
    assert_eq!(
        got,
        [
            (Some(1), 2, 0.04, 0.0),
            (Some(2), 2, 0.02, 0.05),
            (None, 1, 0.04, 0.0)
        ]
    );
    assert!((p.total_s - 0.15).abs() < 1e-12);
    // Stacks saved without a thread read back as None.
    let json = r#"{"frames": [], "samples": 3, "seconds": 0.5}"#;
    let old: StackProfile = serde_json::from_str(json).unwrap();
    assert_eq!((old.native_id, old.split), (None, None));
}

#[test]
fn a_line_numbered_zero_gets_no_source_and_no_panic() {
    let mut agg = Aggregator::new();
    let frames = [frame("f", 0)];
    agg.add(
        &ThreadSample {
            frames: &frames,
            activity: Activity::Python,
            user_s: 0.01,
            system_s: 0.0,
            idle_s: 0.0,
            native_id: Some(1),
            thread_name: None,
            counts: true,
        },
        frames.first(),
    );
    let p = agg.finish(ProfileMeta::default(), &mut |_| Some(vec!["x = 1".into()]));
    assert_eq!(p.files[0].lines[0].line, 0);
    assert_eq!(p.files[0].lines[0].source, "");
    assert_eq!(p.files[0].full_source, vec!["x = 1".to_string()]);
}

#[test]
fn full_source_is_kept_only_for_files_within_bounds() {
    let mut f = FileProfile::new("/a.py");
    f.take_source(&["a".to_string(), "b".to_string()]);
    assert_eq!(f.full_source, vec!["a", "b"]);
    let big = vec!["x".to_string(); FULL_SOURCE_MAX_LINES + 1];
    f.take_source(&big);
    assert!(f.full_source.is_empty());
    let wide = vec!["y".repeat(FULL_SOURCE_MAX_BYTES)];
    f.take_source(&wide);
    assert!(f.full_source.is_empty());
}
