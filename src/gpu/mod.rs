//! GPU figures from outside the target: how busy each line keeps an NVIDIA GPU and how much
//! GPU memory its process held while the line ran.
//!
//! Owns:
//! - the NVML poller ([`monitor`]: our own thread, NVML loaded at run time, never a GPU
//!   setting changed);
//! - the ledger ([`ledger`]) that charges each per-process utilization sample's GPU-seconds
//!   to the lines where that process's threads were during the sample's window, from the
//!   positions the samplers record. The positions are wall-clock, so a thread blocked in a
//!   CUDA synchronize counts where it waits.
//!
//! Must not: read the target's memory, run anything inside it, or block the sampler (the
//! poller talks through a channel the sampler's thread only polls).

pub(crate) mod ledger;
pub(crate) mod monitor;

// The ledger's clock, owned by `timeline` (the sampler stamps positions with it).

/// Environment variable naming the NVML library to load.
pub const NVML_LIB_ENV: &str = "SCALENE_RS_NVML_LIB";
/// The library loaded when [`NVML_LIB_ENV`] is not set.
pub const DEFAULT_NVML_LIB: &str = "libnvidia-ml.so.1";

/// What GPU recording uses.
#[derive(Debug, Clone)]
pub struct GpuConfig {
    /// The NVML library's file name or path.
    pub library: String,
    /// How often NVML is asked (its own per-process samples come about every 1/6–1/5 s).
    pub poll: std::time::Duration,
    /// GPU figures were asked for (`--gpu`, or a library named by [`NVML_LIB_ENV`]). A
    /// machine without the NVIDIA driver is then said to be one. Otherwise, on most
    /// machines (no driver at all) the report says nothing of GPUs.
    pub asked: bool,
}

impl GpuConfig {
    /// The library from [`NVML_LIB_ENV`], else [`DEFAULT_NVML_LIB`]; `asked`: `--gpu`.
    pub fn from_env(asked: bool) -> GpuConfig {
        let named = std::env::var(NVML_LIB_ENV).ok().filter(|s| !s.is_empty());
        GpuConfig {
            asked: asked || named.is_some(),
            library: named.unwrap_or_else(|| DEFAULT_NVML_LIB.to_string()),
            poll: std::time::Duration::from_millis(100),
        }
    }
}
