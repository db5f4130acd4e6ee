//! Unit tests of the walker: the prefetch span of a torn top frame, the still walk of a
//! thread caught installing a C frame, [`spans`](super::verify::spans), and [`LoopCheck`].

use super::verify::spans;
use super::{LoopCheck, StackWalker};
use crate::ptrace::BufferMemory;
use crate::python::strings::TypeAddrs;

/// A torn innermost-frame pointer may be any value, and the span to prefetch for it stays
/// inside the address space. A garbage pointer near the top overflowed the sum (an attach
/// to 3.12.1 died on it in CI, tests/asyncio.rs, stop 34).
#[test]
fn a_torn_top_frame_gives_a_span_inside_the_address_space() {
    let types = TypeAddrs {
        code: 1,
        frame: 2,
        unicode: 3,
        bytes: 4,
        dict: 0,
        module: 0,
        int: 0,
    };
    for (major, minor) in [(2, 7), (3, 10), (3, 11), (3, 12)] {
        let layout = *crate::python_bindings::generated(major, minor, false).unwrap();
        let size = layout.frame.size as u64;
        let w = StackWalker::new(layout, types);
        for top in [
            u64::MAX,
            u64::MAX - 7,
            u64::MAX - size + 1,
            0x7ffe_0000_1000,
        ] {
            let (start, len) = w.top_span(top);
            assert!(start <= top, "{major}.{minor}: {top:#x}");
            assert!(
                start.checked_add(len as u64).is_some(),
                "{major}.{minor}: {top:#x}"
            );
            assert!(
                len as u64 >= size.min(u64::MAX - top),
                "{major}.{minor}: {top:#x}"
            );
            assert!(len as u64 <= size + 4096, "{major}.{minor}: {top:#x}");
        }
    }
}

/// A 3.11/3.12 thread caught between installing a new `_PyCFrame` and writing its
/// `current_frame` (garbage). The still walk reads the caller's C frame instead, and
/// only when there is one. Caught before the new C frame's link to its caller is
/// written (0, or a C frame inner to it), the thread has no stack to report (an error).
#[test]
fn a_thread_caught_installing_a_c_frame_is_read_from_the_callers() {
    for (major, minor) in [(3, 11), (3, 12)] {
        let layout = *crate::python_bindings::generated(major, minor, false).unwrap();
        let t = layout.thread;
        let (cur, prev) = (t.cframe_current_frame.unwrap(), t.cframe_previous.unwrap());
        let base = 0x10_0000u64;
        let (tstate, cframe, caller) = (base, base + 0x1000, base + 0x2000);
        let root = tstate + t.root_cframe.unwrap() as u64;
        let mut bytes = vec![0u8; 0x3000];
        let mut put = |at: u64, v: u64| {
            let o = (at - base) as usize;
            bytes[o..o + 8].copy_from_slice(&v.to_le_bytes());
        };
        put(tstate + t.frame as u64, cframe);
        // The new C frame's current_frame: stack garbage, unreadable.
        put(cframe + cur as u64, 0xe839_4de8_894c_0000);
        put(cframe + prev as u64, caller);
        // The caller's C frame, the outermost call's. The thread had no Python frame
        // yet (0).
        put(caller + cur as u64, 0);
        put(caller + prev as u64, root);
        let with = |bytes: &[u8], at: u64, v: u64| {
            let mut bytes = bytes.to_vec();
            let o = (at - base) as usize;
            bytes[o..o + 8].copy_from_slice(&v.to_le_bytes());
            BufferMemory { base, bytes }
        };
        let mem = BufferMemory {
            base,
            bytes: bytes.clone(),
        };
        let types = TypeAddrs {
            code: 1,
            frame: 2,
            unicode: 3,
            bytes: 4,
            dict: 0,
            module: 0,
            int: 0,
        };
        let mut w = StackWalker::new(layout, types);
        let top = w.current_top_frame(&mem, tstate).unwrap();
        assert_eq!(top, 0xe839_4de8_894c_0000);
        assert!(w.walk(&mem, top).is_err(), "{major}.{minor}");
        let still = w.walk_still(&mem, tstate, top).unwrap();
        assert!(still.frames.is_empty(), "{major}.{minor}");
        // The garbage is 0 (no frame, it seems), but the caller's C frame is walked all
        // the same (here unreadable, so an error, not an empty stack).
        assert!(w.walk_still(&mem, tstate, 0).unwrap().frames.is_empty());
        let bad = with(&bytes, caller + cur as u64, 0xdead_0000);
        assert!(w.walk_still(&bad, tstate, 0).is_err(), "{major}.{minor}");
        // The new C frame's link not written yet: 0, or a C frame inner to it (stack
        // garbage). An error, whatever its current_frame reads.
        for link in [0, cframe - 0x200] {
            let torn = with(&bytes, cframe + prev as u64, link);
            for top in [top, 0] {
                let e = w.walk_still(&torn, tstate, top).unwrap_err();
                assert!(e.to_string().contains("installing"), "{major}.{minor}: {e}");
            }
            assert!(w.cframes(&torn, tstate).is_err(), "{major}.{minor}");
        }
        // Outside any call of the loop, the thread state points at its root C frame.
        // A current_frame of 0 there is a thread with no Python frame.
        let idle = with(&bytes, tstate + t.frame as u64, root);
        assert!(w.walk_still(&idle, tstate, 0).unwrap().frames.is_empty());
        assert!(w.cframes(&idle, tstate).unwrap().is_empty());
        assert_eq!(w.cframes(&mem, tstate).unwrap(), vec![cframe, caller]);
    }
}

#[test]
fn spans_join_near_frames_and_keep_far_ones_apart() {
    // 3.11+ frames side by side in one frame-stack chunk: one range.
    let near = [0x1000_0000, 0x1000_0050, 0x1000_00a0];
    assert_eq!(spans(&near, 0x50), vec![(0x1000_0000, 0x1000_00f0)]);
    // Heap frame objects far apart, in any order: one range each, sorted.
    let far = [0x9000_0000, 0x1000_0000];
    assert_eq!(
        spans(&far, 0x60),
        vec![(0x1000_0000, 0x1000_0060), (0x9000_0000, 0x9000_0060)]
    );
    // Within a page of each other: joined, gap included.
    assert_eq!(spans(&[0x2000, 0x2f00], 0x40), vec![(0x2000, 0x2f40)]);
    // A range never grows past 16 pages, however many frames follow.
    let chain: Vec<u64> = (0..2000u64).map(|i| 0x10_0000 + i * 0x50).collect();
    let s = spans(&chain, 0x50);
    assert!(s.iter().all(|&(a, b)| b - a <= 16 * 4096 + 0x50), "{s:?}");
    assert_eq!(s.first().unwrap().0, 0x10_0000);
    assert_eq!(s.last().unwrap().1, 0x10_0000 + 1999 * 0x50 + 0x50);
    // Addresses at the top of the address space do not overflow.
    assert_eq!(spans(&[u64::MAX - 8], 0x50), vec![(u64::MAX - 8, u64::MAX)]);
    // A 3.12+ chain: the frame stack falling, an entry frame on the C stack between,
    // a generator's frame on the heap. It gets the same ranges as the sorted addresses give.
    let mixed = [
        0x7000_2000,
        0x7000_1f00,
        0x7fff_0000,
        0x7000_1e00,
        0x5555_0000,
        0x7000_1d00,
    ];
    let mut sorted = mixed.to_vec();
    sorted.sort_unstable();
    assert_eq!(spans(&mixed, 0x50), spans(&sorted, 0x50));
    assert_eq!(
        spans(&mixed, 0x50),
        vec![
            (0x5555_0000, 0x5555_0050),
            (0x7000_1d00, 0x7000_2050),
            (0x7fff_0000, 0x7fff_0050)
        ]
    );
}

#[test]
fn a_list_that_loops_is_caught_however_long() {
    for n in [1u64, 3, 40, 200] {
        // A list of `n` that ends: every element passes, each counted.
        let mut check = LoopCheck::new();
        for a in 0..n {
            assert!(check.step(0x1000 + a * 8), "{a} of {n} is new");
        }
        assert_eq!(check.steps, n as usize);
        // The same list with its last element linked back to the first, to the middle,
        // or to itself, is caught within three times the list's length.
        for back in [0, n / 2, n - 1] {
            let mut check = LoopCheck::new();
            let mut a = 0;
            let mut steps = 0;
            while check.step(0x1000 + a * 8) {
                a = if a + 1 == n { back } else { a + 1 };
                steps += 1;
                assert!(steps <= 3 * n + 2, "{n} linked back to {back}: not caught");
            }
        }
    }
}

/// Thread states are labelled by their interpreter's own id:
/// - a subinterpreter (at the head of the list, as a new one goes) by the id it records;
/// - the main one (last) by 0;
/// - where the version records none (2.7, 3.6), by the place counted from the end.
///
/// With the main
/// interpreter alone no id is read (here a garbage one, which two interpreters refuse).
#[test]
fn thread_states_carry_their_interpreters_id() {
    let types = TypeAddrs::default();
    for layout in crate::python_bindings::GENERATED.iter().copied().copied() {
        let what = format!("{:?}", layout.version);
        let (i, t) = (layout.interp, layout.thread);
        let base = 0x10_0000u64;
        let isize = [i.next, i.tstate_head, i.id.unwrap_or(0)]
            .into_iter()
            .max()
            .unwrap()
            + 8;
        let (sub, main) = (base, base + isize as u64);
        let (ts_sub, ts_main) = (main + isize as u64, main + isize as u64 + 0x400);
        let mut bytes = vec![0u8; (ts_main - base) as usize + 0x400];
        let mut put = |at: u64, v: u64| {
            let o = (at - base) as usize;
            bytes[o..o + 8].copy_from_slice(&v.to_le_bytes());
        };
        put(sub + i.next as u64, main);
        for (interp, ts, thread, id) in [(sub, ts_sub, 0x7f01, 3), (main, ts_main, 0x7f02, 0)] {
            put(interp + i.tstate_head as u64, ts);
            if let Some(off) = i.id {
                put(interp + off as u64, id);
            }
            put(ts + t.interp as u64, interp);
            put(ts + t.thread_id as u64, thread);
        }
        let mem = BufferMemory {
            base,
            bytes: bytes.clone(),
        };
        let mut w = StackWalker::new(layout, types);
        let got: Vec<(u64, i64)> = w
            .threads(&mem, sub, Some(0), None)
            .unwrap_or_else(|e| panic!("{what}: {e}"))
            .iter()
            .map(|r| (r.thread_id, r.interp_id))
            .collect();
        let sub_id = if i.id.is_some() { 3 } else { 1 };
        assert_eq!(got, [(0x7f01, sub_id), (0x7f02, 0)], "{what}");
        // The main interpreter alone, its id field garbage: 0, unread.
        let mut alone = bytes.clone();
        if let Some(off) = i.id {
            let o = (main - base) as usize + off;
            alone[o..o + 8].copy_from_slice(&u64::MAX.to_le_bytes());
        }
        let alone = BufferMemory { base, bytes: alone };
        let got = w.threads(&alone, main, Some(0), None).unwrap();
        assert_eq!((got.len(), got[0].interp_id), (1, 0), "{what}");
        if i.id.is_some() {
            assert!(w.threads(&alone, sub, Some(0), None).is_err(), "{what}");
        }
    }
}
