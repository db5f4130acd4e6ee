//! Tests of [`StackWalker::verify`] over a fake address space ([`BufferMemory`]), for every
//! generated Python 3 layout: 3.6–3.10 frame objects and 3.11+ interpreter frames, with the
//! thread state's top frame behind a `_PyCFrame` on 3.11/3.12.
//!
//! Each test builds a thread running `outer → middle → inner`, walks it, changes the
//! memory the way the thread could have between the walk and the verification, and checks
//! what `verify` makes of it. The thread's stack now must be a part of the walk's:
//! - from some frame down to the outermost;
//! - unchanged (that frame's line aside);
//! - with whatever returned or was pushed above it since.
//!
//! `verify` gives Ok(false) when not, and Err when a read fails.
//!
//! And the thread list's reads ([`StackWalker::threads`]) with threads at rest.

use super::{StackWalker, Walk};
use crate::error::{Error, Result};
use crate::ptrace::{BufferMemory, ProcessMemory};
use crate::python::strings::TypeAddrs;
use crate::python_bindings::{FrameModel, Layout, LineTableFormat, StringModel, GENERATED};

/// Where the fake address space starts, and its size.
const BASE: u64 = 0x5500_0000_0000;
const SPACE: usize = 0x8000;
/// Type objects (never read, only compared with objects' `ob_type`).
const TYPES: TypeAddrs = TypeAddrs {
    code: 0x7000_0010,
    frame: 0x7000_0020,
    unicode: 0x7000_0030,
    bytes: 0x7000_0040,
    dict: 0,
    module: 0,
    int: 0,
};
/// Code units of every fake code object. Unit `u` is on line `firstlineno + u`, and its
/// opcode byte is `OPCODE + 2 * u`.
const UNITS: u32 = 8;
const OPCODE: u8 = 0x40;
/// Nowhere in the fake address space.
const NOWHERE: u64 = 0xdead_0000_0000;
/// 3.11+ `owner` of a frame that lives in a generator object.
const FRAME_OWNED_BY_GENERATOR: u8 = 1;

/// Every generated Python 3 layout.
fn layouts() -> Vec<&'static Layout> {
    let all: Vec<&Layout> = GENERATED
        .iter()
        .copied()
        .filter(|l| l.string.model == StringModel::Pep393)
        .collect();
    assert!(all.iter().any(|l| l.frame.model == FrameModel::Interpreter));
    assert!(all
        .iter()
        .any(|l| matches!(l.frame.model, FrameModel::Object { .. })));
    all
}

fn name(l: &Layout) -> String {
    let t = if l.free_threaded { "t" } else { "" };
    format!("{}.{}{t}", l.version.0, l.version.1)
}

/// A bump allocator over a buffer that becomes a [`BufferMemory`] at [`BASE`].
struct Space {
    l: Layout,
    bytes: Vec<u8>,
    next: u64,
}

impl Space {
    fn new(l: Layout) -> Space {
        Space {
            l,
            bytes: vec![0; SPACE],
            next: BASE + 0x100,
        }
    }

    fn alloc(&mut self, size: usize) -> u64 {
        let at = self.next;
        self.next = (at + size as u64 + 15) & !15;
        assert!(self.next <= BASE + SPACE as u64, "the fake space is full");
        at
    }

    fn write(&mut self, at: u64, v: &[u8]) {
        let o = (at - BASE) as usize;
        self.bytes[o..o + v.len()].copy_from_slice(v);
    }

    fn put(&mut self, at: u64, v: u64) {
        self.write(at, &v.to_le_bytes());
    }

    fn get(&self, at: u64) -> u64 {
        let o = (at - BASE) as usize;
        u64::from_le_bytes(self.bytes[o..o + 8].try_into().unwrap())
    }

    fn mem(&self) -> BufferMemory {
        BufferMemory {
            base: BASE,
            bytes: self.bytes.clone(),
        }
    }

    /// A compact ASCII `str`.
    fn text(&mut self, s: &str) -> u64 {
        let st = self.l.string;
        let at = self.alloc(st.ascii_size + s.len() + 1);
        self.put(at + st.ob_type as u64, TYPES.unicode);
        self.put(at + st.unicode_length as u64, s.len() as u64);
        let state: u32 = (1 << st.state_kind_shift)
            | (1 << st.state_compact_shift)
            | (1 << st.state_ascii_shift);
        self.write(at + st.unicode_state as u64, &state.to_le_bytes());
        self.write(at + st.ascii_size as u64, s.as_bytes());
        at
    }

    /// A `bytes` object.
    fn bytes_object(&mut self, b: &[u8]) -> u64 {
        let st = self.l.string;
        let at = self.alloc(st.bytes_sval + b.len() + 1);
        self.put(at + st.ob_type as u64, TYPES.bytes);
        self.put(at + st.bytes_size as u64, b.len() as u64);
        self.write(at + st.bytes_sval as u64, b);
        at
    }

    /// A line table in the layout's format that puts code unit `u` on `firstlineno + u`.
    fn line_table(&self) -> Vec<u8> {
        let (first, next): (&[u8], &[u8]) = match self.l.code.linetable_format {
            // (byte increment, line increment): the increment applies from the next range.
            LineTableFormat::LnotabUnsigned | LineTableFormat::LnotabSigned => (&[2, 1], &[2, 1]),
            // (byte length, line delta) per range.
            LineTableFormat::Linetable310 => (&[2, 0], &[2, 1]),
            // One code unit, "no columns" (code 13), signed-varint line delta 0, then +1.
            LineTableFormat::Locations311 => (&[0xe8, 0], &[0xe8, 2]),
        };
        let mut t = first.to_vec();
        for _ in 1..UNITS {
            t.extend_from_slice(next);
        }
        t
    }

    /// A code object for the function `function` of `/app/<function>.py`.
    fn code(&mut self, function: &str, firstlineno: u32) -> u64 {
        let c = self.l.code;
        let bytecode: Vec<u8> = (0..UNITS as u8 * 2).map(|b| OPCODE + b).collect();
        let name = self.text(function);
        let filename = self.text(&format!("/app/{function}.py"));
        let table = self.line_table();
        let table = self.bytes_object(&table);
        let co_code = match c.co_code {
            Some(_) => self.bytes_object(&bytecode),
            None => 0,
        };
        let size = match c.code_adaptive {
            Some(o) => c.size.max(o) + bytecode.len(),
            None => c.size,
        };
        let at = self.alloc(size);
        self.put(at + self.l.string.ob_type as u64, TYPES.code);
        self.put(at + c.name as u64, name);
        if let Some(o) = c.qualname {
            self.put(at + o as u64, name);
        }
        self.put(at + c.filename as u64, filename);
        self.put(at + c.linetable as u64, table);
        self.write(at + c.firstlineno as u64, &firstlineno.to_le_bytes());
        if let Some(o) = c.co_code {
            self.put(at + o as u64, co_code);
        }
        if let Some(o) = c.code_adaptive {
            self.write(at + o as u64, &bytecode);
        }
        // co_flags 0 (not a generator), _co_firsttraceable 0 (every frame complete).
        at
    }

    /// A frame, executing `code` at code unit `unit`, linked to `back`.
    fn frame(&mut self, code: u64, back: u64, unit: u32) -> u64 {
        let at = self.alloc(self.l.frame.size);
        self.fill_frame(at, code, back, unit);
        at
    }

    /// Writes a frame at `at` (a new one, or one replacing what was there).
    fn fill_frame(&mut self, at: u64, code: u64, back: u64, unit: u32) {
        let f = self.l.frame;
        self.write(at, &vec![0; f.size]);
        self.put(at + f.back as u64, back);
        self.put(at + f.code as u64, code);
        if let FrameModel::Object { .. } = f.model {
            self.put(at, 1); // ob_refcnt
            self.put(at + 8, TYPES.frame);
        }
        // 3.11+: `owner` 0, owned by the thread. ≤3.10: executing.
        self.set_executing(at, true);
        self.set_unit(at, unit);
    }

    /// Moves a frame to code unit `unit` of its code (so to line `firstlineno + unit`).
    fn set_unit(&mut self, frame: u64, unit: u32) {
        let f = self.l.frame;
        match f.model {
            FrameModel::Object {
                lasti_in_code_units,
            } => {
                let lasti = if lasti_in_code_units { unit } else { unit * 2 };
                self.write(frame + f.lasti as u64, &lasti.to_le_bytes());
            }
            FrameModel::Interpreter => {
                let code = self.get(frame + f.code as u64);
                let bytecode = code + self.l.code.code_adaptive.unwrap() as u64;
                self.put(frame + f.lasti as u64, bytecode + 2 * unit as u64);
            }
        }
    }

    /// 3.11/3.12: a frame inside a generator object (owned by it), executing.
    fn generator_frame(&mut self, code: u64, back: u64, unit: u32) -> u64 {
        let f = self.l.frame;
        let iframe = f.gen_iframe.unwrap() as u64;
        let gen = self.alloc(iframe as usize + f.size);
        self.fill_frame(gen + iframe, code, back, unit);
        self.write(
            gen + iframe + f.owner.unwrap() as u64,
            &[FRAME_OWNED_BY_GENERATOR],
        );
        self.set_executing(gen + iframe, true);
        gen + iframe
    }

    /// Marks a frame executing, or suspended (a generator that yielded):
    /// - ≤3.10 in the frame object;
    /// - 3.11/3.12 in the generator that owns the frame (other frames always execute).
    fn set_executing(&mut self, frame: u64, executing: bool) {
        let f = self.l.frame;
        // FRAME_EXECUTING, or FRAME_SUSPENDED (-1).
        let state = |exec: usize| if executing { exec as u8 } else { 0xff };
        let (at, value) = match (f.model, f.executing, f.state, f.executing_state) {
            (FrameModel::Object { .. }, Some(o), _, _) => (frame + o as u64, executing as u8),
            (FrameModel::Object { .. }, None, Some(o), Some(exec)) => {
                (frame + o as u64, state(exec))
            }
            (FrameModel::Interpreter, _, _, Some(exec))
                if f.owner.is_some_and(|o| {
                    self.bytes[(frame + o as u64 - BASE) as usize] == FRAME_OWNED_BY_GENERATOR
                }) =>
            {
                let gen = frame - f.gen_iframe.unwrap() as u64;
                (gen + f.gen_frame_state.unwrap() as u64, state(exec))
            }
            (FrameModel::Interpreter, ..) => {
                assert!(
                    executing,
                    "{}: only a generator's frame yields",
                    name(&self.l)
                );
                return;
            }
            _ => panic!("{}: no executing flag", name(&self.l)),
        };
        self.write(at, &[value]);
    }

    /// A thread state whose innermost frame is `top` (behind a `_PyCFrame` on 3.11/3.12).
    fn thread(&mut self, top: u64) -> u64 {
        let t = self.l.thread;
        let root = t.root_cframe.unwrap_or(0);
        let c_frame_end = root
            + t.cframe_current_frame
                .unwrap_or(0)
                .max(t.cframe_previous.unwrap_or(0));
        let tstate = self.alloc((t.frame + 8).max(c_frame_end + 8));
        if t.cframe_current_frame.is_some() {
            // Outside any call of the loop: the thread state's own root C frame.
            self.put(tstate + t.frame as u64, tstate + root as u64);
        }
        self.set_top(tstate, top);
        tstate
    }

    /// Where the thread state says the thread's innermost frame is.
    fn set_top(&mut self, tstate: u64, top: u64) {
        let t = self.l.thread;
        match t.cframe_current_frame {
            Some(cur) => {
                let cframe = self.get(tstate + t.frame as u64);
                self.put(cframe + cur as u64, top);
            }
            None => self.put(tstate + t.frame as u64, top),
        }
    }
}

/// The frames of the test thread, innermost first: (function, first line, code unit).
const FUNCTIONS: [(&str, u32, u32); 3] = [("inner", 30, 4), ("middle", 20, 3), ("outer", 10, 2)];
/// What a walk of the test thread gives: (function, line), innermost first.
const WALKED: [(&str, Option<u32>); 3] = [
    ("inner", Some(34)),
    ("middle", Some(23)),
    ("outer", Some(12)),
];

/// The test thread, running `outer → middle → inner`; on 3.11/3.12, `middle` may be a
/// generator's frame.
struct Stack {
    s: Space,
    tstate: u64,
    /// The code objects of `FUNCTIONS`.
    codes: [u64; 3],
    /// The frames, innermost first: inner, middle, outer.
    frames: [u64; 3],
}

impl Stack {
    fn new(l: &Layout) -> Stack {
        Stack::with_generator(l, false)
    }

    /// With `generator` (and a layout that has generator-owned frames), `middle` is the
    /// frame of a generator.
    fn with_generator(l: &Layout, generator: bool) -> Stack {
        let mut s = Space::new(*l);
        let codes = FUNCTIONS.map(|(function, first, _)| s.code(function, first));
        let outer = s.frame(codes[2], 0, FUNCTIONS[2].2);
        let middle = if generator && l.frame.gen_iframe.is_some() {
            s.generator_frame(codes[1], outer, FUNCTIONS[1].2)
        } else {
            s.frame(codes[1], outer, FUNCTIONS[1].2)
        };
        let inner = s.frame(codes[0], middle, FUNCTIONS[0].2);
        let tstate = s.thread(inner);
        Stack {
            s,
            tstate,
            codes,
            frames: [inner, middle, outer],
        }
    }

    /// The thread's innermost frame is now `top`.
    fn set_top(&mut self, top: u64) {
        self.s.set_top(self.tstate, top);
    }

    /// Frame `i` (0: inner) now links to `back`.
    fn set_back(&mut self, i: usize, back: u64) {
        let at = self.frames[i] + self.s.l.frame.back as u64;
        self.s.put(at, back);
    }

    /// Frame `i` now runs a new code object, `other`, on its first line.
    fn set_other_code(&mut self, i: usize) {
        let other = self.s.code("other", 50);
        let back = self.s.get(self.frames[i] + self.s.l.frame.back as u64);
        self.s.fill_frame(self.frames[i], other, back, 0);
    }

    /// A new frame of a new code object, linked to `back`.
    fn push(&mut self, back: u64) -> u64 {
        let code = self.s.code("pushed", 70);
        self.s.frame(code, back, 1)
    }
}

fn functions(w: &Walk) -> Vec<(&str, Option<u32>)> {
    w.frames.iter().map(|f| (&*f.function, f.line)).collect()
}

/// How a test walks: the walker's settings, and whether `middle` is a generator's frame
/// (where the layout has generator-owned frames, on 3.11/3.12).
#[derive(Debug, Clone, Copy)]
struct How {
    strict: bool,
    max_depth: usize,
    generator: bool,
}

const PLAIN: How = How {
    strict: false,
    max_depth: 4096,
    generator: false,
};

/// Walks the test thread of `l`, applies `change`, then verifies the walk against the
/// memory as it is now.
fn verify_with(l: &Layout, how: How, change: impl FnOnce(&mut Stack)) -> (Result<bool>, Walk) {
    let max_depth = how.max_depth;
    let mut st = Stack::with_generator(l, how.generator);
    let mut sw = StackWalker::new(*l, TYPES);
    sw.strict = how.strict;
    sw.max_depth = max_depth;
    let mem = st.s.mem();
    let top = sw.current_top_frame(&mem, st.tstate).unwrap();
    let mut w = sw.walk(&mem, top).unwrap();
    let expected = &WALKED[..max_depth.min(3)];
    assert_eq!(functions(&w), expected, "{}: the walk", name(l));
    assert_eq!(w.chain, st.frames[..max_depth.min(3)], "{}", name(l));
    assert_eq!(w.top_op, None);
    change(&mut st);
    let got = sw.verify(&st.s.mem(), st.tstate, &mut w, None);
    // Verification never edits the walk's frames, whatever it decides.
    assert_eq!(functions(&w), expected, "{}: the walk, verified", name(l));
    (got, w)
}

/// [`verify_with`] a plain walker.
fn verify_after(l: &Layout, change: impl FnOnce(&mut Stack)) -> (Result<bool>, Walk) {
    verify_with(l, PLAIN, change)
}

/// Asserts that `verify` accepted (`true`) or rejected (`false`) the walk, and that the
/// walk's opcode was read exactly when it was accepted.
fn expect(l: &Layout, what: &str, accept: bool, change: impl FnOnce(&mut Stack)) {
    let (got, w) = verify_after(l, change);
    match got {
        Ok(v) => assert_eq!(v, accept, "{}: {what}", name(l)),
        Err(e) => panic!("{}: {what}: {e}", name(l)),
    }
    let op = OPCODE + 2 * FUNCTIONS[0].2 as u8;
    assert_eq!(w.top_op, accept.then_some(op), "{}: {what}", name(l));
}

#[test]
fn an_unchanged_stack_is_accepted() {
    for l in layouts() {
        expect(l, "unchanged", true, |_| {});
        // What the top-frame field held is noted (3.11/3.12: the _PyCFrame's address).
        let (_, w) = verify_after(l, |_| {});
        let st = Stack::new(l);
        let field = st.s.get(st.tstate + l.thread.frame as u64);
        assert_eq!(w.top_field, Some(field), "{}", name(l));
        assert!(w.top_instr.is_some(), "{}", name(l));
    }
}

#[test]
fn the_opcode_comes_from_op_mem_when_given() {
    for l in layouts() {
        let mut st = Stack::new(l);
        let mut sw = StackWalker::new(*l, TYPES);
        let mem = st.s.mem();
        let mut w = sw.walk(&mem, st.frames[0]).unwrap();
        let at = w.top_instr.unwrap();
        st.s.write(at, &[0x99]);
        let op_mem = st.s.mem();
        assert_eq!(
            sw.verify(&mem, st.tstate, &mut w, Some(&op_mem)).ok(),
            Some(true)
        );
        assert_eq!(w.top_op, Some(0x99), "{}", name(l));
    }
}

#[test]
fn frames_that_returned_since_are_accepted() {
    for l in layouts() {
        expect(l, "inner returned", true, |st| st.set_top(st.frames[1]));
        expect(l, "inner and middle returned", true, |st| {
            st.set_top(st.frames[2])
        });
        // What lies above the thread's frame now may be anything.
        expect(l, "inner returned, its memory cleared", true, |st| {
            st.set_top(st.frames[1]);
            let f = st.frames[0];
            st.s.write(f, &vec![0; l.frame.size]);
        });
        expect(
            l,
            "inner returned, another frame at its address",
            true,
            |st| {
                st.set_top(st.frames[1]);
                st.set_other_code(0);
            },
        );
        expect(
            l,
            "inner returned, another link at its address",
            true,
            |st| {
                st.set_top(st.frames[1]);
                st.set_back(0, st.frames[2]);
            },
        );
        // A frame above the thread's that no longer decodes only changed.
        expect(l, "inner returned, its code pointer dangling", true, |st| {
            st.set_top(st.frames[1]);
            let at = st.frames[0] + l.frame.code as u64;
            st.s.put(at, NOWHERE);
        });
        // The thread's frame went on to another line, so the walk's stands.
        expect(l, "inner returned, middle went on", true, |st| {
            st.set_top(st.frames[1]);
            st.s.set_unit(st.frames[1], 6);
        });
        expect(l, "inner went on", true, |st| {
            st.s.set_unit(st.frames[0], 7)
        });
    }
}

#[test]
fn frames_pushed_since_are_accepted_when_their_links_reach_the_walk() {
    for l in layouts() {
        expect(l, "a call from inner", true, |st| {
            let x = st.push(st.frames[0]);
            st.s.set_unit(st.frames[0], 5);
            st.set_top(x);
        });
        expect(l, "inner returned, middle called another", true, |st| {
            let x = st.push(st.frames[1]);
            st.set_top(x);
        });
        // Three links at most from the thread's frame to the walk's.
        expect(l, "three frames pushed on middle", true, |st| {
            let z = st.push(st.frames[1]);
            let y = st.push(z);
            let x = st.push(y);
            st.set_top(x);
        });
        expect(l, "four frames pushed on middle", false, |st| {
            let w = st.push(st.frames[1]);
            let z = st.push(w);
            let y = st.push(z);
            let x = st.push(y);
            st.set_top(x);
        });
        // The walk's frames all hold still, but the thread's stack does not run through
        // them (the walk went down a dead generator's frames, say).
        expect(l, "a stack apart from the walk's", false, |st| {
            let x = st.push(0);
            st.set_top(x);
        });
    }
}

#[test]
fn a_kept_frame_with_another_link_is_rejected() {
    for l in layouts() {
        expect(l, "middle links elsewhere", false, |st| {
            // A copy of outer, at another address.
            let copy = st.s.frame(st.codes[2], 0, FUNCTIONS[2].2);
            st.set_back(1, copy);
        });
        expect(l, "inner links elsewhere", false, |st| {
            st.set_back(0, st.frames[2]);
        });
        expect(l, "inner returned, middle links elsewhere", false, |st| {
            st.set_top(st.frames[1]);
            st.set_back(1, 0);
        });
    }
}

#[test]
fn a_kept_frame_with_another_code_object_is_rejected() {
    for l in layouts() {
        expect(l, "middle runs other code", false, |st| {
            st.set_other_code(1)
        });
        expect(l, "outer runs other code", false, |st| st.set_other_code(2));
        expect(l, "inner returned, outer runs other code", false, |st| {
            st.set_top(st.frames[1]);
            st.set_other_code(2);
        });
        // The thread's frame is at inner's address but is not inner (it returned, and
        // another call took its place). So it is not the walk's stack, as far as verify can tell.
        expect(l, "another frame at inner's address", false, |st| {
            st.set_other_code(0)
        });
    }
}

#[test]
fn a_kept_frame_below_the_thread_s_on_another_line_is_rejected() {
    for l in layouts() {
        expect(l, "middle on another line", false, |st| {
            st.s.set_unit(st.frames[1], 6)
        });
        expect(l, "outer on another line", false, |st| {
            st.s.set_unit(st.frames[2], 6)
        });
        expect(l, "inner returned, outer on another line", false, |st| {
            st.set_top(st.frames[1]);
            st.s.set_unit(st.frames[2], 6);
        });
    }
}

#[test]
fn a_top_frame_of_zero_is_rejected() {
    for l in layouts() {
        expect(l, "no frame", false, |st| st.set_top(0));
        // 3.11/3.12: no _PyCFrame either.
        expect(l, "a top-frame field of 0", false, |st| {
            let at = st.tstate + l.thread.frame as u64;
            st.s.put(at, 0);
        });
    }
}

/// A [`BufferMemory`] with one range that cannot be read.
struct WithHole<'a> {
    mem: &'a BufferMemory,
    hole: (u64, u64),
}

impl ProcessMemory for WithHole<'_> {
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<()> {
        if addr < self.hole.1 && addr + buf.len() as u64 > self.hole.0 {
            return Err(Error::Read {
                pid: 0,
                addr,
                len: buf.len(),
                why: "a hole in the test's memory".into(),
            });
        }
        self.mem.read(addr, buf)
    }
}

#[test]
fn an_unreadable_thread_state_or_frame_is_an_error() {
    for l in layouts() {
        let st = Stack::new(l);
        let mem = st.s.mem();
        let field = st.tstate + l.thread.frame as u64;
        let top_field = st.s.get(field);
        let mut holes = vec![
            ("the thread state", (field, field + 8)),
            ("outer", (st.frames[2], st.frames[2] + 8)),
        ];
        if let Some(cur) = l.thread.cframe_current_frame {
            let at = top_field + cur as u64;
            holes.push(("the _PyCFrame", (at, at + 8)));
        }
        for (what, hole) in holes {
            let mut sw = StackWalker::new(*l, TYPES);
            let mut w = sw.walk(&mem, st.frames[0]).unwrap();
            let holed = WithHole { mem: &mem, hole };
            let got = sw.verify(&holed, st.tstate, &mut w, None);
            assert!(got.is_err(), "{}: {what} unreadable: {got:?}", name(l));
            assert_eq!(w.top_op, None);
        }
        // A top frame pointer to nowhere, so following its link fails.
        let (got, _) = verify_after(l, |st| st.set_top(NOWHERE));
        assert!(got.is_err(), "{}: a top frame nowhere: {got:?}", name(l));
    }
}

#[test]
fn a_truncated_walk_is_not_checked_past_its_cut() {
    for l in layouts() {
        let cut = |change: fn(&mut Stack)| {
            verify_with(
                l,
                How {
                    max_depth: 2,
                    ..PLAIN
                },
                change,
            )
            .0
            .ok()
        };
        assert_eq!(cut(|_| {}), Some(true), "{}: unchanged", name(l));
        // Middle, the last frame walked, links elsewhere. That is beyond the cut, so not checked.
        assert_eq!(
            cut(|st| st.set_back(1, 0)),
            Some(true),
            "{}: middle's link",
            name(l)
        );
        // Inner's link is inside the walk.
        assert_eq!(
            cut(|st| st.set_back(0, st.frames[2])),
            Some(false),
            "{}: inner's link",
            name(l)
        );
    }
}

/// A strict walker checks that every frame reached through a link is executing, but not
/// the thread's own frame. A generator that yielded between the walk and the second read
/// still names a stack the thread had. What it checks:
/// - ≤3.10: frame objects' executing flag;
/// - 3.11/3.12: the state of the generator that owns `middle`.
#[test]
fn a_strict_walk_excuses_only_the_thread_s_frame_from_executing() {
    let generator = How {
        generator: true,
        ..PLAIN
    };
    let strict = How {
        strict: true,
        ..generator
    };
    let strict = |l: &Layout, change: fn(&mut Stack)| verify_with(l, strict, change).0.ok();
    let (mut objects, mut generators) = (0, 0);
    for l in layouts() {
        match l.frame.model {
            FrameModel::Object { .. } => objects += 1,
            FrameModel::Interpreter if l.frame.gen_iframe.is_some() => generators += 1,
            FrameModel::Interpreter => continue,
        }
        assert_eq!(strict(l, |_| {}), Some(true), "{}", name(l));
        let middle_suspended = |st: &mut Stack| st.s.set_executing(st.frames[1], false);
        assert_eq!(strict(l, middle_suspended), Some(false), "{}", name(l));
        let middle_on_top_suspended = |st: &mut Stack| {
            st.set_top(st.frames[1]);
            st.s.set_executing(st.frames[1], false);
        };
        let got = strict(l, middle_on_top_suspended);
        assert_eq!(got, Some(true), "{}", name(l));
        if let FrameModel::Object { .. } = l.frame.model {
            let inner_suspended = |st: &mut Stack| st.s.set_executing(st.frames[0], false);
            assert_eq!(strict(l, inner_suspended), Some(true), "{}", name(l));
        }
        // Not strict, a suspended frame is not looked at.
        let (plain, _) = verify_with(l, generator, middle_suspended);
        assert_eq!(plain.ok(), Some(true), "{}", name(l));
    }
    assert!(objects >= 5 && generators >= 2, "{objects} {generators}");
}

/// 3.11/3.12: a thread caught entering the evaluation loop, its new `_PyCFrame` installed
/// and its `current_frame` not written yet. The slot holds what an earlier call left there,
/// the frame of a generator suspended since (its link cleared), which reads as a whole
/// stack of one frame.
///
/// The thread's two C frames against the walk's one call say so:
/// - 3.11: `outer` marked `is_entry`;
/// - 3.12: an entry frame below `outer`.
///
/// And the still walk reads the caller's C frame: `inner → middle → outer`. Settled (the
/// new C frame's `current_frame` written), the walk is the thread's as it is.
#[test]
fn a_stale_generator_frame_in_a_c_frame_being_installed_is_not_the_stack() {
    let mut tried = 0;
    for l in layouts() {
        let (Some(cur), Some(prev), Some(_)) = (
            l.thread.cframe_current_frame,
            l.thread.cframe_previous,
            l.frame.gen_iframe,
        ) else {
            continue;
        };
        tried += 1;
        let mut st = Stack::new(l);
        let f = l.frame;
        // The thread's first call of the loop runs `outer`.
        match f.is_entry {
            Some(o) => st.s.write(st.frames[2] + o as u64, &[1]),
            None => {
                let entry = st.s.frame(0, 0, 0);
                st.s.write(entry + f.owner.unwrap() as u64, &[3]);
                st.set_back(2, entry);
            }
        }
        let t = l.thread;
        // The C frames of the thread's two calls, on its C stack (the inner one lower), the
        // first linked to the thread state's root one and running the stack.
        let root = st.s.get(st.tstate + t.frame as u64);
        let second = st.s.alloc(cur.max(prev) + 8);
        let first = st.s.alloc(cur.max(prev) + 8);
        st.s.put(first + prev as u64, root);
        st.s.put(first + cur as u64, st.s.get(root + cur as u64));
        // A generator, suspended, so its frame links nowhere.
        let code = st.s.code("squares", 60);
        let stale = st.s.generator_frame(code, 0, 1);
        st.s.set_executing(stale, false);
        // The second call installs its C frame, `current_frame` still the stale one.
        st.s.put(second + prev as u64, first);
        st.s.put(second + cur as u64, stale);
        st.s.put(st.tstate + t.frame as u64, second);
        let mut sw = StackWalker::new(*l, TYPES);
        let mem = st.s.mem();
        let top = sw.current_top_frame(&mem, st.tstate).unwrap();
        assert_eq!(top, stale, "{}", name(l));
        let alone = sw.walk(&mem, top).unwrap();
        assert_eq!(functions(&alone), [("squares", Some(61))], "{}", name(l));
        let w = sw.walk_still(&mem, st.tstate, top).unwrap();
        assert_eq!(functions(&w), WALKED, "{}: the caller's C frame", name(l));
        // Settled: the second call runs the generator, resumed (an entry frame of its own).
        st.s.set_executing(stale, true);
        st.s.put(stale + f.back as u64, st.frames[0]);
        match f.is_entry {
            Some(o) => st.s.write(stale + o as u64, &[1]),
            None => {
                let entry = st.s.frame(0, st.frames[0], 0);
                st.s.write(entry + f.owner.unwrap() as u64, &[3]);
                st.s.put(stale + f.back as u64, entry);
            }
        }
        let mem = st.s.mem();
        let w = sw.walk_still(&mem, st.tstate, top).unwrap();
        let mut whole = vec![("squares", Some(61))];
        whole.extend(WALKED);
        assert_eq!(functions(&w), whole, "{}: settled", name(l));
    }
    assert!(tried >= 2, "{tried}");
}

/// Writes the seeds of the `stack_walk` fuzz target (fuzz/corpus/stack_walk/, see
/// `crate::fuzzing::stack_walk` for the format). They are the test thread of every layout,
/// its address space cut after the last object. Run by hand when the layouts change:
/// `cargo test --lib write_stack_walk_seeds -- --ignored`.
#[test]
#[ignore]
fn write_stack_walk_seeds() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/stack_walk");
    std::fs::create_dir_all(&dir).unwrap();
    for l in layouts() {
        let stack = Stack::new(l);
        let pick = GENERATED.iter().position(|g| std::ptr::eq(*g, l)).unwrap() as u8;
        let mut seed = vec![pick];
        seed.extend_from_slice(&stack.tstate.to_le_bytes());
        seed.extend_from_slice(&stack.frames[0].to_le_bytes());
        seed.extend_from_slice(&stack.s.bytes[..(stack.s.next - BASE) as usize]);
        std::fs::write(dir.join(format!("py{}", name(l).replace('.', ""))), seed).unwrap();
    }
}

/// A chain that loops (torn memory) is an error, wherever the loop closes and however long
/// the stack above it, never an endless walk or a stack cut at the depth limit.
#[test]
fn a_frame_chain_that_loops_is_an_error() {
    for l in layouts() {
        for (from, to) in [(0, 0), (2, 0), (2, 1), (1, 0)] {
            let mut st = Stack::new(l);
            // Frames above the loop, so that it closes well past the first links.
            let mut top = st.frames[0];
            for _ in 0..37 {
                top = st.push(top);
            }
            st.set_top(top);
            st.set_back(from, st.frames[to]);
            let mem = st.s.mem();
            let mut sw = StackWalker::new(*l, TYPES);
            let top = sw.current_top_frame(&mem, st.tstate).unwrap();
            match sw.walk(&mem, top) {
                Err(Error::Inconsistent { why, .. }) => {
                    assert_eq!(why, "the frame chain loops", "{} {from}->{to}", name(l))
                }
                other => panic!(
                    "{} {from}->{to}: {:?}",
                    name(l),
                    other.map(|w| w.frames.len())
                ),
            }
        }
    }
}

/// Memory that notes every range read from it.
struct Noted<'a> {
    mem: &'a BufferMemory,
    reads: std::cell::RefCell<Vec<(u64, usize)>>,
}

impl ProcessMemory for Noted<'_> {
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<()> {
        self.reads.borrow_mut().push((addr, buf.len()));
        self.mem.read(addr, buf)
    }
}

impl Noted<'_> {
    /// Whether a read since the last [`Noted::forget`] touched `[at, at + len)`.
    fn touched(&self, at: u64, len: u64) -> bool {
        self.reads
            .borrow()
            .iter()
            .any(|&(a, n)| a < at + len && a + n as u64 > at)
    }

    fn forget(&self) {
        self.reads.borrow_mut().clear();
    }
}

/// Four thread states on the same frames (only the states matter), listed as
/// `first → a → b → c` (`thread_id` 0x7f00 + i, kernel id 100 + i), and their interpreter:
/// (the stack, the states, the interpreter, the bytes of a state the list reads).
fn four_threads(l: &Layout) -> (Stack, Vec<u64>, u64, u64) {
    let mut st = Stack::new(l);
    let t = l.thread;
    // Each state is followed by room for the fields the list reads (a `_PyCFrame` state
    // holds fewer).
    let state_size = [t.next, t.interp, t.frame, t.thread_id]
        .into_iter()
        .chain(t.native_thread_id)
        .max()
        .unwrap() as u64
        + 8;
    st.s.alloc(state_size as usize);
    let mut states = vec![];
    for _ in 0..4 {
        states.push(st.s.thread(st.frames[0]));
        st.s.alloc(state_size as usize);
    }
    let interp = st.s.alloc(l.interp.tstate_head.max(l.interp.next) + 8);
    for (i, &ts) in states.iter().enumerate() {
        st.s.put(ts + t.interp as u64, interp);
        st.s.put(ts + t.thread_id as u64, 0x7f00 + i as u64);
        if let Some(o) = t.native_thread_id {
            st.s.put(ts + o as u64, 100 + i as u64);
        }
        let next = states.get(i + 1).copied().unwrap_or(0);
        st.s.put(ts + t.next as u64, next);
    }
    st.s.put(interp + l.interp.tstate_head as u64, states[0]);
    (st, states, interp, state_size)
}

/// A thread list read with `reuse` (threads that did not run since, with the innermost
/// frame they were read at) reads neither the state of such a thread nor its `_PyCFrame`,
/// and gives the same threads; a thread that ran, or holds the GIL, is read; a failed
/// read of the list makes the next one read every state; a thread that left behind a
/// resting one is gone from a read without `reuse` (a whole one).
#[test]
fn resting_threads_states_are_not_read_again() {
    for l in layouts() {
        let (st, states, interp, state_size) = four_threads(l);
        let t = l.thread;
        let mem = st.s.mem();
        let noted = Noted {
            mem: &mem,
            reads: Default::default(),
        };
        let mut sw = StackWalker::new(*l, TYPES);
        let none = crate::IdMap::default();
        let first = sw.threads(&noted, interp, Some(0), Some(&none)).unwrap();
        assert_eq!(first.len(), 4, "{}", name(l));
        assert!(states.iter().all(|&s| noted.touched(s, state_size)));
        // `a` and `c` rested; `b` ran.
        let rest: crate::IdMap<u64, u64> = [1, 3]
            .into_iter()
            .map(|i| (first[i].thread_id, first[i].top_frame))
            .collect();
        noted.forget();
        let again = sw.threads(&noted, interp, Some(0), Some(&rest)).unwrap();
        for (i, &s) in states.iter().enumerate() {
            let read = noted.touched(s, state_size);
            assert_eq!(read, i == 0 || i == 2, "{} state {i}", name(l));
        }
        noted.forget();
        let ids = |v: &[super::RawThread]| -> Vec<(u64, u64, Option<i32>, u64)> {
            v.iter()
                .map(|r| (r.tstate, r.thread_id, r.native_id, r.top_frame))
                .collect()
        };
        assert_eq!(ids(&again), ids(&first), "{}", name(l));
        // The two taken as they were say so (their callers skip the map); none did at first.
        let rested = |v: &[super::RawThread]| v.iter().map(|r| r.rested).collect::<Vec<_>>();
        assert_eq!(rested(&again), [false, true, false, true], "{}", name(l));
        assert_eq!(rested(&first), [false; 4], "{}", name(l));
        // `c` holds the GIL, so it is read, and said to hold it.
        let held = sw
            .threads(&noted, interp, Some(states[3]), Some(&rest))
            .unwrap();
        assert!(noted.touched(states[3], state_size), "{}", name(l));
        assert!(!noted.touched(states[1], state_size));
        noted.forget();
        assert!(held[3].holds_gil && !held[1].holds_gil, "{}", name(l));
        assert!(!held[3].rested && held[1].rested, "{}", name(l));
        // A read that fails (the head of the list unreadable) leaves the next read whole.
        let holed = WithHole {
            mem: &mem,
            hole: (states[0], states[0] + 8),
        };
        assert_eq!(sw.list_hint(false), None, "{}: no whole read due", name(l));
        assert!(sw.threads(&holed, interp, Some(0), Some(&rest)).is_err());
        // The next read is a whole one: the states as last found, for the prefetch.
        let hint = sw.list_hint(false).expect("a whole read is due");
        for &s in &states {
            assert!(
                hint.iter().any(|&(a, n)| a == s && n as u64 >= state_size),
                "{}",
                name(l)
            );
        }
        noted.forget();
        sw.threads(&noted, interp, Some(0), Some(&rest)).unwrap();
        assert!(
            states.iter().all(|&s| noted.touched(s, state_size)),
            "{}",
            name(l)
        );
        // `b` leaves the list while `a`, before it, rests. `a`'s kept link still leads to
        // `b` (what `RestTracker`'s `list_whole` is for) until every state is read again.
        let mut gone = st.s.mem();
        let a_next = (states[1] + t.next as u64 - BASE) as usize;
        gone.bytes[a_next..a_next + 8].copy_from_slice(&states[3].to_le_bytes());
        let stale = sw.threads(&gone, interp, Some(0), Some(&rest)).unwrap();
        assert_eq!(stale.len(), 4, "{}", name(l));
        let whole = sw.threads(&gone, interp, Some(0), None).unwrap();
        let left: Vec<u64> = whole.iter().map(|r| r.tstate).collect();
        assert_eq!(left, [states[0], states[1], states[3]], "{}", name(l));
    }
}

/// A sample's read of the list, given what changed in the map of threads at rest since the
/// last one (`ReuseDelta`), reads the states of the threads that did not rest, of those
/// whose entry changed and of the GIL holder only, leaves the others out (counted), and
/// gives the threads `threads` gives less those taken as they were; it reads the list the
/// whole way when a sample was missed, a thread started (the head moved), or a state read
/// links elsewhere than before.
#[test]
fn a_sample_reads_only_the_states_of_threads_that_did_not_rest() {
    use crate::python::ReuseDelta;
    for l in layouts() {
        let (mut st, states, interp, state_size) = four_threads(l);
        let t = l.thread;
        let mut sw = StackWalker::new(*l, TYPES);
        let delta = |epoch: u64, threads: &[u64]| ReuseDelta {
            epoch,
            threads: threads.to_vec(),
        };
        let at = |v: &[super::RawThread]| v.iter().map(|r| r.tstate).collect::<Vec<_>>();
        let mem = st.s.mem();
        let noted = Noted {
            mem: &mem,
            reads: Default::default(),
        };
        let none = crate::IdMap::default();
        let (first, left) = sw
            .threads_in_sample(&noted, interp, Some(0), Some(&none), Some(&delta(1, &[])))
            .unwrap();
        assert_eq!((at(&first), left), (states.clone(), 0), "{}", name(l));
        // `a` and `c` come to rest (their entries came in).
        let (ta, tc) = (first[1].thread_id, first[3].thread_id);
        let mut rest: crate::IdMap<u64, u64> = [1, 3]
            .into_iter()
            .map(|i| (first[i].thread_id, first[i].top_frame))
            .collect();
        // The first read was a whole one (as every first is). The next follows the links
        // (taking `a` and `c` as they were) and notes the shape of the list.
        let (two, left) = sw
            .threads_in_sample(
                &noted,
                interp,
                Some(0),
                Some(&rest),
                Some(&delta(2, &[ta, tc])),
            )
            .unwrap();
        assert_eq!((at(&two), left), (states.clone(), 0), "{}", name(l));
        let rested = two.iter().map(|r| r.rested).collect::<Vec<_>>();
        assert_eq!(rested, [false, true, false, true], "{}", name(l));
        // From then on only `first` and `b` are read; `a` and `c` are left out.
        noted.forget();
        let (three, left) = sw
            .threads_in_sample(&noted, interp, Some(0), Some(&rest), Some(&delta(3, &[])))
            .unwrap();
        assert_eq!(
            (at(&three), left),
            (vec![states[0], states[2]], 2),
            "{}",
            name(l)
        );
        assert!(three.iter().all(|r| !r.rested && !r.holds_gil));
        for (i, &s) in states.iter().enumerate() {
            let read = noted.touched(s, state_size);
            assert_eq!(read, i == 0 || i == 2, "{} state {i}", name(l));
        }
        // `c` holds the GIL, so it is read, and said to hold it.
        let (four, left) = sw
            .threads_in_sample(
                &noted,
                interp,
                Some(states[3]),
                Some(&rest),
                Some(&delta(4, &[])),
            )
            .unwrap();
        assert_eq!(
            (at(&four), left),
            (vec![states[0], states[2], states[3]], 1)
        );
        assert!(four[2].holds_gil && !four[0].holds_gil, "{}", name(l));
        // `a` ran (its entry went), so it is read again. `c`, no longer holding the GIL, is left
        // out.
        rest.remove(&ta);
        noted.forget();
        let (five, left) = sw
            .threads_in_sample(&noted, interp, Some(0), Some(&rest), Some(&delta(5, &[ta])))
            .unwrap();
        assert_eq!(
            (at(&five), left),
            (vec![states[0], states[1], states[2]], 1)
        );
        assert!(noted.touched(states[1], state_size) && !noted.touched(states[3], state_size));
        // A sample missed (epoch 7 after 5), so the read goes the whole way, as `threads` reads
        // it.
        let (six, left) = sw
            .threads_in_sample(&noted, interp, Some(0), Some(&rest), Some(&delta(7, &[])))
            .unwrap();
        assert_eq!((at(&six), left), (states.clone(), 0), "{}", name(l));
        assert_eq!(
            six.iter().map(|r| r.rested).collect::<Vec<_>>(),
            [false, false, false, true]
        );
        let (_, left) = sw
            .threads_in_sample(&noted, interp, Some(0), Some(&rest), Some(&delta(8, &[])))
            .unwrap();
        assert_eq!(left, 1, "{}: back to the threads that ran", name(l));
        // `c` leaves behind `b` (which ran), so `b`'s link moved. The read goes the whole way
        // (`c` gone).
        let b_next = (states[2] + t.next as u64 - BASE) as usize;
        let mut gone = st.s.mem();
        gone.bytes[b_next..b_next + 8].copy_from_slice(&0u64.to_le_bytes());
        let (nine, left) = sw
            .threads_in_sample(&gone, interp, Some(0), Some(&rest), Some(&delta(9, &[])))
            .unwrap();
        assert_eq!((at(&nine), left), (states[..3].to_vec(), 0), "{}", name(l));
        // A thread starts, with a state at the head of the list. The read goes the whole way, the
        // new one in.
        let new = st.s.thread(st.frames[0]);
        st.s.alloc(state_size as usize);
        st.s.put(new + t.interp as u64, interp);
        st.s.put(new + t.thread_id as u64, 0x7f10);
        st.s.put(new + t.next as u64, states[0]);
        st.s.put(interp + l.interp.tstate_head as u64, new);
        let grown = st.s.mem();
        let (ten, left) = sw
            .threads_in_sample(&grown, interp, Some(0), Some(&rest), Some(&delta(10, &[])))
            .unwrap();
        assert_eq!(at(&ten)[..2], [new, states[0]], "{}", name(l));
        assert_eq!((ten.len(), left), (5, 0), "{}", name(l));
        // Without what changed in the map (None), always the whole way.
        let (_, left) = sw
            .threads_in_sample(&grown, interp, Some(0), Some(&rest), None)
            .unwrap();
        assert_eq!(left, 0, "{}", name(l));
    }
}
