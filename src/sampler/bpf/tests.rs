//! The BPF totals against /proc's, on threads of this test process.

use super::*;
use crate::sampler::cputime::ThreadFiles;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn gettid() -> i32 {
    // SAFETY: gettid takes no arguments and cannot fail.
    unsafe { libc::syscall(libc::SYS_gettid) as i32 }
}

fn attach_here() -> Option<BpfCpu> {
    match BpfCpu::attach(std::process::id() as i32) {
        Ok(b) => Some(b),
        Err(why) => {
            eprintln!("BPF unavailable here ({why}): skipped");
            None
        }
    }
}

/// Starts a thread running `body` and returns its kernel id.
fn spawn(stop: &Arc<AtomicBool>, body: fn(&AtomicBool)) -> (i32, std::thread::JoinHandle<()>) {
    let tid = Arc::new(AtomicI32::new(0));
    let (t, s) = (tid.clone(), stop.clone());
    let h = std::thread::spawn(move || {
        t.store(gettid(), Ordering::SeqCst);
        body(&s);
    });
    while tid.load(Ordering::SeqCst) == 0 {
        std::thread::yield_now();
    }
    (tid.load(Ordering::SeqCst), h)
}

fn busy(stop: &AtomicBool) {
    let mut x = 0u64;
    while !stop.load(Ordering::Relaxed) {
        x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
    }
}

fn sleepy(stop: &AtomicBool) {
    while !stop.load(Ordering::Relaxed) {
        let t = Instant::now();
        while t.elapsed() < Duration::from_micros(300) {
            std::hint::black_box(0);
        }
        std::thread::sleep(Duration::from_millis(3));
    }
}

fn parked(stop: &AtomicBool) {
    let (_tx, rx) = std::sync::mpsc::channel::<()>();
    let _ = rx.recv_timeout(Duration::from_secs(30));
    let _ = stop;
}

#[test]
fn totals_agree_with_schedstat() {
    let Some(mut bpf) = attach_here() else { return };
    let pid = std::process::id() as i32;
    let stop = Arc::new(AtomicBool::new(false));
    let (b, hb) = spawn(&stop, busy);
    let (s, hs) = spawn(&stop, sleepy);
    let mut files = ThreadFiles::new();
    let mut first = IdMap::default();
    for tid in [b, s] {
        first.insert(tid, bpf.total(pid, tid, &mut files).unwrap());
    }
    for _ in 0..20 {
        std::thread::sleep(Duration::from_millis(15));
        let before = [b, s].map(|tid| files.read_sched(pid, tid).unwrap());
        assert!(bpf.drain(), "records lost");
        for (tid, before) in [b, s].into_iter().zip(before) {
            let ours = bpf.total(pid, tid, &mut files).unwrap();
            let after = files.read_sched(pid, tid).unwrap();
            // Both ways to the same total: the program's between the scheduler's counts
            // read just before the drain and just after, within a millisecond (and 2%).
            // Not "within a millisecond of the count read after": this test's thread can
            // be switched out between two reads (two cores, the other tests beside it), and
            // the busy thread runs meanwhile (CI: bpf 100.19 ms, /proc 105.53 ms read next).
            let slack = 1_000_000 + (after - first[&tid]) / 50;
            assert!(
                before <= ours + slack && ours <= after + slack,
                "thread {tid}: /proc before {before}, bpf {ours}, /proc after {after}"
            );
        }
    }
    assert!(bpf.has_record(s), "the sleeping thread was switched");
    stop.store(true, Ordering::SeqCst);
    hb.join().unwrap();
    hs.join().unwrap();
}

#[test]
fn parked_thread_writes_no_record() {
    let Some(mut bpf) = attach_here() else { return };
    let stop = Arc::new(AtomicBool::new(false));
    let (p, _h) = spawn(&stop, parked);
    // Let it reach its wait (its last switch-out may be recorded), then forget that.
    std::thread::sleep(Duration::from_millis(50));
    bpf.drain();
    bpf.threads.clear();
    std::thread::sleep(Duration::from_millis(200));
    assert!(bpf.drain());
    assert!(!bpf.has_record(p), "a parked thread was switched");
    // While this thread, which runs, was.
    let me = gettid();
    let t = Instant::now();
    while t.elapsed() < Duration::from_millis(5) {
        std::hint::black_box(0);
    }
    std::thread::sleep(Duration::from_millis(2));
    bpf.drain();
    assert!(bpf.has_record(me));
}

#[test]
fn the_last_record_of_a_thread_wins() {
    let mut threads = IdMap::default();
    let rec = |tid, switch_in, run_ns| prog::Record {
        tid,
        switch_in,
        run_ns,
    };
    apply(&mut threads, rec(5, true, 100));
    assert!(threads[&5].on_cpu);
    apply(&mut threads, rec(5, false, 250));
    assert!(!threads[&5].on_cpu && threads[&5].run_ns == 250);
    apply(&mut threads, rec(6, false, 7));
    assert_eq!(threads.len(), 2);
}
