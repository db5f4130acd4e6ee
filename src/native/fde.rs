//! Where the function holding an address begins, from the image's unwind tables, for
//! functions no symbol names.
//!
//! Owns: [`function_start`]. A stripped library's internal function has no symbol, yet its
//! `.eh_frame` entry (FDE) gives the range of the function's code: samples anywhere in it
//! are then one function, `libz.so.1+0x5f20`, not one "function" per instruction sampled.
//! Must not: name functions (an FDE has no name) or unwind.

use super::image::{Image, Section};
use gimli::{BaseAddresses, EhFrame, EhFrameHdr, LittleEndian, UnwindSection};

/// SVMA of the first instruction of the function whose FDE covers SVMA `svma`, found
/// through `.eh_frame_hdr`'s sorted table; None when the image has no such table or no FDE
/// covers the address.
pub(crate) fn function_start(image: &Image, svma: u64) -> Option<u64> {
    let s = &image.sections;
    let (hdr, eh) = (s.eh_frame_hdr.as_ref()?, s.eh_frame.as_ref()?);
    let (hdr_bytes, eh_bytes) = (image.section_bytes(hdr)?, image.section_bytes(eh)?);
    let mut bases = BaseAddresses::default()
        .set_eh_frame_hdr(hdr.svma.start)
        .set_eh_frame(eh.svma.start);
    if let Some(Section { svma: text, .. }) = &s.text {
        bases = bases.set_text(text.start);
    }
    let parsed = EhFrameHdr::new(&hdr_bytes[..], LittleEndian)
        .parse(&bases, 8)
        .ok()?;
    let table = parsed.table()?;
    let frame = EhFrame::new(&eh_bytes[..], LittleEndian);
    // gimli's `fde_for_address`, step by step: its `pointer_to_offset` subtracts the
    // `.eh_frame` address from the table's entry unchecked, and an entry below it (a
    // damaged table; the `elf` fuzz target's find, fuzz/regressions/elf/) overflowed: a
    // panic with overflow checks, a huge offset that failed later without.
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
    fde.contains(svma).then(|| fde.initial_address())
}

#[cfg(test)]
mod tests {
    use super::super::image::{Bytes, Image};
    use super::function_start;

    #[test]
    fn a_table_entry_below_eh_frame_gives_no_function_start() {
        // The `elf` fuzz target's find: a small library whose `.eh_frame_hdr` table has
        // an entry below `.eh_frame`; every address of its text is asked about.
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
}
