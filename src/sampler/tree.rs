//! Following a program's processes: every Python process among a root process and its
//! descendants, each with its own [`Sampler`], merged into one profile.
//!
//! Owns: [`ProcessTree`], with:
//! - finding descendants (/proc/PID/task/TID/children);
//! - locating the interpreter of each new process (and again after an `exec`);
//! - sampling them all on one schedule;
//! - merging their aggregates (times are seconds, so sums are the program's);
//! - telling whoever records more per process (memory) which images of which processes are
//!   sampled and which are over ([`ProcessTree::sampling`], [`ProcessTree::take_retired`]),
//!   each image by a serial number of its own.
//!
//! Must not: start or wait for processes (the session does), or format output.

use super::{Sampler, SamplerConfig, Stats, Ticker};
use crate::error::{Error, Result};
use crate::profile::{Aggregator, ProcessProfile, Profile};
use crate::python::{LocateOptions, PythonProcess};
use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

/// How often the process tree is listed again. A worker that lives a second is found
/// within a few hundredths of it.
const SCAN_INTERVAL: Duration = Duration::from_millis(20);
/// A scan reads one file per thread of every process followed (a fork's child hangs off
/// the thread that forked). With a thousand threads, that takes a few milliseconds. The next
/// scan waits at least this many times as long as the last took, so that scanning costs at
/// most about 2% of a CPU however many threads there are.
const SCAN_COST_FACTOR: u32 = 50;
/// While no task has started anywhere (see [`crate::proc::last_pid`]), a scan takes the
/// last listing of the descendants (less those gone) instead of reading every thread's
/// children again. At least this often it reads them all (a process whose parent exited
/// leaves the tree without any task starting).
const RELIST_EVERY: Duration = Duration::from_secs(1);
/// The longest wait before a process that is not Python (yet) is looked at again when its
/// executable did not change (a program may load libpython later; most never do).
const OTHER_RETRY: Duration = Duration::from_millis(500);
/// Tries in a row a refusal (unsupported version, no permission, no GIL) must hold before
/// a process is given up on (about 60 ms with the backoff).
const REFUSAL_TRIES: u32 = 5;
/// A process whose interpreter was found but not yet initialized is looked at this often.
const STARTING_RETRY: Duration = Duration::from_millis(2);

/// `exe` fields hold a process's image identity ([`crate::proc::image_of`]). A change
/// means an exec.
enum Tracked {
    /// Not (yet) a Python process we can sample; `tries` so far (the wait between tries
    /// grows, because a process just exec'd may not have mapped libpython yet).
    Other {
        exe: String,
        next_try: Instant,
        tries: u32,
    },
    Sampling {
        sampler: Box<Sampler>,
        exe: String,
        command: String,
        serial: u64,
    },
}

/// A finished process's sampler and what it was.
struct Done {
    sampler: Box<Sampler>,
    command: String,
    serial: u64,
}

/// Samples a root process and, when following, every descendant that runs Python.
pub(crate) struct ProcessTree {
    root: i32,
    follow: bool,
    cfg: SamplerConfig,
    locate: LocateOptions,
    tracked: BTreeMap<i32, Tracked>,
    done: Vec<Done>,
    /// When the next scan is due. It is `scan_every` after the last, or later when listing
    /// the processes was costly (see [`SCAN_COST_FACTOR`]).
    next_scan: Option<Instant>,
    /// [`SCAN_INTERVAL`], unless the caller looks for processes itself
    /// ([`ProcessTree::scanning_every`]).
    scan_every: Duration,
    /// The last whole listing of the descendants: the last task id given out before it
    /// (see [`crate::proc::last_pid`]), when, and what it found.
    listed: Option<(u32, Instant, Vec<i32>)>,
    /// Serial of the next image sampled.
    next_serial: u64,
    /// Images retired and not yet taken by [`ProcessTree::take_retired`].
    retired: Vec<(i32, u64)>,
    /// A scan happened since [`ProcessTree::take_scanned`].
    scanned: bool,
    /// Memory figures of images, by serial: peak and allocated MB
    /// ([`ProcessTree::set_process_memory`]).
    memory: HashMap<u64, (f64, f64)>,
    /// Ticks of the shared schedule (`samples`), missed ticks, and the sum of every
    /// process's lost thread samples.
    pub(crate) stats: Stats,
    /// Why a process could not be profiled (unsupported version, permission), by pid.
    pub(crate) notes: BTreeMap<i32, String>,
    /// The first of those refusals, as it came. A caller that found nothing else to profile
    /// answers with it ([`ProcessTree::take_first_refusal`]).
    first_refusal: Option<Error>,
    /// Samplers keep where each thread is at each tick (for the GPU ledger).
    positions: bool,
    /// `--native`: images by build id, shared by the samplers of every process.
    native_cache: Option<super::native::SharedCache>,
}

/// A cache of native images when `cfg` asks for native frames.
fn cfg_native_cache(cfg: &SamplerConfig) -> Option<super::native::SharedCache> {
    cfg.native
        .then(|| std::sync::Arc::new(std::sync::Mutex::new(crate::native::NativeCache::new())))
}

impl ProcessTree {
    /// `follow`: also sample the root's descendants (else only the root).
    pub(crate) fn new(root: i32, follow: bool, cfg: SamplerConfig, locate: LocateOptions) -> Self {
        let native_cache = cfg_native_cache(&cfg);
        ProcessTree {
            root,
            follow,
            cfg,
            locate,
            tracked: BTreeMap::new(),
            done: Vec::new(),
            next_scan: None,
            scan_every: SCAN_INTERVAL,
            listed: None,
            next_serial: 0,
            retired: Vec::new(),
            scanned: false,
            memory: HashMap::new(),
            stats: Stats::default(),
            notes: BTreeMap::new(),
            first_refusal: None,
            positions: false,
            native_cache,
        }
    }

    /// `--native`: the images shared by the samplers (for the memory readers, which read
    /// native stacks too).
    pub(crate) fn native_cache(&self) -> Option<super::native::SharedCache> {
        self.native_cache.clone()
    }

    /// Scans (for an exec, for children when following) every `every` instead of
    /// [`SCAN_INTERVAL`]. This is for the agent, which finds processes itself, follows no
    /// children and needs to see an exec only about as soon as it sees a new process.
    pub(crate) fn scanning_every(mut self, every: Duration) -> Self {
        self.scan_every = every;
        self
    }

    /// Starts with an interpreter already located (the session found the root's).
    pub(crate) fn with_located(mut self, proc: PythonProcess) -> Self {
        // A process `--gil` cannot follow (a free-threaded build) is left to the scan, which
        // says why and does not sample it (see `tick`).
        if proc
            .check_request(self.cfg.gil_only, self.cfg.tasks)
            .is_err()
        {
            return self;
        }
        let pid = proc.pid;
        let exe = crate::proc::image_of(pid).unwrap_or_default();
        self.start_sampling(proc, exe);
        self
    }

    fn start_sampling(&mut self, proc: PythonProcess, exe: String) {
        let pid = proc.pid;
        // What it was refused for is over (it exec'd, or it was a passing state).
        self.notes.remove(&pid);
        let serial = self.next_serial;
        self.next_serial += 1;
        let mut sampler = Sampler::new(proc, self.cfg.clone());
        if let Some(cache) = &self.native_cache {
            sampler = sampler.with_native(cache.clone());
        }
        let mut sampler = Box::new(sampler);
        if self.positions {
            sampler.keep_positions();
        }
        self.tracked.insert(
            pid,
            Tracked::Sampling {
                sampler,
                exe,
                command: crate::proc::command_line(pid),
                serial,
            },
        );
    }

    /// The images being sampled: pid, serial, and the located interpreter.
    pub(crate) fn sampling(&self) -> impl Iterator<Item = (i32, u64, &PythonProcess)> {
        self.tracked.iter().filter_map(|(&pid, t)| match t {
            Tracked::Sampling {
                sampler, serial, ..
            } => Some((pid, *serial, sampler.reader.process())),
            Tracked::Other { .. } => None,
        })
    }

    /// The images that ended (their process ended or exec'd) since the last call: pid and
    /// serial, in the order they ended.
    pub(crate) fn take_retired(&mut self) -> Vec<(i32, u64)> {
        std::mem::take(&mut self.retired)
    }

    /// Whether the processes were listed again since the last call.
    pub(crate) fn take_scanned(&mut self) -> bool {
        std::mem::replace(&mut self.scanned, false)
    }

    /// Where process `pid`'s memory ring is mapped from. A thread of it blocked in a futex
    /// there waits for us (see [`SamplerConfig::handshake_file`]).
    pub(crate) fn set_handshake_file(&mut self, pid: i32, file: std::path::PathBuf) {
        if let Some(Tracked::Sampling { sampler, .. }) = self.tracked.get_mut(&pid) {
            sampler.set_handshake_file(file);
        }
    }

    /// Image `serial`'s own memory figures (peak and allocated MB), for the per-process
    /// breakdown.
    pub(crate) fn set_process_memory(&mut self, serial: u64, peak_mb: f64, alloc_mb: f64) {
        self.memory.insert(serial, (peak_mb, alloc_mb));
    }

    /// Every sampler, from now on, keeps where each thread is at each tick.
    pub(crate) fn keep_positions(&mut self) {
        if self.positions {
            return;
        }
        self.positions = true;
        for t in self.tracked.values_mut() {
            if let Tracked::Sampling { sampler, .. } = t {
                sampler.keep_positions();
            }
        }
    }

    /// Where each thread of every process was at each tick since the last call.
    pub(crate) fn take_positions(&mut self) -> Vec<crate::timeline::Position> {
        let live = self.tracked.values_mut().filter_map(|t| match t {
            Tracked::Sampling { sampler, .. } => Some(sampler),
            Tracked::Other { .. } => None,
        });
        let mut all = Vec::new();
        for s in live.chain(self.done.iter_mut().map(|d| &mut d.sampler)) {
            all.extend(s.take_positions());
        }
        all
    }

    /// The Python threads of every running process that ran since the last call, and
    /// those that did not.
    pub(crate) fn take_threads(&mut self) -> (usize, usize) {
        self.tracked
            .values_mut()
            .filter_map(|t| match t {
                Tracked::Sampling { sampler, .. } => Some(sampler.take_threads()),
                Tracked::Other { .. } => None,
            })
            .fold((0, 0), |(a, i), (a2, i2)| (a + a2, i + i2))
    }

    /// Ends every image (the recording is over). See [`ProcessTree::take_retired`].
    pub(crate) fn retire_all(&mut self) {
        let pids: Vec<i32> = self.tracked.keys().copied().collect();
        for pid in pids {
            self.retire(pid);
        }
    }

    /// The first process refused (see [`ProcessTree::notes`]), with its error.
    pub(crate) fn take_first_refusal(&mut self) -> Option<Error> {
        self.first_refusal.take()
    }

    /// Processes sampled so far, running or finished.
    pub(crate) fn profiled(&self) -> usize {
        self.done.len()
            + self
                .tracked
                .values()
                .filter(|t| matches!(t, Tracked::Sampling { .. }))
                .count()
    }

    fn retire(&mut self, pid: i32) {
        if let Some(Tracked::Sampling {
            sampler,
            command,
            serial,
            ..
        }) = self.tracked.remove(&pid)
        {
            self.retired.push((pid, serial));
            if sampler.stats.samples > 0 {
                self.done.push(Done {
                    sampler,
                    command,
                    serial,
                });
            }
        }
    }

    /// The root and its descendants:
    /// - the last listing less the processes gone, while no task has started since (no
    ///   process can have joined the tree; a thousand threads at rest cost a scan no read
    ///   each);
    /// - else read again.
    fn descendants(&mut self, now: Instant) -> Vec<i32> {
        // Read before the listing, because a task that starts during it changes the id.
        let last = crate::proc::last_pid();
        if let (Some(l), Some((was, at, pids))) = (last, &self.listed) {
            if l == *was && now.duration_since(*at) < RELIST_EVERY {
                return pids
                    .iter()
                    .copied()
                    .filter(|p| std::path::Path::new(&format!("/proc/{p}")).exists())
                    .collect();
            }
        }
        let pids = crate::proc::descendants(self.root);
        self.listed = last.map(|l| (l, now, pids.clone()));
        pids
    }

    /// Looks for new processes, processes that exec'd, and processes that are gone.
    fn scan(&mut self) {
        let now = Instant::now();
        let cpu_before = super::cputime::own_thread_cpu();
        self.scanned = true;
        let pids = if self.follow {
            self.descendants(now)
        } else {
            vec![self.root]
        };
        // The cost is the listing's CPU time, not its wall time.
        // - Wall time counts the while other programs had the CPU. Beside four busy loops,
        //   listings of about 0.1 ms of CPU took up to 54 ms of wall time, which put the
        //   next scan 2.7 s away.
        // - A 3.8 program that slept 1.5 s then ended before its second look, and `run
        //   --async` said "no Python interpreter was found" instead of refusing (1 run in
        //   15 beside three busy loops; the suite's asyncio test saw it).
        // - Locating a new process's interpreter is not counted, because it happens once.
        let cost = super::cputime::own_thread_cpu().saturating_sub(cpu_before);
        self.next_scan = Some(now + self.scan_every.max(cost * SCAN_COST_FACTOR));
        let gone: Vec<i32> = self
            .tracked
            .keys()
            .copied()
            .filter(|p| !pids.contains(p))
            .collect();
        for pid in gone {
            self.retire(pid);
        }
        let own = crate::proc::exe_path(std::process::id() as i32).ok();
        for pid in pids {
            let Some(exe) = crate::proc::image_of(pid) else {
                continue;
            };
            // Forked by us and not yet exec'd, so there is nothing to look at (and our own
            // binary is large to parse).
            if own
                .as_ref()
                .is_some_and(|o| exe.starts_with(&format!("{o}\0")))
            {
                continue;
            }
            match self.tracked.get(&pid) {
                Some(Tracked::Sampling { exe: e, .. }) if *e == exe => continue,
                // It exec'd. What it was is finished; what it is now is a new process.
                Some(Tracked::Sampling { .. }) => self.retire(pid),
                Some(Tracked::Other {
                    exe: e, next_try, ..
                }) if *e == exe && now < *next_try => continue,
                _ => {}
            }
            let tries = match self.tracked.get(&pid) {
                Some(Tracked::Other { exe: e, tries, .. }) if *e == exe => tries + 1,
                _ => 0,
            };
            // A child forked without an exec has its parent's image, with the same
            // interpreter and the same addresses.
            let parent = self.tracked.values().find_map(|t| match t {
                Tracked::Sampling {
                    sampler, exe: e, ..
                } if *e == exe => Some(sampler.reader.process()),
                _ => None,
            });
            let located = match parent {
                Some(p) => p.forked(pid),
                None => PythonProcess::locate(pid, &self.locate),
            };
            let backoff = (STARTING_RETRY * 2u32.saturating_pow(tries.min(16))).min(OTHER_RETRY);
            let located = located.and_then(|p| {
                p.check_request(self.cfg.gil_only, self.cfg.tasks)
                    .map(|_| p)
            });
            let next = match located {
                Ok(p) if matches!(p.interp_head(), Ok(h) if h != 0) => {
                    self.start_sampling(p, exe);
                    continue;
                }
                Ok(_) => now + STARTING_RETRY,
                // A refusal is final only when it holds a few tries in a row, because a
                // process caught mid-exec or still starting may look unreadable for a moment,
                // and a refused process's memory ring is removed as soon as it makes one (CI
                // saw a subprocess of Debian's 3.15 lose its ring so).
                Err(
                    e @ (Error::UnsupportedVersion { .. }
                    | Error::PermissionDenied { .. }
                    | Error::NoGil { .. }
                    | Error::NoAsync { .. }),
                ) if tries + 1 >= REFUSAL_TRIES => {
                    self.notes.insert(pid, e.to_string());
                    self.first_refusal.get_or_insert(e);
                    now + Duration::from_secs(3600)
                }
                // When it is not Python, or not yet (libpython not mapped yet), or mid-exec
                // or exiting, look again, less and less often.
                Err(_) => now + backoff,
            };
            self.tracked.insert(
                pid,
                Tracked::Other {
                    exe,
                    next_try: next,
                    tries,
                },
            );
        }
    }

    /// The running samplers' and finished ones' statistics, summed into `self.stats`.
    fn sum_stats(&mut self) {
        let mut errors = 0;
        let mut paused = 0;
        let mut thinned = 0;
        let mut unchanged = 0;
        let mut short = 0;
        let mut deferred = 0;
        let (mut gil_samples, mut gil_held) = (0, 0);
        let mut kinds: BTreeMap<crate::python::Unread, u64> = BTreeMap::new();
        let mut native = super::native::MergeCounts::default();
        let live = self.tracked.values().filter_map(|t| match t {
            Tracked::Sampling { sampler, .. } => Some(&sampler.stats),
            Tracked::Other { .. } => None,
        });
        let mut notes: Vec<String> = Vec::new();
        for st in live.chain(self.done.iter().map(|d| &d.sampler.stats)) {
            for n in &st.notes {
                if !notes.contains(n) {
                    notes.push(n.clone());
                }
            }
            if self.stats.cpu_times_from.is_none() {
                self.stats.cpu_times_from.clone_from(&st.cpu_times_from);
            }
            errors += st.errors;
            paused += st.paused_reads;
            thinned += st.thinned;
            unchanged += st.unchanged;
            short += st.short_cpu_reads;
            deferred += st.deferred;
            gil_samples += st.gil_samples;
            gil_held += st.gil_held;
            native.add(&st.native);
            for (k, n) in &st.error_kinds {
                *kinds.entry(*k).or_insert(0) += n;
            }
        }
        self.stats.errors = errors;
        self.stats.gil_samples = gil_samples;
        self.stats.gil_held = gil_held;
        self.stats.paused_reads = paused;
        self.stats.thinned = thinned;
        self.stats.unchanged = unchanged;
        self.stats.short_cpu_reads = short;
        self.stats.deferred = deferred;
        self.stats.error_kinds = kinds;
        self.stats.native = native;
        self.stats.notes = notes;
    }

    /// One tick: a scan when due, then one sample of every Python process. False once
    /// the root is gone and nothing is left to sample.
    pub(crate) fn tick(&mut self) -> Result<bool> {
        if self.next_scan.is_none_or(|t| Instant::now() >= t) {
            self.scan();
        }
        let mut ended = Vec::new();
        let mut sampled = false;
        for (&pid, t) in self.tracked.iter_mut() {
            if let Tracked::Sampling { sampler, .. } = t {
                let before = sampler.stats.samples;
                match sampler.sample_once() {
                    // A tick a sampler left without a sample (it thins paused samples)
                    // is not a sample.
                    Ok(()) => sampled |= sampler.stats.samples > before,
                    Err(e) if e.is_process_gone() => ended.push(pid),
                    Err(e) => return Err(e),
                }
            }
        }
        for pid in ended {
            self.retire(pid);
        }
        if sampled {
            self.stats.samples += 1;
        }
        self.sum_stats();
        let sampling = self
            .tracked
            .values()
            .any(|t| matches!(t, Tracked::Sampling { .. }));
        Ok(sampling || crate::proc::process_exists(self.root))
    }

    /// The merged profile of every process sampled.
    pub(crate) fn finish(mut self, program: String) -> Profile {
        self.retire_all();
        self.profile_so_far(program, &mut HashMap::new())
    }

    /// Every sampler, finished or running, with its command and serial.
    fn samplers(&self) -> impl Iterator<Item = (&Sampler, &str, u64)> {
        let done = self
            .done
            .iter()
            .map(|d| (&*d.sampler, d.command.as_str(), d.serial));
        let live = self.tracked.values().filter_map(|t| match t {
            Tracked::Sampling {
                sampler,
                command,
                serial,
                ..
            } => Some((&**sampler, command.as_str(), *serial)),
            Tracked::Other { .. } => None,
        });
        done.chain(live)
    }

    /// The merged profile of every process sampled so far, finished or running (a live
    /// view's, while the recording goes on). `sources` keeps the files' text from one call
    /// to the next, so each file is read once.
    pub(crate) fn profile_so_far(
        &self,
        program: String,
        sources: &mut HashMap<String, Option<Vec<String>>>,
    ) -> Profile {
        let mut agg = Aggregator::new();
        let mut views: Vec<(i32, Option<String>)> = Vec::new();
        let mut processes = Vec::new();
        let mut procs: Vec<&PythonProcess> = Vec::new();
        for (s, command, serial) in self.samplers() {
            agg.absorb(s.aggregator());
            let v = s.reader.process().version.to_string();
            views.push((s.reader.process().pid, s.cwd().map(str::to_string)));
            procs.push(s.reader.process());
            let mem = self.memory.get(&serial);
            processes.push(ProcessProfile {
                pid: s.reader.process().pid,
                command: command.to_string(),
                python_version: v,
                samples: s.stats.samples,
                cpu_pct: s.aggregator().total_s(),
                mem_peak_mb: mem.map(|m| m.0),
                mem_alloc_mb: mem.map(|m| m.1),
                gpu_pct: None,
                gpu_mem_peak_mb: None,
            });
        }
        let total = agg.total_s();
        for p in &mut processes {
            p.cpu_pct = if total > 0.0 {
                100.0 * p.cpu_pct / total
            } else {
                0.0
            };
        }
        let meta = super::profile_meta(&self.cfg, program, self.root, &procs, &self.stats);
        // A file's source as the first process that can read it sees it.
        for (s, _, _) in self.samplers() {
            for (file, text) in s.sources() {
                if text.is_some() && !sources.contains_key(file) {
                    sources.insert(file.clone(), text.clone());
                }
            }
        }
        let mut profile = agg.finish(meta, &mut |file| {
            sources
                .entry(file.to_string())
                .or_insert_with(|| {
                    views.iter().find_map(|(pid, cwd)| {
                        super::read_source(*pid, &super::absolute(file, cwd.as_deref()))
                    })
                })
                .clone()
        });
        // Listed when there are several, or when the one is not the root (a shell
        // script's Python, a launcher's), so the profile says which process it is of.
        if processes.len() > 1 || processes.iter().any(|p| p.pid != self.root) {
            processes.sort_by_key(|p| p.pid);
            profile.processes = processes;
        }
        profile
    }
}

impl Ticker for ProcessTree {
    fn tick(&mut self) -> Result<bool> {
        ProcessTree::tick(self)
    }
    fn stats_mut(&mut self) -> &mut Stats {
        &mut self.stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A kept listing still loses the processes that ended and gains the ones that started
    /// since (a start gives out a new task id, so the tree is listed again).
    #[test]
    fn a_kept_listing_follows_processes_that_end_and_start() {
        // sh → sleep 30 and sleep 0.4 at once; a second sleep 30 once the short one ends.
        let mut child = std::process::Command::new("sh")
            .args(["-c", "sleep 30 & sleep 0.4; sleep 30 & wait"])
            .spawn()
            .expect("sh");
        let root = child.id() as i32;
        let mut tree = ProcessTree::new(
            root,
            true,
            SamplerConfig::default(),
            LocateOptions::default(),
        );
        let sleeps = |pids: &[i32]| -> Vec<i32> {
            pids.iter()
                .copied()
                .filter(|&p| crate::proc::exe_path(p).is_ok_and(|e| e.ends_with("/sleep")))
                .collect()
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut first = Vec::new();
        while Instant::now() < deadline && first.len() < 2 {
            first = sleeps(&tree.descendants(Instant::now()));
            std::thread::sleep(Duration::from_millis(5));
        }
        // Every scan of the next second, as the sampler would make them.
        let mut later = Vec::new();
        let until = Instant::now() + Duration::from_secs(1);
        while Instant::now() < until {
            later = tree.descendants(Instant::now());
            std::thread::sleep(Duration::from_millis(20));
        }
        let later_sleeps = sleeps(&later);
        for p in later.iter().chain(&first).filter(|&&p| p != root) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(*p),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(first.len(), 2, "sleep 30 and sleep 0.4: {first:?}");
        assert_eq!(later_sleeps.len(), 2, "the two sleep 30s: {later:?}");
        let gone: Vec<_> = first.iter().filter(|p| !later_sleeps.contains(p)).collect();
        assert_eq!(gone.len(), 1, "sleep 0.4 ended: {first:?} then {later:?}");
        assert!(
            later_sleeps.iter().any(|p| !first.contains(p)),
            "the new sleep 30 is found"
        );
    }

    #[test]
    fn finds_children_and_grandchildren() {
        // sh → sleep, and sh → sh → sleep.
        let mut child = std::process::Command::new("sh")
            .args(["-c", "sleep 30 & sh -c 'sleep 30 & wait' & wait"])
            .spawn()
            .expect("sh");
        let root = child.id() as i32;
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut found = Vec::new();
        while Instant::now() < deadline {
            found = crate::proc::descendants(root);
            let sleeps = found
                .iter()
                .filter(|&&p| crate::proc::exe_path(p).is_ok_and(|e| e.ends_with("/sleep")))
                .count();
            if sleeps == 2 {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        for p in found.iter().skip(1) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(*p),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(found.first(), Some(&root));
        // root sh, 2 sleeps, the inner sh.
        assert_eq!(found.len(), 4, "{found:?}");
    }
}
