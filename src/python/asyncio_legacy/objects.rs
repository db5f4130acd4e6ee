//! The objects on the way to 3.11–3.13's tasks, read from outside: dicts (combined or split),
//! sets, lists, weak references, instance attributes (a type's dict offset, or its managed
//! dict and values), small ints, and the task object itself ([`TaskLayout`]).
//!
//! Owns: [`Rd`] (one version's layouts over one process's memory, with type caches).
//! Must not: know about tasks' graph or threads (the parent module does).
//!
//! Every size read is bounded before it is used.

use crate::error::{Error, Result};
use crate::ptrace::{field_u64, ProcessMemory};
use crate::python::StackWalker;
use crate::python_bindings::LegacyAsyncLayout;
use std::collections::HashMap;

/// Entries of a dict read at most.
const MAX_DICT_ENTRIES: i64 = 1 << 17;
/// Slots of a set read at most.
const MAX_SET_SLOTS: u64 = 1 << 20;
/// Items of a list read at most.
const MAX_LIST: i64 = 1 << 20;
/// Links of a type's `tp_base` chain followed at most.
const MAX_BASES: usize = 32;

/// The fields of `TaskObj` that are read.
#[derive(Debug, Clone, Copy)]
pub(super) struct TaskLayout {
    /// `sizeof(TaskObj)`: the type's `tp_basicsize`.
    pub(super) size: u64,
    pub(super) event_loop: u64,
    pub(super) fut_waiter: u64,
    pub(super) coro: u64,
    pub(super) name: u64,
    /// 3.11/3.12: the `dict` field of the future's head (the type's `tp_dictoffset`).
    pub(super) dict: Option<i64>,
}

impl TaskLayout {
    /// From the declarations of `FutureObj_HEAD` and `TaskObj` (3.13: read in the 3.13.15
    /// sources; 3.11/3.12: as the builds' own types and objects show it, field by field).
    /// After the object header come:
    /// - `loop` and nine more object pointers:
    ///   - 3.11/3.12: eight, then the state and two int flags, `dict`, the weak reference
    ///     list, `cancelled_exc`;
    ///   - 3.13: nine, then the state, a word of bit flags and an int;
    /// - then `fut_waiter`, `coro`, `name`, `context` and (3.11/3.12) three ints.
    pub(super) fn of(l: &LegacyAsyncLayout) -> TaskLayout {
        let h = l.object_size as u64;
        if l.version.1 <= 12 {
            TaskLayout {
                size: h + 160,
                event_loop: h,
                fut_waiter: h + 112,
                coro: h + 120,
                name: h + 128,
                dict: Some(h as i64 + 88),
            }
        } else {
            TaskLayout {
                size: h + 128,
                event_loop: h,
                fut_waiter: h + 96,
                coro: h + 104,
                name: h + 112,
                dict: None,
            }
        }
    }
}

/// One task's fields.
#[derive(Debug, Clone, Copy)]
pub(super) struct Head {
    pub(super) task: u64,
    pub(super) event_loop: u64,
    pub(super) fut_waiter: u64,
    pub(super) coro: u64,
    pub(super) name: u64,
}

/// Reads objects of one process with one version's layouts; caches type checks.
pub(super) struct Rd<'a> {
    pub(super) l: &'static LegacyAsyncLayout,
    pub(super) t: TaskLayout,
    pub(super) mem: &'a dyn ProcessMemory,
    /// Type → is it `_asyncio.Task` or a subclass.
    pub(super) task_types: HashMap<u64, bool>,
    /// Type → `tp_name`.
    pub(super) names: HashMap<u64, String>,
}

pub(super) fn bad(addr: u64, why: &'static str) -> Error {
    Error::Inconsistent { addr, why }
}

impl Rd<'_> {
    pub(super) fn word(&self, addr: u64, off: i64) -> Result<u64> {
        self.mem.read_u64(addr.wrapping_add_signed(off))
    }

    pub(super) fn byte(&self, addr: u64, off: i64) -> Result<u8> {
        let mut b = [0u8; 1];
        self.mem.read(addr.wrapping_add_signed(off), &mut b)?;
        Ok(b[0])
    }

    pub(super) fn ty(&self, obj: u64) -> Result<u64> {
        if obj == 0 {
            return Err(bad(obj, "a null object"));
        }
        self.word(obj, self.l.ob_type)
    }

    pub(super) fn flags(&self, ty: u64) -> Result<u64> {
        self.word(ty, self.l.tp_flags)
    }

    /// A type's `tp_name`.
    pub(super) fn type_name(&mut self, ty: u64) -> Result<String> {
        if let Some(n) = self.names.get(&ty) {
            return Ok(n.clone());
        }
        let at = self.word(ty, self.l.tp_name)?;
        let name = crate::python::strings::read_c_str::<96>(self.mem, at)?;
        self.names.insert(ty, name.clone());
        Ok(name)
    }

    /// `obj` is a task, of `_asyncio.Task` or a subclass.
    pub(super) fn is_task(&mut self, task_type: u64, obj: u64) -> bool {
        let Ok(ty) = self.ty(obj) else { return false };
        if let Some(&yes) = self.task_types.get(&ty) {
            return yes;
        }
        let mut at = ty;
        let mut yes = false;
        for _ in 0..MAX_BASES {
            if at == task_type {
                yes = true;
                break;
            }
            match self.word(at, self.l.tp_base) {
                Ok(b) if b != 0 => at = b,
                _ => break,
            }
        }
        self.task_types.insert(ty, yes);
        yes
    }

    /// The (key, value) pairs of the entries of dict keys `keys` (split values: `values`).
    pub(super) fn entries(&self, keys: u64, values: u64) -> Result<Vec<(u64, u64)>> {
        let l = self.l;
        let log2 = self.byte(keys, l.dk_log2_size)? as i64;
        let log2_index = self.byte(keys, l.dk_log2_index_bytes)? as i64;
        let kind = self.byte(keys, l.dk_kind)? as i64;
        let n = self.word(keys, l.dk_nentries)? as i64;
        if log2 > 30 || !(log2..=log2 + 3).contains(&log2_index) || n < 0 || n > 1 << log2 {
            return Err(bad(keys, "dict keys of implausible size"));
        }
        if n > MAX_DICT_ENTRIES {
            return Err(bad(keys, "a dict too big to read"));
        }
        let (size, key, value) = if kind == l.dict_keys_general {
            (l.entry_size, l.entry_key, l.entry_value)
        } else {
            (l.uentry_size, l.uentry_key, l.uentry_value)
        };
        let at = keys.wrapping_add_signed(l.dk_indices + (1i64 << log2_index));
        let buf = self.mem.read_vec(at, (n * size) as usize)?;
        let split = if values != 0 {
            let mut n = n;
            if l.values_valid.is_some() {
                // 3.13: the values say how many slots they have (their first byte).
                n = n.min(self.byte(values, 0)? as i64);
            }
            let v = self.mem.read_vec(
                values.wrapping_add_signed(l.values_values),
                (n * 8) as usize,
            )?;
            Some(v)
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

    /// The (key, value) pairs of dict `dict`.
    pub(super) fn dict_items(&self, dict: u64) -> Result<Vec<(u64, u64)>> {
        let keys = self.word(dict, self.l.ma_keys)?;
        let values = self.word(dict, self.l.ma_values)?;
        self.entries(keys, values)
    }

    /// `key` is the str `name`.
    pub(super) fn is_str(&self, walker: &StackWalker, key: u64, name: &str) -> bool {
        let s = &walker.layout.string;
        let Ok(len) = self.word(key, s.unicode_length as i64) else {
            return false;
        };
        if len != name.len() as u64 {
            return false;
        }
        let is_str = self
            .ty(key)
            .and_then(|t| self.flags(t))
            .is_ok_and(|f| f & self.l.flag_unicode as u64 != 0);
        is_str && walker.read_text(self.mem, key).is_ok_and(|t| t == name)
    }

    /// The value of str key `name` among `items`.
    pub(super) fn find(
        &self,
        walker: &StackWalker,
        items: &[(u64, u64)],
        name: &str,
    ) -> Option<u64> {
        items
            .iter()
            .find(|(k, _)| self.is_str(walker, *k, name))
            .map(|&(_, v)| v)
    }

    /// Instance attribute `name` of `obj` (None: it has none, or no attribute storage).
    pub(super) fn attr(&self, walker: &StackWalker, obj: u64, name: &str) -> Result<Option<u64>> {
        let l = self.l;
        let ty = self.ty(obj)?;
        let flags = self.flags(ty)?;
        let mut dict = 0;
        if flags & l.flag_managed_dict as u64 != 0 {
            let mut values = 0;
            if let Some(at) = l.managed_values {
                // 3.11: a values pointer, else a dict pointer.
                values = self.word(obj, at)?;
                if values == 0 {
                    dict = self.word(obj, l.managed_dict)?;
                }
            } else if let Some(untag) = l.values_untag {
                // 3.12: one word, the values tagged by its low bit.
                let w = self.word(obj, l.managed_dict)?;
                if w & 1 != 0 {
                    values = w.wrapping_add_signed(untag);
                } else {
                    dict = w;
                }
            } else {
                // 3.13: a dict pointer; without a dict, the values inline (if the type
                // keeps them there).
                dict = self.word(obj, l.managed_dict)?;
                let inline = l.flag_inline_values.unwrap_or(0) as u64;
                if dict == 0 && inline != 0 && flags & inline != 0 {
                    let size = self.word(ty, l.tp_basicsize)? as i64;
                    if !(0..=1 << 16).contains(&size) {
                        return Err(bad(ty, "a type of implausible size"));
                    }
                    values = obj.wrapping_add_signed(size);
                    // Inline values say whether they hold the attributes (`valid`). Only
                    // they set it, and values a dict allocated leave it unset.
                    let valid = l.values_valid.expect("3.13 has valid");
                    if self.byte(values, valid)? == 0 {
                        return Ok(None);
                    }
                }
            }
            if values != 0 {
                let keys = self.word(ty, l.ht_cached_keys)?;
                if keys == 0 {
                    return Err(bad(ty, "split values without the type's keys"));
                }
                let items = self.entries(keys, values)?;
                return Ok(self.find(walker, &items, name));
            }
        } else {
            let off = self.word(ty, l.tp_dictoffset)? as i64;
            if off > 0 && off < 1 << 16 {
                dict = self.word(obj, off)?;
            }
        }
        if dict == 0 {
            return Ok(None);
        }
        let items = self.dict_items(dict)?;
        Ok(self.find(walker, &items, name))
    }

    /// The keys of set `set` (dummies of deleted keys included, so the caller checks types).
    pub(super) fn set_items(&self, set: u64) -> Result<Vec<u64>> {
        let l = self.l;
        let mask = self.word(set, l.set_mask)?;
        let table = self.word(set, l.set_table)?;
        if mask >= MAX_SET_SLOTS || (mask + 1) & mask != 0 {
            return Err(bad(set, "a set of implausible size"));
        }
        let size = l.setentry_size as usize;
        let slots = self.mem.read_vec(table, (mask as usize + 1) * size)?;
        Ok(slots
            .chunks_exact(size)
            .map(|s| field_u64(s, l.setentry_key as usize))
            .filter(|&k| k != 0)
            .collect())
    }

    /// The items of list `list`.
    pub(super) fn list_items(&self, list: u64) -> Result<Vec<u64>> {
        let n = self.word(list, self.l.ob_size)? as i64;
        if !(0..=MAX_LIST).contains(&n) {
            return Err(bad(list, "a list of implausible length"));
        }
        let items = self.word(list, self.l.list_items)?;
        let buf = self.mem.read_vec(items, n as usize * 8)?;
        Ok(buf.chunks_exact(8).map(|c| field_u64(c, 0)).collect())
    }

    /// A non-negative `int` below 2**64 (None for any other object).
    pub(super) fn small_uint(&self, obj: u64) -> Result<Option<u64>> {
        let l = self.l;
        if self.flags(self.ty(obj)?)? & l.flag_long as u64 == 0 {
            return Ok(None);
        }
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
        let shift = l.long_shift as u64;
        // Three 30-bit digits hold any 64-bit value.
        if negative || ndigits.saturating_mul(shift) > 64 + shift {
            return Ok(None);
        }
        let mut digits = vec![0u8; ndigits as usize * 4];
        self.mem
            .read(obj.wrapping_add_signed(l.long_digits), &mut digits)?;
        let mut value: u128 = 0;
        for (i, d) in digits.chunks_exact(4).enumerate() {
            let d = u32::from_le_bytes(d.try_into().expect("4 bytes")) as u128;
            value |= d << (shift as u32 * i as u32);
        }
        Ok(u64::try_from(value).ok())
    }

    pub(super) fn head(&self, task: u64) -> Result<Head> {
        let buf = self.mem.read_vec(task, self.t.size as usize)?;
        let f = |off: u64| field_u64(&buf, off as usize);
        Ok(Head {
            task,
            event_loop: f(self.t.event_loop),
            fut_waiter: f(self.t.fut_waiter),
            coro: f(self.t.coro),
            name: f(self.t.name),
        })
    }
}

#[cfg(test)]
mod tests;
