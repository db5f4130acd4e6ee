//! The value reader over memory laid out as each version's tables say: reprs of built-in
//! values, then torn and hostile objects (cycles, huge sizes, bad pointers, a spent budget),
//! which must read as errors or bounded text, never as a panic, a hang or a huge read.

use super::repr::float_repr;
use super::*;
use crate::ptrace::BufferMemory;
use crate::python_bindings::{generated, object_layout, StringLayout, GENERATED};

const BASE: u64 = 0x10_0000;

/// Every generated layout's objects table (each one has one).
fn tables() -> Vec<&'static ObjectLayout> {
    GENERATED
        .iter()
        .map(|g| object_layout(g.version.0, g.version.1, g.free_threaded).expect("a table"))
        .collect()
}

/// Objects laid out one after the other in a buffer, as one version has them.
struct Heap {
    l: &'static ObjectLayout,
    s: StringLayout,
    bytes: Vec<u8>,
    /// Type objects by name.
    types: Vec<(&'static str, u64)>,
}

impl Heap {
    fn new(l: &'static ObjectLayout) -> Heap {
        let s = generated(l.version.0, l.version.1, l.free_threaded)
            .expect("a layout for every objects table")
            .string;
        let mut h = Heap {
            l,
            s,
            bytes: Vec::new(),
            types: Vec::new(),
        };
        let py2 = l.version.0 == 2;
        let names = [
            "list",
            "tuple",
            if py2 { "long" } else { "int" },
            "str",
            "NoneType",
            "set",
            "float",
            "Thing",
        ];
        for name in names {
            let heap = if name == "Thing" { l.flag_heaptype } else { 0 };
            let t = h.type_obj(name, heap as u64);
            h.types.push((name, t));
        }
        h
    }

    fn alloc(&mut self, size: usize) -> u64 {
        let at = (self.bytes.len() + 64).next_multiple_of(16);
        self.bytes.resize(at + size, 0);
        BASE + at as u64
    }

    fn put(&mut self, addr: u64, off: i64, v: u64) {
        let at = (addr.wrapping_add_signed(off) - BASE) as usize;
        self.bytes[at..at + 8].copy_from_slice(&v.to_le_bytes());
    }

    fn type_obj(&mut self, name: &str, flags: u64) -> u64 {
        let t = self.alloc(1024);
        let text = self.alloc(name.len() + 1);
        let at = (text - BASE) as usize;
        self.bytes[at..at + name.len()].copy_from_slice(name.as_bytes());
        self.put(t, self.l.tp_name, text);
        self.put(t, self.l.tp_flags, flags);
        t
    }

    fn ty(&self, name: &str) -> u64 {
        let name = match name {
            "int" if self.l.version.0 == 2 => "long",
            n => n,
        };
        self.types.iter().find(|(n, _)| *n == name).unwrap().1
    }

    fn object(&mut self, ty: &str, size: usize) -> u64 {
        let t = self.ty(ty);
        let o = self.alloc(size.max(self.l.object_size as usize + 8));
        self.put(o, self.l.ob_type, t);
        o
    }

    /// A small non-negative int (2.7: a `long`).
    fn int(&mut self, v: u32) -> u64 {
        let l = self.l;
        let o = self.object("int", 64);
        let n = u64::from(v != 0);
        match (l.long_tag, l.long_non_size_bits) {
            (Some(tag), Some(bits)) => self.put(o, tag, (n << bits) | if n == 0 { 1 } else { 0 }),
            _ => self.put(o, l.ob_size, n),
        }
        let at = (o - BASE) as usize + l.long_digits as usize;
        self.bytes[at..at + 4].copy_from_slice(&v.to_le_bytes());
        o
    }

    /// An ASCII str (2.7: a `str` of bytes) that claims `claim` characters.
    fn str(&mut self, text: &str, claim: u64) -> u64 {
        let n = text.len();
        let s = self.s;
        let o;
        let start;
        if self.l.version.0 == 2 {
            o = self.object("str", s.bytes_sval + n + 1);
            self.put(o, s.bytes_size as i64, claim);
            start = s.bytes_sval;
        } else {
            o = self.object("str", s.ascii_size + n + 1);
            self.put(o, s.unicode_length as i64, claim);
            let state = (1u32 << s.state_kind_shift)
                | (1 << s.state_compact_shift)
                | (1 << s.state_ascii_shift);
            let st = (o - BASE) as usize + s.unicode_state;
            self.bytes[st..st + 4].copy_from_slice(&state.to_le_bytes());
            start = s.ascii_size;
        }
        let at = (o - BASE) as usize + start;
        self.bytes[at..at + n].copy_from_slice(text.as_bytes());
        o
    }

    /// A list of `items` that claims `claim` of them.
    fn list(&mut self, items: &[u64], claim: u64) -> u64 {
        let o = self.object("list", 64);
        let array = self.alloc(items.len() * 8 + 8);
        for (i, &it) in items.iter().enumerate() {
            self.put(array, 8 * i as i64, it);
        }
        self.put(o, self.l.ob_size, claim);
        self.put(o, self.l.list_items, array);
        o
    }

    fn tuple(&mut self, items: &[u64]) -> u64 {
        let o = self.object("tuple", self.l.tuple_items as usize + items.len() * 8);
        self.put(o, self.l.ob_size, items.len() as u64);
        for (i, &it) in items.iter().enumerate() {
            self.put(o, self.l.tuple_items + 8 * i as i64, it);
        }
        o
    }

    fn memory(&self) -> BufferMemory {
        BufferMemory {
            base: BASE,
            bytes: self.bytes.clone(),
        }
    }
}

/// The repr of `obj` in `h` under `bounds` and `budget`.
fn repr_in(h: &Heap, obj: u64, bounds: ReprBounds, budget: Budget) -> Result<String> {
    let mem = h.memory();
    let budgeted = Budgeted::new(&mem, budget);
    let types = TypeAddrs::default();
    let v = Values::new(h.l, &budgeted, &h.s, &types, bounds);
    v.repr(obj).map(|(_, r)| r)
}

fn repr(h: &Heap, obj: u64, bounds: ReprBounds) -> Result<String> {
    repr_in(h, obj, bounds, Budget::default())
}

fn why(r: Result<String>) -> String {
    match r {
        Ok(text) => panic!("read as {text:?}, not as an error"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn built_in_values_on_every_layout() {
    for l in tables() {
        let mut h = Heap::new(l);
        let one = h.int(1);
        let ab = h.str("ab", 2);
        let two = h.int(2);
        let t = h.tuple(&[two]);
        let none = h.object("NoneType", 16);
        let thing = h.object("Thing", 16);
        let list = h.list(&[one, ab, t, none, thing, 0], 6);
        // The list holds itself last.
        let array = h.memory().read_u64(list + h.l.list_items as u64).unwrap();
        h.put(array, 40, list);
        let l2 = if l.version.0 == 2 { "L" } else { "" };
        let want = format!("[1{l2}, 'ab', (2{l2},), None, <Thing object at {thing:#x}>, [...]]");
        assert_eq!(
            repr(&h, list, ReprBounds::default()).unwrap(),
            want,
            "{:?}",
            l.version
        );
        // At depth 1 the tuple inside shows its size alone. At depth 0 the list does too.
        let want =
            format!("[1{l2}, 'ab', (… (1 items)), None, <Thing object at {thing:#x}>, [...]]");
        let b = ReprBounds { depth: 1, len: 32 };
        assert_eq!(repr(&h, list, b).unwrap(), want);
        let b = ReprBounds { depth: 0, len: 32 };
        assert_eq!(repr(&h, list, b).unwrap(), "[… (6 items)]");
        // Two items, and the rest counted.
        let b = ReprBounds { depth: 2, len: 2 };
        assert_eq!(
            repr(&h, list, b).unwrap(),
            format!("[1{l2}, 'ab', … (6 items)]")
        );
    }
}

#[test]
fn huge_claims_are_read_only_as_far_as_shown() {
    for l in tables() {
        let mut h = Heap::new(l);
        let one = h.int(1);
        // A list claiming 2**39 items, of which only two exist. Two are read.
        let list = h.list(&[one, one], 1 << 39);
        let b = ReprBounds { depth: 2, len: 2 };
        let l2 = if l.version.0 == 2 { "L" } else { "" };
        assert_eq!(
            repr(&h, list, b).unwrap(),
            format!("[1{l2}, 1{l2}, … (549755813888 items)]")
        );
        // A str claiming a billion characters. The first three are read.
        let s = h.str("abcdef", 1 << 30);
        let b = ReprBounds { depth: 2, len: 3 };
        assert_eq!(repr(&h, s, b).unwrap(), "'abc'…");
        // Sizes no object has.
        let bad = h.list(&[one], 1 << 50);
        assert!(why(repr(&h, bad, b)).contains("implausible"));
        let bad = h.str("ab", u64::MAX);
        assert!(why(repr(&h, bad, b)).contains("implausible"));
    }
}

#[test]
fn bad_pointers_and_torn_objects_are_errors() {
    for l in tables() {
        let mut h = Heap::new(l);
        let b = ReprBounds::default();
        // Items outside the memory, or misaligned.
        let outside = h.list(&[0xdead_0000], 1);
        assert!(why(repr(&h, outside, b)).contains("outside"));
        let crooked = h.list(&[BASE + 3], 1);
        assert!(why(repr(&h, crooked, b)).contains("misaligned"));
        // A list whose items array is gone.
        let gone = h.list(&[], 4);
        h.put(gone, l.list_items, 0x10);
        assert!(why(repr(&h, gone, b)).contains("outside"));
        // A set whose table is of no power-of-two size, or holds fewer keys than it says.
        let set = h.object("set", 256);
        h.put(set, l.set_used, 2);
        h.put(set, l.set_mask, 6);
        assert!(why(repr(&h, set, b)).contains("implausible"));
        let table = h.alloc(8 * l.setentry_size as usize);
        h.put(set, l.set_mask, 7);
        h.put(set, l.set_table, table);
        assert!(why(repr(&h, set, b)).contains("fewer keys"));
        // An int of more digits than is turned into decimal shows its size alone.
        let big = h.object("int", 64);
        match (l.long_tag, l.long_non_size_bits) {
            (Some(tag), Some(bits)) => h.put(big, tag, (1 << 30) << bits),
            _ => h.put(big, l.ob_size, 1 << 30),
        }
        assert!(repr(&h, big, b).unwrap().starts_with("<int of about"));
        // A type whose name never ends.
        let t = h.alloc(1024);
        let name = h.alloc(4096);
        let at = (name - BASE) as usize;
        h.bytes[at..at + 4096].fill(b'x');
        h.put(t, l.tp_name, name);
        let o = h.alloc(64);
        h.put(o, l.ob_type, t);
        assert!(why(repr(&h, o, b)).contains("unterminated"));
    }
}

#[test]
fn a_spent_budget_stops_the_read() {
    let l = *tables().last().unwrap();
    let mut h = Heap::new(l);
    let items: Vec<u64> = (0..32).map(|i| h.int(i)).collect();
    let list = h.list(&items, 32);
    let budget = Budget {
        bytes: 256,
        time: std::time::Duration::from_secs(60),
    };
    let err = why(repr_in(&h, list, ReprBounds::default(), budget));
    assert!(err.contains("budget"), "{err}");
    let budget = Budget {
        bytes: 1 << 20,
        time: std::time::Duration::ZERO,
    };
    std::thread::sleep(std::time::Duration::from_millis(2));
    let err = why(repr_in(&h, list, ReprBounds::default(), budget));
    assert!(err.contains("budget"), "{err}");
}

#[test]
fn floats_read_as_python_writes_them() {
    for (f, want) in [
        (0.1, "0.1"),
        (2.71, "2.71"),
        (1e16, "1e+16"),
        (1e15, "1000000000000000.0"),
        (123456789.125, "123456789.125"),
        (1e-5, "1e-05"),
        (0.0001, "0.0001"),
        (-0.0, "-0.0"),
        (2.0, "2.0"),
        (1.5e300, "1.5e+300"),
        (-2.5e-300, "-2.5e-300"),
        (f64::INFINITY, "inf"),
        (f64::NEG_INFINITY, "-inf"),
        (f64::NAN, "nan"),
    ] {
        assert_eq!(float_repr(f), want, "{f:e}");
    }
}
