//! 3.11/3.12's `_PyCFrame` chain, and the walk of a thread that cannot move.
//!
//! Owns: the retry of a paused thread's walk from its caller's C frame, and the list of a
//! thread's C frames (one per call of the evaluation loop).
//! Must not: decode frames (the walk does), or pause threads (the caller does).

use super::{torn, LoopCheck, StackWalker, Walk};
use crate::error::Result;
use crate::ptrace::ProcessMemory;

impl StackWalker {
    /// Walks a thread that cannot move (paused, or known to be blocked) from `top`, read
    /// from its thread state `tstate`. On 3.11/3.12 a thread entering the evaluation loop
    /// installs a new `_PyCFrame` (on its C stack) before it writes that C frame's
    /// `current_frame`. Caught in between, `current_frame` is whatever the stack held, and
    /// the walk fails. The thread's stack is then its caller's C frame's, because the frame
    /// being pushed is not linked yet. So a failed walk is retried from
    /// `cframe->previous->current_frame` (when that differs). The first error is returned
    /// if that fails too. The garbage may be 0, which reads as a thread with no Python
    /// frame. A `current_frame` of 0 in a C frame that is not the root one (which has no
    /// `previous`) is the same moment, and the caller's C frame is walked.
    ///
    /// The garbage can also be a frame that reads well. It is the frame of a generator that
    /// the same C stack slot held at an earlier resume, suspended since (its link cleared),
    /// read as a whole one-frame stack (seen on 3.12 under load, 3 dumps in 2,000). A
    /// settled thread runs one call of the loop per C frame it installed (the entry frames
    /// met by the walk, one per `_PyCFrame` below the root one). A whole walk that met
    /// another count, while the walk from the caller's C frame meets one less than the C
    /// frames, is this moment, and the caller's walk is the thread's stack.
    ///
    /// The new C frame's `previous` may not be written yet either (the compiler orders
    /// the stores as it likes). Then nothing says where the thread's stack is (seen on
    /// pyenv's 3.12 under load, about one paused read in 12,000, as a thread with no
    /// Python frame under two calls of the loop). That reads as a C frame, not the root
    /// one, that links to 0 or to one inner to it, and is an error
    /// ([`StackWalker::outer_cframe`]), so the snapshot pauses the thread again.
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
    /// thread state). There is one per call of the evaluation loop the thread is in, each a
    /// local of that call's C frame. Empty on other versions. Err when one is being installed
    /// (see [`StackWalker::outer_cframe`]).
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
    /// writes that frame's fields, and the compiler may order those stores either way.
    /// Caught in between, `previous` is whatever the stack held. Every C frame but the root
    /// one is a local of a call of the loop, on the thread's C stack, outer calls at higher
    /// addresses. It links to a C frame outer to it or to the root one (a greenlet's first
    /// C frame too), never to 0. One that does not is being installed (Err, torn; the
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
            // Without the root's place (not in the layout), 0 ends the chain.
            None if previous == 0 => Ok(None),
            Some(root) if previous != root && previous <= cframe => Err(torn(
                cframe,
                "a call of the evaluation loop is installing its C frame (its link is not written yet)",
            )),
            _ => Ok(Some(previous)),
        }
    }

    /// 3.11/3.12: `tstate->cframe->previous->current_frame` (0 when the thread has no frame
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
}
