//! Where each thread was, on the wall clock.
//!
//! Owns: [`Position`] (one thread of a profiled process at one sampling tick) and
//! [`now_us`] (the clock positions are stamped with: microseconds since the Unix epoch,
//! NVML's clock).
//! Must not: know who records or consumes positions. The sampler records them; the GPU
//! ledger charges its samples' time to them.

use crate::python::Frame;
use std::sync::Arc;

/// Where one thread of a profiled process was at one sampling tick.
#[derive(Debug, Clone)]
pub(crate) struct Position {
    /// Wall-clock time of the tick, microseconds since the Unix epoch (NVML's clock).
    pub(crate) t_us: u64,
    pub(crate) pid: i32,
    pub(crate) tid: i32,
    /// The thread's stack, innermost first.
    pub(crate) frames: Arc<[Frame]>,
    /// The frame its time is charged to (the user's line).
    pub(crate) charged: Option<Frame>,
    /// CPU time (user + system) the thread used since its previous sample, seconds.
    pub(crate) cpu_s: f64,
    /// Time since the process's previous sample, µs.
    pub(crate) interval_us: u64,
}

/// Microseconds since the Unix epoch, now.
pub(crate) fn now_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}
