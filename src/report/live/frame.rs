//! What the live view is handed: one picture of a recording, about once per refresh.
//!
//! Owns: [`LiveFrame`] and its header ([`LiveHeader`], [`LiveProcess`], [`LiveGpu`]), the
//! contract between the session (which takes the pictures) and the live view (which shows
//! them).
//! Must not: compute anything.
//!
//! Every figure here is since start. The view cuts windows out of two frames itself
//! (`tally`).

use std::time::Duration;

/// One picture of a recording, as the sampling thread hands it over (about once per
/// refresh).
#[derive(Debug, Clone)]
pub struct LiveFrame {
    /// Since start: the profile the aggregate makes at this moment (as --json would write
    /// it). Its `total_s` is the 100% of the since-start window. Lines, functions, stacks
    /// and memory are all since start.
    pub profile: crate::profile::Profile,
    pub header: LiveHeader,
}

/// The figures of the recording that the profile does not carry, or carries too late.
#[derive(Debug, Clone, Default)]
pub struct LiveHeader {
    /// Each process recorded: pid, command, Python version, and its share.
    pub processes: Vec<LiveProcess>,
    pub rate_requested_hz: f64,
    /// Ticks taken since start.
    pub samples: u64,
    /// Ticks lost since start: missed, plus stacks that could not be read.
    pub lost: u64,
    /// Since start.
    pub elapsed: Duration,
    /// Share of `samples`, since start, where some thread held the GIL, in percent; None
    /// when not known (and for a free-threaded build, which has none).
    pub gil_pct: Option<f64>,
    /// Threads that ran since the last frame, and those that did not, now.
    pub threads_active: usize,
    pub threads_idle: usize,
    /// Recent footprint samples, MB, oldest first (for the sparkline; the last is now);
    /// empty with --cpu-only.
    pub footprint_mb: Vec<f64>,
    /// The GPU now, when there is one.
    pub gpu: Option<LiveGpu>,
    /// Some(code) once the COMMAND exited.
    pub exited: Option<i32>,
    /// One line of status ("attached to 1234", an error).
    pub note: Option<String>,
}

/// One process of the recording.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LiveProcess {
    pub pid: i32,
    pub command: String,
    pub python_version: String,
    /// Its share of the program's time since start, percent (as
    /// [`ProcessProfile::cpu_pct`](crate::profile::ProcessProfile::cpu_pct)). The view
    /// turns it into seconds with the profile's `total_s` to cut windows.
    pub cpu_pct: f64,
}

/// The GPU now.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LiveGpu {
    /// Its SM use, percent.
    pub util_pct: f64,
    /// Memory held on it, MB.
    pub mem_mb: f64,
}
