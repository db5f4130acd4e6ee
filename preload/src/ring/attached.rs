//! `attach` with memory: a ring claimed by a library loaded late (`crate::attach`), given
//! up at the detach and unmapped once no thread can still be using it.
//!
//! Owns: [`open_attached`], [`retire`] and the table of retired rings.
//!
//! Must not: allocate or block in [`retire`] (a detach may run inside the program's malloc).

use super::*;

/// Rings given up by detaches, not yet unmapped (with their lengths). A detach that finds
/// no free entry leaves its ring mapped for good. With each attach unmapping what it can,
/// at most one is usually here.
const RETIRED_MAX: usize = 4;
static RETIRED: [AtomicPtr<Header>; RETIRED_MAX] =
    [const { AtomicPtr::new(core::ptr::null_mut()) }; RETIRED_MAX];
static RETIRED_BYTES: [AtomicUsize; RETIRED_MAX] = [const { AtomicUsize::new(0) }; RETIRED_MAX];
/// Longest an attach waits for threads still inside `emit` before it leaves a retired ring
/// mapped (for a later attach to unmap).
const REAP_WAIT_NS: u64 = 1_000_000_000;

/// Opens the ring file at `path` (NUL-terminated) for an attach, with the checks of
/// [`super::open`] (our uid, mode 0600, magic, version, size), and claims it. The footprint
/// and its peak start at `footprint_start`. The handshake state starts afresh. The program's
/// other processes are not followed (no rings of their own). Returns whether the ring is
/// now the one events go to. Called with the attach lock held, sampling off.
pub fn open_attached(
    path: *const libc::c_char,
    python: (usize, usize),
    footprint_start: i64,
) -> bool {
    reap_retired();
    // SAFETY: `path` is NUL-terminated (the caller's contract).
    let fd = unsafe { libc::open(path, libc::O_RDWR | libc::O_CLOEXEC | libc::O_NOFOLLOW) };
    if fd < 0 {
        return false;
    }
    let mapped = map(fd);
    // SAFETY: closing our own descriptor; the mapping stays.
    unsafe { libc::close(fd) };
    let Some((hdr, bytes)) = mapped else {
        return false;
    };
    // SAFETY: `map` checked the file holds at least a header and the magic.
    let h = unsafe { &*hdr };
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    if claim(h, pid, python.0, python.1).is_err() {
        // SAFETY: unmapping the mapping made above; nothing refers to it.
        unsafe { libc::munmap(hdr as *mut libc::c_void, bytes) };
        return false;
    }
    take_windows(h);
    PY_LO.store(python.0 as u64, Ordering::Relaxed);
    PY_HI.store(python.1 as u64, Ordering::Relaxed);
    CONSUMER.store(h.consumer_pid.load(Ordering::Relaxed), Ordering::Relaxed);
    FOLLOW.store(false, Ordering::Relaxed);
    OWN.store(OWN_NONE, Ordering::Release);
    FORKED.store(false, Ordering::Relaxed);
    reset_handshake_state();
    h.footprint.store(footprint_start, Ordering::Relaxed);
    h.peak.store(footprint_start, Ordering::Relaxed);
    RING_BYTES.store(bytes, Ordering::Relaxed);
    RING.store(hdr, Ordering::Release);
    true
}

/// The attached ring's profiler has detached or is gone (a stale heartbeat).
pub fn attached_ring_done(h: &Header, now: u64) -> bool {
    if h.detached.load(Ordering::Acquire) != 0 {
        return true;
    }
    let beat = h.heartbeat_ns.load(Ordering::Acquire);
    beat != 0 && now.saturating_sub(beat) > layout::HEARTBEAT_STALE_NS
}

/// Whether the current ring (if any) is done with ([`attached_ring_done`]).
pub fn current_ring_done() -> bool {
    ENTERED.fetch_add(1, Ordering::SeqCst);
    let p = RING.load(Ordering::SeqCst);
    // SAFETY: a ring is unmapped only while ENTERED is 0 after it left RING.
    let done = p.is_null() || attached_ring_done(unsafe { &*p }, layout::now_ns());
    ENTERED.fetch_sub(1, Ordering::Release);
    done
}

/// Sets the current ring's `pymem_wrapped`.
pub fn set_pymem_wrapped() {
    ENTERED.fetch_add(1, Ordering::SeqCst);
    let p = RING.load(Ordering::SeqCst);
    if !p.is_null() {
        // SAFETY: as in `current_ring_done`.
        unsafe { &*p }.pymem_wrapped.store(1, Ordering::Release);
    }
    ENTERED.fetch_sub(1, Ordering::Release);
}

/// A detach. Events go nowhere from now on, and the ring is kept mapped until no thread
/// can be using it (the next attach unmaps it, [`reap_retired`]). Allocation-free, because
/// it may run inside the program's malloc.
pub fn retire() {
    let p = RING.swap(core::ptr::null_mut(), Ordering::SeqCst);
    if p.is_null() {
        return;
    }
    let bytes = RING_BYTES.load(Ordering::Relaxed);
    for (slot, len) in RETIRED.iter().zip(&RETIRED_BYTES) {
        if slot
            .compare_exchange(
                core::ptr::null_mut(),
                p,
                Ordering::AcqRel,
                Ordering::Relaxed,
            )
            .is_ok()
        {
            len.store(bytes, Ordering::Release);
            return;
        }
    }
    // No room, so that ring stays mapped (never reached while attaches reap).
}

/// Unmaps the rings earlier detaches gave up, once no thread is inside `emit` or
/// `footprint` (they were taken out of `RING` before, so a thread entering now cannot find
/// them). Waits at most [`REAP_WAIT_NS`] for that. What it cannot unmap stays for later.
fn reap_retired() {
    if RETIRED.iter().all(|p| p.load(Ordering::Acquire).is_null()) {
        return;
    }
    let deadline = layout::now_ns() + REAP_WAIT_NS;
    while ENTERED.load(Ordering::SeqCst) != 0 {
        if layout::now_ns() >= deadline {
            return;
        }
        // SAFETY: sched_yield has no preconditions.
        unsafe { libc::sched_yield() };
    }
    for (slot, len) in RETIRED.iter().zip(&RETIRED_BYTES) {
        let p = slot.load(Ordering::Acquire);
        if p.is_null() {
            continue;
        }
        let bytes = len.load(Ordering::Acquire);
        if bytes == 0 {
            // Its detach is still storing the length.
            continue;
        }
        // SAFETY: a ring mapping of that length, out of RING, and no thread inside a
        // function that could still hold it (ENTERED was 0 after it left RING).
        unsafe { libc::munmap(p as *mut libc::c_void, bytes) };
        len.store(0, Ordering::Relaxed);
        slot.store(core::ptr::null_mut(), Ordering::Release);
    }
}

/// Retired rings still mapped (tests: attach cycles must not pile them up).
#[allow(dead_code)]
pub fn retired_count() -> usize {
    RETIRED
        .iter()
        .filter(|p| !p.load(Ordering::Relaxed).is_null())
        .count()
}
