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
    let fde = table
        .fde_for_address(&frame, &bases, svma, EhFrame::cie_from_offset)
        .ok()?;
    fde.contains(svma).then(|| fde.initial_address())
}
