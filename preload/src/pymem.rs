//! Python's own allocator, wrapped. On CPython 3.8+ the library wraps the interpreter's
//! `PYMEM_DOMAIN_MEM` and `PYMEM_DOMAIN_OBJ` allocators (pymalloc) before `main`, with
//! `PyMem_SetAllocator`, so that every object the interpreter allocates is counted while
//! pymalloc goes on serving it. `PYTHONMALLOC=malloc` sends every object through glibc's
//! malloc instead, which is much slower on small objects than pymalloc. The wrappers cost
//! an indirect call and a few additions each (docs/benchmarks.md has the figures).
//!
//! What is counted where, with the wrappers on:
//! - a request of up to [`SMALL`] bytes (pymalloc serves those from its pools): its size,
//!   as the interpreter's, into the thread's allocation window; not into the footprint,
//!   since its free is not sized (pymalloc has no public way to tell a block's size);
//! - larger requests: pymalloc hands them to the C allocator, whose interposed entry
//!   points count them as before (the caller is the interpreter's image, hence Python);
//! - the footprint of small objects: the arenas pymalloc maps for them (`arenas.rs`), as
//!   under `--keep-pymalloc`, one arena at a time;
//! - a sampled (watched) small object's free: reported as before, so a line's live memory
//!   and the leak score work as with malloc.
//!
//! Why before `main` is safe:
//! - the interpreter allocates nothing through these two domains before its
//!   pre-initialisation (that is when it may switch allocators itself, so it cannot);
//! - on 3.8+ pre-initialisation leaves the allocators alone unless `PYTHONMALLOC` or the
//!   development mode asks for others. In that case ours are replaced before any block went
//!   through them, and only the counting of small objects is lost.
//!
//! The choice is the profiler's (`run` sets [`layout::PYMEM_ENV`] to `hook` along with
//! `PYTHONMALLOC=malloc`):
//! - where the wrappers go in, this process drops that `PYTHONMALLOC`;
//! - where they cannot (2.7, 3.6, 3.7, a program that is not Python), it sets
//!   `PYTHONMALLOC=malloc` for itself and whatever it starts.
//!
//! So a Python child of any version gets one or the other.
//!
//! Free-threaded builds (3.13t+) serve objects with mimalloc, whose heaps the garbage
//! collector walks, and refuse to start with `PYTHONMALLOC=malloc`. There the library drops
//! the `PYTHONMALLOC=malloc` that `run` set (whatever the mode), and the wrappers forward
//! every request to mimalloc on the calling thread (the heap it picked for the object's
//! kind is untouched, so the collector still finds every object). mimalloc serves large
//! requests itself (from its own mappings, not malloc), so there the wrappers count every
//! request, whatever its size.
//!
//! Loaded late (`attach`), the library wraps the same two domains from a pending call
//! (`Py_AddPendingCall`, which runs on the main thread with the thread state attached),
//! on 3.6+. The wrappers stay for the life of the process and pass every call through
//! while nothing is attached. RAW is never wrapped live (any thread may call it without
//! the GIL; its calls reach malloc, which the patched GOT slots count).
//!
//! Owns: the wrappers, their installation, and the environment decision above.
//! Must not: allocate, lock, or touch a block's bytes.

use crate::{active, layout, on_alloc_mimalloc, on_alloc_small, on_free_small, on_move, tls};
use core::cell::UnsafeCell;
use core::ffi::{c_int, c_void};
use core::sync::atomic::{AtomicBool, Ordering};

/// pymalloc's threshold (`SMALL_REQUEST_THRESHOLD`, 512 on every 3.x). Larger requests go
/// to the C allocator.
pub const SMALL: usize = 512;

/// `PyMemAllocatorEx` (3.5+).
#[repr(C)]
#[derive(Clone, Copy)]
struct Allocator {
    ctx: *mut c_void,
    malloc: Option<unsafe extern "C" fn(*mut c_void, usize) -> *mut c_void>,
    calloc: Option<unsafe extern "C" fn(*mut c_void, usize, usize) -> *mut c_void>,
    realloc: Option<unsafe extern "C" fn(*mut c_void, *mut c_void, usize) -> *mut c_void>,
    free: Option<unsafe extern "C" fn(*mut c_void, *mut c_void)>,
}

const EMPTY: Allocator = Allocator {
    ctx: core::ptr::null_mut(),
    malloc: None,
    calloc: None,
    realloc: None,
    free: None,
};

/// The interpreter's own allocators of `PYMEM_DOMAIN_MEM` (1) and `PYMEM_DOMAIN_OBJ` (2),
/// at [`MEM`] and [`OBJ`]. Each domain has wrappers of its own, which find what they wrap
/// here, not through `ctx` (see [`ours`]).
///
/// Written once, read-only afterwards. The one write is made:
/// - before `main` (one thread) when preloaded;
/// - or, loaded late (`attach`), by the pending call that installs the wrappers, on the
///   main thread with the thread state attached. The GIL is held, so no other thread uses
///   these two domains meanwhile, and those that do later take the GIL first, which orders
///   the writes before their reads.
///
/// Never written again once [`HOOKED`].
struct Slots(UnsafeCell<[Allocator; 2]>);
// SAFETY: written only once, by one thread, before the wrappers that read it are installed
// (see above); read-only after.
unsafe impl Sync for Slots {}
static SLOTS: Slots = Slots(UnsafeCell::new([EMPTY, EMPTY]));

/// [`SLOTS`]' index of each domain.
const MEM: usize = 0;
const OBJ: usize = 1;

/// The wrappers are in.
static HOOKED: AtomicBool = AtomicBool::new(false);

/// Whether the interpreter in this process is a free-threaded build. Only those export
/// the helpers of their split reference count.
pub fn is_free_threaded_build() -> bool {
    !symbol(c"_Py_MergeZeroLocalRefcount").is_null()
}

/// The interpreter in this process is a free-threaded build (set before main).
static FREE_THREADED: AtomicBool = AtomicBool::new(false);

/// Whether this process's interpreter is a free-threaded build, whose objects of every size
/// come from mimalloc and its own mappings (not pymalloc's arenas, not malloc; see
/// `arenas.rs`).
#[inline(always)]
pub fn mimalloc_maps() -> bool {
    FREE_THREADED.load(Ordering::Relaxed)
}

/// Requests up to this many bytes are the wrapped allocator's to count:
/// - [`SMALL`] under pymalloc (it hands larger ones to malloc);
/// - every size under mimalloc.
#[inline(always)]
fn counted_up_to() -> usize {
    if mimalloc_maps() {
        usize::MAX
    } else {
        SMALL
    }
}

/// Whether the wrappers count the interpreter's small objects (then arenas count only as
/// footprint).
#[inline(always)]
pub fn hooked() -> bool {
    HOOKED.load(Ordering::Relaxed)
}

const PYMEM_DOMAIN_RAW: i32 = 0;
const PYMEM_DOMAIN_MEM: i32 = 1;
const PYMEM_DOMAIN_OBJ: i32 = 2;

type GetSet = unsafe extern "C" fn(i32, *mut Allocator);

/// Called once by the constructor, after the ring was opened (`accounting`: this process
/// counts into a ring).
pub fn choose(accounting: bool) {
    let free_threaded = is_free_threaded_build();
    FREE_THREADED.store(free_threaded, Ordering::Release);
    let want = getenv(layout::PYMEM_ENV);
    // SAFETY: a NUL-terminated string from getenv.
    let want = (!want.is_null()).then(|| unsafe { core::ffi::CStr::from_ptr(want) }.to_bytes());
    if free_threaded {
        // mimalloc is the only object allocator it accepts, and wrapping it is the only way
        // to see its objects (its mappings are reservations), whatever the mode asked.
        if want.is_some() {
            // Our PYTHONMALLOC=malloc would stop this interpreter before it starts.
            // SAFETY: before main, one thread, so nothing else reads the environment now.
            unsafe { libc::unsetenv(c"PYTHONMALLOC".as_ptr()) };
        }
        // A PYTHONMALLOC of the user's own (mimalloc_debug, say) is left unwrapped.
        if accounting && getenv("PYTHONMALLOC").is_null() {
            install();
        }
        return;
    }
    if want != Some(layout::PYMEM_HOOK.as_bytes()) {
        return;
    }
    if accounting && install() {
        crate::mallocstats::take_over();
        // SAFETY: before main, one thread, so nothing else reads the environment now.
        unsafe { libc::unsetenv(c"PYTHONMALLOC".as_ptr()) };
    } else {
        // SAFETY: as above.
        unsafe { libc::setenv(c"PYTHONMALLOC".as_ptr(), c"malloc".as_ptr(), 1) };
    }
}

fn getenv(key: &str) -> *const libc::c_char {
    let mut buf = [0u8; 64];
    let k = key.as_bytes();
    if k.len() >= buf.len() {
        return core::ptr::null();
    }
    buf[..k.len()].copy_from_slice(k);
    // SAFETY: `buf` is NUL-terminated (zeroed past the key).
    unsafe { libc::getenv(buf.as_ptr() as *const libc::c_char) }
}

fn symbol(name: &core::ffi::CStr) -> *mut c_void {
    // SAFETY: dlsym with RTLD_DEFAULT and a NUL-terminated name.
    unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) }
}

/// Wraps both domains when the interpreter is 3.8+ (`Py_BytesMain` is 3.8's) and has the
/// allocator API; false otherwise (nothing changed).
fn install() -> bool {
    if symbol(c"Py_BytesMain").is_null() {
        return false;
    }
    wrap_domains()
}

/// Whether the interpreter has `PyMemAllocatorEx` and `PyMem_SetAllocator` as
/// [`install_late`] uses them, that is, 3.6+:
/// - 3.5 introduced them;
/// - 3.4 had a struct without `calloc` under the same function names;
/// - 2.7 has no allocator API at all.
pub fn late_api() -> bool {
    if symbol(c"PyMem_SetAllocator").is_null() {
        return false;
    }
    python3_minor().is_some_and(|minor| minor >= 6)
}

/// Calls `f(NULL)` on a short-lived thread of ours once it holds the GIL
/// (`PyGILState_Ensure`; the interpreter hands it over within its switch interval), then
/// lets the GIL go and ends. False when the thread could not be made or the interpreter
/// lacks the API. Not before 3.7 (3.6 may have no GIL yet, so the thread would make one and
/// run beside the main thread).
pub fn with_gil_on_a_thread(f: extern "C" fn(*mut c_void) -> c_int) -> bool {
    if symbol(c"PyGILState_Ensure").is_null() || symbol(c"PyGILState_Release").is_null() {
        return false;
    }
    // SAFETY: pthread_t and pthread_attr_t are plain data, filled by the calls below.
    let mut thread: libc::pthread_t = unsafe { core::mem::zeroed() };
    // SAFETY: as above.
    let mut attr: libc::pthread_attr_t = unsafe { core::mem::zeroed() };
    // SAFETY: a detached thread running `gil_thread(f)`; `f` is a function of this library,
    // which is never unloaded.
    unsafe {
        if libc::pthread_attr_init(&mut attr) != 0 {
            return false;
        }
        libc::pthread_attr_setdetachstate(&mut attr, libc::PTHREAD_CREATE_DETACHED);
        libc::pthread_attr_setstacksize(&mut attr, 256 * 1024);
        let made = libc::pthread_create(&mut thread, &attr, gil_thread, f as *mut c_void);
        libc::pthread_attr_destroy(&mut attr);
        made == 0
    }
}

/// The body of [`with_gil_on_a_thread`]'s thread; `f` is the function to call.
extern "C" fn gil_thread(f: *mut c_void) -> *mut c_void {
    let (ensure, release) = (symbol(c"PyGILState_Ensure"), symbol(c"PyGILState_Release"));
    if ensure.is_null() || release.is_null() {
        return core::ptr::null_mut();
    }
    // SAFETY: `f` is the `extern "C" fn(*mut c_void) -> c_int` given to
    // `with_gil_on_a_thread`; CPython's `PyGILState_STATE PyGILState_Ensure(void)` and
    // `void PyGILState_Release(PyGILState_STATE)` (an enum, a C int) may be called from a
    // thread the interpreter does not know. It makes a thread state for it and takes the
    // GIL.
    unsafe {
        let f = core::mem::transmute::<*mut c_void, extern "C" fn(*mut c_void) -> c_int>(f);
        let state = core::mem::transmute::<*mut c_void, extern "C" fn() -> c_int>(ensure)();
        f(core::ptr::null_mut());
        core::mem::transmute::<*mut c_void, extern "C" fn(c_int)>(release)(state);
    }
    core::ptr::null_mut()
}

/// The minor version of a Python 3 interpreter in this process (from `Py_GetVersion`);
/// None for another major version or when it cannot be told.
pub fn python3_minor() -> Option<u32> {
    let v = symbol(c"Py_GetVersion");
    if v.is_null() {
        return None;
    }
    // SAFETY: CPython's `const char *Py_GetVersion(void)` returns a static string and is
    // callable at any time, with or without the GIL.
    let text =
        unsafe { core::mem::transmute::<*mut c_void, extern "C" fn() -> *const libc::c_char>(v)() };
    if text.is_null() {
        return None;
    }
    // SAFETY: a NUL-terminated static string.
    let text = unsafe { core::ffi::CStr::from_ptr(text) }.to_bytes();
    let mut parts = text.split(|&c| c == b'.' || c == b' ');
    let num = |p: Option<&[u8]>| -> Option<u32> {
        let p = p?;
        if p.is_empty() || !p.iter().all(u8::is_ascii_digit) || p.len() > 4 {
            return None;
        }
        Some(p.iter().fold(0, |n, &d| n * 10 + (d - b'0') as u32))
    };
    match (num(parts.next()), num(parts.next())) {
        (Some(3), Some(minor)) => Some(minor),
        _ => None,
    }
}

/// Wraps both domains of an interpreter that is already running (`attach`). Called by the
/// pending call the attach scheduled, on the main thread with the thread state attached, as
/// `PyMem_SetAllocator` requires. Wrappers installed by an earlier attach stay (they pass
/// every call through while nothing is attached), so the answer is true at once. Never on a
/// free-threaded build (its mimalloc heaps cannot change hands while it runs).
pub fn install_late() -> bool {
    if hooked() {
        return true;
    }
    if is_free_threaded_build() || !late_api() {
        return false;
    }
    let wrapped = wrap_domains();
    if wrapped {
        crate::mallocstats::take_over();
    }
    wrapped
}

/// Wraps `PYMEM_DOMAIN_MEM` and `PYMEM_DOMAIN_OBJ` (see [`install`], [`install_late`]).
fn wrap_domains() -> bool {
    let (get, set) = (symbol(c"PyMem_GetAllocator"), symbol(c"PyMem_SetAllocator"));
    if get.is_null() || set.is_null() {
        return false;
    }
    // SAFETY: both are CPython's `void (PyMemAllocatorDomain, PyMemAllocatorEx *)`.
    let (get, set) = unsafe {
        (
            core::mem::transmute::<*mut c_void, GetSet>(get),
            core::mem::transmute::<*mut c_void, GetSet>(set),
        )
    };
    // SAFETY: one thread before main, or the GIL held (see SLOTS); the interpreter fills
    // and reads the structs we pass, and keeps a copy of ours.
    unsafe {
        let inner = &mut *SLOTS.0.get();
        let mut raw = EMPTY;
        get(PYMEM_DOMAIN_RAW, &mut raw);
        for (i, domain) in [PYMEM_DOMAIN_MEM, PYMEM_DOMAIN_OBJ].into_iter().enumerate() {
            get(domain, &mut inner[i]);
            if inner[i].malloc.is_none()
                || inner[i].calloc.is_none()
                || inner[i].realloc.is_none()
                || inner[i].free.is_none()
            {
                return false;
            }
        }
        // An interpreter built without pymalloc serves objects with its raw (malloc)
        // allocator, so the interposed malloc sees them all already (wrapping would count
        // them twice), as under PYTHONMALLOC=malloc.
        let fn_addr = |a: &Allocator| a.malloc.map(|f| f as usize);
        if fn_addr(&inner[1]) == fn_addr(&raw) {
            return false;
        }
        set(PYMEM_DOMAIN_MEM, &mut ours::<MEM>());
        set(PYMEM_DOMAIN_OBJ, &mut ours::<OBJ>());
    }
    HOOKED.store(true, Ordering::Release);
    true
}

/// Our wrappers of the domain at `SLOTS[D]`. Their `ctx` is the wrapped allocator's own,
/// and they find what they wrap in [`SLOTS`] (never through `ctx`). So a thread that reads
/// the domain's allocator while [`with_own_obj_allocator`] swaps it (the fields are not
/// written at once) calls either function with the right `ctx`, whichever it got.
///
/// # Safety
/// `SLOTS[D]` is filled (see [`SLOTS`]).
unsafe fn ours<const D: usize>() -> Allocator {
    Allocator {
        ctx: inner::<D>().ctx,
        malloc: Some(wrapped_malloc::<D>),
        calloc: Some(wrapped_calloc::<D>),
        realloc: Some(wrapped_realloc::<D>),
        free: Some(wrapped_free::<D>),
    }
}

/// The address of our `malloc` of `PYMEM_DOMAIN_OBJ`.
fn ours_obj_malloc() -> usize {
    let f: unsafe extern "C" fn(*mut c_void, usize) -> *mut c_void = wrapped_malloc::<OBJ>;
    f as usize
}

/// The wrapped allocator of the domain at `SLOTS[D]`.
///
/// # Safety
/// `SLOTS[D]` is filled (see [`SLOTS`]), which is true in every wrapper we installed.
#[inline(always)]
unsafe fn inner<'a, const D: usize>() -> &'a Allocator {
    &(*SLOTS.0.get())[D]
}

/// Calls `f` with the interpreter's own allocator back in `PYMEM_DOMAIN_OBJ` when ours is
/// there, and ours again after; else just calls it. The caller holds the GIL, as
/// `PyMem_SetAllocator` requires (never on a free-threaded build; see `mallocstats.rs`).
///
/// This is for CPython's `_PyObject_DebugMallocStats` (`sys._debugmallocstats()`,
/// `mallocstats.rs`). It prints pymalloc's statistics only when the domain's `malloc` is
/// pymalloc's own. pymalloc's state (its arenas and pools) is what it was, since pymalloc
/// serves every object under the wrappers. Meanwhile this domain's requests go to pymalloc
/// uncounted (a thread of another interpreter with a GIL of its own may make some).
pub fn with_own_obj_allocator<R>(f: impl FnOnce() -> R) -> R {
    let (get, set) = (symbol(c"PyMem_GetAllocator"), symbol(c"PyMem_SetAllocator"));
    if !hooked() || get.is_null() || set.is_null() {
        return f();
    }
    // SAFETY: both are CPython's `void (PyMemAllocatorDomain, PyMemAllocatorEx *)`.
    let (get, set) = unsafe {
        (
            core::mem::transmute::<*mut c_void, GetSet>(get),
            core::mem::transmute::<*mut c_void, GetSet>(set),
        )
    };
    let mut now = EMPTY;
    // SAFETY: the GIL is held (see above); the interpreter fills the struct.
    unsafe { get(PYMEM_DOMAIN_OBJ, &mut now) };
    let ours_now = ours_obj_malloc();
    if now.malloc.map(|f| f as usize) != Some(ours_now) {
        // Another allocator (tracemalloc's, the debug hooks) sits on ours, or replaced it.
        // CPython then prints what it would print without us.
        return f();
    }
    // SAFETY: hooked, so SLOTS is filled; the GIL is held; the interpreter copies the
    // structs we pass.
    unsafe {
        let mut own = *inner::<OBJ>();
        set(PYMEM_DOMAIN_OBJ, &mut own);
        let r = f();
        set(PYMEM_DOMAIN_OBJ, &mut ours::<OBJ>());
        r
    }
}

/// Calls `f` (the wrapped allocator) marked as inside it when `large` (pymalloc hands such
/// requests to the C allocator, whose entry points then count them as the interpreter's).
#[inline(always)]
fn inside<R>(large: bool, f: impl FnOnce() -> R) -> R {
    if !large {
        return f();
    }
    tls::with(|t| {
        let was = t.in_pymem.replace(true);
        let r = f();
        t.in_pymem.set(was);
        r
    })
}

unsafe extern "C" fn wrapped_malloc<const D: usize>(_: *mut c_void, n: usize) -> *mut c_void {
    let a = inner::<D>();
    // SAFETY: `install` checked every function of the wrapped allocator is there.
    let small = n <= counted_up_to();
    let p = inside(!small, || (a.malloc.unwrap_unchecked())(a.ctx, n));
    if small && !p.is_null() && active() {
        counted(p, n);
    }
    p
}

/// Counts what the wrapped allocator made:
/// - a small object of pymalloc's (its frees not sized);
/// - or any object of a free-threaded build's mimalloc (in the footprint).
#[inline(always)]
fn counted(p: *mut c_void, n: usize) {
    if mimalloc_maps() {
        on_alloc_mimalloc(p, n)
    } else {
        on_alloc_small(p, n)
    }
}

unsafe extern "C" fn wrapped_calloc<const D: usize>(
    _: *mut c_void,
    k: usize,
    n: usize,
) -> *mut c_void {
    let a = inner::<D>();
    let bytes = k.checked_mul(n);
    let small = bytes.is_some_and(|b| b <= counted_up_to());
    // SAFETY: as in `wrapped_malloc`.
    let p = inside(!small, || (a.calloc.unwrap_unchecked())(a.ctx, k, n));
    if let (true, Some(bytes)) = (small && !p.is_null() && active(), bytes) {
        counted(p, bytes);
    }
    p
}

unsafe extern "C" fn wrapped_realloc<const D: usize>(
    _: *mut c_void,
    p: *mut c_void,
    n: usize,
) -> *mut c_void {
    let a = inner::<D>();
    // The block may be (or become) one of the C allocator's, whatever `n` is; and what the
    // call copies (through the interposed memcpy) tells what was there before.
    let copied = || tls::with(|t| t.copied.get());
    let before = copied();
    // SAFETY: as in `wrapped_malloc`.
    let q = inside(true, || (a.realloc.unwrap_unchecked())(a.ctx, p, n));
    // None when a copy window filled meanwhile (the counter restarted).
    let copied = copied().checked_sub(before);
    // pymalloc keeps a small block in place when the new size is of the same size class
    // (nothing allocated). Otherwise it moves it:
    // - allocates;
    // - copies what the old block held (up to the new size);
    // - frees the old one.
    // The block lives on, so a watch on it follows it, and only its growth is new memory
    // (counted here when small, by the C allocator's entry points when not). Counting the
    // whole new block again would count what the old one stood for twice.
    if q != p && !q.is_null() && active() {
        if !p.is_null() {
            on_move(p, q);
        }
        if n <= counted_up_to() {
            let grown = copied.map_or(n, |c| n.saturating_sub(c as usize));
            if grown > 0 {
                counted(q, grown);
            }
        }
    }
    q
}

unsafe extern "C" fn wrapped_free<const D: usize>(_: *mut c_void, p: *mut c_void) {
    let a = inner::<D>();
    if !p.is_null() && active() {
        on_free_small(p, mimalloc_maps());
    }
    // SAFETY: as in `wrapped_malloc`.
    (a.free.unwrap_unchecked())(a.ctx, p)
}
