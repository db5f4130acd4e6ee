//! `agent`: every Python process of the host profiled, continuously, and pushed.
//!
//! Owns: [`AgentConfig`] and [`agent`], the orchestrator beside `run` and `attach`:
//! - one thread samples every target on one schedule (each target a [`ProcessTree`] of
//!   its one process, children not followed, so a worker is a target of its own, its own
//!   series), CPU only (nothing is loaded into a target);
//! - a target that used under [`MIN_CPU_NS`] of CPU since its last sample (its CPU
//!   clock says, in one call) is not read at that tick, for at most
//!   [`READ_AT_REST_EVERY`], because most of a host's processes wait most of the time;
//! - the host is looked at every [`AgentConfig::scan_every`] ([`finder::Finder`]), or
//!   less often when a look costs more than 1% of that while;
//! - each target's windows are cut by a [`Pusher`] of its own, labelled with its pid,
//!   service and container, and all go through one [`Exporter`] (one queue, one bound
//!   for all, one sending thread);
//! - a target that exits, execs into something else, or fails to be read is let go. Its
//!   last window is sent, and it is said once;
//! - SIGTERM, SIGINT (and SIGHUP, unless ignored) end the agent. Every open window is
//!   sent, waiting at most 5 s for the backend, and [`agent`] returns.
//!
//! Must not: harm a target (no memory injection, no signal; the reads are those of
//! `attach`), print (lines go to the caller's `say`), or grow with the host (at most
//! [`AgentConfig::max_processes`] targets, each holding its own profile only).

mod finder;

pub use finder::Selection;

use super::push::{self, Pusher, FLUSH_WAIT};
use super::signals::{catch, take_pending};
use crate::error::Result;
use crate::export::{self, Exporter, ExporterStats, PushConfig};
use crate::python::LocateOptions;
use crate::sampler::tree::ProcessTree;
use crate::sampler::{SamplerConfig, Stats, Ticker};
use nix::sys::signal::Signal;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often each target's tree looks whether its process exec'd (three reads of /proc
/// each, which took a fifth of the agent's CPU beside 50 processes when it was every
/// second).
const EXEC_LOOK_EVERY: Duration = Duration::from_secs(5);

/// A look at the host may take at most 1/this of the time until the next one (in CPU
/// time, 1% of a core for the look, however many processes the host runs).
const SCAN_COST_FACTOR: u32 = 100;

/// What `agent` does.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// Where windows go (`service` is not used, because each process is named by its own).
    pub push: PushConfig,
    /// One service name for every process, instead of each one's own.
    pub service: Option<String>,
    pub select: Selection,
    /// How each target is sampled (the rate among it).
    pub sampler: SamplerConfig,
    /// How often the host is looked at for new processes.
    pub scan_every: Duration,
    /// Targets at most; a Python process found beyond them is said once and left alone.
    pub max_processes: usize,
}

/// What the agent did, when it ends.
#[derive(Debug, Clone, Default)]
pub struct AgentOutcome {
    /// Processes profiled, in all.
    pub profiled: u64,
    pub exporter: ExporterStats,
    /// The one-line summary of the push.
    pub summary: String,
}

/// A target that used less CPU than this since its last sample is not read at that tick.
const MIN_CPU_NS: u64 = 1_000_000;
/// A target that used less than [`MIN_CPU_NS`] is read at least this often all the same
/// (its tree looks for an exec then too; a zombie is let go then). Beside 50 processes
/// that wake 10 times a second, 1 s cost the agent 1.35% of a core in all (bench/agent.py).
const READ_AT_REST_EVERY: Duration = Duration::from_secs(5);

/// One process profiled.
struct Target {
    tree: ProcessTree,
    pusher: Pusher,
    service: String,
    /// When it was found, its recording's clock (the windows' durations).
    since: Instant,
    /// Its CPU clock (`clock_getcpuclockid`), which gives all its threads' CPU time in one
    /// call.
    clock: Option<libc::clockid_t>,
    /// Its CPU time at its last sample (ns), and when.
    last: Option<(u64, Instant)>,
}

impl Target {
    /// Whether the process must be sampled now. It must when:
    /// - it used [`MIN_CPU_NS`] of CPU since its last sample;
    /// - or its clock cannot be read (it is gone, and the tree must see it end);
    /// - or it has rested [`READ_AT_REST_EVERY`].
    ///
    /// A sample left out costs the profile no time. The next one reads each thread's CPU
    /// time since the last (in nanoseconds) and charges all of it, as a sample at a lower
    /// rate would. A process is so read at least once per millisecond of CPU it uses, or
    /// per second. So it never gets fewer samples per CPU-second than a busy process gets.
    fn due(&mut self, now: Instant) -> bool {
        let Some(ns) = self.clock.and_then(process_cpu_ns) else {
            return true;
        };
        match self.last {
            Some((was, at))
                if ns.saturating_sub(was) < MIN_CPU_NS
                    && now.duration_since(at) < READ_AT_REST_EVERY =>
            {
                false
            }
            _ => {
                self.last = Some((ns, now));
                true
            }
        }
    }
}

/// Process `pid`'s CPU clock, if the kernel gives it.
fn cpu_clock(pid: i32) -> Option<libc::clockid_t> {
    let mut id: libc::clockid_t = 0;
    // SAFETY: clock_getcpuclockid writes one clockid_t through a valid pointer.
    let r = unsafe { libc::clock_getcpuclockid(pid, &mut id) };
    (r == 0).then_some(id)
}

/// The CPU time of every thread of a process, ns, from its CPU clock (one system call,
/// no file, so cheaper than its stat line by far). None once it is gone.
fn process_cpu_ns(clock: libc::clockid_t) -> Option<u64> {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec through a valid pointer.
    let r = unsafe { libc::clock_gettime(clock, &mut t) };
    (r == 0).then(|| t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64)
}

struct Agent<'a> {
    cfg: &'a AgentConfig,
    finder: finder::Finder,
    exporter: Arc<Exporter>,
    targets: BTreeMap<i32, Target>,
    next_scan: Instant,
    stats: Stats,
    say: &'a mut dyn FnMut(&str),
    /// The last failure of the backend said.
    said_failure: Option<String>,
    profiled: u64,
    said_full: bool,
}

/// Profiles every Python process of the host that `cfg.select` lets through, until
/// SIGTERM, SIGINT or SIGHUP. `say` gets the lines worth a log (one per process found
/// and let go, the backend's failures once each).
pub fn agent(cfg: &AgentConfig, say: &mut dyn FnMut(&str)) -> Result<AgentOutcome> {
    catch(
        &[Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP],
        &[Signal::SIGHUP],
    );
    let exporter = cfg.push.start_exporter();
    let mut a = Agent {
        cfg,
        finder: finder::Finder::new(cfg.select.clone(), cfg.scan_every),
        exporter: Arc::new(exporter),
        targets: BTreeMap::new(),
        next_scan: Instant::now(),
        stats: Stats::default(),
        say,
        said_failure: None,
        profiled: 0,
        said_full: false,
    };
    // Not the courtesy of `crate::courtesy`, because its watchdog wakes 200 times a second,
    // which cost the agent more (7% of its CPU beside 50 processes) than the rare hand-over
    // at 19 Hz that it saves a program.
    let result = crate::sampler::drive(
        &mut a,
        cfg.sampler.rate_hz,
        &mut || !take_pending().is_empty(),
        &mut |_| {},
        None,
        false,
        cfg.sampler.pauses_every_tick(),
    );
    // Every open window, then what waits, for at most FLUSH_WAIT.
    for (_, mut t) in std::mem::take(&mut a.targets) {
        t.tree.stats.elapsed = t.since.elapsed();
        t.pusher.finish_tree(&t.tree);
    }
    let exporter = match Arc::try_unwrap(a.exporter) {
        Ok(own) => own.finish(FLUSH_WAIT),
        Err(shared) => shared.stats(),
    };
    result?;
    Ok(AgentOutcome {
        profiled: a.profiled,
        summary: push::summary(&cfg.push.url, &exporter),
        exporter,
    })
}

impl Agent<'_> {
    /// The service process `pid` is named by:
    /// - `--service`;
    /// - else its OTEL_SERVICE_NAME;
    /// - else, for a multiprocessing worker started by `spawn` or `forkserver` (a
    ///   `python -c` of multiprocessing's), its parent's;
    /// - else its script or module.
    fn service_of(&self, pid: i32, argv: &[String]) -> String {
        if let Some(s) = &self.cfg.service {
            return s.clone();
        }
        let (_, env_service) = export::target_naming(pid);
        if let Some(s) = env_service {
            return s;
        }
        let worker = argv.iter().any(|a| a == "--multiprocessing-fork")
            || argv.iter().any(|a| a.contains("from multiprocessing"));
        let parent = crate::proc::parent(pid).and_then(|p| self.targets.get(&p));
        match parent {
            Some(t) if worker => t.service.clone(),
            _ => export::service_of(argv),
        }
    }

    /// The labels of process `pid`'s windows: `service_name`, the user's tags, `pid`,
    /// and `container_id` and `pod_uid` where its cgroup names them.
    fn labels(&self, pid: i32, service: &str) -> Vec<(String, String)> {
        let mut labels = export::labels_of(service, &self.cfg.push.tags);
        let ours = [
            ("pid", Some(pid.to_string())),
            ("container_id", crate::proc::container::container_id(pid)),
            ("pod_uid", crate::proc::container::pod_uid(pid)),
        ];
        for (k, v) in ours {
            // A tag of the same name is the user's choice.
            if let Some(v) = v.filter(|_| !labels.iter().any(|(n, _)| n == k)) {
                labels.push((k.to_string(), v));
            }
        }
        labels
    }

    fn adopt(&mut self, found: finder::Found) {
        let pid = found.proc.pid;
        if self.targets.len() >= self.cfg.max_processes {
            self.finder.released(pid);
            if !std::mem::replace(&mut self.said_full, true) {
                (self.say)(&format!(
                    "{} processes profiled already (--max-processes): process {pid} and \
                     those found after it while the agent is full are not profiled",
                    self.targets.len()
                ));
            }
            return;
        }
        let service = self.service_of(pid, &found.argv);
        let labels = self.labels(pid, &service);
        let program = found.argv.join(" ");
        let container = labels
            .iter()
            .find(|(k, _)| k == "container_id")
            .map(|(_, v)| format!(", container {}", &v[..12.min(v.len())]))
            .unwrap_or_default();
        (self.say)(&format!(
            "profiling process {pid} ({program}): service {service}{container}, Python {}",
            found.proc.version
        ));
        let pusher = Pusher::sharing(
            self.exporter.clone(),
            &self.cfg.push,
            labels,
            program,
            pid,
            true,
        );
        let tree = ProcessTree::new(
            pid,
            false,
            self.cfg.sampler.clone(),
            LocateOptions::default(),
        )
        .scanning_every(EXEC_LOOK_EVERY)
        .with_located(found.proc);
        self.profiled += 1;
        self.targets.insert(
            pid,
            Target {
                tree,
                pusher,
                service,
                since: Instant::now(),
                clock: cpu_clock(pid),
                last: None,
            },
        );
    }

    /// Lets target `pid` go. Its last window is sent; `why` says why when it did not end.
    fn release(&mut self, pid: i32, why: Option<String>) {
        let Some(mut t) = self.targets.remove(&pid) else {
            return;
        };
        t.tree.stats.elapsed = t.since.elapsed();
        t.pusher.finish_tree(&t.tree);
        self.finder.released(pid);
        let line = match why {
            Some(why) => format!("process {pid}: let go: {why}"),
            None if crate::proc::process_exists(pid) => {
                format!("process {pid}: let go: it runs no Python we can read now")
            }
            None => format!("process {pid} ended"),
        };
        (self.say)(&line);
    }

    /// A failure of the backend not said yet, said once.
    fn say_failures(&mut self) {
        let st = self.exporter.stats();
        if let Some(why) = st
            .last_error
            .filter(|w| self.said_failure.as_ref() != Some(w))
        {
            (self.say)(&format!(
                "push to {}: {why} (retrying with backoff; {} windows dropped so far)",
                self.cfg.push.url, st.dropped
            ));
            self.said_failure = Some(why);
        }
    }
}

/// `found` with each process after its parent, when both are in it, because a worker found
/// with its parent may take its parent's name (see [`Agent::service_of`]).
fn parents_first(mut found: Vec<finder::Found>) -> Vec<finder::Found> {
    let mut out = Vec::with_capacity(found.len());
    while !found.is_empty() {
        let pids: Vec<i32> = found.iter().map(|f| f.proc.pid).collect();
        let orphan =
            |f: &finder::Found| crate::proc::parent(f.proc.pid).is_none_or(|p| !pids.contains(&p));
        // A circle cannot be (a parent started before its child); take the first anyway.
        let at = found.iter().position(orphan).unwrap_or(0);
        out.push(found.remove(at));
    }
    out
}

impl Ticker for Agent<'_> {
    fn tick(&mut self) -> Result<bool> {
        let now = Instant::now();
        if now >= self.next_scan {
            let mut lines = Vec::new();
            let cpu = finder::thread_cpu();
            let (found, locating) = self.finder.scan(now, &mut |l| lines.push(l));
            for l in lines {
                (self.say)(&l);
            }
            // Our CPU time, less locating new processes (it happens once each).
            let cost = finder::thread_cpu()
                .saturating_sub(cpu)
                .saturating_sub(locating);
            for f in parents_first(found) {
                self.adopt(f);
            }
            self.next_scan = now + self.cfg.scan_every.max(cost * SCAN_COST_FACTOR);
        }
        let mut ended = Vec::new();
        for (&pid, t) in &mut self.targets {
            // The schedule's clock is the agent's; each recording's runs from its find.
            t.tree.stats.elapsed = t.since.elapsed();
            if !t.due(now) {
                t.pusher.tick(&t.tree, None);
                continue;
            }
            match t.tree.tick() {
                Ok(true) if t.tree.sampling().next().is_some() => t.pusher.tick(&t.tree, None),
                Ok(_) => ended.push((pid, None)),
                Err(e) => ended.push((pid, Some(e.to_string()))),
            }
        }
        for (pid, why) in ended {
            self.release(pid, why);
        }
        self.say_failures();
        Ok(true)
    }

    fn stats_mut(&mut self) -> &mut Stats {
        &mut self.stats
    }
}
