//! `sys._debugmallocstats()` with the wrappers in (`pymem.rs`). CPython prints pymalloc's
//! statistics (`_PyObject_DebugMallocStats`, 3.3+) only when the object domain's `malloc`
//! is pymalloc's own function. Ours stands there, so the call printed only the free lists
//! (test_sys's test_debugmallocstats, which looks for pymalloc's lines since 3.11, failed).
//!
//! Free-threaded builds are left alone, because they print mimalloc's statistics whatever
//! the object allocator is (seen on 3.13t, with the wrappers in; 3.14's source says so).
//!
//! pymalloc's state is intact (it serves every object under the wrappers). All the call
//! needs is pymalloc's allocator in the domain while it runs.
//!
//! So the library points the sys module's method entry for `_debugmallocstats` (a
//! `PyMethodDef` in a static table of the interpreter's, in its writable data) at
//! [`debugmallocstats`]. That function puts the interpreter's own allocator back for the
//! call (`pymem::with_own_obj_allocator`) and calls CPython's function. Why the entry:
//! - every function object made from it calls through it (`ml_meth` is read at each
//!   call). These are the main interpreter's and any subinterpreter's
//!   `sys._debugmallocstats`, which stay CPython's own objects, with their name, docstring
//!   and signature;
//! - it is there before the interpreter starts. So it is written before `main` (`run`) or
//!   by the pending call that installs the wrappers (`attach`). No hook runs in the
//!   interpreter, nothing is imported, no Python object is made;
//! - it is the same on every version and build, shared or static (the table has no
//!   exported symbol, so it is found by its contents, see [`find_entry`]).
//!
//! An entry is taken only when it is:
//! - the single one in the interpreter's image with the name `_debugmallocstats` (a
//!   NUL-terminated string in a read-only segment);
//! - a function in its code;
//! - `METH_NOARGS` (as on every 3.x);
//! - in data the dynamic linker leaves writable.
//!
//! Otherwise nothing changes and the statistics stay hidden, as before.
//!
//! Not covered: `PYTHONMALLOCSTATS=1`, whose statistics CPython prints from C (at each new
//! arena and at exit), not through the sys module.
//!
//! Owns: finding that entry and the function put in it.
//! Must not: allocate, or write anything but the entry's function pointer.

use crate::elf::{Object, PT_LOAD};
use core::ffi::{c_int, c_void};
use core::sync::atomic::{AtomicUsize, Ordering};

/// `METH_NOARGS` (`methodobject.h`, every 3.x).
const METH_NOARGS: u32 = 0x0004;
/// The method's name as the table's `ml_name` points at it.
const NAME: &[u8] = b"_debugmallocstats\0";
const PF_X: u32 = 1;
const PF_W: u32 = 2;

/// `PyMethodDef`: `ml_name`, `ml_meth`, `ml_flags` (a C int), `ml_doc`.
const ENTRY_SIZE: usize = 4 * core::mem::size_of::<usize>();
const METH_OFFSET: usize = core::mem::size_of::<usize>();
const FLAGS_OFFSET: usize = 2 * core::mem::size_of::<usize>();

/// A `METH_NOARGS` function: `PyObject *(PyObject *module, PyObject *unused)`.
type NoArgs = unsafe extern "C" fn(*mut c_void, *mut c_void) -> *mut c_void;

/// CPython's function of the entry, once ours replaced it (0 before).
static THEIRS: AtomicUsize = AtomicUsize::new(0);

/// Points the entry of `sys._debugmallocstats` at [`debugmallocstats`] (once; nothing when
/// the entry is not found). Called after the wrappers went in, before `main` or with the
/// GIL held (`attach`). The function pointer is written in one store, so a thread calling
/// the method meanwhile calls either function.
pub fn take_over() {
    if THEIRS.load(Ordering::Acquire) != 0 {
        return;
    }
    // SAFETY: dlsym with RTLD_DEFAULT and a NUL-terminated name.
    let anchor = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"PyMem_SetAllocator".as_ptr()) };
    if anchor.is_null() {
        return;
    }
    let Some(entry) = find_entry(anchor as usize) else {
        return;
    };
    // SAFETY: `find_entry` returned an entry of the interpreter's writable data (outside
    // the part made read-only after relocation), aligned as the table is. Its function
    // pointer is a word there, written only here.
    let meth = unsafe { AtomicUsize::from_ptr((entry + METH_OFFSET) as *mut usize) };
    THEIRS.store(meth.load(Ordering::Relaxed), Ordering::Release);
    meth.store(debugmallocstats as NoArgs as usize, Ordering::Release);
}

/// What the entry calls now: CPython's function, with pymalloc back in the object domain
/// while it runs. Called by the interpreter with the GIL held, as a `METH_NOARGS` method.
unsafe extern "C" fn debugmallocstats(module: *mut c_void, unused: *mut c_void) -> *mut c_void {
    let theirs = THEIRS.load(Ordering::Acquire);
    // SAFETY: `take_over` saved the entry's own function (non-zero: the entry holds ours
    // only after it was saved), a `METH_NOARGS` function of the interpreter.
    let theirs = unsafe { core::mem::transmute::<usize, NoArgs>(theirs) };
    crate::pymem::with_own_obj_allocator(|| {
        // SAFETY: called as the interpreter called us, with the same arguments.
        unsafe { theirs(module, unused) }
    })
}

/// The address of the `_debugmallocstats` entry in the image that holds `anchor` (an
/// address of the interpreter's), when exactly one entry fits (see the module's doc).
fn find_entry(anchor: usize) -> Option<usize> {
    struct Find {
        anchor: usize,
        found: Option<usize>,
    }
    unsafe extern "C" fn cb(info: *mut libc::dl_phdr_info, _: usize, data: *mut c_void) -> c_int {
        // SAFETY: dl_iterate_phdr passes a valid info and our own `Find`.
        let (info, f) = unsafe { (&*info, &mut *(data as *mut Find)) };
        let object = Object::of(info);
        if !object.contains(f.anchor) {
            return 0;
        }
        f.found = scan(&object);
        1
    }
    let mut f = Find {
        anchor,
        found: None,
    };
    // SAFETY: the callback reads the program headers and the segments they describe.
    unsafe { libc::dl_iterate_phdr(Some(cb), &mut f as *mut Find as *mut c_void) };
    f.found
}

/// `[lo, hi)` of the object's loaded segments whose flags pass `want`. It covers the bytes
/// the file gives (`p_filesz`), so never the zero-filled tail of a data segment.
fn segments<'a>(
    object: &'a Object<'a>,
    want: impl Fn(u32) -> bool + 'a,
) -> impl Iterator<Item = (usize, usize)> + 'a {
    object
        .phdrs
        .iter()
        .filter(move |p| p.p_type == PT_LOAD && want(p.p_flags))
        .map(|p| {
            let lo = object.base.wrapping_add(p.p_vaddr as usize);
            (lo, lo.wrapping_add(p.p_filesz as usize))
        })
}

fn within(ranges: impl Iterator<Item = (usize, usize)>, addr: usize, len: usize) -> bool {
    ranges
        .into_iter()
        .any(|(lo, hi)| addr >= lo && addr.checked_add(len).is_some_and(|end| end <= hi))
}

/// The one entry of `object`'s writable data (past the part made read-only after
/// relocation) that fits; None when none or several do.
fn scan(object: &Object) -> Option<usize> {
    let (_, relro_hi) = object.relro();
    let word = core::mem::size_of::<usize>();
    let mut found = None;
    for (lo, hi) in segments(object, |f| f & PF_W != 0) {
        let mut a = lo.max(relro_hi).next_multiple_of(word);
        while a.checked_add(ENTRY_SIZE).is_some_and(|end| end <= hi) {
            // SAFETY: `[a, a + ENTRY_SIZE)` is inside a loaded segment's file-backed bytes,
            // mapped readable; aligned words.
            let (name, meth, flags) = unsafe {
                (
                    *(a as *const usize),
                    *((a + METH_OFFSET) as *const usize),
                    *((a + FLAGS_OFFSET) as *const u32),
                )
            };
            if flags == METH_NOARGS
                && within(segments(object, |f| f & PF_X != 0), meth, 1)
                && within(segments(object, |f| f & PF_W == 0), name, NAME.len())
                // SAFETY: `name..name + NAME.len()` is inside a read-only segment (checked
                // just above).
                && unsafe { core::slice::from_raw_parts(name as *const u8, NAME.len()) } == NAME
            {
                if found.is_some() {
                    return None;
                }
                found = Some(a);
            }
            a += word;
        }
    }
    found
}
