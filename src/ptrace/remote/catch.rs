//! The way into the interpreter's own code for a computing thread that is seldom stopped
//! there. The return address of its innermost call out of that code is replaced, on its
//! stack, by a copy of the trampoline's third listing (`trampoline::CATCH_CODE`). That
//! copy waits briefly where the profiler stops it, or else goes on to the original
//! address.
//!
//! Why:
//! - A thread that allocates large buffers in a loop (`bytearray(1 << 20)`) spends almost
//!   all its time in the C library's memset and allocator and in the kernel's page faults.
//! - Stops made now and then (`Hijacked::in_code`) found it inside the interpreter's code
//!   once in hundreds of tries, so the search ran out of time on 4 tries in 10.
//! - But every one of those calls returns into the interpreter. Caught at that return,
//!   the thread holds no C-library lock (the callee has returned) and is where a stop
//!   inside the interpreter's code would have found it.
//!
//! Owns: [`Patch`] (one replaced return address), which covers:
//! - choosing a free copy of the listing;
//! - replacing and restoring the return address;
//! - turning a thread caught in the copy back into the registers it had at the return.
//!
//! Must not:
//! - replace a return address it has not checked (the caller unwinds the stack and names
//!   the slot; its value is read again here);
//! - reuse a copy whose slot is set (unless nothing can lead into it: [`reclaim`]);
//! - clear a slot while the thread's registers still lead through the copy.
//!
//! A profiler that dies at any moment leaves the thread unharmed:
//! - with the address replaced: the callee returns into the copy, which waits at most
//!   50 ms and jumps to the original address (kept in the copy's slot, which stays set);
//! - with the thread caught in the copy: its registers are still the copy's, which go on
//!   the same way;
//! - after [`Patch::caught`]: its registers are those of the return, at the original
//!   address; the copy is no longer on its way.

use super::{write_memory, Hijacked};
use crate::error::Result;
use crate::ptrace::trampoline::{self, Caught};
use crate::ptrace::ProcessMemory;
use nix::sys::ptrace;

/// A return address replaced by a copy of the catch listing.
#[derive(Debug, Clone, Copy)]
pub(super) struct Patch {
    /// Which copy, and where it starts.
    entry: u64,
    at: u64,
    /// The cave of the trampoline.
    cave: u64,
    /// Where the return address is on the thread's stack, and its original value.
    slot: u64,
    ret: u64,
}

/// Where a thread with a patch outstanding is, at a stop.
#[derive(Debug, PartialEq)]
pub(super) enum Progress {
    /// Waiting in the copy's `futex`, so catch it.
    Waiting,
    /// Its callee has not returned yet, or it is on its way into the wait, so look again.
    OnItsWay,
    /// Past the wait (its 50 ms ran out before we looked), so on its way to the original
    /// address by itself.
    Leaving,
    /// Gone through the copy and out (or the address was overwritten some other way), so
    /// nothing of ours is on its way.
    Gone,
}

impl Patch {
    /// Replaces the return address at `slot` (whose value the caller found to be `ret`,
    /// an address of the interpreter's code) of the stopped thread `h` by a free copy of
    /// the catch listing. None when no copy is free or the slot no longer holds `ret`.
    pub(super) fn make(h: &mut Hijacked, slot: u64, ret: u64) -> Result<Option<Patch>> {
        let pid = h.pid;
        let cave = match h.trampoline {
            Some(c) => c,
            None => *h.trampoline.insert(trampoline::install(pid)?),
        };
        let mem = crate::ptrace::RemoteMemory::new(pid)?;
        // Not there (or not readable) now, so no patch this time.
        if mem.read_u64(slot).ok() != Some(ret) {
            return Ok(None);
        }
        let free = |i: &u64| trampoline::catch_slot(pid, cave, *i).ok() == Some(0);
        let entry = match (0..trampoline::CATCH_ENTRIES).find(free) {
            Some(i) => Some(i),
            None if reclaim(h, cave, &mem) => Some(0),
            None => None,
        };
        let Some(entry) = entry else {
            return Ok(None);
        };
        let at = trampoline::catch_entry(cave, entry);
        // The slot first, because from the moment the stack leads into the copy, the copy
        // knows where to go on.
        trampoline::set_catch_slot(pid, cave, entry, ret)?;
        if let Err(e) = write_memory(pid, slot, &at.to_le_bytes()) {
            let _ = trampoline::set_catch_slot(pid, cave, entry, 0);
            return Err(e);
        }
        Ok(Some(Patch {
            entry,
            at,
            cave,
            slot,
            ret,
        }))
    }

    /// Where the thread, stopped with `regs`, is (see [`Progress`]).
    pub(super) fn progress(&self, pid: i32, regs: &libc::user_regs_struct) -> Progress {
        let wake = self.at + trampoline::CATCH_WAKE;
        let end = self.at + trampoline::CATCH_CODE.len() as u64;
        match regs.rip {
            r if r == wake => Progress::Waiting,
            r if (self.at..wake).contains(&r) => Progress::OnItsWay,
            r if (wake..end).contains(&r) => Progress::Leaving,
            _ => {
                let still = crate::ptrace::RemoteMemory::new(pid)
                    .and_then(|m| m.read_u64(self.slot))
                    .is_ok_and(|v| v == self.at);
                if still {
                    Progress::OnItsWay
                } else {
                    Progress::Gone
                }
            }
        }
    }

    /// The thread `h`, stopped with `regs` in the copy's wait ([`Progress::Waiting`]), set
    /// to the registers it had when its callee returned (the copy's saved values, its
    /// stack pointer above them, the original address), its system call not restarted.
    /// Returns those registers, or None when they could not be set (it then goes on through
    /// the copy by itself, and the slot stays set).
    pub(super) fn caught(
        &self,
        h: &mut Hijacked,
        regs: &libc::user_regs_struct,
    ) -> Option<libc::user_regs_struct> {
        let mem = crate::ptrace::RemoteMemory::new(h.pid).ok()?;
        let saved = mem.read_vec(regs.rsp, Caught::RSP as usize).ok()?;
        let word = |at: u64| {
            let at = at as usize;
            u64::from_le_bytes(saved[at..at + 8].try_into().unwrap())
        };
        let mut back = *regs;
        back.r11 = word(Caught::R11);
        back.r10 = word(Caught::R10);
        back.rdi = word(Caught::RDI);
        back.rsi = word(Caught::RSI);
        back.rdx = word(Caught::RDX);
        back.rcx = word(Caught::RCX);
        back.rax = word(Caught::RAX);
        back.eflags = word(Caught::RFLAGS);
        back.rsp = regs.rsp + Caught::RSP;
        back.rip = self.ret;
        // Outside a system call, so the copy's `futex` is not restarted.
        back.orig_rax = u64::MAX;
        ptrace::setregs(h.tid, back).ok()?;
        // Its registers no longer lead through the copy, so the copy is free again.
        let _ = trampoline::set_catch_slot(h.pid, self.cave, self.entry, 0);
        Some(back)
    }

    /// Undoes the patch of the stopped thread `h` (found [`Progress::OnItsWay`] before its
    /// callee returned, or [`Progress::Gone`]). The original return address is put back
    /// where the copy's still is, and the copy freed. Where the thread is inside the copy
    /// or past its wait, the slot stays set (it goes on by itself).
    pub(super) fn undo(&self, h: &Hijacked, regs: &libc::user_regs_struct) {
        let pid = h.pid;
        let in_copy = (self.at..self.at + trampoline::CATCH_CODE.len() as u64).contains(&regs.rip);
        if in_copy {
            return;
        }
        let still = crate::ptrace::RemoteMemory::new(pid)
            .and_then(|m| m.read_u64(self.slot))
            .is_ok_and(|v| v == self.at);
        if still && write_memory(pid, self.slot, &self.ret.to_le_bytes()).is_err() {
            return;
        }
        let _ = trampoline::set_catch_slot(pid, self.cave, self.entry, 0);
    }
}

/// Frees every copy of the catch listing in the cave at `cave` when none can be on any
/// thread's way. That is when the process has one thread, `h` (stopped), which is in no
/// copy, and no word of its stack (from its stack pointer to the end of its mapping) is a
/// copy's address. Slots are left set by profilers killed while a return address was
/// replaced. Without this, a process would lose this way in after
/// [`trampoline::CATCH_ENTRIES`] such kills.
fn reclaim(h: &Hijacked, cave: u64, mem: &dyn ProcessMemory) -> bool {
    let pid = h.pid;
    if crate::proc::threads(pid).map_or(true, |t| t != [h.tid.as_raw()]) {
        return false;
    }
    let Ok(regs) = ptrace::getregs(h.tid) else {
        return false;
    };
    let copies: Vec<u64> = (0..trampoline::CATCH_ENTRIES)
        .map(|i| trampoline::catch_entry(cave, i))
        .collect();
    let len = trampoline::CATCH_CODE.len() as u64;
    if copies.iter().any(|&at| (at..at + len).contains(&regs.rip)) {
        return false;
    }
    let maps = crate::proc::read_maps(pid).unwrap_or_default();
    let Some(stack) = maps
        .iter()
        .find(|m| m.start <= regs.rsp && regs.rsp < m.end)
    else {
        return false;
    };
    let mut bytes = vec![0u8; (stack.end - regs.rsp) as usize];
    match mem.read_prefix(regs.rsp, &mut bytes) {
        Ok(got) if got == bytes.len() => {}
        _ => return false,
    }
    let leads_in = bytes
        .chunks_exact(8)
        .any(|w| copies.contains(&u64::from_le_bytes(w.try_into().unwrap())));
    if leads_in {
        return false;
    }
    (0..trampoline::CATCH_ENTRIES).all(|i| trampoline::set_catch_slot(pid, cave, i, 0).is_ok())
}
