//! The names a program gave its threads (`threading.Thread(name=...)`, `t.name = ...`),
//! read from outside. They come from each interpreter's `threading._active` (a dict,
//! ident → `Thread`) and each `Thread`'s `_name` (2.7: `_Thread__name`, its `__name`
//! mangled). The ident is the thread's `pthread_t`, which its thread state records
//! (`thread_id`).
//!
//! Owns: [`ThreadNames`] (where each interpreter's `_active` was found, kept between
//! reads, and when to look for it again) and [`NamesRead`].
//!
//! Must not: pause threads, or be read at every sample (callers read when the threads
//! change, and now and then for renames). What it reads is checked, not frozen. A dict
//! that changes under the read fails its count check, and the read is tried once more.

use super::objects::{Objects, MAX_DICT_ITEMS};
use super::process::PythonProcess;
use crate::error::{Error, Result};
use crate::ptrace::{PageCache, ProcessMemory};
use crate::python_bindings::object_layout;
use crate::IdMap;
use std::time::{Duration, Instant};

/// How long where an interpreter's `_active` was found is trusted while a thread wanted
/// is missing there (a thread of C code never is in it; `sys.modules` is read again in case
/// `threading` was imported anew).
const RELOCATE: Duration = Duration::from_secs(2);
/// How long that an interpreter has no `threading` yet is trusted. A program imports it
/// early, often right after the first look (at its start).
const RELOCATE_ABSENT: Duration = Duration::from_millis(200);

/// Reads of one interpreter's names tried at most in a row (a dict resized under the
/// first read fails its count).
const TRIES: usize = 2;

/// What one read found: names by (interpreter address, thread ident), and why some
/// interpreters' could not be read.
#[derive(Debug, Default)]
pub(crate) struct NamesRead {
    pub(crate) names: IdMap<(u64, u64), String>,
    /// None when every interpreter's `threading` was read (or is not imported).
    pub(crate) unavailable: Option<String>,
}

/// Where an interpreter's `_active` was found, and when it was looked for.
#[derive(Debug, Clone, Copy)]
struct Found {
    /// None: `threading` was not imported then.
    active: Option<u64>,
    at: Instant,
}

/// The names of every interpreter's threads, with where each interpreter's `_active` was
/// found (kept from one read to the next).
#[derive(Debug, Default)]
pub(crate) struct ThreadNames {
    found: IdMap<u64, Found>,
}

impl ThreadNames {
    /// The names of the threads `wanted` ((interpreter address, ident) each). That is every
    /// thread of each of their interpreters that `threading` knows, the wanted ones
    /// among them.
    pub(crate) fn read(
        &mut self,
        proc: &PythonProcess,
        mem: &dyn ProcessMemory,
        wanted: &[(u64, u64)],
    ) -> NamesRead {
        let (major, minor) = proc.layout.version;
        let Some(l) = object_layout(major, minor, proc.layout.free_threaded) else {
            return NamesRead {
                names: IdMap::default(),
                unavailable: Some(format!(
                    "no layout of the objects of this build of Python {major}.{minor}"
                )),
            };
        };
        let mut interps: Vec<u64> = wanted.iter().map(|w| w.0).filter(|&i| i != 0).collect();
        interps.sort_unstable();
        interps.dedup();
        self.found.retain(|i, _| interps.binary_search(i).is_ok());
        let mut out = NamesRead::default();
        let attr = if major == 2 { "_Thread__name" } else { "_name" };
        for interp in interps {
            let want: Vec<u64> = wanted
                .iter()
                .filter(|w| w.0 == interp)
                .map(|w| w.1)
                .collect();
            let mut result = Err(Error::Inconsistent {
                addr: interp,
                why: "not read",
            });
            for _ in 0..TRIES {
                // A fresh cache each time, so the second try reads the target anew.
                let cache = PageCache::new(mem);
                let o = Objects::new(l, &cache, &proc.layout.string, &proc.addrs.types);
                result = self.read_interp(&o, interp, &want, attr);
                if result.is_ok() {
                    break;
                }
            }
            match result {
                Ok(names) => out
                    .names
                    .extend(names.into_iter().map(|(id, n)| ((interp, id), n))),
                Err(e) => {
                    self.found.remove(&interp);
                    out.unavailable
                        .get_or_insert_with(|| format!("the threading module is unreadable: {e}"));
                }
            }
        }
        out
    }

    /// The names of interpreter `interp`'s threads, from its `_active` as found before
    /// when that still reads and names every thread of `want` (or was found lately), else
    /// found again.
    fn read_interp(
        &mut self,
        o: &Objects,
        interp: u64,
        want: &[u64],
        attr: &str,
    ) -> Result<IdMap<u64, String>> {
        if let Some(f) = self.found.get(&interp).copied() {
            let age = f.at.elapsed();
            match f.active {
                Some(active) => {
                    if let Ok(names) = read_active(o, active, attr) {
                        if age < RELOCATE || want.iter().all(|t| names.contains_key(t)) {
                            return Ok(names);
                        }
                    }
                }
                None if age < RELOCATE_ABSENT => return Ok(IdMap::default()),
                None => {}
            }
        }
        let active = locate(o, interp)?;
        self.found.insert(
            interp,
            Found {
                active,
                at: Instant::now(),
            },
        );
        match active {
            Some(a) => read_active(o, a, attr),
            None => Ok(IdMap::default()),
        }
    }
}

/// `threading._active` of the interpreter at `interp` (None while `threading` is not
/// imported there).
pub(super) fn locate(o: &Objects, interp: u64) -> Result<Option<u64>> {
    let Some(dict) = o.module_dict(interp, "threading")? else {
        return Ok(None);
    };
    let items = o.dict_items(dict)?;
    Ok(o.find_str(&items, "_active"))
}

/// Each thread's name in `_active` (dict `active`), by ident. Entries whose key is no
/// `int` or whose value has no `str` attribute `attr` are left out.
pub(super) fn read_active(o: &Objects, active: u64, attr: &str) -> Result<IdMap<u64, String>> {
    let items = o.dict_items(active)?;
    debug_assert!(items.len() as u64 <= MAX_DICT_ITEMS);
    let mut out = IdMap::default();
    for (key, thread) in items {
        let Some(ident) = o.int_bits(key)? else {
            continue;
        };
        // One thread's torn object costs its name, not the others'.
        if let Ok(Some(name)) = o.attr(thread, attr) {
            if let Ok(text) = o.text(name) {
                out.insert(ident, text);
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A version with no objects table (one read through `_Py_DebugOffsets` alone) has no
    /// names, and says why, without reading anything.
    #[test]
    fn a_version_without_an_objects_table_says_so() {
        let mut layout = **crate::python_bindings::GENERATED.last().expect("a layout");
        layout.version = (3, 99);
        let proc = PythonProcess::own_for_tests(layout, 0);
        let mem = crate::ptrace::BufferMemory {
            base: 0,
            bytes: Vec::new(),
        };
        let read = ThreadNames::default().read(&proc, &mem, &[(0x1000, 0x7f00)]);
        assert!(read.names.is_empty());
        let why = read.unavailable.expect("a reason");
        assert!(why.contains("no layout") && why.contains("3.99"), "{why}");
    }
}
