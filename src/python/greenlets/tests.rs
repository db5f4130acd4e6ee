use super::*;
use crate::ptrace::BufferMemory;

/// The members' offsets as greenlet's declarations give them: 3.1+ with `_self`, 2.0 and
/// 3.0 without it; a `_PyErr_StackItem` of four words (3.7–3.10) or two (3.11+), none
/// before 3.7. The figures were checked against live greenlets (2.0.2, 3.1.1, 3.2.5,
/// 3.5.6) from inside.
#[test]
fn implementation_layouts_follow_the_declarations() {
    let new_311 = ImplLayout::of((3, 5), Some(16)).expect("greenlet 3");
    assert_eq!(
        new_311,
        ImplLayout {
            self_at: Some(8),
            stack_at: 56,
            top_frame_at: 104
        }
    );
    let new_37 = ImplLayout::of((3, 1), Some(32)).expect("greenlet 3.1");
    assert_eq!((new_37.stack_at, new_37.top_frame_at), (72, 120));
    let old = ImplLayout::of((2, 0), Some(32)).expect("greenlet 2");
    assert_eq!(
        (old.self_at, old.stack_at, old.top_frame_at),
        (None, 64, 112)
    );
    // 2.7 and 3.6: three exception pointers, no context.
    let py2 = ImplLayout::of((2, 0), None).expect("greenlet 2");
    assert_eq!((py2.stack_at, py2.top_frame_at), (48, 88));
    assert!(ImplLayout::of((1, 1), Some(32)).is_none());
}

/// Reads inside the saved part of a greenlet's C stack come from its copy; reads across
/// its ends are pieced together from both.
#[test]
fn a_spilled_stack_reads_its_copy() {
    let base = 0x1000u64;
    let mut bytes: Vec<u8> = (0..0x100u32).map(|i| i as u8).collect();
    // The copy of 0x1010..0x1020 lives at 0x1080: its bytes are 0xc0 + i.
    for i in 0..0x10 {
        bytes[0x80 + i] = 0xc0 + i as u8;
    }
    let mem = BufferMemory { base, bytes };
    let s = SpilledStack {
        mem: &mem,
        start: 0x1010,
        saved: 0x10,
        copy: 0x1080,
    };
    let mut buf = [0u8; 0x20];
    s.read(0x1008, &mut buf).expect("readable");
    let want: Vec<u8> = (0x08..0x10)
        .chain((0..0x10).map(|i| 0xc0 + i))
        .chain(0x20..0x28)
        .collect();
    assert_eq!(&buf[..], &want[..]);
}

/// A build without collector lists in our tables says why, naming its version.
#[test]
fn unsupported_builds_say_why() {
    for l in crate::python_bindings::GENERATED.iter() {
        let why = unsupported(l);
        let listed = !l.free_threaded;
        assert_eq!(why.is_none(), listed, "{:?}: {why:?}", l.version);
        if let Some(w) = why {
            assert!(
                w.contains(&format!("{}.{}", l.version.0, l.version.1)),
                "{w}"
            );
        }
    }
}
