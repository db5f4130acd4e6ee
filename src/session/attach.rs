//! `attach`: profile a running process (and, with `--subprocesses`, its Python
//! descendants) for a while, and leave it as it was.
//!
//! Owns: [`AttachConfig`] and [`attach`]:
//! - the checks before anything starts (no such process, not Python, `--gil` / `--async`
//!   asked of a build that cannot answer, `--native` without the right to stop it);
//! - a root that is not Python (a shell script, a PyInstaller bootloader, a supervisor)
//!   under `--subprocesses`, which is watched for its Python descendants, said in one line,
//!   and an error at the end when none was profiled;
//! - when `--duration` counts from ([`Clock`]): the target's memory settled, or its first
//!   Python descendant found.
//!
//! Must not: render the report (the caller does) or change anything in the target.

use super::gpu::{merge_gpu, GpuRecording};
use super::signals::{catch, take_pending};
use super::{finish_memory, live, merge_memory, push, LiveLink, Recording};
use crate::error::{Error, Result};
use crate::gpu::GpuConfig;
use crate::memory::consumer::MemoryConfig;
use crate::memory::fleet::Fleet;
use crate::proc::command_line;
use crate::profile::Profile;
use crate::python::{LocateOptions, PythonProcess};
use crate::sampler::tree::ProcessTree;
use crate::sampler::{SamplerConfig, Stats};
use nix::sys::signal::Signal;
use std::cell::Cell;
use std::time::{Duration, Instant};

/// The longest `attach --duration` waits, past the duration, for memory to be settled
/// (our library loads within [`crate::memory::inject::PATIENCE`] or is refused).
const MEMORY_SETTLE_MAX: Duration = Duration::from_secs(3);

/// What `attach` records.
#[derive(Debug, Clone)]
pub struct AttachConfig {
    pub pid: i32,
    pub duration: Option<Duration>,
    pub sampler: SamplerConfig,
    pub locate: LocateOptions,
    /// Profile the process's descendants too (`--subprocesses`); a process that is not
    /// Python is then a root to watch, not an error.
    pub follow_children: bool,
    /// Read the memory ring when the process has one (started under `run`, whose
    /// profiler is gone); None means do not.
    pub memory: Option<MemoryConfig>,
    /// GPU watching through NVML; None with `--no-gpu`.
    pub gpu: Option<GpuConfig>,
    /// A live view watches (`top`); see [`super::RunConfig::live`].
    pub live: Option<LiveLink>,
    /// `--push`: see [`super::RunConfig::push`].
    pub push: Option<crate::export::PushConfig>,
}

/// When `--duration` counts from, told by the recording's ticks (which see the
/// processes) to the stop check.
pub(super) struct Clock {
    /// The root when it is Python. None when it is not; its first Python descendant
    /// sampled then stands for it.
    root: Option<i32>,
    /// The duration counts from here. It marks that process's memory settled (counted, or
    /// refused with its reason), or, without memory, its sampling begun.
    settled: Cell<Option<Instant>>,
    /// When a first Python process was sampled.
    found: Cell<Option<Instant>>,
}

impl Clock {
    fn new(root: Option<i32>) -> Clock {
        Clock {
            root,
            settled: Cell::new(None),
            found: Cell::new(None),
        }
    }

    /// After a tick: what the tree samples now, and what the fleet has settled.
    pub(super) fn observe(&self, tree: &ProcessTree, fleet: Option<&Fleet>) {
        if self.found.get().is_none() && tree.sampling().next().is_some() {
            self.found.set(Some(Instant::now()));
        }
        if self.settled.get().is_some() {
            return;
        }
        let target = match self.root {
            Some(pid) => tree.sampling().find(|&(p, _, _)| p == pid),
            None => tree.sampling().next(),
        };
        let settled = match (target, fleet) {
            // For a Python root no longer sampled (it exited), there is nothing to wait for.
            // With no Python descendant yet, the duration has not begun.
            (None, _) => self.root.is_some(),
            (Some(_), None) => true,
            (Some((_, serial, _)), Some(f)) => f.settled(serial),
        };
        if settled {
            self.settled.set(Some(Instant::now()));
        }
    }

    /// Whether `d` is over, the recording having started at `start`.
    fn over(&self, d: Duration, start: Instant) -> bool {
        match (self.settled.get(), self.found.get()) {
            (Some(t), _) => t.elapsed() >= d,
            // With its memory not settled yet, wait at most [`MEMORY_SETTLE_MAX`] more.
            (None, Some(f)) => f.elapsed() >= d + MEMORY_SETTLE_MAX,
            // A Python root is sampled from the first tick on; a root that is not Python
            // and never had a Python descendant ends at the duration.
            (None, None) if self.root.is_some() => start.elapsed() >= d + MEMORY_SETTLE_MAX,
            (None, None) => start.elapsed() >= d,
        }
    }
}

/// What the process attached to is.
enum Root {
    /// A Python process, located and ready to be sampled.
    Python(Box<PythonProcess>),
    /// Not Python, under `--subprocesses`, so a root to watch (its executable, to name it).
    Watched { exe: String },
}

/// Finds what process `cfg.pid` is, refusing what cannot be profiled.
fn locate_root(cfg: &AttachConfig) -> Result<Root> {
    if cfg.pid <= 0 {
        return Err(Error::NoSuchProcess(cfg.pid));
    }
    let proc = match PythonProcess::locate(cfg.pid, &cfg.locate) {
        Ok(p) => p,
        Err(Error::NotPython { exe, .. }) if cfg.follow_children => {
            return Ok(Root::Watched { exe })
        }
        Err(e) => return Err(e),
    };
    proc.check_request(cfg.sampler.gil_only, cfg.sampler.tasks)?;
    if proc.interp_head()? == 0 {
        return Err(Error::BadState {
            pid: cfg.pid,
            why: "the interpreter is not initialized (starting up or shutting down)".into(),
        });
    }
    if cfg.sampler.native {
        crate::python::check_can_stop(&proc)?;
    }
    Ok(Root::Python(Box::new(proc)))
}

/// Checks, before a live view takes the terminal, what [`attach`] would refuse at once.
pub(super) fn check(cfg: &AttachConfig) -> Result<()> {
    locate_root(cfg).map(|_| ())
}

/// Profiles a running process until Ctrl-C (SIGINT), SIGTERM, SIGHUP (unless ignored, as
/// under `nohup`), the duration, or its exit.
/// The target is never stopped longer than one sample's read and is left as it was.
///
/// With `follow_children`, a process that is not Python is watched instead. Its Python
/// descendants, those running and those that start, are profiled until it exits (or
/// Ctrl-C, or the duration, counted from when the first one is found). When none was,
/// the answer is [`Error::NotPython`] (or why the ones found could not be profiled).
pub fn attach(cfg: &AttachConfig, progress: &mut dyn FnMut(&Stats)) -> Result<(Profile, Stats)> {
    let located = locate_root(cfg)?;
    let program = command_line(cfg.pid);
    // A root that is not Python is said in one line (in a live view's header).
    let watched_exe = match &located {
        Root::Python(_) => None,
        Root::Watched { exe } => Some(exe.clone()),
    };
    let watching = watched_exe.as_ref().map(|exe| {
        let name = exe.rsplit('/').next().unwrap_or(exe);
        let doing = if cfg.live.is_some() {
            "watching"
        } else {
            "profiling"
        };
        format!(
            "process {} ({name}) is not Python: {doing} its Python descendants",
            cfg.pid
        )
    });
    // SIGINT and SIGTERM ask us to stop, also where a script started us with them ignored
    // (a background job, whose `kill -INT` stops us as it always did); a hang-up under `nohup`
    // does not.
    if cfg.live.is_none() {
        catch(
            &[Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP],
            &[Signal::SIGHUP],
        );
        if let Some(line) = &watching {
            eprintln!("scalene-rs: {line}");
        }
    }
    // Memory: each process's ring, taken over from the `run` that started the program.
    let cwd = crate::proc::cwd(cfg.pid);
    let start = Instant::now();
    let mut tree = ProcessTree::new(
        cfg.pid,
        cfg.follow_children,
        cfg.sampler.clone(),
        cfg.locate.clone(),
    );
    let root_is_python = watched_exe.is_none();
    if let Root::Python(proc) = located {
        tree = tree.with_located(*proc);
    }
    let mut fleet = cfg
        .memory
        .clone()
        .map(|m| Fleet::for_attach(m).with_native(tree.native_cache()));
    let duration = cfg.duration;
    let mut gpu = cfg.gpu.as_ref().map(GpuRecording::start);
    // `--duration` runs from when memory is settled (counted, or refused with its reason),
    // so that a short attach still counts memory; without memory, from the first sample.
    // Under a root that is not Python, both are its first Python descendant's.
    let clock = Clock::new(root_is_python.then_some(cfg.pid));
    let courteous = cfg.sampler.courteous(fleet.is_some());
    let mut publisher = cfg
        .live
        .clone()
        .map(|l| live::Publisher::new(l, program.clone(), cfg.pid, cfg.sampler.rate_hz));
    if let (Some(p), Some(line)) = (publisher.as_mut(), &watching) {
        p.say(line.clone());
    }
    let quiet = cfg.live.is_some();
    let mut pusher = cfg
        .push
        .as_ref()
        .map(|p| push::Pusher::new(p, program.clone(), cfg.pid, quiet));
    let result = crate::sampler::drive(
        &mut Recording {
            tree: &mut tree,
            fleet: fleet.as_mut(),
            gpu: gpu.as_mut(),
            clock: Some(&clock),
            live: publisher.as_mut(),
            push: pusher.as_mut(),
        },
        cfg.sampler.rate_hz,
        &mut || {
            cfg.live.as_ref().is_some_and(LiveLink::stopping)
                || !take_pending().is_empty()
                || duration.is_some_and(|d| clock.over(d, start))
        },
        progress,
        Some(cfg.pid),
        courteous,
        cfg.sampler.pauses_every_tick(),
    );
    let mut notes = Vec::new();
    for line in fleet.iter_mut().flat_map(|f| f.last_announcements()) {
        // Under a live view, said once the terminal is back (with the other notes).
        match cfg.live {
            Some(_) => notes.push(line),
            None => eprintln!("scalene-rs: {line}"),
        }
    }
    let mut why_not = None;
    // Another process of the program whose memory cannot be recorded is said once each,
    // because its figures would read as a process that allocated nothing.
    for (pid, why) in fleet.iter().flat_map(|f| f.first_note_per_process()) {
        if pid == cfg.pid {
            why_not = Some(why.to_string());
        } else {
            notes.push(format!("no memory data for process {pid}: {why}"));
        }
    }
    let since_attach = fleet.as_ref().is_some_and(|f| f.injected > 0);
    let gpu = gpu.map(|g| g.finish(&mut tree));
    let memory = finish_memory(&mut tree, fleet);
    result?;
    // With nothing Python under a root that is not, the error comes once the recording is
    // over.
    let nothing = (!root_is_python && tree.profiled() == 0).then(|| {
        tree.take_first_refusal().unwrap_or_else(|| {
            let when = if !crate::proc::process_exists(cfg.pid) {
                "before it exited".to_string()
            } else if let Some(d) = duration.filter(|&d| clock.over(d, start)) {
                format!("in the {:.1} s watched", d.as_secs_f64())
            } else {
                "before the recording was stopped".to_string()
            };
            Error::NotPython {
                pid: cfg.pid,
                exe: watched_exe.unwrap_or_default(),
                why: format!("no Python process among its descendants was profiled {when}"),
            }
        })
    });
    if cfg.memory.is_some() && memory.is_none() {
        let why = why_not.unwrap_or_else(|| "no memory ring of the program was found".into());
        notes.push(format!("no memory data: {why}"));
    }
    let mut stats = tree.stats.clone();
    let mut profile = tree.finish(program);
    if let Some((agg, totals)) = memory {
        merge_memory(&mut profile, agg, totals, cfg.pid, cwd.as_deref());
        if let Some(m) = profile.memory.as_mut() {
            m.since_attach = since_attach;
        }
    }
    if let Some(g) = gpu {
        merge_gpu(&mut profile, g, cfg.pid, cwd.as_deref());
    }
    if let (Some(p), Some(pc)) = (pusher, &cfg.push) {
        notes.push(push::summary(&pc.url, &p.finish(&profile)));
    }
    if let Some(e) = nothing {
        return Err(e);
    }
    stats.notes.extend(notes);
    Ok((profile, stats))
}
