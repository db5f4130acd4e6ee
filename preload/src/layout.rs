//! The shared-memory ring's layout: the one definition both sides compile (the preload
//! library as the producer, `scalene_rs::memory` as the consumer, through `#[path]`).
//!
//! Owns:
//! - the header and slot structures;
//! - the event kinds;
//! - the constants of the format;
//! - the producer's lock-free protocol ([`Header::reserve`], [`Slot::publish`]), so the
//!   consumer's tests exercise the very code the library runs.
//!
//! Must not: allocate, block, or panic (it runs inside the program's malloc).

use core::sync::atomic::{AtomicI32, AtomicI64, AtomicU32, AtomicU64, Ordering};

/// The profiler is getting ready to read stacks, so the first events may wait for it
/// (bounded).
pub const HANDSHAKE_STARTING: u32 = 0;
/// The profiler reads the allocating thread's stack while it waits.
pub const HANDSHAKE_ON: u32 = 1;
/// The profiler does not answer, so never wait.
pub const HANDSHAKE_OFF: u32 = 2;
/// Longest a thread waits in the handshake, from its event's time on (the producer's
/// deadline is at least this far past `time_ns`). A consumer that has stopped the thread
/// before then has stopped it inside the wait.
pub const HANDSHAKE_WAIT_NS: u64 = 5_000_000;

/// "SCLNRING" little-endian.
pub const MAGIC: u64 = u64::from_le_bytes(*b"SCLNRING");
/// Bumped whenever the header or the slot layout changes.
pub const LAYOUT_VERSION: u32 = 1;
/// Bytes reserved for the header; the slots start here.
pub const HEADER_BYTES: usize = 4096;
/// Environment variable that names the ring file for the library.
pub const RING_ENV: &str = "SCALENE_RS_RING";
/// A Python process of the program other than the one that claimed the ring named by
/// [`RING_ENV`] makes a ring of its own, named that path followed by this separator and
/// its pid (`...ring.4242`), when the header's `child_capacity` says so.
pub const CHILD_RING_SEP: u8 = b'.';
/// Environment variable by which the profiler asks for Python's allocator to be wrapped
/// where the interpreter allows it ([`PYMEM_HOOK`]), `PYTHONMALLOC=malloc` elsewhere; or
/// says that the `PYTHONMALLOC=malloc` it set is its own ([`PYMEM_MALLOC`]). Either way a
/// free-threaded interpreter, which refuses to start with `PYTHONMALLOC=malloc` (its object
/// allocator must be mimalloc), drops it and is wrapped.
pub const PYMEM_ENV: &str = "SCALENE_RS_PYMEM";
pub const PYMEM_HOOK: &str = "hook";
pub const PYMEM_MALLOC: &str = "malloc";

/// A thread allocated a window's worth of bytes: `a` = `b` = the bytes, `c` = of which by
/// the interpreter's own image, `ptr` = the allocation that filled the window (it is
/// watched for its free; 0 when the watch table was full).
pub const EV_ALLOC: u32 = 1;
/// [`EV_ALLOC`] whose window was filled by one block of at least a window (the same
/// fields). Its thread waits on a handshake budget of its own, so its stack is its own
/// unless such blocks come faster than that budget allows. A consumer that predates it
/// reads it as an unknown event.
pub const EV_ALLOC_LARGE: u32 = 6;
/// A thread freed a window's worth of bytes: `a` = the bytes.
pub const EV_FREE: u32 = 2;
/// A thread copied a copy window's worth of bytes (memcpy/memmove): `a` = bytes.
pub const EV_COPY: u32 = 3;
/// A watched (sampled) allocation was freed: `ptr`.
pub const EV_SAMPLED_FREE: u32 = 4;
/// A watched (sampled) allocation was moved by realloc: `ptr` = where it was, `a` = where
/// it is now (it stays watched there, because the memory it stands for is still live).
pub const EV_SAMPLED_MOVE: u32 = 5;

/// The ring file's header. The profiler creates the file and fills the constant fields;
/// the one process that claims it (`producer_pid`) produces events. A ring of one of the
/// program's other processes is created and filled the same way by that process's library
/// (the constant fields copied from the profiler's ring), already claimed.
#[repr(C)]
pub struct Header {
    pub magic: AtomicU64,
    pub version: AtomicU32,
    pub slot_bytes: AtomicU32,
    /// Number of slots, a power of two.
    pub capacity: AtomicU64,
    /// Set by the library that claims the ring (compare-and-swap from 0).
    pub producer_pid: AtomicI32,
    /// The profiler's pid (stale rings of dead profilers are removed by name and by this).
    pub consumer_pid: AtomicI32,
    /// Sampling window of allocated (and of freed) bytes.
    pub window: AtomicU64,
    /// Sampling window of copied bytes.
    pub copy_window: AtomicU64,
    /// [`HANDSHAKE_STARTING`] until the profiler can read stacks, then
    /// [`HANDSHAKE_ON`] while it answers handshakes, or [`HANDSHAKE_OFF`].
    pub handshake: AtomicU32,
    /// Bumped and woken (futex) by a producer that waits for an answer.
    pub doorbell: AtomicU32,
    /// Sampled live footprint and its peak, bytes.
    pub footprint: AtomicI64,
    pub peak: AtomicI64,
    /// Events lost because the ring was full.
    pub dropped: AtomicU64,
    /// The interpreter image's address range in the producer, for information.
    pub python_lo: AtomicU64,
    pub python_hi: AtomicU64,
    /// Handshakes the producer gave up waiting for.
    pub handshake_timeouts: AtomicU64,
    /// Handshakes the profiler has answered (it is alive and answering, maybe slowly).
    pub answers: AtomicU64,
    /// Bumped when a new profiler takes the ring over (`attach` after the `run` that
    /// started the program is gone). Then a library that stopped waiting waits again.
    pub consumer_generation: AtomicU64,
    /// Next ticket to reserve (producers), on its own cache line.
    pub head: AtomicU64,
    pub _pad1: [u64; 7],
    /// Next ticket to read (the consumer), on its own cache line.
    pub tail: AtomicU64,
    pub _pad2: [u64; 7],
    /// Not 0: the profiler follows the program's other Python processes, and each of them
    /// makes a ring of its own of this many slots (a power of two; see
    /// [`CHILD_RING_SEP`]), its header filled like this one. Added at the end, so a ring of a
    /// profiler that predates it reads 0 (no rings of their own).
    pub child_capacity: AtomicU64,
    /// `attach` with memory only (0 otherwise): CLOCK_MONOTONIC nanoseconds of the
    /// profiler's latest heartbeat, written at least every [`HEARTBEAT_NS`]. A library
    /// that finds it older than [`HEARTBEAT_STALE_NS`] judges the profiler gone (the
    /// profiler's pid may mean nothing in the target's pid namespace).
    pub heartbeat_ns: AtomicU64,
    /// `attach` with memory only: set to 1 by the profiler when it detaches. The library
    /// then stops counting and puts back every function pointer it patched.
    pub detached: AtomicU32,
    /// `attach` with memory only: set to 1 by the library once the interpreter's own
    /// allocator (`PyMem_SetAllocator`) is wrapped, which happens at the interpreter's next
    /// pending call (on its main thread, with the thread state attached).
    pub pymem_wrapped: AtomicU32,
}

/// How often the profiler of an `attach` with memory writes [`Header::heartbeat_ns`].
pub const HEARTBEAT_NS: u64 = 200_000_000;
/// A heartbeat older than this means the profiler is gone.
pub const HEARTBEAT_STALE_NS: u64 = 3_000_000_000;

/// Exported by the library for `attach` with memory: `int scalene_rs_attach(const char
/// *ring_path, unsigned long how)`. The profiler calls it in the target (a remote call on
/// a thread stopped where it holds no lock) after loading the library there. Returns one
/// of the `ATTACH_*` codes.
///
/// `how` is [`ATTACH_FROM_RUNNING_CODE`] when the thread was stopped while running the
/// interpreter's code. Anything else means it was stopped in a wait. A caller that passes
/// one argument leaves whatever was in the register, never that value in practice.
pub const ATTACH_SYMBOL: &str = "scalene_rs_attach";
/// `how` of [`ATTACH_SYMBOL`]: the calling thread was stopped while running the
/// interpreter's code, where it may hold the interpreter's pending-call lock (the library
/// then wraps the allocator from a thread of its own that takes the GIL, on 3.8+).
pub const ATTACH_FROM_RUNNING_CODE: u64 = 0x5ca1_e0b5_c0de_0001;
/// Counting: the ring is claimed, the allocation functions patched. The interpreter's own
/// allocator is wrapped at its next pending call, or once a thread of the library has the
/// GIL ([`ATTACH_FROM_RUNNING_CODE`]) ([`Header::pymem_wrapped`]).
pub const ATTACH_OK: i32 = 0;
/// The library was loaded with LD_PRELOAD (the program runs under `run`), so nothing was
/// done.
pub const ATTACH_PRELOADED: i32 = -1;
/// The ring file could not be opened, mapped or claimed.
pub const ATTACH_NO_RING: i32 = -2;
/// No Python interpreter image in this process.
pub const ATTACH_NOT_PYTHON: i32 = -3;
/// A free-threaded interpreter, whose object allocator cannot be wrapped while it runs.
pub const ATTACH_FREE_THREADED: i32 = -4;
/// The C library's allocation functions were not found.
pub const ATTACH_NO_LIBC: i32 = -5;
/// Another profiler's attach is still counting in this process (one at a time).
pub const ATTACH_BUSY: i32 = -6;

/// One event. `seq` = ticket + 1 once the event is written (release). The consumer reads
/// a slot only when its `seq` says it holds the ticket it expects. Tickets wrap (never in
/// practice: after 2^64 events). But the header is the program's to write, and a tail of
/// `u64::MAX` must not overflow the reader (the `ring` fuzz target's find).
#[repr(C)]
pub struct Slot {
    pub seq: AtomicU64,
    pub kind: AtomicU32,
    pub tid: AtomicI32,
    pub a: AtomicU64,
    pub b: AtomicU64,
    pub c: AtomicU64,
    pub ptr: AtomicU64,
    pub time_ns: AtomicU64,
    /// 1 when the producer waits for an answer; the consumer sets `ack` to 1 and wakes it.
    pub wants_ack: AtomicU32,
    pub ack: AtomicU32,
}

/// What a producer writes into a slot.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EventData {
    pub kind: u32,
    pub tid: i32,
    pub a: u64,
    pub b: u64,
    pub c: u64,
    pub ptr: u64,
    pub time_ns: u64,
    pub wants_ack: bool,
}

impl Header {
    /// Reserves the next ticket, or returns None (and counts a dropped event) when every
    /// slot is written and not yet read. Never blocks.
    pub fn reserve(&self) -> Option<u64> {
        let cap = self.capacity.load(Ordering::Relaxed);
        let mut head = self.head.load(Ordering::Acquire);
        loop {
            let tail = self.tail.load(Ordering::Acquire);
            if head.wrapping_sub(tail) >= cap {
                self.dropped.fetch_add(1, Ordering::Relaxed);
                return None;
            }
            match self.head.compare_exchange_weak(
                head,
                head.wrapping_add(1),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Some(head),
                Err(x) => head = x,
            }
        }
    }

    /// The slot of `ticket`.
    ///
    /// # Safety
    /// `self` must be the start of a mapping at least `file_bytes(capacity)` long.
    pub unsafe fn slot(&self, ticket: u64) -> &Slot {
        let cap = self.capacity.load(Ordering::Relaxed);
        let base = (self as *const Header as *const u8).wrapping_add(HEADER_BYTES) as *const Slot;
        // SAFETY: the index is below `capacity` and the caller vouches for the mapping.
        unsafe { &*base.add((ticket & (cap.max(1) - 1)) as usize) }
    }
}

impl Slot {
    /// Writes `e` as the event of `ticket` and makes it visible to the consumer.
    pub fn publish(&self, ticket: u64, e: &EventData) {
        self.kind.store(e.kind, Ordering::Relaxed);
        self.tid.store(e.tid, Ordering::Relaxed);
        self.a.store(e.a, Ordering::Relaxed);
        self.b.store(e.b, Ordering::Relaxed);
        self.c.store(e.c, Ordering::Relaxed);
        self.ptr.store(e.ptr, Ordering::Relaxed);
        self.time_ns.store(e.time_ns, Ordering::Relaxed);
        self.ack.store(0, Ordering::Relaxed);
        self.wants_ack.store(e.wants_ack as u32, Ordering::Relaxed);
        self.seq.store(ticket.wrapping_add(1), Ordering::Release);
    }

    /// Reads the event of `ticket`, if it is written.
    pub fn read(&self, ticket: u64) -> Option<EventData> {
        if self.seq.load(Ordering::Acquire) != ticket.wrapping_add(1) {
            return None;
        }
        Some(EventData {
            kind: self.kind.load(Ordering::Relaxed),
            tid: self.tid.load(Ordering::Relaxed),
            a: self.a.load(Ordering::Relaxed),
            b: self.b.load(Ordering::Relaxed),
            c: self.c.load(Ordering::Relaxed),
            ptr: self.ptr.load(Ordering::Relaxed),
            time_ns: self.time_ns.load(Ordering::Relaxed),
            wants_ack: self.wants_ack.load(Ordering::Relaxed) != 0,
        })
    }
}

/// Bytes of the whole ring file for `capacity` slots.
pub const fn file_bytes(capacity: u64) -> usize {
    HEADER_BYTES + capacity as usize * core::mem::size_of::<Slot>()
}

const _: () = assert!(core::mem::size_of::<Header>() <= HEADER_BYTES);
const _: () = assert!(core::mem::size_of::<Slot>() == 64);

/// CLOCK_MONOTONIC in nanoseconds: the clock events are stamped with, read by both sides.
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: fills a timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
