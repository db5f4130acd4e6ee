//! The memory part of a profile (docs/profile-json.md): per line and for the whole
//! program. Plain data, filled by `memory`, read by every renderer.
//!
//! Owns: [`LineMemory`], [`MemorySummary`] and what they list (native allocations,
//! allocating stacks, likely leaks).
//! Must not: fold memory events (`memory` does) or format output.

use super::Frame;
use serde::{Deserialize, Serialize};

/// A line's memory: what it allocated (sampled), how much of it the interpreter itself
/// allocated, its live footprint's peak and mean, its footprint over time, and the bytes it
/// copied per second of the program.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LineMemory {
    pub mem_alloc_mb: f64,
    pub mem_python_pct: f64,
    pub mem_peak_mb: f64,
    pub mem_avg_mb: f64,
    /// The line's live footprint (MB) in equal slices of the run, oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mem_timeline: Vec<f64>,
    pub copy_mb_s: f64,
    /// `--native`: the native functions its sampled allocations came from (the innermost
    /// frame of each handshake's stack, the allocation machinery's frames dropped), most
    /// bytes first, at most [`NATIVE_FUNCTIONS_PER_LINE`](super::NATIVE_FUNCTIONS_PER_LINE).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mem_native_functions: Vec<NativeAllocation>,
}

/// A native function's share of a line's allocations.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NativeAllocation {
    /// Its symbol (demangled), or `module+0xSTART` when it has none.
    pub function: String,
    /// The file name of its module.
    pub module: String,
    /// MB of the sampled allocations it made (each sampled window's bytes, as the line's
    /// `mem_alloc_mb`).
    pub mb: f64,
}

impl LineMemory {
    pub(crate) fn is_empty(&self) -> bool {
        self.mem_alloc_mb == 0.0 && self.copy_mb_s == 0.0 && self.mem_peak_mb == 0.0
    }
}

/// The program's memory, when it was recorded (`run` without `--cpu-only`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MemorySummary {
    /// Peak of the sampled live footprint, MB.
    pub peak_mb: f64,
    /// (seconds since start, footprint MB), oldest first.
    pub timeline: Vec<[f64; 2]>,
    /// Allocation bytes sampled, MB, and the share of them the interpreter allocated.
    pub alloc_mb: f64,
    pub python_pct: f64,
    pub copy_mb: f64,
    /// Lines whose sampled allocations were rarely freed while the footprint grew.
    pub leaks: Vec<Leak>,
    /// The sampling windows, bytes.
    pub window_bytes: u64,
    pub copy_window_bytes: u64,
    /// Events lost because the ring was full, and handshakes the program gave up on.
    pub dropped_events: u64,
    pub handshake_timeouts: u64,
    /// Handshakes answered (allocations tied to their line while their thread waited), and
    /// the program's time spent waiting for those answers, ms (all threads together).
    #[serde(default)]
    pub handshakes: u64,
    #[serde(default)]
    pub handshake_wait_ms: f64,
    /// Allocations of at least a window in one block (a large buffer, an array), MB. Of
    /// those, also the MB charged without a stack of their own, with how many events that
    /// was. They went to the line of their thread's latest handshake. Such blocks came
    /// faster than their own handshake budget, or the profiler answered too late.
    #[serde(default)]
    pub large_alloc_mb: f64,
    #[serde(default)]
    pub large_alloc_without_own_stack_mb: f64,
    #[serde(default)]
    pub large_allocs_without_own_stack: u64,
    /// Every distinct full stack that allocated, with its bytes (the allocation flame
    /// graph), most first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stacks: Vec<MemoryStack>,
    /// `attach` loaded our library into the process, so memory is counted from the attach on
    /// (what it held before is not attributed to lines; the footprint starts at its C heap
    /// in use then).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub since_attach: bool,
    /// `--native`: how many handshakes' stacks got their native frames, and how many kept
    /// their Python frames alone (with why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub native: Option<MemoryNativeMeta>,
}

/// The native stacks of a `--native` recording's allocations, read at the handshakes.
/// Events sent without waiting keep Python frames and are not counted here.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MemoryNativeMeta {
    pub native_stacks: u64,
    pub python_only_stacks: u64,
    /// Why stacks kept their Python frames alone, with how many each.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub python_only_reasons: std::collections::BTreeMap<String, u64>,
}

/// A full stack (innermost first) and the bytes its sampled allocation windows stand for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemoryStack {
    pub frames: Vec<Frame>,
    /// KiB allocated (rounded).
    pub alloc_kib: u64,
}

/// A likely leak.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Leak {
    pub filename: String,
    pub line: u32,
    /// Laplace's rule of succession: 1 − (frees + 1) / (allocations + 2).
    pub likelihood: f64,
    /// Growth of the program's footprint over the run, MB/s.
    pub growth_mb_s: f64,
    pub sampled_allocs: u64,
    pub sampled_frees: u64,
}
