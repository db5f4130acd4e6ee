//! The frame walk: one thread's chain of frames, from its innermost one out.
//!
//! Owns: the walk itself and the decoding of one frame ([`FrameStep`]).
//! Must not: read a frame's code object but through the code cache ([`super::code`]).

use super::code::CodeInfo;
use super::prefetch::Ahead;
use super::{torn, Frame, LoopCheck, StackWalker, Walk};
use crate::error::Result;
use crate::ptrace::{field_u32, field_u64, field_u8, ProcessMemory};
use crate::python::strings;
use crate::python_bindings::FrameModel;
use std::sync::Arc;

/// A Python frame's code object, line, and current instruction's address.
type CodeAt = (Arc<CodeInfo>, Option<u32>, Option<u64>);

/// One frame decoded by [`StackWalker::step`].
#[derive(Clone)]
pub(super) struct FrameStep {
    /// The next (outer) frame's address.
    pub(super) back: u64,
    /// The code object's address (0 for none).
    code: u64,
    /// The frame's code object and line, when it is a Python frame of the program.
    pub(super) frame: Option<(Arc<CodeInfo>, Option<u32>)>,
    /// AVMA of its current instruction, when known.
    instr: Option<u64>,
    /// It is the outermost frame of one call of the evaluation loop (≤3.11: every frame
    /// on ≤3.10, `is_entry` on 3.11), or an entry frame between two such calls (3.12+).
    entry: bool,
}

/// 3.11+: the owner of a generator's (or coroutine's) frame, which lives in the generator.
const FRAME_OWNED_BY_GENERATOR: u8 = 1;

impl StackWalker {
    /// Walks one thread's frames from its innermost frame `top`.
    pub(crate) fn walk(&mut self, mem: &dyn ProcessMemory, top: u64) -> Result<Walk> {
        self.validated.clear();
        self.keep_memo_bounded();
        let mut ahead = std::mem::take(&mut self.ahead);
        ahead.clear();
        let w = self.walk_inner(mem, top, &mut ahead);
        ahead.known.clear();
        self.ahead = ahead;
        self.validated.clear();
        w
    }

    fn walk_inner(&mut self, mem: &dyn ProcessMemory, top: u64, ahead: &mut Ahead) -> Result<Walk> {
        let size = self.layout.frame.size;
        // From a page cache: the chain followed once first, its frames' bytes kept, and the
        // code objects of the frames that need decoding fetched in one request.
        if mem.prefetches() {
            self.read_ahead(mem, top, ahead);
        }
        // Room for a stack as deep as the last one walked (growing the vectors frame by
        // frame was a tenth of a busy sample's own work).
        let room = self.last_depth.min(self.max_depth) + 4;
        let mut w = Walk {
            frames: Vec::with_capacity(room),
            chain: Vec::with_capacity(room),
            shown: Vec::with_capacity(room),
            bytes: Vec::with_capacity(room * size),
            ..Walk::default()
        };
        let mut frames = LoopCheck::new();
        // For frames the look ahead did not read (allocated on first need).
        let mut buf = Vec::new();
        // `w.bytes` is the look ahead's, copied at once at the end, while every frame so
        // far came from it. From the first that did not, it is kept frame by frame.
        let mut own_bytes = false;
        let mut addr = top;
        while addr != 0 {
            if w.frames.len() >= self.max_depth {
                w.truncated = true;
                break;
            }
            if !frames.step(addr) {
                return Err(torn(addr, "the frame chain loops"));
            }
            let i = w.chain.len();
            let decoded: FrameStep;
            let (step, bytes) = match ahead.chain.get(i) {
                Some(&a) if a == addr => {
                    let bytes = &ahead.bytes[i * size..(i + 1) * size];
                    match ahead.known[i] {
                        Some(k) => (&self.memo_frames[k].step, bytes),
                        None => {
                            decoded = self.remember(mem, addr, bytes, i == 0)?;
                            (&decoded, bytes)
                        }
                    }
                }
                _ => {
                    if !own_bytes {
                        own_bytes = true;
                        w.bytes.extend_from_slice(&ahead.bytes[..i * size]);
                    }
                    buf.resize(size, 0);
                    mem.read(addr, &mut buf)?;
                    decoded = self.step_memo(mem, addr, &buf, i == 0)?;
                    (&decoded, &buf[..])
                }
            };
            w.chain.push(addr);
            if own_bytes {
                w.bytes.extend_from_slice(bytes);
            }
            w.shown.push(step.frame.is_some());
            w.evals_open += u32::from(step.frame.is_some());
            if step.entry {
                w.evals.push(std::mem::take(&mut w.evals_open));
                if self.layout.version >= (3, 12) {
                    w.anchors.push(addr);
                }
            }
            if let Some((code, line)) = &step.frame {
                if w.frames.is_empty() {
                    w.top_instr = step.instr;
                }
                w.frames.push(Frame {
                    function: code.function,
                    filename: code.filename,
                    line: *line,
                    native: false,
                });
            }
            if step.back == 0 && self.strict && self.outermost_is_generator(step.code) {
                return Err(torn(
                    addr,
                    "the chain ends at a generator frame (it was suspended or finished meanwhile)",
                ));
            }
            addr = step.back;
        }
        if !own_bytes {
            w.bytes
                .extend_from_slice(&ahead.bytes[..w.chain.len() * size]);
        }
        if w.truncated {
            return Ok(w);
        }
        self.last_depth = w.chain.len();
        if self.strict && w.frames.is_empty() && !w.chain.is_empty() {
            // A thread has no frame but C-stack entry frames only for an instant (starting
            // or ending). A read without pausing that sees that was most likely misled by
            // an entry frame already gone from the C stack, its memory reused (seen on
            // 3.14). The paused read that follows says what the thread really has.
            return Err(torn(
                top,
                "the chain holds no Python frame (an entry frame that was gone?)",
            ));
        }
        Ok(w)
    }

    /// A `str` object's text (names, task names).
    pub(crate) fn read_text(&self, mem: &dyn ProcessMemory, addr: u64) -> Result<String> {
        strings::read_text(mem, &self.layout.string, &self.types, addr)
    }

    /// The frame at `addr` alone, as a walk would show it (None for a frame CPython hides),
    /// and its bytes (`layout.frame.size` of them). It is for a suspended coroutine's frame,
    /// which lives inside its coroutine object and is on no thread's chain.
    pub(crate) fn frame_at(
        &mut self,
        mem: &dyn ProcessMemory,
        addr: u64,
    ) -> Result<(Option<Frame>, Vec<u8>)> {
        let buf = mem.read_vec(addr, self.layout.frame.size)?;
        let step = self.step(mem, addr, &buf, false, true);
        self.validated.clear();
        let frame = step?.frame.map(|(code, line)| Frame {
            function: code.function,
            filename: code.filename,
            line,
            native: false,
        });
        Ok((frame, buf))
    }

    /// 3.11+: the frame is a generator's (whether the generator is executing is kept in the
    /// generator object, not in the frame's bytes).
    pub(super) fn generator_frame(&self, buf: &[u8]) -> bool {
        let f = &self.layout.frame;
        matches!(f.model, FrameModel::Interpreter)
            && f.owner
                .is_some_and(|o| field_u8(buf, o) == FRAME_OWNED_BY_GENERATOR)
    }

    /// Decodes one frame from its bytes `buf` (read at `addr`): its link, its code object
    /// and, when it is a Python frame of the program, the frame itself.
    /// - `trust_cache`: use a cached code object without reading its header again (only
    ///   right after a walk that validated it).
    /// - `innermost`: the frame the thread's top-frame pointer named. It was executing when
    ///   that pointer was read, so the strict "is it executing" checks (meant for frames
    ///   reached through links) do not apply to it. A generator that yields between the two
    ///   reads would otherwise fail the sample exactly when Python code was running, and
    ///   biased the profile towards native time.
    pub(super) fn step(
        &mut self,
        mem: &dyn ProcessMemory,
        addr: u64,
        buf: &[u8],
        trust_cache: bool,
        innermost: bool,
    ) -> Result<FrameStep> {
        let check_executing = self.strict && !innermost;
        let f = self.layout.frame;
        let back = field_u64(buf, f.back);
        let code_addr = match f.model {
            // 3.14+ holds `f_executable` as a tagged `_PyStackRef`. Objects are at least
            // 8-byte aligned, so the low bits are tags (and always 0 before 3.14).
            FrameModel::Interpreter => field_u64(buf, f.code) & !7,
            FrameModel::Object { .. } => field_u64(buf, f.code),
        };
        let mut out = FrameStep {
            back,
            code: code_addr,
            frame: None,
            instr: None,
            entry: self.is_entry(buf),
        };
        match f.model {
            FrameModel::Object {
                lasti_in_code_units,
            } => {
                let (code, line, instr) = self.object_frame(
                    mem,
                    addr,
                    buf,
                    code_addr,
                    lasti_in_code_units,
                    trust_cache,
                    check_executing,
                )?;
                out.frame = Some((code, line));
                out.instr = instr;
            }
            FrameModel::Interpreter => {
                let owner = f.owner.map(|o| field_u8(buf, o));
                // 3.12+: frames owned by the C stack (shim / entry frames) are not Python.
                let not_python = self.layout.version >= (3, 12) && owner.unwrap_or(0) >= 3;
                if let (
                    true,
                    Some(FRAME_OWNED_BY_GENERATOR),
                    Some(iframe),
                    Some(state),
                    Some(exec),
                ) = (
                    check_executing,
                    owner,
                    f.gen_iframe,
                    f.gen_frame_state,
                    f.executing_state,
                ) {
                    let gen = addr.wrapping_sub(iframe as u64);
                    let mut st = [0u8; 1];
                    mem.read(gen.wrapping_add(state as u64), &mut st)?;
                    if st[0] as i8 as i64 != exec as i64 {
                        return Err(torn(
                            addr,
                            "a generator frame on the chain is not executing",
                        ));
                    }
                }
                if !not_python && code_addr != 0 {
                    if let Some((code, line, instr)) =
                        self.interpreter_frame(mem, buf, code_addr, owner, trust_cache)?
                    {
                        out.frame = Some((code, line));
                        out.instr = instr;
                    }
                }
            }
        }
        Ok(out)
    }

    /// Whether the frame `buf` begins a call of the evaluation loop (see
    /// [`FrameStep::entry`]).
    fn is_entry(&self, buf: &[u8]) -> bool {
        /// 3.12–3.15: the owner of the entry frame `_PyEval_EvalFrameDefault` pushes
        /// (`FRAME_OWNED_BY_CSTACK` on 3.12/3.13, `FRAME_OWNED_BY_INTERPRETER` on 3.14+,
        /// both 3; 3.14's `FRAME_OWNED_BY_CSTACK`, 4, is not such a frame).
        const ENTRY_FRAME_OWNER: u8 = 3;
        let f = &self.layout.frame;
        match f.model {
            FrameModel::Object { .. } => true,
            FrameModel::Interpreter if self.layout.version < (3, 12) => {
                f.is_entry.is_some_and(|o| field_u8(buf, o) != 0)
            }
            FrameModel::Interpreter => f
                .owner
                .is_some_and(|o| field_u8(buf, o) == ENTRY_FRAME_OWNER),
        }
    }

    /// A ≤3.10 frame object (`buf`, read at `addr`): checked to be a live frame (and, with
    /// `check_executing`, an executing one), then its code object, line and instruction.
    #[allow(clippy::too_many_arguments)]
    fn object_frame(
        &mut self,
        mem: &dyn ProcessMemory,
        addr: u64,
        buf: &[u8],
        code_addr: u64,
        lasti_in_code_units: bool,
        trust_cache: bool,
        check_executing: bool,
    ) -> Result<CodeAt> {
        let f = self.layout.frame;
        if self.types.frame != 0 && field_u64(buf, 8) != self.types.frame {
            return Err(torn(addr, "not a frame object"));
        }
        // A freed frame object (a code's zombie frame or one on the free list)
        // keeps its type and a stale `f_back`, but its reference count is 0.
        // A chain read without pausing that runs through one is torn.
        if self.strict && field_u64(buf, 0) == 0 {
            return Err(torn(addr, "a frame on the chain was freed"));
        }
        if check_executing {
            let suspended = match (f.stacktop, f.executing, f.state, f.executing_state) {
                (Some(o), _, _, _) => field_u64(buf, o) != 0,
                (_, Some(o), _, _) => field_u8(buf, o) == 0,
                (_, _, Some(o), Some(exec)) => field_u8(buf, o) as usize != exec,
                _ => false,
            };
            if suspended {
                return Err(torn(addr, "a frame on the chain is not executing"));
            }
        }
        let code = self.code_maybe_cached(mem, code_addr, trust_cache)?;
        let mut instr = None;
        let lasti = field_u32(buf, f.lasti) as i32;
        let line = if lasti < 0 {
            Some(code.firstlineno)
        } else {
            let off = if lasti_in_code_units {
                (lasti as u32).wrapping_mul(2)
            } else {
                lasti as u32
            };
            if code.bytecode != 0 && off < code.bytecode_len {
                instr = Some(code.bytecode.wrapping_add(off as u64));
            }
            code.table.line_at(off)
        };
        Ok((code, line, instr))
    }

    /// One `_PyInterpreterFrame` (3.11+); None for frames CPython itself hides
    /// (not a code object, or an incomplete frame still setting up).
    fn interpreter_frame(
        &mut self,
        mem: &dyn ProcessMemory,
        buf: &[u8],
        code_addr: u64,
        owner: Option<u8>,
        trust_cache: bool,
    ) -> Result<Option<CodeAt>> {
        // 3.13+ `f_executable` may hold a non-code object for some internal frames.
        let cached = if trust_cache {
            self.code_cache.get(&code_addr).cloned()
        } else {
            None
        };
        let code = match cached {
            Some(c) => Some(c),
            None => self.code_or_none(mem, code_addr)?,
        };
        let Some(code) = code else {
            return if self.layout.version >= (3, 13) {
                Ok(None)
            } else {
                Err(torn(code_addr, "a frame's code is not a code object"))
            };
        };
        let instr = field_u64(buf, self.layout.frame.lasti);
        // Incomplete frames (3.11/3.12) are still before the first traceable instruction.
        if let Some(first) = code.firsttraceable {
            if owner != Some(FRAME_OWNED_BY_GENERATOR)
                && instr < code.bytecode.wrapping_add(first as u64 * 2)
            {
                return Ok(None);
            }
        }
        // CPython's generated shims (3.13's `__init__` cleanup trampoline) have first line 0
        // and no line for any instruction. They are not Python code of the program, so not
        // shown.
        if code.firstlineno == 0 && code.table.line_at(0).is_none() {
            return Ok(None);
        }
        // Nor is any code of the file `<shim>` (3.12's `<interpreter trampoline>`, the code
        // of every entry frame). A paused read knows such a frame by its owner. A read
        // without pausing can catch an entry frame being pushed, its owner byte not written
        // yet (CI saw it once in 3,200 `dump --nonblocking` of 3.12).
        if &*code.filename == "<shim>" {
            return Ok(None);
        }
        let (line, at) = if instr < code.bytecode {
            (Some(code.firstlineno), None)
        } else {
            let off = instr - code.bytecode;
            if off > u32::MAX as u64 {
                return Err(torn(instr, "instruction pointer far outside its code"));
            }
            (code.table.line_at(off as u32), Some(instr))
        };
        Ok(Some((code, line, at)))
    }
}
