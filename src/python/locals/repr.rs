//! A short `repr` of one object of the target, read from outside under bounds.
//!
//! Owns: [`Values`] (one version's layouts over one process's memory, for one dump) and
//! the rules of the text it writes (docs/dump-json.md, "Locals"):
//! - `None`, `True`, `False`, `int` (any size; 2.7's `long` with its `L`), `float` (as
//!   Python's `repr`);
//! - `str` and `bytes` in quotes, cut after `len` characters (bytes) with `…` after the
//!   closing quote; 2.7's `str` as 3.x's `bytes` without the `b`;
//! - `tuple`, `list`, `dict`, `set`, `frozenset` with their first `len` items, then
//!   `… (N items)`; a container deeper than `depth` as `[… (N items)]`; a container met
//!   again inside itself as Python writes it (`[...]`, `{...}`);
//! - anything else `<TypeName object at 0x…>`.
//!
//! Must not: call anything in the target, make a system call (memory comes through
//! [`ProcessMemory`]), or read a size before bounding it. A value that does not read
//! consistently is an error (shown `<unreadable: …>` by the caller), never a guess.

use super::budget::Budgeted;
use crate::error::{Error, Result};
use crate::ptrace::{field_u64, ProcessMemory};
use crate::python::objects::Objects;
use crate::python::strings::TypeAddrs;
use crate::python_bindings::{ObjectLayout, StringLayout, StringModel};
use std::cell::RefCell;
use std::collections::HashMap;
use std::fmt::Write;

/// Most 30-bit (or 15-bit) digits of an `int` turned into decimal (about 9,900 decimal
/// digits). A bigger one is shown by its size.
const MAX_INT_DIGITS: u64 = 1024;
/// Most slots of a set's table scanned for its first items.
const MAX_SET_SLOTS: u64 = 1 << 22;
/// Longest type name read (`tp_name`).
const MAX_TYPE_NAME: usize = 128;
/// Most elements a tuple or list may claim before it is taken as torn.
const MAX_SEQUENCE: u64 = 1 << 40;

fn bad(addr: u64, why: &'static str) -> Error {
    Error::Inconsistent { addr, why }
}

/// How far a repr goes: containers expanded `depth` levels down (the value itself is level
/// 0), at most `len` items of each and `len` characters of a string.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReprBounds {
    pub depth: usize,
    pub len: usize,
}

impl Default for ReprBounds {
    fn default() -> ReprBounds {
        ReprBounds { depth: 2, len: 32 }
    }
}

/// The built-in types a repr knows, by a type's `tp_name` (a type made at run time, a
/// class, is never one of them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    None,
    Bool,
    Int,
    /// 2.7's `int` (a C long).
    Int2,
    /// 2.7's `long`.
    Long2,
    Float,
    Str,
    Bytes,
    /// 2.7's `str` (bytes).
    Str2,
    Tuple,
    List,
    Dict,
    Set,
    FrozenSet,
    Cell,
    Other,
}

/// A type as read: its short name (after the last dot of `tp_name`) and kind.
#[derive(Debug, Clone)]
pub(super) struct TypeInfo {
    pub(super) name: String,
    pub(super) kind: Kind,
}

/// Reads values of one process with one version's layouts, for one dump. Type objects are
/// read once each (by address).
pub(crate) struct Values<'a> {
    pub(super) l: &'static ObjectLayout,
    pub(super) mem: &'a Budgeted<'a>,
    strings: &'a StringLayout,
    types: &'a TypeAddrs,
    bounds: ReprBounds,
    type_cache: RefCell<HashMap<u64, TypeInfo>>,
}

impl<'a> Values<'a> {
    pub(crate) fn new(
        l: &'static ObjectLayout,
        mem: &'a Budgeted<'a>,
        strings: &'a StringLayout,
        types: &'a TypeAddrs,
        bounds: ReprBounds,
    ) -> Values<'a> {
        Values {
            l,
            mem,
            strings,
            types,
            bounds,
            type_cache: RefCell::new(HashMap::new()),
        }
    }

    pub(super) fn word(&self, addr: u64, off: i64) -> Result<u64> {
        self.mem.read_u64(addr.wrapping_add_signed(off))
    }

    fn int32(&self, addr: u64, off: i64) -> Result<i32> {
        Ok(self.mem.read_u32(addr.wrapping_add_signed(off))? as i32)
    }

    /// The type of `obj`, read once per type.
    pub(super) fn type_of(&self, obj: u64) -> Result<TypeInfo> {
        if obj == 0 || obj & 7 != 0 {
            return Err(bad(obj, "a null or misaligned object pointer"));
        }
        let ty = self.word(obj, self.l.ob_type)?;
        if let Some(t) = self.type_cache.borrow().get(&ty) {
            return Ok(t.clone());
        }
        if ty == 0 || ty & 7 != 0 {
            return Err(bad(
                obj,
                "an object whose type pointer is null or misaligned",
            ));
        }
        let at = self.word(ty, self.l.tp_name)?;
        let mut buf = [0u8; MAX_TYPE_NAME];
        let n = self.mem.read_prefix(at, &mut buf)?;
        let end = buf[..n]
            .iter()
            .position(|&b| b == 0)
            .ok_or(bad(ty, "a type name too long or unterminated"))?;
        let full = String::from_utf8_lossy(&buf[..end]).into_owned();
        let name = full.rsplit('.').next().unwrap_or(&full).to_string();
        let flags = self.word(ty, self.l.tp_flags)?;
        let py2 = self.l.version.0 == 2;
        let kind = if flags & self.l.flag_heaptype as u64 != 0 {
            Kind::Other
        } else {
            match full.as_str() {
                "NoneType" => Kind::None,
                "bool" => Kind::Bool,
                "int" if py2 => Kind::Int2,
                "long" if py2 => Kind::Long2,
                "int" => Kind::Int,
                "float" => Kind::Float,
                "str" if py2 => Kind::Str2,
                "str" => Kind::Str,
                "bytes" if !py2 => Kind::Bytes,
                "tuple" => Kind::Tuple,
                "list" => Kind::List,
                "dict" => Kind::Dict,
                "set" => Kind::Set,
                "frozenset" => Kind::FrozenSet,
                "cell" => Kind::Cell,
                _ => Kind::Other,
            }
        };
        // Where the reader knows the built-in type's address, a look-alike is not it.
        let known = match kind {
            Kind::Int | Kind::Int2 => self.types.int,
            Kind::Dict => self.types.dict,
            Kind::Str => self.types.unicode,
            Kind::Bytes | Kind::Str2 => self.types.bytes,
            _ => 0,
        };
        let kind = if known != 0 && known != ty {
            Kind::Other
        } else {
            kind
        };
        let t = TypeInfo { name, kind };
        self.type_cache.borrow_mut().insert(ty, t.clone());
        Ok(t)
    }

    /// The repr of `obj` and its type's name.
    pub(crate) fn repr(&self, obj: u64) -> Result<(String, String)> {
        let t = self.type_of(obj)?;
        let mut out = String::new();
        let mut path = Vec::new();
        self.write(obj, &t, 0, &mut path, &mut out)?;
        Ok((t.name, out))
    }

    fn write(
        &self,
        obj: u64,
        t: &TypeInfo,
        level: usize,
        path: &mut Vec<u64>,
        out: &mut String,
    ) -> Result<()> {
        self.mem.check_time()?;
        match t.kind {
            Kind::None => out.push_str("None"),
            Kind::Bool => {
                let v = self.int_text(obj)?;
                out.push_str(match v.as_str() {
                    "0" => "False",
                    "1" => "True",
                    _ => return Err(bad(obj, "a bool that is neither 0 nor 1")),
                });
            }
            Kind::Int => out.push_str(&self.int_text(obj)?),
            Kind::Int2 => {
                let at = self.l.int_value.ok_or(bad(obj, "no layout of 2.7's int"))?;
                let _ = write!(out, "{}", self.word(obj, at)? as i64);
            }
            Kind::Long2 => {
                let text = self.int_text(obj)?;
                out.push_str(&text);
                if !text.starts_with('<') {
                    out.push('L');
                }
            }
            Kind::Float => {
                let bits = self.word(obj, self.l.float_value)?;
                out.push_str(&float_repr(f64::from_bits(bits)));
            }
            Kind::Str => self.write_str(obj, out)?,
            Kind::Bytes | Kind::Str2 => {
                if t.kind == Kind::Bytes {
                    out.push('b');
                }
                self.write_bytes(obj, out)?;
            }
            Kind::Tuple | Kind::List | Kind::Dict | Kind::Set | Kind::FrozenSet => {
                self.write_container(obj, t.kind, level, path, out)?
            }
            Kind::Cell | Kind::Other => {
                let _ = write!(out, "<{} object at {obj:#x}>", t.name);
            }
        }
        Ok(())
    }

    /// An item of a container, at `level`.
    fn write_item(
        &self,
        obj: u64,
        level: usize,
        path: &mut Vec<u64>,
        out: &mut String,
    ) -> Result<()> {
        let t = self.type_of(obj)?;
        self.write(obj, &t, level, path, out)
    }

    fn write_container(
        &self,
        obj: u64,
        kind: Kind,
        level: usize,
        path: &mut Vec<u64>,
        out: &mut String,
    ) -> Result<()> {
        let (open, close, cycle) = match kind {
            Kind::Tuple => ("(", ")", "(...)"),
            Kind::List => ("[", "]", "[...]"),
            Kind::Dict => ("{", "}", "{...}"),
            Kind::Set => ("{", "}", "set(...)"),
            _ => ("frozenset({", "})", "frozenset(...)"),
        };
        if path.contains(&obj) {
            out.push_str(cycle);
            return Ok(());
        }
        let n = match kind {
            Kind::Tuple | Kind::List => self.word(obj, self.l.ob_size)?,
            Kind::Dict => self.word(obj, self.l.ma_used)?,
            _ => self.word(obj, self.l.set_used)?,
        };
        if n > MAX_SEQUENCE {
            return Err(bad(obj, "a container of implausible size"));
        }
        if n == 0 {
            out.push_str(match kind {
                Kind::Tuple => "()",
                Kind::List => "[]",
                Kind::Dict => "{}",
                Kind::Set => "set()",
                _ => "frozenset()",
            });
            return Ok(());
        }
        out.push_str(open);
        if level >= self.bounds.depth {
            let _ = write!(out, "… ({n} items){close}");
            return Ok(());
        }
        let shown = n.min(self.bounds.len as u64) as usize;
        path.push(obj);
        match kind {
            Kind::Tuple | Kind::List => {
                let first = if kind == Kind::Tuple {
                    obj.wrapping_add_signed(self.l.tuple_items)
                } else {
                    self.word(obj, self.l.list_items)?
                };
                let items = self.mem.read_vec(first, shown * 8)?;
                for i in 0..shown {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    self.write_item(field_u64(&items, i * 8), level + 1, path, out)?;
                }
                if kind == Kind::Tuple && n == 1 {
                    out.push(',');
                }
            }
            Kind::Dict => {
                let objects = Objects::new(self.l, self.mem, self.strings, self.types);
                let items = objects.dict_items(obj)?;
                for (i, (k, v)) in items.iter().take(shown).enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    self.write_item(*k, level + 1, path, out)?;
                    out.push_str(": ");
                    self.write_item(*v, level + 1, path, out)?;
                }
            }
            _ => {
                let keys = self.set_keys(obj, n, shown)?;
                for (i, k) in keys.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    self.write_item(*k, level + 1, path, out)?;
                }
            }
        }
        path.pop();
        if n as usize > shown {
            let _ = write!(out, ", … ({n} items)");
        }
        out.push_str(close);
        Ok(())
    }

    /// The first `want` keys of set `set` (of `used` keys), in its table's order. A slot
    /// with no key, or a deleted one's (hash -1), is skipped.
    fn set_keys(&self, set: u64, used: u64, want: usize) -> Result<Vec<u64>> {
        let l = self.l;
        let mask = self.word(set, l.set_mask)?;
        if mask >= MAX_SET_SLOTS || (mask + 1) & mask != 0 || used > mask + 1 {
            return Err(bad(set, "a set table of implausible size"));
        }
        let table = self.word(set, l.set_table)?;
        let size = l.setentry_size as usize;
        let (key, hash) = (l.setentry_key as usize, l.setentry_hash as usize);
        let mut keys = Vec::with_capacity(want);
        // A chunk of slots at a time, up to the items wanted.
        const CHUNK: u64 = 256;
        let mut slot = 0;
        while slot <= mask && keys.len() < want {
            let count = CHUNK.min(mask + 1 - slot);
            let at = table.wrapping_add(slot * size as u64);
            let buf = self.mem.read_vec(at, count as usize * size)?;
            for e in buf.chunks_exact(size) {
                let (k, h) = (field_u64(e, key), field_u64(e, hash));
                if k != 0 && h != u64::MAX && keys.len() < want {
                    keys.push(k);
                }
            }
            slot += count;
        }
        if keys.len() < want {
            return Err(bad(
                set,
                "a set whose table holds fewer keys than its count",
            ));
        }
        Ok(keys)
    }

    /// The decimal text of `int` (or 2.7 `long`, or `bool`) `obj`.
    fn int_text(&self, obj: u64) -> Result<String> {
        let l = self.l;
        if let (Some(at), Kind::Bool) = (l.int_value, self.type_of(obj)?.kind) {
            // 2.7's bool is an int (a C long).
            return Ok((self.word(obj, at)? as i64).to_string());
        }
        let (digits_at, shift) = (l.long_digits, l.long_shift);
        if l.digit_size != 4 {
            return Err(bad(obj, "int digits of a size not read (not 4 bytes)"));
        }
        let (ndigits, negative) = match (l.long_tag, l.long_non_size_bits) {
            (Some(tag_at), Some(bits)) => {
                let tag = self.word(obj, tag_at)?;
                // The low two bits are the sign: 0 positive, 1 zero, 2 negative.
                (tag >> bits, tag & 3 == 2)
            }
            _ => {
                let size = self.word(obj, l.ob_size)? as i64;
                (size.unsigned_abs(), size < 0)
            }
        };
        if ndigits > MAX_INT_DIGITS {
            return Ok(format!("<int of about {} bits>", ndigits * shift as u64));
        }
        let raw = self
            .mem
            .read_vec(obj.wrapping_add_signed(digits_at), ndigits as usize * 4)?;
        let digits: Vec<u32> = raw
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        if digits.iter().any(|&d| d >> shift != 0) {
            return Err(bad(obj, "an int digit out of range"));
        }
        let mut text = to_decimal(&digits, shift as u32);
        if negative && text != "0" {
            text.insert(0, '-');
        }
        Ok(text)
    }

    /// A `str` (3.x), its first `len` characters.
    fn write_str(&self, obj: u64, out: &mut String) -> Result<()> {
        let s = self.strings;
        debug_assert!(matches!(s.model, StringModel::Pep393));
        let header = self.mem.read_vec(obj, s.ascii_size)?;
        let length = field_u64(&header, s.unicode_length);
        if length > MAX_SEQUENCE {
            return Err(bad(obj, "a str of implausible length"));
        }
        let state = crate::ptrace::field_u32(&header, s.unicode_state);
        let kind = (state >> s.state_kind_shift) & 7;
        let compact = (state >> s.state_compact_shift) & 1 == 1;
        let ascii = (state >> s.state_ascii_shift) & 1 == 1;
        let width = match kind {
            1 | 2 | 4 => kind as u64,
            _ => return Err(bad(obj, "a str of a kind not readable (not made ready)")),
        };
        if ascii && width != 1 {
            return Err(bad(obj, "an ASCII str with a wide kind"));
        }
        let data = if compact {
            obj.wrapping_add(if ascii { s.ascii_size } else { s.compact_size } as u64)
        } else {
            self.word(obj, s.unicode_data_any as i64)?
        };
        let shown = length.min(self.bounds.len as u64);
        let raw = self.mem.read_vec(data, (shown * width) as usize)?;
        let chars: Vec<char> = raw
            .chunks_exact(width as usize)
            .map(|c| {
                let mut b = [0u8; 4];
                b[..c.len()].copy_from_slice(c);
                char::from_u32(u32::from_le_bytes(b)).unwrap_or(char::REPLACEMENT_CHARACTER)
            })
            .collect();
        let quote = pick_quote(chars.iter().map(|&c| c as u32));
        out.push(quote);
        for c in chars {
            escape(c as u32, quote, out);
        }
        out.push(quote);
        if length > shown {
            out.push('…');
        }
        Ok(())
    }

    /// The quoted payload of a `bytes` (2.7: `str`), its first `len` bytes.
    fn write_bytes(&self, obj: u64, out: &mut String) -> Result<()> {
        let s = self.strings;
        let size = self.word(obj, s.bytes_size as i64)?;
        if size > MAX_SEQUENCE {
            return Err(bad(obj, "a bytes object of implausible size"));
        }
        let shown = size.min(self.bounds.len as u64);
        let raw = self
            .mem
            .read_vec(obj.wrapping_add(s.bytes_sval as u64), shown as usize)?;
        let quote = pick_quote(raw.iter().map(|&b| b as u32));
        out.push(quote);
        for b in raw {
            escape(
                if b >= 0x80 {
                    0x100 + b as u32
                } else {
                    b as u32
                },
                quote,
                out,
            );
        }
        out.push(quote);
        if size > shown {
            out.push('…');
        }
        Ok(())
    }

    /// The value a cell object holds (0: empty).
    pub(super) fn cell_contents(&self, cell: u64) -> Result<u64> {
        self.word(cell, self.l.cell_ref)
    }

    /// A C `int` field of a code object.
    pub(super) fn code_int(&self, code: u64, off: i64) -> Result<i32> {
        self.int32(code, off)
    }
}

/// `'` unless the text has a `'` and no `"` (Python's choice).
fn pick_quote(chars: impl Iterator<Item = u32> + Clone) -> char {
    let single = chars.clone().any(|c| c == '\'' as u32);
    let double = chars.into_iter().any(|c| c == '"' as u32);
    if single && !double {
        '"'
    } else {
        '\''
    }
}

/// One character of a quoted text. `c` above 0xff and below 0x200 is byte `c - 0x100` of
/// a bytes object (escaped as `\xNN`).
/// - `\\`, the quote, `\t`, `\n`, `\r` escaped with a backslash;
/// - other characters below 0x20, 0x7f, and 0x80–0x9f as `\xNN`;
/// - every other character as it is.
fn escape(c: u32, quote: char, out: &mut String) {
    match c {
        0x5c => out.push_str("\\\\"),
        0x09 => out.push_str("\\t"),
        0x0a => out.push_str("\\n"),
        0x0d => out.push_str("\\r"),
        _ if c == quote as u32 => {
            out.push('\\');
            out.push(quote);
        }
        0x100..=0x1ff => {
            let _ = write!(out, "\\x{:02x}", c - 0x100);
        }
        0..=0x1f | 0x7f..=0x9f => {
            let _ = write!(out, "\\x{c:02x}");
        }
        _ => out.push(char::from_u32(c).unwrap_or(char::REPLACEMENT_CHARACTER)),
    }
}

/// The decimal text of the unsigned number whose digits (`shift` bits each) are `digits`,
/// least significant first.
fn to_decimal(digits: &[u32], shift: u32) -> String {
    const BASE: u64 = 1_000_000_000;
    // Little-endian limbs of nine decimal digits each.
    let mut limbs: Vec<u32> = Vec::new();
    for &d in digits.iter().rev() {
        let mut carry = d as u64;
        for limb in limbs.iter_mut() {
            let v = ((*limb as u64) << shift) + carry;
            *limb = (v % BASE) as u32;
            carry = v / BASE;
        }
        while carry > 0 {
            limbs.push((carry % BASE) as u32);
            carry /= BASE;
        }
    }
    let Some((top, rest)) = limbs.split_last() else {
        return "0".to_string();
    };
    let mut s = top.to_string();
    for limb in rest.iter().rev() {
        let _ = write!(s, "{limb:09}");
    }
    s
}

/// `repr(f)` as Python writes it: the shortest digits that read back as `f`, in fixed
/// notation when the decimal exponent is from -4 to 15, else in scientific notation with a
/// signed exponent of at least two digits.
pub(crate) fn float_repr(f: f64) -> String {
    if f.is_nan() {
        return "nan".into();
    }
    if f.is_infinite() {
        return if f < 0.0 { "-inf" } else { "inf" }.into();
    }
    // Rust's `{:e}` gives the shortest round-trip digits: `-1.2345e-7`.
    let sci = format!("{f:e}");
    let (mantissa, exp) = sci.split_once('e').expect("`{:e}` always has an exponent");
    let exp: i32 = exp.parse().expect("`{:e}`'s exponent is a number");
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    // The decimal point goes after `point` digits.
    let point = exp + 1;
    let n = digits.len() as i32;
    let body = if (-3..=16).contains(&point) {
        if point <= 0 {
            format!("0.{}{digits}", "0".repeat((-point) as usize))
        } else if point >= n {
            format!("{digits}{}.0", "0".repeat((point - n) as usize))
        } else {
            format!(
                "{}.{}",
                &digits[..point as usize],
                &digits[point as usize..]
            )
        }
    } else {
        let (first, rest) = digits.split_at(1);
        let frac = if rest.is_empty() {
            String::new()
        } else {
            format!(".{rest}")
        };
        let e = point - 1;
        format!(
            "{first}{frac}e{}{:02}",
            if e < 0 { '-' } else { '+' },
            e.unsigned_abs()
        )
    };
    format!("{sign}{body}")
}
