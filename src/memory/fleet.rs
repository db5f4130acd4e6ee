//! Memory of a program of several processes. Each Python process has a ring of its own,
//! read by a consumer of its own, and their results merge into one.
//!
//! Owns: [`Fleet`], which is
//! - finding the ring of each process the process tree samples. It is the ring the
//!   profiler made (which the program's first Python process claims), or the one another
//!   process made for itself at its first event (`<ring>.<pid>`).
//! - checking it belongs to the image being sampled, because a process that `exec`s gets a
//!   new ring;
//! - running a [`MemoryRecorder`] per ring, one thread each, so that a process's
//!   allocating thread never waits on a consumer busy with another process's handshake;
//! - finishing it when its process ends or execs;
//! - each process's own figures, and the merged result.
//!
//! Must not: look for processes (the process tree does, and tells us), read stacks itself
//! (the recorders do), or format output.

use super::aggregate::{MemoryAggregator, RingTotals};
use super::consumer::{self, MemoryConfig, MemoryRecorder};
use super::native::SharedCache;
use super::ring::{self, layout, Ring};
use crate::python::PythonProcess;
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

const MB: f64 = 1024.0 * 1024.0;

/// One process's own memory figures (the per-process breakdown of the profile).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct ProcessFigures {
    /// Peak of its sampled live footprint, MB.
    pub(crate) peak_mb: f64,
    /// MB it allocated (its sampled windows).
    pub(crate) alloc_mb: f64,
}

/// Where rings come from.
enum Source {
    /// `run`: the profiler's ring (until the process that claimed it is found), and the
    /// rings processes make beside it, which we remove when done.
    Run {
        main: Option<Ring>,
        main_path: PathBuf,
    },
    /// `attach` to a program whose `run` is gone: each process's ring is taken over. The
    /// profiler's ring's path comes from each process's environment.
    Attach,
}

/// A finished recorder's results.
struct Finished {
    agg: MemoryAggregator,
    totals: RingTotals,
    end_ns: u64,
}

/// The rings of a program's processes and their consumers, by the process tree's serial
/// of each sampled image of a process.
pub(crate) struct Fleet {
    cfg: MemoryConfig,
    source: Source,
    live: HashMap<u64, MemoryRecorder>,
    /// Images whose ring will never come (attach: no library in the process).
    settled: HashSet<u64>,
    /// `attach`: the profiler's ring as named in each image's environment.
    mains: HashMap<u64, PathBuf>,
    done: Vec<Finished>,
    /// Why a process's memory cannot be recorded, by pid.
    notes: Vec<(i32, String)>,
    /// `run`: the preload library (every process of the program that allocates through it
    /// maps it), and the images already checked for it.
    library: Option<PathBuf>,
    checked: HashSet<u64>,
    /// `attach`: processes our library was loaded into (or called again in) for this
    /// recording.
    pub(crate) injected: usize,
    announcements: Vec<String>,
    /// `attach`: each image our library was tried in, with its pid and when it was first tried.
    inject_since: HashMap<u64, (i32, std::time::Instant)>,
    /// `attach`: processes our library counts in, whose announcement waits for the
    /// interpreter's allocator to be wrapped (None: Python 2, nothing to wait for), until
    /// the deadline.
    awaiting: Vec<(i32, Option<ring::PymemFlag>, std::time::Instant)>,
    /// `--native`: images shared with the samplers. Each recorder reads the native frames
    /// of the allocations whose threads wait.
    native: Option<SharedCache>,
}

/// How long `attach` waits for the interpreter to wrap its allocator after our library is in.
const ATTACH_SETTLE: std::time::Duration = std::time::Duration::from_secs(2);

impl Fleet {
    /// For `run`: `main` is the ring the profiler made and named to the program.
    /// `library`: the preload library the program was given.
    pub(crate) fn for_run(main: Ring, cfg: MemoryConfig, library: &Path) -> Fleet {
        let main_path = main.path().to_path_buf();
        let mut fleet = Fleet::new(
            Source::Run {
                main: Some(main),
                main_path,
            },
            cfg,
        );
        fleet.library = Some(library.to_path_buf());
        fleet
    }

    /// For `attach`: rings are found through each process's environment.
    pub(crate) fn for_attach(cfg: MemoryConfig) -> Fleet {
        Fleet::new(Source::Attach, cfg)
    }

    fn new(source: Source, cfg: MemoryConfig) -> Fleet {
        Fleet {
            cfg,
            source,
            live: HashMap::new(),
            settled: HashSet::new(),
            mains: HashMap::new(),
            done: Vec::new(),
            notes: Vec::new(),
            library: None,
            checked: HashSet::new(),
            injected: 0,
            announcements: Vec::new(),
            inject_since: HashMap::new(),
            awaiting: Vec::new(),
            native: None,
        }
    }

    /// `--native`: the recorders read each waiting allocation's native frames, with images
    /// from `cache` (the samplers').
    pub(crate) fn with_native(mut self, cache: Option<SharedCache>) -> Fleet {
        self.native = cache;
        self
    }

    /// Whether image `serial` needs no more looking at (its ring is read, or will never come).
    pub(crate) fn settled(&self, serial: u64) -> bool {
        self.live.contains_key(&serial) || self.settled.contains(&serial)
    }

    /// Image `serial` of process `pid` is sampled through `proc`. When its ring is there, this
    /// starts reading it (its handshakes are answered from then on) and returns its path
    /// (where a thread blocked in the handshake waits). Call again on later scans until
    /// [`Fleet::settled`], because a process makes its ring at its first sampled event.
    pub(crate) fn adopt(&mut self, pid: i32, serial: u64, proc: &PythonProcess) -> Option<PathBuf> {
        if self.settled(serial) {
            return None;
        }
        if self.checked.insert(serial) {
            if let Some(why) = self.unreachable(pid) {
                self.settled.insert(serial);
                self.notes.push((pid, why));
                return None;
            }
        }
        let found = match &mut self.source {
            Source::Run { main, main_path } => {
                match Ring::open_child(&ring::child_path(main_path, pid), pid) {
                    Ok(Some(r)) => Some(r),
                    // The profiler's ring, if this is the process that claimed it. Its file
                    // stays until the end, because the program's later processes read their
                    // settings from it.
                    Ok(None) if main.as_ref().is_some_and(|m| m.producer_pid() == pid) => {
                        main.take().map(|mut m| {
                            m.keep_file();
                            m
                        })
                    }
                    Ok(None) | Err(_) => None,
                }
            }
            Source::Attach => {
                let main = match self.mains.get(&serial) {
                    Some(m) => m.clone(),
                    None => match consumer::ring_of_program(pid) {
                        Ok(m) => {
                            self.mains.insert(serial, m.clone());
                            m
                        }
                        // Started without us, so our library goes in now, with a ring of
                        // its own.
                        Err(_) => {
                            self.inject(pid, serial, proc);
                            return None;
                        }
                    },
                };
                match consumer::take_over_ring(&main, pid) {
                    Ok(r) => r,
                    Err(why) => {
                        self.settled.insert(serial);
                        self.notes.push((pid, why));
                        return None;
                    }
                }
            }
        };
        let mut ring = found?;
        if !of_this_image(&ring, proc) {
            // The ring of this process's image before an `exec` (the new image makes its
            // own, replacing it). It is not ours to remove. Nobody waits on it any more.
            ring.keep_file();
            return None;
        }
        let path = ring.path().to_path_buf();
        let reader = proc.reopen().ok();
        let recorder = MemoryRecorder::start(ring, reader, self.cfg.clone(), self.native.clone());
        self.live.insert(serial, recorder);
        if matches!(self.source, Source::Attach) {
            // Said as for a process our library goes into, which is when its counting begins.
            self.announcements.push(format!(
                "memory of process {pid} is counted from now on (the ring its `run` left \
                 was taken over)"
            ));
        }
        Some(path)
    }

    /// `attach`: loads our library into process `pid` (image `serial`), which was started
    /// without us, and reads the ring it hands it. Tried at each scan until a thread of the
    /// process is at a safe point, for at most [`super::inject::PATIENCE`]. It never waits
    /// here, because this is the sampler's thread and a stall would charge its CPU time to
    /// one line.
    fn inject(&mut self, pid: i32, serial: u64, proc: &PythonProcess) {
        use super::inject::{attach_library, Attach};
        let (_, since) = *self
            .inject_since
            .entry(serial)
            .or_insert_with(|| (pid, std::time::Instant::now()));
        let why = match attach_library(proc, &self.cfg) {
            Attach::Counting(ring) => {
                self.injected += 1;
                let reader = proc.reopen().ok();
                // Python 2 has no allocator API, so its small objects count through pymalloc's
                // arenas, as under `run`.
                let wrapped = (proc.version.major >= 3).then(|| ring.python_allocator_flag());
                let recorder =
                    MemoryRecorder::start(ring, reader, self.cfg.clone(), self.native.clone());
                self.live.insert(serial, recorder);
                self.awaiting
                    .push((pid, wrapped, std::time::Instant::now() + ATTACH_SETTLE));
                return;
            }
            Attach::NotNow if since.elapsed() < super::inject::PATIENCE => return,
            Attach::NotNow => super::inject::NO_SAFE_THREAD.to_string(),
            Attach::Refused(why) => why,
        };
        self.settled.insert(serial);
        self.announcements
            .push(format!("recording time only for process {pid}: {why}"));
        self.notes.push((pid, why));
    }

    /// What happened since the last call that the user should hear of as it happens. Once
    /// our library counts in a process: from when its memory is counted — now, with the
    /// interpreter's own allocator wrapped at its next pending call, said when it is (or
    /// after [`ATTACH_SETTLE`], because a main thread blocked in C runs none until it
    /// returns).
    pub(crate) fn take_announcements(&mut self) -> Vec<String> {
        let now = std::time::Instant::now();
        let mut still = Vec::new();
        for (pid, wrapped, deadline) in std::mem::take(&mut self.awaiting) {
            let done = wrapped.as_ref().is_none_or(|w| w.is_set());
            if !done && now < deadline {
                still.push((pid, wrapped, deadline));
                continue;
            }
            let rest = if done {
                ""
            } else {
                "; its Python objects are counted once its main thread runs Python code again"
            };
            self.announcements.push(format!(
                "memory of process {pid} is counted from now on (our library is loaded into \
                 it; what it held before is not attributed to lines){rest}"
            ));
        }
        self.awaiting = still;
        std::mem::take(&mut self.announcements)
    }

    /// [`Fleet::take_announcements`] at the end of a recording. What still waited is said now,
    /// and a process our library was still waiting to go into gets its reason.
    pub(crate) fn last_announcements(&mut self) -> Vec<String> {
        let waiting: Vec<(u64, i32)> = self
            .inject_since
            .iter()
            .filter(|(s, _)| !self.settled(**s))
            .map(|(&s, &(pid, _))| (s, pid))
            .collect();
        for (serial, pid) in waiting {
            self.settled.insert(serial);
            self.notes.push((
                pid,
                "the recording ended before a thread of the process waited where our \
                 library could be loaded (a sleep, a lock or condition wait, select/poll) \
                 or was found running the interpreter's own code"
                    .into(),
            ));
        }
        let now = std::time::Instant::now();
        for a in &mut self.awaiting {
            a.2 = now;
        }
        self.take_announcements()
    }

    /// The first reason each process's memory cannot be recorded, one per process, in the
    /// order they came.
    pub(crate) fn first_note_per_process(&self) -> Vec<(i32, &str)> {
        let mut told = HashSet::new();
        self.notes
            .iter()
            .filter(|(pid, _)| told.insert(*pid))
            .map(|(pid, why)| (*pid, why.as_str()))
            .collect()
    }

    /// `run`: why process `pid` can record no memory, when it cannot:
    /// - the preload library is not in it (its dynamic loader could not open the file, as in
    ///   a chroot or a mount namespace of its own without our temporary directory), or
    /// - the ring is not visible from its root.
    ///
    /// Its figures would otherwise read as a process that allocated nothing.
    fn unreachable(&self, pid: i32) -> Option<String> {
        let Source::Run { main_path, .. } = &self.source else {
            return None;
        };
        let library = self.library.as_deref()?;
        let name = library.file_name()?.to_string_lossy();
        let maps = crate::proc::read_maps(pid).ok()?;
        // By name, because a root that binds our directory shows the file under another path.
        let loaded = crate::proc::maps::maps_file_named(&maps, &name);
        if !loaded {
            return Some(format!(
                "memory not recorded: the preload library is not in the process (its loader \
                 could not open {}: it runs in a root or mount namespace of its own without \
                 that directory)",
                library.display()
            ));
        }
        let inside = format!("/proc/{pid}/root{}", main_path.display());
        if !Path::new(&inside).exists() && Path::new(&format!("/proc/{pid}/root")).exists() {
            return Some(format!(
                "memory not recorded: the ring {} is not visible from the process's root \
                 (it runs in a root or mount namespace of its own without it)",
                main_path.display()
            ));
        }
        None
    }

    /// Process `pid` of the program cannot be sampled (an unsupported interpreter, no
    /// permission). Its ring, once it has one, must not make it wait for us.
    pub(crate) fn refuse(&mut self, pid: i32) {
        if let Source::Run { main, main_path } = &mut self.source {
            if let Some(m) = main.as_ref().filter(|m| m.producer_pid() == pid) {
                m.set_handshake(false);
            }
            // Dropped at once, which tells it not to wait and removes it.
            let _ = Ring::open_child(&ring::child_path(main_path, pid), pid);
        }
    }

    /// Image `serial` is over (its process ended or exec'd). This reads what is left of its
    /// ring and stops. Returns its own figures, when its ring was read.
    pub(crate) fn retire(&mut self, serial: u64) -> Option<ProcessFigures> {
        self.settled.remove(&serial);
        self.checked.remove(&serial);
        self.mains.remove(&serial);
        let (agg, totals) = self.live.remove(&serial)?.finish();
        let figures = ProcessFigures {
            peak_mb: totals.peak_bytes.max(0) as f64 / MB,
            alloc_mb: agg.alloc_bytes() / MB,
        };
        self.done.push(Finished {
            agg,
            totals,
            end_ns: layout::now_ns(),
        });
        Some(figures)
    }

    /// Every process's memory so far, merged, while the recording goes on (a live view).
    /// It is made of the finished images' and each running recorder's last copy (see
    /// [`MemoryRecorder::live_copy`]). None until some memory was read.
    pub(crate) fn live_memory(&self) -> Option<(MemoryAggregator, RingTotals)> {
        let now = layout::now_ns();
        let mut parts: Vec<(MemoryAggregator, RingTotals, u64)> = self
            .done
            .iter()
            .map(|f| (f.agg.clone(), f.totals, f.end_ns))
            .collect();
        parts.extend(
            self.live
                .values()
                .filter_map(|r| r.live_copy())
                .map(|(agg, totals)| (agg, totals, now)),
        );
        if parts.is_empty() {
            return None;
        }
        let defaults = RingTotals {
            window: self.cfg.window,
            copy_window: self.cfg.copy_window,
            ..RingTotals::default()
        };
        Some(MemoryAggregator::merge_processes(parts, defaults))
    }

    /// Stops every reader and merges every process's memory (see
    /// [`MemoryAggregator::merge_processes`]). `run` always has a result (the program's
    /// memory was recorded, if only as nothing); `attach` only when some ring was read.
    /// The rings `run` made or was given are removed, also those of processes never read.
    pub(crate) fn finish(mut self) -> Option<(MemoryAggregator, RingTotals)> {
        let serials: Vec<u64> = self.live.keys().copied().collect();
        for s in serials {
            self.retire(s);
        }
        let defaults = RingTotals {
            window: self.cfg.window,
            copy_window: self.cfg.copy_window,
            ..RingTotals::default()
        };
        if let Source::Run { main, main_path } = &mut self.source {
            // Never read. Its program's processes no longer wait for us.
            drop(main.take());
            let _ = std::fs::remove_file(&*main_path);
            ring::remove_children_of(main_path);
            // Nothing recorded, and a process said why, so this is not a program that
            // allocated nothing.
            if self.done.is_empty() && !self.notes.is_empty() {
                return None;
            }
        } else if self.done.is_empty() {
            return None;
        }
        let parts = self
            .done
            .into_iter()
            .map(|f| (f.agg, f.totals, f.end_ns))
            .collect();
        Some(MemoryAggregator::merge_processes(parts, defaults))
    }
}

/// Whether `ring` was claimed by the image `proc` reads. It was if the library wrote where the
/// interpreter's image (libpython, or a static executable) starts in its process, and the
/// process maps a file starting just there now (an `exec` maps everything afresh, at other
/// addresses). True when either is unknown.
fn of_this_image(ring: &Ring, proc: &PythonProcess) -> bool {
    use std::sync::atomic::Ordering;
    let lo = ring.header().python_lo.load(Ordering::Acquire);
    let Ok(maps) = crate::proc::read_maps(proc.pid) else {
        return true;
    };
    let Some(path) = maps
        .iter()
        .find(|m| (m.start..m.end).contains(&lo))
        .and_then(|m| m.path.as_deref())
    else {
        return lo == 0;
    };
    lo == 0
        || maps
            .iter()
            .filter(|m| m.path.as_deref() == Some(path))
            .map(|m| m.start)
            .min()
            == Some(lo)
}
