//! Where the function holding an address begins, from the image's unwind tables, for
//! functions no symbol names.
//!
//! Owns:
//! - [`function_start`] and [`function_range`]. A stripped library's internal function
//!   has no symbol, yet its `.eh_frame` entry (FDE) gives the range of the function's
//!   code. Samples anywhere in it are then one function, `libz.so.1+0x5f20`, not one
//!   "function" per instruction sampled.
//! - [`expression_row`]: the unwind row at an address when its CFA is computed by a DWARF
//!   expression (for the unwinder, which cannot follow such rows by itself).
//! - [`jump_targets`]: where a function's code jumps outside itself, which is how the
//!   parts of a function split by the compiler are found.
//!
//! Must not: name functions (an FDE has no name) or unwind.

use super::image::{Image, Section};
use gimli::{
    BaseAddresses, CfaRule, EhFrame, EhFrameHdr, EndianSlice, FrameDescriptionEntry, LittleEndian,
    RegisterRule, UnwindContext, UnwindSection,
};

/// SVMA of the first instruction of the function whose FDE covers SVMA `svma`, found
/// through `.eh_frame_hdr`'s sorted table; None when the image has no such table or no FDE
/// covers the address.
pub(crate) fn function_start(image: &Image, svma: u64) -> Option<u64> {
    with_fde(image, svma, |_, _, fde| Some(fde.initial_address()))
}

/// SVMA range of the code the FDE covering SVMA `svma` describes (one function, or one
/// part of a function the compiler split); None as for [`function_start`].
pub(crate) fn function_range(image: &Image, svma: u64) -> Option<std::ops::Range<u64>> {
    with_fde(image, svma, |_, _, fde| {
        let start = fde.initial_address();
        Some(start..start.checked_add(fde.len())?)
    })
}

/// The targets of the direct jumps (`jmp rel32`, `jcc rel32`) in `code`, the bytes of a
/// function at AVMA `at`, that land outside it, each once, in address order.
///
/// Why: GCC's hot/cold partitioning (`-freorder-blocks-and-partition`, with PGO) moves part
/// of a function into code of its own, with an FDE of its own and no symbol. Debian's
/// static Python 3.15 keeps 844 bytes under `_PyEval_EvalFrameDefault`; the bytecode loop
/// itself (82 KB) is such a part, reached by `jmp`.
///
/// The bytes are not decoded instruction by instruction: every offset is tried. An offset
/// inside another instruction may read as a jump to anywhere, so the caller keeps only
/// targets that an FDE covers and no symbol names.
pub(crate) fn jump_targets(code: &[u8], at: u64) -> Vec<u64> {
    let end = at.saturating_add(code.len() as u64);
    let mut out = Vec::new();
    let rel32 = |i: usize| -> Option<i64> {
        let b = code.get(i..i + 4)?;
        Some(i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as i64)
    };
    for i in 0..code.len() {
        // jmp rel32 (E9 cd): 5 bytes; jcc rel32 (0F 80..8F cd): 6 bytes.
        let (len, rel) = match (code[i], code.get(i + 1)) {
            (0xe9, _) => (5, rel32(i + 1)),
            (0x0f, Some(&op)) if (0x80..=0x8f).contains(&op) => (6, rel32(i + 2)),
            _ => continue,
        };
        let Some(rel) = rel else { continue };
        let target = (at + i as u64 + len).wrapping_add_signed(rel);
        if !(at..end).contains(&target) {
            out.push(target);
        }
    }
    // Each once, in address order.
    out.sort_unstable();
    out.dedup();
    out
}

/// x86-64 DWARF register numbers: the frame pointer, the stack pointer, the return address.
pub(crate) const RBP: u16 = 6;
pub(crate) const RSP: u16 = 7;
pub(crate) const RA: u16 = 16;

/// Where a frame's CFA (its caller's stack pointer) is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Cfa {
    /// A register (not the stack or frame pointer) plus an offset.
    Register(u16, i64),
    /// The value of a DWARF expression (its bytes).
    Expression(Vec<u8>),
}

/// Where a register's value for the caller is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Saved {
    /// Not saved: the caller's value is the frame's.
    Same,
    /// The caller has none (the return address: the outermost frame).
    Undefined,
    /// In memory at CFA + offset.
    AtCfa(i64),
    /// It is CFA + offset.
    CfaPlus(i64),
    /// In that register.
    Register(u16),
    /// In memory at the address a DWARF expression computes.
    At(Vec<u8>),
    /// It is the value a DWARF expression computes.
    Value(Vec<u8>),
}

/// The unwind row at an address whose CFA is not the stack or frame pointer plus an
/// offset. GCC emits that for a function that realigns its stack (AVX code keeping
/// 32- or 64-byte aligned locals: `CFA = *(rbp - 8)` from the body on, `r10` in the
/// prologue). There framehop gives up and falls back to frame pointers, which reach the
/// caller with the wrong stack pointer (the realignment's padding).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ExprRow {
    pub(crate) encoding: gimli::Encoding,
    pub(crate) cfa: Cfa,
    pub(crate) rbp: Saved,
    pub(crate) ra: Saved,
}

/// Most bytes of one expression kept (GCC's are 2–4 bytes).
const MAX_EXPRESSION: usize = 64;

/// The row at SVMA `svma` when its CFA is a DWARF expression or another register's (see
/// [`ExprRow`]); None for the usual rows, and where no FDE covers the address.
pub(crate) fn expression_row(image: &Image, svma: u64) -> Option<ExprRow> {
    with_fde(image, svma, |frame, bases, fde| {
        let mut ctx = UnwindContext::new();
        let row = fde
            .unwind_info_for_address(frame, bases, &mut ctx, svma)
            .ok()?;
        let bytes = |e: &gimli::UnwindExpression<usize>| -> Option<Vec<u8>> {
            let expr = e.get(frame).ok()?;
            (expr.0.len() <= MAX_EXPRESSION).then(|| expr.0.slice().to_vec())
        };
        let cfa = match row.cfa() {
            CfaRule::RegisterAndOffset { register, offset } => {
                if matches!(register.0, RBP | RSP) {
                    return None;
                }
                Cfa::Register(register.0, *offset)
            }
            CfaRule::Expression(e) => Cfa::Expression(bytes(e)?),
        };
        let saved = |reg: u16| -> Option<Saved> {
            Some(match row.register(gimli::Register(reg)) {
                // No rule for the return address, so it is where the call put it.
                None if reg == RA => Saved::AtCfa(-8),
                None | Some(RegisterRule::SameValue) => Saved::Same,
                Some(RegisterRule::Undefined) if reg == RA => Saved::Undefined,
                Some(RegisterRule::Undefined) => Saved::Same,
                Some(RegisterRule::Offset(o)) => Saved::AtCfa(o),
                Some(RegisterRule::ValOffset(o)) => Saved::CfaPlus(o),
                Some(RegisterRule::Register(r)) => Saved::Register(r.0),
                Some(RegisterRule::Expression(e)) => Saved::At(bytes(&e)?),
                Some(RegisterRule::ValExpression(e)) => Saved::Value(bytes(&e)?),
                _ => return None,
            })
        };
        Some(ExprRow {
            encoding: fde.cie().encoding(),
            cfa,
            rbp: saved(RBP)?,
            ra: saved(RA)?,
        })
    })
}

/// Calls `f` with the FDE that covers SVMA `svma` (found through `.eh_frame_hdr`), its
/// section and base addresses.
fn with_fde<T>(
    image: &Image,
    svma: u64,
    f: impl FnOnce(
        &EhFrame<EndianSlice<LittleEndian>>,
        &BaseAddresses,
        &FrameDescriptionEntry<EndianSlice<LittleEndian>>,
    ) -> Option<T>,
) -> Option<T> {
    let s = &image.sections;
    let (hdr, eh) = (s.eh_frame_hdr.as_ref()?, s.eh_frame.as_ref()?);
    let (hdr_bytes, eh_bytes) = (image.section_bytes(hdr)?, image.section_bytes(eh)?);
    let mut bases = BaseAddresses::default()
        .set_eh_frame_hdr(hdr.svma.start)
        .set_eh_frame(eh.svma.start);
    if let Some(Section { svma: text, .. }) = &s.text {
        bases = bases.set_text(text.start);
    }
    if !table_fits(&hdr_bytes) {
        return None;
    }
    let parsed = EhFrameHdr::new(&hdr_bytes[..], LittleEndian)
        .parse(&bases, 8)
        .ok()?;
    let table = parsed.table()?;
    let frame = EhFrame::new(&eh_bytes[..], LittleEndian);
    // gimli's `fde_for_address`, step by step. Its `pointer_to_offset` subtracts the
    // `.eh_frame` address from the table's entry unchecked. An entry below it (a damaged
    // table; the `elf` fuzz target's find, fuzz/regressions/elf/) overflowed. That was a
    // panic with overflow checks, and a huge offset that failed later without.
    let fde_ptr = table.lookup(svma, &bases).ok()?.direct().ok()?;
    if fde_ptr < parsed.eh_frame_ptr().direct().ok()? {
        return None;
    }
    let offset = table
        .pointer_to_offset(gimli::Pointer::Direct(fde_ptr))
        .ok()?;
    let fde = frame
        .fde_from_offset(&bases, offset, EhFrame::cie_from_offset)
        .ok()?;
    if !fde.contains(svma) {
        return None;
    }
    f(&frame, &bases, &fde)
}

/// Bytes of a pointer of DWARF encoding `enc` (its low four bits). Only the fixed-size
/// formats, because ULEB128 and the others are not used by `.eh_frame_hdr` writers we know.
fn encoded_size(enc: u8) -> Option<usize> {
    match enc & 0x0f {
        0x02 | 0x0a => Some(2),
        0x03 | 0x0b => Some(4),
        0x04 | 0x0c => Some(8),
        _ => None,
    }
}

/// Whether `.eh_frame_hdr`'s search table holds as many entries as its header says. gimli
/// 0.33's binary search multiplies that count by the entry size unchecked (an absurd count
/// overflows, the `elf` fuzz target's find). So a table that claims more than its section
/// holds is not searched.
///
/// Header: version, three encodings (pointer to `.eh_frame`, entry count, table), the
/// pointer, the count, then the table of (start, FDE) pairs.
fn table_fits(hdr: &[u8]) -> bool {
    let (Some(ptr), Some(count), Some(entry)) = (
        hdr.get(1).copied().and_then(encoded_size),
        hdr.get(2).copied().and_then(encoded_size),
        hdr.get(3).copied().and_then(encoded_size),
    ) else {
        return false;
    };
    let at = 4 + ptr;
    let Some(raw) = hdr.get(at..at + count) else {
        return false;
    };
    let mut le = [0u8; 8];
    le[..count].copy_from_slice(raw);
    let entries = u64::from_le_bytes(le);
    let room = (hdr.len() - at - count) as u64;
    entries
        .checked_mul(2 * entry as u64)
        .is_some_and(|bytes| bytes <= room)
}

#[cfg(test)]
mod tests {
    use super::super::image::{Bytes, Image};
    use super::function_start;

    #[test]
    fn a_table_that_claims_more_entries_than_it_holds_is_not_searched() {
        // version 1; .eh_frame pointer pcrel|sdata4; count udata4; table datarel|sdata4
        let mut hdr = vec![1u8, 0x1b, 0x03, 0x3b, 0, 0, 0, 0];
        let with_count = |hdr: &[u8], n: u32, entries: usize| {
            let mut h = hdr.to_vec();
            h.extend_from_slice(&n.to_le_bytes());
            h.extend(std::iter::repeat_n(0u8, 8 * entries));
            h
        };
        assert!(super::table_fits(&with_count(&hdr, 2, 2)));
        assert!(!super::table_fits(&with_count(&hdr, 3, 2)));
        assert!(!super::table_fits(&with_count(&hdr, u32::MAX, 2)));
        // udata8 count: 2^62 entries of 16 bytes overflow a u64.
        hdr[2] = 0x04;
        let mut h = hdr.clone();
        h.extend_from_slice(&(1u64 << 62).to_le_bytes());
        assert!(!super::table_fits(&h));
        // A ULEB128 count (not fixed-size) is not searched.
        hdr[2] = 0x01;
        assert!(!super::table_fits(&with_count(&hdr, 1, 1)));
        assert!(!super::table_fits(&[1, 0x1b]));
    }

    #[test]
    fn a_table_entry_below_eh_frame_gives_no_function_start() {
        // The `elf` fuzz target's find: a small library whose `.eh_frame_hdr` table has
        // an entry below `.eh_frame`. Every address of its text is asked about.
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/fuzz/regressions/elf/eh_frame_hdr_entry_below_eh_frame.so"
        );
        let image = Image::parse(path.into(), Bytes::Owned(std::fs::read(path).unwrap())).unwrap();
        // Its section names are damaged too (no `.text`): the first pages, where its
        // code is.
        for svma in 0..0x3000 {
            let _ = function_start(&image, svma);
        }
    }

    #[test]
    fn jumps_out_of_a_function_are_its_targets() {
        // The tail of Debian 3.15's `_PyEval_EvalFrameDefault` at 0x5c6f77 (`jmp` into its
        // split-off loop at 0x44291a), a `jne rel32` back into itself, and a `jmp rel8`.
        let at = 0x5c6f77;
        let mut code = vec![0xe9, 0x9e, 0xb9, 0xe7, 0xff];
        code.extend([0x0f, 0x85, 0xf6, 0xff, 0xff, 0xff]); // jne back to `at + 1`
        code.extend([0xeb, 0xb4]);
        assert_eq!(super::jump_targets(&code, at), vec![0x44291a]);
        // Cut short, a jump's displacement is not read past the end.
        assert!(super::jump_targets(&[0xe9, 0x00, 0x01], at).is_empty());
        assert!(super::jump_targets(&[], at).is_empty());
    }
}
