//! scalene-rs's preload library, loaded into the profiled program with LD_PRELOAD. It:
//! - interposes the malloc family, memcpy and memmove (and mmap/munmap, for pymalloc's
//!   arenas; see `arenas.rs`);
//! - counts bytes per thread (`tls.rs`);
//! - writes a sampled event into the profiler's shared-memory ring each time a thread has
//!   allocated a window's worth of bytes, freed a window's worth, copied a copy window's
//!   worth, or freed a sampled allocation.
//!
//! Owns: the interposed entry points and the per-thread accounting, whose common path is a
//! few instructions (the sampled path is out of line). Every entry point delegates to the
//! real function (`real.rs`). Accounting happens only when a ring was claimed (`ring.rs`),
//! so a program that is not Python runs unchanged.
//!
//! Must not: allocate, take a lock, or panic on any path reachable from an entry point
//! (the crate is built with panic = "abort"), or block except the bounded handshake.

mod arenas;
mod attach;
mod budget;
mod elf;
pub mod layout;
mod mallocstats;
mod maps;
mod pymem;
mod real;
mod ring;
mod tls;

use budget::{handshake_allowed, spend};
use core::ffi::c_void;
use core::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use tls::ThreadState;

/// The interpreter image's address range (`[lo, hi)`); zero when not Python.
static PY_LO: AtomicUsize = AtomicUsize::new(0);
static PY_HI: AtomicUsize = AtomicUsize::new(0);

/// Runs before `main` (and before the interpreter starts) when preloaded. When loaded late,
/// it runs at the `dlopen` of an attach, where it only finds the C library's functions. It
/// finds no ring, no environment and no Python allocator; those are `scalene_rs_attach`'s
/// (`attach.rs`).
extern "C" fn constructor() {
    attach::detect_late_load();
    if attach::loaded_late() {
        if real::init() {
            real::check_glibc_chunks();
        }
        return;
    }
    real::init();
    real::check_glibc_chunks();
    let range = maps::interpreter_range();
    if let Some((lo, hi)) = range {
        PY_LO.store(lo, Ordering::Relaxed);
        PY_HI.store(hi, Ordering::Relaxed);
    }
    ring::open(range);
    pymem::choose(active());
}

#[used]
#[link_section = ".init_array"]
static CONSTRUCTOR: extern "C" fn() = constructor;

fn tid(t: &ThreadState) -> i32 {
    let mut id = t.tid.get();
    if id == 0 {
        // SAFETY: gettid has no preconditions.
        id = unsafe { libc::syscall(libc::SYS_gettid) } as i32;
        t.tid.set(id);
    }
    id
}

/// Sets the interpreter image's range (`attach`, before counting starts).
pub(crate) fn set_interpreter_range(lo: usize, hi: usize) {
    PY_LO.store(lo, Ordering::Relaxed);
    PY_HI.store(hi, Ordering::Relaxed);
}

#[inline(always)]
pub(crate) fn active() -> bool {
    ring::ACTIVE.load(Ordering::Relaxed)
}

#[inline(always)]
pub(crate) fn in_python(ret: usize) -> bool {
    ret.wrapping_sub(PY_LO.load(Ordering::Relaxed))
        < PY_HI
            .load(Ordering::Relaxed)
            .wrapping_sub(PY_LO.load(Ordering::Relaxed))
}

/// Counts `bytes` allocated at `p` by a call returning to `ret`. Allocations and frees are
/// counted apart, each with its own window. So a loop that allocates and frees the same
/// block is seen (net counting would never see it from an offset), and the footprint is their
/// difference.
#[inline(always)]
fn on_alloc(p: *mut c_void, bytes: usize, ret: usize) {
    count_alloc(p, bytes, |t| in_python(ret) || t.in_pymem.get(), false)
}

/// Counts a small object (at most `pymem::SMALL` bytes) that the interpreter's wrapped
/// allocator (pymalloc) made. It is the interpreter's by definition, and in the allocation
/// window but not the footprint (see `pymem.rs`).
#[inline(always)]
pub(crate) fn on_alloc_small(p: *mut c_void, bytes: usize) {
    count_alloc(p, bytes, |_| true, true)
}

/// Counts an object that a free-threaded build's wrapped mimalloc made (any size). It is the
/// interpreter's, and in the footprint, which its sampled frees take back one window each
/// (mimalloc cannot tell a block's size at its free; see `pymem.rs`).
#[inline(always)]
pub(crate) fn on_alloc_mimalloc(p: *mut c_void, bytes: usize) {
    count_alloc(p, bytes, |_| true, false)
}

/// The common path of [`on_alloc`] and [`on_alloc_small`] (each inlines it with its own
/// constants). `python` tells whether the interpreter allocated, `small` whether the bytes
/// stay out of the footprint.
#[inline(always)]
fn count_alloc(
    p: *mut c_void,
    bytes: usize,
    python: impl FnOnce(&ThreadState) -> bool,
    small: bool,
) {
    tls::with(|t| {
        if t.busy.get() {
            return;
        }
        let allocated = t.allocated.get() + bytes as u64;
        if python(t) {
            t.python.set(t.python.get() + bytes as u64);
        }
        if small {
            t.small.set(t.small.get() + bytes as u64);
        }
        let window = ring::WINDOW.load(Ordering::Relaxed);
        if allocated >= window {
            alloc_window_full(t, p, allocated, bytes as u64 >= window);
        } else {
            t.allocated.set(allocated);
        }
    })
}

/// The sampled (rare) part of [`on_alloc`]. It is out of line, so the common path stays a
/// few instructions inlined into each entry point. `large`: the block that filled the
/// window is at least a window by itself. Its event waits on the large blocks' own budget,
/// so that a churn of small objects before it never leaves it without its own stack.
#[cold]
#[inline(never)]
fn alloc_window_full(t: &ThreadState, p: *mut c_void, allocated: u64, large: bool) {
    t.busy.set(true);
    t.allocated.set(0);
    // Small objects counted by the wrapped Python allocator are not in the footprint
    // (their frees are not sized, and pymalloc's arenas stand for them there).
    ring::footprint(allocated.saturating_sub(t.small.replace(0)) as i64);
    let watched = if watch(p as usize) { p as u64 } else { 0 };
    let (kind, credit, at) = if large {
        (layout::EV_ALLOC_LARGE, &t.credit_large, &t.credit_large_at)
    } else {
        (layout::EV_ALLOC, &t.credit, &t.credit_at)
    };
    let wait = handshake_allowed(credit, at);
    let answered = ring::emit(
        kind,
        tid(t),
        allocated,
        allocated,
        t.python.replace(0),
        watched,
        wait,
    );
    spend(credit, answered);
    t.busy.set(false);
}

/// A block freed through the interpreter's wrapped allocator. Only a watched one counts
/// (its size is not known; a large block's free reaches the C allocator's `free` too).
/// `window_back`: the block stood for a whole window of the footprint, which its free
/// takes back (a free-threaded build's mimalloc, whose objects are all in the footprint;
/// pymalloc's small objects are there through their arenas instead).
#[inline(always)]
pub(crate) fn on_free_small(p: *mut c_void, window_back: bool) {
    if !unwatch(p as usize) {
        return;
    }
    tls::with(|t| {
        if !t.busy.get() {
            if window_back {
                ring::footprint(-(ring::WINDOW.load(Ordering::Relaxed) as i64));
            }
            free_sampled(t, p, true, t.freed.get());
        }
    })
}

/// A block that realloc moved from `p` to `q`. When `p` was watched, `q` is, and the profiler
/// is told. The memory it stands for lives on (pymalloc moves a shrinking string to a
/// smaller size class, say). A watch table too full for `q` makes it a sampled free.
#[inline(always)]
pub(crate) fn on_move(p: *mut c_void, q: *mut c_void) {
    if !unwatch(p as usize) {
        return;
    }
    moved_sampled(p, q);
}

#[cold]
#[inline(never)]
fn moved_sampled(p: *mut c_void, q: *mut c_void) {
    tls::with(|t| {
        if t.busy.get() {
            return;
        }
        t.busy.set(true);
        if watch(q as usize) {
            ring::emit(
                layout::EV_SAMPLED_MOVE,
                tid(t),
                q as u64,
                0,
                0,
                p as u64,
                false,
            );
        } else {
            ring::emit(layout::EV_SAMPLED_FREE, tid(t), 0, 0, 0, p as u64, false);
        }
        t.busy.set(false);
    })
}

/// Counts `bytes` freed at `p` (null: a block shrunk in place).
#[inline(always)]
fn on_free(p: *mut c_void, bytes: usize) {
    tls::with(|t| {
        if t.busy.get() {
            return;
        }
        let sampled = unwatch(p as usize);
        let freed = t.freed.get() + bytes as u64;
        if sampled || freed >= ring::WINDOW.load(Ordering::Relaxed) {
            free_sampled(t, p, sampled, freed);
        } else {
            t.freed.set(freed);
        }
    })
}

/// The sampled (rare) part of [`on_free`], run when a watched block was freed or the free
/// window is full.
#[cold]
#[inline(never)]
fn free_sampled(t: &ThreadState, p: *mut c_void, sampled: bool, freed: u64) {
    t.busy.set(true);
    if sampled {
        ring::emit(layout::EV_SAMPLED_FREE, tid(t), 0, 0, 0, p as u64, false);
    }
    if freed >= ring::WINDOW.load(Ordering::Relaxed) {
        ring::footprint(-(freed as i64));
        ring::emit(layout::EV_FREE, tid(t), freed, 0, 0, 0, false);
        t.freed.set(0);
    } else {
        t.freed.set(freed);
    }
    t.busy.set(false);
}

/// Counts `n` bytes copied.
#[inline(always)]
fn on_copy(n: usize) {
    tls::with(|t| {
        if t.busy.get() {
            return;
        }
        let c = t.copied.get() + n as u64;
        if c >= ring::COPY_WINDOW.load(Ordering::Relaxed) {
            copy_window_full(t, c);
        } else {
            t.copied.set(c);
        }
    })
}

/// The sampled (rare) part of [`on_copy`].
#[cold]
#[inline(never)]
fn copy_window_full(t: &ThreadState, copied: u64) {
    t.busy.set(true);
    t.copied.set(0);
    let wait = handshake_allowed(&t.credit, &t.credit_at);
    let answered = ring::emit(layout::EV_COPY, tid(t), copied, 0, 0, 0, wait);
    spend(&t.credit, answered);
    t.busy.set(false);
}

// ---- Sampled allocations: a small lock-free table of pointers. ----
//
// A pointer lives in one bucket of 8 slots, one aligned cache line. Every free of the
// program asks whether its pointer is watched, so the answer must usually come without
// touching the table (32 KiB, cold, so it would cost a cache miss per free).
//
// A 4 KiB filter counts, per 12-bit hash, the pointers watched under it. The count is never
// fewer than are there, because it is raised before an insertion and lowered after a
// removal. Only a non-zero count sends the free to the bucket.

const WATCH_SLOTS: usize = 4096;
const BUCKET: usize = 8;
static WATCHED: AtomicUsize = AtomicUsize::new(0);
#[repr(C, align(64))]
struct Table([AtomicUsize; WATCH_SLOTS]);
#[allow(clippy::declare_interior_mutable_const)]
const EMPTY: AtomicUsize = AtomicUsize::new(0);
static TABLE: Table = Table([EMPTY; WATCH_SLOTS]);
#[repr(C, align(64))]
struct Filter([AtomicU8; WATCH_SLOTS]);
#[allow(clippy::declare_interior_mutable_const)]
const ZERO: AtomicU8 = AtomicU8::new(0);
static FILTER: Filter = Filter([ZERO; WATCH_SLOTS]);

/// `p`'s 12-bit hash, which is its filter entry. Its bucket starts at the hash with the low
/// 3 bits cleared.
#[inline(always)]
fn hash(p: usize) -> usize {
    (p >> 4).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (usize::BITS - 12)
}

/// Forgets every watched pointer (for an attach, because the pointers of an earlier one's
/// ring mean nothing to the new profiler). Counting is off meanwhile. A concurrent `unwatch`
/// of the same pointer and this clear take it out once between them (both swap it for 0).
pub(crate) fn clear_watches() {
    if WATCHED.load(Ordering::Acquire) == 0 {
        return;
    }
    for s in &TABLE.0 {
        let p = s.swap(0, Ordering::AcqRel);
        if p != 0 {
            FILTER.0[hash(p)].fetch_sub(1, Ordering::AcqRel);
            WATCHED.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

fn watch(p: usize) -> bool {
    if p == 0 {
        return false;
    }
    let h = hash(p);
    FILTER.0[h].fetch_add(1, Ordering::AcqRel);
    let b = h & !(BUCKET - 1);
    for s in &TABLE.0[b..b + BUCKET] {
        if s.compare_exchange(0, p, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            WATCHED.fetch_add(1, Ordering::Relaxed);
            return true;
        }
    }
    FILTER.0[h].fetch_sub(1, Ordering::AcqRel);
    false
}

#[inline(always)]
fn unwatch(p: usize) -> bool {
    if WATCHED.load(Ordering::Relaxed) == 0 || p == 0 {
        return false;
    }
    let h = hash(p);
    if FILTER.0[h].load(Ordering::Acquire) == 0 {
        return false;
    }
    unwatch_slow(p, h)
}

#[cold]
#[inline(never)]
fn unwatch_slow(p: usize, h: usize) -> bool {
    let b = h & !(BUCKET - 1);
    for s in &TABLE.0[b..b + BUCKET] {
        if s.load(Ordering::Relaxed) == p
            && s.compare_exchange(p, 0, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        {
            FILTER.0[h].fetch_sub(1, Ordering::AcqRel);
            WATCHED.fetch_sub(1, Ordering::Relaxed);
            return true;
        }
    }
    false
}

// ---- Entry points. ----

#[inline(always)]
fn usable(p: *mut c_void) -> usize {
    if real::is_boot(p) {
        real::boot_size(p)
    } else {
        real::block_size(p)
    }
}

fn malloc_impl(size: usize, ret: usize) -> *mut c_void {
    let p = real::malloc(size);
    if !p.is_null() && active() {
        on_alloc(p, usable(p), ret);
    }
    p
}

fn calloc_impl(n: usize, size: usize, ret: usize) -> *mut c_void {
    let p = real::calloc(n, size);
    if !p.is_null() && active() {
        on_alloc(p, usable(p), ret);
    }
    p
}

fn realloc_impl(p: *mut c_void, size: usize, ret: usize) -> *mut c_void {
    if p.is_null() {
        return malloc_impl(size, ret);
    }
    if real::is_boot(p) {
        // Never hand a bootstrap pointer to the real allocator. Move it out instead.
        let q = real::malloc(size);
        if !q.is_null() {
            real::memcpy(q, p, real::boot_size(p).min(size));
            if active() {
                on_alloc(q, usable(q), ret);
            }
        }
        return q;
    }
    if !active() {
        return real::realloc(p, size);
    }
    let old = usable(p);
    let q = real::realloc(p, size);
    if size == 0 && q.is_null() {
        // realloc(p, 0) freed p.
        on_free(p, old);
        return q;
    }
    if q.is_null() {
        return q;
    }
    let new = usable(q);
    if q == p {
        // Grown or shrunk in place, so only the difference moved.
        if new >= old {
            on_alloc(q, new - old, ret);
        } else {
            on_free_in_place(old - new);
        }
    } else {
        // Moved. The block lives on elsewhere (a watch on it follows it), its contents
        // copied. What it held was counted when it was allocated, so only the growth is new
        // memory (or the shrinkage freed), as in place. Counting the whole new block
        // again counted those bytes twice in a line's live memory (a growing list's
        // array: 130 MB on a line that kept 87).
        on_move(p, q);
        if new >= old {
            on_alloc(q, new - old, ret);
        } else {
            on_free_in_place(old - new);
        }
        on_copy(old.min(size));
    }
    q
}

/// A block shrunk in place. Fewer bytes are held, and the block itself is still live (and
/// watched).
fn on_free_in_place(bytes: usize) {
    on_free(core::ptr::null_mut(), bytes)
}

fn reallocarray_impl(p: *mut c_void, n: usize, size: usize, ret: usize) -> *mut c_void {
    match n.checked_mul(size) {
        Some(total) => realloc_impl(p, total, ret),
        // Let the real function report the overflow (ENOMEM).
        None => real::reallocarray(p, n, size),
    }
}

fn posix_memalign_impl(out: *mut *mut c_void, align: usize, size: usize, ret: usize) -> i32 {
    let r = real::posix_memalign(out, align, size);
    if r == 0 && active() {
        // SAFETY: on success posix_memalign stored the block's address through `out`.
        let p = unsafe { *out };
        on_alloc(p, usable(p), ret);
    }
    r
}

fn aligned_alloc_impl(align: usize, size: usize, ret: usize) -> *mut c_void {
    let p = real::aligned_alloc(align, size);
    if !p.is_null() && active() {
        on_alloc(p, usable(p), ret);
    }
    p
}

fn memalign_impl(align: usize, size: usize, ret: usize) -> *mut c_void {
    let p = real::memalign(align, size);
    if !p.is_null() && active() {
        on_alloc(p, usable(p), ret);
    }
    p
}

fn valloc_impl(size: usize, ret: usize) -> *mut c_void {
    let p = real::valloc(size);
    if !p.is_null() && active() {
        on_alloc(p, usable(p), ret);
    }
    p
}

fn pvalloc_impl(size: usize, ret: usize) -> *mut c_void {
    let p = real::pvalloc(size);
    if !p.is_null() && active() {
        on_alloc(p, usable(p), ret);
    }
    p
}

#[no_mangle]
pub extern "C" fn free(p: *mut c_void) {
    if p.is_null() || real::is_boot(p) {
        return;
    }
    if active() {
        on_free(p, real::block_size(p));
    }
    real::free(p)
}

#[no_mangle]
pub extern "C" fn malloc_usable_size(p: *mut c_void) -> usize {
    if p.is_null() {
        return 0;
    }
    if real::is_boot(p) {
        real::boot_size(p)
    } else {
        real::usable_size(p)
    }
}

#[no_mangle]
pub extern "C" fn memcpy(d: *mut c_void, s: *const c_void, n: usize) -> *mut c_void {
    if active() {
        on_copy(n);
    }
    real::memcpy(d, s, n)
}

#[no_mangle]
pub extern "C" fn memmove(d: *mut c_void, s: *const c_void, n: usize) -> *mut c_void {
    if active() {
        on_copy(n);
    }
    real::memmove(d, s, n)
}

// The allocating entry points are thin trampolines that add their own return address as
// one more argument, so the implementation can tell whether the interpreter's image called.
macro_rules! trampoline {
    ($name:ident => $imp:ident, ($($arg:ident: $t:ty),*) -> $ret:ty, $x86_reg:literal, $arm_reg:literal) => {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the body only copies the return address into the next free argument
        // register and tail-jumps to a C-ABI function that takes it as one more argument;
        // it touches no stack slot and no callee-saved register.
        #[unsafe(naked)]
        #[no_mangle]
        pub extern "C" fn $name($($arg: $t),*) -> $ret {
            // The return address is at [rsp] on entry; pass it as the next argument.
            core::arch::naked_asm!(
                concat!("mov ", $x86_reg, ", [rsp]"),
                "jmp {f}",
                f = sym $imp,
            )
        }

        #[cfg(target_arch = "aarch64")]
        // SAFETY: as above, with the link register as the return address.
        #[unsafe(naked)]
        #[no_mangle]
        pub extern "C" fn $name($($arg: $t),*) -> $ret {
            // The return address is in the link register on entry.
            core::arch::naked_asm!(
                concat!("mov ", $arm_reg, ", x30"),
                "b {f}",
                f = sym $imp,
            )
        }

        #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
        #[no_mangle]
        pub extern "C" fn $name($($arg: $t),*) -> $ret {
            $imp($($arg,)* 0)
        }
    };
}

trampoline!(malloc => malloc_shim, (size: usize) -> *mut c_void, "rsi", "x1");
trampoline!(calloc => calloc_shim, (n: usize, size: usize) -> *mut c_void, "rdx", "x2");
trampoline!(realloc => realloc_shim, (p: *mut c_void, size: usize) -> *mut c_void, "rdx", "x2");
trampoline!(reallocarray => reallocarray_shim,
    (p: *mut c_void, n: usize, size: usize) -> *mut c_void, "rcx", "x3");
trampoline!(posix_memalign => posix_memalign_shim,
    (out: *mut *mut c_void, align: usize, size: usize) -> i32, "rcx", "x3");
trampoline!(aligned_alloc => aligned_alloc_shim, (align: usize, size: usize) -> *mut c_void, "rdx", "x2");
trampoline!(memalign => memalign_shim, (align: usize, size: usize) -> *mut c_void, "rdx", "x2");
trampoline!(valloc => valloc_shim, (size: usize) -> *mut c_void, "rsi", "x1");
trampoline!(pvalloc => pvalloc_shim, (size: usize) -> *mut c_void, "rsi", "x1");

// The C-ABI targets of the trampolines (they take the return address as a last argument).
extern "C" fn malloc_shim(size: usize, ret: usize) -> *mut c_void {
    malloc_impl(size, ret)
}
extern "C" fn calloc_shim(n: usize, size: usize, ret: usize) -> *mut c_void {
    calloc_impl(n, size, ret)
}
extern "C" fn realloc_shim(p: *mut c_void, size: usize, ret: usize) -> *mut c_void {
    realloc_impl(p, size, ret)
}
extern "C" fn reallocarray_shim(p: *mut c_void, n: usize, size: usize, ret: usize) -> *mut c_void {
    reallocarray_impl(p, n, size, ret)
}
extern "C" fn posix_memalign_shim(
    out: *mut *mut c_void,
    align: usize,
    size: usize,
    ret: usize,
) -> i32 {
    posix_memalign_impl(out, align, size, ret)
}
extern "C" fn aligned_alloc_shim(align: usize, size: usize, ret: usize) -> *mut c_void {
    aligned_alloc_impl(align, size, ret)
}
extern "C" fn memalign_shim(align: usize, size: usize, ret: usize) -> *mut c_void {
    memalign_impl(align, size, ret)
}
extern "C" fn valloc_shim(size: usize, ret: usize) -> *mut c_void {
    valloc_impl(size, ret)
}
extern "C" fn pvalloc_shim(size: usize, ret: usize) -> *mut c_void {
    pvalloc_impl(size, ret)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watched_pointers_are_found_once() {
        let ptrs: Vec<usize> = (1..=100).map(|i| 0x7f00_0000_0000 + i * 0x1010).collect();
        for &p in &ptrs {
            assert!(watch(p));
        }
        assert!(!unwatch(0x1234_5678));
        for &p in &ptrs {
            assert!(unwatch(p), "{p:#x}");
            assert!(!unwatch(p), "{p:#x} found twice");
        }
        assert_eq!(WATCHED.load(Ordering::Relaxed), 0);
        assert!(
            FILTER.0.iter().all(|c| c.load(Ordering::Relaxed) == 0),
            "the filter counts what the table holds"
        );
        assert!(!watch(0));
        // A full bucket. The pointer is not watched, and the filter says so.
        let h = hash(0x7f00_0000_0000);
        let same: Vec<usize> = (0..1usize << 20)
            .map(|i| 0x7f00_0000_0000 + (i << 4))
            .filter(|&p| hash(p) & !(BUCKET - 1) == h & !(BUCKET - 1))
            .take(BUCKET + 1)
            .collect();
        for &p in &same[..BUCKET] {
            assert!(watch(p));
        }
        assert!(!watch(same[BUCKET]), "the bucket is full");
        assert!(!unwatch(same[BUCKET]));
        for &p in &same[..BUCKET] {
            assert!(unwatch(p));
        }
        assert!(FILTER.0.iter().all(|c| c.load(Ordering::Relaxed) == 0));
        // A watched block moved by realloc stays watched at its new address (no ring here,
        // so the event goes nowhere). An unwatched one moving changes nothing.
        let (p, q) = (0x7f00_1000_0010usize, 0x7f00_2000_0020usize);
        assert!(watch(p));
        on_move(p as *mut c_void, q as *mut c_void);
        assert!(!unwatch(p), "the old address is no longer watched");
        assert!(unwatch(q), "the new one is");
        on_move(p as *mut c_void, q as *mut c_void);
        assert!(!unwatch(q));
        assert_eq!(WATCHED.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn block_sizes_read_from_glibc_headers_match_malloc_usable_size() {
        // The constructor ran in this test binary too, against glibc's allocator.
        real::check_glibc_chunks();
        assert_eq!(real::reads_glibc_chunks(), cfg!(target_env = "gnu"));
        for size in [0, 1, 17, 512, 4000, 200_000, 3 << 20] {
            let p = real::malloc(size);
            assert_eq!(real::block_size(p), real::usable_size(p), "{size}");
            let q = real::realloc(p, size * 2 + 1);
            assert_eq!(real::block_size(q), real::usable_size(q), "{size}");
            real::free(q);
        }
    }

    #[test]
    fn interposed_allocator_round_trips() {
        // This test binary itself runs on the interposed functions (idle: no ring).
        let p = malloc_impl(100, 0);
        assert!(!p.is_null());
        assert!(malloc_usable_size(p) >= 100);
        let q = realloc_impl(p, 1 << 20, 0);
        assert!(!q.is_null() && malloc_usable_size(q) >= 1 << 20);
        free(q);
        let mut out = core::ptr::null_mut();
        assert_eq!(posix_memalign_impl(&mut out, 4096, 10, 0), 0);
        assert_eq!(out as usize % 4096, 0);
        free(out);
    }
}
