//! A core's address space: [`CoreMemory`], one more [`ProcessMemory`].
//!
//! Owns: reads of the process's memory as the core saved it:
//! - bytes the kernel (or gdb) dumped: from the core's `PT_LOAD` segments;
//! - bytes it did not dump (read-only file mappings, as a rule code and `.rodata`; the
//!   kernel writes an empty segment for them, gdb none): from the file `NT_FILE` names,
//!   opened by [`Files`] (under `--lib-root`, checked by build id), and only where the
//!   file maps them read-only (they cannot have changed since they were mapped);
//! - anything else: an error (never zeros, a file's first contents of a page the process
//!   may have written, or a guess).
//!
//! Must not: parse notes (`notes.rs`), or read a file whose build id differs from the
//! core's (`files.rs` refuses it).

use super::files::Files;
use super::notes::{FileNote, Segment};
use crate::error::{Error, Result};
use crate::ptrace::ProcessMemory;
use std::sync::Arc;

/// The memory of a dead process, from its core (and the files it had mapped).
pub(crate) struct CoreMemory {
    pub(super) pid: i32,
    pub(super) bytes: Arc<memmap2::Mmap>,
    /// Sorted by `vaddr`; each checked to lie inside `bytes`.
    pub(super) segments: Vec<Segment>,
    /// `NT_FILE`, sorted by `start`.
    pub(super) maps: Vec<FileNote>,
    pub(super) files: Arc<Files>,
}

impl CoreMemory {
    /// The segment holding `addr`.
    fn segment(&self, addr: u64) -> Option<&Segment> {
        let i = self.segments.partition_point(|s| s.vaddr <= addr);
        let s = self.segments.get(i.checked_sub(1)?)?;
        (addr - s.vaddr < s.memsz).then_some(s)
    }

    /// Whether a segment of the core holds `addr`.
    pub(crate) fn segment_at(&self, addr: u64) -> Option<()> {
        self.segment(addr).map(|_| ())
    }

    /// The `NT_FILE` mapping holding `addr`.
    fn mapping(&self, addr: u64) -> Option<&FileNote> {
        let i = self.maps.partition_point(|m| m.start <= addr);
        let m = self.maps.get(i.checked_sub(1)?)?;
        (addr < m.end).then_some(m)
    }

    fn fail(&self, addr: u64, len: usize, why: impl Into<String>) -> Error {
        Error::Read {
            pid: self.pid,
            addr,
            len,
            why: why.into(),
        }
    }

    /// Fills `buf` from `addr` up to the end of the piece of memory that holds `addr` (one
    /// segment's dumped part, or one mapping's file). Returns the count filled.
    fn read_piece(&self, addr: u64, buf: &mut [u8]) -> Result<usize> {
        let seg = self.segment(addr);
        if let Some(s) = seg.filter(|s| addr - s.vaddr < s.filesz) {
            let within = addr - s.vaddr;
            let n = (s.filesz - within).min(buf.len() as u64) as usize;
            // Checked when the core was opened: the dumped part lies inside the file.
            let at = (s.offset + within) as usize;
            buf[..n].copy_from_slice(&self.bytes[at..at + n]);
            return Ok(n);
        }
        let Some(m) = self.mapping(addr) else {
            return Err(self.fail(
                addr,
                buf.len(),
                match seg {
                    Some(_) => "not in the core (not dumped, and no file is mapped there)",
                    None => "not in the core (no segment holds it: not mapped, or a damaged core)",
                },
            ));
        };
        // Not past the segment where there is one (the kernel writes one for every
        // mapping; gdb leaves out those it does not dump).
        let end = seg.map_or(m.end, |s| (s.vaddr + s.memsz).min(m.end));
        let n = (end - addr).min(buf.len() as u64) as usize;
        let at = m.offset + (addr - m.start);
        self.files
            .read(&m.path, at, &mut buf[..n])
            .map_err(|why| self.fail(addr, buf.len(), why))?;
        Ok(n)
    }
}

impl ProcessMemory for CoreMemory {
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<()> {
        let mut done = 0;
        while done < buf.len() {
            let at = addr
                .checked_add(done as u64)
                .ok_or_else(|| self.fail(addr, buf.len(), "past the end of the address space"))?;
            match self.read_piece(at, &mut buf[done..]) {
                Ok(n) if n > 0 => done += n,
                Ok(_) => return Err(self.fail(at, buf.len() - done, "nothing there")),
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    fn read_prefix(&self, addr: u64, buf: &mut [u8]) -> Result<usize> {
        let mut done = 0;
        while done < buf.len() {
            match self.read_piece(addr.wrapping_add(done as u64), &mut buf[done..]) {
                Ok(n) if n > 0 => done += n,
                Ok(_) => break,
                Err(e) if done == 0 => return Err(e),
                Err(_) => break,
            }
        }
        Ok(done)
    }
}

/// What the core holds of the memory at `addr..addr + len`, that is the dumped part of its
/// segment, if all of the range is dumped (for the build-id check of a mapping's first
/// page, which must come from the core itself, not from the file being checked).
pub(super) fn dumped<'a>(
    bytes: &'a [u8],
    segments: &[Segment],
    addr: u64,
    len: usize,
) -> Option<&'a [u8]> {
    let i = segments.partition_point(|s| s.vaddr <= addr);
    let s = segments.get(i.checked_sub(1)?)?;
    let within = addr - s.vaddr;
    if within.checked_add(len as u64)? > s.filesz {
        return None;
    }
    let at = usize::try_from(s.offset + within).ok()?;
    bytes.get(at..at.checked_add(len)?)
}
