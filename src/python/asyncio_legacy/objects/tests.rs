//! Reads of hostile or torn objects: refused, bounded, never a panic or a loop.

use super::*;
use crate::ptrace::BufferMemory;
use crate::python_bindings::legacy_async;

const BASE: u64 = 0x10_0000;

struct Mem(BufferMemory);

impl Mem {
    fn new() -> Mem {
        Mem(BufferMemory {
            base: BASE,
            bytes: vec![0; 1 << 16],
        })
    }
    fn put(&mut self, addr: u64, off: i64, v: u64) {
        let at = (addr.wrapping_add_signed(off) - BASE) as usize;
        self.0.bytes[at..at + 8].copy_from_slice(&v.to_le_bytes());
    }
}

fn rd(mem: &Mem) -> Rd<'_> {
    let l = legacy_async(3, 12, false).expect("a 3.12 table");
    Rd {
        l,
        t: TaskLayout::of(l),
        mem: &mem.0,
        task_types: HashMap::new(),
        names: HashMap::new(),
    }
}

#[test]
fn task_layout_matches_the_sizes_the_builds_report() {
    // `_asyncio.Task.__basicsize__` and `__dictoffset__` of the pyenv builds.
    for (minor, ft, size) in [
        (11, false, 176),
        (12, false, 176),
        (13, false, 144),
        (13, true, 160),
    ] {
        let t = TaskLayout::of(legacy_async(3, minor, ft).expect("a table"));
        assert_eq!(t.size, size, "3.{minor}{}", if ft { "t" } else { "" });
        assert_eq!(t.dict, (minor < 13).then_some(104));
    }
}

#[test]
fn a_set_of_implausible_size_is_refused() {
    let mut m = Mem::new();
    let set = BASE + 0x100;
    let l = legacy_async(3, 12, false).expect("a 3.12 table");
    m.put(set, l.set_mask, (1 << 40) - 1);
    assert!(rd(&m).set_items(set).is_err());
    m.put(set, l.set_mask, 5);
    assert!(rd(&m).set_items(set).is_err(), "a mask must be 2**k - 1");
    let table = BASE + 0x1000;
    m.put(set, l.set_mask, 3);
    m.put(set, l.set_table, table);
    m.put(table, 16, 0xabc0);
    m.put(table, 48, 0xdef0);
    assert_eq!(rd(&m).set_items(set).expect("a set"), vec![0xabc0, 0xdef0]);
}

#[test]
fn dict_keys_of_implausible_size_are_refused() {
    let mut m = Mem::new();
    let l = legacy_async(3, 12, false).expect("a 3.12 table");
    let keys = BASE + 0x200;
    // dk_log2_size 3 (8 slots), 1-byte indices, but 100 entries.
    m.put(keys, l.dk_log2_size, 3 | (3 << 8));
    m.put(keys, l.dk_nentries, 100);
    assert!(rd(&m).entries(keys, 0).is_err());
    // An index width that does not fit the size.
    m.put(keys, l.dk_log2_size, 3 | (9 << 8));
    m.put(keys, l.dk_nentries, 1);
    assert!(rd(&m).entries(keys, 0).is_err());
}

#[test]
fn ints_are_read_to_64_bits_and_no_further() {
    let mut m = Mem::new();
    let l = legacy_async(3, 12, false).expect("a 3.12 table");
    let (int, ty) = (BASE + 0x300, BASE + 0x800);
    m.put(int, l.ob_type, ty);
    m.put(ty, l.tp_flags, l.flag_long as u64);
    // 3 digits: 5 + (7 << 30) + (1 << 60).
    m.put(int, l.long_tag.expect("3.12"), 3 << 3);
    m.put(int, l.long_digits, 5 | (7 << 32));
    m.put(int, l.long_digits + 8, 1);
    let want = 5 + (7u64 << 30) + (1u64 << 60);
    assert_eq!(rd(&m).small_uint(int).expect("an int"), Some(want));
    // A digit count no int of 64 bits has, as a torn read might give.
    m.put(int, l.long_tag.expect("3.12"), !7);
    assert_eq!(rd(&m).small_uint(int).expect("an int"), None);
    // Not an int.
    m.put(ty, l.tp_flags, 0);
    assert_eq!(rd(&m).small_uint(int).expect("an object"), None);
}

#[test]
fn a_type_whose_bases_loop_is_no_task() {
    let mut m = Mem::new();
    let l = legacy_async(3, 12, false).expect("a 3.12 table");
    let (obj, a, b, task_type) = (BASE + 0x400, BASE + 0x800, BASE + 0xc00, BASE + 0x2000);
    m.put(obj, l.ob_type, a);
    m.put(a, l.tp_base, b);
    m.put(b, l.tp_base, a);
    assert!(!rd(&m).is_task(task_type, obj));
    m.put(b, l.tp_base, task_type);
    assert!(rd(&m).is_task(task_type, obj));
}
