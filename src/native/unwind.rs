//! A stopped thread's native stack: what is copied while it is stopped, and the unwinding
//! of that copy into return addresses.
//!
//! Owns: [`Capture`] (the registers, from `PTRACE_GETREGS`, and the thread's stack from its
//! stack pointer up to the end of its stack mapping, in one read) and [`Unwinder`]
//! (framehop's x86-64 unwinder: DWARF CFI from `.eh_frame_hdr`/`.eh_frame` or
//! `.debug_frame`, frame pointers where a module has no rule for an address). Unwinding
//! reads only the copy, so it runs after the threads are let go: the pause lasts one
//! system call for the registers and one for the stack, per thread.
//! Must not: pause threads itself (the caller holds them: `ptrace::pause`), or name frames.

use super::image::{Section, SectionBytes};
use super::modules::Modules;
use crate::proc::MapEntry;
use crate::ptrace::pause::PausedThreads;
use crate::ptrace::ProcessMemory;
use framehop::x86_64::{CacheX86_64, UnwindRegsX86_64, UnwinderX86_64};
use framehop::{ExplicitModuleSectionInfo, FrameAddress, Module, Unwinder as _};

/// Most bytes of one thread's stack copied (the default thread stack is 8 MiB).
pub(crate) const MAX_STACK_BYTES: usize = 8 << 20;
/// Bytes copied when the stack pointer is in no mapping we know of (one read that stops
/// where the memory does).
const UNKNOWN_STACK_BYTES: usize = 512 << 10;
/// Most native frames of one stack by default; deeper ones are cut (and say so). A
/// Python ↔ C recursion costs about 8 native frames a level, so this keeps about 2,000
/// levels; an unwound frame costs 16 bytes (its address and stack pointer) before naming.
pub const MAX_NATIVE_FRAMES: usize = 16_384;

/// One stopped thread's registers and stack, taken while it is stopped.
pub(crate) struct Capture {
    ip: u64,
    sp: u64,
    bp: u64,
    /// The stack from `sp` up.
    stack: Vec<u8>,
}

/// Why a thread's native stack has no frames: what went wrong taking it.
pub(crate) type CaptureError = String;

/// Takes thread `tid`'s registers and stack. `tid` must be held by `paused`; `maps` (read
/// before the pause) bound the read at the end of the stack's mapping.
pub(crate) fn capture(
    pid: i32,
    tid: i32,
    paused: &PausedThreads,
    mem: &dyn ProcessMemory,
    maps: &[MapEntry],
) -> Result<Capture, CaptureError> {
    let regs = paused
        .registers(pid, tid)
        .map_err(|e| format!("registers of thread {tid}: {e}"))?;
    let (ip, sp, bp) = (regs.rip, regs.rsp, regs.rbp);
    let len = maps
        .iter()
        .find(|m| m.start <= sp && sp < m.end)
        .map_or(UNKNOWN_STACK_BYTES, |m| (m.end - sp) as usize)
        .min(MAX_STACK_BYTES);
    let mut stack = vec![0u8; len];
    let got = mem
        .read_prefix(sp, &mut stack)
        .map_err(|e| format!("the stack of thread {tid} at {sp:#x}: {e}"))?;
    stack.truncate(got);
    Ok(Capture { ip, sp, bp, stack })
}

impl Capture {
    /// A capture made of its parts (the fuzz targets' way in).
    #[cfg(feature = "fuzzing")]
    pub(crate) fn from_parts(ip: u64, sp: u64, bp: u64, stack: Vec<u8>) -> Capture {
        Capture { ip, sp, bp, stack }
    }

    /// The addresses of the stack copied (from the stack pointer up).
    pub(crate) fn stack_range(&self) -> std::ops::Range<u64> {
        self.sp..self.sp + self.stack.len() as u64
    }

    /// The 8 bytes at `addr` of the copied stack.
    fn word(&self, addr: u64) -> Result<u64, ()> {
        let off = addr.checked_sub(self.sp).ok_or(())? as usize;
        let bytes = self
            .stack
            .get(off..off.checked_add(8).ok_or(())?)
            .ok_or(())?;
        Ok(u64::from_le_bytes(bytes.try_into().map_err(|_| ())?))
    }
}

/// How an unwind ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum End {
    /// At the outermost frame (the unwind rules say the stack ends there).
    Complete,
    /// At the unwinder's frame limit ([`MAX_NATIVE_FRAMES`] unless set): the stack was
    /// cut.
    Truncated,
    /// Somewhere it could go no further: why (a frame without rules or frame pointer, a
    /// stack read past the copy). The frames before it stand.
    Stopped(String),
}

/// The return addresses of one stack, innermost (the instruction pointer) first.
pub(crate) struct Unwound {
    pub(crate) frames: Vec<FrameAddress>,
    /// Each frame's stack pointer: frame `i` occupies `[sps[i], sps[i + 1])` of the stack
    /// (its locals, which is where the evaluation loop keeps the marks the merge with
    /// Python frames pairs it by).
    pub(crate) sps: Vec<u64>,
    pub(crate) end: End,
}

/// framehop's unwinder over one process's modules, with its rule cache.
pub(crate) struct Unwinder {
    inner: UnwinderX86_64<SectionBytes>,
    cache: CacheX86_64,
    /// Most frames of one stack (`dump --max-native-depth`).
    pub(crate) max_frames: usize,
}

impl Unwinder {
    /// An unwinder that knows the rules of every module with a trusted image.
    pub(crate) fn new(modules: &Modules) -> Unwinder {
        let mut inner = UnwinderX86_64::new();
        for m in &modules.list {
            let Some(image) = &m.image else { continue };
            let s = &image.sections;
            let svma = |sec: &Option<Section>| sec.as_ref().map(|x| x.svma.clone());
            let data = |sec: &Option<Section>| sec.as_ref().and_then(|x| image.section_bytes(x));
            let info = ExplicitModuleSectionInfo {
                base_svma: 0,
                text_svma: svma(&s.text),
                text: None,
                stubs_svma: None,
                stub_helper_svma: None,
                got_svma: svma(&s.got),
                unwind_info: None,
                eh_frame_svma: svma(&s.eh_frame),
                eh_frame: data(&s.eh_frame),
                eh_frame_hdr_svma: svma(&s.eh_frame_hdr),
                eh_frame_hdr: data(&s.eh_frame_hdr),
                debug_frame: data(&s.debug_frame),
                text_segment_svma: None,
                text_segment: None,
            };
            inner.add_module(Module::new(
                m.path.to_string(),
                m.avma.clone(),
                m.bias,
                info,
            ));
        }
        Unwinder {
            inner,
            cache: CacheX86_64::new(),
            max_frames: MAX_NATIVE_FRAMES,
        }
    }

    /// Unwinds a captured stack, one frame at a time (to know each frame's stack pointer).
    pub(crate) fn unwind(&mut self, cap: &Capture) -> Unwound {
        let mut read = |addr: u64| cap.word(addr);
        let mut regs = UnwindRegsX86_64::new(cap.ip, cap.sp, cap.bp);
        let mut at = FrameAddress::from_instruction_pointer(cap.ip);
        let mut frames = vec![at];
        let mut sps = vec![cap.sp];
        let end = loop {
            if frames.len() >= self.max_frames {
                break End::Truncated;
            }
            match self
                .inner
                .unwind_frame(at, &mut regs, &mut self.cache, &mut read)
            {
                Ok(Some(ret)) => match FrameAddress::from_return_address(ret) {
                    Some(next) => {
                        at = next;
                        frames.push(next);
                        sps.push(regs.sp());
                    }
                    None => break End::Complete,
                },
                Ok(None) => break End::Complete,
                Err(e) => break End::Stopped(e.to_string()),
            }
        };
        Unwound { frames, sps, end }
    }
}
