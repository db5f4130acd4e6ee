//! The producer side of the shared-memory ring: claiming the ring file the profiler made,
//! writing events without locks, and the bounded handshake that lets the profiler read an
//! allocating thread's stack while that thread waits.
//!
//! Owns: [`open`] (once, from the constructor), [`emit`], the footprint and peak in the
//! header, the fork rule (a forked child never writes to its parent's ring).
//! Must not: allocate, block longer than [`HANDSHAKE_WAIT_NS`], or wait again once the
//! profiler has stopped answering.

use crate::layout::{self, EventData, Header, Slot};
use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, Ordering};

/// Longest a thread waits for the profiler to read its stack.
pub const HANDSHAKE_WAIT_NS: i64 = 5_000_000;
/// Unanswered handshakes in a row (with no answer at all in between, even a late one) after
/// which the library never waits again although the profiler still runs: a hung profiler
/// costs the program at most this many waits. A profiler that is gone ends the waiting at
/// the first unanswered one; one that answers late (a loaded machine) keeps it going.
const MAX_TIMEOUTS_IN_A_ROW: u32 = 16;

static RING: AtomicPtr<Header> = AtomicPtr::new(core::ptr::null_mut());
/// Sampling is on: a ring is claimed and this is the process that claimed it.
pub static ACTIVE: AtomicBool = AtomicBool::new(false);
static WAIT: AtomicBool = AtomicBool::new(true);
/// The ring's consumer generation when we stopped waiting.
static GAVE_UP_AT: AtomicU64 = AtomicU64::new(0);
static TIMEOUTS: AtomicU32 = AtomicU32::new(0);
/// The profiler's answer count at the last unanswered handshake.
static ANSWERS_SEEN: AtomicU64 = AtomicU64::new(0);
pub static WINDOW: AtomicU64 = AtomicU64::new(1 << 20);
pub static COPY_WINDOW: AtomicU64 = AtomicU64::new(1 << 20);

/// Opens and claims the ring named by the environment, when this process is Python and
/// the file is ours (same uid, no access for others). Called once before main.
pub fn open(python: Option<(usize, usize)>) {
    let Some((lo, hi)) = python else { return };
    let name = ring_name();
    if name.is_null() {
        return;
    }
    // SAFETY: `name` is a NUL-terminated string from getenv.
    let fd = unsafe { libc::open(name, libc::O_RDWR | libc::O_CLOEXEC | libc::O_NOFOLLOW) };
    if fd < 0 {
        return;
    }
    let hdr = map(fd);
    // SAFETY: closing our own descriptor; the mapping stays.
    unsafe { libc::close(fd) };
    let Some(hdr) = hdr else { return };
    // SAFETY: `map` checked the file holds at least a header and the magic.
    let h = unsafe { &*hdr };
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    if h.producer_pid
        .compare_exchange(0, pid, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        return;
    }
    h.python_lo.store(lo as u64, Ordering::Relaxed);
    h.python_hi.store(hi as u64, Ordering::Relaxed);
    let w = h.window.load(Ordering::Relaxed);
    if w > 0 {
        WINDOW.store(w, Ordering::Relaxed);
    }
    let cw = h.copy_window.load(Ordering::Relaxed);
    if cw > 0 {
        COPY_WINDOW.store(cw, Ordering::Relaxed);
    }
    RING.store(hdr, Ordering::Release);
    // SAFETY: registering a plain function as the child's fork handler.
    unsafe { libc::pthread_atfork(None, None, Some(after_fork_in_child)) };
    ACTIVE.store(true, Ordering::Release);
}

extern "C" fn after_fork_in_child() {
    // The ring belongs to the parent: the child runs on, unsampled.
    ACTIVE.store(false, Ordering::Release);
}

fn ring_name() -> *const libc::c_char {
    let mut key = [0u8; 32];
    let env = layout::RING_ENV.as_bytes();
    key[..env.len()].copy_from_slice(env);
    // SAFETY: `key` is NUL-terminated (zero-filled past the name).
    unsafe { libc::getenv(key.as_ptr() as *const libc::c_char) }
}

/// Maps the ring file after checking it is private to our user and well-formed.
fn map(fd: i32) -> Option<*mut Header> {
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
    Some(hdr)
}

fn header() -> Option<&'static Header> {
    let p = RING.load(Ordering::Acquire);
    // SAFETY: once set, the mapping lives as long as the process.
    (!p.is_null()).then(|| unsafe { &*p })
}

/// Moves the footprint by `delta` bytes and raises the peak.
pub fn footprint(delta: i64) {
    let Some(h) = header() else { return };
    let now = h.footprint.fetch_add(delta, Ordering::AcqRel) + delta;
    h.peak.fetch_max(now, Ordering::AcqRel);
}

/// Longest the program waits, once, for the profiler to get ready to read stacks (it
/// locates the interpreter while the program starts).
const STARTUP_WAIT_NS: u64 = 2_000_000_000;
/// The startup wait is done in slices this long, checking the profiler is still there.
const STARTUP_SLICE_NS: i64 = 5_000_000;
static STARTUP_DONE: AtomicBool = AtomicBool::new(false);
static STARTUP_DEADLINE: AtomicU64 = AtomicU64::new(0);

/// The first events of a program may come before the profiler can read stacks: wait
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

fn profiler_gone(h: &Header) -> bool {
    let consumer = h.consumer_pid.load(Ordering::Relaxed);
    // SAFETY: kill with signal 0 only checks that the process exists.
    consumer <= 0 || unsafe { libc::kill(consumer, 0) } != 0 && errno() == libc::ESRCH
}

/// Writes one event; when `wait` and the profiler answers handshakes, waits (bounded) until
/// it has read this thread's stack. A full ring drops the event and counts it.
pub fn emit(kind: u32, tid: i32, a: u64, b: u64, c: u64, ptr: u64, wait: bool) {
    let Some(h) = header() else { return };
    let Some(ticket) = h.reserve() else { return };
    if wait
        && !WAIT.load(Ordering::Relaxed)
        && h.consumer_generation.load(Ordering::Acquire) != GAVE_UP_AT.load(Ordering::Relaxed)
    {
        // A new profiler took the ring over: give it a chance.
        TIMEOUTS.store(0, Ordering::Relaxed);
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
        return;
    }
    h.doorbell.fetch_add(1, Ordering::AcqRel);
    futex_wake(&h.doorbell);
    let deadline = layout::now_ns() + HANDSHAKE_WAIT_NS as u64;
    loop {
        if s.ack.load(Ordering::Acquire) != 0 {
            TIMEOUTS.store(0, Ordering::Relaxed);
            return;
        }
        let now = layout::now_ns();
        if now >= deadline {
            break;
        }
        futex_wait(&s.ack, 0, (deadline - now) as i64);
    }
    h.handshake_timeouts.fetch_add(1, Ordering::Relaxed);
    let gone = profiler_gone(h);
    let answers = h.answers.load(Ordering::Acquire);
    if ANSWERS_SEEN.swap(answers, Ordering::Relaxed) != answers {
        // It answered something since the last miss: slow, not hung.
        TIMEOUTS.store(0, Ordering::Relaxed);
    }
    if gone || TIMEOUTS.fetch_add(1, Ordering::Relaxed) + 1 >= MAX_TIMEOUTS_IN_A_ROW {
        GAVE_UP_AT.store(
            h.consumer_generation.load(Ordering::Acquire),
            Ordering::Relaxed,
        );
        WAIT.store(false, Ordering::Relaxed);
    }
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
