//! The memo: frames decoded by earlier walks, by address, not decoded again.
//!
//! Owns: [`Decoded`] and the look-ups of a frame by its address and bytes.
//! Must not: keep a generator's frame (whether it executes is not in its bytes).

use super::walk::FrameStep;
use super::StackWalker;
use crate::error::Result;
use crate::ptrace::ProcessMemory;

/// A frame's bytes as a walk read them and what they decoded to.
pub(super) struct Decoded {
    /// Where the frame is.
    addr: u64,
    /// The memo entry of the frame it linked to when a walk last went through both
    /// (`usize::MAX` when none yet). It gives the next frame's entry without a lookup by
    /// address.
    next: std::cell::Cell<usize>,
    bytes: Vec<u8>,
    pub(super) step: FrameStep,
    /// The checks its decoding made (see [`StackWalker::checks`]).
    checks: u8,
}

/// Most frames [`StackWalker::memo`] holds (it starts afresh past this).
const MEMO_LIMIT: usize = 16_384;

impl StackWalker {
    /// Starts the memo afresh once it holds [`MEMO_LIMIT`] frames (at the start of a walk).
    pub(super) fn keep_memo_bounded(&mut self) {
        if self.memo.len() >= MEMO_LIMIT {
            self.memo.clear();
            self.memo_frames.clear();
        }
    }

    /// [`StackWalker::step`] for a walk, without decoding again a frame that reads byte for
    /// byte as one an earlier walk decoded at the same address. The frames under a busy
    /// thread's innermost ones wait in calls and do not change from one sample to the next.
    /// Decoding them (code object, line table) was most of a sample's own work.
    ///
    /// Same bytes are the same link, code object (which the frame holds a reference to, so
    /// it is still that object) and instruction, so the same result. Two exceptions are
    /// decoded every time:
    /// - a generator's frame (whether it is executing is not in its bytes);
    /// - a frame whose earlier decoding skipped a check this one needs.
    pub(super) fn step_memo(
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
    pub(super) fn remember(
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
        // (The memo starts afresh past its limit between walks, in `walk`, so indices into
        // it stay put during one.)
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
    /// without decoding it. (Never a generator's frame, because none is kept, and equal
    /// bytes have the same owner.)
    fn known(&self, addr: u64, buf: &[u8], innermost: bool) -> Option<usize> {
        self.known_at(*self.memo.get(&addr)?, buf, innermost)
    }

    /// [`StackWalker::known`] of memo entry `k` (an entry of the frame's address).
    fn known_at(&self, k: usize, buf: &[u8], innermost: bool) -> Option<usize> {
        let d = &self.memo_frames[k];
        (d.bytes == buf && d.checks >= self.checks(innermost)).then_some(k)
    }

    /// [`StackWalker::known`] of the frame at `addr` that the frame of memo entry `prev`
    /// links to:
    /// - through `prev`'s note of its next frame when it names `addr` (the same chain as
    ///   last time, so no lookup by address);
    /// - else by address, noting the result.
    pub(super) fn known_after(
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
            // The memo holds one entry per address, so this is the one a lookup would find.
            return self.known_at(next, buf, innermost);
        }
        let k = self.known(addr, buf, innermost);
        if let Some(k) = k {
            self.memo_frames[p].next.set(k);
        }
        k
    }

    /// The checks [`StackWalker::step`] makes of a frame's bytes, in increasing order:
    /// - none beyond its type (0);
    /// - a strict walk's (1: a frame object freed meanwhile);
    /// - those of a frame reached through a link in a strict walk (2: it is executing).
    fn checks(&self, innermost: bool) -> u8 {
        u8::from(self.strict) + u8::from(self.strict && !innermost)
    }
}
