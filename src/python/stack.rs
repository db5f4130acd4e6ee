//! Walking interpreters, thread states and frames.
//!
//! Owns: [`StackWalker`], which turns a runtime address into every thread's stack
//! (function, file, line, innermost first), and the code-object cache. It reads only
//! through [`ProcessMemory`], so it can walk captured memory in tests.
//! Must not: touch /proc or ptrace (the caller pauses threads and maps thread ids), or
//! format output.
//!
//! Everything read is validated (type pointers, chain cycles, sizes); a failed check is an
//! error, never a made-up frame. Code objects are immutable while alive, so their decoded
//! names and line tables are cached by address and revalidated by a fingerprint of the
//! fields they came from.

use super::linetable::LineTable;
use super::strings::{self, TypeAddrs};
use crate::error::{Error, Result};
use crate::ptrace::{field_u32, field_u64, field_u8, ProcessMemory};
use crate::python_bindings::{FrameModel, Layout};
use std::collections::HashMap;
use std::sync::Arc;

pub(crate) use crate::profile::Frame;

/// One thread state as found in the interpreter.
#[derive(Debug, Clone)]
pub(crate) struct RawThread {
    /// Address of the `PyThreadState`.
    pub(crate) tstate: u64,
    /// `thread_id`: the thread's `pthread_t`.
    pub(crate) thread_id: u64,
    /// Kernel TID when the version records it (3.8+).
    pub(crate) native_id: Option<i32>,
    /// Address of the innermost frame when we read the thread state.
    pub(crate) top_frame: u64,
    /// Index of the interpreter (0 = main).
    pub(crate) interp_index: usize,
    /// Whether this thread holds its interpreter's GIL.
    pub(crate) holds_gil: bool,
    /// Taken as the last read found it, unread: the thread is in the `reuse` map the list
    /// was read with, with this innermost frame, and does not hold the GIL (see
    /// [`KnownStates`]). Saves the callers a look-up of that map per thread.
    pub(crate) rested: bool,
}

/// The result of walking one thread's frames.
#[derive(Debug, Clone, Default)]
pub struct Walk {
    /// Innermost first.
    pub(crate) frames: Vec<Frame>,
    /// The stack was deeper than `max_depth` and was cut.
    pub(crate) truncated: bool,
    /// AVMA of the first byte (the opcode) of the innermost Python frame's current
    /// instruction, when known.
    pub(crate) top_instr: Option<u64>,
    /// The opcode at `top_instr`, when [`StackWalker::verify`] read it.
    pub(crate) top_op: Option<u8>,
    /// Addresses of every frame the walk went through (hidden ones too), innermost first.
    pub(crate) chain: Vec<u64>,
    /// For each entry of `chain`: whether it gave one of `frames` (hidden frames do not).
    pub(crate) shown: Vec<bool>,
    /// The bytes the walk decoded, `layout.frame.size` for each entry of `chain`, one after
    /// another: [`StackWalker::verify`] compares a second read with them.
    pub(crate) bytes: Vec<u8>,
    /// Read with the thread paused after reads without pausing kept failing validation.
    pub(crate) paused: bool,
    /// The value of the thread state's top-frame field when [`StackWalker::verify`] read it
    /// (3.11/3.12: the address of the current `_PyCFrame`).
    pub(crate) top_field: Option<u64>,
    /// For each call of the evaluation loop (a C frame of `_PyEval_EvalFrameDefault`,
    /// `PyEval_EvalFrameEx` on 2.7), innermost first, how many of `frames` it runs: one each
    /// on ≤3.10; on 3.11 up to the frame marked `is_entry`; on 3.12+ up to an entry frame
    /// (owned by the C stack). What the merge with native frames pairs them by.
    pub(crate) evals: Vec<u32>,
    /// Frames of `frames` after the last of `evals` (the outermost ones): none in a whole
    /// stack; in a truncated one, the part of a call cut off.
    pub(crate) evals_open: u32,
    /// 3.11+: for each of `evals`, an address inside that call's own C stack frame: its
    /// entry frame (3.12+, a local of `_PyEval_EvalFrameDefault`), or its `_PyCFrame`
    /// (3.11, read by `python::native::cframe_anchors`). Empty before 3.11.
    pub(crate) anchors: Vec<u64>,
    /// Not walked: the thread did not run since its last read (see
    /// `SnapshotOptions::reuse`); everything else is empty.
    pub(crate) unchanged: bool,
    /// The ranges [`StackWalker::verify`] read `chain` again in ([`spans`] of it): the next
    /// sample's second look reads them (empty until verified).
    pub(crate) spans: Vec<(u64, u64)>,
}

impl Walk {
    /// The walk of a thread left unread because it did not run since its last read.
    pub(crate) fn unchanged() -> Walk {
        Walk {
            unchanged: true,
            ..Walk::default()
        }
    }
}

/// Links followed from a thread's new innermost frame, when verifying a walk, to find where
/// its stack joins the walk's.
const MAX_JOIN_LINKS: usize = 3;

/// The address ranges `[start, end)` that cover objects of `size` bytes at `addrs`, joining
/// objects less than a page apart.
pub(crate) fn spans(addrs: &[u64], size: u64) -> Vec<(u64, u64)> {
    const JOIN: u64 = 4096;
    // A chain of 3.11+'s frame stack comes innermost first, at falling addresses, with
    // a few frames elsewhere (3.12+'s entry frames on the C stack, generators' frames):
    // reversed, it is nearly sorted, and an insertion sort does little more than look.
    let mut sorted: Vec<u64> = addrs.iter().rev().copied().collect();
    if sorted.len() <= 256 {
        for i in 1..sorted.len() {
            let a = sorted[i];
            let mut j = i;
            while j > 0 && sorted[j - 1] > a {
                sorted[j] = sorted[j - 1];
                j -= 1;
            }
            sorted[j] = a;
        }
    } else {
        sorted.sort_unstable();
    }
    let mut out: Vec<(u64, u64)> = Vec::new();
    for a in sorted {
        let end = a.saturating_add(size);
        match out.last_mut() {
            Some(last) if a <= last.1.saturating_add(JOIN) && end - last.0 <= 16 * JOIN => {
                last.1 = last.1.max(end)
            }
            _ => out.push((a, end)),
        }
    }
    out
}

/// A Python frame's code object, line, and current instruction's address.
type CodeAt = (Arc<CodeInfo>, Option<u32>, Option<u64>);

/// One frame decoded by [`StackWalker::step`].
#[derive(Clone)]
struct FrameStep {
    /// The next (outer) frame's address.
    back: u64,
    /// The code object's address (0 for none).
    code: u64,
    /// The frame's code object and line, when it is a Python frame of the program.
    frame: Option<(Arc<CodeInfo>, Option<u32>)>,
    /// AVMA of its current instruction, when known.
    instr: Option<u64>,
    /// It is the outermost frame of one call of the evaluation loop (≤3.11: every frame
    /// on ≤3.10, `is_entry` on 3.11), or an entry frame between two such calls (3.12+).
    entry: bool,
}

/// Decoded facts about one code object.
#[derive(Debug)]
struct CodeInfo {
    function: crate::profile::Name,
    filename: crate::profile::Name,
    firstlineno: u32,
    table: LineTable,
    /// AVMA of the first bytecode byte (3.11+: `co_code_adaptive`; ≤3.10: the payload of
    /// `co_code`); 0 when unknown.
    bytecode: u64,
    /// Length of the bytecode in bytes (≤3.10; `u32::MAX` when not known up front).
    bytecode_len: u32,
    /// 3.11/3.12: `_co_firsttraceable` in code units.
    firsttraceable: Option<u32>,
    /// `co_flags` (0 when the layout does not know where they are).
    flags: u32,
    /// Pointer fields this was decoded from: a changed fingerprint means a new object.
    fingerprint: [u64; 4],
}

/// Walks stacks of one interpreter layout.
pub struct StackWalker {
    pub(crate) layout: Layout,
    types: TypeAddrs,
    /// Deepest stack returned; deeper ones are truncated (and say so).
    pub max_depth: usize,
    /// Check that every frame on the chain is executing (a chain read without pausing may
    /// run through a generator frame that was suspended meanwhile: that read is torn).
    pub(crate) strict: bool,
    code_cache: HashMap<u64, Arc<CodeInfo>, ahash::RandomState>,
    /// What the last snapshot read, one range per page (see
    /// [`crate::ptrace::PageCache::used_ranges`]): the next one prefetches it.
    pub page_hint: Vec<(u64, usize)>,
    /// The hint of the snapshot before, while a read without pausing left threads to be
    /// read paused right after (their pages are there, not in `page_hint`); else empty.
    pub(crate) reread_hint: Vec<(u64, usize)>,
    /// What the last snapshot's verification read (each thread's frames, then its
    /// top-frame fields): the next one reads it a second time right after its prefetch.
    pub recheck_hint: Vec<(u64, usize)>,
    /// Read each thread's [`Walk::anchors`] on 3.11 too (its `_PyCFrame` chain), for the
    /// merge with native frames.
    pub(crate) want_anchors: bool,
    /// Code objects already validated during the current walk (a recursive function's
    /// code is checked once, not once per frame). Empty outside a walk.
    validated: Vec<u64>,
    /// Frames decoded by earlier walks, by address (where in `memo_frames`): see
    /// [`StackWalker::step_memo`].
    memo: HashMap<u64, usize, ahash::RandomState>,
    /// What `memo` points into. A walk refers to its entries by index, which stay put
    /// until the memo starts afresh, between walks (taking a reference to each frame's
    /// code object instead was a visible part of a busy sample: atomic increments).
    memo_frames: Vec<Decoded>,
    /// Frames on the chain of the last whole walk.
    last_depth: usize,
    /// The look ahead's room, kept between walks (see [`Ahead`]).
    ahead: Ahead,
    /// [`StackWalker::verify`]'s marks of each frame, kept between walks.
    marks: Vec<bool>,
    /// The chain [`StackWalker::verify`] last read again, and its [`spans`].
    spans_of: Vec<u64>,
    spans_last: Vec<(u64, u64)>,
    /// The thread states the last read of the thread list found (see [`KnownStates`]).
    known_states: KnownStates,
    /// Threads the last snapshot found unchanged and left out (see
    /// [`crate::python::SnapshotOptions::omit_unchanged`]).
    pub(crate) left_out: usize,
    /// Threads the last snapshot left unread under `SnapshotOptions::max_walks`, and where
    /// in the thread list the next one starts.
    pub(crate) deferred: usize,
    pub(crate) walk_cursor: usize,
}

/// The thread states as reads of the thread list found them, by address: a thread that has
/// not run since its state was read left that state as it was (its innermost frame, its
/// ids), and its link to the next state changes only when the next thread leaves the list
/// (a new thread goes in at the head). So a list of a thousand threads of which two ran is
/// read in three states (the two and the head), not a thousand: each state is a request's
/// range and a page the kernel pins, at every sample.
///
/// A thread that leaves the list while its neighbour rests would be found again through
/// the neighbour's old link (it is read, as a thread that changed, until the list is read
/// whole): every [`FULL_LIST_EVERY`], and after a read that failed, every state is read.
#[derive(Default)]
struct KnownStates {
    by_addr: crate::IdMap<u64, KnownState>,
    /// When every state of the list was last read (None: never, or a read failed since).
    full_at: Option<std::time::Instant>,
    /// The number of the current read of the list (marks the entries it met).
    read: u32,
    /// The list as the last read of a sample found it, for the next sample's read of only
    /// the threads that ran (see [`StackWalker::threads_in_sample`]); None after any other
    /// read.
    shape: Option<Shape>,
}

/// The thread list of one interpreter as a sample's read found it, against the caller's
/// map of threads at rest (`reuse`) as of `epoch`: the next sample, given what changed in
/// that map since ([`crate::python::ReuseDelta`]), reads the states of the threads that
/// did not rest and those whose entry changed, and counts the others, instead of
/// following a thousand links and looking each thread up.
struct Shape {
    /// The interpreter (the only one) and its first thread state (a new thread goes in at
    /// the head).
    interp: u64,
    head: u64,
    /// States on the list.
    len: usize,
    /// The states that were not taken as they were, in list order.
    unrested: Vec<u64>,
    /// Each state by its `thread_id`.
    by_thread: crate::IdMap<u64, u64>,
    epoch: u64,
}

/// A thread state as last read: the thread found, and what its `next` field held.
struct KnownState {
    raw: RawThread,
    interp: u64,
    next: u64,
    /// Its `frame` field (on 3.11/3.12 the `_PyCFrame` that names the top frame).
    frame_field: u64,
    /// The read of the list that last met it.
    met: u32,
    /// Where that read met it in the list (0: the head).
    pos: u32,
}

impl KnownState {
    /// `reuse` names its thread with the innermost frame it was last read with: it has not
    /// run since (the GIL aside, which the caller checks).
    fn rests_in(&self, reuse: &crate::IdMap<u64, u64>) -> bool {
        reuse.get(&self.raw.thread_id) == Some(&self.raw.top_frame)
    }
}

impl KnownStates {
    /// Whether the next read of the list is to be a whole one (asked for, due, or after
    /// a failed read).
    fn whole(&self, asked: bool) -> bool {
        asked || self.full_at.is_none_or(|t| t.elapsed() >= FULL_LIST_EVERY)
    }

    /// A read of the list begins: whether it is to be a whole one.
    fn begin(&mut self, asked: bool) -> bool {
        self.read = self.read.wrapping_add(1);
        self.whole(asked)
    }

    /// A read of the list ended: states it did not meet are forgotten.
    fn end(&mut self, read: &Result<Vec<RawThread>>, whole: bool) {
        match read {
            Ok(list) => {
                if whole {
                    self.full_at = Some(std::time::Instant::now());
                }
                if self.by_addr.len() > list.len() {
                    let now = self.read;
                    self.by_addr.retain(|_, k| k.met == now);
                }
            }
            Err(_) => self.full_at = None,
        }
    }
}

impl Shape {
    /// The shape of `list` as a read of interpreter `interp` found it, against the map of
    /// `epoch`; None for a list that spans interpreters or names a thread twice.
    fn of(list: &[RawThread], interp: u64, epoch: u64) -> Option<Shape> {
        if list.iter().any(|t| t.interp_index != 0) {
            return None;
        }
        let mut by_thread = crate::IdMap::default();
        for t in list {
            if by_thread.insert(t.thread_id, t.tstate).is_some() {
                return None;
            }
        }
        Some(Shape {
            interp,
            head: list.first().map_or(0, |t| t.tstate),
            len: list.len(),
            unrested: list
                .iter()
                .filter(|t| !t.rested)
                .map(|t| t.tstate)
                .collect(),
            by_thread,
            epoch,
        })
    }
}

/// How often a sample reads every thread state of the list, whatever the threads did
/// (see [`KnownStates`]): a bound on how long a list changed behind a resting thread goes
/// unseen; a read of a thousand states once a second is a few hundred microseconds.
const FULL_LIST_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// The chain as [`StackWalker::read_ahead`] followed it: each frame's address, its bytes
/// (`layout.frame.size` each, one after another) and what the memo knows of it. The
/// walker keeps one and reuses its room walk after walk (allocating and growing these
/// vectors for every walk was a tenth of a busy sample's own work).
#[derive(Default)]
struct Ahead {
    chain: Vec<u64>,
    bytes: Vec<u8>,
    known: Vec<Option<usize>>,
    /// The code objects to fetch (address, size).
    codes: Vec<(u64, usize)>,
}

impl Ahead {
    fn clear(&mut self) {
        self.chain.clear();
        self.bytes.clear();
        self.known.clear();
        self.codes.clear();
    }
}

/// A frame's bytes as a walk read them and what they decoded to.
struct Decoded {
    /// Where the frame is.
    addr: u64,
    /// The memo entry of the frame it linked to when a walk last went through both
    /// (`usize::MAX`: none yet): the next frame's entry without a lookup by address.
    next: std::cell::Cell<usize>,
    bytes: Vec<u8>,
    step: FrameStep,
    /// The checks its decoding made: see [`StackWalker::checks`].
    checks: u8,
}

/// 3.11+: the owner of a generator's (or coroutine's) frame, which lives in the generator.
const FRAME_OWNED_BY_GENERATOR: u8 = 1;

/// Most frames [`StackWalker::memo`] holds (it starts afresh past this).
const MEMO_LIMIT: usize = 16_384;

/// Limits that stop a walk of corrupt or torn memory from running forever.
const MAX_INTERPRETERS: usize = 4096;
const MAX_THREADS: usize = 1 << 16;
const CODE_CACHE_LIMIT: usize = 100_000;

/// Catches a list or chain that loops (torn memory: the interpreters, a thread list, the
/// frames, the C frames), in constant work and memory per step (Brent's): the element
/// `lap` steps back is kept, and a new one taken each time `lap` doubles; a list that loops
/// meets the kept element within three times its length. (A set of every element met cost
/// a seeded hasher and an allocation per list at every sample; a search of the elements
/// met was quadratic.)
struct LoopCheck {
    kept: u64,
    lap: usize,
    power: usize,
    /// Elements met so far.
    steps: usize,
}

impl LoopCheck {
    fn new() -> LoopCheck {
        LoopCheck {
            kept: 0,
            lap: 0,
            power: 1,
            steps: 0,
        }
    }

    /// False when `a` (never 0) closes a loop.
    fn step(&mut self, a: u64) -> bool {
        if a == self.kept {
            return false;
        }
        self.steps += 1;
        self.lap += 1;
        if self.lap == self.power {
            (self.kept, self.lap, self.power) = (a, 0, self.power * 2);
        }
        true
    }
}

fn torn(addr: u64, why: &'static str) -> Error {
    Error::Inconsistent { addr, why }
}

/// A walk's frames read a second time, all in one request, then the thread's top-frame
/// field (and the innermost instruction's opcode).
struct ReadAgain {
    /// Ranges read (frames close together are one range) and their bytes, one after another.
    spans: Vec<(u64, u64)>,
    bufs: Vec<u8>,
    frame_size: usize,
    op: [u8; 1],
    field: [u8; 8],
}

impl Drop for ReadAgain {
    fn drop(&mut self) {
        crate::ptrace::give_back_buf(std::mem::take(&mut self.bufs));
    }
}

impl ReadAgain {
    /// Frame `addr`'s bytes (empty when it was not read).
    fn frame(&self, addr: u64) -> &[u8] {
        let size = self.frame_size;
        let mut off = 0usize;
        for &(start, end) in &self.spans {
            let len = (end - start) as usize;
            if addr >= start && addr.saturating_add(size as u64) <= end {
                let at = off + (addr - start) as usize;
                return &self.bufs[at..at + size];
            }
            off += len;
        }
        &[]
    }
}

impl StackWalker {
    pub fn new(layout: Layout, types: TypeAddrs) -> StackWalker {
        StackWalker {
            layout,
            types,
            max_depth: 4096,
            strict: false,
            code_cache: HashMap::default(),
            page_hint: Vec::new(),
            reread_hint: Vec::new(),
            recheck_hint: Vec::new(),
            want_anchors: false,
            validated: Vec::new(),
            memo: HashMap::default(),
            memo_frames: Vec::new(),
            last_depth: 0,
            ahead: Ahead::default(),
            marks: Vec::new(),
            spans_of: Vec::new(),
            spans_last: Vec::new(),
            known_states: KnownStates::default(),
            left_out: 0,
            deferred: 0,
            walk_cursor: 0,
        }
    }

    /// Every thread state of every interpreter, starting from the first interpreter.
    /// `gil_tstate_current`: the value of `_PyThreadState_Current` (2.7/3.6) or
    /// `_PyRuntime.gilstate.tstate_current` (3.7–3.11), when the caller has it.
    pub(crate) fn threads(
        &mut self,
        mem: &dyn ProcessMemory,
        interp_head: u64,
        gil_tstate_current: Option<u64>,
        reuse: Option<&crate::IdMap<u64, u64>>,
    ) -> Result<Vec<RawThread>> {
        // A state whose thread is in `reuse` with the innermost frame it was last read
        // with, and which does not hold the GIL, is taken as the last read found it (see
        // [`KnownStates`]); but not at a whole read.
        self.read_threads(mem, interp_head, gil_tstate_current, reuse)
            .0
    }

    /// [`StackWalker::threads`], and whether it read every state (a whole read).
    fn read_threads(
        &mut self,
        mem: &dyn ProcessMemory,
        interp_head: u64,
        gil_tstate_current: Option<u64>,
        reuse: Option<&crate::IdMap<u64, u64>>,
    ) -> (Result<Vec<RawThread>>, bool) {
        self.known_states.shape = None;
        let whole = self.known_states.begin(reuse.is_none());
        let reuse = reuse.filter(|_| !whole);
        let read = self.read_list(mem, interp_head, gil_tstate_current, reuse);
        self.known_states.end(&read, whole);
        (read, whole)
    }

    /// A sample's read of the thread list: [`StackWalker::threads`], or, when `delta` says
    /// how `reuse` changed since the last sample's read and that read found one
    /// interpreter, only the threads that did not rest (the states of threads whose entry
    /// in `reuse` changed, of those that ran last time, and of the GIL holder; each read as
    /// `threads` reads it), with the number of threads at rest left out: what `threads`
    /// would give, the threads taken as they were aside. The list is read the whole way
    /// (every link followed) when its head moved (a thread started), a state read shows
    /// another link or another thread than last time, or every [`FULL_LIST_EVERY`].
    pub(crate) fn threads_in_sample(
        &mut self,
        mem: &dyn ProcessMemory,
        interp_head: u64,
        gil_tstate_current: Option<u64>,
        reuse: Option<&crate::IdMap<u64, u64>>,
        delta: Option<&crate::python::ReuseDelta>,
    ) -> Result<(Vec<RawThread>, usize)> {
        if let (Some(reuse), Some(delta), Some(shape)) =
            (reuse, delta, self.known_states.shape.take())
        {
            let fits = shape.epoch.wrapping_add(1) == delta.epoch
                && shape.interp == interp_head
                && !self.known_states.whole(false);
            if fits {
                match self.ran_since(mem, shape, gil_tstate_current, reuse, delta) {
                    Ok(Some(read)) => return Ok(read),
                    Ok(None) => {}
                    Err(e) => {
                        self.known_states.full_at = None;
                        return Err(e);
                    }
                }
            }
        }
        let (list, whole) = self.read_threads(mem, interp_head, gil_tstate_current, reuse);
        let list = list?;
        // A whole read takes no thread as it was: not a shape to go on from.
        if let (false, Some(_), Some(delta)) = (whole, reuse, delta) {
            self.known_states.shape = Shape::of(&list, interp_head, delta.epoch);
        }
        Ok((list, 0))
    }

    /// [`StackWalker::threads_in_sample`]'s read of the threads that did not rest. None:
    /// the list is to be read the whole way.
    fn ran_since(
        &mut self,
        mem: &dyn ProcessMemory,
        mut shape: Shape,
        gil: Option<u64>,
        reuse: &crate::IdMap<u64, u64>,
        delta: &crate::python::ReuseDelta,
    ) -> Result<Option<(Vec<RawThread>, usize)>> {
        let l = &self.layout;
        let interp = shape.interp;
        if mem.read_u64(interp.wrapping_add(l.interp.tstate_head as u64))? != shape.head
            || mem.read_u64(interp.wrapping_add(l.interp.next as u64))? != 0
        {
            return Ok(None);
        }
        let holder = match gil {
            Some(h) => h,
            None => self.gil_holder_312(mem, interp)?,
        };
        let known = &self.known_states.by_addr;
        let at = |tstate: u64| known.get(&tstate).map(|k| (k.pos, tstate));
        let mut look: Vec<(u32, u64)> =
            Vec::with_capacity(shape.unrested.len() + delta.threads.len() + 1);
        look.extend(shape.unrested.iter().filter_map(|&t| at(t)));
        for thread in &delta.threads {
            if let Some(&t) = shape.by_thread.get(thread) {
                look.extend(at(t));
            }
        }
        if holder != 0 {
            // A state not on the list holds the GIL: the list changed.
            let Some(h) = at(holder) else { return Ok(None) };
            look.push(h);
        }
        look.sort_unstable();
        look.dedup();
        // Every state left unlooked at is one the way through the links would take as it
        // was (checked at every sample of the debug build's tests: a change of the map
        // missing from `delta` would leave a thread that ran unread).
        #[cfg(debug_assertions)]
        for (addr, k) in &self.known_states.by_addr {
            if !look.iter().any(|&(_, t)| t == *addr) {
                assert!(
                    k.rests_in(reuse),
                    "a thread at rest left out of a sample's read of the list"
                );
            }
        }
        let mut out = Vec::with_capacity(look.len());
        shape.unrested.clear();
        for (_, tstate) in look {
            let holds_gil = tstate == holder;
            let Some(k) = self.known_states.by_addr.get(&tstate) else {
                return Ok(None);
            };
            if !holds_gil && k.rests_in(reuse) {
                // At rest: taken as it was, left out.
                continue;
            }
            let (was_thread, was_next) = (k.raw.thread_id, k.next);
            let (t, next, frame_field) = self.read_thread(mem, tstate, interp)?;
            if next != was_next || t.thread_id != was_thread {
                return Ok(None);
            }
            if let Some(k) = self.known_states.by_addr.get_mut(&tstate) {
                k.raw = t.clone();
                k.frame_field = frame_field;
            }
            shape.unrested.push(tstate);
            out.push(RawThread { holds_gil, ..t });
        }
        let left_out = shape.len - out.len();
        shape.epoch = delta.epoch;
        self.known_states.shape = Some(shape);
        Ok(Some((out, left_out)))
    }

    /// What a walk from innermost frame `top` reads first, for a prefetch: that frame, and
    /// on 3.11+ (frames side by side in the thread's frame stack, callers below) the bytes
    /// below it on its page, where its callers most likely are. `top` was read without
    /// stopping the thread and may be torn (anywhere, up to `u64::MAX`): the span ends at the
    /// top of the address space rather than past it.
    pub(crate) fn top_span(&self, top: u64) -> (u64, usize) {
        const BELOW: u64 = 2048;
        let size = self.layout.frame.size as u64;
        let start = if matches!(self.layout.frame.model, FrameModel::Interpreter) {
            top.saturating_sub(BELOW)
                .max(top & !(crate::ptrace::CACHE_PAGE - 1))
        } else {
            top
        };
        (start, (top.saturating_add(size) - start) as usize)
    }

    /// What the next read of the thread list will read of the states as last found, when
    /// it is to be a whole one (`asked`, or due): each state's fields and on 3.11/3.12 its
    /// `_PyCFrame`'s, for the caller's prefetch (read one at a time, a thousand resting
    /// states cost a thousand system calls once a second). None otherwise.
    pub(crate) fn list_hint(&self, asked: bool) -> Option<Vec<(u64, usize)>> {
        let known = &self.known_states;
        if known.by_addr.is_empty() || !known.whole(asked) {
            return None;
        }
        Some(self.state_ranges(|_| true))
    }

    /// What the next read of the thread list will read of the states as last found when
    /// it is not a whole one, for the caller's prefetch: the states of the threads not in
    /// `reuse` (they ran) — when there are more than a few (a pool waking at once has
    /// hundreds, each a system call of its own otherwise). None otherwise, without a look
    /// at every state.
    pub(crate) fn ran_hint(&self, reuse: &crate::IdMap<u64, u64>) -> Option<Vec<(u64, usize)>> {
        const FEW: usize = 8;
        let known = &self.known_states;
        if known.by_addr.len() <= reuse.len() + FEW {
            return None;
        }
        Some(self.state_ranges(|k| !k.rests_in(reuse)))
    }

    /// What a read of the known states `pick` chooses reads: each one's fields and on
    /// 3.11/3.12 its `_PyCFrame`'s.
    fn state_ranges(&self, pick: impl Fn(&KnownState) -> bool) -> Vec<(u64, usize)> {
        let size = self.state_size();
        let cframe = self.layout.thread.cframe_current_frame;
        let mut out = Vec::new();
        for (&addr, k) in self.known_states.by_addr.iter().filter(|(_, k)| pick(k)) {
            out.push((addr, size));
            if let Some(off) = cframe.filter(|_| k.frame_field != 0) {
                out.push((k.frame_field.wrapping_add(off as u64), 8));
            }
        }
        out
    }

    /// The bytes of a thread state the list reads (up to its last field read).
    fn state_size(&self) -> usize {
        let t = &self.layout.thread;
        [
            t.next,
            t.interp,
            t.frame,
            t.thread_id,
            t.native_thread_id.unwrap_or(0),
        ]
        .into_iter()
        .max()
        .unwrap_or(0)
            + 8
    }

    /// [`StackWalker::threads`]' walk of the lists.
    fn read_list(
        &mut self,
        mem: &dyn ProcessMemory,
        interp_head: u64,
        gil: Option<u64>,
        reuse: Option<&crate::IdMap<u64, u64>>,
    ) -> Result<Vec<RawThread>> {
        let l = &self.layout;
        // Room for as many threads as the last read met.
        let mut out = Vec::with_capacity(self.known_states.by_addr.len());
        let mut interps = LoopCheck::new();
        let mut interp = interp_head;
        let mut index = 0;
        let now = self.known_states.read;
        while interp != 0 {
            if !interps.step(interp) || interps.steps > MAX_INTERPRETERS {
                return Err(torn(interp, "the interpreter list loops"));
            }
            let holder = match gil {
                Some(h) => h,
                None => self.gil_holder_312(mem, interp)?,
            };
            let mut tstate = mem.read_u64(interp.wrapping_add(l.interp.tstate_head as u64))?;
            let mut tstates = LoopCheck::new();
            while tstate != 0 {
                if !tstates.step(tstate) || tstates.steps > MAX_THREADS {
                    return Err(torn(tstate, "the thread list loops"));
                }
                let holds_gil = holder != 0 && holder == tstate;
                let rested = match (reuse, self.known_states.by_addr.get_mut(&tstate)) {
                    (Some(reuse), Some(k))
                        if !holds_gil && k.interp == interp && k.rests_in(reuse) =>
                    {
                        k.met = now;
                        k.pos = out.len() as u32;
                        let raw = RawThread {
                            rested: true,
                            ..k.raw.clone()
                        };
                        Some((raw, k.next))
                    }
                    _ => None,
                };
                let (t, next) = match rested {
                    Some(known) => known,
                    None => {
                        let (t, next, frame_field) = self.read_thread(mem, tstate, interp)?;
                        let k = KnownState {
                            raw: t.clone(),
                            interp,
                            next,
                            frame_field,
                            met: now,
                            pos: out.len() as u32,
                        };
                        self.known_states.by_addr.insert(tstate, k);
                        (t, next)
                    }
                };
                out.push(RawThread {
                    interp_index: index,
                    holds_gil,
                    ..t
                });
                tstate = next;
            }
            interp = mem.read_u64(interp.wrapping_add(l.interp.next as u64))?;
            index += 1;
        }
        Ok(out)
    }

    /// 3.12+: the GIL lives in the interpreter (`ceval.gil`); the holder is `last_holder`
    /// while `locked` is set. Returns 0 when nobody holds it or the layout lacks it.
    fn gil_holder_312(&self, mem: &dyn ProcessMemory, interp: u64) -> Result<u64> {
        let i = &self.layout.interp;
        let (Some(gil_ptr), Some(locked), Some(holder)) =
            (i.ceval_gil, i.gil_locked, i.gil_last_holder)
        else {
            return Ok(0);
        };
        let gil = mem.read_u64(interp.wrapping_add(gil_ptr as u64))?;
        if gil == 0 {
            return Ok(0);
        }
        if mem.read_u32(gil.wrapping_add(locked as u64))? == 0 {
            return Ok(0);
        }
        mem.read_u64(gil.wrapping_add(holder as u64))
    }

    /// The thread state at `tstate`, and its `next` and `frame` fields.
    fn read_thread(
        &self,
        mem: &dyn ProcessMemory,
        tstate: u64,
        interp: u64,
    ) -> Result<(RawThread, u64, u64)> {
        let t = &self.layout.thread;
        let size = self.state_size();
        // On the stack: a thread state's first fields are a few hundred bytes.
        let mut small = [0u8; 512];
        let large;
        let buf: &[u8] = if size <= small.len() {
            mem.read(tstate, &mut small[..size])?;
            &small[..size]
        } else {
            large = mem.read_vec(tstate, size)?;
            &large
        };
        if field_u64(buf, t.interp) != interp {
            return Err(torn(
                tstate,
                "a thread state does not point back to its interpreter",
            ));
        }
        let frame_field = field_u64(buf, t.frame);
        let top_frame = self.top_frame_from(mem, frame_field)?;
        let raw = RawThread {
            tstate,
            thread_id: field_u64(buf, t.thread_id),
            native_id: t
                .native_thread_id
                .map(|o| field_u64(buf, o) as i32)
                .filter(|&n| n > 0),
            top_frame,
            interp_index: 0,
            holds_gil: false,
            rested: false,
        };
        Ok((raw, field_u64(buf, t.next), frame_field))
    }

    /// The innermost frame address from the thread state's `frame` field value
    /// (following `cframe` on 3.11/3.12).
    fn top_frame_from(&self, mem: &dyn ProcessMemory, field: u64) -> Result<u64> {
        match self.layout.thread.cframe_current_frame {
            Some(off) if field != 0 => mem.read_u64(field.wrapping_add(off as u64)),
            _ => Ok(field),
        }
    }

    /// Re-reads a thread's innermost frame address (to detect a stack that changed while
    /// it was walked without pausing).
    pub(crate) fn current_top_frame(&self, mem: &dyn ProcessMemory, tstate: u64) -> Result<u64> {
        let field = mem.read_u64(tstate.wrapping_add(self.layout.thread.frame as u64))?;
        self.top_frame_from(mem, field)
    }

    /// Walks a thread that cannot move (paused, or known to be blocked) from `top`, read
    /// from its thread state `tstate`. On 3.11/3.12 a thread entering the evaluation loop
    /// installs a new `_PyCFrame` (on its C stack) before it writes that C frame's
    /// `current_frame`: caught in between, `current_frame` is whatever the stack held, and
    /// the walk fails. The thread's stack is then its caller's C frame's: the frame being
    /// pushed is not linked yet. So a failed walk is retried from
    /// `cframe->previous->current_frame` (when that differs); the first error is returned
    /// if that fails too. The garbage may be 0, which reads as a thread with no Python
    /// frame: a `current_frame` of 0 in a C frame that is not the root one (which has no
    /// `previous`) is the same moment, and the caller's C frame is walked.
    ///
    /// The garbage can also be a frame that reads well: the frame of a generator that
    /// the same C stack slot held at an earlier resume, suspended since (its link cleared),
    /// read as a whole one-frame stack (seen on 3.12 under load, 3 dumps in 2,000). A
    /// settled thread runs one call of the loop per C frame it installed (the entry frames
    /// met by the walk, one per `_PyCFrame` below the root one); a whole walk that met
    /// another count, while the walk from the caller's C frame meets one less than the C
    /// frames, is this moment, and the caller's walk is the thread's stack.
    ///
    /// The new C frame's `previous` may not be written yet either (the compiler orders
    /// the stores as it likes): then nothing says where the thread's stack is (seen on
    /// pyenv's 3.12 under load, about one paused read in 12,000, as a thread with no
    /// Python frame under two calls of the loop). That reads as a C frame, not the root
    /// one, that links to 0 or to one inner to it, and is an error
    /// ([`StackWalker::outer_cframe`]): the snapshot pauses the thread again.
    pub(crate) fn walk_still(
        &mut self,
        mem: &dyn ProcessMemory,
        tstate: u64,
        top: u64,
    ) -> Result<Walk> {
        // Err: caught installing a C frame whose link is not written yet.
        let caller = self.caller_cframe_top(mem, tstate)?;
        if top == 0 {
            if let Some(outer) = caller.filter(|&o| o != 0) {
                return self.walk(mem, outer);
            }
        }
        let first = match self.walk(mem, top) {
            Ok(w) => {
                let calls = match self.cframes(mem, tstate)?.len() {
                    n if !w.truncated && w.evals.len() != n && n > 0 => n,
                    _ => return Ok(w),
                };
                return Ok(match caller {
                    Some(outer) if outer != top => match self.walk(mem, outer) {
                        Ok(c) if !c.truncated && c.evals.len() + 1 == calls => c,
                        _ => w,
                    },
                    _ => w,
                });
            }
            Err(e) => e,
        };
        if first.is_process_gone() {
            return Err(first);
        }
        match caller {
            Some(outer) if outer != top => self.walk(mem, outer).map_err(|_| first),
            _ => Err(first),
        }
    }

    /// 3.11/3.12: the thread's `_PyCFrame`s, innermost first, without the root one (in the
    /// thread state): one per call of the evaluation loop the thread is in, each a local of
    /// that call's C frame. Empty on other versions. Err when one is being installed (see
    /// [`StackWalker::outer_cframe`]).
    pub(crate) fn cframes(&self, mem: &dyn ProcessMemory, tstate: u64) -> Result<Vec<u64>> {
        /// Most `_PyCFrame`s followed on one thread (a chain longer than this is torn).
        const MAX_CFRAMES: usize = 1 << 16;
        let t = &self.layout.thread;
        if t.cframe_previous.is_none() || t.cframe_current_frame.is_none() {
            return Ok(Vec::new());
        }
        let mut out = Vec::new();
        let mut chain = LoopCheck::new();
        let mut at = Some(mem.read_u64(tstate.wrapping_add(t.frame as u64))?);
        while let Some(c) = at.filter(|&c| c != 0) {
            if !chain.step(c) || out.len() >= MAX_CFRAMES {
                return Err(torn(c, "the C frame chain loops"));
            }
            at = self.outer_cframe(mem, tstate, c)?;
            if at.is_some() {
                out.push(c);
            }
        }
        Ok(out)
    }

    /// 3.11/3.12: the C frame outer to `cframe` (its `previous`), None for the root one.
    /// A call of the evaluation loop points `tstate->cframe` at its new C frame before it
    /// writes that frame's fields, and the compiler may order those stores either way:
    /// caught in between, `previous` is whatever the stack held. Every C frame but the root
    /// one is a local of a call of the loop, on the thread's C stack, outer calls at higher
    /// addresses, and links to a C frame outer to it or to the root one (a greenlet's first
    /// C frame too), never to 0: one that does not is being installed (Err, torn: the
    /// thread has no stack to report at this instant).
    fn outer_cframe(
        &self,
        mem: &dyn ProcessMemory,
        tstate: u64,
        cframe: u64,
    ) -> Result<Option<u64>> {
        let t = &self.layout.thread;
        let Some(prev) = t.cframe_previous else {
            return Ok(None);
        };
        let root = t.root_cframe.map(|o| tstate.wrapping_add(o as u64));
        if root == Some(cframe) {
            return Ok(None);
        }
        let previous = mem.read_u64(cframe.wrapping_add(prev as u64))?;
        match root {
            // Without the root's place (not in the layout): 0 ends the chain.
            None if previous == 0 => Ok(None),
            Some(root) if previous != root && previous <= cframe => Err(torn(
                cframe,
                "a call of the evaluation loop is installing its C frame (its link is not written yet)",
            )),
            _ => Ok(Some(previous)),
        }
    }

    /// 3.11/3.12: `tstate->cframe->previous->current_frame` (0: the thread has no frame
    /// there); None on other versions or at the root C frame. Err when the current C frame
    /// is being installed with its link not written yet.
    fn caller_cframe_top(&self, mem: &dyn ProcessMemory, tstate: u64) -> Result<Option<u64>> {
        let Some(cur) = self.layout.thread.cframe_current_frame else {
            return Ok(None);
        };
        let cframe = mem.read_u64(tstate.wrapping_add(self.layout.thread.frame as u64))?;
        match self.outer_cframe(mem, tstate, cframe)? {
            Some(previous) => Ok(Some(mem.read_u64(previous.wrapping_add(cur as u64))?)),
            None => Ok(None),
        }
    }

    /// Walks one thread's frames from its innermost frame `top`.
    pub(crate) fn walk(&mut self, mem: &dyn ProcessMemory, top: u64) -> Result<Walk> {
        self.validated.clear();
        if self.memo.len() >= MEMO_LIMIT {
            self.memo.clear();
            self.memo_frames.clear();
        }
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
        // far came from it; from the first that did not, it is kept frame by frame.
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
            // or ending); a read without pausing that sees that was most likely misled by
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
    /// and its bytes (`layout.frame.size` of them): for a suspended coroutine's frame, which
    /// lives inside its coroutine object and is on no thread's chain.
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

    /// Checks, after a walk without pausing, that the walk's stack is one the thread had:
    /// every frame of the chain is read again (all in one request, after the walk), then
    /// the thread's innermost frame; the thread's stack must now be a part of the walk's,
    /// from some frame down to the outermost, unchanged (that frame's line aside), with
    /// whatever returned, yielded or was pushed above it since. This is what a second walk
    /// would establish, without following the chain again: the addresses are known, so one
    /// `read_many` fetches them all. Also reads the opcode at the innermost instruction
    /// (into `w.top_op`) in the same request, or, with `op_mem`, from there afterwards (an
    /// instruction's opcode does not depend on when it is read: the walk's own cache
    /// serves it without another system call).
    /// Ok(false): the stack changed; Err: a read failed.
    pub(crate) fn verify(
        &mut self,
        mem: &dyn ProcessMemory,
        tstate: u64,
        w: &mut Walk,
        op_mem: Option<&dyn ProcessMemory>,
    ) -> Result<bool> {
        let mut marks = std::mem::take(&mut self.marks);
        let same = self.verify_with(mem, tstate, w, op_mem, &mut marks);
        self.marks = marks;
        same
    }

    fn verify_with(
        &mut self,
        mem: &dyn ProcessMemory,
        tstate: u64,
        w: &mut Walk,
        op_mem: Option<&dyn ProcessMemory>,
        marks: &mut Vec<bool>,
    ) -> Result<bool> {
        let n = w.chain.len();
        let size = self.layout.frame.size;
        let mut again = self.read_again(mem, tstate, w, op_mem)?;
        let (op, field) = (again.op, again.field);
        let locate = |addr: u64| again.frame(addr);
        // Where the thread's stack stands now (its innermost frame, read after every frame).
        w.top_field = Some(u64::from_le_bytes(field));
        let now = self.top_frame_from(mem, u64::from_le_bytes(field))?;
        if now == 0 {
            return Ok(false);
        }
        // Which of the walk's frames are still there, unchanged, at the second read: the
        // stack now is `chain[j..]` (as the walk saw it, `chain[j]`'s line aside) with
        // whatever was pushed on `chain[j]` since, for the smallest such `j`. Frames above
        // it returned, yielded or were replaced (a generator finished and the next one
        // resumed at the same address, say) after the walk read them, each linked to the
        // one below it when read: the walk's stack is one the thread had. A stricter rule
        // (an unchanged top, or a frame pushed right on it) fails most reads of a stack
        // that changes every few hundred nanoseconds (a generator resumed from C in a
        // loop), which then have to be read paused. (Which reads fail still depends on the
        // state read: see `sampler::pauses`.)
        // Reporting the stack left behind instead of the walk's would favour the caller's
        // state (a CALL: native time).
        let k = w.chain.iter().position(|&a| a == now);
        // `steady[i]`: frame `i` reads as the walk saw it (its line aside) with the same
        // link; `same_line[i]`: on the same line too.
        marks.clear();
        marks.resize(2 * n, false);
        let (steady, same_line) = marks.split_at_mut(n);
        let mut at = 0;
        for (i, &addr) in w.chain.iter().enumerate() {
            let shown_at = at;
            if w.shown[i] {
                at += 1;
            }
            // A frame that reads byte for byte as the walk read it is as the walk saw it:
            // same link, code and instruction. Only the others are decoded, and a
            // generator's frame (whether it still executes is not in its bytes).
            let now_bytes = locate(addr);
            if !now_bytes.is_empty()
                && !self.generator_frame(now_bytes)
                && w.bytes.get(i * size..(i + 1) * size) == Some(now_bytes)
            {
                steady[i] = true;
                same_line[i] = true;
                continue;
            }
            // Frames above the thread's innermost one may be anything now (suspended,
            // freed): an error reading one only means it changed.
            let innermost = k.map_or(i == 0, |k| i == k);
            let step = match self.step(mem, addr, now_bytes, true, innermost) {
                Ok(s) => s,
                Err(e) if e.is_process_gone() => return Err(e),
                Err(_) => continue,
            };
            let expected_back = w.chain.get(i + 1).copied().unwrap_or(0);
            if step.back != expected_back && !(w.truncated && i + 1 == n) {
                continue;
            }
            match (step.frame, w.shown[i]) {
                (Some((code, line)), true) => {
                    let f = &w.frames[shown_at];
                    if f.function == code.function && f.filename == code.filename {
                        steady[i] = true;
                        same_line[i] = f.line == line;
                    }
                }
                (None, false) => {
                    steady[i] = true;
                    same_line[i] = true;
                }
                _ => {}
            }
        }
        // The smallest `j` with `chain[j..]` steady and `chain[j + 1..]` on their lines.
        let mut j = n;
        while j > 0 && steady[j - 1] && (j == n || same_line[j]) {
            j -= 1;
        }
        // Where the thread's stack now joins the walk's: `now` itself, or (a frame pushed
        // since) the first of the walk's frames that the links from `now` reach, read
        // from the process now, a few links at most (3.12+ puts a C-stack entry frame
        // between a generator resumed from C and its caller). A part of the walk's chain
        // that reads as unchanged proves nothing unless the thread's stack runs through
        // it: a dead generator's frames hold still too.
        let joined = match k {
            Some(k) => Some(k),
            None => self.join_below(mem.live().unwrap_or(mem), now, &w.chain)?,
        };
        if joined.is_none_or(|m| j > m) {
            // The thread's stack does not run through a part of the walk's that held
            // still: the walk may be torn.
            return Ok(false);
        }
        if w.top_instr.is_some() {
            w.top_op = Some(op[0]);
        }
        w.spans = std::mem::take(&mut again.spans);
        Ok(true)
    }

    /// Reads the walk's frames again in one request (frames that lie close together, as
    /// 3.11+'s frame stack keeps them, as one range: the kernel pins and copies each range
    /// separately), the opcode at the innermost instruction (from `op_mem` when given),
    /// and last the thread state's top-frame field, after every frame.
    fn read_again(
        &mut self,
        mem: &dyn ProcessMemory,
        tstate: u64,
        w: &Walk,
        op_mem: Option<&dyn ProcessMemory>,
    ) -> Result<ReadAgain> {
        let size = self.layout.frame.size;
        // A busy thread's chain is most often the one verified last time: its ranges too.
        if self.spans_of != w.chain {
            self.spans_of.clone_from(&w.chain);
            self.spans_last = spans(&w.chain, size as u64);
        }
        let spans = self.spans_last.clone();
        let total: usize = spans.iter().map(|&(a, b)| (b - a) as usize).sum();
        let mut again = ReadAgain {
            bufs: crate::ptrace::take_buf(total),
            spans,
            frame_size: size,
            op: [0u8; 1],
            field: [0u8; 8],
        };
        let field_addr = tstate.wrapping_add(self.layout.thread.frame as u64);
        {
            let mut reqs: Vec<(u64, &mut [u8])> = Vec::with_capacity(again.spans.len() + 2);
            let mut rest = &mut again.bufs[..];
            for &(start, end) in &again.spans {
                let (head, tail) = rest.split_at_mut((end - start) as usize);
                reqs.push((start, head));
                rest = tail;
            }
            if let (Some(at), None) = (w.top_instr, op_mem) {
                reqs.push((at, &mut again.op[..]));
            }
            // Last: the thread state is read after every frame.
            reqs.push((field_addr, &mut again.field[..]));
            let want = reqs.len();
            if mem.read_many(&mut reqs) < want {
                return Err(torn(field_addr, "the frame stack could not be read again"));
            }
        }
        if let (Some(at), Some(m)) = (w.top_instr, op_mem) {
            m.read(at, &mut again.op)?;
            // The instructions around it count as used: the next sample's prefetch brings
            // them, where a busy thread most likely is by then (the opcode alone missed
            // whenever the thread had moved on: one request more).
            const AROUND: u64 = 64;
            let lo = at.saturating_sub(AROUND);
            m.keep(lo, (at.saturating_add(AROUND) - lo) as usize);
        }
        Ok(again)
    }

    /// The first frame of `chain` that the links from `now` reach, read from `live`, within
    /// [`MAX_JOIN_LINKS`] links; None when they do not.
    fn join_below(
        &self,
        live: &dyn ProcessMemory,
        now: u64,
        chain: &[u64],
    ) -> Result<Option<usize>> {
        let mut at = now;
        for _ in 0..MAX_JOIN_LINKS {
            let mut back = [0u8; 8];
            live.read(at.wrapping_add(self.layout.frame.back as u64), &mut back)?;
            at = u64::from_le_bytes(back);
            if at == 0 {
                return Ok(None);
            }
            if let Some(m) = chain.iter().position(|&a| a == at) {
                return Ok(Some(m));
            }
        }
        Ok(None)
    }

    /// [`StackWalker::step`] for a walk, without decoding again a frame that reads byte for
    /// byte as one an earlier walk decoded at the same address: the frames under a busy
    /// thread's innermost ones wait in calls and do not change from one sample to the next,
    /// and decoding them (code object, line table) was most of a sample's own work. Same
    /// bytes are the same link, code object (which the frame holds a reference to, so it
    /// is still that object) and instruction, so the same result, with two exceptions that
    /// are decoded every time: a generator's frame (whether it is executing is not in its
    /// bytes) and a frame whose earlier decoding skipped a check this one needs.
    fn step_memo(
        &mut self,
        mem: &dyn ProcessMemory,
        addr: u64,
        buf: &[u8],
        innermost: bool,
    ) -> Result<FrameStep> {
        match self.known(addr, buf, innermost) {
            Some(k) => Ok(self.memo_frames[k].step.clone()),
            None => self.remember(mem, addr, buf, innermost),
        }
    }

    /// Decodes the frame at `addr` ([`StackWalker::step`]) and keeps the result for
    /// [`StackWalker::known`] (generator frames aside).
    fn remember(
        &mut self,
        mem: &dyn ProcessMemory,
        addr: u64,
        buf: &[u8],
        innermost: bool,
    ) -> Result<FrameStep> {
        let checks = self.checks(innermost);
        let step = self.step(mem, addr, buf, false, innermost)?;
        if self.generator_frame(buf) {
            return Ok(step);
        }
        // (The memo starts afresh past its limit between walks, in `walk`: indices into it
        // stay put during one.)
        match self.memo.get(&addr) {
            Some(&k) => {
                let d = &mut self.memo_frames[k];
                d.bytes.clear();
                d.bytes.extend_from_slice(buf);
                d.step = step.clone();
                d.checks = checks;
            }
            None => {
                self.memo.insert(addr, self.memo_frames.len());
                self.memo_frames.push(Decoded {
                    addr,
                    next: std::cell::Cell::new(usize::MAX),
                    bytes: buf.to_vec(),
                    step: step.clone(),
                    checks,
                });
            }
        }
        Ok(step)
    }

    /// What [`StackWalker::step_memo`] knows of the frame at `addr` whose bytes are `buf`,
    /// without decoding it. (Never a generator's frame: none is kept, and equal bytes have
    /// the same owner.)
    fn known(&self, addr: u64, buf: &[u8], innermost: bool) -> Option<usize> {
        self.known_at(*self.memo.get(&addr)?, buf, innermost)
    }

    /// [`StackWalker::known`] of memo entry `k` (an entry of the frame's address).
    fn known_at(&self, k: usize, buf: &[u8], innermost: bool) -> Option<usize> {
        let d = &self.memo_frames[k];
        (d.bytes == buf && d.checks >= self.checks(innermost)).then_some(k)
    }

    /// [`StackWalker::known`] of the frame at `addr` that the frame of memo entry `prev`
    /// links to: through `prev`'s note of its next frame when it names `addr` (the same
    /// chain as last time: no lookup by address), else by address, noting the result.
    fn known_after(
        &self,
        prev: Option<usize>,
        addr: u64,
        buf: &[u8],
        innermost: bool,
    ) -> Option<usize> {
        let Some(p) = prev else {
            return self.known(addr, buf, innermost);
        };
        let next = self.memo_frames[p].next.get();
        if self.memo_frames.get(next).is_some_and(|d| d.addr == addr) {
            // The memo holds one entry per address: this is the one a lookup would find.
            return self.known_at(next, buf, innermost);
        }
        let k = self.known(addr, buf, innermost);
        if let Some(k) = k {
            self.memo_frames[p].next.set(k);
        }
        k
    }

    /// 3.11+: the frame is a generator's (whether the generator is executing is kept in the
    /// generator object, not in the frame's bytes).
    fn generator_frame(&self, buf: &[u8]) -> bool {
        let f = &self.layout.frame;
        matches!(f.model, FrameModel::Interpreter)
            && f.owner
                .is_some_and(|o| field_u8(buf, o) == FRAME_OWNED_BY_GENERATOR)
    }

    /// The checks [`StackWalker::step`] makes of a frame's bytes, in increasing order: none
    /// beyond its type (0), a strict walk's (1: a frame object freed meanwhile), and those
    /// of a frame reached through a link in a strict walk (2: it is executing).
    fn checks(&self, innermost: bool) -> u8 {
        u8::from(self.strict) + u8::from(self.strict && !innermost)
    }

    /// Decodes one frame from its bytes `buf` (read at `addr`): its link, its code object
    /// and, when it is a Python frame of the program, the frame itself. `trust_cache`: use a
    /// cached code object without reading its header again (only right after a walk that
    /// validated it). `innermost`: the frame the thread's top-frame pointer named; it was
    /// executing when that pointer was read, so the strict "is it executing" checks (meant
    /// for frames reached through links) do not apply to it: a generator that yields between
    /// the two reads would otherwise fail the sample exactly when Python code was running,
    /// and biased the profile towards native time.
    fn step(
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
            // 3.14+ holds `f_executable` as a tagged `_PyStackRef`: objects are at least
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
        /// (`FRAME_OWNED_BY_CSTACK` on 3.12/3.13, `FRAME_OWNED_BY_INTERPRETER` on 3.14+:
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
        // keeps its type and a stale `f_back`, but its reference count is 0:
        // a chain read without pausing that runs through one is torn.
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

    /// Follows the chain from `top` once, keeping each frame's bytes and what the memo
    /// already knows of it (see [`StackWalker::step_memo`]), and asks `mem` (a page cache)
    /// to fetch the code objects of the other frames all at once: the walk proper then finds
    /// frames and code objects in the cache instead of reading each with its own system
    /// call, and does not read the frames again. Errors here only end the look ahead; the
    /// walk proper reports them.
    fn read_ahead(&self, mem: &dyn ProcessMemory, top: u64, ahead: &mut Ahead) {
        let f = self.layout.frame;
        let mut addr = top;
        let mut prev = None;
        while addr != 0 && ahead.chain.len() < self.max_depth + 64 {
            // Read straight into the look ahead's bytes.
            let at = ahead.bytes.len();
            if mem.read_append(addr, f.size, &mut ahead.bytes).is_err() {
                break;
            }
            let buf = &ahead.bytes[at..];
            let innermost = ahead.chain.is_empty();
            let known = self.known_after(prev, addr, buf, innermost);
            prev = known;
            let code = field_u64(buf, f.code) & !7;
            if known.is_some() && innermost {
                // Its code object was not read this time (the frame is known), but the next
                // sample will most likely find the innermost frame on another instruction
                // and read it: keep it in the next prefetch instead of a request of its own.
                mem.keep(code, self.layout.code.size);
            }
            if known.is_none() {
                // 3.12+: a frame owned by the C stack is not read as Python (see `step`).
                let c_owned = self.layout.version >= (3, 12)
                    && f.owner.is_some_and(|o| field_u8(buf, o) >= 3);
                if code != 0 && !c_owned && !ahead.codes.iter().any(|&(c, _)| c == code) {
                    ahead.codes.push((code, self.layout.code.size));
                }
            }
            let back = field_u64(buf, f.back);
            ahead.chain.push(addr);
            ahead.known.push(known);
            addr = back;
        }
        if !ahead.codes.is_empty() {
            mem.prefetch(&ahead.codes);
        }
    }

    /// Whether the code object at `code_addr` (already cached by the walk) is a generator,
    /// coroutine or async generator: such a frame is always entered from a Python frame, so
    /// a chain that ends there was cut by a concurrent change.
    fn outermost_is_generator(&self, code_addr: u64) -> bool {
        const CO_GENERATOR: u32 = 0x20;
        const CO_COROUTINE: u32 = 0x80;
        const CO_ASYNC_GENERATOR: u32 = 0x200;
        self.code_cache
            .get(&(code_addr & !7))
            .is_some_and(|c| c.flags & (CO_GENERATOR | CO_COROUTINE | CO_ASYNC_GENERATOR) != 0)
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
        // Incomplete frames (3.11/3.12): still before the first traceable instruction.
        if let Some(first) = code.firsttraceable {
            if owner != Some(FRAME_OWNED_BY_GENERATOR)
                && instr < code.bytecode.wrapping_add(first as u64 * 2)
            {
                return Ok(None);
            }
        }
        // CPython's generated shims (3.13's `__init__` cleanup trampoline) have first line 0
        // and no line for any instruction: not Python code of the program, so not shown.
        if code.firstlineno == 0 && code.table.line_at(0).is_none() {
            return Ok(None);
        }
        // Nor is any code of the file `<shim>` (3.12's `<interpreter trampoline>`, the code
        // of every entry frame): a paused read knows such a frame by its owner; a read
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

    /// Decoded code object at `addr`, from the cache when its fingerprint still matches.
    fn code(&mut self, mem: &dyn ProcessMemory, addr: u64) -> Result<Arc<CodeInfo>> {
        self.code_or_none(mem, addr)?
            .ok_or_else(|| torn(addr, "not a code object"))
    }

    /// [`StackWalker::code`], or the cached object without reading it when `trust_cache`.
    fn code_maybe_cached(
        &mut self,
        mem: &dyn ProcessMemory,
        addr: u64,
        trust_cache: bool,
    ) -> Result<Arc<CodeInfo>> {
        if trust_cache {
            if let Some(c) = self.code_cache.get(&addr) {
                return Ok(c.clone());
            }
        }
        self.code(mem, addr)
    }

    /// Like [`StackWalker::code`], but `None` when the object's type is not `code`.
    fn code_or_none(
        &mut self,
        mem: &dyn ProcessMemory,
        addr: u64,
    ) -> Result<Option<Arc<CodeInfo>>> {
        if addr == 0 {
            return Err(torn(addr, "NULL code object"));
        }
        if self.validated.contains(&addr) {
            if let Some(hit) = self.code_cache.get(&addr) {
                return Ok(Some(hit.clone()));
            }
        }
        let c = self.layout.code;
        // The header of a code object is small: read it into the stack when it fits.
        let mut small = [0u8; 512];
        let mut large = Vec::new();
        let buf: &mut [u8] = if c.size <= small.len() {
            &mut small[..c.size]
        } else {
            large.resize(c.size, 0);
            &mut large
        };
        mem.read(addr, buf)?;
        let buf: &[u8] = buf;
        if self.types.code != 0 && field_u64(buf, self.layout.string.ob_type) != self.types.code {
            return Ok(None);
        }
        let name_ptr = c
            .qualname
            .map(|o| field_u64(buf, o))
            .filter(|&p| p != 0)
            .unwrap_or_else(|| field_u64(buf, c.name));
        let fingerprint = [
            name_ptr,
            field_u64(buf, c.filename),
            field_u64(buf, c.linetable),
            field_u32(buf, c.firstlineno) as u64,
        ];
        if let Some(hit) = self.code_cache.get(&addr) {
            if hit.fingerprint == fingerprint {
                if self.validated.len() < 64 {
                    self.validated.push(addr);
                }
                return Ok(Some(hit.clone()));
            }
        }
        let s = &self.layout.string;
        let function = strings::read_text(mem, s, &self.types, fingerprint[0])?;
        let filename = strings::read_text(mem, s, &self.types, fingerprint[1])?;
        let table_bytes = strings::read_bytes(mem, s, &self.types, fingerprint[2])?;
        // ≤3.10: the bytecode is a separate bytes object; note where its payload starts.
        let (bytecode, bytecode_len) = match (c.code_adaptive, c.co_code) {
            (Some(o), _) => (addr.wrapping_add(o as u64), u32::MAX),
            (None, Some(o)) => {
                let obj = field_u64(buf, o);
                match (obj != 0).then(|| mem.read_u64(obj.wrapping_add(s.bytes_size as u64))) {
                    Some(Ok(len)) if len <= strings::MAX_BYTES => {
                        (obj.wrapping_add(s.bytes_sval as u64), len as u32)
                    }
                    _ => (0, 0),
                }
            }
            (None, None) => (0, 0),
        };
        let firstlineno = fingerprint[3] as u32;
        // 0 is real (3.13's generated __init__ cleanup shim has no source line).
        if (firstlineno as i32) < 0 {
            return Err(torn(addr, "code object with a negative first line"));
        }
        let info = Arc::new(CodeInfo {
            table: LineTable::decode(c.linetable_format, &table_bytes, firstlineno),
            function: function.into(),
            filename: filename.into(),
            firstlineno,
            bytecode,
            bytecode_len,
            firsttraceable: c.firsttraceable.map(|o| field_u32(buf, o)),
            flags: if c.flags == usize::MAX {
                0
            } else {
                field_u32(buf, c.flags)
            },
            fingerprint,
        });
        if self.code_cache.len() >= CODE_CACHE_LIMIT {
            self.code_cache.clear();
        }
        self.code_cache.insert(addr, info.clone());
        Ok(Some(info))
    }
}

#[cfg(test)]
mod tests {
    use super::StackWalker;
    use super::{spans, LoopCheck};
    use crate::ptrace::BufferMemory;
    use crate::python::strings::TypeAddrs;

    /// A torn innermost-frame pointer may be any value: the span to prefetch for it stays
    /// inside the address space (a garbage pointer near the top overflowed the sum: an
    /// attach to 3.12.1 died on it in CI, tests/asyncio.rs, stop 34).
    #[test]
    fn a_torn_top_frame_gives_a_span_inside_the_address_space() {
        let types = TypeAddrs {
            code: 1,
            frame: 2,
            unicode: 3,
            bytes: 4,
        };
        for (major, minor) in [(2, 7), (3, 10), (3, 11), (3, 12)] {
            let layout = *crate::python_bindings::generated(major, minor, false).unwrap();
            let size = layout.frame.size as u64;
            let w = StackWalker::new(layout, types);
            for top in [
                u64::MAX,
                u64::MAX - 7,
                u64::MAX - size + 1,
                0x7ffe_0000_1000,
            ] {
                let (start, len) = w.top_span(top);
                assert!(start <= top, "{major}.{minor}: {top:#x}");
                assert!(
                    start.checked_add(len as u64).is_some(),
                    "{major}.{minor}: {top:#x}"
                );
                assert!(
                    len as u64 >= size.min(u64::MAX - top),
                    "{major}.{minor}: {top:#x}"
                );
                assert!(len as u64 <= size + 4096, "{major}.{minor}: {top:#x}");
            }
        }
    }

    /// A 3.11/3.12 thread caught between installing a new `_PyCFrame` and writing its
    /// `current_frame` (garbage): the still walk reads the caller's C frame instead, and
    /// only when there is one; caught before the new C frame's link to its caller is
    /// written (0, or a C frame inner to it), the thread has no stack to report (an error).
    #[test]
    fn a_thread_caught_installing_a_c_frame_is_read_from_the_callers() {
        for (major, minor) in [(3, 11), (3, 12)] {
            let layout = *crate::python_bindings::generated(major, minor, false).unwrap();
            let t = layout.thread;
            let (cur, prev) = (t.cframe_current_frame.unwrap(), t.cframe_previous.unwrap());
            let base = 0x10_0000u64;
            let (tstate, cframe, caller) = (base, base + 0x1000, base + 0x2000);
            let root = tstate + t.root_cframe.unwrap() as u64;
            let mut bytes = vec![0u8; 0x3000];
            let mut put = |at: u64, v: u64| {
                let o = (at - base) as usize;
                bytes[o..o + 8].copy_from_slice(&v.to_le_bytes());
            };
            put(tstate + t.frame as u64, cframe);
            // The new C frame's current_frame: stack garbage, unreadable.
            put(cframe + cur as u64, 0xe839_4de8_894c_0000);
            put(cframe + prev as u64, caller);
            // The caller's C frame, the outermost call's: the thread had no Python frame
            // yet (0).
            put(caller + cur as u64, 0);
            put(caller + prev as u64, root);
            let with = |bytes: &[u8], at: u64, v: u64| {
                let mut bytes = bytes.to_vec();
                let o = (at - base) as usize;
                bytes[o..o + 8].copy_from_slice(&v.to_le_bytes());
                BufferMemory { base, bytes }
            };
            let mem = BufferMemory {
                base,
                bytes: bytes.clone(),
            };
            let types = TypeAddrs {
                code: 1,
                frame: 2,
                unicode: 3,
                bytes: 4,
            };
            let mut w = StackWalker::new(layout, types);
            let top = w.current_top_frame(&mem, tstate).unwrap();
            assert_eq!(top, 0xe839_4de8_894c_0000);
            assert!(w.walk(&mem, top).is_err(), "{major}.{minor}");
            let still = w.walk_still(&mem, tstate, top).unwrap();
            assert!(still.frames.is_empty(), "{major}.{minor}");
            // The garbage is 0 (no frame, it seems): the caller's C frame is walked all
            // the same (here unreadable: an error, not an empty stack).
            assert!(w.walk_still(&mem, tstate, 0).unwrap().frames.is_empty());
            let bad = with(&bytes, caller + cur as u64, 0xdead_0000);
            assert!(w.walk_still(&bad, tstate, 0).is_err(), "{major}.{minor}");
            // The new C frame's link not written yet: 0, or a C frame inner to it (stack
            // garbage). An error, whatever its current_frame reads.
            for link in [0, cframe - 0x200] {
                let torn = with(&bytes, cframe + prev as u64, link);
                for top in [top, 0] {
                    let e = w.walk_still(&torn, tstate, top).unwrap_err();
                    assert!(e.to_string().contains("installing"), "{major}.{minor}: {e}");
                }
                assert!(w.cframes(&torn, tstate).is_err(), "{major}.{minor}");
            }
            // Outside any call of the loop, the thread state points at its root C frame:
            // a current_frame of 0 there is a thread with no Python frame.
            let idle = with(&bytes, tstate + t.frame as u64, root);
            assert!(w.walk_still(&idle, tstate, 0).unwrap().frames.is_empty());
            assert!(w.cframes(&idle, tstate).unwrap().is_empty());
            assert_eq!(w.cframes(&mem, tstate).unwrap(), vec![cframe, caller]);
        }
    }

    #[test]
    fn spans_join_near_frames_and_keep_far_ones_apart() {
        // 3.11+ frames side by side in one frame-stack chunk: one range.
        let near = [0x1000_0000, 0x1000_0050, 0x1000_00a0];
        assert_eq!(spans(&near, 0x50), vec![(0x1000_0000, 0x1000_00f0)]);
        // Heap frame objects far apart, in any order: one range each, sorted.
        let far = [0x9000_0000, 0x1000_0000];
        assert_eq!(
            spans(&far, 0x60),
            vec![(0x1000_0000, 0x1000_0060), (0x9000_0000, 0x9000_0060)]
        );
        // Within a page of each other: joined, gap included.
        assert_eq!(spans(&[0x2000, 0x2f00], 0x40), vec![(0x2000, 0x2f40)]);
        // A range never grows past 16 pages, however many frames follow.
        let chain: Vec<u64> = (0..2000u64).map(|i| 0x10_0000 + i * 0x50).collect();
        let s = spans(&chain, 0x50);
        assert!(s.iter().all(|&(a, b)| b - a <= 16 * 4096 + 0x50), "{s:?}");
        assert_eq!(s.first().unwrap().0, 0x10_0000);
        assert_eq!(s.last().unwrap().1, 0x10_0000 + 1999 * 0x50 + 0x50);
        // Addresses at the top of the address space do not overflow.
        assert_eq!(spans(&[u64::MAX - 8], 0x50), vec![(u64::MAX - 8, u64::MAX)]);
        // A 3.12+ chain: the frame stack falling, an entry frame on the C stack between,
        // a generator's frame on the heap: the same ranges as the sorted addresses give.
        let mixed = [
            0x7000_2000,
            0x7000_1f00,
            0x7fff_0000,
            0x7000_1e00,
            0x5555_0000,
            0x7000_1d00,
        ];
        let mut sorted = mixed.to_vec();
        sorted.sort_unstable();
        assert_eq!(spans(&mixed, 0x50), spans(&sorted, 0x50));
        assert_eq!(
            spans(&mixed, 0x50),
            vec![
                (0x5555_0000, 0x5555_0050),
                (0x7000_1d00, 0x7000_2050),
                (0x7fff_0000, 0x7fff_0050)
            ]
        );
    }

    #[test]
    fn a_list_that_loops_is_caught_however_long() {
        for n in [1u64, 3, 40, 200] {
            // A list of `n` that ends: every element passes, each counted.
            let mut check = LoopCheck::new();
            for a in 0..n {
                assert!(check.step(0x1000 + a * 8), "{a} of {n} is new");
            }
            assert_eq!(check.steps, n as usize);
            // The same list with its last element linked back to the first, to the middle,
            // or to itself: caught within three times the list's length.
            for back in [0, n / 2, n - 1] {
                let mut check = LoopCheck::new();
                let mut a = 0;
                let mut steps = 0;
                while check.step(0x1000 + a * 8) {
                    a = if a + 1 == n { back } else { a + 1 };
                    steps += 1;
                    assert!(steps <= 3 * n + 2, "{n} linked back to {back}: not caught");
                }
            }
        }
    }
}

#[cfg(test)]
#[path = "stack_verify_tests.rs"]
mod verify_tests;
