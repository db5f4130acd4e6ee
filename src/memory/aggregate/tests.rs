use super::*;
use crate::memory::ring::layout::{EV_ALLOC, EV_COPY, EV_SAMPLED_FREE, EV_SAMPLED_MOVE};

fn ev(kind: u32, a: u64, b: u64, c: u64, ptr: u64, t: u64) -> Event {
    Event {
        what: What::decode(kind, a, b, c, ptr),
        tid: 1,
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

#[test]
fn processes_merge_lines_and_footprints_over_time() {
    let ms = 1_000_000u64;
    // Process A keeps 4 windows on line 3 from 0 to 10 ms and ends at 30 ms; process B
    // keeps 2 windows on line 3 and 1 on line 5 from 20 ms, and ends at 50 ms.
    let mut a = MemoryAggregator::new();
    for i in 0..4u64 {
        a.add(&ev(EV_ALLOC, M, M, M, 0x1000 + i, i * ms), key(3));
        a.footprint_at(i * ms, ((i + 1) * M) as i64);
    }
    let mut b = MemoryAggregator::new();
    for i in 0..2u64 {
        b.add(&ev(EV_ALLOC, M, M, 0, 0x1000 + i, 20 * ms + i * ms), key(3));
        b.footprint_at(20 * ms + i * ms, ((i + 1) * M) as i64);
    }
    b.add(&ev(EV_ALLOC, M, M, 0, 0x2000, 25 * ms), key(5));
    b.footprint_at(25 * ms, (3 * M) as i64);
    let ta = RingTotals {
        peak_bytes: (4 * M) as i64,
        dropped: 1,
        ..Default::default()
    };
    let tb = RingTotals {
        peak_bytes: (3 * M) as i64,
        handshake_timeouts: 2,
        ..Default::default()
    };
    let (m, t) = MemoryAggregator::merge_processes(
        vec![(a, ta, 30 * ms), (b, tb, 50 * ms)],
        RingTotals::default(),
    );
    // Both alive from 20 to 30 ms: 4 + 3 MiB at the top; the sums of the counters.
    assert_eq!(t.peak_bytes, (7 * M) as i64);
    assert_eq!((t.dropped, t.handshake_timeouts), (1, 2));
    assert_eq!(m.alloc_bytes(), (7 * M) as f64);
    let mut p = profile();
    m.merge_into(&mut p, t, &mut |_| None);
    let line = |n: u32| {
        p.files[0]
            .lines
            .iter()
            .find(|l| l.line == n)
            .unwrap()
            .memory
            .clone()
            .unwrap()
    };
    // Line 3: 4 + 2 windows; live together 4 + 2 MiB (A's bytes go when A ends at 30 ms).
    assert!((line(3).mem_alloc_mb - 6.0).abs() < 1e-9);
    assert!((line(3).mem_peak_mb - 6.0).abs() < 1e-9);
    assert!((line(3).mem_python_pct - 100.0 * 4.0 / 6.0).abs() < 1e-9);
    assert!((line(5).mem_peak_mb - 1.0).abs() < 1e-9);
    let mem = p.memory.as_ref().unwrap();
    assert!((mem.peak_mb - 7.0).abs() < 1e-9);
    // The program's footprint: A's 4 MiB until 30 ms, B's 3 then, nothing after 50 ms.
    let at = |s: f64| {
        mem.timeline
            .iter()
            .take_while(|p| p[0] <= s + 1e-12)
            .last()
            .map_or(0.0, |p| p[1])
    };
    assert_eq!(at(0.010), 4.0);
    assert_eq!(at(0.026), 7.0);
    assert_eq!(at(0.035), 3.0);
    assert_eq!(at(0.060), 0.0);
}

#[test]
fn one_process_merges_unchanged_and_none_is_empty() {
    let mut a = MemoryAggregator::new();
    a.add(&ev(EV_ALLOC, M, M, M, 0x1000, 5), key(3));
    a.footprint_at(5, M as i64);
    let t = RingTotals {
        peak_bytes: 9 * M as i64,
        ..Default::default()
    };
    let (m, t2) = MemoryAggregator::merge_processes(vec![(a, t, 100)], RingTotals::default());
    assert_eq!(t2.peak_bytes, t.peak_bytes);
    assert_eq!(m.footprint.0, vec![(5, M as f64)]);
    let defaults = RingTotals {
        window: 77,
        ..Default::default()
    };
    let (m, t3) = MemoryAggregator::merge_processes(Vec::new(), defaults);
    assert_eq!(m.alloc_bytes(), 0.0);
    assert_eq!(t3.window, 77);
}

#[test]
fn a_watched_block_moved_by_realloc_stays_live_until_its_new_address_is_freed() {
    let mut agg = MemoryAggregator::new();
    let line = key(3).unwrap();
    agg.add(&ev(EV_ALLOC, M, M, M, 0x10, 1), key(3));
    agg.add(&ev(EV_SAMPLED_MOVE, 0x20, 0, 0, 0x10, 2), None);
    // The old address is nobody's now (its free is pymalloc reusing the slot, say).
    agg.add(&ev(EV_SAMPLED_FREE, 0, 0, 0, 0x10, 3), None);
    assert_eq!(agg.lines[&line].current, M as f64);
    agg.add(&ev(EV_SAMPLED_FREE, 0, 0, 0, 0x20, 4), None);
    assert_eq!(agg.lines[&line].current, 0.0);
    assert_eq!(agg.lines[&line].peak, M as f64);
    // A move of a block that is not watched changes nothing.
    agg.add(&ev(EV_SAMPLED_MOVE, 0x40, 0, 0, 0x30, 5), None);
    assert!(agg.watched.is_empty());
}

/// An event's time is the program's to write: one at `u64::MAX` after others near 0 makes
/// a recording that spans the whole clock, sliced without overflowing.
#[test]
fn an_event_time_at_the_end_of_the_clock_slices_the_timeline() {
    let mut agg = MemoryAggregator::new();
    agg.add(&ev(EV_ALLOC, M, M, 0, 0x1000, 1), key(3));
    agg.add(&ev(EV_ALLOC, M, M, 0, 0x2000, u64::MAX), key(3));
    let mut p = profile();
    agg.merge_into(&mut p, RingTotals::default(), &mut |_| None);
    let mem = p.files[0].lines[0].memory.clone().unwrap();
    assert_eq!(mem.mem_timeline.len(), LINE_TIMELINE_SLICES);
    assert!((mem.mem_timeline[0] - 1.0).abs() < 1e-9);
    assert!((mem.mem_timeline.last().unwrap() - 2.0).abs() < 1e-9);
}

/// The rings' counters are the programs' to write: garbage in one process's adds up to at
/// most `u64::MAX` with the others'.
#[test]
fn ring_counters_near_the_top_add_up_without_overflow() {
    let torn = RingTotals {
        dropped: u64::MAX,
        handshake_timeouts: u64::MAX - 1,
        handshake_wait_ns: u64::MAX,
        ..Default::default()
    };
    let some = RingTotals {
        dropped: 3,
        handshake_timeouts: 3,
        handshake_wait_ns: 3,
        ..Default::default()
    };
    let (_, t) = MemoryAggregator::merge_processes(
        vec![
            (MemoryAggregator::new(), torn, 10),
            (MemoryAggregator::new(), some, 10),
        ],
        RingTotals::default(),
    );
    assert_eq!(
        (t.dropped, t.handshake_timeouts, t.handshake_wait_ns),
        (u64::MAX, u64::MAX, u64::MAX)
    );
}

/// Blocks of at least a window (`EV_ALLOC_LARGE`) are summed, with those charged without
/// a stack of their own apart; other events are not counted there.
#[test]
fn large_blocks_without_their_own_stack_are_said() {
    use crate::memory::ring::layout::EV_ALLOC_LARGE;
    let mut agg = MemoryAggregator::new();
    for i in 0..4u64 {
        let e = ev(EV_ALLOC_LARGE, 8 * M, 8 * M, 8 * M, 0, i);
        agg.add(&e, key(3));
        agg.note_stack_of_large(&e, i != 2);
    }
    let small = ev(EV_ALLOC, M, M, M, 0, 9);
    agg.add(&small, key(5));
    agg.note_stack_of_large(&small, false);
    let mut p = profile();
    agg.merge_into(&mut p, RingTotals::default(), &mut |_| None);
    let m = p.memory.unwrap();
    assert_eq!(m.large_alloc_mb, 32.0);
    assert_eq!(m.large_alloc_without_own_stack_mb, 8.0);
    assert_eq!(m.large_allocs_without_own_stack, 1);
}
