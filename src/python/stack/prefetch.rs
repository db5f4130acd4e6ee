//! Read-ahead: what a walk will read, fetched before it reads it.
//!
//! Owns:
//! - [`Ahead`] (the chain followed once, with its frames' bytes);
//! - the fetch of the code objects it needs;
//! - the span a top frame's prefetch reads.
//!
//! Must not: report errors (they only end the look ahead; the walk proper reports them).

use super::StackWalker;
use crate::ptrace::{field_u64, field_u8, ProcessMemory};
use crate::python_bindings::FrameModel;

/// The chain as [`StackWalker::read_ahead`] followed it: each frame's address, its bytes
/// (`layout.frame.size` each, one after another) and what the memo knows of it. The
/// walker keeps one and reuses its room walk after walk (allocating and growing these
/// vectors for every walk was a tenth of a busy sample's own work).
#[derive(Default)]
pub(super) struct Ahead {
    pub(super) chain: Vec<u64>,
    pub(super) bytes: Vec<u8>,
    pub(super) known: Vec<Option<usize>>,
    /// The code objects to fetch (address, size).
    codes: Vec<(u64, usize)>,
}

impl Ahead {
    pub(super) fn clear(&mut self) {
        self.chain.clear();
        self.bytes.clear();
        self.known.clear();
        self.codes.clear();
    }
}

impl StackWalker {
    /// What a walk from innermost frame `top` reads first, for a prefetch. That is the frame,
    /// and on 3.11+ (frames side by side in the thread's frame stack, callers below) the bytes
    /// below it on its page, where its callers most likely are. `top` was read without
    /// stopping the thread and may be torn (anywhere, up to `u64::MAX`). So the span ends at
    /// the top of the address space rather than past it.
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

    /// Follows the chain from `top` once, keeping each frame's bytes and what the memo
    /// already knows of it (see [`StackWalker::step_memo`]). It asks `mem` (a page cache)
    /// to fetch the code objects of the other frames all at once. The walk proper then finds
    /// frames and code objects in the cache instead of reading each with its own system
    /// call, and does not read the frames again. Errors here only end the look ahead, and the
    /// walk proper reports them.
    pub(super) fn read_ahead(&self, mem: &dyn ProcessMemory, top: u64, ahead: &mut Ahead) {
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
                // and read it. So keep it in the next prefetch instead of a request of its own.
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
}
