//! The producer side of the shared-memory ring:
//! - claiming the ring file the profiler made, or making this process's own ring;
//! - writing events without locks;
//! - the bounded handshake that lets the profiler read an allocating thread's stack while
//!   that thread waits.
//!
//! Owns:
//! - [`open`] (once, from the constructor), [`emit`];
//! - the footprint and peak in the header;
//! - the fork rule, that a forked child never writes to its parent's ring;
//! - the rings of the program's other processes, when the profiler follows them (the
//!   header's `child_capacity`). These make a ring of their own, `<the profiler's
//!   ring>.<pid>`, at their first event. They are:
//!   - a Python process that finds the profiler's ring claimed (an exec'd or spawned
//!     child, a subprocess, this very process after an `exec`);
//!   - a forked child.
//!
//! Must not: allocate, block longer than [`HANDSHAKE_WAIT_NS`], or wait again once the
//! profiler has stopped answering.

use crate::layout::{self, EventData, Header, Slot};
use core::sync::atomic::{
    AtomicBool, AtomicI32, AtomicPtr, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering,
};

/// Longest a thread waits for the profiler to read its stack.
pub const HANDSHAKE_WAIT_NS: i64 = layout::HANDSHAKE_WAIT_NS as i64;
/// Unanswered handshakes in a row (with no answer at all in between, even a late one) after
/// which the library stops waiting although the profiler still runs. So a hung profiler
/// costs the program at most this many waits. A profiler that is gone ends the waiting at
/// the first unanswered one. One that answers late (a loaded machine) keeps it going.
const MAX_TIMEOUTS_IN_A_ROW: u32 = 16;
/// After stopping with the profiler still there, waiting starts again once both hold:
/// - the profiler has read every event written up to then (it was behind, not hung; on a
///   loaded machine its reader can be off the CPU for the 80 ms of those waits);
/// - this long has passed, doubled at each such stop (at most [`MAX_RESUME_SHIFT`] times).
///
/// So a profiler that is always too slow costs the program 16 waits per period, a
/// vanishing share.
const RESUME_AFTER_NS: u64 = 500_000_000;
const MAX_RESUME_SHIFT: u32 = 7;

/// How long a waiting thread polls for the answer (yielding its CPU to anyone who wants it)
/// before it sleeps in a futex.
/// - An answer is the profiler's wake-up, then its read of the stack. It takes tens to a
///   little over a hundred microseconds.
/// - A thread asleep in the handshake would be off the CPU at the line that allocated,
///   while the sampler's clock runs on. That skews the lines' CPU shares
///   (fixtures/cpu/split.py shows it).
/// - Polled, the wait is CPU time of that line, as the program's own clock sees it too.
/// - Polling burns that CPU, so it stops at the slowest usual answer. Longer spins bought
///   no shorter waits. Sleeping outright both waited longer and cost the program more
///   (julia under memory mode).
/// - A profiler slow to answer costs each handshake the whole spin of the thread's CPU,
///   which can tilt equal threads' shares.
const SPIN_NS: u64 = 150_000;

static RING: AtomicPtr<Header> = AtomicPtr::new(core::ptr::null_mut());
/// Bytes of the mapping at `RING`.
static RING_BYTES: AtomicUsize = AtomicUsize::new(0);
/// Sampling is on. A ring is claimed (or one of our own is to be made) for this process.
pub static ACTIVE: AtomicBool = AtomicBool::new(false);
static WAIT: AtomicBool = AtomicBool::new(true);
/// The ring's consumer generation when we stopped waiting.
static GAVE_UP_AT: AtomicU64 = AtomicU64::new(0);
static TIMEOUTS: AtomicU32 = AtomicU32::new(0);
/// The profiler's answer count at the last unanswered handshake.
static ANSWERS_SEEN: AtomicU64 = AtomicU64::new(0);
/// When waiting stopped with the profiler still there (0: it did not), the ticket reserved
/// then, and how many times that happened (see [`RESUME_AFTER_NS`]).
static SLOW_SINCE_NS: AtomicU64 = AtomicU64::new(0);
static SLOW_TICKET: AtomicU64 = AtomicU64::new(0);
static SLOW_STOPS: AtomicU32 = AtomicU32::new(0);
pub static WINDOW: AtomicU64 = AtomicU64::new(1 << 20);
pub static COPY_WINDOW: AtomicU64 = AtomicU64::new(1 << 20);

// ---- This process's own ring (a process of the program that did not claim the
// profiler's): what its header gets, copied from the profiler's ring. ----

/// No own ring to make (none needed, or making it failed).
const OWN_NONE: u32 = 0;
/// Make one at the next event.
const OWN_PENDING: u32 = 1;
/// A thread is making it (events meanwhile are not written).
const OWN_MAKING: u32 = 2;
/// Made: `RING` points to it.
const OWN_READY: u32 = 3;
static OWN: AtomicU32 = AtomicU32::new(OWN_NONE);
/// The profiler follows the program's other processes, so they (and our fork children)
/// make rings of their own.
static FOLLOW: AtomicBool = AtomicBool::new(false);
/// This process is a fork child. Thread ids the library cached per thread before the fork
/// are its parent's, so events carry the id asked of the kernel instead.
static FORKED: AtomicBool = AtomicBool::new(false);
static CAPACITY: AtomicU64 = AtomicU64::new(0);
static CONSUMER: AtomicI32 = AtomicI32::new(0);
static PY_LO: AtomicU64 = AtomicU64::new(0);
static PY_HI: AtomicU64 = AtomicU64::new(0);
/// The profiler's ring's path (our own ring's name starts with it). It is written once
/// before main, and read when the ring is made. Longer paths (never ours, because rings
/// live in /dev/shm or a runtime directory) get no rings of their own. The name is built
/// on the stack of the allocating thread, so it stays small.
const PATH_MAX: usize = 512;
static MAIN_PATH: [AtomicU8; PATH_MAX] = [const { AtomicU8::new(0) }; PATH_MAX];
static MAIN_LEN: AtomicUsize = AtomicUsize::new(0);

/// Opens the ring named by the environment, when this process is Python and the file is
/// ours (same uid, no access for others).
/// - It claims the ring if nobody has.
/// - Else it gets ready to make a ring of its own, when the profiler follows the program's
///   processes, or when the ring is our own image's from before an `exec`.
///
/// Called once before main.
pub fn open(python: Option<(usize, usize)>) {
    let Some((lo, hi)) = python else { return };
    PY_LO.store(lo as u64, Ordering::Relaxed);
    PY_HI.store(hi as u64, Ordering::Relaxed);
    let name = ring_name();
    if name.is_null() {
        return;
    }
    // SAFETY: `name` is a NUL-terminated string from getenv.
    let fd = unsafe { libc::open(name, libc::O_RDWR | libc::O_CLOEXEC | libc::O_NOFOLLOW) };
    if fd < 0 {
        return;
    }
    let mapped = map(fd);
    // SAFETY: closing our own descriptor; the mapping stays.
    unsafe { libc::close(fd) };
    let Some((hdr, bytes)) = mapped else { return };
    // SAFETY: `map` checked the file holds at least a header and the magic.
    let h = unsafe { &*hdr };
    take_windows(h);
    let children = h.child_capacity.load(Ordering::Relaxed);
    let follow = children.is_power_of_two();
    FOLLOW.store(follow, Ordering::Relaxed);
    let own_capacity = if follow {
        children
    } else {
        h.capacity.load(Ordering::Relaxed)
    };
    CAPACITY.store(own_capacity, Ordering::Relaxed);
    CONSUMER.store(h.consumer_pid.load(Ordering::Relaxed), Ordering::Relaxed);
    // SAFETY: `name` is NUL-terminated (see above).
    remember_path(unsafe { core::ffi::CStr::from_ptr(name) }.to_bytes());
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    match claim(h, pid, lo, hi) {
        Ok(()) => {
            RING_BYTES.store(bytes, Ordering::Relaxed);
            RING.store(hdr, Ordering::Release);
        }
        Err(owner) => {
            // SAFETY: unmapping the mapping made above; nothing refers to it.
            unsafe { libc::munmap(hdr as *mut libc::c_void, bytes) };
            // Another process of the program has it; or we had it, before an `exec`
            // (the profiler reads our new image with a new ring).
            if !(follow || owner == pid) || MAIN_LEN.load(Ordering::Relaxed) == 0 {
                return;
            }
            OWN.store(OWN_PENDING, Ordering::Release);
        }
    }
    register_fork_handler();
    ACTIVE.store(true, Ordering::Release);
}

/// Registers [`after_fork_in_child`] (once).
pub fn register_fork_handler() {
    static DONE: AtomicBool = AtomicBool::new(false);
    if DONE.swap(true, Ordering::AcqRel) {
        return;
    }
    // SAFETY: registering a plain function as the child's fork handler.
    unsafe { libc::pthread_atfork(None, None, Some(after_fork_in_child)) };
}

/// The sampling windows the profiler chose (0: keep ours).
fn take_windows(h: &Header) {
    let w = h.window.load(Ordering::Relaxed);
    if w > 0 {
        WINDOW.store(w, Ordering::Relaxed);
    }
    let cw = h.copy_window.load(Ordering::Relaxed);
    if cw > 0 {
        COPY_WINDOW.store(cw, Ordering::Relaxed);
    }
}

/// Claims the mapped ring `h` for process `pid` (the interpreter image at `[lo, hi)`), or
/// returns the pid of the process that has it.
fn claim(h: &Header, pid: i32, lo: usize, hi: usize) -> Result<(), i32> {
    h.producer_pid
        .compare_exchange(0, pid, Ordering::AcqRel, Ordering::Acquire)?;
    h.python_lo.store(lo as u64, Ordering::Relaxed);
    h.python_hi.store(hi as u64, Ordering::Relaxed);
    Ok(())
}

/// The per-ring state of the handshake. A fresh ring starts waiting for its profiler.
fn reset_handshake_state() {
    WAIT.store(true, Ordering::Relaxed);
    TIMEOUTS.store(0, Ordering::Relaxed);
    ANSWERS_SEEN.store(0, Ordering::Relaxed);
    GAVE_UP_AT.store(0, Ordering::Relaxed);
    SLOW_SINCE_NS.store(0, Ordering::Relaxed);
    SLOW_TICKET.store(0, Ordering::Relaxed);
    SLOW_STOPS.store(0, Ordering::Relaxed);
    STARTUP_DONE.store(false, Ordering::Relaxed);
    STARTUP_DEADLINE.store(0, Ordering::Relaxed);
}

// ---- `attach` with memory (`attached.rs`). ----

/// Threads inside [`emit`] or [`footprint`], which may hold a reference to the ring they
/// found. A ring given up by a detach is unmapped only when none is (see [`retire`]).
static ENTERED: AtomicUsize = AtomicUsize::new(0);

mod attached;
pub use attached::{
    attached_ring_done, current_ring_done, open_attached, retire, set_pymem_wrapped,
};

/// Runs in a forked child, single-threaded, before `fork` returns. So nothing here may
/// allocate or lock.
extern "C" fn after_fork_in_child() {
    // The ring is the parent's, so never write to it. Another thread of the parent may have
    // been in the middle of an event, and that thread is not in the child.
    let parent = RING.swap(core::ptr::null_mut(), Ordering::AcqRel);
    if !parent.is_null() {
        // SAFETY: the parent's mapping, of that size. No thread of the child uses it (the one
        // thread here is in fork, not in `emit`).
        unsafe {
            libc::munmap(
                parent as *mut libc::c_void,
                RING_BYTES.load(Ordering::Relaxed),
            )
        };
    }
    if !FOLLOW.load(Ordering::Relaxed) || !ACTIVE.load(Ordering::Relaxed) {
        // The child runs on, unsampled.
        OWN.store(OWN_NONE, Ordering::Release);
        ACTIVE.store(false, Ordering::Release);
        return;
    }
    // A fresh start: the child's own ring at its first event, its own handshake state.
    FORKED.store(true, Ordering::Relaxed);
    reset_handshake_state();
    OWN.store(OWN_PENDING, Ordering::Release);
}

fn remember_path(path: &[u8]) {
    // Room for the separator, a pid and the NUL.
    if path.len() + 16 > PATH_MAX {
        return;
    }
    for (slot, &b) in MAIN_PATH.iter().zip(path) {
        slot.store(b, Ordering::Relaxed);
    }
    MAIN_LEN.store(path.len(), Ordering::Release);
}

fn ring_name() -> *const libc::c_char {
    let mut key = [0u8; 32];
    let env = layout::RING_ENV.as_bytes();
    key[..env.len()].copy_from_slice(env);
    // SAFETY: `key` is NUL-terminated (zero-filled past the name).
    unsafe { libc::getenv(key.as_ptr() as *const libc::c_char) }
}

/// Maps the ring file after checking it is private to our user and well-formed; returns
/// the mapping and its length.
fn map(fd: i32) -> Option<(*mut Header, usize)> {
    // SAFETY: fstat fills a stat struct we own.
    let mut st: libc::stat = unsafe { core::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return None;
    }
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    if st.st_uid != uid || st.st_mode & 0o077 != 0 || (st.st_size as usize) < layout::HEADER_BYTES {
        return None;
    }
    let size = st.st_size as usize;
    // SAFETY: a fresh shared mapping of the whole file; nothing else is at that address.
    let p = unsafe {
        libc::mmap(
            core::ptr::null_mut(),
            size,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return None;
    }
    let hdr = p as *mut Header;
    // SAFETY: the mapping is at least a header long.
    let h = unsafe { &*hdr };
    let cap = h.capacity.load(Ordering::Relaxed);
    let ok = h.magic.load(Ordering::Relaxed) == layout::MAGIC
        && h.version.load(Ordering::Relaxed) == layout::LAYOUT_VERSION
        && h.slot_bytes.load(Ordering::Relaxed) as usize == core::mem::size_of::<Slot>()
        && cap.is_power_of_two()
        && layout::file_bytes(cap) <= size;
    if !ok {
        // SAFETY: unmapping what we just mapped.
        unsafe { libc::munmap(p, size) };
        return None;
    }
    Some((hdr, size))
}

/// The ring events go to; our own is made here at the first event that needs it.
#[inline]
fn header() -> Option<&'static Header> {
    let p = RING.load(Ordering::Acquire);
    if !p.is_null() {
        // SAFETY: once set, the mapping lives:
        // - as long as the process (a fork child drops its parent's in the fork handler, before
        //   any of its threads runs);
        // - or, for an attach's ring, until no thread is inside `emit` or `footprint` after a
        //   detach took it out of RING (the callers of `header` count themselves in ENTERED).
        return Some(unsafe { &*p });
    }
    if OWN.load(Ordering::Acquire) != OWN_PENDING {
        return None;
    }
    own_ring()
}

/// Makes this process's own ring (one thread does; events of other threads meanwhile are
/// not written). On failure, or when the profiler is gone, sampling stops.
#[cold]
fn own_ring() -> Option<&'static Header> {
    if OWN
        .compare_exchange(OWN_PENDING, OWN_MAKING, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        return None;
    }
    let consumer = CONSUMER.load(Ordering::Relaxed);
    // SAFETY: kill with signal 0 only checks that the process exists.
    let gone = consumer <= 0 || unsafe { libc::kill(consumer, 0) } != 0 && errno() == libc::ESRCH;
    let made = if gone { None } else { make_own_ring() };
    let Some((hdr, bytes)) = made else {
        OWN.store(OWN_NONE, Ordering::Release);
        ACTIVE.store(false, Ordering::Release);
        return None;
    };
    RING_BYTES.store(bytes, Ordering::Relaxed);
    RING.store(hdr, Ordering::Release);
    OWN.store(OWN_READY, Ordering::Release);
    // SAFETY: just mapped, as large as its header says.
    Some(unsafe { &*hdr })
}

/// Creates `<profiler's ring>.<pid>` (O_EXCL, O_NOFOLLOW, mode 0600), sizes and maps it,
/// and fills its header like the profiler fills its own, claimed by us, the magic last.
fn make_own_ring() -> Option<(*mut Header, usize)> {
    let len = MAIN_LEN.load(Ordering::Acquire);
    let cap = CAPACITY.load(Ordering::Relaxed);
    if len == 0 || !cap.is_power_of_two() {
        return None;
    }
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    let mut name = [0u8; PATH_MAX];
    for (b, slot) in name.iter_mut().zip(&MAIN_PATH[..len]) {
        *b = slot.load(Ordering::Relaxed);
    }
    name[len] = layout::CHILD_RING_SEP;
    let end = len + 1 + write_decimal(&mut name[len + 1..], pid as u32);
    name[end] = 0;
    let path = name.as_ptr() as *const libc::c_char;
    let flags = libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    // SAFETY: `path` is NUL-terminated.
    let mut fd = unsafe { libc::open(path, flags, 0o600 as libc::c_uint) };
    if fd < 0 && errno() == libc::EEXIST && stale_own_name(path) {
        // SAFETY: as above.
        fd = unsafe { libc::open(path, flags, 0o600 as libc::c_uint) };
    }
    if fd < 0 {
        return None;
    }
    let bytes = layout::file_bytes(cap);
    // SAFETY: plain calls on the descriptor we just created; the mapping is fresh.
    let p = unsafe {
        if libc::fchmod(fd, 0o600) != 0 || !reserve(fd, bytes) {
            libc::MAP_FAILED
        } else {
            libc::mmap(
                core::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        }
    };
    // SAFETY: closing our descriptor; the mapping (if any) stays.
    unsafe { libc::close(fd) };
    if p == libc::MAP_FAILED {
        // SAFETY: removing the file we created.
        unsafe { libc::unlink(path) };
        return None;
    }
    let hdr = p as *mut Header;
    // SAFETY: a fresh mapping of `bytes` ≥ a header, zero-filled.
    let h = unsafe { &*hdr };
    h.version.store(layout::LAYOUT_VERSION, Ordering::Relaxed);
    h.slot_bytes
        .store(core::mem::size_of::<Slot>() as u32, Ordering::Relaxed);
    h.capacity.store(cap, Ordering::Relaxed);
    h.consumer_pid
        .store(CONSUMER.load(Ordering::Relaxed), Ordering::Relaxed);
    h.window
        .store(WINDOW.load(Ordering::Relaxed), Ordering::Relaxed);
    h.copy_window
        .store(COPY_WINDOW.load(Ordering::Relaxed), Ordering::Relaxed);
    if FOLLOW.load(Ordering::Relaxed) {
        h.child_capacity.store(cap, Ordering::Relaxed);
    }
    h.python_lo
        .store(PY_LO.load(Ordering::Relaxed), Ordering::Relaxed);
    h.python_hi
        .store(PY_HI.load(Ordering::Relaxed), Ordering::Relaxed);
    h.producer_pid.store(pid, Ordering::Relaxed);
    // The magic goes last, because the profiler reads a ring only once it sees a complete
    // header.
    h.magic.store(layout::MAGIC, Ordering::Release);
    Some((hdr, bytes))
}

/// Gives the new file `fd` its `bytes`, allocated now. Why:
/// - a ring whose pages could not be had later (a full /dev/shm) would kill the program
///   with SIGBUS at its next event;
/// - a size above the process's file size limit would kill it with SIGXFSZ now.
///
/// False: no ring.
fn reserve(fd: i32, bytes: usize) -> bool {
    // SAFETY: getrlimit fills a struct we own.
    let mut lim: libc::rlimit = unsafe { core::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::getrlimit(libc::RLIMIT_FSIZE, &mut lim) } != 0
        || (lim.rlim_cur != libc::RLIM_INFINITY && lim.rlim_cur < bytes as libc::rlim_t)
    {
        return false;
    }
    // SAFETY: plain calls on a descriptor of ours.
    match unsafe { libc::fallocate(fd, 0, 0, bytes as libc::off_t) } {
        0 => true,
        // A file system that cannot reserve (not tmpfs) gets the file sized only, as the
        // profiler's.
        // SAFETY: as above.
        _ if errno() == libc::EOPNOTSUPP => unsafe {
            libc::ftruncate(fd, bytes as libc::off_t) == 0
        },
        _ => false,
    }
}

/// A file already at our own ring's name is stale: a process that had our pid before us,
/// or our own image before an `exec` (pids name one live process at a time). Removes it
/// when it is our user's plain file. Returns whether it did.
fn stale_own_name(path: *const libc::c_char) -> bool {
    // SAFETY: lstat fills a stat struct we own; `path` is NUL-terminated.
    let mut st: libc::stat = unsafe { core::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::lstat(path, &mut st) } != 0 {
        return false;
    }
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    if st.st_uid != uid || st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return false;
    }
    // SAFETY: removing a file of ours at a NUL-terminated path.
    unsafe { libc::unlink(path) == 0 }
}

/// Writes `n` in decimal at the start of `out`; returns the digits written.
fn write_decimal(out: &mut [u8], mut n: u32) -> usize {
    let mut digits = [0u8; 10];
    let mut k = 0;
    loop {
        digits[k] = b'0' + (n % 10) as u8;
        k += 1;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    for (o, d) in out.iter_mut().zip(digits[..k].iter().rev()) {
        *o = *d;
    }
    k
}

/// Moves the footprint by `delta` bytes and raises the peak.
pub fn footprint(delta: i64) {
    ENTERED.fetch_add(1, Ordering::SeqCst);
    if let Some(h) = header() {
        let now = h.footprint.fetch_add(delta, Ordering::AcqRel) + delta;
        h.peak.fetch_max(now, Ordering::AcqRel);
    }
    ENTERED.fetch_sub(1, Ordering::Release);
}

/// Longest the program waits, once, for the profiler to get ready to read stacks (it
/// locates the interpreter while the program starts).
const STARTUP_WAIT_NS: u64 = 2_000_000_000;
/// The startup wait is done in slices this long, checking the profiler is still there.
const STARTUP_SLICE_NS: i64 = 5_000_000;
static STARTUP_DONE: AtomicBool = AtomicBool::new(false);
static STARTUP_DEADLINE: AtomicU64 = AtomicU64::new(0);

/// The first events of a program may come before the profiler can read stacks. So wait
/// (once, bounded, and no longer than the profiler lives) until it is ready. Returns
/// whether it now answers handshakes.
#[cold]
fn wait_for_profiler(h: &Header) -> bool {
    if STARTUP_DONE.load(Ordering::Relaxed) {
        return false;
    }
    let now = layout::now_ns();
    let _ = STARTUP_DEADLINE.compare_exchange(
        0,
        now + STARTUP_WAIT_NS,
        Ordering::AcqRel,
        Ordering::Acquire,
    );
    let deadline = STARTUP_DEADLINE.load(Ordering::Acquire);
    loop {
        match h.handshake.load(Ordering::Acquire) {
            layout::HANDSHAKE_STARTING => {}
            state => {
                STARTUP_DONE.store(true, Ordering::Relaxed);
                return state == layout::HANDSHAKE_ON;
            }
        }
        let now = layout::now_ns();
        if now >= deadline || profiler_gone(h) {
            STARTUP_DONE.store(true, Ordering::Relaxed);
            return false;
        }
        futex_wait(
            &h.handshake,
            layout::HANDSHAKE_STARTING,
            STARTUP_SLICE_NS.min((deadline - now) as i64),
        );
    }
}

/// The profiler is gone:
/// - its heartbeat is stale;
/// - or it detached (`attach` with memory, whose profiler's pid may mean nothing in our
///   pid namespace);
/// - or (a heartbeat of 0: `run`) its process no longer exists.
fn profiler_gone(h: &Header) -> bool {
    if h.heartbeat_ns.load(Ordering::Acquire) != 0 || h.detached.load(Ordering::Acquire) != 0 {
        return attached_ring_done(h, layout::now_ns());
    }
    let consumer = h.consumer_pid.load(Ordering::Relaxed);
    // SAFETY: kill with signal 0 only checks that the process exists.
    consumer <= 0 || unsafe { libc::kill(consumer, 0) } != 0 && errno() == libc::ESRCH
}

/// Writes one event. When `wait` and the profiler answers handshakes, waits (bounded) until
/// the profiler has read this thread's stack. A full ring drops the event and counts it.
///
/// Returns whether the profiler answered. A wait that timed out returns false. Unanswered
/// waits are bounded by [`MAX_TIMEOUTS_IN_A_ROW`], not by the thread's handshake budget,
/// so that a profiler still starting its reader gets its chance.
pub fn emit(kind: u32, tid: i32, a: u64, b: u64, c: u64, ptr: u64, wait: bool) -> bool {
    ENTERED.fetch_add(1, Ordering::SeqCst);
    let r = emit_on_ring(kind, tid, a, b, c, ptr, wait);
    ENTERED.fetch_sub(1, Ordering::Release);
    r
}

#[allow(clippy::too_many_arguments)]
fn emit_on_ring(kind: u32, tid: i32, a: u64, b: u64, c: u64, ptr: u64, wait: bool) -> bool {
    let Some(h) = header() else { return false };
    if crate::attach::attached() && attached_ring_done(h, layout::now_ns()) {
        // The profiler of this attach detached or is gone. So stop, and put back what the attach
        // patched.
        crate::attach::detach();
        return false;
    }
    let tid = if FORKED.load(Ordering::Relaxed) {
        // SAFETY: gettid has no preconditions.
        unsafe { libc::syscall(libc::SYS_gettid) as i32 }
    } else {
        tid
    };
    let Some(ticket) = h.reserve() else {
        return false;
    };
    if wait
        && !WAIT.load(Ordering::Relaxed)
        && (h.consumer_generation.load(Ordering::Acquire) != GAVE_UP_AT.load(Ordering::Relaxed)
            || caught_up(h))
    {
        // A new profiler took the ring over, or the slow one caught up, so give it a chance.
        TIMEOUTS.store(0, Ordering::Relaxed);
        SLOW_SINCE_NS.store(0, Ordering::Relaxed);
        WAIT.store(true, Ordering::Relaxed);
    }
    let wait = wait
        && WAIT.load(Ordering::Relaxed)
        && match h.handshake.load(Ordering::Acquire) {
            layout::HANDSHAKE_ON => true,
            layout::HANDSHAKE_STARTING => wait_for_profiler(h),
            _ => false,
        };
    // SAFETY: `map` checked the mapping holds `capacity` slots after the header.
    let s = unsafe { h.slot(ticket) };
    s.publish(
        ticket,
        &EventData {
            kind,
            tid,
            a,
            b,
            c,
            ptr,
            time_ns: layout::now_ns(),
            wants_ack: wait,
        },
    );
    if !wait {
        return false;
    }
    h.doorbell.fetch_add(1, Ordering::AcqRel);
    futex_wake(&h.doorbell);
    let start = layout::now_ns();
    let deadline = start + HANDSHAKE_WAIT_NS as u64;
    // The answer usually comes within tens of microseconds, so wait for it on the CPU first,
    // then sleep for the rest of the bound. Sleeping in the kernel and being woken costs as
    // much again, and off the CPU the thread would look idle to the sampler.
    let spin_until = start + SPIN_NS;
    while s.ack.load(Ordering::Acquire) == 0 && layout::now_ns() < spin_until {
        // SAFETY: sched_yield has no preconditions; on a busy machine it lets the
        // profiler (or anyone else) have this CPU.
        unsafe { libc::sched_yield() };
    }
    loop {
        if s.ack.load(Ordering::Acquire) != 0 {
            TIMEOUTS.store(0, Ordering::Relaxed);
            return true;
        }
        let now = layout::now_ns();
        if now >= deadline {
            break;
        }
        futex_wait(&s.ack, 0, (deadline - now) as i64);
    }
    h.handshake_timeouts.fetch_add(1, Ordering::Relaxed);
    let gone = profiler_gone(h);
    if gone && crate::attach::attached() {
        crate::attach::detach();
        return false;
    }
    let answers = h.answers.load(Ordering::Acquire);
    if ANSWERS_SEEN.swap(answers, Ordering::Relaxed) != answers {
        // It answered something since the last miss, so it is slow, not hung.
        TIMEOUTS.store(0, Ordering::Relaxed);
    }
    if gone || TIMEOUTS.fetch_add(1, Ordering::Relaxed) + 1 >= MAX_TIMEOUTS_IN_A_ROW {
        GAVE_UP_AT.store(
            h.consumer_generation.load(Ordering::Acquire),
            Ordering::Relaxed,
        );
        if !gone {
            SLOW_TICKET.store(h.head.load(Ordering::Acquire), Ordering::Relaxed);
            SLOW_SINCE_NS.store(layout::now_ns().max(1), Ordering::Relaxed);
            SLOW_STOPS.fetch_add(1, Ordering::Relaxed);
        }
        WAIT.store(false, Ordering::Relaxed);
    }
    false
}

/// Waiting stopped because the profiler answered too late, and it has since read every
/// event written up to then, and the back-off has passed (see [`RESUME_AFTER_NS`]).
#[cold]
fn caught_up(h: &Header) -> bool {
    let since = SLOW_SINCE_NS.load(Ordering::Relaxed);
    if since == 0 {
        return false;
    }
    let shift = SLOW_STOPS
        .load(Ordering::Relaxed)
        .saturating_sub(1)
        .min(MAX_RESUME_SHIFT);
    layout::now_ns().saturating_sub(since) >= RESUME_AFTER_NS << shift
        && h.tail.load(Ordering::Acquire) >= SLOW_TICKET.load(Ordering::Relaxed)
        && !profiler_gone(h)
}

fn futex_wait(word: &AtomicU32, expected: u32, timeout_ns: i64) {
    let ts = libc::timespec {
        tv_sec: timeout_ns / 1_000_000_000,
        tv_nsec: timeout_ns % 1_000_000_000,
    };
    // SAFETY: a shared (not private) futex wait on a word of the shared mapping, with a
    // relative timeout we own; it only reads the word.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            &ts as *const libc::timespec,
        )
    };
}

fn futex_wake(word: &AtomicU32) {
    // SAFETY: a shared futex wake on a word of the shared mapping.
    unsafe { libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, i32::MAX) };
}

fn errno() -> i32 {
    // SAFETY: reads this thread's errno.
    unsafe { *libc::__errno_location() }
}

#[cfg(test)]
mod tests;
