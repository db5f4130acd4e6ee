//! A frame's local variables read from outside (`dump --locals`): its arguments, then its
//! other locals, cells and free variables, each with a short repr of its value.
//!
//! Owns:
//! - [`Local`] and its [`LocalKind`];
//! - [`LocalsOptions`] (the bounds of the reprs and the budget of a dump);
//! - [`read_frame`]: which slots of a frame hold what, on every version of the matrix.
//!
//! The slots:
//! - ≤3.10: `f_localsplus` holds `co_nlocals` locals (named by `co_varnames`, the
//!   arguments first), then a cell per `co_cellvars`, then one per `co_freevars`;
//! - 3.11+: `localsplus` holds `co_nlocalsplus` slots named by `co_localsplusnames`, each
//!   of the kind its byte of `co_localspluskinds` says (hidden ones, a comprehension's
//!   inlined variables, are left out). 3.14+ slots are tagged `_PyStackRef`s;
//! - a cell or free variable's slot holds a cell, whose contents are the value (before
//!   3.11's `MAKE_CELL` runs, an argument's slot still holds the argument itself).
//!
//! An unbound slot (NULL, or an empty cell) is left out, as `locals()` leaves it out.
//! Submodules: `repr` (a value's text), `budget` (the limits of one dump's reads).
//!
//! Must not: call anything in the target, make a system call, or pause a thread (the
//! caller reads while the threads are paused, so every value is of one moment).

mod budget;
mod repr;
#[cfg(test)]
mod tests;

use crate::error::{Error, Result};
use crate::ptrace::{field_u64, ProcessMemory};
use crate::python::strings::{self, TypeAddrs};
use crate::python_bindings::{FrameModel, Layout, ObjectLayout};
pub use budget::Budget;
pub(crate) use budget::Budgeted;
pub use repr::ReprBounds;
pub(crate) use repr::Values;

/// Slots of a frame read at most (CPython's compiler makes far fewer).
const MAX_SLOTS: u64 = 1 << 16;

fn bad(addr: u64, why: &'static str) -> Error {
    Error::Inconsistent { addr, why }
}

/// What `dump --locals` reads.
#[derive(Debug, Clone, Copy, Default)]
pub struct LocalsOptions {
    pub bounds: ReprBounds,
    pub budget: Budget,
}

/// What a variable of a frame is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LocalKind {
    /// A parameter (positional, keyword-only, `*args`, `**kwargs`).
    Arg,
    Local,
    /// A local that a nested function uses (held in a cell).
    Cell,
    /// A variable of an enclosing function (a closure's).
    Free,
}

impl LocalKind {
    pub fn as_str(self) -> &'static str {
        match self {
            LocalKind::Arg => "arg",
            LocalKind::Local => "local",
            LocalKind::Cell => "cell",
            LocalKind::Free => "free",
        }
    }
}

/// One variable of a frame and its value.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Local {
    pub name: String,
    pub kind: LocalKind,
    /// The value's type name (None when even that could not be read).
    #[serde(rename = "type")]
    pub type_name: Option<String>,
    /// The value's repr (see `repr`), or `<unreadable: why>`.
    pub repr: String,
    /// The value object's address (a cell's contents, not the cell).
    #[serde(serialize_with = "hex")]
    pub address: u64,
}

fn hex<S: serde::Serializer>(a: &u64, s: S) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_str(&format!("{a:#x}"))
}

/// A frame's locals, or why they were not read.
pub type FrameLocals = std::result::Result<Vec<Local>, String>;

/// One version's layouts for reading locals.
pub(crate) struct LocalsLayout<'a> {
    pub(crate) layout: &'a Layout,
    pub(crate) objects: &'static ObjectLayout,
    pub(crate) types: &'a TypeAddrs,
}

/// The locals of every frame of `frames` (addresses of frames the walk showed), read
/// through `mem` (which holds the dump's budget).
pub(crate) fn read_frames(
    l: &LocalsLayout,
    mem: &Budgeted,
    frames: &[u64],
    bounds: ReprBounds,
) -> Vec<FrameLocals> {
    let values = Values::new(l.objects, mem, &l.layout.string, l.types, bounds);
    frames
        .iter()
        .map(|&f| read_frame(&values, l, f).map_err(|e| e.to_string()))
        .collect()
}

/// The names in tuple `tuple` of `str`s.
fn names(v: &Values, l: &LocalsLayout, tuple: u64) -> Result<Vec<String>> {
    let o = v.l;
    let n = v.word(tuple, o.ob_size)?;
    if n > MAX_SLOTS {
        return Err(bad(tuple, "a names tuple of implausible size"));
    }
    let items = v
        .mem
        .read_vec(tuple.wrapping_add_signed(o.tuple_items), n as usize * 8)?;
    (0..n as usize)
        .map(|i| strings::read_text(v.mem, &l.layout.string, l.types, field_u64(&items, i * 8)))
        .collect()
}

/// The locals of the frame at `frame`, in slot order (the arguments first).
pub(crate) fn read_frame(v: &Values, l: &LocalsLayout, frame: u64) -> Result<Vec<Local>> {
    let o = v.l;
    let f = &l.layout.frame;
    let interp = matches!(f.model, FrameModel::Interpreter);
    let mut code = v.word(frame, f.code as i64)?;
    if interp {
        // 3.14+: `f_executable` is a tagged `_PyStackRef` (0 before).
        code &= !7;
    }
    let argcount = v.code_int(code, o.code_argcount)?;
    let kwonly = match o.code_kwonlyargcount {
        Some(at) => v.code_int(code, at)?,
        None => 0,
    };
    let flags = v.code_int(code, o.code_flags)? as i64;
    let nargs = argcount as i64
        + kwonly as i64
        + i64::from(flags & o.co_varargs != 0)
        + i64::from(flags & o.co_varkeywords != 0);
    // Each variable: its name (None: a hidden slot), its kind, whether it holds a cell, and
    // which slot holds it.
    let mut slots: Vec<(Option<String>, LocalKind, bool, usize)> = Vec::new();
    let kind_of = |i: usize, other: LocalKind| {
        if (i as i64) < nargs {
            LocalKind::Arg
        } else {
            other
        }
    };
    match (
        o.code_nlocalsplus,
        o.code_localsplusnames,
        o.code_localspluskinds,
    ) {
        (Some(n_at), Some(names_at), Some(kinds_at)) => {
            let n = v.code_int(code, n_at)?;
            if !(0..=MAX_SLOTS as i32).contains(&n) {
                return Err(bad(code, "a code object with an implausible slot count"));
            }
            let all = names(v, l, v.word(code, names_at)?)?;
            let kinds_obj = v.word(code, kinds_at)?;
            let kinds = strings::read_bytes(v.mem, &l.layout.string, l.types, kinds_obj)?;
            if all.len() != n as usize || kinds.len() != n as usize {
                return Err(bad(code, "slot names or kinds that do not match the count"));
            }
            let bit = |b: Option<i64>, k: u8| b.is_some_and(|b| k as i64 & b != 0);
            for (i, (name, &k)) in all.into_iter().zip(&kinds).enumerate() {
                let kind = if bit(o.fast_hidden, k) {
                    None
                } else if bit(o.fast_free, k) {
                    Some(LocalKind::Free)
                } else if bit(o.fast_cell, k) {
                    Some(LocalKind::Cell)
                } else {
                    Some(LocalKind::Local)
                };
                let celled = bit(o.fast_free, k) || bit(o.fast_cell, k);
                match kind {
                    Some(kind) => slots.push((Some(name), kind_of(i, kind), celled, i)),
                    None => slots.push((None, LocalKind::Local, false, i)),
                }
            }
        }
        _ => {
            let missing = || bad(code, "no layout of this version's code object");
            let n = v.code_int(code, o.code_nlocals.ok_or_else(missing)?)?;
            if !(0..=MAX_SLOTS as i32).contains(&n) {
                return Err(bad(code, "a code object with an implausible local count"));
            }
            let varnames = names(v, l, v.word(code, o.code_varnames.ok_or_else(missing)?)?)?;
            if varnames.len() < n as usize {
                return Err(bad(code, "fewer local names than locals"));
            }
            let cellvars = names(v, l, v.word(code, o.code_cellvars.ok_or_else(missing)?)?)?;
            let freevars = names(v, l, v.word(code, o.code_freevars.ok_or_else(missing)?)?)?;
            let n = n as usize;
            // An argument that a nested function uses lives in its cell (its own slot is
            // cleared when the frame starts). It is shown in the argument's place, as 3.11+
            // has it.
            let mut moved = vec![false; cellvars.len()];
            for (i, name) in varnames.into_iter().take(n).enumerate() {
                let cell = cellvars.iter().position(|c| *c == name);
                match cell {
                    Some(j) if (i as i64) < nargs => {
                        moved[j] = true;
                        slots.push((Some(name), LocalKind::Arg, true, n + j));
                    }
                    _ => slots.push((Some(name), kind_of(i, LocalKind::Local), false, i)),
                }
            }
            for (j, name) in cellvars.into_iter().enumerate() {
                if !moved[j] {
                    slots.push((Some(name), LocalKind::Cell, true, n + j));
                }
            }
            let cells = moved.len();
            for (j, name) in freevars.into_iter().enumerate() {
                slots.push((Some(name), LocalKind::Free, true, n + cells + j));
            }
        }
    }
    let count = slots.iter().map(|s| s.3 + 1).max().unwrap_or(0);
    if count as u64 > MAX_SLOTS {
        return Err(bad(code, "a frame of implausibly many slots"));
    }
    let raw = v
        .mem
        .read_vec(frame.wrapping_add_signed(o.frame_localsplus), count * 8)?;
    let mut out = Vec::new();
    for (name, kind, celled, slot) in slots {
        let Some(name) = name else { continue };
        let mut value = field_u64(&raw, slot * 8);
        if let Some(bits) = o.stackref_tag_bits {
            let tag = value & bits as u64;
            // 0: a pointer; 1 (`Py_TAG_REFCNT`): a pointer whose count is deferred (and
            // alone, NULL); other tags are no object of their own.
            if tag > 1 {
                out.push(unreadable(
                    name,
                    kind,
                    value,
                    "a tagged value, not an object",
                ));
                continue;
            }
            value &= !(bits as u64);
        }
        if value == 0 {
            continue;
        }
        if celled {
            match v.type_of(value) {
                Ok(t) if t.kind == repr::Kind::Cell => match v.cell_contents(value) {
                    Ok(0) => continue,
                    Ok(inner) => value = inner,
                    Err(e) => {
                        out.push(unreadable_err(name, kind, value, &e));
                        continue;
                    }
                },
                Ok(_) => {}
                Err(e) => {
                    out.push(unreadable_err(name, kind, value, &e));
                    continue;
                }
            }
        }
        out.push(match v.repr(value) {
            Ok((type_name, repr)) => Local {
                name,
                kind,
                type_name: Some(type_name),
                repr,
                address: value,
            },
            Err(e) => unreadable_err(name, kind, value, &e),
        });
    }
    Ok(out)
}

fn unreadable(name: String, kind: LocalKind, address: u64, why: &str) -> Local {
    Local {
        name,
        kind,
        type_name: None,
        repr: format!("<unreadable: {why}>"),
        address,
    }
}

fn unreadable_err(name: String, kind: LocalKind, address: u64, e: &Error) -> Local {
    let why = match e {
        Error::Inconsistent { why, .. } => why.to_string(),
        other => other.to_string(),
    };
    unreadable(name, kind, address, &why)
}
