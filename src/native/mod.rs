//! Native (C, C++, Rust) stacks: a process's modules, their unwind rules and symbols, and
//! each stopped thread's stack unwound and named. The process is live, or a core's
//! (`from_saved`, files opened through `coredump::Files`).
//!
//! Owns:
//! - [`NativeProcess`]: one process's modules and unwinder, made before its threads are
//!   paused;
//! - [`NativeFrame`] (one named frame) and `NativeStack`;
//! - [`NativeCache`]: images by build id, shared across processes;
//! - the parts:
//!   - `image`: an ELF file's sections, build id, symbols and line tables;
//!   - `modules`: the files as the target sees them, checked by build id;
//!   - `debuginfo`: separate debug files, found and checked;
//!   - `sections`: MiniDebugInfo and compressed sections decompressed, within bounds, and
//!     the `.gnu_debuglink` record;
//!   - `symbols`: sized symbols, demangling;
//!   - `unwind`: the registers and stack copy taken while a thread is stopped, and
//!     framehop's unwinder over the copy.
//!
//! Must not:
//! - know about Python (the merge with Python frames is `python::native`);
//! - pause threads (the caller holds them);
//! - format output.
//!
//! Addresses follow the glossary in `elf`: AVMA (in the process), SVMA (in the ELF file),
//! bias = AVMA − SVMA per loaded module.

mod debuginfo;
mod fde;
#[cfg(feature = "fuzzing")]
pub(crate) mod fuzz;
mod image;
mod modules;
mod sections;
mod symbols;
mod unwind;

use crate::error::Result;
use crate::proc::ns::Namespaces;
use crate::proc::MapEntry;
use crate::ptrace::pause::PausedThreads;
use crate::ptrace::ProcessMemory;
pub use modules::NativeCache;
use modules::{FileState, Modules};
use std::collections::HashMap;
use std::sync::Arc;
#[cfg(target_arch = "x86_64")]
pub(crate) use unwind::saved_capture;
pub(crate) use unwind::Capture;
pub use unwind::MAX_NATIVE_FRAMES;
use unwind::{End, Unwinder};

/// Most bytes of a function scanned for its jumps ([`NativeProcess::split_parts`]).
const MAX_SPLIT_SCAN: u64 = 64 << 10;
/// Most split-off parts kept for a function (GCC makes one).
const MAX_SPLIT_PARTS: usize = 4;

/// One native frame, named as well as the module's file allows.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct NativeFrame {
    /// AVMA: the instruction pointer for the innermost frame, a return address for the
    /// others.
    pub(crate) address: u64,
    /// The function whose symbol covers the address, demangled (C++, Rust); None when no
    /// symbol does (a stripped library's internal function: `module+0xOFFSET`).
    pub(crate) symbol: Option<Arc<str>>,
    /// The file name of the module (`libc.so.6`, `[vdso]`); None for an address in no
    /// module (generated code).
    pub(crate) module: Option<Arc<str>>,
    /// SVMA of `address` in its module (what `addr2line -e MODULE` takes); the address
    /// itself when it is in no module.
    pub(crate) offset: u64,
    /// The source file and line of the instruction (for a return address, of the call),
    /// when the module has DWARF line tables.
    pub(crate) file: Option<Arc<str>>,
    pub(crate) line: Option<u32>,
    /// SVMA of the first instruction of the function holding the frame, from the module's
    /// unwind table, when no symbol names it. That is what tells one unnamed function from
    /// another.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) function_start: Option<u64>,
    /// Why the module's file was not used to name the frame (it changed on disk since it
    /// was loaded, or could not be read); absent when it was.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) module_note: Option<Arc<str>>,
}

impl NativeFrame {
    /// `symbol`, or `module+0xOFFSET`, or the bare address.
    pub(crate) fn label(&self) -> String {
        match (&self.symbol, &self.module) {
            (Some(s), _) => s.to_string(),
            (None, Some(m)) => format!("{m}+{:#x}", self.offset),
            (None, None) => format!("{:#x}", self.address),
        }
    }

    /// The function's name for a profile, which adds up samples by function: `symbol`, or
    /// `module+0xSTART` with the start of the unnamed function, or as [`Self::label`].
    pub(crate) fn function_label(&self) -> String {
        match (&self.symbol, &self.module, self.function_start) {
            (None, Some(m), Some(start)) => format!("{m}+{start:#x}"),
            _ => self.label(),
        }
    }
}

/// Each paused thread's capture (by kernel id), or why it has none.
pub(crate) type Captures = Vec<(i32, std::result::Result<Capture, String>)>;

/// One thread's native stack, innermost first.
#[derive(Debug, Clone, Default)]
pub(crate) struct NativeStack {
    pub(crate) frames: Vec<NativeFrame>,
    /// Each frame's stack pointer (AVMA). Frame `i`'s locals lie in `[sps[i], sps[i + 1])`.
    pub(crate) sps: Vec<u64>,
    /// The thread's stack as copied: from its stack pointer to the end of its mapping.
    pub(crate) stack_range: std::ops::Range<u64>,
    /// The stack was deeper than the frame limit ([`NativeProcess::set_max_frames`]) and
    /// was cut.
    pub(crate) truncated: bool,
    /// The unwinder could go no further before the outermost frame: why.
    pub(crate) stopped: Option<String>,
}

/// One process's modules and unwinder. It is made before its threads are paused (reading
/// /proc/PID/maps and opening files takes milliseconds), used while they are (capture)
/// and after (unwinding and naming).
pub struct NativeProcess {
    pid: i32,
    /// How long the last [`NativeProcess::capture_all`] took. That is what `--native` adds to
    /// the time the threads are stopped.
    last_capture: std::time::Duration,
    maps: Vec<MapEntry>,
    modules: Modules,
    unwinder: Unwinder,
    /// Frames named so far, by address and lookup address. A profile's samples name the
    /// same few thousand addresses again and again (symbol search, demangling and line
    /// tables once each).
    named: HashMap<(u64, u64), NativeFrame>,
    /// Name frames with their source file and line too (`dump`); a profile has no use for
    /// them, and a library's DWARF can take long to index the first time (the sampler
    /// would stall, and its next sample carry the stall's time).
    lines: bool,
}

/// The symbol covering `avma` in the ELF file at `host_path`, mapped in the process from
/// `path` as `maps` say, demangled (None: no symbol covers it), and the address's SVMA.
/// It is for an address of a process known from its core (the crash's). None when the
/// file cannot be parsed or its first segment is not among `maps`.
pub(crate) fn name_in_file(
    host_path: &std::path::Path,
    maps: &[MapEntry],
    path: &str,
    avma: u64,
) -> Option<(Option<String>, u64)> {
    let file = std::fs::File::open(host_path).ok()?;
    let image = image::Image::from_file(&file, host_path).ok()?;
    let head = maps
        .iter()
        .filter(|m| m.path.as_deref() == Some(path))
        .find(|m| m.offset == image.first_load_offset)?;
    let svma = avma.wrapping_sub(head.start.wrapping_sub(image.first_load_svma));
    let name = image
        .symbols()
        .find(svma)
        .map(|f| symbols::demangle(image.symbol_name(&f)).into_owned());
    Some((name, svma))
}

/// Whether the bytes before `ret` in the process end with a call instruction (`e8 rel32`,
/// or `ff /2` with any of its operand forms, 2 to 7 bytes long with prefixes). A return
/// address follows one.
fn follows_a_call(mem: &dyn ProcessMemory, ret: u64) -> bool {
    let Some(from) = ret.checked_sub(7) else {
        return false;
    };
    let Ok(b) = mem.read_vec(from, 7) else {
        return false;
    };
    // b[7 - n] is the byte n before `ret`.
    if b[2] == 0xe8 {
        return true;
    }
    (2..=7).any(|n| b[7 - n] == 0xff && (b[8 - n] >> 3) & 7 == 2)
}

/// Most named frames a [`NativeProcess`] keeps (beyond, it starts afresh).
const MAX_NAMED: usize = 1 << 16;

impl NativeProcess {
    /// Reads process `pid`'s map and modules (images from `cache` when it has them).
    pub(crate) fn new(
        pid: i32,
        mem: &dyn ProcessMemory,
        ns: Namespaces,
        cache: &mut NativeCache,
    ) -> Result<NativeProcess> {
        let maps = crate::proc::read_maps(pid)?;
        let modules = Modules::read(pid, &maps, mem, ns, cache);
        let unwinder = Unwinder::new(&modules);
        Ok(NativeProcess {
            pid,
            last_capture: std::time::Duration::ZERO,
            maps,
            modules,
            unwinder,
            named: HashMap::new(),
            lines: true,
        })
    }

    /// The modules of a process known from its core: `maps` its file mappings (with their
    /// executable flags), `mem` its memory, `files` where its files are found.
    pub(crate) fn from_saved(
        pid: i32,
        maps: Vec<MapEntry>,
        mem: &dyn ProcessMemory,
        files: &crate::coredump::Files,
        cache: &mut NativeCache,
    ) -> NativeProcess {
        let modules = Modules::read_from(modules::Opener::Saved(files), &maps, mem, cache);
        let unwinder = Unwinder::new(&modules);
        NativeProcess {
            pid,
            last_capture: std::time::Duration::ZERO,
            maps,
            modules,
            unwinder,
            named: HashMap::new(),
            lines: true,
        }
    }

    /// Cuts native stacks at `n` frames (at least 1; [`unwind::MAX_NATIVE_FRAMES`] unless
    /// set). A cut stack is merged as far as it goes and says it was cut.
    pub fn set_max_frames(&mut self, n: usize) {
        self.unwinder.max_frames = n.max(1);
    }

    /// Takes the registers and stack of every thread `paused` holds (call it while they
    /// are stopped). Gives one capture, or why there is none, per thread.
    pub(crate) fn capture_all(
        &mut self,
        paused: &PausedThreads,
        mem: &dyn ProcessMemory,
    ) -> Captures {
        let start = std::time::Instant::now();
        let captures = paused
            .tids()
            .into_iter()
            .map(|tid| (tid, unwind::capture(self.pid, tid, paused, mem, &self.maps)))
            .collect();
        self.last_capture = start.elapsed();
        captures
    }

    /// Names frames without their source file and line (for profiles, see the `lines` field).
    pub(crate) fn without_lines(mut self) -> NativeProcess {
        self.lines = false;
        self
    }

    /// Whether `pid`'s code has changed since its modules were read, that is, a file-backed
    /// executable mapping added, removed or moved (an extension imported, a library
    /// unloaded). Err: the map could not be read.
    pub(crate) fn code_changed(&self) -> Result<bool> {
        let now = crate::proc::read_maps(self.pid)?;
        let code = |maps: &[MapEntry]| -> Vec<(u64, u64, u64)> {
            maps.iter()
                .filter(|m| m.executable && m.inode != 0)
                .map(|m| (m.start, m.end, m.inode))
                .collect()
        };
        Ok(code(&now) != code(&self.maps))
    }

    /// How long the last capture of every thread's registers and stack took (the threads
    /// were stopped meanwhile).
    pub fn last_capture_time(&self) -> std::time::Duration {
        self.last_capture
    }

    /// Where the thread stopped with `regs` returns into code that `wanted` accepts (an
    /// AVMA of the instruction the return address follows). It gives the innermost such
    /// return address of its stack (unwound from a copy of at most `stack_bytes`, at most
    /// `max_frames` deep) and the stack slot it is popped from, checked twice:
    /// - the slot holds that address;
    /// - the instruction before it is a call.
    ///
    /// None when no frame returns there (or the unwinding stopped first).
    pub(crate) fn return_slot(
        &mut self,
        tid: i32,
        regs: &libc::user_regs_struct,
        mem: &dyn ProcessMemory,
        (stack_bytes, max_frames): (usize, usize),
        wanted: &dyn Fn(u64) -> bool,
    ) -> Option<(u64, u64)> {
        let cap = unwind::capture_registers(tid, regs, mem, &self.maps, stack_bytes).ok()?;
        let keep = self.unwinder.max_frames;
        self.unwinder.max_frames = max_frames.max(2);
        let unwound = self.unwinder.unwind(&cap);
        self.unwinder.max_frames = keep;
        // Frame 0 is where the thread is, not a return.
        let k =
            (1..unwound.frames.len()).find(|&k| wanted(unwound.frames[k].address_for_lookup()))?;
        let ret = unwound.frames[k].address();
        // The caller's stack pointer after the return. The return address is just below.
        let slot = unwound.sps[k].checked_sub(8)?;
        (cap.word(slot) == Ok(ret) && follows_a_call(mem, ret)).then_some((slot, ret))
    }

    /// The parts of the function at `at` (AVMA, `len` bytes) that the compiler split off
    /// into code of their own, as AVMA ranges (see [`fde::jump_targets`]). A part is code
    /// that the function jumps to, that an FDE of the same module covers, that no symbol
    /// names, that lies in `.text`, and that is not the function itself. At most
    /// [`MAX_SPLIT_PARTS`].
    pub(crate) fn split_parts(
        &self,
        mem: &dyn ProcessMemory,
        at: u64,
        len: u64,
    ) -> Vec<(u64, u64)> {
        let Some(m) = self.modules.find(at) else {
            return Vec::new();
        };
        let Some(image) = &m.image else {
            return Vec::new();
        };
        let mut code = vec![0u8; len.min(MAX_SPLIT_SCAN) as usize];
        if mem.read(at, &mut code).is_err() {
            return Vec::new();
        }
        let mut parts: Vec<(u64, u64)> = Vec::new();
        for target in fde::jump_targets(&code, at) {
            if !m.avma.contains(&target) || parts.iter().any(|&(a, l)| target.wrapping_sub(a) < l) {
                continue;
            }
            let svma = target.wrapping_sub(m.bias);
            if image.symbols().find(svma).is_some() {
                continue;
            }
            let Some(range) = fde::function_range(image, svma) else {
                continue;
            };
            // Inside `.text` (a tail call into a `.plt` stub is no part of the function).
            let in_text = image
                .sections
                .text
                .as_ref()
                .is_some_and(|t| t.svma.start <= range.start && range.end <= t.svma.end);
            if !in_text {
                continue;
            }
            let start = range.start.wrapping_add(m.bias);
            let part_len = range.end - range.start;
            // Not the function itself, nor a part that overlaps it.
            if start < at + len && at < start + part_len {
                continue;
            }
            parts.push((start, part_len));
            if parts.len() == MAX_SPLIT_PARTS {
                break;
            }
        }
        parts
    }

    /// Unwinds a capture and names its frames.
    pub(crate) fn stack(&mut self, cap: &Capture) -> NativeStack {
        let unwound = self.unwinder.unwind(cap);
        let frames = unwound
            .frames
            .iter()
            .map(|f| {
                let key = (f.address(), f.address_for_lookup());
                if let Some(known) = self.named.get(&key) {
                    return known.clone();
                }
                let frame = self.name(key.0, key.1);
                if self.named.len() >= MAX_NAMED {
                    self.named.clear();
                }
                self.named.insert(key, frame.clone());
                frame
            })
            .collect();
        let (truncated, stopped) = match unwound.end {
            End::Complete => (false, None),
            End::Truncated => (true, None),
            End::Stopped(why) => (false, Some(why)),
        };
        NativeStack {
            frames,
            sps: unwound.sps,
            stack_range: cap.stack_range(),
            truncated,
            stopped,
        }
    }

    /// Names the frame at `address`; `lookup` is the address inside the instruction that
    /// made the call (a return address minus one), which is what a symbol must cover.
    fn name(&self, address: u64, lookup: u64) -> NativeFrame {
        let Some(m) = self.modules.find(lookup) else {
            return NativeFrame {
                address,
                symbol: None,
                module: None,
                offset: address,
                file: None,
                line: None,
                function_start: None,
                module_note: None,
            };
        };
        let svma = lookup.wrapping_sub(m.bias);
        let symbol = m.image.as_ref().and_then(|image| {
            let found = image.symbols().find(svma)?;
            Some(Arc::from(symbols::demangle(image.symbol_name(&found))))
        });
        let function_start = match (&symbol, &m.image) {
            (None, Some(image)) => fde::function_start(image, svma),
            _ => None,
        };
        let source = m.image.as_ref().filter(|_| self.lines);
        let (file, line) = match source.and_then(|image| image.line(svma)) {
            Some((file, line)) => (Some(file), Some(line)),
            None => (None, None),
        };
        let module_note = match &m.state {
            FileState::Loaded => None,
            FileState::Replaced => Some(Arc::from(
                "deleted or replaced on disk since it was loaded (named from the loaded file)",
            )),
            FileState::Changed(why) | FileState::Unreadable(why) => Some(Arc::from(why.as_str())),
        };
        NativeFrame {
            address,
            symbol,
            module: Some(m.name.clone()),
            offset: address.wrapping_sub(m.bias),
            file,
            line,
            function_start,
            module_note,
        }
    }
}
