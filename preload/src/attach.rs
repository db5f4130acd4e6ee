//! `attach` with memory. The library is loaded late into a running Python process. The
//! profiler makes one of its threads, stopped where it holds no lock, call `dlopen` and then
//! [`scalene_rs_attach`].
//!
//! Loaded late, the library's own `malloc` & co. interpose nothing, because every object
//! already bound its calls to the C library. So the attach rewrites GOT slots:
//! - which: the `JUMP_SLOT` and `GLOB_DAT` relocations of the allocation and copy
//!   functions, in every loaded object but the C library, the dynamic linker, the vDSO and
//!   this library;
//! - to what: this library's entry points, the same ones `run` interposes (the
//!   trampolines' return-address trick and all accounting are shared);
//! - `dlopen`'s slots point at a wrapper that patches the objects each successful `dlopen`
//!   brings in (extension modules imported later);
//! - how: each slot is one atomic word store. Its old value is kept in a bounded table and
//!   put back at the detach.
//!
//! The interpreter's own allocator is wrapped by a pending call (`pymem.rs`).
//!
//! The detach comes when the ring's `detached` is set or its heartbeat is stale. It is
//! noticed on the sampled paths (`ring::emit`) or by the next attach. Counting stops and
//! every slot is put back. The library stays loaded, because slots copied by threads just
//! before may still lead here and Python's allocator stays wrapped, passing through.
//!
//! Blocks allocated before the attach and freed after (or the other way round) are safe.
//! Every entry point forwards the very pointer to the very allocator the slot led to before
//! (glibc's). No wrapper adds a header or uses a heap of its own.
//!
//! What is not seen:
//! - calls inside the C library itself (strdup, fopen...; no PLT);
//! - function pointers to malloc copied before the attach;
//! - `memcpy` the compiler inlined;
//! - allocators linked statically into an object;
//! - objects loaded with `dlmopen`.
//!
//! Owns: late-load detection, the patch table and its lock, [`scalene_rs_attach`],
//! [`detach`].
//! Must not: allocate, lock or block in [`detach`], which runs inside the program's malloc.
//! Patching runs only in the attach and in the `dlopen` wrapper, never on allocator paths.

use crate::elf::{
    page_size, Dyn, Kind, Object, Rela, Sym, DT_JMPREL, DT_NULL, DT_PLTRELSZ, DT_RELA, DT_RELASZ,
    DT_STRSZ, DT_STRTAB, DT_SYMTAB, PT_DYNAMIC, R_GLOB_DAT, R_JUMP_SLOT,
};
use crate::{layout, maps, pymem, real, ring};
use core::ffi::{c_char, c_int, c_void, CStr};
use core::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};

/// The library was loaded after start-up (`dlopen`), not preloaded.
static LATE: AtomicBool = AtomicBool::new(false);

/// Whether the library was loaded late (set by the constructor, before anything else).
#[inline(always)]
pub fn loaded_late() -> bool {
    LATE.load(Ordering::Relaxed)
}

const IDLE: u8 = 0;
const ATTACHED: u8 = 1;
/// A detach is under way: counting stopped, the slots not yet all put back.
const DETACHING: u8 = 2;
static STATE: AtomicU8 = AtomicU8::new(IDLE);
/// A detach wants the slots put back (by whoever holds the patch lock).
static RESTORE_WANTED: AtomicBool = AtomicBool::new(false);
/// The patch lock: held while the table or the slots change.
static LOCK: AtomicBool = AtomicBool::new(false);

/// Attached and counting.
#[inline(always)]
pub fn attached() -> bool {
    STATE.load(Ordering::Relaxed) == ATTACHED
}

/// Called by the constructor, first. Decides whether the library was loaded late. The
/// object that holds this code comes before the C library in the link map when preloaded
/// (LD_PRELOAD objects are loaded before the executable's dependencies), after it when
/// loaded by `dlopen`.
pub fn detect_late_load() {
    let mut walk = Walk {
        us: self_addr(),
        ..Walk::default()
    };
    // SAFETY: the callback only reads the program headers dl_iterate_phdr hands it.
    unsafe { libc::dl_iterate_phdr(Some(order_cb), &mut walk as *mut Walk as *mut c_void) };
    LATE.store(
        matches!((walk.us_at, walk.libc_at), (Some(u), Some(c)) if u > c),
        Ordering::Relaxed,
    );
}

#[derive(Default)]
struct Walk {
    us: usize,
    index: usize,
    us_at: Option<usize>,
    libc_at: Option<usize>,
}

unsafe extern "C" fn order_cb(info: *mut libc::dl_phdr_info, _: usize, data: *mut c_void) -> c_int {
    // SAFETY: dl_iterate_phdr passes a valid info and our own `Walk`.
    let (info, walk) = unsafe { (&*info, &mut *(data as *mut Walk)) };
    let obj = Object::of(info);
    if walk.us_at.is_none() && obj.contains(walk.us) {
        walk.us_at = Some(walk.index);
    }
    if walk.libc_at.is_none() && obj.kind() == Kind::Libc {
        walk.libc_at = Some(walk.index);
    }
    walk.index += 1;
    0
}

/// An address inside this library's code.
fn self_addr() -> usize {
    detect_late_load as fn() as usize
}

// ---- What is patched, and to what ----

/// The functions patched, in the order of [`TARGETS`].
const NAMES: [&CStr; 16] = [
    c"malloc",
    c"calloc",
    c"realloc",
    c"reallocarray",
    c"free",
    c"posix_memalign",
    c"aligned_alloc",
    c"memalign",
    c"valloc",
    c"pvalloc",
    c"memcpy",
    c"memmove",
    c"mmap",
    c"mmap64",
    c"munmap",
    c"dlopen",
];
/// Where each of [`NAMES`] goes:
/// - this library's entry point of that name, found in this library's own symbol table,
///   because taking the address in Rust could go through the GOT, which in an object loaded
///   late says libc's;
/// - for `dlopen`, [`dlopen_wrapper`].
static TARGETS: [AtomicUsize; 16] = [const { AtomicUsize::new(0) }; 16];

/// Finds this library's entry points ([`TARGETS`]); false if one is missing or not ours.
fn find_targets() -> bool {
    if TARGETS[0].load(Ordering::Acquire) != 0 {
        return true;
    }
    // SAFETY: Dl_info is plain data; dladdr fills it or returns 0.
    let mut info: libc::Dl_info = unsafe { core::mem::zeroed() };
    // SAFETY: dladdr only looks an address of ours up.
    if unsafe { libc::dladdr(self_addr() as *const c_void, &mut info) } == 0
        || info.dli_fname.is_null()
    {
        return false;
    }
    // SAFETY: our own object, already loaded, so RTLD_NOLOAD only gives its handle (never
    // closed; the library is never unloaded anyway).
    let us = unsafe { libc::dlopen(info.dli_fname, libc::RTLD_NOLOAD | libc::RTLD_LAZY) };
    if us.is_null() {
        return false;
    }
    let ours = |a: usize| {
        // SAFETY: as above.
        let mut i: libc::Dl_info = unsafe { core::mem::zeroed() };
        // SAFETY: as above.
        let found = unsafe { libc::dladdr(a as *const c_void, &mut i) } != 0;
        found && i.dli_fbase == info.dli_fbase
    };
    let mut found = [0usize; 16];
    for (f, name) in found.iter_mut().zip(NAMES) {
        *f = if name == c"dlopen" {
            dlopen_wrapper as *const () as usize
        } else {
            // SAFETY: dlsym in our own handle (ourselves first) of a NUL-terminated name.
            unsafe { libc::dlsym(us, name.as_ptr()) as usize }
        };
        if *f == 0 || !ours(*f) {
            return false;
        }
    }
    for (t, f) in TARGETS.iter().zip(found) {
        t.store(f, Ordering::Release);
    }
    true
}

/// `dlopen`, then the new objects patched. Not exported under that name, so only the slots
/// we patch lead here. (The real `dlopen` sees this library as its caller, which only
/// matters for a relative name resolved through the caller's RPATH/RUNPATH.)
unsafe extern "C" fn dlopen_wrapper(file: *const c_char, mode: c_int) -> *mut c_void {
    // SAFETY: the caller's own arguments, to the real dlopen (our own GOT slot, never
    // patched, is bound to it).
    let h = unsafe { libc::dlopen(file, mode) };
    if !h.is_null() && attached() {
        lock();
        if attached() {
            patch_all();
        }
        unlock();
    }
    h
}

// ---- The patch table ----

const TABLE_MAX: usize = 8192;
/// Patched slots: address, old value, new value (each entry written under the lock, read
/// under it).
static SLOT_AT: [AtomicUsize; TABLE_MAX] = [const { AtomicUsize::new(0) }; TABLE_MAX];
static SLOT_OLD: [AtomicUsize; TABLE_MAX] = [const { AtomicUsize::new(0) }; TABLE_MAX];
static SLOT_NEW: [AtomicUsize; TABLE_MAX] = [const { AtomicUsize::new(0) }; TABLE_MAX];
static PATCHED: AtomicUsize = AtomicUsize::new(0);
/// Slots left alone because the table was full.
static OVERFLOW: AtomicUsize = AtomicUsize::new(0);

fn try_lock() -> bool {
    LOCK.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
        .is_ok()
}

/// Takes the patch lock (attach and the dlopen wrapper only, never an allocator path).
fn lock() {
    while !try_lock() {
        // SAFETY: sched_yield has no preconditions.
        unsafe { libc::sched_yield() };
    }
}

/// Releases the patch lock, first putting the slots back if a detach asked meanwhile
/// (a detach that finds the lock taken leaves that to the holder).
fn unlock() {
    loop {
        if RESTORE_WANTED.swap(false, Ordering::SeqCst) {
            restore_all();
            STATE.store(IDLE, Ordering::SeqCst);
        }
        LOCK.store(false, Ordering::SeqCst);
        if !RESTORE_WANTED.load(Ordering::SeqCst) || !try_lock() {
            return;
        }
    }
}

/// Makes the RELRO page of `slot` writable; false when that fails.
fn writable(slot: usize) -> bool {
    let page = page_size();
    // SAFETY: changes the protection of one RELRO page of a loaded object's data segment
    // (never code), to what it had before the dynamic linker made it read-only.
    unsafe {
        libc::mprotect(
            (slot & !(page - 1)) as *mut c_void,
            page,
            libc::PROT_READ | libc::PROT_WRITE,
        ) == 0
    }
}

/// Gives a RELRO page back its read-only protection.
fn read_only(slot: usize) {
    let page = page_size();
    // SAFETY: as in `writable`, back to what the dynamic linker set.
    unsafe { libc::mprotect((slot & !(page - 1)) as *mut c_void, page, libc::PROT_READ) };
}

/// Patches every loaded object (lock held).
fn patch_all() {
    let mut w = PatchWalk { us: self_addr() };
    // SAFETY: the callback reads the objects' dynamic sections and writes only GOT slots
    // of the functions above (see `patch_object`).
    unsafe { libc::dl_iterate_phdr(Some(patch_cb), &mut w as *mut PatchWalk as *mut c_void) };
}

struct PatchWalk {
    us: usize,
}

unsafe extern "C" fn patch_cb(info: *mut libc::dl_phdr_info, _: usize, data: *mut c_void) -> c_int {
    // SAFETY: dl_iterate_phdr passes a valid info and our own `PatchWalk`.
    let (info, w) = unsafe { (&*info, &*(data as *const PatchWalk)) };
    let obj = Object::of(info);
    if obj.kind() != Kind::Other || obj.contains(w.us) {
        return 0;
    }
    patch_object(&obj);
    0
}

/// A dynamic-section address. glibc relocates them in place for normal objects. An
/// unrelocated one is below the object's base.
fn at(base: usize, v: u64) -> usize {
    let v = v as usize;
    if v < base {
        v + base
    } else {
        v
    }
}

fn patch_object(obj: &Object) {
    let Some(dynamic) = obj.phdrs.iter().find(|p| p.p_type == PT_DYNAMIC) else {
        return;
    };
    let (mut symtab, mut strtab, mut strsz) = (0usize, 0usize, 0usize);
    let (mut jmprel, mut pltsz, mut rela, mut relasz) = (0usize, 0usize, 0usize, 0usize);
    let mut d = (obj.base + dynamic.p_vaddr as usize) as *const Dyn;
    for _ in 0..4096 {
        // SAFETY: the object's dynamic section, mapped, ended by DT_NULL.
        let e = unsafe { &*d };
        match e.tag {
            DT_NULL => break,
            DT_SYMTAB => symtab = at(obj.base, e.val),
            DT_STRTAB => strtab = at(obj.base, e.val),
            DT_STRSZ => strsz = e.val as usize,
            DT_JMPREL => jmprel = at(obj.base, e.val),
            DT_PLTRELSZ => pltsz = e.val as usize,
            DT_RELA => rela = at(obj.base, e.val),
            DT_RELASZ => relasz = e.val as usize,
            _ => {}
        }
        // SAFETY: the next entry of the same array (the loop stops at DT_NULL).
        d = unsafe { d.add(1) };
    }
    if symtab == 0 || strtab == 0 || strsz == 0 {
        return;
    }
    let relro = obj.relro();
    for (table, bytes) in [(jmprel, pltsz), (rela, relasz)] {
        if table == 0 {
            continue;
        }
        let n = bytes / core::mem::size_of::<Rela>();
        // SAFETY: the object's relocation table of `bytes` bytes, mapped read-only.
        let relocs = unsafe { core::slice::from_raw_parts(table as *const Rela, n) };
        for r in relocs {
            let kind = (r.info & 0xffff_ffff) as u32;
            if kind != R_JUMP_SLOT && kind != R_GLOB_DAT {
                continue;
            }
            let sym = (r.info >> 32) as usize;
            // SAFETY: the symbol its relocation names, in the object's symbol table.
            let name_at = unsafe { &*(symtab as *const Sym).add(sym) }.name as usize;
            if name_at >= strsz {
                continue;
            }
            // SAFETY: a NUL-terminated name inside the string table (`strsz` bytes).
            let name = unsafe { CStr::from_ptr((strtab + name_at) as *const c_char) };
            let Some(i) = NAMES.iter().position(|n| *n == name) else {
                continue;
            };
            let slot = obj.base + r.offset as usize;
            patch_slot(slot, TARGETS[i].load(Ordering::Acquire), relro);
        }
    }
}

/// Whether the page of `slot` is mapped (`msync` fails with ENOMEM where it is not),
/// probed without touching it or its protection.
fn mapped(slot: usize) -> bool {
    let page = page_size();
    // SAFETY: msync of one page only asks the kernel about it (MS_ASYNC schedules nothing
    // for anonymous or private pages). It fails harmlessly where nothing is mapped.
    unsafe { libc::msync((slot & !(page - 1)) as *mut c_void, page, libc::MS_ASYNC) == 0 }
}

/// Points `slot` at `new` and records its old value (lock held). A slot in the object's
/// RELRO range is made writable for the store and read-only again after; others are in
/// the object's writable data already (a GOT always is one or the other).
fn patch_slot(slot: usize, new: usize, relro: (usize, usize)) {
    if new == 0 || !slot.is_multiple_of(core::mem::size_of::<usize>()) {
        return;
    }
    let in_relro = slot >= relro.0 && slot < relro.1;
    if in_relro && !writable(slot) {
        return;
    }
    // SAFETY: a GOT slot of a loaded object, which is an aligned, mapped, writable word
    // that other threads read concurrently (one atomic store changes it).
    let cell = unsafe { AtomicUsize::from_ptr(slot as *mut usize) };
    let old = cell.load(Ordering::Acquire);
    let n = PATCHED.load(Ordering::Relaxed);
    if old != new {
        if n >= TABLE_MAX {
            OVERFLOW.fetch_add(1, Ordering::Relaxed);
        } else {
            // The low bit (slots are word-aligned) says the page is RELRO.
            SLOT_AT[n].store(slot | in_relro as usize, Ordering::Relaxed);
            SLOT_OLD[n].store(old, Ordering::Relaxed);
            SLOT_NEW[n].store(new, Ordering::Relaxed);
            PATCHED.store(n + 1, Ordering::Release);
            cell.store(new, Ordering::Release);
        }
    }
    if in_relro {
        read_only(slot);
    }
}

/// Puts every patched slot back (lock held, or taken by a detach). It is allocation-free
/// and takes no lock but ours, because it may run inside the program's malloc. A slot is
/// left alone when:
/// - its page is gone (its object unloaded by `dlclose`);
/// - it no longer holds our entry point (something else rewrote it, or the page is another
///   mapping now).
fn restore_all() {
    let n = PATCHED.load(Ordering::Acquire);
    for i in (0..n).rev() {
        let at = SLOT_AT[i].load(Ordering::Relaxed);
        let (slot, relro) = (at & !1, at & 1 != 0);
        let old = SLOT_OLD[i].load(Ordering::Relaxed);
        let new = SLOT_NEW[i].load(Ordering::Relaxed);
        if !mapped(slot) {
            continue;
        }
        // SAFETY: as in `patch_slot`, a mapped, aligned GOT word (read first; written only
        // once it is known to hold our entry point, made writable if RELRO).
        let cell = unsafe { AtomicUsize::from_ptr(slot as *mut usize) };
        if cell.load(Ordering::Acquire) != new || (relro && !writable(slot)) {
            continue;
        }
        let _ = cell.compare_exchange(new, old, Ordering::AcqRel, Ordering::Relaxed);
        if relro {
            read_only(slot);
        }
    }
    PATCHED.store(0, Ordering::Release);
}

/// Slots patched now, and slots left alone because the table was full (tests, reports).
#[allow(dead_code)]
pub fn patched() -> (usize, usize) {
    (
        PATCHED.load(Ordering::Relaxed),
        OVERFLOW.load(Ordering::Relaxed),
    )
}

// ---- Attach and detach ----

/// `int scalene_rs_attach(const char *ring_path, unsigned long how)` starts counting into
/// the ring at `ring_path` (a file of ours, mode 0600, made by the profiler) in this running
/// Python process.
/// - It is called by the profiler on a thread that holds no lock, after loading the library
///   with `dlopen`. It may be called again after a detach, with a new ring.
/// - For `how`, see [`layout::ATTACH_FROM_RUNNING_CODE`].
/// - It returns one of the `ATTACH_*` codes of `layout.rs`. On any code but
///   [`layout::ATTACH_OK`] nothing was changed.
///
/// # Safety
/// `ring_path` is a NUL-terminated path; the caller holds none of the C library's or the
/// dynamic linker's locks.
#[no_mangle]
pub unsafe extern "C" fn scalene_rs_attach(ring_path: *const c_char, how: u64) -> c_int {
    if !loaded_late() || another_copy_preloaded() {
        return layout::ATTACH_PRELOADED;
    }
    if pymem::is_free_threaded_build() {
        return layout::ATTACH_FREE_THREADED;
    }
    if !real::init() || !real::resolved() || foreign_allocator() || !find_targets() {
        return layout::ATTACH_NO_LIBC;
    }
    let Some((lo, hi)) = maps::interpreter_range() else {
        return layout::ATTACH_NOT_PYTHON;
    };
    if ring_path.is_null() {
        return layout::ATTACH_NO_RING;
    }
    lock();
    // With a previous attach, finish its detach, or refuse when its profiler still counts
    // on it (one profiler at a time).
    loop {
        match STATE.load(Ordering::SeqCst) {
            IDLE => break,
            DETACHING => {
                if RESTORE_WANTED.swap(false, Ordering::SeqCst) {
                    restore_all();
                    STATE.store(IDLE, Ordering::SeqCst);
                } else {
                    // Its detach is between two stores (a few instructions).
                    // SAFETY: sched_yield has no preconditions.
                    unsafe { libc::sched_yield() };
                }
            }
            _ => {
                if ring::current_ring_done() {
                    detach();
                } else {
                    unlock();
                    return layout::ATTACH_BUSY;
                }
            }
        }
    }
    crate::set_interpreter_range(lo, hi);
    crate::clear_watches();
    if !ring::open_attached(ring_path, (lo, hi), heap_in_use()) {
        unlock();
        return layout::ATTACH_NO_RING;
    }
    register_fork_handler();
    STATE.store(ATTACHED, Ordering::SeqCst);
    ring::ACTIVE.store(true, Ordering::Release);
    patch_all();
    unlock();
    schedule_pymem(how == layout::ATTACH_FROM_RUNNING_CODE);
    layout::ATTACH_OK
}

/// Stops counting and puts every patched slot back. Called when the attached ring's
/// profiler detached or is gone. Allocation-free and lock-free, because it runs inside the
/// program's malloc. When the patch lock is taken, its holder puts the slots back.
pub fn detach() {
    if STATE
        .compare_exchange(ATTACHED, DETACHING, Ordering::SeqCst, Ordering::SeqCst)
        .is_err()
    {
        return;
    }
    ring::ACTIVE.store(false, Ordering::SeqCst);
    ring::retire();
    RESTORE_WANTED.store(true, Ordering::SeqCst);
    if try_lock() {
        unlock();
    }
}

/// Another copy of the library, preloaded (the program runs under `run`, whose ring it
/// has). Its `scalene_rs_attach` is the global scope's; ours (loaded `RTLD_LOCAL`) is not.
fn another_copy_preloaded() -> bool {
    // SAFETY: dlsym with RTLD_DEFAULT and a NUL-terminated name.
    let p = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"scalene_rs_attach".as_ptr()) } as usize;
    // (Not compared with `scalene_rs_attach as usize`, because an exported function's
    // address taken here goes through our GOT, which says the global scope's, that is, the
    // other copy's.)
    p != 0 && !Object::is_ours(p)
}

impl Object<'_> {
    /// Whether `addr` is in this library.
    fn is_ours(addr: usize) -> bool {
        object_index(addr) == object_index(self_addr())
    }
}

/// The index in the link map of the object holding `addr`.
fn object_index(addr: usize) -> Option<usize> {
    struct Find {
        addr: usize,
        index: usize,
        found: Option<usize>,
    }
    unsafe extern "C" fn cb(info: *mut libc::dl_phdr_info, _: usize, data: *mut c_void) -> c_int {
        // SAFETY: dl_iterate_phdr passes a valid info and our own `Find`.
        let (info, f) = unsafe { (&*info, &mut *(data as *mut Find)) };
        if Object::of(info).contains(f.addr) {
            f.found = Some(f.index);
            return 1;
        }
        f.index += 1;
        0
    }
    let mut f = Find {
        addr,
        index: 0,
        found: None,
    };
    // SAFETY: the callback only reads program headers.
    unsafe { libc::dl_iterate_phdr(Some(cb), &mut f as *mut Find as *mut c_void) };
    f.found
}

/// The program's `malloc` is not the C library's (jemalloc, tcmalloc...). Forwarding
/// to glibc's would free their blocks into the wrong heap. The global scope's `malloc`
/// must be libc's, or the executable's own PLT stub (a non-PIE executable that takes
/// `malloc`'s address), which leads to it.
fn foreign_allocator() -> bool {
    // SAFETY: dlsym with RTLD_DEFAULT and a NUL-terminated name.
    let p = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"malloc".as_ptr()) } as usize;
    let real = real::MALLOC.load(Ordering::Acquire) as usize;
    !(p == real || object_index(p) == Some(0))
}

/// The C heap in use now (`mallinfo2`, else `mallinfo`), blocks in use plus mmapped ones.
/// It is where the footprint of an attach starts. pymalloc's arenas are not in it (they are
/// mmapped by the interpreter, not malloc), nor other allocators' heaps.
fn heap_in_use() -> i64 {
    let libc_h = real::libc_handle();
    if libc_h.is_null() {
        return 0;
    }
    #[repr(C)]
    #[derive(Default)]
    struct Info2 {
        arena: usize,
        ordblks: usize,
        smblks: usize,
        hblks: usize,
        hblkhd: usize,
        usmblks: usize,
        fsmblks: usize,
        uordblks: usize,
        fordblks: usize,
        keepcost: usize,
    }
    #[repr(C)]
    #[derive(Default)]
    struct Info {
        arena: c_int,
        ordblks: c_int,
        smblks: c_int,
        hblks: c_int,
        hblkhd: c_int,
        usmblks: c_int,
        fsmblks: c_int,
        uordblks: c_int,
        fordblks: c_int,
        keepcost: c_int,
    }
    // SAFETY: dlsym in libc's handle of NUL-terminated names.
    let (f2, f1) = unsafe {
        (
            libc::dlsym(libc_h, c"mallinfo2".as_ptr()),
            libc::dlsym(libc_h, c"mallinfo".as_ptr()),
        )
    };
    if !f2.is_null() {
        // SAFETY: glibc's `struct mallinfo2 mallinfo2(void)` (2.33+), returned by value.
        let i = unsafe { core::mem::transmute::<*mut c_void, extern "C" fn() -> Info2>(f2)() };
        return (i.uordblks + i.hblkhd).min(i64::MAX as usize) as i64;
    }
    if !f1.is_null() {
        // SAFETY: `struct mallinfo mallinfo(void)`, ints (they wrap above 2 GiB).
        let i = unsafe { core::mem::transmute::<*mut c_void, extern "C" fn() -> Info>(f1)() };
        return (i.uordblks as u32 as i64) + (i.hblkhd as u32 as i64);
    }
    0
}

/// Has the interpreter's allocator wrapped, with the GIL held, at its next pending call (on
/// its main thread). With the wrappers already in (an earlier attach), the ring is told at
/// once.
///
/// Called on a thread the profiler stopped while it ran the interpreter's own code
/// (`from_running_code`), which may hold the pending-call lock (a bytecode loop that
/// inlines its pending-call handling), `Py_AddPendingCall` would wait for itself for ever
/// on 3.8+, where it waits for that lock. There a short-lived thread of ours takes the GIL
/// (the interpreter hands it over within its switch interval) and wraps it. Before 3.8,
/// `Py_AddPendingCall` only tries the lock (and 3.6 may have no GIL yet to take).
fn schedule_pymem(from_running_code: bool) {
    if pymem::hooked() {
        ring::set_pymem_wrapped();
        return;
    }
    if !pymem::late_api() {
        return;
    }
    if from_running_code && pymem::python3_minor().is_some_and(|m| m >= 8) {
        pymem::with_gil_on_a_thread(wrap_pymem);
        return;
    }
    // SAFETY: dlsym with RTLD_DEFAULT and a NUL-terminated name.
    let add = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"Py_AddPendingCall".as_ptr()) };
    if add.is_null() {
        return;
    }
    type Add = unsafe extern "C" fn(extern "C" fn(*mut c_void) -> c_int, *mut c_void) -> c_int;
    // SAFETY: CPython's `int Py_AddPendingCall(int (*)(void *), void *)`, callable from any
    // thread without the GIL; the callback runs on the main thread with it.
    unsafe { core::mem::transmute::<*mut c_void, Add>(add)(wrap_pymem, core::ptr::null_mut()) };
}

/// The pending call (or [`pymem::with_gil_on_a_thread`]'s call). Wraps the interpreter's
/// allocator, if still attached. Returns 0 (no exception).
extern "C" fn wrap_pymem(_: *mut c_void) -> c_int {
    if attached() && pymem::install_late() {
        ring::set_pymem_wrapped();
    }
    0
}

static FORK_HANDLER: AtomicBool = AtomicBool::new(false);

fn register_fork_handler() {
    if FORK_HANDLER.swap(true, Ordering::AcqRel) {
        return;
    }
    ring::register_fork_handler();
    // SAFETY: registering a plain function as the child's fork handler (runs after the
    // ring's, by registration order).
    unsafe { libc::pthread_atfork(None, None, Some(after_fork_in_child)) };
}

/// A forked child counts nothing (the ring is the parent's, dropped by the ring's handler),
/// so its slots go back. It runs on one thread, inside `fork`, so the lock a parent's thread
/// held is void.
extern "C" fn after_fork_in_child() {
    if STATE.swap(IDLE, Ordering::SeqCst) == IDLE {
        return;
    }
    RESTORE_WANTED.store(false, Ordering::SeqCst);
    restore_all();
    LOCK.store(false, Ordering::SeqCst);
}
