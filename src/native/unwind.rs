//! A stopped thread's native stack: what is copied while it is stopped, and the unwinding
//! of that copy into return addresses.
//!
//! Owns:
//! - [`Capture`]: the registers, from `PTRACE_GETREGS`, and the thread's stack from its
//!   stack pointer up to the end of its stack mapping, in one read;
//! - [`Unwinder`]: framehop's x86-64 unwinder (DWARF CFI from `.eh_frame_hdr`/`.eh_frame`
//!   or `.debug_frame`, frame pointers where a module has no rule for an address).
//!
//! Unwinding reads only the copy, so it runs after the threads are let go. The pause lasts
//! one system call for the registers and one for the stack, per thread.
//!
//! Must not: pause threads itself (the caller holds them: `ptrace::pause`), or name frames.

use super::fde::{self, Cfa, ExprRow, Saved};
use super::image::{Image, Section, SectionBytes};
use super::modules::Modules;
use crate::proc::MapEntry;
use crate::ptrace::pause::PausedThreads;
use crate::ptrace::ProcessMemory;
use crate::IdMap;
use framehop::x86_64::{CacheX86_64, UnwindRegsX86_64, UnwinderX86_64};
use framehop::{ExplicitModuleSectionInfo, FrameAddress, Module, Unwinder as _};
use std::ops::Range;
use std::sync::Arc;

/// Most bytes of one thread's stack copied (the default thread stack is 8 MiB).
pub(crate) const MAX_STACK_BYTES: usize = 8 << 20;
/// Bytes copied when the stack pointer is in no mapping we know of (one read that stops
/// where the memory does).
const UNKNOWN_STACK_BYTES: usize = 512 << 10;
/// Most native frames of one stack by default; deeper ones are cut (and say so). A
/// Python ↔ C recursion costs about 8 native frames a level, so this keeps about 2,000
/// levels; an unwound frame costs 16 bytes (its address and stack pointer) before naming.
pub const MAX_NATIVE_FRAMES: usize = 16_384;

/// DWARF's x86-64 register numbers 0–16 (rax, rdx, rcx, rbx, rsi, rdi, rbp, rsp, r8–r15,
/// the return address: rip).
type DwarfRegs = [u64; 17];

/// One stopped thread's registers and stack, taken while it is stopped.
pub(crate) struct Capture {
    ip: u64,
    sp: u64,
    bp: u64,
    /// Every general register, for the innermost frame's rules that name others than
    /// these three (a stack-realigning prologue's `r10`); None in captures made of parts.
    regs: Option<Box<DwarfRegs>>,
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
    capture_registers(tid, &regs, mem, maps, MAX_STACK_BYTES)
}

/// [`capture`] of a thread stopped by other means, whose registers are `regs`. It takes at
/// most `max_bytes` of its stack.
pub(crate) fn capture_registers(
    tid: i32,
    regs: &libc::user_regs_struct,
    mem: &dyn ProcessMemory,
    maps: &[MapEntry],
    max_bytes: usize,
) -> Result<Capture, CaptureError> {
    let (ip, sp, bp) = (regs.rip, regs.rsp, regs.rbp);
    let r = &regs;
    let dwarf: DwarfRegs = [
        r.rax, r.rdx, r.rcx, r.rbx, r.rsi, r.rdi, r.rbp, r.rsp, r.r8, r.r9, r.r10, r.r11, r.r12,
        r.r13, r.r14, r.r15, r.rip,
    ];
    let len = maps
        .iter()
        .find(|m| m.start <= sp && sp < m.end)
        .map_or(UNKNOWN_STACK_BYTES, |m| (m.end - sp) as usize)
        .min(max_bytes);
    let mut stack = vec![0u8; len];
    let got = mem
        .read_prefix(sp, &mut stack)
        .map_err(|e| format!("the stack of thread {tid} at {sp:#x}: {e}"))?;
    stack.truncate(got);
    Ok(Capture {
        ip,
        sp,
        bp,
        regs: Some(Box::new(dwarf)),
        stack,
    })
}

/// A thread's capture from its registers as a core saved them (x86-64's `pr_reg`, the
/// order of `struct user_regs_struct`) and its stack read from `mem`, at most
/// [`MAX_STACK_BYTES`]. Err: why there is none.
#[cfg(target_arch = "x86_64")]
pub(crate) fn saved_capture(
    regs: &[u64],
    mem: &dyn ProcessMemory,
) -> Result<Capture, CaptureError> {
    let r = |i: usize| {
        regs.get(i)
            .copied()
            .ok_or("registers cut short in the core")
    };
    // user_regs_struct: r15 r14 r13 r12 rbp rbx r11 r10 r9 r8 rax rcx rdx rsi rdi
    // orig_rax rip cs eflags rsp ...
    let (ip, sp, bp) = (r(16)?, r(19)?, r(4)?);
    let dwarf: DwarfRegs = [
        r(10)?,
        r(12)?,
        r(11)?,
        r(5)?,
        r(13)?,
        r(14)?,
        bp,
        sp,
        r(9)?,
        r(8)?,
        r(7)?,
        r(6)?,
        r(3)?,
        r(2)?,
        r(1)?,
        r(0)?,
        ip,
    ];
    let mut stack = vec![0u8; UNKNOWN_STACK_BYTES.max(1 << 20)];
    let got = mem
        .read_prefix(sp, &mut stack)
        .map_err(|e| format!("the stack at {sp:#x}: {e}"))?;
    stack.truncate(got);
    Ok(Capture {
        ip,
        sp,
        bp,
        regs: Some(Box::new(dwarf)),
        stack,
    })
}

impl Capture {
    /// A capture made of its parts (the fuzz targets' way in).
    #[cfg(feature = "fuzzing")]
    pub(crate) fn from_parts(ip: u64, sp: u64, bp: u64, stack: Vec<u8>) -> Capture {
        Capture {
            ip,
            sp,
            bp,
            regs: None,
            stack,
        }
    }

    /// The addresses of the stack copied (from the stack pointer up).
    pub(crate) fn stack_range(&self) -> std::ops::Range<u64> {
        self.sp..self.sp + self.stack.len() as u64
    }

    /// The 8 bytes at `addr` of the copied stack.
    pub(crate) fn word(&self, addr: u64) -> Result<u64, ()> {
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
    /// The stack was cut at the unwinder's frame limit ([`MAX_NATIVE_FRAMES`] unless
    /// set).
    Truncated,
    /// Somewhere it could go no further, and why (a frame without rules or frame pointer, a
    /// stack read past the copy). The frames before it stand.
    Stopped(String),
}

/// The return addresses of one stack, innermost (the instruction pointer) first.
pub(crate) struct Unwound {
    pub(crate) frames: Vec<FrameAddress>,
    /// Each frame's stack pointer. Frame `i` occupies `[sps[i], sps[i + 1])` of the stack
    /// (its locals, which is where the evaluation loop keeps the marks the merge with
    /// Python frames pairs it by).
    pub(crate) sps: Vec<u64>,
    pub(crate) end: End,
}

/// framehop's unwinder over one process's modules, with its rule cache; and our own step
/// for the frames whose rules framehop cannot follow (see [`fde::ExprRow`]).
pub(crate) struct Unwinder {
    inner: UnwinderX86_64<SectionBytes>,
    cache: CacheX86_64,
    /// Most frames of one stack (`dump --max-native-depth`).
    pub(crate) max_frames: usize,
    /// The modules with a trusted image: their addresses, bias (AVMA − SVMA) and image,
    /// sorted by address.
    images: Vec<(Range<u64>, u64, Arc<Image>)>,
    /// By lookup address: the expression row there, or None for a usual one (framehop's).
    rows: IdMap<u64, Option<Arc<ExprRow>>>,
}

/// Most lookup addresses whose kind of row is remembered (then forgotten all at once).
const MAX_ROWS: usize = 1 << 16;

impl Unwinder {
    /// An unwinder that knows the rules of every module with a trusted image.
    pub(crate) fn new(modules: &Modules) -> Unwinder {
        let mut inner = UnwinderX86_64::new();
        let mut images = Vec::new();
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
            images.push((m.avma.clone(), m.bias, image.clone()));
        }
        Unwinder {
            inner,
            cache: CacheX86_64::new(),
            max_frames: MAX_NATIVE_FRAMES,
            images,
            rows: IdMap::default(),
        }
    }

    /// The expression row at lookup address `avma`, when the row there is one.
    fn expression_row(&mut self, avma: u64) -> Option<Arc<ExprRow>> {
        if let Some(known) = self.rows.get(&avma) {
            return known.clone();
        }
        let i = self.images.partition_point(|(r, ..)| r.start <= avma);
        let row = self.images[..i]
            .last()
            .filter(|(r, ..)| avma < r.end)
            .and_then(|(_, bias, image)| fde::expression_row(image, avma.wrapping_sub(*bias)))
            .map(Arc::new);
        if self.rows.len() >= MAX_ROWS {
            self.rows.clear();
        }
        self.rows.insert(avma, row.clone());
        row
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
            let innermost = frames.len() == 1;
            // The caller's return address (None: the stack ends here), regs moved to it.
            let next = match self.expression_row(at.address_for_lookup()) {
                Some(row) => expression_step(&row, cap, innermost, &mut regs, &read),
                None => self
                    .inner
                    .unwind_frame(at, &mut regs, &mut self.cache, &mut read)
                    .map_err(|e| e.to_string()),
            };
            match next {
                Ok(Some(ret)) => match FrameAddress::from_return_address(ret) {
                    Some(next) => {
                        at = next;
                        frames.push(next);
                        sps.push(regs.sp());
                    }
                    None => break End::Complete,
                },
                Ok(None) => break End::Complete,
                Err(e) => break End::Stopped(e),
            }
        };
        Unwound { frames, sps, end }
    }
}

/// Follows an expression row (see [`fde::ExprRow`]) from the frame `regs` stand in, as
/// framehop's `unwind_frame` does. It gives the caller's return address (None: the stack
/// ends here), with `regs` moved to the caller. Err: why it cannot.
fn expression_step(
    row: &ExprRow,
    cap: &Capture,
    innermost: bool,
    regs: &mut UnwindRegsX86_64,
    read: &dyn Fn(u64) -> Result<u64, ()>,
) -> Result<Option<u64>, String> {
    // The innermost frame knows every register; outer ones only these three.
    let mut known = [None; 17];
    match (&cap.regs, innermost) {
        (Some(all), true) => known = all.map(Some),
        _ => {
            known[fde::RBP as usize] = Some(regs.bp());
            known[fde::RSP as usize] = Some(regs.sp());
            known[fde::RA as usize] = Some(regs.ip());
        }
    }
    match step(row, &known, read) {
        Step::Caller { ip, sp, bp } if innermost || sp > regs.sp() => {
            *regs = UnwindRegsX86_64::new(ip, sp, bp);
            Ok(Some(ip))
        }
        Step::Caller { .. } => Err(
            "a frame's unwind rule (a DWARF expression) moved the stack pointer backwards".into(),
        ),
        Step::Outermost => Ok(None),
        Step::Unknown => {
            Err("a frame's unwind rule (a DWARF expression) could not be evaluated".into())
        }
    }
}

/// What one step of [`step`] found.
#[derive(Debug, PartialEq, Eq)]
enum Step {
    /// The caller's instruction pointer (a return address), stack and frame pointers.
    Caller { ip: u64, sp: u64, bp: u64 },
    /// The row says there is no caller.
    Outermost,
    /// A register the rule needs is not known, a read fell outside the copy, or the
    /// expression is not one we evaluate.
    Unknown,
}

/// Follows an expression row from a frame whose registers `known` are (None: not known).
fn step(row: &ExprRow, known: &[Option<u64>; 17], read: &dyn Fn(u64) -> Result<u64, ()>) -> Step {
    let reg = |r: u16| known.get(r as usize).copied().flatten();
    let Some(cfa) = (match &row.cfa {
        Cfa::Register(r, off) => reg(*r).map(|v| v.wrapping_add(*off as u64)),
        Cfa::Expression(e) => evaluate(e, row.encoding, known, read),
    }) else {
        return Step::Unknown;
    };
    let restore = |saved: &Saved, now: Option<u64>| -> Option<Option<u64>> {
        Some(match saved {
            Saved::Same => now,
            Saved::Undefined => None,
            Saved::AtCfa(o) => Some(read(cfa.wrapping_add(*o as u64)).ok()?),
            Saved::CfaPlus(o) => Some(cfa.wrapping_add(*o as u64)),
            Saved::Register(r) => Some(reg(*r)?),
            Saved::At(e) => Some(read(evaluate(e, row.encoding, known, read)?).ok()?),
            Saved::Value(e) => Some(evaluate(e, row.encoding, known, read)?),
        })
    };
    let Some(ip) = restore(&row.ra, None) else {
        return Step::Unknown;
    };
    let Some(ip) = ip else {
        return Step::Outermost;
    };
    match restore(&row.rbp, reg(fde::RBP)) {
        Some(Some(bp)) => Step::Caller { ip, sp: cfa, bp },
        // The caller's frame pointer is not known, so it takes a value no rule trusts.
        Some(None) => Step::Caller { ip, sp: cfa, bp: 0 },
        None => Step::Unknown,
    }
}

/// Most operations one expression may run (a hostile one could loop).
const MAX_OPERATIONS: u32 = 256;

/// The value a DWARF expression computes from registers `known` and memory `read` (the
/// stack copy); None when it needs what is not known or does not compute an address.
fn evaluate(
    bytes: &[u8],
    encoding: gimli::Encoding,
    known: &[Option<u64>; 17],
    read: &dyn Fn(u64) -> Result<u64, ()>,
) -> Option<u64> {
    use gimli::{EvaluationResult, Location, Value};
    let expr = gimli::Expression(gimli::EndianSlice::new(bytes, gimli::LittleEndian));
    let mut eval = expr.evaluation(encoding);
    eval.set_max_iterations(MAX_OPERATIONS);
    let mut result = eval.evaluate().ok()?;
    loop {
        result = match result {
            EvaluationResult::Complete => break,
            EvaluationResult::RequiresRegister { register, .. } => {
                let v = known.get(register.0 as usize).copied().flatten()?;
                eval.resume_with_register(Value::Generic(v)).ok()?
            }
            EvaluationResult::RequiresMemory {
                address,
                size,
                space: None,
                ..
            } if (1..=8).contains(&size) => {
                let word = read(address).ok()?;
                let v = if size == 8 {
                    word
                } else {
                    word & ((1u64 << (8 * size)) - 1)
                };
                eval.resume_with_memory(Value::Generic(v)).ok()?
            }
            _ => return None,
        };
    }
    match eval.as_result().last()?.location {
        Location::Address { address } => Some(address),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// GCC's stack realignment with a DRAP register. After the prologue:
    /// - the CFA is `*(rbp - 8)` (`DW_OP_breg6 -8; DW_OP_deref`);
    /// - rbp is saved at `rbp` (`DW_OP_breg6 0`);
    /// - the return address is at CFA − 8.
    ///
    /// The caller's registers come from the copy, whatever padding the realignment left
    /// between the frame and its caller.
    #[test]
    fn a_realigned_frame_is_followed_by_its_dwarf_expressions() {
        let encoding = gimli::Encoding {
            format: gimli::Format::Dwarf32,
            version: 1,
            address_size: 8,
        };
        // DW_OP_breg6 (0x76) with SLEB128 -8 (0x78), DW_OP_deref (0x06); DW_OP_breg6 0.
        let row = ExprRow {
            encoding,
            cfa: Cfa::Expression(vec![0x76, 0x78, 0x06]),
            rbp: Saved::At(vec![0x76, 0x00]),
            ra: Saved::AtCfa(-8),
        };
        let base = 0x7ffc_0000_0000u64;
        let mut words = vec![0u64; 64];
        // The frame:
        // - rbp at base + 0x40 holds the caller's rbp;
        // - the DRAP copy of the CFA is at rbp − 8;
        // - the caller's frame (CFA) is at base + 0x100, its return address below it.
        let (rbp, cfa) = (base + 0x40, base + 0x100);
        let put = |w: &mut Vec<u64>, at: u64, v: u64| w[((at - base) / 8) as usize] = v;
        put(&mut words, rbp, 0x1111);
        put(&mut words, rbp - 8, cfa);
        put(&mut words, cfa - 8, 0x5555_0000_1234);
        let read = |addr: u64| -> Result<u64, ()> {
            let i = addr.checked_sub(base).ok_or(())? / 8;
            words.get(i as usize).copied().ok_or(())
        };
        let mut known = [None; 17];
        known[fde::RBP as usize] = Some(rbp);
        known[fde::RSP as usize] = Some(base);
        known[fde::RA as usize] = Some(0x5555_0000_0100);
        assert_eq!(
            step(&row, &known, &read),
            Step::Caller {
                ip: 0x5555_0000_1234,
                sp: cfa,
                bp: 0x1111
            }
        );
        // The prologue's row: CFA = r10 + 0, known only in the innermost frame.
        let prologue = ExprRow {
            cfa: Cfa::Register(10, 0),
            rbp: Saved::Same,
            ..row.clone()
        };
        assert_eq!(step(&prologue, &known, &read), Step::Unknown);
        known[10] = Some(cfa);
        assert_eq!(
            step(&prologue, &known, &read),
            Step::Caller {
                ip: 0x5555_0000_1234,
                sp: cfa,
                bp: rbp
            }
        );
        // A read past the copy, an expression we do not evaluate, no return address.
        known[fde::RBP as usize] = Some(base + 0x1000);
        assert_eq!(step(&row, &known, &read), Step::Unknown);
        let odd = ExprRow {
            cfa: Cfa::Expression(vec![0x96]), // DW_OP_nop: computes nothing
            ..row.clone()
        };
        assert_eq!(step(&odd, &known, &read), Step::Unknown);
        let last = ExprRow {
            cfa: Cfa::Register(10, 0),
            ra: Saved::Undefined,
            ..row
        };
        assert_eq!(step(&last, &known, &read), Step::Outermost);
    }
}
