//! Objects of the target read from outside, on every version of the matrix:
//! - dicts (2.7's table of entries; the keys object of 3.6–3.10 and of 3.11+, combined or
//!   split);
//! - instance attributes (a type's dict offset, or 3.11+'s managed dict and values);
//! - `int`s and `str`s;
//! - a module's dict found by its name in an interpreter's `sys.modules`.
//!
//! Owns: [`Objects`] (one version's [`ObjectLayout`] over one process's memory, for one
//! read).
//! Must not: know what the objects mean (its callers do, such as `thread_names`), or keep
//! anything from one read to the next. Every size read is bounded before it is used, and
//! every dict is checked against its own count of items (`ma_used`). So a torn or hostile
//! object reads as an error, never as a hang, a panic or a huge allocation.

use super::strings::{self, TypeAddrs};
use crate::error::{Error, Result};
use crate::ptrace::{field_u64, ProcessMemory};
use crate::python_bindings::{ObjectLayout, StringLayout, StringModel};
use std::cell::RefCell;
use std::collections::HashMap;

/// Items of a dict read at most (a large program's `sys.modules` has a few thousand).
pub(crate) const MAX_DICT_ITEMS: u64 = 1 << 17;
/// Slots of a dict's table (2.7) or index (3.6–3.10) read at most.
const MAX_DICT_SLOTS: u64 = 1 << 18;
/// Longest key compared with a name (the names looked up are short identifiers).
const MAX_KEY_CHARS: u64 = 64;
/// Largest `tp_basicsize` taken as read right (inline values start there, 3.13+).
const MAX_BASIC_SIZE: u64 = 1 << 16;

fn bad(addr: u64, why: &'static str) -> Error {
    Error::Inconsistent { addr, why }
}

/// Reads objects of one process with one version's layouts. Made for one read. It keeps
/// the text of the keys it compared (interned names are shared by every instance).
pub(crate) struct Objects<'a> {
    pub(crate) l: &'static ObjectLayout,
    mem: &'a dyn ProcessMemory,
    strings: &'a StringLayout,
    types: &'a TypeAddrs,
    /// Key → its text (None when not a `str`, or longer than [`MAX_KEY_CHARS`]).
    keys: RefCell<HashMap<u64, Option<String>>>,
}

impl<'a> Objects<'a> {
    pub(crate) fn new(
        l: &'static ObjectLayout,
        mem: &'a dyn ProcessMemory,
        strings: &'a StringLayout,
        types: &'a TypeAddrs,
    ) -> Objects<'a> {
        Objects {
            l,
            mem,
            strings,
            types,
            keys: RefCell::new(HashMap::new()),
        }
    }

    fn word(&self, addr: u64, off: i64) -> Result<u64> {
        self.mem.read_u64(addr.wrapping_add_signed(off))
    }

    fn byte(&self, addr: u64, off: i64) -> Result<u8> {
        let mut b = [0u8; 1];
        self.mem.read(addr.wrapping_add_signed(off), &mut b)?;
        Ok(b[0])
    }

    fn ty(&self, obj: u64) -> Result<u64> {
        if obj == 0 {
            return Err(bad(obj, "a null object"));
        }
        self.word(obj, self.l.ob_type)
    }

    /// Whether `obj` is of the type at `exact` when that is known, else of a type whose
    /// flags have `flag` (a subclass of the built-in type).
    fn is_of(&self, obj: u64, exact: u64, flag: i64) -> Result<bool> {
        let ty = self.ty(obj)?;
        if exact != 0 {
            return Ok(ty == exact);
        }
        Ok(self.word(ty, self.l.tp_flags)? & flag as u64 != 0)
    }

    /// Whether `obj` is a module, that is, of `PyModule_Type` (by address when known, else
    /// by the type's name).
    fn is_module(&self, obj: u64) -> Result<bool> {
        let ty = self.ty(obj)?;
        if self.types.module != 0 {
            return Ok(ty == self.types.module);
        }
        let at = self.word(ty, self.l.tp_name)?;
        let mut buf = [0u8; 8];
        let n = self.mem.read_prefix(at, &mut buf)?;
        Ok(n >= 7 && &buf[..7] == b"module\0")
    }

    /// The (key, value) pairs of dict `dict`, in its order, checked against its count.
    pub(crate) fn dict_items(&self, dict: u64) -> Result<Vec<(u64, u64)>> {
        let l = self.l;
        if !self.is_of(dict, self.types.dict, l.flag_dict)? {
            return Err(bad(dict, "not a dict"));
        }
        let used = self.word(dict, l.ma_used)?;
        if used > MAX_DICT_ITEMS {
            return Err(bad(dict, "a dict too big to read"));
        }
        let items = match (l.ma_mask, l.ma_table, l.ma_keys, l.ma_values) {
            (Some(mask), Some(table), _, _) => self.table_items(dict, mask, table)?,
            (_, _, Some(keys), Some(values)) => {
                let keys = self.word(dict, keys)?;
                let values = self.word(dict, values)?;
                self.keys_items(keys, values)?
            }
            _ => return Err(bad(dict, "no dict layout for this version")),
        };
        if items.len() as u64 != used {
            return Err(bad(dict, "a dict whose entries do not add up to its count"));
        }
        Ok(items)
    }

    /// 2.7: the live entries of the dict's table (`ma_mask + 1` slots).
    fn table_items(&self, dict: u64, mask_at: i64, table_at: i64) -> Result<Vec<(u64, u64)>> {
        let l = self.l;
        let mask = self.word(dict, mask_at)?;
        if mask >= MAX_DICT_SLOTS || (mask + 1) & mask != 0 {
            return Err(bad(dict, "a dict table of implausible size"));
        }
        let table = self.word(dict, table_at)?;
        let size = l.entry_size as usize;
        let buf = self.mem.read_vec(table, (mask as usize + 1) * size)?;
        Ok(buf
            .chunks_exact(size)
            .map(|e| {
                (
                    field_u64(e, l.entry_key as usize),
                    field_u64(e, l.entry_value as usize),
                )
            })
            .filter(|&(k, v)| k != 0 && v != 0)
            .collect())
    }

    /// 3.6+: the (key, value) pairs of the entries of keys object `keys` (a split dict's
    /// values in `values`, else 0).
    fn keys_items(&self, keys: u64, values: u64) -> Result<Vec<(u64, u64)>> {
        let l = self.l;
        let missing = || bad(keys, "no dict keys layout for this version");
        let (entries, n, (size, key, value)) = match l.dk_size {
            // 3.6–3.10: word-sized fields; indices of 1, 2, 4 or 8 bytes by the slot count.
            Some(size_at) => {
                let slots = self.word(keys, size_at)?;
                if slots == 0 || slots & (slots - 1) != 0 || slots > MAX_DICT_SLOTS {
                    return Err(bad(keys, "dict keys of implausible size"));
                }
                let index_bytes = match slots {
                    0..=0xff => 1,
                    0x100..=0xffff => 2,
                    _ => 4,
                };
                let n = self.word(keys, l.dk_nentries.ok_or_else(missing)?)?;
                let indices = l.dk_indices.ok_or_else(missing)?;
                let at = keys.wrapping_add_signed(indices + (slots * index_bytes) as i64);
                (at, n, (l.entry_size, l.entry_key, l.entry_value))
            }
            // 3.11+: byte-sized log2 sizes, and entries with or without a hash.
            None => {
                let log2 = self.byte(keys, l.dk_log2_size.ok_or_else(missing)?)? as u64;
                let log2_index =
                    self.byte(keys, l.dk_log2_index_bytes.ok_or_else(missing)?)? as u64;
                let kind = self.byte(keys, l.dk_kind.ok_or_else(missing)?)? as i64;
                let n = self.word(keys, l.dk_nentries.ok_or_else(missing)?)?;
                if log2 > 30 || !(log2..=log2 + 3).contains(&log2_index) || n > 1 << log2 {
                    return Err(bad(keys, "dict keys of implausible size"));
                }
                let indices = l.dk_indices.ok_or_else(missing)?;
                let at = keys.wrapping_add_signed(indices + (1i64 << log2_index));
                let entry = if Some(kind) == l.dict_keys_general {
                    (l.entry_size, l.entry_key, l.entry_value)
                } else {
                    let (Some(s), Some(k), Some(v)) = (l.uentry_size, l.uentry_key, l.uentry_value)
                    else {
                        return Err(missing());
                    };
                    (s, k, v)
                };
                (at, n, entry)
            }
        };
        if n > MAX_DICT_ITEMS.min(MAX_DICT_SLOTS) {
            return Err(bad(keys, "a dict too big to read"));
        }
        let buf = self.mem.read_vec(entries, n as usize * size as usize)?;
        let split = if values != 0 {
            let mut slots = n;
            if let Some(at) = l.values_capacity {
                // 3.13+: the values say how many slots they have.
                slots = slots.min(self.byte(values, at)? as u64);
            }
            let first = values.wrapping_add_signed(l.values_values.unwrap_or(0));
            Some(self.mem.read_vec(first, slots as usize * 8)?)
        } else {
            None
        };
        let mut out = Vec::new();
        for i in 0..n as usize {
            let k = field_u64(&buf, i * size as usize + key as usize);
            let v = match &split {
                Some(v) if (i + 1) * 8 <= v.len() => field_u64(v, i * 8),
                Some(_) => 0,
                None => field_u64(&buf, i * size as usize + value as usize),
            };
            if k != 0 && v != 0 {
                out.push((k, v));
            }
        }
        Ok(out)
    }

    /// The text of `key` when it is a `str` of at most [`MAX_KEY_CHARS`] characters.
    fn key_text(&self, key: u64) -> Option<String> {
        if let Some(t) = self.keys.borrow().get(&key) {
            return t.clone();
        }
        let text = self.short_text(key).ok().flatten();
        self.keys.borrow_mut().insert(key, text.clone());
        text
    }

    fn short_text(&self, key: u64) -> Result<Option<String>> {
        let exact = match self.strings.model {
            StringModel::Bytes2 => self.types.bytes,
            StringModel::Pep393 => self.types.unicode,
        };
        if !self.is_of(key, exact, self.l.flag_str)? {
            return Ok(None);
        }
        let len_at = match self.strings.model {
            StringModel::Bytes2 => self.strings.bytes_size,
            StringModel::Pep393 => self.strings.unicode_length,
        };
        if self.word(key, len_at as i64)? > MAX_KEY_CHARS {
            return Ok(None);
        }
        self.text(key).map(Some)
    }

    /// The value of the `str` key `name` among `items`.
    pub(crate) fn find_str(&self, items: &[(u64, u64)], name: &str) -> Option<u64> {
        items
            .iter()
            .find(|(k, _)| self.key_text(*k).is_some_and(|t| t == name))
            .map(|&(_, v)| v)
    }

    /// The text of `str` object `obj` (2.7: `str`, its bytes as UTF-8).
    pub(crate) fn text(&self, obj: u64) -> Result<String> {
        strings::read_text(self.mem, self.strings, self.types, obj)
    }

    /// Instance attribute `name` of `obj`, as its instance dict or values hold it (None when
    /// it has none, or no storage for attributes).
    pub(crate) fn attr(&self, obj: u64, name: &str) -> Result<Option<u64>> {
        let l = self.l;
        let ty = self.ty(obj)?;
        let flags = self.word(ty, l.tp_flags)?;
        let managed = l.flag_managed_dict.is_some_and(|f| flags & f as u64 != 0);
        let mut dict = 0;
        if managed {
            let at = l
                .managed_dict
                .ok_or(bad(ty, "a managed dict without its layout"))?;
            let mut values = 0;
            if let Some(values_at) = l.managed_values {
                // 3.11: a values pointer, else a dict pointer.
                values = self.word(obj, values_at)?;
                if values == 0 {
                    dict = self.word(obj, at)?;
                }
            } else if let Some(untag) = l.values_untag {
                // 3.12: one word, the values tagged by its low bit.
                let w = self.word(obj, at)?;
                if w & 1 != 0 {
                    values = w.wrapping_add_signed(untag);
                } else {
                    dict = w;
                }
            } else {
                // 3.13+: a dict pointer; without a dict, the values inline (when the type
                // keeps them there), which say whether they hold the attributes.
                dict = self.word(obj, at)?;
                let inline = l.flag_inline_values.unwrap_or(0) as u64;
                if dict == 0 && flags & inline != 0 {
                    let size = self.word(ty, l.tp_basicsize)?;
                    if size > MAX_BASIC_SIZE {
                        return Err(bad(ty, "a type of implausible size"));
                    }
                    values = obj.wrapping_add(size);
                    let valid = l
                        .values_valid
                        .ok_or(bad(ty, "inline values without layout"))?;
                    if self.byte(values, valid)? == 0 {
                        return Ok(None);
                    }
                }
            }
            if values != 0 {
                let cached = l
                    .ht_cached_keys
                    .ok_or(bad(ty, "split values without layout"))?;
                let keys = self.word(ty, cached)?;
                if keys == 0 {
                    return Err(bad(ty, "split values without the type's keys"));
                }
                let items = self.keys_items(keys, values)?;
                return Ok(self.find_str(&items, name));
            }
        } else {
            // A var-sized object's negative offset is not read (no instance read here is one).
            let off = self.word(ty, l.tp_dictoffset)? as i64;
            if off > 0 && off < MAX_BASIC_SIZE as i64 {
                dict = self.word(obj, off)?;
            }
        }
        if dict == 0 {
            return Ok(None);
        }
        let items = self.dict_items(dict)?;
        Ok(self.find_str(&items, name))
    }

    /// The low 64 bits of `int` `obj`, as CPython makes a thread's ident from a C long or
    /// unsigned long (None when not an `int`, or out of that range).
    pub(crate) fn int_bits(&self, obj: u64) -> Result<Option<u64>> {
        let l = self.l;
        if !self.is_of(obj, self.types.int, l.flag_int)? {
            return Ok(None);
        }
        if let Some(at) = l.int_value {
            // 2.7: a C long.
            return self.word(obj, at).map(Some);
        }
        let (digits_at, shift, digit_size) = (l.long_digits, l.long_shift, l.digit_size);
        let (ndigits, negative) = match l.long_tag {
            Some(tag) => {
                let tag = self.word(obj, tag)?;
                (tag >> 3, tag & 3 == 2)
            }
            None => {
                let size = self.word(obj, l.ob_size)? as i64;
                (size.unsigned_abs(), size < 0)
            }
        };
        let shift = shift as u64;
        // Three 30-bit digits hold any 64-bit value.
        if negative || digit_size != 4 || ndigits.saturating_mul(shift) > 64 + shift {
            return Ok(None);
        }
        let mut digits = vec![0u8; ndigits as usize * 4];
        self.mem
            .read(obj.wrapping_add_signed(digits_at), &mut digits)?;
        let mut value: u128 = 0;
        for (i, d) in digits.chunks_exact(4).enumerate() {
            let d = u32::from_le_bytes(d.try_into().expect("4 bytes")) as u128;
            value |= d << (shift as u32 * i as u32);
        }
        Ok(u64::try_from(value).ok())
    }

    /// The dict of module `name` of the interpreter at `interp`
    /// (`sys.modules[name].__dict__`); None while it is not imported.
    pub(crate) fn module_dict(&self, interp: u64, name: &str) -> Result<Option<u64>> {
        let modules = self.word(interp, self.l.interp_modules)?;
        if modules == 0 {
            return Ok(None);
        }
        let items = self.dict_items(modules)?;
        let Some(module) = self.find_str(&items, name) else {
            return Ok(None);
        };
        if !self.is_module(module)? {
            return Err(bad(module, "a sys.modules entry that is not a module"));
        }
        let dict = self.word(module, self.l.md_dict)?;
        Ok((dict != 0).then_some(dict))
    }
}

#[cfg(test)]
#[path = "objects_tests.rs"]
mod tests;
