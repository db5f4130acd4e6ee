//! Function symbols of one image, by address, and the demangling of their names.
//!
//! Owns:
//! - [`Symbols`], built from the symbol tables of one or more files (an image's `.symtab`
//!   and `.dynsym`, its debug file's and its MiniDebugInfo's `.symtab`; functions with a
//!   size only);
//! - [`demangle`] (C++ through `cpp_demangle`, Rust through `rustc-demangle`).
//!
//! Must not: guess. An address outside every symbol's `[start, start + size)` has no name
//! here (the caller shows it as `library+0xOFFSET`), never the nearest symbol below it.
//! A stripped library's exported symbols are few, and the nearest one is most often
//! another function altogether.

use std::borrow::Cow;
use std::ops::Range;

/// Symbol tables of an image: (file range of the table, file range of its strings) each.
pub(crate) type Tables = Vec<(Range<usize>, Range<usize>)>;

/// One function, `[start, end)` in SVMAs, and where its name lies: which file's bytes hold
/// it (the index of its source in [`Symbols::parse`]), and where there.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Sym {
    start: u64,
    end: u64,
    source: usize,
    name: Range<usize>,
    /// Lower is preferred among aliases of one range: global, then weak, then local.
    rank: u8,
}

/// The functions of one image, sorted by start address, aliases of one range folded into
/// the preferred name.
#[derive(Debug, Default)]
pub(crate) struct Symbols {
    syms: Vec<Sym>,
}

/// A symbol found for an address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Found {
    /// SVMA of the function's first byte.
    pub(crate) start: u64,
    /// Which file the name is in (see `Image::symbol_name`), and its bytes there.
    pub(crate) source: usize,
    pub(crate) name: Range<usize>,
}

const STT_FUNC: u8 = 2;
const STB_LOCAL: u8 = 0;
const STB_GLOBAL: u8 = 1;
const STB_WEAK: u8 = 2;
const SYM_SIZE: usize = 24;
/// Symbols looked at below an address for one whose range covers it (nested or
/// overlapping ranges are rare, such as a function and its alias of another size).
const LOOK_BACK: usize = 16;

impl Symbols {
    /// Reads the function symbols of each source, a file's bytes and its `tables`
    /// ((symbol table, its strings) file ranges). The tables are 64-bit little-endian
    /// (`Image` parses nothing else). The files must be of one image (their SVMAs are the
    /// same).
    pub(crate) fn parse(sources: &[(&[u8], &Tables)]) -> Symbols {
        let mut syms = Vec::new();
        for (source, &(data, tables)) in sources.iter().enumerate() {
            Symbols::parse_one(source, data, tables, &mut syms);
        }
        // Aliases (one range, several names, often once in each table): keep the
        // preferred name — global before weak before local, then the fewest leading
        // underscores (`qsort_r` before `__qsort_r`), then the shortest, then by bytes, so
        // that the choice does not depend on table order.
        let key = |s: &Sym| {
            let n = &sources[s.source].0[s.name.clone()];
            let underscores = n.iter().take_while(|&&b| b == b'_').count();
            (s.start, s.end, s.rank, underscores, n.len(), n.to_vec())
        };
        syms.sort_by_cached_key(key);
        syms.dedup_by(|later, kept| later.start == kept.start && later.end == kept.end);
        Symbols { syms }
    }

    /// The function symbols of one file's `tables`, added to `syms`.
    fn parse_one(source: usize, data: &[u8], tables: &Tables, syms: &mut Vec<Sym>) {
        for (table, strings) in tables {
            let Some(table) = data.get(table.clone()) else {
                continue;
            };
            for raw in table.chunks_exact(SYM_SIZE) {
                let st_name = u32::from_le_bytes(raw[0..4].try_into().unwrap_or([0; 4])) as usize;
                let info = raw[4];
                let shndx = u16::from_le_bytes([raw[6], raw[7]]);
                let value = u64::from_le_bytes(raw[8..16].try_into().unwrap_or([0; 8]));
                let size = u64::from_le_bytes(raw[16..24].try_into().unwrap_or([0; 8]));
                if info & 0xf != STT_FUNC || shndx == 0 || size == 0 || st_name == 0 {
                    continue;
                }
                let rank = match info >> 4 {
                    STB_GLOBAL => 0,
                    STB_WEAK => 1,
                    STB_LOCAL => 2,
                    _ => 3,
                };
                let Some(at) = strings.start.checked_add(st_name) else {
                    continue;
                };
                if at >= strings.end {
                    continue;
                }
                let Some(len) = data[at..strings.end].iter().position(|&b| b == 0) else {
                    continue;
                };
                let Some(end) = value.checked_add(size) else {
                    continue;
                };
                syms.push(Sym {
                    start: value,
                    end,
                    source,
                    name: at..at + len,
                    rank,
                });
            }
        }
    }

    /// The function whose range holds the SVMA `addr`, if any.
    pub(crate) fn find(&self, addr: u64) -> Option<Found> {
        let above = self.syms.partition_point(|s| s.start <= addr);
        self.syms[..above]
            .iter()
            .rev()
            .take(LOOK_BACK)
            .find(|s| addr < s.end)
            .map(|s| Found {
                start: s.start,
                source: s.source,
                name: s.name.clone(),
            })
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.syms.len()
    }
}

/// A symbol's name as people read it: C++ (`_Z…`) and Rust (`_R…`, and legacy `_ZN…E`
/// with a hash) demangled, Rust's hash left out. Anything else (C) stays as it is.
pub(crate) fn demangle(name: &str) -> Cow<'_, str> {
    if name.starts_with("_R") || is_legacy_rust(name) {
        if let Ok(d) = rustc_demangle::try_demangle(name) {
            return Cow::Owned(format!("{d:#}"));
        }
    }
    if name.starts_with("_Z") {
        if let Ok(sym) = cpp_demangle::Symbol::new(name) {
            if let Ok(d) = sym.demangle() {
                return Cow::Owned(d);
            }
        }
    }
    Cow::Borrowed(name)
}

/// Rust's legacy mangling: a C++-like `_ZN…E` path whose last element is `h` and 16 hex
/// digits (`17h0123456789abcdefE`), perhaps followed by a `.llvm.…` suffix.
fn is_legacy_rust(name: &str) -> bool {
    let Some(body) = name.strip_prefix("_ZN") else {
        return false;
    };
    let body = body.split('.').next().unwrap_or(body);
    let Some(body) = body.strip_suffix('E') else {
        return false;
    };
    body.len() > 19
        && body[body.len() - 19..].starts_with("17h")
        && body[body.len() - 16..]
            .bytes()
            .all(|b| b.is_ascii_hexdigit())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A symbol table and its strings, laid out as in a file: (data, tables).
    fn table(entries: &[(&str, u8, u64, u64)]) -> (Vec<u8>, Tables) {
        let mut strings = vec![0u8];
        let mut syms = vec![0u8; SYM_SIZE]; // the null symbol
        for &(name, info, value, size) in entries {
            let at = strings.len() as u32;
            strings.extend_from_slice(name.as_bytes());
            strings.push(0);
            let mut raw = [0u8; SYM_SIZE];
            raw[0..4].copy_from_slice(&at.to_le_bytes());
            raw[4] = info;
            raw[6..8].copy_from_slice(&1u16.to_le_bytes());
            raw[8..16].copy_from_slice(&value.to_le_bytes());
            raw[16..24].copy_from_slice(&size.to_le_bytes());
            syms.extend_from_slice(&raw);
        }
        let mut data = syms.clone();
        let strings_at = data.len();
        data.extend_from_slice(&strings);
        (data.clone(), vec![(0..syms.len(), strings_at..data.len())])
    }

    fn name_at(data: &[u8], s: &Symbols, addr: u64) -> Option<String> {
        s.find(addr)
            .map(|f| String::from_utf8(data[f.name].to_vec()).unwrap())
    }

    #[test]
    fn an_address_is_named_only_inside_a_symbols_range() {
        let global_func = (STB_GLOBAL << 4) | STT_FUNC;
        let local_func = (STB_LOCAL << 4) | STT_FUNC;
        let (data, tables) = table(&[
            ("first", global_func, 0x1000, 0x100),
            ("second", local_func, 0x1200, 0x10),
            // An object, not a function, is never a frame's name.
            ("a_table", (STB_GLOBAL << 4) | 1, 0x1300, 0x100),
            // No size, so it cannot say what it covers.
            ("unsized", global_func, 0x1500, 0),
        ]);
        let s = Symbols::parse(&[(&data, &tables)]);
        assert_eq!(s.len(), 2);
        assert_eq!(name_at(&data, &s, 0x1000).as_deref(), Some("first"));
        assert_eq!(name_at(&data, &s, 0x10ff).as_deref(), Some("first"));
        // Past `first`'s end and before `second`: no name, not "first".
        assert_eq!(name_at(&data, &s, 0x1100), None);
        assert_eq!(name_at(&data, &s, 0x120f).as_deref(), Some("second"));
        assert_eq!(name_at(&data, &s, 0x1210), None);
        assert_eq!(name_at(&data, &s, 0x1350), None);
        assert_eq!(name_at(&data, &s, 0x1500), None);
        assert_eq!(name_at(&data, &s, 0xfff), None);
    }

    #[test]
    fn aliases_fold_into_the_preferred_name_whatever_the_order() {
        let global = (STB_GLOBAL << 4) | STT_FUNC;
        let weak = (STB_WEAK << 4) | STT_FUNC;
        let local = (STB_LOCAL << 4) | STT_FUNC;
        for order in [[0, 1, 2], [2, 1, 0], [1, 2, 0]] {
            let all = [
                ("__qsort_r", global, 0x2000, 0x80),
                ("qsort_r", global, 0x2000, 0x80),
                ("msort", local, 0x2000, 0x80),
            ];
            let entries: Vec<_> = order.iter().map(|&i| all[i]).collect();
            let (data, tables) = table(&entries);
            let s = Symbols::parse(&[(&data, &tables)]);
            assert_eq!(name_at(&data, &s, 0x2040).as_deref(), Some("qsort_r"));
        }
        // A weak alias loses to a global one.
        let (data, tables) = table(&[("w", weak, 0x10, 4), ("g", global, 0x10, 4)]);
        let s = Symbols::parse(&[(&data, &tables)]);
        assert_eq!(name_at(&data, &s, 0x12).as_deref(), Some("g"));
    }

    #[test]
    fn a_nested_range_wins_and_the_outer_one_still_covers_the_rest() {
        let f = (STB_GLOBAL << 4) | STT_FUNC;
        let (data, tables) = table(&[("outer", f, 0x100, 0x100), ("inner", f, 0x140, 0x10)]);
        let s = Symbols::parse(&[(&data, &tables)]);
        assert_eq!(name_at(&data, &s, 0x145).as_deref(), Some("inner"));
        assert_eq!(name_at(&data, &s, 0x180).as_deref(), Some("outer"));
    }

    #[test]
    fn several_files_name_one_image_each_name_from_its_own_bytes() {
        let global = (STB_GLOBAL << 4) | STT_FUNC;
        let local = (STB_LOCAL << 4) | STT_FUNC;
        // A stripped library's .dynsym, and its debug file's .symtab: the exported
        // function again (a local alias of the same range too), and a static one.
        let (dynsym, dyn_tables) = table(&[("exported", global, 0x1000, 0x40)]);
        let (symtab, sym_tables) = table(&[
            ("static_helper", local, 0x1040, 0x20),
            ("exported_alias", local, 0x1000, 0x40),
            ("exported", global, 0x1000, 0x40),
        ]);
        let sources = [(&dynsym[..], &dyn_tables), (&symtab[..], &sym_tables)];
        let s = Symbols::parse(&sources);
        assert_eq!(s.len(), 2);
        let name = |addr| {
            s.find(addr)
                .map(|f| String::from_utf8(sources[f.source].0[f.name].to_vec()).unwrap())
        };
        assert_eq!(name(0x1010).as_deref(), Some("exported"));
        assert_eq!(name(0x1050).as_deref(), Some("static_helper"));
        assert_eq!(s.find(0x1050).unwrap().source, 1);
        assert_eq!(name(0x1060), None);
    }

    #[test]
    fn names_are_demangled() {
        assert_eq!(demangle("spin_inner"), "spin_inner");
        assert_eq!(
            demangle("_PyEval_EvalFrameDefault.cold"),
            "_PyEval_EvalFrameDefault.cold"
        );
        assert_eq!(demangle("_ZN3foo3barEv"), "foo::bar()");
        assert_eq!(
            demangle("_ZNSt6vectorIiSaIiEE9push_backERKi"),
            "std::vector<int, std::allocator<int> >::push_back(int const&)"
        );
        // Rust, legacy and v0 manglings: the path without the hash.
        assert_eq!(
            demangle("_ZN4core3ptr13drop_in_place17h0123456789abcdefE"),
            "core::ptr::drop_in_place"
        );
        assert_eq!(demangle("_RNvCs15kBYyAo9fc_7mycrate4main"), "mycrate::main");
        // Not a mangled name after all, so left alone.
        assert_eq!(demangle("_Z"), "_Z");
        assert_eq!(demangle("_ZN3fooE."), "_ZN3fooE.");
    }
}
