use super::*;

fn ev(kind: u32, a: u64, b: u64, c: u64, ptr: u64, t: u64) -> Event {
    Event {
        kind,
        tid: 1,
        a,
        b,
        c,
        ptr,
        time_ns: t,
        wants_ack: false,
        ticket: 0,
    }
}

fn key(line: u32) -> Option<LineKey> {
    Some(("/app/m.py".into(), line))
}

fn profile() -> Profile {
    crate::profile::Aggregator::new().finish(Default::default(), &mut |_| None)
}

const M: u64 = 1 << 20;

#[test]
fn laplace_rule() {
    assert!((leak_likelihood(0, 0) - 0.5).abs() < 1e-12);
    assert!(leak_likelihood(40, 0) > LEAK_THRESHOLD);
    assert!(leak_likelihood(40, 3) < LEAK_THRESHOLD);
    assert!(leak_likelihood(100, 100) < 0.01);
}

#[test]
fn lines_get_their_bytes_python_share_and_leaks() {
    let mut agg = MemoryAggregator::new();
    // Line 3 keeps everything it allocates (60 windows, 3/4 by the interpreter);
    // line 7 frees each of its windows again.
    for i in 0..60u64 {
        agg.add(
            &ev(EV_ALLOC, M, M, 3 * M / 4, 0x1000 + i, i * 1_000_000),
            key(3),
        );
        agg.add(
            &ev(EV_ALLOC, M, M, 0, 0x9000 + i, i * 1_000_000 + 1),
            key(7),
        );
        agg.add(
            &ev(EV_SAMPLED_FREE, 0, 0, 0, 0x9000 + i, i * 1_000_000 + 2),
            None,
        );
        agg.footprint_at(i * 1_000_000 + 3, ((i + 1) * M) as i64);
    }
    agg.add(&ev(EV_COPY, 10 * M, 0, 0, 0, 60_000_000), key(9));
    let mut p = profile();
    p.meta.duration_s = 2.0;
    agg.merge_into(
        &mut p,
        RingTotals {
            peak_bytes: (60 * M) as i64,
            ..Default::default()
        },
        &mut |_| Some(vec!["a".into(); 10]),
    );
    let f = &p.files[0];
    let line = |n: u32| {
        f.lines
            .iter()
            .find(|l| l.line == n)
            .unwrap()
            .memory
            .clone()
            .unwrap()
    };
    assert!((line(3).mem_alloc_mb - 60.0).abs() < 1e-9);
    assert!((line(3).mem_python_pct - 75.0).abs() < 1e-9);
    assert!((line(3).mem_peak_mb - 60.0).abs() < 1e-9);
    assert!((line(7).mem_peak_mb - 1.0).abs() < 1e-9);
    assert_eq!(line(7).mem_python_pct, 0.0);
    assert!((line(9).copy_mb_s - 5.0).abs() < 1e-9);
    assert_eq!(line(3).mem_timeline.len(), LINE_TIMELINE_SLICES);
    assert!((line(3).mem_timeline.last().unwrap() - 60.0).abs() < 1e-9);
    let m = p.memory.unwrap();
    assert_eq!(m.leaks.len(), 1);
    assert_eq!(m.leaks[0].line, 3);
    assert!(m.leaks[0].growth_mb_s > 0.0);
    assert!((m.peak_mb - 60.0).abs() < 1e-9);
}

#[test]
fn timelines_stay_bounded() {
    let mut agg = MemoryAggregator::new();
    for i in 0..(3 * MAX_POINTS as u64) {
        agg.footprint_at(i, i as i64);
    }
    assert!(agg.footprint.0.len() <= MAX_POINTS);
    // The highest value survives decimation.
    assert_eq!(
        agg.footprint.0.last().unwrap().1,
        (3 * MAX_POINTS - 1) as f64
    );
}
