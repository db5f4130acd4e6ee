//! Walking interpreters, thread states and frames.
//!
//! Owns: [`StackWalker`], which turns a runtime address into every thread's stack
//! (function, file, line, innermost first), and the code-object cache. It reads only
//! through [`ProcessMemory`](crate::ptrace::ProcessMemory), so it can walk captured memory
//! in tests.
//! Must not: touch /proc or ptrace (the caller pauses threads and maps thread ids), or
//! format output.
//!
//! Everything read is validated (type pointers, chain cycles, sizes). A failed check is an
//! error, never a made-up frame. Code objects are immutable while alive, so their decoded
//! names and line tables are cached by address and revalidated by a fingerprint of the
//! fields they came from.
//!
//! The files, each one part of [`StackWalker`]:
//! - here: the walker, a walk's result ([`Walk`]) and the loop check of lists and chains.
//! - [`threads`]: the thread list, its cache of states at rest, and its prefetch hints.
//! - [`cframe`]: 3.11/3.12's `_PyCFrame` chain, and the walk of a thread that cannot move.
//! - [`walk`]: the frame walk, and the decoding of one frame.
//! - [`code`]: the code-object cache.
//! - [`memo`]: frames decoded by earlier walks, not decoded again.
//! - [`prefetch`]: the read-ahead of a chain and its code objects.
//! - [`verify`]: the check of a walk made without pausing, by a second read.

mod cframe;
mod code;
mod memo;
mod prefetch;
mod threads;
mod verify;
mod walk;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod verify_tests;

use super::strings::TypeAddrs;
use crate::error::Error;
use crate::python_bindings::Layout;
use code::CodeInfo;
use memo::Decoded;
use prefetch::Ahead;
use std::collections::HashMap;
use std::sync::Arc;
use threads::KnownStates;

pub(crate) use crate::python::frame::Frame;
pub(crate) use threads::{RawThread, StaleId};

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
    /// For each entry of `chain`, whether it gave one of `frames` (hidden frames do not).
    pub(crate) shown: Vec<bool>,
    /// The bytes the walk decoded, `layout.frame.size` for each entry of `chain`, one after
    /// another. [`StackWalker::verify`] compares a second read with them.
    pub(crate) bytes: Vec<u8>,
    /// Read with the thread paused after reads without pausing kept failing validation.
    pub(crate) paused: bool,
    /// The value of the thread state's top-frame field when [`StackWalker::verify`] read it
    /// (3.11/3.12: the address of the current `_PyCFrame`).
    pub(crate) top_field: Option<u64>,
    /// For each call of the evaluation loop (a C frame of `_PyEval_EvalFrameDefault`,
    /// `PyEval_EvalFrameEx` on 2.7), innermost first, how many of `frames` it runs:
    /// - on ≤3.10, one each;
    /// - on 3.11, up to the frame marked `is_entry`;
    /// - on 3.12+, up to an entry frame (owned by the C stack).
    ///
    /// It is what the merge with native frames pairs them by.
    pub(crate) evals: Vec<u32>,
    /// Frames of `frames` after the last of `evals` (the outermost ones). There are none in
    /// a whole stack; in a truncated one, they are the part of a call cut off.
    pub(crate) evals_open: u32,
    /// 3.11+: for each of `evals`, an address inside that call's own C stack frame. It is
    /// its entry frame (3.12+, a local of `_PyEval_EvalFrameDefault`), or its `_PyCFrame`
    /// (3.11, read by `python::native::cframe_anchors`). Empty before 3.11.
    pub(crate) anchors: Vec<u64>,
    /// Not walked, because the thread did not run since its last read (see
    /// `RestTracker`'s `reuse`). Everything else is empty.
    pub(crate) unchanged: bool,
    /// The ranges [`StackWalker::verify`] read `chain` again in
    /// ([`spans`](verify::spans) of it). The next sample's second look reads them (empty
    /// until verified).
    pub(crate) spans: Vec<(u64, u64)>,
    /// With `dump --locals`, each of `frames`' locals, read in the same pause.
    pub(crate) locals: Vec<crate::python::locals::FrameLocals>,
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

/// Walks stacks of one interpreter layout.
pub struct StackWalker {
    pub(crate) layout: Layout,
    types: TypeAddrs,
    /// Deepest stack returned; deeper ones are truncated (and say so).
    pub max_depth: usize,
    /// Check that every frame on the chain is executing (a chain read without pausing may
    /// run through a generator frame that was suspended meanwhile, and that read is torn).
    pub(crate) strict: bool,
    code_cache: crate::IdMap<u64, Arc<CodeInfo>>,
    /// What the last snapshot read, one range per page (see
    /// [`crate::ptrace::PageCache::used_ranges`]). The next one prefetches it.
    pub page_hint: Vec<(u64, usize)>,
    /// The hint of the snapshot before, while a read without pausing left threads to be
    /// read paused right after (their pages are there, not in `page_hint`); else empty.
    pub(crate) reread_hint: Vec<(u64, usize)>,
    /// What the last snapshot's verification read (each thread's frames, then its
    /// top-frame fields). The next one reads it a second time right after its prefetch.
    pub recheck_hint: Vec<(u64, usize)>,
    /// Read each thread's [`Walk::anchors`] on 3.11 too (its `_PyCFrame` chain), for the
    /// merge with native frames.
    pub(crate) want_anchors: bool,
    /// Code objects already validated during the current walk (a recursive function's
    /// code is checked once, not once per frame). Empty outside a walk.
    validated: Vec<u64>,
    /// Frames decoded by earlier walks, by address (where in `memo_frames`). See
    /// [`StackWalker::step_memo`].
    memo: crate::IdMap<u64, usize>,
    /// What `memo` points into. A walk refers to its entries by index, which stay put
    /// until the memo starts afresh, between walks (taking a reference to each frame's
    /// code object instead, with its atomic increments, was a visible part of a busy
    /// sample).
    memo_frames: Vec<Decoded>,
    /// Frames on the chain of the last whole walk.
    last_depth: usize,
    /// The look ahead's room, kept between walks (see [`Ahead`]).
    ahead: Ahead,
    /// [`StackWalker::verify`]'s marks of each frame, kept between walks.
    marks: Vec<bool>,
    /// The chain [`StackWalker::verify`] last read again, and its [`spans`](verify::spans).
    spans_of: Vec<u64>,
    spans_last: Vec<(u64, u64)>,
    /// The thread states the last read of the thread list found (see [`KnownStates`]).
    known_states: KnownStates,
    /// Threads the last snapshot found unchanged and left out (see
    /// [`crate::python::RestTracker`]'s `omit_unchanged`).
    pub(crate) left_out: usize,
    /// Threads the last snapshot left unread under `RestTracker`'s `max_walks`, and where
    /// in the thread list the next one starts.
    pub(crate) deferred: usize,
    pub(crate) walk_cursor: usize,
    /// Thread states whose recorded kernel id is no thread of the process, with the thread
    /// each is (found by a snapshot, see [`crate::python::tids::stale_ids`]). Each read of
    /// such a state gives the thread's id instead, while the state still records the stale
    /// one.
    pub(crate) stale_ids: Vec<StaleId>,
}

/// Catches a list or chain that loops (torn memory, in the interpreters, a thread list, the
/// frames, the C frames), in constant work and memory per step (Brent's). The element
/// `lap` steps back is kept, and a new one taken each time `lap` doubles. A list that loops
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
            stale_ids: Vec::new(),
        }
    }
}
