use super::*;

#[test]
fn decimal() {
    let mut b = [0u8; 12];
    assert_eq!(write_decimal(&mut b, 0), 1);
    assert_eq!(&b[..1], b"0");
    assert_eq!(write_decimal(&mut b, 4194304), 7);
    assert_eq!(&b[..7], b"4194304");
    assert_eq!(write_decimal(&mut b, u32::MAX), 10);
    assert_eq!(&b[..10], b"4294967295");
}

/// The tests that set the library's process-wide state (its ring's path, its ring).
static GLOBALS: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Sets the library up as `run` would, with this process as the profiler, a ring of
/// 256 slots and a profiler's ring path of its own (`tag`). It gives that path and our pid.
fn as_if_run_by_us(tag: &str) -> (std::path::PathBuf, i32) {
    let main = std::env::temp_dir().join(format!(
        "scalene-rs-preload-{tag}-{}.ring",
        std::process::id()
    ));
    remember_path(main.as_os_str().as_encoded_bytes());
    CAPACITY.store(256, Ordering::Relaxed);
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    CONSUMER.store(pid, Ordering::Relaxed);
    (main, pid)
}

/// A profiler that answers nothing for 16 handshakes in a row, yet is there, is waited
/// for no more (the 17th event is sent without waiting); once it has read every event
/// written up to then and the back-off has passed, an event waits again and gets its
/// answer.
#[test]
fn waiting_stops_for_a_profiler_too_slow_and_starts_again_when_it_caught_up() {
    let _g = GLOBALS.lock().unwrap_or_else(|e| e.into_inner());
    // The "profiler" is this process. It is there, and answers nothing.
    let (main, pid) = as_if_run_by_us("slow");
    let (hdr, bytes) = make_own_ring().expect("made");
    // SAFETY: the mapping just made; it stays until the end of the test.
    let h: &'static Header = unsafe { &*hdr };
    h.handshake.store(layout::HANDSHAKE_ON, Ordering::Release);
    RING.store(hdr, Ordering::Release);
    let took = |wait: bool| {
        let t = std::time::Instant::now();
        let answered = emit(layout::EV_ALLOC, 1, 1, 1, 0, 0, wait);
        (answered, t.elapsed())
    };
    let bound = std::time::Duration::from_nanos(HANDSHAKE_WAIT_NS as u64);
    for i in 0..MAX_TIMEOUTS_IN_A_ROW {
        let (answered, waited) = took(true);
        assert!(
            !answered && waited >= bound,
            "wait {i}: {answered} {waited:?}"
        );
    }
    let (answered, waited) = took(true);
    assert!(
        !answered && waited < bound / 5,
        "not waited for: {waited:?}"
    );
    // It reads everything up to now, and the back-off passes.
    h.tail
        .store(h.head.load(Ordering::Acquire), Ordering::Release);
    std::thread::sleep(std::time::Duration::from_nanos(RESUME_AFTER_NS));
    let want = h.head.load(Ordering::Acquire);
    let answer = std::thread::spawn(move || {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while std::time::Instant::now() < deadline {
            // SAFETY: the ring's mapping holds `capacity` slots.
            let s = unsafe { h.slot(want) };
            if h.head.load(Ordering::Acquire) > want && s.wants_ack.load(Ordering::Acquire) == 1 {
                s.ack.store(1, Ordering::Release);
                return true;
            }
            std::thread::yield_now();
        }
        false
    });
    let (answered, waited) = took(true);
    // The event asked to be waited for (the answering thread saw `wants_ack`), so waiting
    // started again. Whether the answer came within the bound depends on when that
    // thread got a CPU (on a loaded machine it may not within 5 ms). When it did not, the
    // event must have waited the whole bound.
    assert!(answer.join().unwrap(), "waiting did not start again");
    assert!(
        answered || waited >= bound,
        "neither answered nor waited: {waited:?}"
    );
    RING.store(core::ptr::null_mut(), Ordering::Release);
    WAIT.store(true, Ordering::Relaxed);
    SLOW_SINCE_NS.store(0, Ordering::Relaxed);
    SLOW_STOPS.store(0, Ordering::Relaxed);
    TIMEOUTS.store(0, Ordering::Relaxed);
    // SAFETY: unmapping what make_own_ring mapped; nothing refers to it any more.
    unsafe { libc::munmap(hdr as *mut libc::c_void, bytes) };
    let _ = std::fs::remove_file(format!("{}.{pid}", main.display()));
}

/// The ring a process makes for itself: `<profiler's ring>.<pid>`, private, sized for
/// its slots, its header complete and claimed by us. A stale file at that name (a
/// process that had our pid before, our own image before an exec) is replaced.
#[test]
fn own_ring_is_made_like_the_profilers() {
    let _g = GLOBALS.lock().unwrap_or_else(|e| e.into_inner());
    use std::os::unix::fs::MetadataExt;
    let (main, pid) = as_if_run_by_us("test");
    let own = std::path::PathBuf::from(format!("{}.{pid}", main.display()));
    std::fs::write(&own, b"stale").unwrap();
    let (hdr, bytes) = make_own_ring().expect("made");
    let meta = std::fs::metadata(&own).unwrap();
    assert_eq!(meta.mode() & 0o777, 0o600);
    assert_eq!(meta.len() as usize, layout::file_bytes(256));
    assert_eq!(bytes, layout::file_bytes(256));
    // SAFETY: the mapping just made.
    let h = unsafe { &*hdr };
    assert_eq!(h.magic.load(Ordering::Relaxed), layout::MAGIC);
    assert_eq!(h.version.load(Ordering::Relaxed), layout::LAYOUT_VERSION);
    assert_eq!(h.capacity.load(Ordering::Relaxed), 256);
    assert_eq!(h.producer_pid.load(Ordering::Relaxed), pid);
    assert_eq!(h.consumer_pid.load(Ordering::Relaxed), pid);
    assert_eq!(
        h.handshake.load(Ordering::Relaxed),
        layout::HANDSHAKE_STARTING
    );
    assert_eq!(
        h.window.load(Ordering::Relaxed),
        WINDOW.load(Ordering::Relaxed)
    );
    // SAFETY: unmapping what make_own_ring mapped.
    unsafe { libc::munmap(hdr as *mut libc::c_void, bytes) };
    std::fs::remove_file(&own).unwrap();
    // A symbolic link at the name is never followed nor removed.
    std::os::unix::fs::symlink("/nonexistent", &own).unwrap();
    assert!(make_own_ring().is_none());
    assert!(std::fs::symlink_metadata(&own)
        .unwrap()
        .file_type()
        .is_symlink());
    std::fs::remove_file(&own).unwrap();
}
