//! The shared-memory ring's layout: the one definition both sides compile (the preload
//! library as the producer, `scalene_rs::memory` as the consumer, through `#[path]`).
//!
//! Owns: the header and slot structures, the event kinds and the constants of the format.
//! Must not: hold logic beyond plain field access; both sides rely on `#[repr(C)]` only.

use core::sync::atomic::{AtomicI32, AtomicI64, AtomicU32, AtomicU64};

/// "SCLNRING" little-endian.
pub const MAGIC: u64 = u64::from_le_bytes(*b"SCLNRING");
/// Bumped whenever the header or the slot layout changes.
pub const LAYOUT_VERSION: u32 = 1;
/// Bytes reserved for the header; the slots start here.
pub const HEADER_BYTES: usize = 4096;
/// Environment variable that names the ring file for the library.
pub const RING_ENV: &str = "SCALENE_RS_RING";

/// A thread's net allocation grew by a window: `a` = net bytes (positive), `b` = bytes
/// allocated in the window, `c` = of which by the interpreter's own image, `ptr` = the
/// allocation that crossed the window (it is watched for its free).
pub const EV_ALLOC: u32 = 1;
/// A thread's net allocation shrank by a window: `a` = net bytes freed (positive).
pub const EV_FREE: u32 = 2;
/// A thread copied a copy window's worth of bytes (memcpy/memmove): `a` = bytes.
pub const EV_COPY: u32 = 3;
/// A watched (sampled) allocation was freed: `ptr`.
pub const EV_SAMPLED_FREE: u32 = 4;

/// The ring file's header. The profiler creates the file and fills the constant fields;
/// the one process that claims it (`producer_pid`) produces events.
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
    /// Sampling window of net allocation, bytes.
    pub window: AtomicU64,
    /// Sampling window of copied bytes.
    pub copy_window: AtomicU64,
    /// 1 while the profiler answers handshakes (it reads the allocating thread's stack).
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
    pub _pad0: [u64; 2],
    /// Next ticket to reserve (producers), on its own cache line.
    pub head: AtomicU64,
    pub _pad1: [u64; 7],
    /// Next ticket to read (the consumer), on its own cache line.
    pub tail: AtomicU64,
    pub _pad2: [u64; 7],
}

/// One event. `seq` = ticket + 1 once the event is written (release); the consumer reads a
/// slot only when its `seq` says it holds the ticket it expects.
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

/// Bytes of the whole ring file for `capacity` slots.
pub const fn file_bytes(capacity: u64) -> usize {
    HEADER_BYTES + capacity as usize * core::mem::size_of::<Slot>()
}

const _: () = assert!(core::mem::size_of::<Header>() <= HEADER_BYTES);
const _: () = assert!(core::mem::size_of::<Slot>() == 64);
