//! The check of a walk made without pausing: its frames read a second time.
//!
//! Owns: [`StackWalker::verify`] and the ranges it reads again ([`spans`]).
//! Must not: walk the chain again (the addresses are known), or pause the thread (a walk
//! that fails the check is the caller's to read paused).

use super::{torn, StackWalker, Walk};
use crate::error::Result;
use crate::ptrace::ProcessMemory;

/// Links followed from a thread's new innermost frame, when verifying a walk, to find where
/// its stack joins the walk's.
const MAX_JOIN_LINKS: usize = 3;

/// The address ranges `[start, end)` that cover objects of `size` bytes at `addrs`, joining
/// objects less than a page apart.
pub(crate) fn spans(addrs: &[u64], size: u64) -> Vec<(u64, u64)> {
    const JOIN: u64 = 4096;
    // A chain of 3.11+'s frame stack comes innermost first, at falling addresses, with
    // a few frames elsewhere (3.12+'s entry frames on the C stack, generators' frames).
    // Reversed, it is nearly sorted, and an insertion sort does little more than look.
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
    /// Checks, after a walk without pausing, that the walk's stack is one the thread had.
    ///
    /// - Every frame of the chain is read again, all in one request after the walk, then
    ///   the thread's innermost frame.
    /// - The thread's stack must now be a part of the walk's, from some frame down to the
    ///   outermost, unchanged (that frame's line aside). Whatever returned, yielded or was
    ///   pushed above it since does not matter.
    /// - This is what a second walk would establish, without following the chain again.
    ///   The addresses are known, so one `read_many` fetches them all.
    /// - The opcode at the innermost instruction goes into `w.top_op`, read in the same
    ///   request. With `op_mem` it is read from there afterwards, because an instruction's
    ///   opcode does not depend on when it is read, and the walk's own cache serves it
    ///   without another system call.
    ///
    /// Ok(false) when the stack changed. Err when a read failed.
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
        // This finds which of the walk's frames are still there, unchanged, at the second
        // read. The stack now is `chain[j..]` as the walk saw it (`chain[j]`'s line aside),
        // plus whatever was pushed on `chain[j]` since, for the smallest such `j`.
        //
        // Frames above `chain[j]` returned, yielded or were replaced after the walk read
        // them. Say, a generator finished and the next one resumed at the same address.
        // Each was linked to the one below it when read. So the walk's stack is one the
        // thread had.
        //
        // A stricter rule would want an unchanged top, or a frame pushed right on it. It
        // fails most reads of a stack that changes every few hundred nanoseconds (a
        // generator resumed from C in a loop). Those then have to be read paused. (Which
        // reads fail still depends on the state read. See `sampler::pauses`.)
        //
        // Reporting the stack left behind instead of the walk's would favour the caller's
        // state (a CALL, so native time).
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
            // A frame that reads byte for byte as the walk read it is as the walk saw it,
            // with the same link, code and instruction. Only the others are decoded, and a
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
            // freed), so an error reading one only means it changed.
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
        // Where the thread's stack now joins the walk's:
        // - `now` itself;
        // - or (a frame pushed since) the first of the walk's frames that the links from
        //   `now` reach, read from the process now, a few links at most (3.12+ puts a
        //   C-stack entry frame between a generator resumed from C and its caller).
        //
        // A part of the walk's chain that reads as unchanged proves nothing unless the
        // thread's stack runs through it, because a dead generator's frames hold still too.
        let joined = match k {
            Some(k) => Some(k),
            None => self.join_below(mem.live().unwrap_or(mem), now, &w.chain)?,
        };
        if joined.is_none_or(|m| j > m) {
            // The thread's stack does not run through a part of the walk's that held
            // still, so the walk may be torn.
            return Ok(false);
        }
        if w.top_instr.is_some() {
            w.top_op = Some(op[0]);
        }
        w.spans = std::mem::take(&mut again.spans);
        Ok(true)
    }

    /// Reads the walk's frames again in one request (frames that lie close together, as
    /// 3.11+'s frame stack keeps them, as one range, because the kernel pins and copies each
    /// range separately), the opcode at the innermost instruction (from `op_mem` when given),
    /// and last the thread state's top-frame field, after every frame.
    fn read_again(
        &mut self,
        mem: &dyn ProcessMemory,
        tstate: u64,
        w: &Walk,
        op_mem: Option<&dyn ProcessMemory>,
    ) -> Result<ReadAgain> {
        let size = self.layout.frame.size;
        // A busy thread's chain is most often the one verified last time, and its ranges are
        // too.
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
            // The instructions around it count as used, so the next sample's prefetch brings
            // them, where a busy thread most likely is by then (the opcode alone missed
            // whenever the thread had moved on, costing one request more).
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
}
