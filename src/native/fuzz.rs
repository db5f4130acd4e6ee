//! The native side's fuzz entry points (see `crate::fuzzing`): ELF images parsed from the
//! fuzzer's bytes, and captured stacks unwound over this process's own modules.
//!
//! Owns: cutting the fuzzer's bytes into an image or a [`Capture`], and asking of them
//! what the profiler asks.
//!
//! Must not: parse or unwind in any way of its own (the readers are `image`, `symbols`,
//! `fde`, `unwind`).

use super::image::{self, Bytes, Image};
use super::unwind::Capture;
use super::{NativeCache, NativeProcess};
use crate::proc::ns::Namespaces;
use crate::ptrace::{BufferMemory, RemoteMemory};
use std::cell::RefCell;

/// Where the fuzzer's bytes lie when read as a loaded image from memory.
const LOADED_AT: u64 = 0x7f00_0000_0000;

/// An ELF image as the native side reads it: a module's file, a separate debug file, and
/// a loaded image read through the memory trait (the vDSO's and a changed file's way).
pub(crate) fn fuzz_image(data: &[u8]) {
    if let Ok(img) = Image::parse("fuzz.so".into(), Bytes::Owned(data.to_vec())) {
        ask(&img);
    }
    if let Ok(img) = Image::parse_debug_file("fuzz.debug".into(), Bytes::Owned(data.to_vec())) {
        ask(&img);
    }
    let mem = BufferMemory {
        base: LOADED_AT,
        bytes: data.to_vec(),
    };
    let _ = image::build_id_in_memory(&mem, LOADED_AT);
    if let Some(img) = image::unwind_image_in_memory(&mem, LOADED_AT) {
        ask(&img);
    }
}

/// What the profiler asks of an image: whether it wants a debug file, the symbol, line and
/// function start of addresses across its text.
fn ask(img: &Image) {
    let _ = img.wants_debug_file();
    let s = &img.sections;
    for sec in [
        &s.text,
        &s.eh_frame,
        &s.eh_frame_hdr,
        &s.debug_frame,
        &s.got,
    ]
    .into_iter()
    .flatten()
    {
        let _ = img.section_bytes(sec).map(|b| b.len());
    }
    let text = s.text.as_ref().map_or(0..0x1000, |t| t.svma.clone());
    let step = ((text.end.saturating_sub(text.start)) / 8).max(1);
    for i in 0..9u64 {
        let svma = text.start.saturating_add(i.saturating_mul(step));
        if let Some(found) = img.symbols().find(svma) {
            let _ = super::symbols::demangle(img.symbol_name(&found));
        }
        let _ = img.line(svma);
        let _ = super::fde::function_start(img, svma);
    }
}

thread_local! {
    /// This process's own modules and unwinder, read once.
    static OWN: RefCell<Option<NativeProcess>> = const { RefCell::new(None) };
}

/// A captured stack. Bytes 0–1 pick a module of this process and bytes 2–5 an offset into
/// it (the instruction pointer), bytes 6–13 the frame pointer. The rest is the stack,
/// copied from a fixed stack pointer up. Unwound and named as a paused thread's is.
pub(crate) fn fuzz_unwind(data: &[u8]) {
    OWN.with(|own| {
        let mut own = own.borrow_mut();
        let process = own.get_or_insert_with(|| {
            let pid = std::process::id() as i32;
            let mem = RemoteMemory::new(pid).expect("reading our own memory");
            NativeProcess::new(pid, &mem, Namespaces::of(pid), &mut NativeCache::new())
                .expect("our own modules")
                .without_lines()
        });
        let mut head = [0u8; 14];
        let n = data.len().min(head.len());
        head[..n].copy_from_slice(&data[..n]);
        let list = &process.modules.list;
        let m = &list[usize::from(u16::from_le_bytes([head[0], head[1]])) % list.len()];
        let offset = u64::from(u32::from_le_bytes(head[2..6].try_into().expect("4")));
        let len = (m.avma.end - m.avma.start).max(1);
        let ip = m.avma.start + offset % len;
        let bp = u64::from_le_bytes(head[6..14].try_into().expect("8"));
        let cap = Capture::from_parts(ip, 0x7ffc_0000_0000, bp, data[n..].to_vec());
        let _ = process.stack(&cap);
    });
}
