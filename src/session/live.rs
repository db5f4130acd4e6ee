//! The recording's side of a live view (`top`): pictures of the profile so far, taken
//! between ticks and handed to the view down a channel.
//!
//! Owns:
//! - [`LiveLink`] (what a recording shares with its view: the channel, the refresh period,
//!   the stop asked for, the command's pid);
//! - [`Publisher`], which takes a picture ([`LiveFrame`]) once per refresh.
//!
//! Must not: draw, or wait on the view. A full channel drops the picture (the view shows
//! the newest one anyway), so a terminal that is slow to draw never slows the sampling.

use crate::memory::fleet::Fleet;
use crate::profile::Profile;
use crate::report::live::{LiveFrame, LiveGpu, LiveHeader, LiveProcess, Wake};
use crate::sampler::tree::ProcessTree;
use crate::sampler::Stats;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::mpsc::SyncSender;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Footprint points kept for the header's sparkline, two minutes at the default refresh.
const FOOTPRINT_POINTS: usize = 120;

/// The header's processes, one per pid, as the view's shares are kept by pid.
///
/// A pid that exec'd has an image before and after (a forked child sampled before its
/// `exec`, as `subprocess` does on 3.8). The row says what it runs now (the later image,
/// because the tree lists a pid's earlier image first) and adds the shares of both.
fn one_row_per_pid(images: &[crate::profile::ProcessProfile]) -> Vec<LiveProcess> {
    let mut rows: Vec<LiveProcess> = Vec::with_capacity(images.len());
    for p in images {
        match rows.iter_mut().find(|r| r.pid == p.pid) {
            Some(r) => {
                r.command = p.command.clone();
                r.python_version = p.python_version.clone();
                r.cpu_pct += p.cpu_pct;
            }
            None => rows.push(LiveProcess {
                pid: p.pid,
                command: p.command.clone(),
                python_version: p.python_version.clone(),
                cpu_pct: p.cpu_pct,
            }),
        }
    }
    rows
}

/// What a recording shares with the live view that watches it.
#[derive(Debug, Clone)]
pub struct LiveLink {
    /// Where pictures go (bounded, so a full channel drops the picture).
    pub frames: SyncSender<LiveFrame>,
    /// Rung after each picture sent, so the view draws it at once.
    pub wake: Wake,
    /// How often a picture is taken, milliseconds (the view's `+` / `-` change it).
    pub refresh_ms: Arc<AtomicU64>,
    /// Set by the view's side: the recording is to end now.
    pub stop: Arc<AtomicBool>,
    /// `top -- COMMAND`: the command's pid once it started (0 before).
    pub child: Arc<AtomicI32>,
}

impl LiveLink {
    /// A link whose pictures go to `frames` (ringing `wake`), taken every `refresh`.
    pub fn new(frames: SyncSender<LiveFrame>, wake: Wake, refresh: Duration) -> LiveLink {
        LiveLink {
            frames,
            wake,
            refresh_ms: Arc::new(AtomicU64::new(refresh.as_millis().max(1) as u64)),
            stop: Arc::new(AtomicBool::new(false)),
            child: Arc::new(AtomicI32::new(0)),
        }
    }

    /// Whether the view asked the recording to end.
    pub(crate) fn stopping(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    fn refresh(&self) -> Duration {
        Duration::from_millis(self.refresh_ms.load(Ordering::Relaxed).max(1))
    }
}

/// Pictures of a recording: the profile so far, memory merged in, while it goes on
/// (`top`'s frames, `--push`'s windows).
pub(crate) struct Camera {
    /// The command line shown as the profile's program.
    program: String,
    /// The root process (its view of the files gives the memory lines' sources).
    pid: i32,
    cwd: Option<String>,
    /// Each file's text, read once.
    sources: HashMap<String, Option<Vec<String>>>,
}

impl Camera {
    pub(crate) fn new(program: String, pid: i32) -> Camera {
        Camera {
            program,
            pid,
            cwd: crate::proc::cwd(pid),
            sources: HashMap::new(),
        }
    }

    /// The profile of every process so far, with its memory.
    pub(crate) fn picture(&mut self, tree: &ProcessTree, fleet: Option<&Fleet>) -> Profile {
        let mut profile = tree.profile_so_far(self.program.clone(), &mut self.sources);
        if let Some((agg, totals)) = fleet.and_then(Fleet::live_memory) {
            let (pid, cwd, sources) = (self.pid, self.cwd.as_deref(), &mut self.sources);
            agg.merge_into(&mut profile, totals, &mut |file| {
                sources
                    .entry(file.to_string())
                    .or_insert_with(|| {
                        crate::sampler::read_source(pid, &crate::sampler::absolute(file, cwd))
                    })
                    .clone()
            });
        }
        profile
    }
}

/// Takes a picture of the recording once per refresh, between ticks.
pub(crate) struct Publisher {
    link: LiveLink,
    camera: Camera,
    requested_hz: f64,
    last: Option<Instant>,
    footprint: VecDeque<f64>,
    /// How long the last picture took (the cost of a live view, between ticks).
    pub(crate) last_cost: Duration,
    /// The last line the recording had to say (memory counted from now on, say).
    said: Option<String>,
}

impl Publisher {
    pub(crate) fn new(link: LiveLink, program: String, pid: i32, requested_hz: f64) -> Self {
        Publisher {
            link,
            camera: Camera::new(program, pid),
            requested_hz,
            last: None,
            footprint: VecDeque::new(),
            last_cost: Duration::ZERO,
            said: None,
        }
    }

    /// A line the recording would print, shown in the header instead (the view has the
    /// terminal).
    pub(crate) fn say(&mut self, line: String) {
        self.said = Some(line);
    }

    /// After a tick: a picture when one is due.
    pub(crate) fn tick(
        &mut self,
        tree: &mut ProcessTree,
        fleet: Option<&Fleet>,
        gpu: Option<LiveGpu>,
    ) {
        if self.last.is_some_and(|t| t.elapsed() < self.link.refresh()) {
            return;
        }
        let began = Instant::now();
        self.last = Some(began);
        let profile = self.camera.picture(tree, fleet);
        if let Some(m) = &profile.memory {
            if let Some(&[_, mb]) = m.timeline.last() {
                if self.footprint.len() == FOOTPRINT_POINTS {
                    self.footprint.pop_front();
                }
                self.footprint.push_back(mb);
            }
        }
        let threads = tree.take_threads();
        let mut header = self.header(&profile, &tree.stats, threads, None);
        header.gpu = gpu;
        self.send(LiveFrame { profile, header });
        self.last_cost = began.elapsed();
    }

    /// The last picture: the finished profile, and the command's exit code when it exited.
    pub(crate) fn finish(&mut self, profile: Profile, stats: &Stats, exited: Option<i32>) {
        let header = self.header(&profile, stats, (0, 0), exited);
        self.send(LiveFrame { profile, header });
    }

    fn header(
        &self,
        profile: &Profile,
        stats: &Stats,
        (active, idle): (usize, usize),
        exited: Option<i32>,
    ) -> LiveHeader {
        let processes = if profile.processes.is_empty() {
            vec![LiveProcess {
                pid: profile.meta.pid,
                command: profile.meta.program.clone(),
                python_version: profile.meta.python_version.clone(),
                cpu_pct: 100.0,
            }]
        } else {
            one_row_per_pid(&profile.processes)
        };
        LiveHeader {
            processes,
            rate_requested_hz: self.requested_hz,
            samples: stats.samples,
            lost: stats.missed + stats.errors,
            elapsed: stats.elapsed,
            gil_pct: (stats.gil_samples > 0)
                .then(|| 100.0 * stats.gil_held as f64 / stats.gil_samples as f64),
            threads_active: active,
            threads_idle: idle,
            footprint_mb: self.footprint.iter().copied().collect(),
            gpu: None,
            exited,
            note: self.said.clone().or_else(|| stats.notes.first().cloned()),
        }
    }

    /// Hands `frame` over. A full channel drops it (the view shows the newest anyway). A
    /// view gone drops it too (the recording goes on until told to stop).
    fn send(&self, frame: LiveFrame) {
        if self.link.frames.try_send(frame).is_ok() {
            self.link.wake.ring();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::one_row_per_pid;
    use crate::profile::ProcessProfile;

    fn image(pid: i32, command: &str, cpu_pct: f64) -> ProcessProfile {
        ProcessProfile {
            pid,
            command: command.to_string(),
            python_version: "3.8".to_string(),
            samples: 1,
            cpu_pct,
            mem_peak_mb: None,
            mem_alloc_mb: None,
            gpu_pct: None,
            gpu_mem_peak_mb: None,
        }
    }

    #[test]
    fn a_pid_that_execd_is_one_row_running_its_new_command() {
        let rows = one_row_per_pid(&[
            image(10, "python parent.py", 5.0),
            image(11, "python parent.py", 1.0),
            image(11, "python child.py", 94.0),
        ]);
        let seen: Vec<(i32, &str, f64)> = rows
            .iter()
            .map(|r| (r.pid, r.command.as_str(), r.cpu_pct))
            .collect();
        assert_eq!(
            seen,
            vec![(10, "python parent.py", 5.0), (11, "python child.py", 95.0)]
        );
    }
}
