//! Ring tests. The producer protocol is the library's own (`layout.rs`), driven here from
//! threads of the test process.

use super::*;
use layout::EventData;
use std::os::unix::fs::OpenOptionsExt;

fn ring(cap: u64) -> Ring {
    Ring::create(&std::env::temp_dir(), cap, 1 << 20, 1 << 20).unwrap()
}

fn produce(r: &Ring, a: u64, wants_ack: bool) -> bool {
    let h = r.header();
    match h.reserve() {
        Some(t) => {
            // SAFETY: the ring's mapping holds `capacity` slots.
            let s = unsafe { h.slot(t) };
            s.publish(
                t,
                &EventData {
                    kind: layout::EV_ALLOC,
                    tid: 7,
                    a,
                    wants_ack,
                    ..Default::default()
                },
            );
            true
        }
        None => false,
    }
}

#[test]
fn file_is_private_and_removed() {
    let r = ring(8);
    let meta = std::fs::metadata(r.path()).unwrap();
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    assert_eq!(meta.len() as usize, layout::file_bytes(8));
    let path = r.path().to_path_buf();
    // A second ring never reuses a name (O_EXCL would fail on an existing file).
    let r2 = ring(8);
    assert_ne!(r2.path(), path);
    drop(r);
    assert!(!path.exists());
}

#[test]
fn events_come_in_order_across_wraps() {
    let mut r = ring(8);
    for i in 0..100u64 {
        assert!(produce(&r, i, false));
        if i % 3 == 2 {
            // Read in bursts, so the ring wraps with several events pending.
            while let Some(e) = r.next_event() {
                assert_eq!(seq(&e), e.ticket);
            }
        }
    }
    let mut last = None;
    while let Some(e) = r.next_event() {
        last = Some(seq(&e));
    }
    assert_eq!(last, Some(99));
    assert_eq!(r.dropped(), 0);
    assert!(r.header().head.load(Ordering::Relaxed) > 8);
}

#[test]
fn full_ring_drops_and_counts() {
    let mut r = ring(8);
    for i in 0..8 {
        assert!(produce(&r, i, false));
    }
    assert!(!produce(&r, 8, false));
    assert!(!produce(&r, 9, false));
    assert_eq!(r.dropped(), 2);
    assert_eq!(r.next_event().map(|e| seq(&e)), Some(0));
    assert!(produce(&r, 10, false));
    let rest: Vec<u64> = std::iter::from_fn(|| r.next_event())
        .map(|e| seq(&e))
        .collect();
    assert_eq!(rest, vec![1, 2, 3, 4, 5, 6, 7, 10]);
}

#[test]
fn an_event_waiting_for_its_answer_keeps_its_slot() {
    let mut r = ring(8);
    assert!(produce(&r, 1, true));
    assert!(produce(&r, 2, false));
    let e = r.next_event().unwrap();
    assert!(e.wants_ack);
    // Not answered, so the same event comes again, and its slot is not free.
    assert_eq!(r.next_event().map(|e| e.ticket), Some(e.ticket));
    assert_eq!(r.header().tail.load(Ordering::Relaxed), 0);
    r.ack(&e);
    // SAFETY: ticket 0's slot is inside the mapping.
    assert_eq!(unsafe { r.header().slot(0) }.ack.load(Ordering::Relaxed), 1);
    assert_eq!(r.next_event().map(|e| seq(&e)), Some(2));
}

#[test]
fn many_producers_lose_nothing_they_did_not_count() {
    let mut r = ring(256);
    const THREADS: u64 = 4;
    const EACH: u64 = 20_000;
    let hdr = r.header() as *const Header as usize;
    let producers: Vec<_> = (0..THREADS)
        .map(|t| {
            std::thread::spawn(move || {
                // SAFETY: the ring outlives the threads (joined below before it drops).
                let h = unsafe { &*(hdr as *const Header) };
                for i in 0..EACH {
                    if let Some(k) = h.reserve() {
                        // SAFETY: as above.
                        let s = unsafe { h.slot(k) };
                        s.publish(
                            k,
                            &EventData {
                                kind: layout::EV_COPY,
                                tid: t as i32,
                                a: i,
                                ..Default::default()
                            },
                        );
                    }
                }
            })
        })
        .collect();
    let mut got = 0u64;
    let mut last = [None::<u64>; THREADS as usize];
    let mut check = |e: Event| {
        let prev = &mut last[e.tid as usize];
        assert!(
            prev.is_none_or(|p| seq(&e) > p),
            "out of order for one producer"
        );
        *prev = Some(seq(&e));
    };
    while producers.iter().any(|p| !p.is_finished()) {
        while let Some(e) = r.next_event() {
            check(e);
            got += 1;
        }
    }
    for p in producers {
        p.join().unwrap();
    }
    while let Some(e) = r.next_event() {
        check(e);
        got += 1;
    }
    assert_eq!(got + r.dropped(), THREADS * EACH);
    assert!(got > 0);
}

#[test]
fn stale_rings_of_dead_profilers_are_removed() {
    let dir = std::env::temp_dir().join(format!("scalene-rs-ring-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // A pid above the kernel's limit is never running.
    let dead = dir.join(format!("{PREFIX}99999999-0.ring"));
    let live = dir.join(format!("{PREFIX}{}-0.ring", std::process::id()));
    let other = dir.join("unrelated-99999999-0.ring");
    for f in [&dead, &live, &other] {
        std::fs::write(f, b"x").unwrap();
    }
    // A dead profiler's ring whose program (its producer, here us) still runs. `attach`
    // may take it over, so it stays. The same ring of a dead program goes.
    let header = |producer: i32| {
        let mut h = vec![0u8; std::mem::size_of::<Header>()];
        let at = std::mem::offset_of!(Header, producer_pid);
        h[at..at + 4].copy_from_slice(&producer.to_ne_bytes());
        h
    };
    let orphan = dir.join(format!("{PREFIX}99999998-0.ring"));
    let finished = dir.join(format!("{PREFIX}99999997-0.ring"));
    std::fs::write(&orphan, header(std::process::id() as i32)).unwrap();
    std::fs::write(&finished, header(99999996)).unwrap();
    // The rings the program's processes made beside their profiler's go by the same rule.
    let child_alive = child_path(&orphan, std::process::id() as i32);
    let child_gone = child_path(&orphan, 99999995);
    std::fs::write(&child_alive, header(std::process::id() as i32)).unwrap();
    std::fs::write(&child_gone, header(99999995)).unwrap();
    assert_eq!(clean_stale(&dir), 3);
    assert!(!dead.exists() && !finished.exists() && !child_gone.exists());
    assert!(live.exists() && other.exists() && orphan.exists() && child_alive.exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A ring as a process of the program makes it for itself (the library's `make_own_ring`),
/// with the profiler's header fields, claimed by `producer`, read by `reader`.
fn child_ring(path: &Path, producer: i32, reader: i32, mode: u32) {
    let cap = 16u64;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .unwrap();
    file.set_len(layout::file_bytes(cap) as u64).unwrap();
    // SAFETY: a fresh mapping of the file just made; atomics only.
    let map = unsafe { MmapMut::map_mut(&file) }.unwrap();
    // SAFETY: page-aligned and a header long.
    let h = unsafe { &*(map.as_ptr() as *const Header) };
    h.version.store(layout::LAYOUT_VERSION, Ordering::Relaxed);
    h.slot_bytes
        .store(std::mem::size_of::<Slot>() as u32, Ordering::Relaxed);
    h.capacity.store(cap, Ordering::Relaxed);
    h.consumer_pid.store(reader, Ordering::Relaxed);
    h.producer_pid.store(producer, Ordering::Relaxed);
    h.magic.store(layout::MAGIC, Ordering::Release);
}

#[test]
fn rings_of_the_programs_processes_are_found_checked_and_removed() {
    let main = ring(8);
    main.set_child_rings(Some(CHILD_CAPACITY));
    assert_eq!(
        main.header().child_capacity.load(Ordering::Relaxed),
        CHILD_CAPACITY
    );
    let me = std::process::id() as i32;
    let path = child_path(main.path(), 4242);
    assert_eq!(
        path.file_name().unwrap().to_string_lossy(),
        format!(
            "{}.4242",
            main.path().file_name().unwrap().to_string_lossy()
        )
    );
    // Not there yet, then being made (no header yet), so looked at again later.
    assert!(Ring::open_child(&path, 4242).unwrap().is_none());
    std::fs::File::create(&path).unwrap();
    assert!(Ring::open_child(&path, 4242).unwrap().is_none());
    std::fs::remove_file(&path).unwrap();
    // Readable by others, or another process's, or another profiler's: refused.
    child_ring(&path, 4242, me, 0o644);
    assert!(Ring::open_child(&path, 4242).is_err());
    std::fs::remove_file(&path).unwrap();
    child_ring(&path, 4242, me, 0o600);
    assert!(Ring::open_child(&path, 4243).is_err());
    std::fs::remove_file(&path).unwrap();
    child_ring(&path, 4242, 1, 0o600);
    assert!(Ring::open_child(&path, 4242).is_err());
    std::fs::remove_file(&path).unwrap();
    // Ours: read, and removed when done...
    child_ring(&path, 4242, me, 0o600);
    let r = Ring::open_child(&path, 4242).unwrap().unwrap();
    assert_eq!(r.producer_pid(), 4242);
    drop(r);
    assert!(!path.exists());
    // ... unless the name holds another file by then (the process exec'd and made a new
    // ring). That one stays for its reader.
    child_ring(&path, 4242, me, 0o600);
    let r = Ring::open_child(&path, 4242).unwrap().unwrap();
    std::fs::remove_file(&path).unwrap();
    child_ring(&path, 4242, me, 0o600);
    drop(r);
    assert!(path.exists());
    // The end of a run removes what its processes made and nobody read; only those.
    let other = main.path().with_extension("ring.x1");
    std::fs::write(&other, b"x").unwrap();
    child_ring(&child_path(main.path(), 7), 7, me, 0o600);
    assert_eq!(remove_children_of(main.path()), 2);
    assert!(!path.exists() && other.exists() && main.path().exists());
    std::fs::remove_file(&other).unwrap();
}

#[test]
fn a_failed_take_over_leaves_the_ring_alone() {
    let r = ring(8);
    r.set_handshake(true);
    // Claimed by us as the producer, read by us (alive). Taking it over fails, and the
    // failed attempt must not tell the producer to stop waiting for its reader.
    let me = std::process::id() as i32;
    r.header().producer_pid.store(me, Ordering::Relaxed);
    r.header().consumer_pid.store(1, Ordering::Relaxed);
    assert!(Ring::take_over(r.path(), me).is_err());
    assert_eq!(
        r.header().handshake.load(Ordering::Relaxed),
        layout::HANDSHAKE_ON
    );
}

/// The number a test event carries (in its bytes).
fn seq(e: &Event) -> u64 {
    match e.what {
        What::Alloc { bytes, .. } | What::Copy { bytes } => bytes,
        other => panic!("not a test event: {other:?}"),
    }
}

#[test]
fn a_header_whose_capacity_overflows_the_ring_size_is_refused() {
    // The `ring` fuzz target's find (fuzz/regressions/ring/): magic, version 1, 64-byte
    // slots, a capacity of 2^63. `file_bytes(capacity)` overflowed. With overflow checks
    // that was a panic, and without them a size that wrapped below the file's and passed.
    let found: [u8; 26] = [
        0x53, 0x43, 0x4c, 0x4e, 0x52, 0x49, 0x4e, 0x47, 0x01, 0x00, 0x00, 0x00, 0x40, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x80, 0x00, 0x00,
    ];
    assert!(Ring::from_bytes(&found).is_err());
    // Every power of two too large for the file, up to 2^63, with one event written.
    let mut bytes = vec![0u8; layout::file_bytes(4)];
    bytes[..8].copy_from_slice(&layout::MAGIC.to_ne_bytes());
    bytes[8..12].copy_from_slice(&layout::LAYOUT_VERSION.to_ne_bytes());
    bytes[12..16].copy_from_slice(&64u32.to_ne_bytes());
    let head = std::mem::offset_of!(layout::Header, head);
    bytes[head..head + 8].copy_from_slice(&1u64.to_ne_bytes());
    for shift in 3..64 {
        bytes[16..24].copy_from_slice(&(1u64 << shift).to_ne_bytes());
        assert!(Ring::from_bytes(&bytes).is_err(), "capacity 2^{shift}");
    }
    bytes[16..24].copy_from_slice(&4u64.to_ne_bytes());
    assert!(Ring::from_bytes(&bytes).is_ok());
}

#[test]
fn tickets_wrap_at_the_end_of_the_counter() {
    // The `ring` fuzz target's find (fuzz/regressions/ring/). A header whose tail is
    // u64::MAX overflowed `ticket + 1` in the reader (a panic with overflow checks).
    let mut bytes = vec![0u8; layout::file_bytes(4)];
    bytes[..8].copy_from_slice(&layout::MAGIC.to_ne_bytes());
    bytes[8..12].copy_from_slice(&layout::LAYOUT_VERSION.to_ne_bytes());
    bytes[12..16].copy_from_slice(&64u32.to_ne_bytes());
    bytes[16..24].copy_from_slice(&4u64.to_ne_bytes());
    let tail = std::mem::offset_of!(layout::Header, tail);
    bytes[tail..tail + 8].copy_from_slice(&u64::MAX.to_ne_bytes());
    // The slot of ticket u64::MAX (index 3) is written, and its seq is u64::MAX + 1 = 0.
    let slot = layout::HEADER_BYTES + 3 * 64;
    bytes[slot + 8..slot + 12].copy_from_slice(&layout::EV_FREE.to_ne_bytes());
    bytes[slot + 16..slot + 24].copy_from_slice(&4096u64.to_ne_bytes());
    let mut r = Ring::from_bytes(&bytes).unwrap();
    let e = r.next_event().unwrap();
    assert_eq!(e.ticket, u64::MAX);
    assert_eq!(e.what, What::Free { bytes: 4096 });
    assert_eq!(r.tickets(), (0, 0));
    assert!(r.next_event().is_none());
}
