//! The GPU part of a profile (docs/profile-json.md): per line, per process, per device and
//! for the whole program. Plain data, filled by `gpu::ledger`, read by every renderer.

use super::Frame;
use serde::{Deserialize, Serialize};

/// A line's GPU figures.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LineGpu {
    /// The line's share of the program's GPU busy time (GPU-seconds: SM utilization ×
    /// time, every device), percent.
    pub gpu_pct: f64,
    /// The most GPU memory the line's process held (every device) at a poll while the line
    /// ran, MB.
    pub gpu_mem_peak_mb: f64,
}

/// The program's GPU figures, or why there are none.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuSummary {
    /// Why there are no per-line GPU figures (no driver, no GPU, NVML failed to start, the
    /// program never used a GPU); None when there are.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unavailable: Option<String>,
    /// `unavailable` is kept here but not said in the report: NVML could not be loaded (no
    /// NVIDIA driver installed, as on most machines) and GPU figures were not asked for
    /// (`--gpu`, `SCALENE_RS_NVML_LIB`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub quiet: bool,
    /// What else to know: NVML failed mid-run (figures up to then), a function the driver
    /// lacks, a corrected clock.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    /// The driver's version, as NVML gives it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver: Option<String>,
    /// GPU busy seconds of the program's processes (SM utilization × time, every device).
    pub gpu_s: f64,
    /// Of those, seconds no line could be found for (no sample of the process then).
    pub unattributed_s: f64,
    /// Peak of the GPU memory the program's processes held together at one poll, MB.
    pub mem_peak_mb: f64,
    /// (seconds since start, the program's GPU busy percent of one GPU — the devices'
    /// summed —, its GPU memory MB) in equal slices of the run, oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub timeline: Vec<[f64; 3]>,
    /// Every device NVML showed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<GpuDevice>,
    /// Every full stack charged GPU time, with its milliseconds, most first (the GPU flame
    /// graph and pprof's `gpu` values).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stacks: Vec<GpuStack>,
    /// Utilization samples of processes outside the program on the same devices, seen and
    /// never charged.
    #[serde(default)]
    pub other_process_samples: u64,
}

impl GpuSummary {
    /// Whether there is anything per line to show (columns, timeline).
    pub fn has_data(&self) -> bool {
        self.unavailable.is_none() && (self.gpu_s > 0.0 || self.mem_peak_mb > 0.0)
    }
}

/// One GPU's figures for the program.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuDevice {
    pub index: u32,
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub uuid: String,
    /// The program's GPU busy seconds on it.
    pub gpu_s: f64,
    /// The program's peak GPU memory on it, MB.
    pub mem_peak_mb: f64,
    /// The device's mean busy percent while recorded, every process's work counted (NVML's
    /// device-wide utilization; context only, never charged to lines).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_busy_pct: Option<f64>,
}

/// A full stack (innermost first) and the GPU time charged to it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuStack {
    pub frames: Vec<Frame>,
    /// The kernel thread id of the thread that was there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub native_id: Option<i32>,
    /// GPU busy milliseconds (SM utilization × time).
    pub gpu_ms: f64,
}
