//! The object reader over memory laid out as each version's tables say: a `sys.modules`
//! with `threading`, its `_active`, and `Thread`s whose names live in an instance dict, in
//! split values (3.11, 3.12) or in inline values (3.13+); then dicts that lie about
//! themselves, and random memory, which must read as errors without a panic or a hang.

use super::*;
use crate::ptrace::BufferMemory;
use crate::python::thread_names::{locate, read_active};
use crate::python_bindings::{generated, object_layout, GENERATED};

const BASE: u64 = 0x10_0000;

/// Objects laid out one after the other in a buffer, as one version has them.
struct Heap {
    l: &'static ObjectLayout,
    s: StringLayout,
    bytes: Vec<u8>,
    types: TypeAddrs,
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
            types: TypeAddrs::default(),
        };
        let flags = |f: i64| f as u64;
        h.types = TypeAddrs {
            dict: h.type_obj(flags(l.flag_dict)),
            module: h.type_obj(0),
            int: h.type_obj(flags(l.flag_int)),
            unicode: if l.version.0 == 2 {
                0
            } else {
                h.type_obj(flags(l.flag_str))
            },
            bytes: if l.version.0 == 2 {
                h.type_obj(flags(l.flag_str))
            } else {
                0
            },
            ..TypeAddrs::default()
        };
        h
    }

    /// `size` zeroed bytes, 16-aligned, with 64 bytes of room before them (the words a
    /// managed dict keeps before its object).
    fn alloc(&mut self, size: usize) -> u64 {
        let at = (self.bytes.len() + 64).next_multiple_of(16);
        self.bytes.resize(at + size, 0);
        BASE + at as u64
    }

    fn put(&mut self, addr: u64, off: i64, v: u64) {
        let at = (addr.wrapping_add_signed(off) - BASE) as usize;
        self.bytes[at..at + 8].copy_from_slice(&v.to_le_bytes());
    }

    fn put_u8(&mut self, addr: u64, off: i64, v: u8) {
        self.bytes[(addr.wrapping_add_signed(off) - BASE) as usize] = v;
    }

    fn object(&mut self, ty: u64, size: usize) -> u64 {
        let o = self.alloc(size.max(self.l.object_size as usize + 8));
        self.put(o, self.l.ob_type, ty);
        o
    }

    fn type_obj(&mut self, flags: u64) -> u64 {
        let t = self.alloc(1024);
        self.put(t, self.l.tp_flags, flags);
        t
    }

    fn str(&mut self, text: &str) -> u64 {
        assert!(text.is_ascii());
        let n = text.len();
        let (at, o) = match self.s.model {
            StringModel::Bytes2 => {
                let o = self.object(self.types.bytes, self.s.bytes_sval + n + 1);
                self.put(o, self.s.bytes_size as i64, n as u64);
                (self.s.bytes_sval, o)
            }
            StringModel::Pep393 => {
                let o = self.object(self.types.unicode, self.s.ascii_size + n + 1);
                self.put(o, self.s.unicode_length as i64, n as u64);
                let state = (1u32 << self.s.state_kind_shift)
                    | (1 << self.s.state_compact_shift)
                    | (1 << self.s.state_ascii_shift);
                let st = (o - BASE) as usize + self.s.unicode_state;
                self.bytes[st..st + 4].copy_from_slice(&state.to_le_bytes());
                (self.s.ascii_size, o)
            }
        };
        let start = (o - BASE) as usize + at;
        self.bytes[start..start + n].copy_from_slice(text.as_bytes());
        o
    }

    fn int(&mut self, v: u64) -> u64 {
        let l = self.l;
        let o = self.object(self.types.int, 64);
        if let Some(at) = l.int_value {
            self.put(o, at, v);
            return o;
        }
        let shift = l.long_shift as u32;
        let mut digits = Vec::new();
        let mut rest = v;
        while rest != 0 {
            digits.push((rest & ((1 << shift) - 1)) as u32);
            rest >>= shift;
        }
        match l.long_tag {
            Some(tag) => self.put(o, tag, (digits.len() as u64) << 3),
            None => self.put(o, l.ob_size, digits.len() as u64),
        }
        for (i, d) in digits.iter().enumerate() {
            let at = (o - BASE) as usize + l.long_digits as usize + 4 * i;
            self.bytes[at..at + 4].copy_from_slice(&d.to_le_bytes());
        }
        o
    }

    /// A keys object of eight slots holding `items` (values left out when `split`).
    fn keys(&mut self, items: &[(u64, u64)], general: bool, split: bool) -> u64 {
        let l = self.l;
        let (size, key, value) = if general {
            (l.entry_size, l.entry_key, l.entry_value)
        } else {
            (
                l.uentry_size.unwrap(),
                l.uentry_key.unwrap(),
                l.uentry_value.unwrap(),
            )
        };
        let indices = l.dk_indices.unwrap();
        let k = self.alloc(indices as usize + 8 + 8 * size as usize);
        match l.dk_size {
            Some(at) => self.put(k, at, 8),
            None => {
                self.put_u8(k, l.dk_log2_size.unwrap(), 3);
                self.put_u8(k, l.dk_log2_index_bytes.unwrap(), 3);
                let kind = if general {
                    l.dict_keys_general.unwrap() as u8
                } else {
                    1
                };
                self.put_u8(k, l.dk_kind.unwrap(), kind);
            }
        }
        self.put(k, l.dk_nentries.unwrap(), items.len() as u64);
        for (i, &(kk, v)) in items.iter().enumerate() {
            let e = k + (indices + 8) as u64 + (i as i64 * size) as u64;
            self.put(e, key, kk);
            if !split {
                self.put(e, value, v);
            }
        }
        k
    }

    fn dict(&mut self, items: &[(u64, u64)]) -> u64 {
        let l = self.l;
        let d = self.object(self.types.dict, 96);
        self.put(d, l.ma_used, items.len() as u64);
        if let (Some(mask), Some(table)) = (l.ma_mask, l.ma_table) {
            let t = self.alloc(8 * l.entry_size as usize);
            self.put(d, mask, 7);
            self.put(d, table, t);
            for (i, &(k, v)) in items.iter().enumerate() {
                // Every other slot, as a hash table leaves gaps.
                let e = t + (2 * i as i64 * l.entry_size) as u64;
                self.put(e, l.entry_key, k);
                self.put(e, l.entry_value, v);
            }
        } else {
            let keys = self.keys(items, true, false);
            self.put(d, l.ma_keys.unwrap(), keys);
        }
        d
    }

    fn module(&mut self, dict: u64) -> u64 {
        let m = self.object(self.types.module, 64);
        self.put(m, self.l.md_dict, dict);
        m
    }

    /// A `Thread` whose attributes are `attrs`: in an instance dict (≤3.10, or when
    /// `dict` on 3.11+), else in the values a managed dict keeps (3.11, 3.12) or inline
    /// (3.13+).
    fn thread(&mut self, attrs: &[(u64, u64)], dict: bool) -> u64 {
        let l = self.l;
        let Some(managed) = l.flag_managed_dict else {
            let ty = self.type_obj(0);
            self.put(ty, l.tp_dictoffset, l.object_size as u64);
            let o = self.object(ty, l.object_size as usize + 8);
            let d = self.dict(attrs);
            self.put(o, l.object_size, d);
            return o;
        };
        let inline = l.flag_inline_values.unwrap_or(0) as u64;
        let ty = self.type_obj(managed as u64 | inline);
        let keys = self.keys(attrs, false, true);
        self.put(ty, l.ht_cached_keys.unwrap(), keys);
        let basic = l.object_size as u64 + 16;
        self.put(ty, l.tp_basicsize, basic);
        let o = self.object(ty, basic as usize + 16 + 8 * attrs.len());
        if dict {
            let d = self.dict(attrs);
            self.put(o, l.managed_dict.unwrap(), d);
            return o;
        }
        let values = if inline != 0 {
            let v = o + basic;
            self.put_u8(v, l.values_capacity.unwrap(), attrs.len() as u8);
            self.put_u8(v, l.values_valid.unwrap(), 1);
            v
        } else {
            let v = self.alloc(8 * attrs.len() + 16);
            match (l.managed_values, l.values_untag) {
                (Some(at), _) => self.put(o, at, v),
                (None, Some(untag)) => self.put(o, l.managed_dict.unwrap(), v - untag as u64),
                _ => unreachable!("3.11 or 3.12"),
            }
            v
        };
        for (i, &(_, v)) in attrs.iter().enumerate() {
            let at = values + l.values_values.unwrap_or(0) as u64 + 8 * i as u64;
            self.put(at, 0, v);
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

/// Every generated layout has its objects table (the matrix of names never shrinks).
fn every_table() -> Vec<&'static ObjectLayout> {
    GENERATED
        .iter()
        .map(|g| {
            object_layout(g.version.0, g.version.1, g.free_threaded).unwrap_or_else(|| {
                panic!(
                    "no objects table for {:?} (free-threaded: {})",
                    g.version, g.free_threaded
                )
            })
        })
        .collect()
}

/// The idents and names of [`names_heap`]'s threads.
const IDENTS: [u64; 2] = [0x7f3a_1c2d_9b80, 0x55aa_0000_0001];
const NAMES: [&str; 2] = ["worker-3", "x"];

/// An interpreter whose `sys.modules` holds `os` and `threading`, whose `_active` holds two
/// `Thread`s named [`NAMES`]: the first keeps its attributes in a dict, the second as its
/// type lays them out (the same on ≤3.10). The heap, the interpreter, `_active`, the
/// attribute the names are in, and the keys of `os` and of `os`'s module.
fn names_heap(l: &'static ObjectLayout) -> (Heap, u64, u64, &'static str, (u64, u64)) {
    let mut h = Heap::new(l);
    let attr = if l.version.0 == 2 {
        "_Thread__name"
    } else {
        "_name"
    };
    let (target, name_key) = (h.str("_target"), h.str(attr));
    let mut active = Vec::new();
    for (i, (&ident, name)) in IDENTS.iter().zip(NAMES).enumerate() {
        let name = h.str(name);
        let t = h.thread(&[(target, 0x42), (name_key, name)], i == 0);
        let key = h.int(ident);
        active.push((key, t));
    }
    let active = h.dict(&active);
    let (active_key, other_key) = (h.str("_active"), h.str("Thread"));
    let threading_dict = h.dict(&[(other_key, 0x77), (active_key, active)]);
    let threading = h.module(threading_dict);
    let os = h.module(h.types.dict);
    let (os_key, threading_key) = (h.str("os"), h.str("threading"));
    let modules = h.dict(&[(os_key, os), (threading_key, threading)]);
    let interp = h.alloc(l.interp_modules as usize + 8);
    h.put(interp, l.interp_modules, modules);
    (h, interp, active, attr, (os_key, os))
}

#[test]
fn reads_every_threads_name_on_every_layout() {
    for l in every_table() {
        let what = format!("{:?}{}", l.version, if l.free_threaded { "t" } else { "" });
        let (mut h, interp, active, attr, (os_key, os)) = names_heap(l);
        let mem = h.memory();
        let o = Objects::new(l, &mem, &h.s, &h.types);
        let found = locate(&o, interp).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(found, Some(active), "{what}");
        let read = read_active(&o, active, attr).unwrap_or_else(|e| panic!("{what}: {e}"));
        for (ident, name) in IDENTS.iter().zip(NAMES) {
            assert_eq!(read.get(ident).map(String::as_str), Some(name), "{what}");
        }
        assert_eq!(read.len(), 2, "{what}");
        // Without `threading` in sys.modules: nothing, and no error.
        let modules = h.dict(&[(os_key, os)]);
        h.put(interp, l.interp_modules, modules);
        let mem = h.memory();
        let o = Objects::new(l, &mem, &h.s, &h.types);
        assert_eq!(locate(&o, interp).unwrap(), None, "{what}");
    }
}

/// The names' heap with bytes changed at random (sizes, pointers, flags torn as a read
/// racing the program's writes can find them): every read ends, with names or an error.
#[test]
fn a_torn_heap_reads_as_errors_without_a_panic() {
    let mut rng = 0x2545_f491_4f6c_dd1d_u64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    for l in every_table() {
        let (h, interp, _, attr, _) = names_heap(l);
        for _ in 0..300 {
            let mut mem = h.memory();
            for _ in 0..1 + next() % 8 {
                let at = (next() % mem.bytes.len() as u64) as usize;
                mem.bytes[at] = match next() % 4 {
                    0 => 0,
                    1 => 0xff,
                    _ => next() as u8,
                };
            }
            let o = Objects::new(l, &mem, &h.s, &h.types);
            if let Ok(Some(active)) = locate(&o, interp) {
                let _ = read_active(&o, active, attr);
            }
        }
    }
}

#[test]
fn dicts_that_lie_are_errors() {
    for l in every_table() {
        let what = format!("{:?}", l.version);
        let mut h = Heap::new(l);
        let k = h.str("k");
        let good = h.dict(&[(k, 0x10)]);
        // Its count says two items, it holds one.
        let short = h.dict(&[(k, 0x10)]);
        h.put(short, l.ma_used, 2);
        // A count too big to read.
        let huge = h.dict(&[(k, 0x10)]);
        h.put(huge, l.ma_used, u64::MAX);
        // A table or keys object of an impossible size.
        let bad_size = h.dict(&[(k, 0x10)]);
        match (l.ma_mask, l.ma_keys) {
            (Some(mask), _) => h.put(bad_size, mask, 6),
            (None, Some(keys_at)) => {
                let keys = {
                    let mem = h.memory();
                    mem.read_u64(bad_size + keys_at as u64).unwrap()
                };
                match l.dk_size {
                    Some(at) => h.put(keys, at, 12),
                    None => h.put_u8(keys, l.dk_log2_size.unwrap(), 40),
                }
            }
            _ => unreachable!(),
        }
        // Not a dict at all.
        let not_dict = h.object(h.types.int, 64);
        let mem = h.memory();
        let o = Objects::new(l, &mem, &h.s, &h.types);
        assert_eq!(o.dict_items(good).unwrap(), vec![(k, 0x10)], "{what}");
        for (d, why) in [
            (short, "a short count"),
            (huge, "a huge count"),
            (bad_size, "an impossible size"),
            (not_dict, "not a dict"),
        ] {
            assert!(o.dict_items(d).is_err(), "{what}: {why} read as a dict");
        }
    }
}

#[test]
fn random_memory_reads_as_errors_without_a_panic() {
    let mut rng = 0x9e37_79b9_7f4a_7c15_u64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    for l in every_table() {
        let mut bytes = vec![0u8; 1 << 16];
        for b in bytes.chunks_exact_mut(8) {
            // Words that often point back into the buffer, as a torn heap's do.
            let w = next();
            let w = if w & 3 == 0 {
                BASE + (w >> 8) % (1 << 16)
            } else {
                w >> (w & 63)
            };
            b.copy_from_slice(&w.to_le_bytes());
        }
        let mem = BufferMemory { base: BASE, bytes };
        let s = generated(l.version.0, l.version.1, l.free_threaded)
            .unwrap()
            .string;
        let types = TypeAddrs::default();
        let o = Objects::new(l, &mem, &s, &types);
        for _ in 0..400 {
            let at = BASE + (next() % (1 << 16)) / 8 * 8;
            let _ = o.dict_items(at);
            let _ = o.attr(at, "_name");
            let _ = o.int_bits(at);
            let _ = locate(&o, at);
            let _ = read_active(&o, at, "_name");
        }
    }
}
