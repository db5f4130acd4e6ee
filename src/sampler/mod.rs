//! The sampling loop: every thread of a Python process, at a steady rate, from outside.
//!
//! Owns: [`Sampler`] — timing (deadline-based, missed ticks counted, never invented), the
//! per-thread CPU time from /proc (user vs system measured by the kernel), the Python-vs-native
//! tag (the innermost frame's current instruction is a CALL of some form), idle and GIL state,
//! folding library frames into the user's calling line, and feeding the [`Aggregator`].
//! Must not: format output, or keep samples one by one (memory stays bounded).

pub mod cputime;

use crate::error::Result;
use crate::profile::{Activity, Aggregator, Profile, ProfileMeta, ThreadSample};
use crate::ptrace;
use crate::python::{self, Frame, PythonProcess, SnapshotOptions, StackWalker};
use cputime::{CpuReading, CpuTracker};
use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

/// What to record.
#[derive(Debug, Clone)]
pub struct SamplerConfig {
    /// Samples per second.
    pub rate_hz: f64,
    /// Count time threads spend off the CPU (sleeping, waiting) too.
    pub wall: bool,
    /// Count only the thread holding the GIL.
    pub gil_only: bool,
    /// Read without pausing the target.
    pub nonblocking: bool,
    /// Keep stdlib / site-packages lines instead of charging them to the calling user line.
    pub profile_all: bool,
}

impl Default for SamplerConfig {
    fn default() -> Self {
        SamplerConfig {
            rate_hz: 100.0,
            wall: false,
            gil_only: false,
            nonblocking: false,
            profile_all: false,
        }
    }
}

/// Running totals, shown live and in the report.
#[derive(Debug, Clone, Default)]
pub struct Stats {
    pub samples: u64,
    pub missed: u64,
    pub errors: u64,
    /// Error messages (first line) and how often each happened.
    pub error_kinds: BTreeMap<String, u64>,
    pub elapsed: Duration,
    /// Things the user should know about the recording (e.g. why there is no memory data).
    pub notes: Vec<String>,
}

/// Whether a file belongs to the Python installation or to installed packages rather than to
/// the user's program.
pub fn is_library_file(path: &str) -> bool {
    if path.starts_with("<frozen ") {
        return true;
    }
    if path.contains("/site-packages/") || path.contains("/dist-packages/") {
        return true;
    }
    // <prefix>/lib/pythonX.Y/...
    if let Some(i) = path.find("/lib/python") {
        let rest = &path[i + "/lib/python".len()..];
        let ver: String = rest.chars().take_while(|c| *c != '/').collect();
        return !ver.is_empty() && ver.chars().all(|c| c.is_ascii_digit() || c == '.');
    }
    false
}

/// Samples one process.
pub struct Sampler {
    pub proc: PythonProcess,
    walker: StackWalker,
    cpu: CpuTracker,
    /// /proc files of the threads, open between samples.
    files: cputime::ThreadFiles,
    cfg: SamplerConfig,
    agg: Aggregator,
    pub stats: Stats,
    last_wall: Option<Instant>,
    /// The target's working directory when we started, for relative file names.
    cwd: Option<String>,
    /// Where each thread was the last time it was seen running: CPU time a thread used
    /// before it went to sleep belongs there, not to the line it sleeps on.
    last_running: HashMap<i32, (Vec<Frame>, Activity)>,
    /// The last listing of the target's threads and when it was taken.
    tids_listed: Option<(Instant, Vec<i32>)>,
}

/// How long a listing of the target's threads is reused. Threads that Python knows are
/// matched by their kernel id at once (3.8+); this bounds how late another new thread's
/// CPU time starts being read.
const RELIST_INTERVAL: Duration = Duration::from_millis(50);

impl Sampler {
    pub fn new(proc: PythonProcess, cfg: SamplerConfig) -> Sampler {
        let walker = StackWalker::new(proc.layout, proc.addrs.types);
        let cwd = std::fs::read_link(format!("/proc/{}/cwd", proc.pid))
            .ok()
            .map(|p| p.to_string_lossy().into_owned());
        Sampler {
            proc,
            walker,
            cpu: CpuTracker::new(),
            files: cputime::ThreadFiles::new(),
            cfg,
            agg: Aggregator::new(),
            stats: Stats::default(),
            last_wall: None,
            cwd,
            last_running: HashMap::new(),
            tids_listed: None,
        }
    }

    /// Takes one sample of every thread. Errors that lose only this sample are counted, not
    /// returned; an error is returned only when the process is gone.
    pub fn sample_once(&mut self) -> Result<()> {
        let pid = self.proc.pid;
        let now = Instant::now();
        let wall_s = self
            .last_wall
            .map(|t| now.duration_since(t).as_secs_f64())
            .unwrap_or(0.0);
        self.last_wall = Some(now);
        let tids = match self.thread_list(pid) {
            Ok(t) => t,
            Err(e) if e.is_process_gone() || !crate::error::process_exists(pid) => {
                return Err(crate::Error::ProcessExited(pid))
            }
            Err(e) => {
                self.count_error(&e.to_string());
                return Ok(());
            }
        };
        let readings: HashMap<i32, CpuReading> = tids
            .iter()
            .filter_map(|&t| Some((t, self.files.read(pid, t)?)))
            .collect();
        if readings.len() < tids.len() {
            // A thread exited: list again next time.
            self.tids_listed = None;
        }
        self.cpu.retain(&tids);
        self.files.retain(&tids);
        let states: HashMap<i32, char> = readings.iter().map(|(t, r)| (*t, r.state)).collect();
        let opts = SnapshotOptions {
            nonblocking: self.cfg.nonblocking,
            thread_names: false,
            ..Default::default()
        };
        let snap = match python::take_snapshot_with_states(
            &self.proc,
            &mut self.walker,
            &opts,
            Some(&states),
        ) {
            Ok(s) => s,
            Err(e) if e.is_process_gone() => return Err(e),
            Err(e) => {
                self.count_error(&e.to_string());
                return Ok(());
            }
        };
        self.stats.samples += 1;
        // A Python thread whose kernel thread we have not listed yet: list again next time.
        if snap
            .threads
            .iter()
            .any(|t| t.native_id.is_some_and(|n| !tids.contains(&n)))
        {
            self.tids_listed = None;
        }
        for t in &snap.threads {
            let Some(tid) = t.native_id else { continue };
            let Some(reading) = readings.get(&tid) else {
                continue;
            };
            let delta = self.cpu.delta(tid, *reading);
            if let Some(err) = &t.error {
                self.count_error(err);
                continue;
            }
            if self.cfg.gil_only && !t.holds_gil {
                continue;
            }
            let idle_s = if self.cfg.wall {
                (wall_s - delta.user_s - delta.system_s).max(0.0)
            } else {
                0.0
            };
            let activity = if t.in_native == Some(true) {
                Activity::Native
            } else {
                Activity::Python
            };
            // Running before the stack was read and not asleep right after: a thread that went
            // to sleep in between must not have its CPU charged to the line it sleeps on.
            let running = reading.state == 'R'
                && !matches!(
                    self.files.state(pid, tid),
                    Some('S') | Some('D') | Some('I') | None
                );
            // CPU time since the last sample: where the thread is now if it is running,
            // else where it was last seen running (it used that CPU before it slept).
            let (cpu_frames, cpu_activity) = match (running, self.last_running.get(&tid)) {
                (false, Some((f, a))) => (f.clone(), *a),
                _ => (t.frames.clone(), activity),
            };
            self.charge(
                tid,
                &cpu_frames,
                cpu_activity,
                delta.user_s,
                delta.system_s,
                0.0,
            );
            // Time off the CPU (wall mode): where the thread waits now.
            self.charge(tid, &t.frames, activity, 0.0, 0.0, idle_s);
            if running {
                self.last_running.insert(tid, (t.frames.clone(), activity));
            }
        }
        self.last_running.retain(|t, _| tids.contains(t));
        Ok(())
    }

    /// The target's threads: listed again from /proc when the last listing is older than
    /// [`RELIST_INTERVAL`] or a thread was found missing or new; else the last listing.
    fn thread_list(&mut self, pid: i32) -> Result<Vec<i32>> {
        if let Some((at, tids)) = &self.tids_listed {
            if at.elapsed() < RELIST_INTERVAL {
                return Ok(tids.clone());
            }
        }
        let tids = ptrace::threads(pid)?;
        self.tids_listed = Some((Instant::now(), tids.clone()));
        Ok(tids)
    }

    fn charge(
        &mut self,
        tid: i32,
        frames: &[Frame],
        activity: Activity,
        user_s: f64,
        system_s: f64,
        idle_s: f64,
    ) {
        if user_s + system_s + idle_s <= 0.0 {
            return;
        }
        let sample = ThreadSample {
            frames,
            activity,
            user_s,
            system_s,
            idle_s,
            native_id: Some(tid),
            thread_name: None,
        };
        let attribution = self.attribution(frames);
        self.agg.add(&sample, attribution);
    }

    /// The frame time is charged to: the innermost frame, or with library folding, the
    /// innermost frame of the user's own code (else the innermost frame).
    fn attribution<'f>(&self, frames: &'f [Frame]) -> Option<&'f Frame> {
        if self.cfg.profile_all {
            return frames.first();
        }
        frames
            .iter()
            .find(|f| !is_library_file(&f.filename))
            .or(frames.first())
    }

    fn count_error(&mut self, msg: &str) {
        self.stats.errors += 1;
        let key: String = msg.chars().take(120).collect();
        *self.stats.error_kinds.entry(key).or_insert(0) += 1;
    }

    /// Samples until `stop()` says so or the process exits. `progress` is called about
    /// four times a second.
    pub fn run(
        &mut self,
        stop: &mut dyn FnMut() -> bool,
        progress: &mut dyn FnMut(&Stats),
    ) -> Result<()> {
        let period = Duration::from_secs_f64(1.0 / self.cfg.rate_hz.max(0.001));
        let start = Instant::now();
        let mut next = start;
        let mut last_progress = start;
        loop {
            if stop() {
                break;
            }
            match self.sample_once() {
                Ok(()) => {}
                Err(e) if e.is_process_gone() => break,
                Err(e) => return Err(e),
            }
            next += period;
            let now = Instant::now();
            if now > next {
                // Fell behind. Ticks stay on their schedule (start + k·period): every tick
                // whose successor is also already due is missed and counted; the latest due
                // one is taken at once. (Restarting the schedule from `now` would drop the
                // fraction of a period lost on every late sample: a sampler needing 130 µs at
                // 10 kHz would take 7.7 kHz while counting almost nothing as missed.)
                let behind = now.duration_since(next).as_secs_f64() / period.as_secs_f64();
                let skipped = behind.floor() as u64;
                self.stats.missed += skipped;
                next += period.mul_f64(skipped as f64);
            } else {
                std::thread::sleep(next - now);
            }
            self.stats.elapsed = start.elapsed();
            if last_progress.elapsed() >= Duration::from_millis(250) {
                last_progress = Instant::now();
                progress(&self.stats);
            }
        }
        self.stats.elapsed = start.elapsed();
        Ok(())
    }

    /// The finished profile.
    pub fn finish(&self, program: String) -> Profile {
        let secs = self.stats.elapsed.as_secs_f64();
        let meta = ProfileMeta {
            program,
            pid: self.proc.pid,
            python_version: self.proc.version.to_string(),
            duration_s: secs,
            samples: self.stats.samples,
            missed_samples: self.stats.missed,
            errors: self.stats.errors,
            rate_hz: if secs > 0.0 {
                self.stats.samples as f64 / secs
            } else {
                0.0
            },
            requested_rate_hz: self.cfg.rate_hz,
            mode: if self.cfg.wall { "wall" } else { "cpu" }.into(),
            profile_all: self.cfg.profile_all,
        };
        let mut cache: HashMap<String, Option<Vec<String>>> = HashMap::new();
        let pid = self.proc.pid;
        let cwd = self.cwd.clone();
        self.agg.finish(meta, &mut |file| {
            cache
                .entry(file.to_string())
                .or_insert_with(|| read_source(pid, &absolute(file, cwd.as_deref())))
                .clone()
        })
    }
}

/// `file` made absolute against `cwd` when it is relative (`python app.py` records "app.py").
pub fn absolute(file: &str, cwd: Option<&str>) -> String {
    match cwd {
        Some(dir) if !file.starts_with('/') && !file.starts_with('<') => {
            format!("{}/{file}", dir.trim_end_matches('/'))
        }
        _ => file.to_string(),
    }
}

/// A source file's lines, read as the target sees the file (through /proc/PID/root) when
/// the process is still there, else from our own view.
pub fn read_source(pid: i32, file: &str) -> Option<Vec<String>> {
    if !file.starts_with('/') {
        return None;
    }
    let via_root = format!("/proc/{pid}/root{file}");
    let bytes = std::fs::read(&via_root)
        .or_else(|_| std::fs::read(file))
        .ok()?;
    Some(
        String::from_utf8_lossy(&bytes)
            .lines()
            .map(|l| l.to_string())
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn library_files() {
        for lib in [
            "/usr/lib/python3.11/threading.py",
            "/root/.pyenv/versions/3.12.1/lib/python3.12/json/decoder.py",
            "/venv/lib/python3.12/site-packages/numpy/core/numeric.py",
            "/usr/lib/python3/dist-packages/yaml/__init__.py",
            "<frozen importlib._bootstrap>",
        ] {
            assert!(is_library_file(lib), "{lib}");
        }
        for user in [
            "/home/me/app.py",
            "<string>",
            "/srv/lib/python_tools/x.py",
            "app.py",
        ] {
            assert!(!is_library_file(user), "{user}");
        }
    }
}
