//! The real allocator and copy functions, and the bootstrap heap that serves allocations
//! made while they are being found (glibc's dlsym may call calloc for its error buffer).
//!
//! The real functions are found:
//! - with `dlsym(RTLD_NEXT, ...)` when the library was preloaded;
//! - in the C library's own handle when it was loaded late (`attach`). RTLD_NEXT then finds
//!   nothing after us, and RTLD_DEFAULT may find a non-PIE executable's `malloc` stub, which
//!   jumps through a slot we patch, to ourselves.
//!
//! Owns:
//! - resolution once;
//! - the real function pointers;
//! - the static bootstrap buffer;
//! - [`block_size`]: a block's usable size read from glibc's chunk header when the real
//!   allocator is glibc's (checked once, see [`check_glibc_chunks`]).
//!
//! Must not: account or sample anything (that is `lib.rs`), or ever hand a bootstrap
//! pointer to the real `free`.

use core::ffi::c_void;
use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicU8, AtomicUsize, Ordering};

type Fn1 = unsafe extern "C" fn(usize) -> *mut c_void;
type Fn2 = unsafe extern "C" fn(usize, usize) -> *mut c_void;
type ReallocFn = unsafe extern "C" fn(*mut c_void, usize) -> *mut c_void;
type ReallocArrayFn = unsafe extern "C" fn(*mut c_void, usize, usize) -> *mut c_void;
type FreeFn = unsafe extern "C" fn(*mut c_void);
type PosixMemalignFn = unsafe extern "C" fn(*mut *mut c_void, usize, usize) -> i32;
type UsableFn = unsafe extern "C" fn(*mut c_void) -> usize;
type CopyFn = unsafe extern "C" fn(*mut c_void, *const c_void, usize) -> *mut c_void;
type MmapFn = unsafe extern "C" fn(*mut c_void, usize, i32, i32, i32, i64) -> *mut c_void;
type MunmapFn = unsafe extern "C" fn(*mut c_void, usize) -> i32;

macro_rules! slots {
    ($($name:ident),*) => {
        $(pub static $name: AtomicPtr<c_void> = AtomicPtr::new(core::ptr::null_mut());)*
    };
}
slots!(
    MALLOC,
    CALLOC,
    REALLOC,
    REALLOCARRAY,
    FREE,
    POSIX_MEMALIGN,
    ALIGNED_ALLOC,
    MEMALIGN,
    VALLOC,
    PVALLOC,
    USABLE,
    MEMCPY,
    MEMMOVE,
    MMAP,
    MMAP64,
    MUNMAP
);

/// 0 = not resolved, 1 = resolving, 2 = resolved.
static STATE: AtomicU8 = AtomicU8::new(0);

/// Resolves every real function once. Returns whether they are resolved (false while
/// another call is resolving them, e.g. dlsym calling calloc).
#[cold]
pub fn init() -> bool {
    match STATE.compare_exchange(0, 1, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => {}
        Err(2) => return true,
        Err(_) => return false,
    }
    let handle = if crate::attach::loaded_late() {
        let h = libc_handle();
        if h.is_null() {
            // Nothing to resolve from. A later call (the attach) may try again.
            STATE.store(0, Ordering::Release);
            return false;
        }
        h
    } else {
        libc::RTLD_NEXT
    };
    let find = |slot: &AtomicPtr<c_void>, name: &core::ffi::CStr| {
        // SAFETY: dlsym with RTLD_NEXT or a live handle and a NUL-terminated name has no
        // other requirement.
        let p = unsafe { libc::dlsym(handle, name.as_ptr()) };
        slot.store(p, Ordering::Release);
    };
    find(&MEMCPY, c"memcpy");
    find(&MEMMOVE, c"memmove");
    find(&MMAP, c"mmap");
    find(&MMAP64, c"mmap64");
    find(&MUNMAP, c"munmap");
    find(&MALLOC, c"malloc");
    find(&CALLOC, c"calloc");
    find(&REALLOC, c"realloc");
    find(&REALLOCARRAY, c"reallocarray");
    find(&FREE, c"free");
    find(&POSIX_MEMALIGN, c"posix_memalign");
    find(&ALIGNED_ALLOC, c"aligned_alloc");
    find(&MEMALIGN, c"memalign");
    find(&VALLOC, c"valloc");
    find(&PVALLOC, c"pvalloc");
    find(&USABLE, c"malloc_usable_size");
    STATE.store(2, Ordering::Release);
    true
}

/// The C library's handle (never closed), or null. It is glibc's `libc.so.6`, else
/// `libc.so`.
pub fn libc_handle() -> *mut c_void {
    for name in [c"libc.so.6", c"libc.so"] {
        // SAFETY: dlopen of a NUL-terminated name that only looks the object up
        // (RTLD_NOLOAD), so it loads nothing and runs no constructor.
        let h = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOLOAD | libc::RTLD_LAZY) };
        if !h.is_null() {
            return h;
        }
    }
    core::ptr::null_mut()
}

/// Whether every function the entry points forward to was found (`attach` patches nothing
/// otherwise).
pub fn resolved() -> bool {
    [
        &MALLOC,
        &CALLOC,
        &REALLOC,
        &FREE,
        &POSIX_MEMALIGN,
        &MEMALIGN,
        &USABLE,
        &MEMCPY,
        &MEMMOVE,
        &MMAP,
        &MUNMAP,
    ]
    .iter()
    .all(|s| !s.load(Ordering::Acquire).is_null())
}

#[inline(always)]
fn get(slot: &AtomicPtr<c_void>) -> *mut c_void {
    let p = slot.load(Ordering::Acquire);
    if p.is_null() && init() {
        return slot.load(Ordering::Acquire);
    }
    p
}

macro_rules! caller {
    ($fname:ident, $slot:ident, $ty:ty, ($($arg:ident: $t:ty),*) -> $ret:ty, $fallback:expr) => {
        #[inline(always)]
        pub fn $fname($($arg: $t),*) -> $ret {
            let p = get(&$slot);
            if p.is_null() {
                return $fallback;
            }
            // SAFETY: `p` is the address dlsym gave for this very function, whose C
            // signature `$ty` spells; the arguments are the caller's, passed on unchanged.
            unsafe { core::mem::transmute::<*mut c_void, $ty>(p)($($arg),*) }
        }
    };
}

caller!(malloc, MALLOC, Fn1, (size: usize) -> *mut c_void, boot_alloc(size, 16));
caller!(calloc, CALLOC, Fn2, (n: usize, size: usize) -> *mut c_void,
    match n.checked_mul(size) { Some(t) => boot_alloc(t, 16), None => core::ptr::null_mut() });
caller!(realloc, REALLOC, ReallocFn, (p: *mut c_void, size: usize) -> *mut c_void,
    boot_realloc(p, size));
caller!(reallocarray, REALLOCARRAY, ReallocArrayFn, (p: *mut c_void, n: usize, size: usize) -> *mut c_void,
    match n.checked_mul(size) { Some(t) => boot_realloc(p, t), None => core::ptr::null_mut() });
/// The real `free`; before resolution nothing can have been allocated by it.
#[inline(always)]
pub fn free(p: *mut c_void) {
    let f = get(&FREE);
    if !f.is_null() {
        // SAFETY: `f` is dlsym's address of `free`, whose C signature FreeFn spells.
        unsafe { core::mem::transmute::<*mut c_void, FreeFn>(f)(p) }
    }
}
caller!(posix_memalign, POSIX_MEMALIGN, PosixMemalignFn,
(out: *mut *mut c_void, align: usize, size: usize) -> i32,
{
    let p = boot_alloc(size, align);
    if p.is_null() { libc::ENOMEM } else {
        // SAFETY: the caller passes a valid out pointer, as posix_memalign requires.
        unsafe { *out = p };
        0
    }
});
caller!(aligned_alloc, ALIGNED_ALLOC, Fn2, (align: usize, size: usize) -> *mut c_void, boot_alloc(size, align));
caller!(memalign, MEMALIGN, Fn2, (align: usize, size: usize) -> *mut c_void, boot_alloc(size, align));
caller!(valloc, VALLOC, Fn1, (size: usize) -> *mut c_void, boot_alloc(size, 4096));
caller!(pvalloc, PVALLOC, Fn1, (size: usize) -> *mut c_void, boot_alloc(size, 4096));
caller!(usable_size, USABLE, UsableFn, (p: *mut c_void) -> usize, 0);

/// The real allocator is glibc's and its chunk headers read as [`block_size`] expects.
static GLIBC_CHUNKS: AtomicBool = AtomicBool::new(false);

/// The usable size of a live block of the real allocator (what `malloc_usable_size` says).
/// With glibc's allocator it is read from the chunk header in front of the block (the size
/// word: chunk size | flags, 2 = mmapped). That is the same word glibc's own
/// `malloc_usable_size` reads, without the call through a pointer and the look at the next
/// chunk's header it also makes (which only matters for a block that is not live). Every
/// block this is asked about is live, just returned by the allocator or about to be freed.
#[inline(always)]
pub fn block_size(p: *mut c_void) -> usize {
    if GLIBC_CHUNKS.load(Ordering::Relaxed) {
        // SAFETY: `p` is a live block of glibc's allocator (see above), which always keeps
        // its chunk's size word in the 8 bytes before the block.
        let word = unsafe { (p as *const usize).sub(1).read() };
        chunk_usable(word)
    } else {
        usable_size(p)
    }
}

/// Whether [`block_size`] reads glibc's chunk headers.
#[cfg(test)]
pub fn reads_glibc_chunks() -> bool {
    GLIBC_CHUNKS.load(Ordering::Relaxed)
}

/// glibc: a chunk's usable bytes from its size word (mmapped chunks have a two-word header,
/// others use the next chunk's first word as well).
#[inline(always)]
fn chunk_usable(word: usize) -> usize {
    let size = word & !7;
    let overhead = if word & 2 != 0 {
        2 * core::mem::size_of::<usize>()
    } else {
        core::mem::size_of::<usize>()
    };
    size.saturating_sub(overhead)
}

/// Turns [`block_size`]'s header reading on when the real `malloc` and
/// `malloc_usable_size` are glibc's (in libc.so) and agree with the header on blocks of
/// every kind (small, large, mmapped, aligned, calloc'd). Called once from the constructor,
/// after [`init`]. Anything unexpected leaves the plain call to `malloc_usable_size`.
#[cold]
pub fn check_glibc_chunks() {
    let in_libc = |f: *mut c_void| {
        // SAFETY: Dl_info is plain data; dladdr fills it or returns 0.
        let mut info: libc::Dl_info = unsafe { core::mem::zeroed() };
        // SAFETY: dladdr only looks `f` up among the loaded objects.
        if f.is_null() || unsafe { libc::dladdr(f, &mut info) } == 0 || info.dli_fname.is_null() {
            return false;
        }
        // SAFETY: dli_fname is a NUL-terminated path owned by the dynamic linker.
        let path = unsafe { core::ffi::CStr::from_ptr(info.dli_fname) }.to_bytes();
        let base = path.rsplit(|&c| c == b'/').next().unwrap_or(path);
        base.starts_with(b"libc.so") || base.starts_with(b"libc-2.")
    };
    if !in_libc(MALLOC.load(Ordering::Acquire)) || !in_libc(USABLE.load(Ordering::Acquire)) {
        return;
    }
    let agrees = |p: *mut c_void| {
        if p.is_null() {
            return true;
        }
        // SAFETY: `p` was just returned by glibc's allocator.
        let word = unsafe { (p as *const usize).sub(1).read() };
        let ok = chunk_usable(word) == usable_size(p);
        free(p);
        ok
    };
    let mut ok = true;
    for size in [1, 24, 100, 1000, 5000, 70_000, 1 << 20, 4 << 20] {
        ok &= agrees(malloc(size));
        ok &= agrees(calloc(1, size));
        ok &= agrees(memalign(64, size));
        ok &= agrees(aligned_alloc(4096, size.next_multiple_of(4096)));
    }
    GLIBC_CHUNKS.store(ok, Ordering::Relaxed);
}
caller!(memcpy, MEMCPY, CopyFn, (d: *mut c_void, s: *const c_void, n: usize) -> *mut c_void,
    slow_copy(d, s, n));
caller!(memmove, MEMMOVE, CopyFn, (d: *mut c_void, s: *const c_void, n: usize) -> *mut c_void,
    slow_copy(d, s, n));

caller!(mmap, MMAP, MmapFn,
    (addr: *mut c_void, len: usize, prot: i32, flags: i32, fd: i32, off: i64) -> *mut c_void,
    sys_mmap(addr, len, prot, flags, fd, off));
caller!(mmap64, MMAP64, MmapFn,
    (addr: *mut c_void, len: usize, prot: i32, flags: i32, fd: i32, off: i64) -> *mut c_void,
    sys_mmap(addr, len, prot, flags, fd, off));
caller!(munmap, MUNMAP, MunmapFn, (addr: *mut c_void, len: usize) -> i32, sys_munmap(addr, len));

/// mmap without libc's wrapper, for calls made before the real function is known (glibc's
/// `syscall` returns -1 = MAP_FAILED and sets errno on failure).
fn sys_mmap(
    addr: *mut c_void,
    len: usize,
    prot: i32,
    flags: i32,
    fd: i32,
    off: i64,
) -> *mut c_void {
    // SAFETY: the caller's own arguments, passed to the kernel unchanged.
    unsafe { libc::syscall(libc::SYS_mmap, addr, len, prot, flags, fd, off) as *mut c_void }
}

/// munmap without libc's wrapper, for calls made before the real function is known.
fn sys_munmap(addr: *mut c_void, len: usize) -> i32 {
    // SAFETY: the caller's own arguments, passed to the kernel unchanged.
    unsafe { libc::syscall(libc::SYS_munmap, addr, len) as i32 }
}

/// Byte-by-byte copy for calls made before the real functions are known. Volatile
/// accesses keep the compiler from turning this loop back into a call to memcpy.
fn slow_copy(d: *mut c_void, s: *const c_void, n: usize) -> *mut c_void {
    let (d8, s8) = (d as *mut u8, s as *const u8);
    if (d8 as usize) <= (s8 as usize) {
        for i in 0..n {
            // SAFETY: the caller guarantees `n` readable bytes at `s` and writable at `d`.
            unsafe { d8.add(i).write_volatile(s8.add(i).read_volatile()) };
        }
    } else {
        for i in (0..n).rev() {
            // SAFETY: as above; copying backwards keeps overlapping moves right.
            unsafe { d8.add(i).write_volatile(s8.add(i).read_volatile()) };
        }
    }
    d
}

const BOOT_BYTES: usize = 256 * 1024;
#[repr(C, align(4096))]
struct BootHeap(core::cell::UnsafeCell<[u8; BOOT_BYTES]>);
// SAFETY: the buffer is handed out in disjoint pieces by an atomic bump pointer.
unsafe impl Sync for BootHeap {}
static BOOT: BootHeap = BootHeap(core::cell::UnsafeCell::new([0; BOOT_BYTES]));
static BOOT_USED: AtomicUsize = AtomicUsize::new(0);

/// Whether `p` was handed out by the bootstrap heap (such pointers are never freed).
#[inline(always)]
pub fn is_boot(p: *const c_void) -> bool {
    let base = BOOT.0.get() as usize;
    (p as usize).wrapping_sub(base) < BOOT_BYTES
}

/// The size recorded in front of a bootstrap allocation.
pub fn boot_size(p: *const c_void) -> usize {
    // SAFETY: every bootstrap allocation has its size in the 8 bytes before it.
    unsafe { (p as *const usize).sub(1).read() }
}

fn boot_alloc(size: usize, align: usize) -> *mut c_void {
    let align = align.clamp(16, 4096);
    if !align.is_power_of_two() {
        return core::ptr::null_mut();
    }
    let base = BOOT.0.get() as usize;
    let mut used = BOOT_USED.load(Ordering::Relaxed);
    loop {
        let start = (base + used + 8 + align - 1) & !(align - 1);
        let end = start + size;
        if end > base + BOOT_BYTES {
            return core::ptr::null_mut();
        }
        match BOOT_USED.compare_exchange_weak(used, end - base, Ordering::AcqRel, Ordering::Relaxed)
        {
            Ok(_) => {
                // SAFETY: [start - 8, end) lies inside the buffer and is ours alone now.
                unsafe { (start as *mut usize).sub(1).write(size) };
                return start as *mut c_void;
            }
            Err(u) => used = u,
        }
    }
}

fn boot_realloc(p: *mut c_void, size: usize) -> *mut c_void {
    let q = boot_alloc(size, 16);
    if !q.is_null() && !p.is_null() && is_boot(p) {
        slow_copy(q, p, boot_size(p).min(size));
    }
    q
}
