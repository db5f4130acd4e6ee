//! pymalloc's arenas, as allocations.
//!
//! Python's small-object allocator (pymalloc) serves objects of up to 512 bytes from
//! arenas the interpreter maps itself, not from malloc. An arena is an anonymous private
//! `mmap`:
//! - 256 KiB up to 3.9, 1 MiB since 3.10;
//! - unmapped once it is empty.
//!
//! What counts, by allocator mode:
//! - pymalloc left alone (`run --python-allocator pymalloc`): each arena mapped counts as
//!   an allocation of the interpreter, each unmapped as a free. A line that grows small
//!   objects is seen one arena at a time. Objects allocated and freed inside arenas
//!   already mapped are not seen.
//! - pymalloc wrapped (`pymem.rs`): the objects themselves are counted. The arenas count
//!   only in the footprint (the objects' frees are not sized).
//! - `PYTHONMALLOC=malloc`: the interpreter maps no arenas, so nothing here counts.
//! - A free-threaded build: mimalloc maps memory for objects of every size, in
//!   reservations of 1 GiB that say nothing of what is used. Nothing it maps counts; the
//!   wrappers (`pymem.rs`) count its objects.
//!
//! Owns: the interposed `mmap`, `mmap64` and `munmap`, and what counts as an arena.
//! Must not: count any mapping that is not an arena (files, stacks, other sizes, other
//! callers). They are not heap memory, and their unmapping must not be subtracted either.

use crate::{active, in_python, on_alloc, on_free, pymem, real, ring};
use core::ffi::c_void;

/// The arena sizes of every supported interpreter.
const ARENA_SIZES: [usize; 2] = [256 << 10, 1 << 20];

/// Whether a mapping of `len` bytes made or unmapped by a call returning to `ret` is one of
/// the interpreter's arenas (pymalloc's; never in a free-threaded build, whose mimalloc
/// maps reservations, not arenas).
#[inline(always)]
fn is_arena(len: usize, ret: usize) -> bool {
    ARENA_SIZES.contains(&len) && in_python(ret) && !pymem::mimalloc_maps()
}

/// Counts the mapping `p` (`len` bytes, `flags`) just made by a call returning to `ret`.
#[inline(always)]
fn mapped(p: *mut c_void, len: usize, flags: i32, ret: usize) {
    let anonymous_private = flags & libc::MAP_ANONYMOUS != 0
        && flags & libc::MAP_PRIVATE != 0
        && flags & libc::MAP_FIXED == 0;
    if p != libc::MAP_FAILED && anonymous_private && active() && is_arena(len, ret) {
        if pymem::hooked() {
            // The objects in it are counted one by one, so the arena is footprint only.
            ring::footprint(len as i64);
        } else {
            on_alloc(p, len, ret);
        }
    }
}

extern "C" fn mmap_shim(
    addr: *mut c_void,
    len: usize,
    prot: i32,
    flags: i32,
    fd: i32,
    off: i64,
    ret: usize,
) -> *mut c_void {
    let p = real::mmap(addr, len, prot, flags, fd, off);
    mapped(p, len, flags, ret);
    p
}

extern "C" fn mmap64_shim(
    addr: *mut c_void,
    len: usize,
    prot: i32,
    flags: i32,
    fd: i32,
    off: i64,
    ret: usize,
) -> *mut c_void {
    let p = real::mmap64(addr, len, prot, flags, fd, off);
    mapped(p, len, flags, ret);
    p
}

extern "C" fn munmap_shim(addr: *mut c_void, len: usize, ret: usize) -> i32 {
    // Counted before the real call, because once unmapped, the address may be mapped again
    // by another thread and counted anew.
    if !addr.is_null() && active() && is_arena(len, ret) {
        if pymem::hooked() {
            ring::footprint(-(len as i64));
        } else {
            on_free(addr, len);
        }
    }
    real::munmap(addr, len)
}

// mmap takes six arguments. On x86-64 the return address goes to the stack as the seventh,
// so these trampolines call (and return) instead of jumping.
macro_rules! trampoline7 {
    ($name:ident => $shim:ident) => {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: on entry rsp ≡ 8 (mod 16) and [rsp] is the return address. Pushing a copy
        // of it aligns the stack for the call and makes it the callee's seventh (stack)
        // argument. The six register arguments pass through untouched. After the call the
        // copy is dropped and rax (the result) returned. No callee-saved register is used.
        #[unsafe(naked)]
        #[no_mangle]
        pub extern "C" fn $name(
            addr: *mut c_void,
            len: usize,
            prot: i32,
            flags: i32,
            fd: i32,
            off: i64,
        ) -> *mut c_void {
            core::arch::naked_asm!(
                "push qword ptr [rsp]",
                "call {f}",
                "add rsp, 8",
                "ret",
                f = sym $shim,
            )
        }

        #[cfg(target_arch = "aarch64")]
        // SAFETY: the return address (link register) goes to the seventh argument register,
        // then a tail branch to a C-ABI function taking it as one more argument.
        #[unsafe(naked)]
        #[no_mangle]
        pub extern "C" fn $name(
            addr: *mut c_void,
            len: usize,
            prot: i32,
            flags: i32,
            fd: i32,
            off: i64,
        ) -> *mut c_void {
            core::arch::naked_asm!("mov x6, x30", "b {f}", f = sym $shim)
        }

        #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
        #[no_mangle]
        pub extern "C" fn $name(
            addr: *mut c_void,
            len: usize,
            prot: i32,
            flags: i32,
            fd: i32,
            off: i64,
        ) -> *mut c_void {
            $shim(addr, len, prot, flags, fd, off, 0)
        }
    };
}

trampoline7!(mmap => mmap_shim);
trampoline7!(mmap64 => mmap64_shim);

#[cfg(target_arch = "x86_64")]
// SAFETY: as the two-argument trampolines of lib.rs, the return address goes to the third
// argument register and the body tail-jumps to a C-ABI function taking it as one more.
#[unsafe(naked)]
#[no_mangle]
pub extern "C" fn munmap(addr: *mut c_void, len: usize) -> i32 {
    core::arch::naked_asm!("mov rdx, [rsp]", "jmp {f}", f = sym munmap_shim)
}

#[cfg(target_arch = "aarch64")]
// SAFETY: as above, with the link register as the return address.
#[unsafe(naked)]
#[no_mangle]
pub extern "C" fn munmap(addr: *mut c_void, len: usize) -> i32 {
    core::arch::naked_asm!("mov x2, x30", "b {f}", f = sym munmap_shim)
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
#[no_mangle]
pub extern "C" fn munmap(addr: *mut c_void, len: usize) -> i32 {
    munmap_shim(addr, len, 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interposed_mmap_maps_and_unmaps() {
        // This test binary runs on the interposed functions (idle, with no ring).
        for len in [4096, 256 << 10, 1 << 20] {
            let p = mmap(
                core::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            assert_ne!(p, libc::MAP_FAILED);
            // SAFETY: `p` is a fresh writable mapping of `len` bytes.
            unsafe { (p as *mut u8).add(len - 1).write(1) };
            assert_eq!(munmap(p, len), 0);
        }
        let bad = mmap64(core::ptr::null_mut(), 0, 0, libc::MAP_PRIVATE, -1, 0);
        assert_eq!(
            bad,
            libc::MAP_FAILED,
            "a zero-length mapping fails as before"
        );
    }
}
