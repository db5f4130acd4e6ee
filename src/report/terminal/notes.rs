//! The rows under a line recorded with `--native`: its native functions and allocations.
//!
//! Owns: the short form of a native function's name for such a row.
//! Must not: shorten a name anywhere else. The JSON keeps every name whole.

use super::cells::{mb_cell, pct_text, truncate_end};
use crate::profile::LineProfile;

/// Native functions shown under a line (`--native`), at most.
const NATIVE_SHOWN: usize = 3;
/// Where the row under a line starts: right of the line number.
pub(super) const NOTE_INDENT: usize = 7;

/// The row under a line with native time recorded with `--native`: the native functions
/// it was spent in, `↳ native: deflate 28%, libz.so.1+0x5d80 11%, …`, cut to `width`.
/// None when the line has none worth a tenth of a percent.
pub(super) fn native_note(l: &LineProfile, width: usize) -> Option<String> {
    let shown: Vec<String> = l
        .native_functions
        .iter()
        .filter(|f| f.pct >= 0.1)
        .take(NATIVE_SHOWN)
        .map(|f| format!("{} {}", short_function(&f.function), pct_text(f.pct)))
        .collect();
    if shown.is_empty() {
        return None;
    }
    let more = if l.native_functions.len() > shown.len() {
        ", …"
    } else {
        ""
    };
    let note = format!("↳ native: {}{more}", shown.join(", "));
    Some(truncate_end(&note, width))
}

/// The row under a line whose allocations were recorded with `--native`: the native
/// functions they came from, `↳ allocated in: alloc_big 40M, PyList_New 2.1M, …`, cut to
/// `width`. None when the line has none worth a cell (0.05 MB).
pub(super) fn allocated_note(l: &LineProfile, width: usize) -> Option<String> {
    let all = l
        .memory
        .as_ref()
        .map_or(&[][..], |m| &m.mem_native_functions[..]);
    let shown: Vec<String> = all
        .iter()
        .map(|f| (f, mb_cell(f.mb)))
        .filter(|(_, mb)| !mb.is_empty())
        .take(NATIVE_SHOWN)
        .map(|(f, mb)| format!("{} {mb}", short_function(&f.function)))
        .collect();
    if shown.is_empty() {
        return None;
    }
    let more = if all.len() > shown.len() { ", …" } else { "" };
    let note = format!("↳ allocated in: {}{more}", shown.join(", "));
    Some(truncate_end(&note, width))
}

/// Template arguments longer than this are shown as `<…>` in a row under a line.
const TEMPLATE_SHOWN: usize = 16;

/// A native function's name as short as a row under a line wants it. That is a demangled
/// C++ name without its return type, parameter list, `[clone …]` suffix and long template
/// arguments. So `unsigned long partition<zmm_vector<double>, Cmp<…>, 8,
/// double>(double*, …) [clone .constprop.0]` is `partition<…>`. C names and
/// `module+0xSTART` stay as they are. The JSON keeps every name whole.
fn short_function(name: &str) -> std::borrow::Cow<'_, str> {
    if !name.contains(['(', '<', ' ']) {
        return name.into();
    }
    let mut name = name;
    while let Some(i) = name.rfind(" [clone ") {
        name = &name[..i];
    }
    // The parameter list is the first '(' outside template arguments. The return type is
    // up to the last space outside them before it.
    let (mut depth, mut start, mut end) = (0usize, 0usize, name.len());
    for (i, c) in name.char_indices() {
        match c {
            '<' => depth += 1,
            '>' => depth = depth.saturating_sub(1),
            ' ' if depth == 0 => start = i + 1,
            '(' if depth == 0 && i > start => {
                end = i;
                break;
            }
            _ => {}
        }
    }
    let core = &name[start.min(end)..end];
    if core.is_empty() || core.ends_with("operator") {
        return name.into();
    }
    // Long template arguments (the outermost ones) become `<…>`.
    let mut out = String::with_capacity(core.len());
    let (mut depth, mut open) = (0usize, 0usize);
    for (i, c) in core.char_indices() {
        match c {
            '<' => {
                if depth == 0 {
                    open = i;
                    out.push('<');
                }
                depth += 1;
            }
            '>' if depth > 0 => {
                depth -= 1;
                if depth == 0 {
                    let args = &core[open + 1..i];
                    if args.chars().count() > TEMPLATE_SHOWN {
                        out.push('…');
                    } else {
                        out.push_str(args);
                    }
                    out.push('>');
                }
            }
            c if depth == 0 => out.push(c),
            _ => {}
        }
    }
    if depth > 0 {
        // Unbalanced, so not a name we understand.
        return name.into();
    }
    out.into()
}

#[cfg(test)]
mod short_name_tests {
    use super::short_function as short;

    #[test]
    fn native_names_are_shortened_for_the_row_under_a_line() {
        assert_eq!(short("deflate_slow"), "deflate_slow");
        assert_eq!(short("libz.so.1.2.13+0x5d80"), "libz.so.1.2.13+0x5d80");
        assert_eq!(
            short(
                "unsigned long partition_unrolled<zmm_vector<double>, Comparator<zmm_vector<\
                 double>, false>, 8, double>(double*, unsigned long, unsigned long, double, \
                 double*, double*) [clone .constprop.0]"
            ),
            "partition_unrolled<…>"
        );
        assert_eq!(
            short("void np::qsort_simd::QSort_X86_V4<double>(double*, long)"),
            "np::qsort_simd::QSort_X86_V4<double>"
        );
        assert_eq!(
            short("DOUBLE_matmul_matrixmatrix.isra.0"),
            "DOUBLE_matmul_matrixmatrix.isra.0"
        );
        assert_eq!(
            short("std::vector<int, std::allocator<int> >::push_back(int const&)"),
            "std::vector<…>::push_back"
        );
        assert_eq!(
            short("foo::operator()(int) const"),
            "foo::operator()(int) const"
        );
        assert_eq!(short("broken<(int)"), "broken<(int)");
    }
}
