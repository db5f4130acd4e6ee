//! The calling thread's counters, reached without a function call.
//!
//! Why not `thread_local!`:
//! - A `thread_local!` of a cdylib uses the general-dynamic TLS model. Every access calls
//!   `__tls_get_addr` (through the PLT), on every malloc, free and memcpy of the program.
//! - For a module whose TLS is not in the static block, that call may itself allocate.
//!
//! What instead:
//! - This library is only ever loaded at start-up (LD_PRELOAD). There glibc puts every
//!   module's TLS in the static block.
//! - So on x86-64 the block is declared in assembly and reached with the initial-exec
//!   model, as the thread pointer plus an offset the dynamic linker writes once into the GOT
//!   (`@gottpoff`). Two instructions, no call, no allocation ever.
//! - A later `dlopen` of the library would still work, because glibc keeps surplus static
//!   TLS for such modules, and 128 bytes fit.
//! - Other architectures keep `thread_local!`.
//!
//! Owns: [`ThreadState`] and [`with`].
//! Must not: allocate, or hand out the state beyond one call of `with`. A signal handler
//! that interrupts the thread reaches the same state. Every user must tolerate that, as
//! `lib.rs` does with its `busy` flag.

use core::cell::Cell;

/// One thread's counters since its last events. All zeroes is the initial state (the TLS
/// block starts zero-filled). There is no destructor, so access works until the thread is
/// gone.
#[repr(C)]
pub struct ThreadState {
    /// Bytes allocated since the last alloc event, and of those, by the interpreter.
    pub allocated: Cell<u64>,
    pub python: Cell<u64>,
    /// Bytes freed since the last free event.
    pub freed: Cell<u64>,
    pub copied: Cell<u64>,
    /// Of `allocated`, the small objects the wrapped Python allocator counted (not part of
    /// the footprint).
    pub small: Cell<u64>,
    /// Handshake budget: the handshakes this thread may still have, in ns of earning time
    /// (see `handshake_allowed`), as of `credit_at` (monotonic ns; 0 when never used).
    pub credit: Cell<i64>,
    pub credit_at: Cell<u64>,
    /// The same for the events of allocations of at least a window in one block, which
    /// have a budget of their own (see `lib.rs`), so the churn of small objects never
    /// spends it.
    pub credit_large: Cell<i64>,
    pub credit_large_at: Cell<u64>,
    /// The thread's kernel id, once asked for (0 until then).
    pub tid: Cell<i32>,
    /// Inside our own accounting (an event being written), so calls pass straight through.
    pub busy: Cell<bool>,
    /// Inside the interpreter's wrapped allocator (`pymem.rs`), which may hand the request
    /// to the C allocator. What it allocates there is the interpreter's, whatever the
    /// return address says (pymalloc reaches malloc through tail calls, so the return
    /// address is the wrapper's, in this library).
    pub in_pymem: Cell<bool>,
}

/// Bytes of the assembly TLS block; the state must fit.
#[cfg(target_arch = "x86_64")]
const BLOCK_BYTES: usize = 128;
#[cfg(target_arch = "x86_64")]
const _: () = assert!(core::mem::size_of::<ThreadState>() <= BLOCK_BYTES);
#[cfg(target_arch = "x86_64")]
const _: () = assert!(core::mem::align_of::<ThreadState>() <= 64);

// The block: zero-filled thread-local storage (.tbss), hidden so only this object sees it.
#[cfg(target_arch = "x86_64")]
core::arch::global_asm!(
    ".pushsection .tbss.scalene_preload_tls,\"awT\",@nobits",
    ".p2align 6",
    ".globl scalene_preload_tls",
    ".hidden scalene_preload_tls",
    ".type scalene_preload_tls,@object",
    ".size scalene_preload_tls,128",
    "scalene_preload_tls:",
    ".zero 128",
    ".popsection",
);

/// Runs `f` on the calling thread's state.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub fn with<R>(f: impl FnOnce(&ThreadState) -> R) -> R {
    let p: *const ThreadState;
    // SAFETY: %fs:0 holds the thread pointer (glibc's TCB points to itself) of every thread
    // that can run this code, and the GOT slot holds the block's offset from it, written by
    // the dynamic linker before any code of this object runs. Reads only, no stack.
    unsafe {
        core::arch::asm!(
            "mov {p}, qword ptr fs:[0]",
            "add {p}, qword ptr [rip + scalene_preload_tls@GOTTPOFF]",
            p = out(reg) p,
            options(pure, readonly, nostack),
        )
    };
    // SAFETY: `p` is this thread's block of 128 bytes, 64-aligned, zero-initialised, alive
    // as long as the thread, touched only by this thread (Cells are not shared across
    // threads). All zeroes is a valid ThreadState.
    f(unsafe { &*p })
}

#[cfg(not(target_arch = "x86_64"))]
thread_local! {
    static T: ThreadState = const {
        ThreadState {
            allocated: Cell::new(0),
            python: Cell::new(0),
            freed: Cell::new(0),
            copied: Cell::new(0),
            small: Cell::new(0),
            credit: Cell::new(0),
            credit_at: Cell::new(0),
            credit_large: Cell::new(0),
            credit_large_at: Cell::new(0),
            tid: Cell::new(0),
            busy: Cell::new(false),
            in_pymem: Cell::new(false),
        }
    };
}

/// Runs `f` on the calling thread's state.
#[cfg(not(target_arch = "x86_64"))]
#[inline(always)]
pub fn with<R>(f: impl FnOnce(&ThreadState) -> R) -> R {
    T.with(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_thread_has_its_own_zeroed_state() {
        with(|t| {
            assert_eq!(t.allocated.get(), 0);
            assert!(!t.busy.get());
            t.allocated.set(7);
        });
        let here = with(|t| t as *const ThreadState as usize);
        assert_eq!(here % 64, 0);
        let there = std::thread::spawn(|| {
            with(|t| {
                assert_eq!(t.allocated.get(), 0, "a new thread starts from zero");
                t.allocated.set(9);
                t as *const ThreadState as usize
            })
        })
        .join()
        .unwrap();
        assert_ne!(here, there);
        with(|t| assert_eq!(t.allocated.get(), 7));
    }
}
