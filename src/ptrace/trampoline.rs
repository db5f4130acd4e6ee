//! The way back from a call into the target, one that needs no tracer.
//!
//! The way back is a few instructions of ours, written once into the target. The called
//! function returns to them. They put the thread back exactly as it was: vector state,
//! flags, every register and its stack pointer. Then they resume its interrupted system
//! call. So the target continues whether or not the profiler is still there. The profiler
//! may be gone in two ways:
//! - it was killed with SIGKILL mid-call;
//! - it gave up on a call that took too long.
//!
//! The instructions also leave the function's result and a "done" word where the profiler
//! reads them.
//!
//! Owns:
//! - the code, [`CODE`] and [`RESUME_CODE`] (their assembly is below);
//! - the layout of the block the profiler writes on the thread's stack ([`Block`]);
//! - where the code goes ([`install`]).
//!
//! The code goes in a cave at the end of the last page of an executable segment of a file
//! the target mapped. The cave is the bytes past the segment's end. They are mapped, but
//! never executed nor read. They are written through /proc/PID/mem. That writes into a
//! read-only private mapping by copying its page. So only this process's copy changes,
//! never the file.
//!
//! Must not: write anywhere a thread may execute or read, or depend on the profiler after
//! the call has started.
//!
//! The code is x86-64, in AT&T syntax. When the function returns here, `rsp` points at the
//! block.
//! ```text
//!     mov    %rax, 144(%rsp)      # the function's result
//!     movq   $1, 152(%rsp)        # done
//!     mov    $-1, %eax            # every component of the XSAVE image...
//!     mov    $-1, %edx
//!     xrstor64 192(%rsp)          # ...back into the vector registers
//!     pushq  128(%rsp)            # rflags
//!     popfq
//!     mov    0(%rsp), %r15        # then each register
//!     mov    8(%rsp), %r14
//!     mov    16(%rsp), %r13
//!     mov    24(%rsp), %r12
//!     mov    32(%rsp), %rbp
//!     mov    40(%rsp), %rbx
//!     mov    56(%rsp), %r10
//!     mov    64(%rsp), %r9
//!     mov    72(%rsp), %r8
//!     mov    80(%rsp), %rax       # the system call's number (restart) or -EINTR
//!     mov    88(%rsp), %rcx
//!     mov    96(%rsp), %rdx
//!     mov    104(%rsp), %rsi
//!     mov    112(%rsp), %rdi
//!     mov    136(%rsp), %r11      # where to resume (r11 and rcx are what the `syscall`
//!     mov    120(%rsp), %rsp      #  instruction clobbers: free to use)
//!     jmp    *%r11
//! ```
//!
//! The resume address is one of two:
//! - the thread's `syscall` instruction, so that its wait starts again (as the kernel
//!   restarts an interrupted wait);
//! - for a wait that was to fail with EINTR, the instruction after it, with rax = -EINTR.
//!
//! Nothing in the code depends on the call. The same bytes serve every call. They also
//! serve a call that returns after a later call rewrote them.
//!
//! A thread may be stopped anywhere outside a system call. In `remote.rs` that is a
//! computing thread, interrupted inside the interpreter's own code. The second listing,
//! [`RESUME_CODE`], puts such a thread back with every register as it was, `r11` and `rcx`
//! too. It starts [`RESUME_AT`] bytes after the first listing.
//! - First it waits on the done word (`futex`), at most the block's timeout (200 ms). A
//!   profiler still there stops it in that wait ([`RESUME_WAKE`]). The profiler sets it
//!   back where it was, for the next call. Without us, the thread goes on by itself when
//!   the wait ends.
//! - It ends on a `ret $136`. The profiler wrote that return's address 144 bytes below the
//!   thread's own stack pointer, and the block's `rsp` points there. The return pops the
//!   address and moves `rsp` back to the thread's own.
//!
//! Those 8 bytes are below the 128-byte red zone, which stays untouched. A signal delivered
//! just before the `ret` builds its frame below them.
//!
//! No signal of ours is involved anywhere. A profiler that dies at any moment leaves the
//! thread to finish the call and come back by itself.
//!
//! The listing of [`RESUME_CODE`]:
//! ```text
//!     mov    %rax, 144(%rsp)
//!     movq   $1, 152(%rsp)
//!     lea    152(%rsp), %rdi      # futex(&done, FUTEX_WAIT_PRIVATE, 1, &timeout)
//!     mov    $128, %esi
//!     mov    $1, %edx
//!     lea    160(%rsp), %r10
//!     mov    $202, %eax
//!     syscall                     # [RESUME_WAKE] after it
//!     mov    $-1, %eax
//!     mov    $-1, %edx
//!     xrstor64 192(%rsp)
//!     pushq  128(%rsp)
//!     popfq
//!     mov    0(%rsp), %r15
//!     mov    8(%rsp), %r14
//!     mov    16(%rsp), %r13
//!     mov    24(%rsp), %r12
//!     mov    32(%rsp), %rbp
//!     mov    40(%rsp), %rbx
//!     mov    48(%rsp), %r11
//!     mov    56(%rsp), %r10
//!     mov    64(%rsp), %r9
//!     mov    72(%rsp), %r8
//!     mov    80(%rsp), %rax
//!     mov    88(%rsp), %rcx
//!     mov    96(%rsp), %rdx
//!     mov    104(%rsp), %rsi
//!     mov    112(%rsp), %rdi
//!     mov    120(%rsp), %rsp      # the resume address's slot
//!     ret    $136                 # resume, rsp back to the thread's own
//! ```
//!
//! A computing thread is seldom stopped inside the interpreter's own code when it spends
//! most of its time in the C library or the kernel (a loop of large buffers: memset, page
//! faults). `remote.rs` then catches it on its way back into that code. The return address
//! of its innermost call out of the interpreter is replaced, on its stack, by the address of
//! a third listing, [`CATCH_CODE`]. There are [`CATCH_ENTRIES`] copies of it, [`CATCH_STRIDE`]
//! bytes apart from [`CATCH_AT`]. Each copy is followed by its own slot, [`CATCH_ORIGINAL`]
//! bytes from its start, that holds the return address it replaced (0: the copy is free).
//! The called function returns into it with every register as the interpreter will see it:
//! - it saves what it is about to change (flags and the registers of a `futex` call) on the
//!   stack, below the stack pointer (the callee's frame, dead once it returned);
//! - it waits on a zero word of its own, at most 50 ms. A profiler still there
//!   stops it in that wait ([`CATCH_WAKE`]), sets every register to what it was at the
//!   return, and uses the thread as one stopped in the interpreter's code;
//! - without us, the wait ends by itself; it puts the registers back and jumps to the
//!   original return address, read from its slot.
//!
//! A slot is set only while it is 0 and cleared only by the profiler that set it, once the
//! thread's registers no longer lead through the copy. A profiler killed with a return
//! address replaced leaves its copy's slot set for good, so no later profiler reuses it.
//!
//! The listing of [`CATCH_CODE`] (`rsp` points just past the replaced return address):
//! ```text
//!     pushfq
//!     push   %rax
//!     push   %rcx
//!     push   %rdx
//!     push   %rsi
//!     push   %rdi
//!     push   %r10
//!     push   %r11
//!     push   $50000000            # the wait's timespec: 50 ms...
//!     push   $0                   # ...and 0 s, also the futex word
//!     mov    %rsp, %rdi           # futex(&word, FUTEX_WAIT_PRIVATE, 0, &timeout)
//!     mov    $128, %esi
//!     xor    %edx, %edx
//!     mov    %rsp, %r10
//!     mov    $202, %eax
//!     syscall                     # [CATCH_WAKE] after it
//!     lea    16(%rsp), %rsp
//!     pop    %r11
//!     pop    %r10
//!     pop    %rdi
//!     pop    %rsi
//!     pop    %rdx
//!     pop    %rcx
//!     pop    %rax
//!     popfq
//!     jmp    *6(%rip)             # the slot, 64 bytes from the start
//! ```

use crate::error::{Error, Result};

/// The code (see the module's doc; `tests::code_is_its_listing` assembles the listing).
pub(crate) const CODE: [u8; 132] = [
    0x48, 0x89, 0x84, 0x24, 0x90, 0x00, 0x00, 0x00, 0x48, 0xc7, 0x84, 0x24, 0x98, 0x00, 0x00, 0x00,
    0x01, 0x00, 0x00, 0x00, 0xb8, 0xff, 0xff, 0xff, 0xff, 0xba, 0xff, 0xff, 0xff, 0xff, 0x48, 0x0f,
    0xae, 0xac, 0x24, 0xc0, 0x00, 0x00, 0x00, 0xff, 0xb4, 0x24, 0x80, 0x00, 0x00, 0x00, 0x9d, 0x4c,
    0x8b, 0x3c, 0x24, 0x4c, 0x8b, 0x74, 0x24, 0x08, 0x4c, 0x8b, 0x6c, 0x24, 0x10, 0x4c, 0x8b, 0x64,
    0x24, 0x18, 0x48, 0x8b, 0x6c, 0x24, 0x20, 0x48, 0x8b, 0x5c, 0x24, 0x28, 0x4c, 0x8b, 0x54, 0x24,
    0x38, 0x4c, 0x8b, 0x4c, 0x24, 0x40, 0x4c, 0x8b, 0x44, 0x24, 0x48, 0x48, 0x8b, 0x44, 0x24, 0x50,
    0x48, 0x8b, 0x4c, 0x24, 0x58, 0x48, 0x8b, 0x54, 0x24, 0x60, 0x48, 0x8b, 0x74, 0x24, 0x68, 0x48,
    0x8b, 0x7c, 0x24, 0x70, 0x4c, 0x8b, 0x9c, 0x24, 0x88, 0x00, 0x00, 0x00, 0x48, 0x8b, 0x64, 0x24,
    0x78, 0x41, 0xff, 0xe3,
];

/// The second listing (see the module's doc).
pub(crate) const RESUME_CODE: [u8; 162] = [
    0x48, 0x89, 0x84, 0x24, 0x90, 0x00, 0x00, 0x00, 0x48, 0xc7, 0x84, 0x24, 0x98, 0x00, 0x00, 0x00,
    0x01, 0x00, 0x00, 0x00, 0x48, 0x8d, 0xbc, 0x24, 0x98, 0x00, 0x00, 0x00, 0xbe, 0x80, 0x00, 0x00,
    0x00, 0xba, 0x01, 0x00, 0x00, 0x00, 0x4c, 0x8d, 0x94, 0x24, 0xa0, 0x00, 0x00, 0x00, 0xb8, 0xca,
    0x00, 0x00, 0x00, 0x0f, 0x05, 0xb8, 0xff, 0xff, 0xff, 0xff, 0xba, 0xff, 0xff, 0xff, 0xff, 0x48,
    0x0f, 0xae, 0xac, 0x24, 0xc0, 0x00, 0x00, 0x00, 0xff, 0xb4, 0x24, 0x80, 0x00, 0x00, 0x00, 0x9d,
    0x4c, 0x8b, 0x3c, 0x24, 0x4c, 0x8b, 0x74, 0x24, 0x08, 0x4c, 0x8b, 0x6c, 0x24, 0x10, 0x4c, 0x8b,
    0x64, 0x24, 0x18, 0x48, 0x8b, 0x6c, 0x24, 0x20, 0x48, 0x8b, 0x5c, 0x24, 0x28, 0x4c, 0x8b, 0x5c,
    0x24, 0x30, 0x4c, 0x8b, 0x54, 0x24, 0x38, 0x4c, 0x8b, 0x4c, 0x24, 0x40, 0x4c, 0x8b, 0x44, 0x24,
    0x48, 0x48, 0x8b, 0x44, 0x24, 0x50, 0x48, 0x8b, 0x4c, 0x24, 0x58, 0x48, 0x8b, 0x54, 0x24, 0x60,
    0x48, 0x8b, 0x74, 0x24, 0x68, 0x48, 0x8b, 0x7c, 0x24, 0x70, 0x48, 0x8b, 0x64, 0x24, 0x78, 0xc2,
    0x88, 0x00,
];

/// The third listing (see the module's doc).
pub(crate) const CATCH_CODE: [u8; 58] = [
    0x9c, 0x50, 0x51, 0x52, 0x56, 0x57, 0x41, 0x52, 0x41, 0x53, 0x68, 0x80, 0xf0, 0xfa, 0x02, 0x6a,
    0x00, 0x48, 0x89, 0xe7, 0xbe, 0x80, 0x00, 0x00, 0x00, 0x31, 0xd2, 0x49, 0x89, 0xe2, 0xb8, 0xca,
    0x00, 0x00, 0x00, 0x0f, 0x05, 0x48, 0x8d, 0x64, 0x24, 0x10, 0x41, 0x5b, 0x41, 0x5a, 0x5f, 0x5e,
    0x5a, 0x59, 0x58, 0x9d, 0xff, 0x25, 0x06, 0x00, 0x00, 0x00,
];
/// Where the first copy of [`CATCH_CODE`] starts, from the cave's start.
pub(crate) const CATCH_AT: u64 = 320;
/// How many copies of [`CATCH_CODE`] the cave holds, and how far apart they are.
pub(crate) const CATCH_ENTRIES: u64 = 2;
pub(crate) const CATCH_STRIDE: u64 = 72;
/// Where a copy's slot (the return address it replaced) is, from the copy's start.
pub(crate) const CATCH_ORIGINAL: u64 = 64;
/// Where a thread waiting in a copy's `futex` is (the instruction after its `syscall`),
/// from the copy's start.
pub(crate) const CATCH_WAKE: u64 = 37;
/// How long a copy waits for the profiler to stop it, nanoseconds (its listing's `push`;
/// the tests check the two agree).
#[cfg(test)]
pub(crate) const CATCH_PARK_NS: u64 = 50_000_000;

/// Where [`CATCH_CODE`] saved the registers it uses, from the stack pointer of a thread
/// waiting at [`CATCH_WAKE`]. The stack pointer at the return is [`Caught::RSP`] above it.
pub(crate) struct Caught;

impl Caught {
    pub(crate) const R11: u64 = 16;
    pub(crate) const R10: u64 = 24;
    pub(crate) const RDI: u64 = 32;
    pub(crate) const RSI: u64 = 40;
    pub(crate) const RDX: u64 = 48;
    pub(crate) const RCX: u64 = 56;
    pub(crate) const RAX: u64 = 64;
    pub(crate) const RFLAGS: u64 = 72;
    pub(crate) const RSP: u64 = 80;
}

/// Where [`RESUME_CODE`] starts, from the cave's start.
pub(crate) const RESUME_AT: u64 = 144;
/// Where a thread waiting in [`RESUME_CODE`]'s `futex` is (the instruction after its
/// `syscall`), from the cave's start.
pub(crate) const RESUME_WAKE: u64 = RESUME_AT + 53;
/// How far below the thread's stack pointer [`RESUME_CODE`]'s resume address goes.
pub(crate) const RESUME_SLOT_BELOW: u64 = 144;
/// How long [`RESUME_CODE`] waits for the profiler to stop it after a call, nanoseconds.
pub(crate) const RESUME_PARK_NS: u64 = 200_000_000;

/// Room the cave must have (every listing, the copies of the third with their slots).
const CAVE_BYTES: u64 = CATCH_AT + CATCH_ENTRIES * CATCH_STRIDE;

/// The block the profiler writes on the thread's stack for [`CODE`], as offsets in bytes from
/// its start. The start must be 64-byte aligned (XRSTOR's rule) and is where `rsp` points
/// when the called function returns.
pub(crate) struct Block;

impl Block {
    pub(crate) const R15: usize = 0;
    pub(crate) const R14: usize = 8;
    pub(crate) const R13: usize = 16;
    pub(crate) const R12: usize = 24;
    pub(crate) const RBP: usize = 32;
    pub(crate) const RBX: usize = 40;
    /// [`RESUME_CODE`] only (the first listing uses r11 for its jump).
    pub(crate) const R11: usize = 48;
    pub(crate) const R10: usize = 56;
    pub(crate) const R9: usize = 64;
    pub(crate) const R8: usize = 72;
    pub(crate) const RAX: usize = 80;
    pub(crate) const RCX: usize = 88;
    pub(crate) const RDX: usize = 96;
    pub(crate) const RSI: usize = 104;
    pub(crate) const RDI: usize = 112;
    pub(crate) const RSP: usize = 120;
    pub(crate) const RFLAGS: usize = 128;
    pub(crate) const RESUME: usize = 136;
    /// Written by the code: the function's result, then 1.
    pub(crate) const RESULT: usize = 144;
    pub(crate) const DONE: usize = 152;
    /// [`RESUME_CODE`] only: the `struct timespec` of its wait ([`RESUME_PARK_NS`]).
    pub(crate) const TIMEOUT: usize = 160;
    /// The XSAVE image (standard form, as PTRACE_GETREGSET NT_X86_XSTATE gives it).
    pub(crate) const XSAVE: usize = 192;

    /// The block's bytes for a thread stopped with `regs` in an interrupted system call,
    /// and its XSAVE image.
    pub(crate) fn bytes(regs: &libc::user_regs_struct, xsave: &[u8]) -> Vec<u8> {
        let mut b = vec![0u8; Self::XSAVE + xsave.len()];
        let mut put = |at: usize, v: u64| b[at..at + 8].copy_from_slice(&v.to_le_bytes());
        // -EINTR: the wait was to fail (the kernel would not restart it), and it returns so.
        let (rax, resume) = if regs.rax as i64 == -(libc::EINTR as i64) {
            (regs.rax, regs.rip)
        } else {
            // Restarted as the kernel would, by the `syscall` instruction (2 bytes) again,
            // with its number.
            (regs.orig_rax, regs.rip - 2)
        };
        for (at, v) in [
            (Self::R15, regs.r15),
            (Self::R14, regs.r14),
            (Self::R13, regs.r13),
            (Self::R12, regs.r12),
            (Self::RBP, regs.rbp),
            (Self::RBX, regs.rbx),
            (Self::R10, regs.r10),
            (Self::R9, regs.r9),
            (Self::R8, regs.r8),
            (Self::RAX, rax),
            (Self::RCX, regs.rcx),
            (Self::RDX, regs.rdx),
            (Self::RSI, regs.rsi),
            (Self::RDI, regs.rdi),
            (Self::RSP, regs.rsp),
            (Self::RFLAGS, regs.eflags),
            (Self::RESUME, resume),
        ] {
            put(at, v);
        }
        b[Self::XSAVE..].copy_from_slice(xsave);
        b
    }

    /// The block's bytes for [`RESUME_CODE`], for a thread stopped with `regs` anywhere
    /// outside a system call and put back with every register as it was. Its stack pointer is
    /// the resume address's slot ([`RESUME_SLOT_BELOW`] below its own), which the caller
    /// writes.
    pub(crate) fn resume_bytes(regs: &libc::user_regs_struct, xsave: &[u8]) -> Vec<u8> {
        let mut b = vec![0u8; Self::XSAVE + xsave.len()];
        let mut put = |at: usize, v: u64| b[at..at + 8].copy_from_slice(&v.to_le_bytes());
        for (at, v) in [
            (Self::R15, regs.r15),
            (Self::R14, regs.r14),
            (Self::R13, regs.r13),
            (Self::R12, regs.r12),
            (Self::RBP, regs.rbp),
            (Self::RBX, regs.rbx),
            (Self::R11, regs.r11),
            (Self::R10, regs.r10),
            (Self::R9, regs.r9),
            (Self::R8, regs.r8),
            (Self::RAX, regs.rax),
            (Self::RCX, regs.rcx),
            (Self::RDX, regs.rdx),
            (Self::RSI, regs.rsi),
            (Self::RDI, regs.rdi),
            (Self::RSP, regs.rsp - RESUME_SLOT_BELOW),
            (Self::RFLAGS, regs.eflags),
            (Self::RESUME, regs.rip),
            (Self::TIMEOUT, 0),
            (Self::TIMEOUT + 8, RESUME_PARK_NS),
        ] {
            put(at, v);
        }
        b[Self::XSAVE..].copy_from_slice(xsave);
        b
    }
}

/// One program header's fields that matter here.
struct Segment {
    offset: u64,
    filesz: u64,
    executable: bool,
}

/// The program headers of the ELF file mapped at `base` in `pid` (read from its memory,
/// because the first page of a mapped ELF file holds its headers).
fn segments(mem: &dyn crate::ptrace::ProcessMemory, base: u64) -> Option<Vec<Segment>> {
    let head = mem.read_vec(base, 64).ok()?;
    if &head[..4] != b"\x7fELF" || head[4] != 2 {
        return None;
    }
    let u16_at = |b: &[u8], at: usize| u16::from_le_bytes([b[at], b[at + 1]]);
    let u64_at = |b: &[u8], at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap());
    let (phoff, phentsize, phnum) = (
        u64_at(&head, 0x20),
        u16_at(&head, 0x36) as usize,
        u16_at(&head, 0x38) as usize,
    );
    if phentsize < 56 || phnum == 0 || phnum > 256 {
        return None;
    }
    // The headers are the process's memory, so they may hold any value at all.
    let table = mem
        .read_vec(base.checked_add(phoff)?, phentsize * phnum)
        .ok()?;
    Some(
        table
            .chunks(phentsize)
            .filter(|p| u32::from_le_bytes(p[..4].try_into().unwrap()) == 1) // PT_LOAD
            .map(|p| Segment {
                offset: u64_at(p, 8),
                filesz: u64_at(p, 32),
                executable: u32::from_le_bytes(p[4..8].try_into().unwrap()) & 1 != 0, // PF_X
            })
            .collect(),
    )
}

/// Where [`CODE`] can go in `pid`. That is the end of the last page of an executable mapping
/// of a file, past its segment's last byte, with room for the code.
fn find_cave(pid: i32) -> Result<u64> {
    let maps = crate::proc::read_maps(pid)?;
    let mem = crate::ptrace::RemoteMemory::new(pid)?;
    for m in maps.iter().filter(|m| m.executable && m.path.is_some()) {
        let Some(base) = maps
            .iter()
            .find(|b| b.path == m.path && b.offset == 0)
            .map(|b| b.start)
        else {
            continue;
        };
        let Some(segs) = segments(&mem, base) else {
            continue;
        };
        if let Some(cave) = cave_in(m, &segs) {
            return Ok(cave);
        }
    }
    Err(Error::BadState {
        pid,
        why: "no room in its code for our way back from a call (no executable segment ends \
              short of its page)"
            .into(),
    })
}

/// Where [`CODE`] can go in the executable mapping `m` of a file whose segments are
/// `segs`. That is past the end of one that ends inside `m`, with room for the code.
fn cave_in(m: &crate::proc::MapEntry, segs: &[Segment]) -> Option<u64> {
    let map_end_offset = m.offset + (m.end - m.start);
    for s in segs.iter().filter(|s| s.executable) {
        // Read from the process's memory, so it may hold any value at all.
        let Some(end) = s.offset.checked_add(s.filesz) else {
            continue;
        };
        // The segment must end inside this mapping, leaving room after it.
        if end <= m.offset || end > map_end_offset {
            continue;
        }
        let code_end = m.start + (end - m.offset);
        let cave = (m.end - CAVE_BYTES) & !15;
        if cave >= code_end.next_multiple_of(16) {
            return Some(cave);
        }
    }
    None
}

/// Writes every listing into a cave of `pid` (again, because the bytes are the same every time)
/// and returns the cave's address (where [`CODE`] starts). The slots of [`CATCH_CODE`]'s
/// copies are left as they are where the code was there already (a copy may be in use),
/// else set to 0 (free).
pub(crate) fn install(pid: i32) -> Result<u64> {
    let at = find_cave(pid)?;
    let f = open_mem(pid)?;
    let mut code = [0u8; CAVE_BYTES as usize];
    code[..CODE.len()].copy_from_slice(&CODE);
    code[RESUME_AT as usize..RESUME_AT as usize + RESUME_CODE.len()].copy_from_slice(&RESUME_CODE);
    for i in 0..CATCH_ENTRIES as usize {
        let start = CATCH_AT as usize + i * CATCH_STRIDE as usize;
        code[start..start + CATCH_CODE.len()].copy_from_slice(&CATCH_CODE);
    }
    let mut now = [0u8; CAVE_BYTES as usize];
    read_mem(pid, &f, at, &mut now)?;
    // The slots are not code, so they are compared as they are.
    let mut same = code;
    for i in 0..CATCH_ENTRIES as usize {
        let slot = (CATCH_AT + i as u64 * CATCH_STRIDE + CATCH_ORIGINAL) as usize;
        same[slot..slot + 8].copy_from_slice(&now[slot..slot + 8]);
    }
    if now != same {
        write_mem(pid, &f, at, &code)?;
    }
    Ok(at)
}

/// The slot of copy `i` of [`CATCH_CODE`] in the cave at `cave`: its value now.
pub(crate) fn catch_slot(pid: i32, cave: u64, i: u64) -> Result<u64> {
    let mut b = [0u8; 8];
    read_mem(pid, &open_mem(pid)?, catch_slot_at(cave, i), &mut b)?;
    Ok(u64::from_le_bytes(b))
}

/// Sets the slot of copy `i` of [`CATCH_CODE`] in the cave at `cave` to `value`.
pub(crate) fn set_catch_slot(pid: i32, cave: u64, i: u64, value: u64) -> Result<()> {
    write_mem(
        pid,
        &open_mem(pid)?,
        catch_slot_at(cave, i),
        &value.to_le_bytes(),
    )
}

/// Where copy `i` of [`CATCH_CODE`] starts in the cave at `cave`.
pub(crate) fn catch_entry(cave: u64, i: u64) -> u64 {
    cave + CATCH_AT + i * CATCH_STRIDE
}

fn catch_slot_at(cave: u64, i: u64) -> u64 {
    catch_entry(cave, i) + CATCH_ORIGINAL
}

/// The target's memory as a file. Writes reach its read-only private mappings too (the
/// page copied, never the file).
fn open_mem(pid: i32) -> Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(format!("/proc/{pid}/mem"))
        .map_err(|e| crate::proc::os_error(pid, "opening /proc/PID/mem", e))
}

fn read_mem(pid: i32, f: &std::fs::File, at: u64, buf: &mut [u8]) -> Result<()> {
    use std::os::unix::fs::FileExt;
    f.read_exact_at(buf, at)
        .map_err(|e| crate::proc::os_error(pid, "reading /proc/PID/mem", e))
}

fn write_mem(pid: i32, f: &std::fs::File, at: u64, bytes: &[u8]) -> Result<()> {
    use std::os::unix::fs::FileExt;
    f.write_all_at(bytes, at)
        .map_err(|e| crate::proc::os_error(pid, "writing into /proc/PID/mem", e))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bytes are the module doc's listings, assembled (where GNU `as` is there).
    #[test]
    fn code_is_its_listing() {
        assemble_listing(0, &CODE);
        assemble_listing(1, &RESUME_CODE);
        assemble_listing(2, &CATCH_CODE);
        let wake = (RESUME_WAKE - RESUME_AT) as usize;
        assert_eq!(RESUME_CODE[wake - 2..wake], [0x0f, 0x05]);
        let wake = CATCH_WAKE as usize;
        assert_eq!(CATCH_CODE[wake - 2..wake], [0x0f, 0x05]);
        // The copies fit their stride with their slot, which the jump reads (rip-relative,
        // from the end of its 6 bytes).
        assert!(CATCH_ORIGINAL as usize >= CATCH_CODE.len() && CATCH_ORIGINAL + 8 <= CATCH_STRIDE);
        let disp = i32::from_le_bytes(CATCH_CODE[CATCH_CODE.len() - 4..].try_into().unwrap());
        assert_eq!(CATCH_CODE.len() as u64 + disp as u64, CATCH_ORIGINAL);
        assert!(CATCH_AT >= RESUME_AT + RESUME_CODE.len() as u64);
        // The timespec the listing pushes.
        assert_eq!(
            u32::from_le_bytes(CATCH_CODE[11..15].try_into().unwrap()) as u64,
            CATCH_PARK_NS
        );
    }

    fn assemble_listing(nth: usize, code: &[u8]) {
        let src = include_str!("trampoline.rs");
        let mut lines = src.lines();
        for _ in 0..=nth {
            lines.by_ref().find(|l| l.contains("```text"));
        }
        let listing: String = lines
            .take_while(|l| !l.contains("```"))
            .map(|l| l.trim_start_matches("//!").split('#').next().unwrap_or(""))
            .map(|l| format!("{l}\n"))
            .collect();
        let dir =
            std::env::temp_dir().join(format!("scalene-rs-tramp-{}-{nth}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (s, o, bin) = (dir.join("t.s"), dir.join("t.o"), dir.join("t.bin"));
        std::fs::write(&s, format!(".text\n{listing}")).unwrap();
        let ok = |c: &mut std::process::Command| c.status().is_ok_and(|s| s.success());
        if !ok(std::process::Command::new("as").arg("-o").arg(&o).arg(&s)) {
            eprintln!("no GNU as: the listing is not assembled");
            return;
        }
        assert!(ok(std::process::Command::new("objcopy")
            .args(["-O", "binary", "-j", ".text"])
            .arg(&o)
            .arg(&bin)));
        assert_eq!(std::fs::read(&bin).unwrap(), code);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// An ELF header and program headers as the process's memory holds them at `base`, with
    /// the program headers at `phoff` and one executable PT_LOAD of `offset` and `filesz`.
    fn headers(base: u64, phoff: u64, offset: u64, filesz: u64) -> crate::ptrace::BufferMemory {
        let mut bytes = vec![0u8; 64 + 56];
        bytes[..5].copy_from_slice(b"\x7fELF\x02");
        bytes[0x20..0x28].copy_from_slice(&phoff.to_le_bytes());
        bytes[0x36..0x38].copy_from_slice(&56u16.to_le_bytes());
        bytes[0x38..0x3a].copy_from_slice(&1u16.to_le_bytes());
        let ph = &mut bytes[64..];
        ph[..4].copy_from_slice(&1u32.to_le_bytes()); // PT_LOAD
        ph[4..8].copy_from_slice(&5u32.to_le_bytes()); // PF_R | PF_X
        ph[8..16].copy_from_slice(&offset.to_le_bytes());
        ph[32..40].copy_from_slice(&filesz.to_le_bytes());
        crate::ptrace::BufferMemory { base, bytes }
    }

    /// The program headers' place is read from the process. One past the top of the
    /// address space is no table (it overflowed the sum before, a panic with overflow
    /// checks).
    #[test]
    fn program_headers_past_the_top_of_the_address_space_are_none() {
        let base = 0x40_0000;
        let segs = segments(&headers(base, 64, 0, 0x123), base).expect("one segment");
        assert_eq!(segs.len(), 1);
        assert_eq!((segs[0].offset, segs[0].filesz), (0, 0x123));
        assert!(segments(&headers(base, u64::MAX - 0x10, 0, 0x123), base).is_none());
    }

    /// A segment read from the process that ends past `u64::MAX` ends in no mapping, so
    /// there is no cave after it.
    #[test]
    fn a_segment_ending_past_the_top_has_no_cave() {
        let m = crate::proc::MapEntry {
            start: 0x40_0000,
            end: 0x40_1000,
            offset: 0,
            readable: true,
            executable: true,
            path: Some("/lib/x.so".into()),
            dev: (0, 0),
            inode: 1,
            deleted: false,
            vdso: false,
        };
        let seg = |offset, filesz| Segment {
            offset,
            filesz,
            executable: true,
        };
        let cave = (0x40_1000 - CAVE_BYTES) & !15;
        assert_eq!(cave_in(&m, &[seg(0, 0x100)]), Some(cave));
        assert_eq!(cave_in(&m, &[seg(u64::MAX - 8, 16)]), None);
        assert_eq!(
            cave_in(&m, &[seg(u64::MAX - 8, 16), seg(0, 0x100)]),
            Some(cave)
        );
    }

    #[test]
    fn a_wait_to_fail_returns_and_a_restartable_one_restarts() {
        // SAFETY: an all-zero register set is a valid value.
        let mut regs: libc::user_regs_struct = unsafe { std::mem::zeroed() };
        regs.rip = 0x1002;
        regs.orig_rax = 202;
        regs.rax = -512i64 as u64;
        regs.rsp = 0x7000;
        let b = Block::bytes(&regs, &[7; 64]);
        let at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
        assert_eq!((at(Block::RAX), at(Block::RESUME)), (202, 0x1000));
        assert_eq!(at(Block::RSP), 0x7000);
        assert_eq!(&b[Block::XSAVE..], &[7; 64]);
        regs.rax = -4i64 as u64;
        let b = Block::bytes(&regs, &[]);
        let at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
        assert_eq!((at(Block::RAX) as i64, at(Block::RESUME)), (-4, 0x1002));
    }
}
