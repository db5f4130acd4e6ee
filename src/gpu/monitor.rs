//! The NVML poller. Our own thread asks NVML, every [`GpuConfig::poll`], for each device's
//! per-process utilization samples (newer than the last one seen) and its compute processes'
//! memory, and sends what it read over a channel.
//!
//! Owns:
//! - loading NVML (through `nvml-wrapper`, at run time, because the binary runs where no
//!   driver is installed);
//! - falling back to older functions on older drivers;
//! - telling failures apart ("not found" is no new sample; a lost GPU ends the polling; a
//!   missing function is said once);
//! - stopping within a bounded wait even when a call into the driver never returns.
//!
//! Must not: change any GPU setting (accounting mode, clocks, persistence), or block its
//! caller. The sampler's thread only takes what has arrived.

use super::GpuConfig;
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, Nvml};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One GPU that NVML showed.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct DeviceInfo {
    pub(crate) index: u32,
    pub(crate) name: String,
    pub(crate) uuid: String,
}

/// One per-process utilization sample. Process `pid` kept `sm_pct` % of device `device`'s
/// SMs busy over NVML's sampling period ending at `t_us` (NVML's timestamp, µs).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct UtilSample {
    pub(crate) device: u32,
    pub(crate) pid: u32,
    pub(crate) t_us: u64,
    pub(crate) sm_pct: u32,
}

/// GPU memory process `pid` held on `device` when polled, MiB.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct MemReading {
    pub(crate) device: u32,
    pub(crate) pid: u32,
    pub(crate) mib: f64,
}

/// What the poller tells the recording.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Report {
    /// NVML answered, and these devices are watched.
    Started {
        devices: Vec<DeviceInfo>,
        driver: Option<String>,
    },
    /// No GPU figures at all, and why (no driver, no device, no permission).
    Unavailable(String),
    /// No GPU figures, because the NVML library could not be loaded (no NVIDIA driver installed,
    /// as on most machines), and why.
    NoLibrary(String),
    /// One poll of every device, read by `at_us` (our clock, taken after the calls).
    Poll {
        at_us: u64,
        util: Vec<UtilSample>,
        mem: Vec<MemReading>,
        /// Device-wide busy % (every process's work, not only the program's), by device.
        device_busy: Vec<(u32, u32)>,
    },
    /// Something the report should say once (a function this driver lacks, say).
    Note(String),
    /// NVML failed for good at `at_us`, so no more polls.
    Failed { at_us: u64, why: String },
    /// The poller ended as asked, after a last poll.
    Stopped,
}

/// The running poller.
pub(crate) struct Monitor {
    rx: Receiver<Report>,
    stop: Arc<AtomicBool>,
}

impl Monitor {
    /// Starts polling on a thread of its own. Returns at once (loading NVML happens there).
    pub(crate) fn start(cfg: &GpuConfig) -> Monitor {
        let (tx, rx) = mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let cfg = cfg.clone();
        let spawned = std::thread::Builder::new()
            .name("scalene-rs-nvml".into())
            .spawn(move || poll_loop(&cfg, &tx, &flag));
        if let Err(e) = spawned {
            // The receiver still answers, with this one line.
            let (tx, rx2) = mpsc::channel();
            let _ = tx.send(Report::Unavailable(format!(
                "could not start the NVML thread: {e}"
            )));
            return Monitor { rx: rx2, stop };
        }
        Monitor { rx, stop }
    }

    /// What the poller sent since the last call, without waiting.
    pub(crate) fn take(&self) -> Vec<Report> {
        self.rx.try_iter().collect()
    }

    /// Asks the poller to stop after a last poll and waits for it at most `wait`. Returns
    /// what it sent meanwhile and whether it stopped in time (a call into the driver that
    /// never returns leaves the thread behind, and it ends with the process).
    pub(crate) fn stop(self, wait: Duration) -> (Vec<Report>, bool) {
        self.stop.store(true, Ordering::SeqCst);
        let deadline = Instant::now() + wait;
        let mut got = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok(Report::Stopped) => return (got, true),
                Ok(r) => {
                    // A failure or an unavailable NVML ends the thread without Stopped.
                    let last = matches!(
                        r,
                        Report::Failed { .. } | Report::Unavailable(_) | Report::NoLibrary(_)
                    );
                    got.push(r);
                    if last {
                        return (got, true);
                    }
                }
                Err(RecvTimeoutError::Disconnected) => return (got, true),
                Err(RecvTimeoutError::Timeout) => return (got, false),
            }
        }
    }
}

/// Why NVML could not be started, for the report's header.
fn init_failure(lib: &str, e: &NvmlError) -> String {
    match e {
        NvmlError::LibloadingError(le) => format!(
            "NVML could not be loaded ({le}): no NVIDIA driver here? \
             (set {} to the library's path)",
            super::NVML_LIB_ENV
        ),
        NvmlError::FailedToLoadSymbol(s) => {
            format!("{lib} is not a usable NVML (it lacks nvmlInit_v2: {s})")
        }
        NvmlError::DriverNotLoaded => "the NVIDIA driver is not loaded (NVML: nvmlInit)".into(),
        NvmlError::NoPermission => "no permission to use NVML (nvmlInit)".into(),
        other => format!("NVML failed to start: {other}"),
    }
}

/// A call's error that ends the polling for good.
fn fatal(e: &NvmlError) -> bool {
    matches!(
        e,
        NvmlError::GpuLost
            | NvmlError::Uninitialized
            | NvmlError::DriverNotLoaded
            | NvmlError::LibRmVersionMismatch
            | NvmlError::ResetRequired
    )
}

/// A function this driver's NVML does not have (or does not offer on this device).
fn missing(e: &NvmlError) -> bool {
    matches!(
        e,
        NvmlError::FailedToLoadSymbol(_) | NvmlError::FunctionNotFound | NvmlError::NotSupported
    )
}

/// Which function lists a device's compute processes on this driver.
#[derive(Debug, Clone, Copy, PartialEq)]
enum ProcessList {
    V3,
    V2,
    None,
}

/// The processes on `d` and their memory, with the newest function this driver has.
fn compute_processes(
    d: &Device<'_>,
    which: &mut ProcessList,
) -> Result<Vec<(u32, Option<u64>)>, NvmlError> {
    let used = |m: UsedGpuMemory| match m {
        UsedGpuMemory::Used(b) => Some(b),
        UsedGpuMemory::Unavailable => None,
    };
    loop {
        let got = match *which {
            ProcessList::V3 => d.running_compute_processes(),
            ProcessList::V2 => d.running_compute_processes_v2(),
            ProcessList::None => return Ok(Vec::new()),
        };
        match got {
            Ok(list) => {
                return Ok(list
                    .into_iter()
                    .map(|p| (p.pid, used(p.used_gpu_memory)))
                    .collect())
            }
            Err(e) if missing(&e) => {
                *which = match *which {
                    ProcessList::V3 => ProcessList::V2,
                    _ => ProcessList::None,
                };
            }
            Err(e) => return Err(e),
        }
    }
}

/// Environment variable naming a file that gets every poll's answers, raw.
pub const TRACE_ENV: &str = "SCALENE_RS_NVML_TRACE";

/// One poll's answers as lines: `poll AT`, `util DEVICE PID TIMESTAMP SM%`, `mem DEVICE PID
/// MIB` (times µs since the epoch).
fn trace_poll(out: &mut std::fs::File, at_us: u64, util: &[UtilSample], mem: &[MemReading]) {
    use std::io::Write;
    let mut text = format!("poll {at_us}\n");
    for u in util {
        text.push_str(&format!(
            "util {} {} {} {}\n",
            u.device, u.pid, u.t_us, u.sm_pct
        ));
    }
    for m in mem {
        text.push_str(&format!("mem {} {} {:.0}\n", m.device, m.pid, m.mib));
    }
    let _ = out.write_all(text.as_bytes());
}

/// After this many polls in a row in which every call failed, NVML is given up.
const FAILED_POLLS_MAX: u32 = 5;

fn poll_loop(cfg: &GpuConfig, tx: &Sender<Report>, stop: &AtomicBool) {
    let nvml = match Nvml::builder()
        .lib_path(std::ffi::OsStr::new(&cfg.library))
        .init()
    {
        Ok(n) => n,
        Err(e) => {
            let why = init_failure(&cfg.library, &e);
            let _ = tx.send(match e {
                NvmlError::LibloadingError(_) => Report::NoLibrary(why),
                _ => Report::Unavailable(why),
            });
            return;
        }
    };
    let count = match nvml.device_count() {
        Ok(0) => {
            let _ = tx.send(Report::Unavailable("NVML found no GPU".into()));
            return;
        }
        Ok(n) => n,
        Err(e) => {
            let _ = tx.send(Report::Unavailable(format!(
                "NVML could not count the GPUs: {e}"
            )));
            return;
        }
    };
    let mut devices = Vec::new();
    let mut infos = Vec::new();
    for i in 0..count {
        match nvml.device_by_index(i) {
            Ok(d) => {
                let name = d.name().unwrap_or_else(|_| format!("GPU {i}"));
                let uuid = d.uuid().unwrap_or_default();
                infos.push(DeviceInfo {
                    index: i,
                    name,
                    uuid,
                });
                devices.push((i, d));
            }
            Err(e) => {
                let _ = tx.send(Report::Note(format!("GPU {i} could not be opened: {e}")));
            }
        }
    }
    if devices.is_empty() {
        let _ = tx.send(Report::Unavailable(
            "NVML could open none of the GPUs".into(),
        ));
        return;
    }
    let _ = tx.send(Report::Started {
        devices: infos,
        driver: nvml.sys_driver_version().ok(),
    });
    // SCALENE_RS_NVML_TRACE=FILE: every answer, raw, for a look at what NVML says.
    let mut trace = std::env::var_os(TRACE_ENV).and_then(|p| {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(p)
            .ok()
    });
    let n = devices.len();
    let mut last_seen = vec![0u64; n];
    let mut util_ok = vec![true; n];
    let mut lists = vec![ProcessList::V3; n];
    let mut said_no_util = false;
    let mut said_no_list = false;
    let mut failed_polls = 0;
    loop {
        let last = stop.load(Ordering::SeqCst);
        let mut util = Vec::new();
        let mut mem = Vec::new();
        let mut device_busy = Vec::new();
        let mut failures: Vec<NvmlError> = Vec::new();
        let mut calls = 0;
        for (k, (index, d)) in devices.iter().enumerate() {
            if util_ok[k] {
                calls += 1;
                match d.process_utilization_stats(last_seen[k]) {
                    Ok(samples) => {
                        for s in samples {
                            last_seen[k] = last_seen[k].max(s.timestamp);
                            util.push(UtilSample {
                                device: *index,
                                pid: s.pid,
                                t_us: s.timestamp,
                                sm_pct: s.sm_util,
                            });
                        }
                    }
                    // No sample newer than the last one seen.
                    Err(NvmlError::NotFound) => {}
                    // The count changed between NVML's two calls, so that is left to the next poll.
                    Err(NvmlError::InsufficientSize(_)) => {}
                    Err(e) if missing(&e) || matches!(e, NvmlError::NoPermission) => {
                        util_ok[k] = false;
                        if !said_no_util {
                            said_no_util = true;
                            let what = if matches!(e, NvmlError::NoPermission) {
                                "no permission to read"
                            } else {
                                "this driver's NVML cannot give"
                            };
                            let _ = tx.send(Report::Note(format!(
                                "{what} per-process GPU utilization \
                                 (nvmlDeviceGetProcessUtilization: {e}): GPU memory only"
                            )));
                        }
                    }
                    Err(e) => failures.push(e),
                }
            }
            calls += 1;
            match compute_processes(d, &mut lists[k]) {
                Ok(list) => {
                    for (pid, bytes) in list {
                        if let Some(b) = bytes {
                            mem.push(MemReading {
                                device: *index,
                                pid,
                                mib: b as f64 / (1u64 << 20) as f64,
                            });
                        }
                    }
                    if lists[k] == ProcessList::None && !said_no_list {
                        said_no_list = true;
                        let _ = tx.send(Report::Note(
                            "this driver's NVML cannot list the processes on a GPU \
                             (nvmlDeviceGetComputeRunningProcesses_v3/_v2): no GPU memory figures"
                                .into(),
                        ));
                    }
                }
                Err(e) => failures.push(e),
            }
            calls += 1;
            match d.utilization_rates() {
                Ok(u) => device_busy.push((*index, u.gpu)),
                Err(e) if !missing(&e) && !matches!(e, NvmlError::NoPermission) => failures.push(e),
                Err(_) => {}
            }
        }
        // Taken after the calls, so everything this poll read was so by then.
        let at_us = crate::timeline::now_us();
        if let Some(e) = failures.iter().find(|e| fatal(e)) {
            let _ = tx.send(Report::Failed {
                at_us,
                why: format!("NVML failed: {e}"),
            });
            return;
        }
        failed_polls = if calls > 0 && failures.len() >= calls {
            failed_polls + 1
        } else {
            0
        };
        if failed_polls >= FAILED_POLLS_MAX {
            let why = failures
                .first()
                .map_or_else(|| "unknown error".to_string(), |e| e.to_string());
            let _ = tx.send(Report::Failed {
                at_us,
                why: format!("NVML failed {FAILED_POLLS_MAX} polls in a row: {why}"),
            });
            return;
        }
        if let Some(t) = trace.as_mut() {
            trace_poll(t, at_us, &util, &mem);
        }
        let sent = tx.send(Report::Poll {
            at_us,
            util,
            mem,
            device_busy,
        });
        if sent.is_err() || last {
            let _ = tx.send(Report::Stopped);
            return;
        }
        // Sleep in short steps so that a stop is answered quickly.
        let until = Instant::now() + cfg.poll;
        while Instant::now() < until && !stop.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(5).min(cfg.poll));
        }
    }
}
