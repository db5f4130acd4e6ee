//! `top`: a recording (`attach` to a PID, or `run` of a COMMAND) watched live, full screen.
//!
//! Owns: the two threads of `top` and how they end.
//! - The recording runs on a thread of its own, as `attach` or `run` would, and hands a
//!   picture of the profile to the view once per refresh ([`super::live`]).
//! - The view runs on the calling thread ([`crate::report::live::run`]): the terminal,
//!   the keys, and the quit signals (SIGTERM, SIGHUP, SIGINT).
//! - The end: the view returns (the terminal already given back), the recording is told
//!   to stop, a COMMAND still running is asked to end (SIGINT, then SIGTERM, then SIGKILL,
//!   each after [`END_GRACE`]), and the recording's whole profile comes back.
//!
//! Must not: draw (the view does) or sample (the recording does). A process given by PID
//! is left as `attach` leaves it.

use super::{AttachConfig, LiveLink, RunConfig};
use crate::error::{Error, Result};
use crate::profile::Profile;
use crate::report::live::{self, Exit, LiveOptions};
use crate::sampler::Stats;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// How long a COMMAND still running when `top` ends is given to end after each signal
/// (SIGINT, as Ctrl-C would have sent it; then SIGTERM; then SIGKILL).
const END_GRACE: Duration = Duration::from_secs(3);

/// Pictures waiting for the view at most. The view takes the newest, so a slow one only
/// makes the recording drop pictures, never wait.
const FRAMES_QUEUED: usize = 2;

/// What `top` watches.
#[derive(Debug, Clone)]
pub enum TopTarget {
    /// A running process (and, `--subprocesses`, its descendants; then the process need
    /// not be Python itself).
    Pid(AttachConfig),
    /// A command started for it (and every Python process it starts).
    Command(RunConfig),
}

/// What `top` does.
#[derive(Debug, Clone)]
pub struct TopConfig {
    pub target: TopTarget,
    /// How often the view is refreshed (`--refresh`).
    pub refresh: Duration,
    /// End when the COMMAND exits instead of waiting for a key (`--exit-on-end`).
    pub exit_on_end: bool,
}

/// How `top` ended.
pub struct TopOutcome {
    /// The whole recording (None when no Python process was profiled).
    pub profile: Option<Profile>,
    pub stats: Stats,
    /// `top`'s own exit code: the COMMAND's when it ended by itself, else 0.
    pub exit_code: i32,
    /// What to say once the terminal is back, a line each.
    pub notes: Vec<String>,
}

/// What the recording thread gives back.
enum Recorded {
    Attach(Result<(Profile, Stats)>),
    Run(Result<super::RunOutcome>),
}

/// Runs `top` (see the module's doc). The caller has checked that stdout is a terminal.
pub fn top(cfg: TopConfig) -> Result<TopOutcome> {
    if let TopTarget::Pid(a) = &cfg.target {
        // The usual one-line errors (no such process, not Python without
        // `--subprocesses`, no permission), before the screen is taken over.
        super::attach::check(a)?;
    }
    let quit = live::quit_on_signals().map_err(|e| Error::io("catching signals", e))?;
    let (tx, rx) = std::sync::mpsc::sync_channel(FRAMES_QUEUED);
    let wake = live::Wake::new().map_err(|e| Error::io("making the view's wake-up", e))?;
    let link = LiveLink::new(tx, wake.clone(), cfg.refresh);
    let (stop, child, refresh_ms) = (
        link.stop.clone(),
        link.child.clone(),
        link.refresh_ms.clone(),
    );
    let is_command = matches!(cfg.target, TopTarget::Command(_));
    let target = cfg.target.clone();
    let ended = wake.clone();
    let worker = std::thread::Builder::new()
        .name("recording".into())
        .spawn(move || {
            let recorded = match target {
                TopTarget::Pid(mut a) => {
                    a.live = Some(link);
                    let r = super::attach(&a, &mut |_| {});
                    drop(a);
                    Recorded::Attach(r)
                }
                TopTarget::Command(mut r) => {
                    r.live = Some(link);
                    let out = super::run(&r, &mut |_| {});
                    drop(r);
                    Recorded::Run(out)
                }
            };
            // Every sender is gone with the config that held the link. So the view sees
            // the channel hang up now, not at the end of its poll.
            ended.ring();
            recorded
        })
        .map_err(|e| Error::io("starting the recording thread", e))?;
    let opts = LiveOptions {
        refresh: cfg.refresh,
        exit_on_end: cfg.exit_on_end,
    };
    let shown = live::run(
        rx,
        wake,
        opts,
        &mut |d| refresh_ms.store(d.as_millis().max(1) as u64, Ordering::Relaxed),
        quit,
    );
    // The terminal is ours again. The recording ends now; a COMMAND still running is
    // asked to end.
    stop.store(true, Ordering::SeqCst);
    let mut notes = Vec::new();
    if is_command {
        end_command(child.load(Ordering::SeqCst), &worker, &mut notes);
    }
    let recorded = worker
        .join()
        .map_err(|_| Error::io("recording", std::io::Error::other("the thread panicked")))?;
    let exit = shown.map_err(|e| Error::io("drawing on the terminal", e))?;
    let ended = matches!(exit, Exit::Ended(_) | Exit::Disconnected);
    match recorded {
        Recorded::Attach(r) => {
            let (profile, stats) = r?;
            if ended {
                notes.push(format!("process {} exited", profile.meta.pid));
            }
            Ok(TopOutcome {
                profile: Some(profile),
                stats,
                exit_code: 0,
                notes,
            })
        }
        Recorded::Run(r) => {
            let out = r?;
            notes.extend(out.note.clone());
            let code = super::exit_code(&out.status);
            notes.push(format!("the command exited with code {code}"));
            Ok(TopOutcome {
                profile: out.profile,
                stats: out.stats,
                exit_code: if ended { code } else { 0 },
                notes,
            })
        }
    }
}

/// Asks the COMMAND (`pid`; 0: it never started) to end while the recording thread waits
/// for it: SIGINT, SIGTERM, then SIGKILL, each after [`END_GRACE`]. Says which it took.
fn end_command(pid: i32, worker: &std::thread::JoinHandle<Recorded>, notes: &mut Vec<String>) {
    use nix::sys::signal::{kill, Signal};
    if pid <= 0 {
        return;
    }
    let target = nix::unistd::Pid::from_raw(pid);
    for sig in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGKILL] {
        if worker.is_finished() {
            return;
        }
        if kill(target, sig).is_err() {
            return;
        }
        if sig != Signal::SIGINT {
            notes.push(format!("the command did not end on SIGINT: sent {sig}"));
        }
        let until = Instant::now() + END_GRACE;
        while Instant::now() < until && !worker.is_finished() {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}
