//! The ledger over made-up positions and samples whose truth is known.

use super::*;

const T0: u64 = 1_000_000_000_000;
const MS: u64 = 1000;

fn frames(line: u32) -> Arc<[Frame]> {
    vec![Frame {
        function: "f".into(),
        filename: "/app.py".into(),
        line: Some(line),
        native: false,
    }]
    .into()
}

/// A position of a thread that used `busy` of the 10 ms since its previous sample on a CPU.
fn pos(t_ms: u64, pid: i32, tid: i32, line: u32, busy: bool) -> Position {
    let f = frames(line);
    Position {
        t_us: T0 + t_ms * MS,
        pid,
        tid,
        charged: f.first().cloned(),
        frames: f,
        cpu_s: if busy { 0.01 } else { 0.0 },
        interval_us: 10 * MS,
    }
}

fn started() -> Report {
    Report::Started {
        devices: vec![DeviceInfo {
            index: 0,
            name: "Fake GPU 0".into(),
            uuid: "GPU-fake-0".into(),
        }],
        driver: Some("1.0".into()),
    }
}

/// A utilization sample of process `pid` on device 0 at `t_us` (µs since the epoch).
fn sample(pid: u32, t_us: u64, sm_pct: u32) -> UtilSample {
    UtilSample {
        device: 0,
        pid,
        t_us,
        sm_pct,
    }
}

/// A poll read `at_ms` after T0 that brought `util` and nothing else.
fn poll_of(at_ms: u64, util: Vec<UtilSample>) -> Report {
    Report::Poll {
        at_us: T0 + at_ms * MS,
        util,
        mem: Vec::new(),
        device_busy: Vec::new(),
    }
}

/// A poll read `at_ms` after T0: samples (pid, ms after T0, SM %), memory (pid, MiB).
fn poll(at_ms: u64, util: &[(u32, u64, u32)], mem: &[(u32, f64)]) -> Report {
    Report::Poll {
        at_us: T0 + at_ms * MS,
        util: util
            .iter()
            .map(|&(pid, t_ms, sm)| sample(pid, T0 + t_ms * MS, sm))
            .collect(),
        mem: mem
            .iter()
            .map(|&(pid, mib)| MemReading {
                device: 0,
                pid,
                mib,
            })
            .collect(),
        device_busy: vec![(0, 100)],
    }
}

fn line_pct(r: &GpuResult, line: u32) -> f64 {
    r.lines
        .get(&(crate::profile::Name::new("/app.py"), line))
        .map_or(0.0, |g| g.gpu_pct)
}

/// Line 10 runs for 2 s with the process at 80%, then line 20 for 2 s at 0%, while
/// process 99 (not ours) is at 100% throughout; samples every 200 ms.
fn two_phases(ledger: &mut Ledger) {
    ledger.take(vec![started()]);
    let mut positions = Vec::new();
    for t in (0..4000).step_by(10) {
        positions.push(pos(t, 7, 7, if t <= 2000 { 10 } else { 20 }, true));
    }
    ledger.add_positions(positions);
    let mut k = 0;
    for t in (200..=4000).step_by(200) {
        let ours = if t <= 2000 { 80 } else { 0 };
        let mut util = vec![(99, t, 100)];
        if ours > 0 {
            util.push((7, t, ours));
        }
        let mem = if t >= 3000 { 4096.0 } else { 512.0 };
        ledger.take(vec![poll(t + 5, &util, &[(7, mem), (99, 9000.0)])]);
        k += 1;
    }
    assert_eq!(k, 20);
}

#[test]
fn gpu_time_goes_where_the_process_was_and_never_to_another_process() {
    let mut l = Ledger::new(T0);
    l.add_ours([(7, Some(T0))]);
    two_phases(&mut l);
    let r = l.finish(T0 + 4100 * MS, true);
    assert!(
        r.summary.unavailable.is_none(),
        "{:?}",
        r.summary.unavailable
    );
    // 80% of 2 s = 1.6 GPU-seconds, all on line 10 (the first sample's window starts at the
    // recording's start).
    assert!((r.summary.gpu_s - 1.6).abs() < 1e-9, "{}", r.summary.gpu_s);
    assert!((line_pct(&r, 10) - 100.0).abs() < 1e-6);
    assert_eq!(line_pct(&r, 20), 0.0);
    assert_eq!(r.summary.other_process_samples, 20);
    // Memory: the process held 4096 MiB only while line 20 ran; 9000 is another's.
    let m = |line: u32| r.lines[&(crate::profile::Name::new("/app.py"), line)].gpu_mem_peak_mb;
    assert_eq!(m(10), 512.0);
    assert_eq!(m(20), 4096.0);
    assert_eq!(r.summary.mem_peak_mb, 4096.0);
    assert!((r.procs[&7].0 - 100.0).abs() < 1e-9 && r.procs[&7].1 == 4096.0);
    assert!(!r.summary.timeline.is_empty());
    let busy_first: f64 = r.summary.timeline[..5].iter().map(|p| p[1]).sum::<f64>() / 5.0;
    assert!((busy_first - 80.0).abs() < 1.0, "{busy_first}");
}

/// One second of process 7 at 50%: its main thread (7) on line 10, busy or not, and thread
/// 8 on line 30, `pool` deciding each of its positions.
fn main_and_pool(main_busy: bool, pool: impl Fn(u64, Position) -> Position) -> GpuResult {
    let mut l = Ledger::new(T0);
    l.take(vec![started()]);
    l.add_ours([(7, Some(T0))]);
    let mut positions = Vec::new();
    for t in (0..1000).step_by(10) {
        positions.push(pos(t, 7, 7, 10, main_busy));
        positions.push(pool(t, pos(t, 7, 8, 30, false)));
    }
    l.add_positions(positions);
    for t in (200..=1000).step_by(200) {
        l.take(vec![poll(t + 1, &[(7, t, 50)], &[])]);
    }
    l.finish(T0 + 1000 * MS, true)
}

#[test]
fn a_thread_idle_through_a_window_is_left_out_while_another_runs() {
    let r = main_and_pool(true, |_, p| p);
    assert!((line_pct(&r, 10) - 100.0).abs() < 1e-6);
    assert_eq!(line_pct(&r, 30), 0.0);
    // Stacks keep their thread.
    assert!(r.summary.stacks.iter().all(|s| s.native_id == Some(7)));
}

#[test]
fn when_every_thread_waits_the_main_thread_is_charged() {
    let r = main_and_pool(false, |_, p| p);
    // Thread 7 is process 7's main thread.
    assert!((line_pct(&r, 10) - 100.0).abs() < 1e-6);
    assert_eq!(line_pct(&r, 30), 0.0);
}

#[test]
fn a_thread_that_wakes_now_and_then_gets_its_cpu_share_only() {
    // Seen running at every fifth tick, having used 0.1 ms.
    let r = main_and_pool(true, |t, mut p| {
        if t % 50 == 0 {
            p.cpu_s = 0.0001;
        }
        p
    });
    assert!(line_pct(&r, 30) < 0.5, "{}", line_pct(&r, 30));
}

#[test]
fn a_gap_between_samples_is_not_smeared_over() {
    // One sample at 1 s after none since 0.2 s, so it stands for one period, not 0.8 s.
    let mut l = line_10_then_20(1000, 1000);
    l.take(vec![poll(201, &[(7, 200, 100)], &[])]);
    l.take(vec![poll(401, &[(7, 400, 100)], &[])]);
    l.take(vec![poll(1001, &[(7, 1000, 100)], &[])]);
    let r = l.finish(T0 + 1000 * MS, true);
    assert!((r.summary.gpu_s - 0.6).abs() < 1e-9, "{}", r.summary.gpu_s);
}

#[test]
fn a_clock_that_differs_is_corrected_and_said() {
    let skew = 3600 * 1000; // NVML an hour ahead
    let mut l = line_10_then_20(990, 2000);
    for t in (200..=2000).step_by(200) {
        let sm = if t <= 1000 { 100 } else { 0 };
        let util: Vec<(u32, u64, u32)> = if sm > 0 {
            vec![(7, t + skew, sm)]
        } else {
            vec![]
        };
        l.take(vec![poll(t + 2, &util, &[])]);
    }
    let r = l.finish(T0 + 2000 * MS, true);
    assert!(
        r.summary.notes.iter().any(|n| n.contains("clock")),
        "{:?}",
        r.summary.notes
    );
    assert!(
        (line_pct(&r, 10) - 100.0).abs() < 1.0,
        "{}",
        line_pct(&r, 10)
    );
}

#[test]
fn why_there_are_no_figures() {
    let mut l = Ledger::new(T0);
    l.take(vec![Report::Unavailable("NVML found no GPU".into())]);
    let r = l.finish(T0 + MS, true);
    assert_eq!(r.summary.unavailable.as_deref(), Some("NVML found no GPU"));
    assert!(!r.summary.has_data());

    let mut l = Ledger::new(T0);
    l.take(vec![started()]);
    l.add_ours([(7, Some(T0))]);
    l.take(vec![poll(100, &[(99, 90, 100)], &[(99, 100.0)])]);
    let r = l.finish(T0 + 200 * MS, true);
    let why = r.summary.unavailable.unwrap();
    assert!(
        why.contains("used no GPU") && why.contains("other processes"),
        "{why}"
    );

    // Failed mid-run, so the figures up to then stay, with a note.
    let mut l = Ledger::new(T0);
    l.add_ours([(7, Some(T0))]);
    two_phases(&mut l);
    l.take(vec![Report::Failed {
        at_us: T0 + 4050 * MS,
        why: "NVML failed: GPU lost".into(),
    }]);
    let r = l.finish(T0 + 5000 * MS, true);
    assert!(r.summary.has_data());
    assert!(r.summary.notes.iter().any(|n| n.contains("GPU lost")));

    // The poller never answered the stop.
    let mut l = Ledger::new(T0);
    l.add_ours([(7, Some(T0))]);
    two_phases(&mut l);
    let r = l.finish(T0 + 5000 * MS, false);
    assert!(r.summary.notes.iter().any(|n| n.contains("did not answer")));
}

#[test]
fn history_arriving_late_is_not_taken_for_a_clock_difference() {
    let mut l = Ledger::new(T0 + 5000 * MS);
    l.take(vec![started()]);
    l.add_ours([(7, Some(T0))]);
    l.add_positions(
        (5000..7000)
            .step_by(10)
            .map(|t| pos(t, 7, 7, 10, true))
            .collect(),
    );
    // Two answers without samples, then NVML's history (another process, 4 s old), then
    // fresh samples of ours.
    l.take(vec![poll(5100, &[], &[]), poll(5200, &[], &[])]);
    l.take(vec![poll(5300, &[(99, 1000, 50), (99, 1200, 50)], &[])]);
    for t in (5400..=7000).step_by(200) {
        l.take(vec![poll(t + 3, &[(7, t, 100)], &[])]);
    }
    let r = l.finish(T0 + 7000 * MS, true);
    assert!(r.summary.notes.is_empty(), "{:?}", r.summary.notes);
    assert!((line_pct(&r, 10) - 100.0).abs() < 1e-6);
    assert_eq!(r.summary.unattributed_s, 0.0);
}

/// A ledger of process 7 (started at T0) whose main thread, busy, is on line 10 up to
/// `switch_ms` and on line 20 after it, up to `end_ms`.
fn line_10_then_20(switch_ms: u64, end_ms: u64) -> Ledger {
    let mut l = Ledger::new(T0);
    l.take(vec![started()]);
    l.add_ours([(7, Some(T0))]);
    l.add_positions(
        (0..end_ms)
            .step_by(10)
            .map(|t| pos(t, 7, 7, if t <= switch_ms { 10 } else { 20 }, true))
            .collect(),
    );
    l
}

#[test]
fn memory_read_just_after_a_line_changed_goes_to_the_new_line() {
    // Line 10 until 2000 ms, then line 20, which allocates at once.
    let mut l = line_10_then_20(2000, 3000);
    l.take(vec![poll(1900, &[], &[(7, 512.0)])]);
    // Read 1 ms after the last position on line 10. The memory was there by then.
    l.take(vec![poll(2001, &[], &[(7, 4096.0)])]);
    let r = l.finish(T0 + 3000 * MS, true);
    let m = |line: u32| r.lines[&(crate::profile::Name::new("/app.py"), line)].gpu_mem_peak_mb;
    assert_eq!(m(10), 512.0);
    assert_eq!(m(20), 4096.0);
}

#[test]
fn a_clock_behind_ours_is_corrected_too() {
    let behind = 3600 * 1000;
    let mut l = line_10_then_20(1000, 1000);
    for t in (200..=1000).step_by(200) {
        let s = sample(7, T0 + t * MS - behind * MS, 100);
        l.take(vec![poll_of(t + 2, vec![s])]);
    }
    let r = l.finish(T0 + 1000 * MS, true);
    assert!(
        r.summary.notes.iter().any(|n| n.contains("3600.0 s")),
        "{:?}",
        r.summary.notes
    );
    assert!((line_pct(&r, 10) - 100.0).abs() < 1e-6);
    assert!((r.summary.gpu_s - 1.0).abs() < 0.01, "{}", r.summary.gpu_s);
}

/// What an H200 (driver 580) answered for a process just started. Its first sample
/// carries the time of the device's previous sample, 8 s before the process existed. The
/// next ones come every 200 ms. Nothing is charged to the lines before the GPU work, and
/// the clock is right.
#[test]
fn a_new_process_s_first_sample_from_before_it_existed_is_passed_over() {
    let mut l = line_10_then_20(3000, 6000);
    l.take(vec![poll_of(2900, vec![sample(7, T0 - 8000 * MS, 44)])]);
    for t in (3200..=6000).step_by(200) {
        l.take(vec![poll(t + 90, &[(7, t, 99)], &[])]);
    }
    let r = l.finish(T0 + 6100 * MS, true);
    assert!(r.summary.notes.is_empty(), "{:?}", r.summary.notes);
    assert_eq!(line_pct(&r, 10), 0.0);
    assert!(
        (r.summary.gpu_s - 0.99 * 3.0).abs() < 1e-6,
        "{}",
        r.summary.gpu_s
    );
}

/// Process 7 on the GPU at 80% from the recording's start, its first position (line 10)
/// only at `first_ms`, then one every 10 ms to 1 s; polls every 200 ms arrive before any
/// position is taken (as on a loaded machine, where the sampler's first reading of a
/// program that starts on the GPU comes late).
fn late_first_position(first_ms: u64) -> GpuResult {
    let mut l = Ledger::new(T0);
    l.take(vec![started()]);
    l.add_ours([(7, Some(T0))]);
    for t in (200..=400).step_by(200) {
        l.take(vec![poll(t + 1, &[(7, t, 80)], &[])]);
    }
    let positions = (first_ms..1000)
        .step_by(10)
        .map(|t| pos(t, 7, 7, 10, true))
        .collect();
    l.add_positions(positions);
    for t in (600..=1000).step_by(200) {
        l.take(vec![poll(t + 1, &[(7, t, 80)], &[])]);
    }
    l.finish(T0 + 1000 * MS, true)
}

/// GPU time from before a process's first position goes where its threads were first
/// seen after it (0.1-0.35 s of a 1.2-GPU-second fixture went to no line on a loaded
/// machine); when that is more than a second later, to no line.
#[test]
fn gpu_time_before_the_first_position_goes_where_the_program_went_next() {
    let r = late_first_position(450);
    assert!((r.summary.gpu_s - 0.8).abs() < 1e-9, "{}", r.summary.gpu_s);
    assert_eq!(r.summary.unattributed_s, 0.0);
    assert!((line_pct(&r, 10) - 100.0).abs() < 1e-6);
    let r = late_first_position(990);
    assert!(
        r.summary.unattributed_s == 0.0,
        "{}",
        r.summary.unattributed_s
    );
    // No position within a second after the first two windows, so no line for them.
    let mut l = Ledger::new(T0);
    l.take(vec![started()]);
    l.add_ours([(7, Some(T0))]);
    l.take(vec![poll(201, &[(7, 200, 80)], &[])]);
    l.add_positions(vec![pos(1500, 7, 7, 10, true)]);
    let r = l.finish(T0 + 1600 * MS, true);
    assert!(
        (r.summary.unattributed_s - 0.16).abs() < 1e-9,
        "{}",
        r.summary.unattributed_s
    );
    assert_eq!(line_pct(&r, 10), 0.0);
}
