//! The profiler's consumer thread: reads the ring as events arrive, reads the allocating
//! thread's Python stack while that thread waits in the handshake, answers it, and folds
//! the events.
//!
//! Owns:
//! - [`MemoryRecorder`] (the thread, its stop, its result);
//! - the memory side of `run`, the ring and the written library ([`MemorySetup`]);
//! - finding the rings of a program whose `run` is gone, for `attach` ([`ring_of_program`],
//!   [`take_over_ring`]).
//!
//! Must not: pause the target's threads (only the allocating thread waits, in its own
//! futex; with `--native` that thread alone is stopped for the copy of its native stack,
//! `native.rs`) or take longer than needed per event, because the program waits for our
//! answer.

use super::aggregate::{LineKey, MemoryAggregator, RingTotals};
pub use super::config::{MemoryConfig, PythonAllocator};
use super::native::{NativeStacks, SharedCache};
use super::preload::{preload_env, PreloadFile};
use super::ring::{self, layout, Ring, What};
use crate::python::{Frame, PythonProcess, ThreadReader};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The ring and the library for one `run`, created before the program starts.
pub(crate) struct MemorySetup {
    pub(crate) ring: Ring,
    pub(crate) library: PreloadFile,
    python_allocator: PythonAllocator,
}

impl MemorySetup {
    pub(crate) fn new(cfg: &MemoryConfig) -> std::io::Result<MemorySetup> {
        let dir = ring::ring_dir();
        ring::clean_stale(&dir);
        let ring = Ring::create(&dir, ring::DEFAULT_CAPACITY, cfg.window, cfg.copy_window)?;
        // Not /dev/shm, because it may be mounted noexec and the library must be mapped
        // executable.
        super::preload::clean_stale(&std::env::temp_dir());
        let library = PreloadFile::write(&std::env::temp_dir())?;
        Ok(MemorySetup {
            ring,
            library,
            python_allocator: cfg.python_allocator,
        })
    }

    /// The environment the program gets (our LD_PRELOAD after the user's own).
    pub(crate) fn env(&self) -> Vec<(String, String)> {
        let user = std::env::var("LD_PRELOAD").ok();
        let user_pythonmalloc = std::env::var("PYTHONMALLOC").ok();
        preload_env(
            user.as_deref(),
            user_pythonmalloc.as_deref(),
            self.library.path(),
            self.ring.path(),
            self.python_allocator,
        )
    }
}

/// The ring the profiler made for the program `pid` belongs to (named in its environment),
/// when the preload library is loaded in it, which means the program was started under
/// `run`. An error says it was not (then `attach` loads the library itself; see
/// memory/inject.rs).
pub(crate) fn ring_of_program(pid: i32) -> Result<PathBuf, String> {
    let maps = crate::proc::read_maps(pid).unwrap_or_default();
    if !crate::proc::maps::maps_file_named(&maps, crate::PRELOAD_LIBRARY) {
        return Err("the program was not started under `scalene-rs run`".into());
    }
    crate::proc::environ_var(pid, ring::RING_ENV)
        .map(PathBuf::from)
        .ok_or_else(|| {
            "the preload library is loaded but its ring is not named in the environment".into()
        })
}

/// Process `pid`'s ring, of a program started under `run` whose profiler is gone
/// (`attach`), taken over. It is:
/// - the one it made for itself (`<main>.<pid>`);
/// - else the profiler's ring `main` if it is the process that claimed it.
///
/// `Ok(None)` means neither (not yet; a process makes its own at its first sampled event).
pub(crate) fn take_over_ring(main: &Path, pid: i32) -> Result<Option<Ring>, String> {
    let own = ring::child_path(main, pid);
    if own.exists() {
        return Ring::take_over(&own, pid).map(Some);
    }
    match ring::producer_of(main) {
        // When it is another process's (or nobody's yet), look again later.
        Some(p) if p != pid => Ok(None),
        _ => Ring::take_over(main, pid).map(Some),
    }
}

/// The running consumer thread.
pub(crate) struct MemoryRecorder {
    stop: Arc<AtomicBool>,
    handle: JoinHandle<(MemoryAggregator, RingTotals)>,
    live: Arc<LiveCopy>,
}

/// A copy of a recorder's figures so far, for a live view (`top`), made by the recorder's
/// own thread at most every [`LIVE_COPY_EVERY`] once somebody asked for one.
#[derive(Default)]
struct LiveCopy {
    wanted: AtomicBool,
    copy: std::sync::Mutex<Option<(MemoryAggregator, RingTotals)>>,
}

/// How often a recorder copies its figures for a live view. It is twice per refresh of the
/// default one-second view, so a view is at most half a second behind its memory.
const LIVE_COPY_EVERY: Duration = Duration::from_millis(500);

impl MemoryRecorder {
    /// Starts reading `ring` for the process `proc` (a handle of its own, see
    /// [`PythonProcess::reopen`]). Handshakes are answered from now on. Given `native` (with
    /// `--native`, images shared with the samplers), each handshake's stack gets its native
    /// frames.
    pub(crate) fn start(
        mut ring: Ring,
        proc: Option<PythonProcess>,
        cfg: MemoryConfig,
        native: Option<SharedCache>,
    ) -> MemoryRecorder {
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let live = Arc::new(LiveCopy::default());
        let live2 = live.clone();
        let name = match ring.producer_pid() {
            0 => "memory".to_string(),
            pid => format!("memory-{pid}"),
        };
        let handle = std::thread::Builder::new()
            .name(name)
            .spawn(move || consume(&mut ring, proc, &cfg, native, &stop2, &live2))
            .expect("spawning the memory thread");
        MemoryRecorder { stop, handle, live }
    }

    /// The figures so far, as the recorder's thread last copied them (None until it has;
    /// the first call asks for copies from then on).
    pub(crate) fn live_copy(&self) -> Option<(MemoryAggregator, RingTotals)> {
        self.live.wanted.store(true, Ordering::Relaxed);
        self.live
            .copy
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Stops after reading what is left; returns the folded events and the ring's totals.
    pub(crate) fn finish(self) -> (MemoryAggregator, RingTotals) {
        self.stop.store(true, Ordering::Release);
        self.handle
            .join()
            .unwrap_or_else(|_| (MemoryAggregator::new(), RingTotals::default()))
    }
}

/// Longest wait for the doorbell after reading events, and after finding none.
const BUSY_NAP: Duration = Duration::from_millis(2);
const IDLE_NAP: Duration = Duration::from_millis(10);

fn consume(
    ring: &mut Ring,
    proc: Option<PythonProcess>,
    cfg: &MemoryConfig,
    native: Option<SharedCache>,
    stop: &AtomicBool,
    live: &LiveCopy,
) -> (MemoryAggregator, RingTotals) {
    let mut agg = MemoryAggregator::new();
    let mut reader = proc.map(|p| {
        let r = ThreadReader::new(&p);
        (p, r)
    });
    // The modules are read before the handshakes start, because the program's first events
    // wait for us (bounded) while we get ready, and its later ones would time out.
    let mut native = match (native, &reader) {
        (Some(cache), Some((p, _))) => {
            let mut n = NativeStacks::new(cache);
            n.prepare(p);
            Some(n)
        }
        _ => None,
    };
    ring.set_handshake(reader.is_some());
    let mut bell = 0;
    // Handshakes answered, and how long their threads waited in all (from the event's
    // time to our answer), that is, the program's time spent waiting for us.
    let (mut handshakes, mut waited_ns) = (0u64, 0u64);
    let mut carried = HashMap::new();
    // The same for the events of blocks of at least a window (`What::Alloc::large`).
    let mut carried_large = HashMap::new();
    let mut last_footprint = Instant::now();
    let mut last_copy: Option<Instant> = None;
    // Once told to stop, the events reserved by then are the recording's last, because a
    // process that goes on allocating must not keep the recording (and our answers) going.
    let mut end: Option<u64> = None;
    loop {
        if end.is_none() && stop.load(Ordering::Acquire) {
            // New events no longer wait for us; those in the ring are still answered. A
            // library we loaded (attach) stops counting and unpatches.
            ring.set_handshake(false);
            ring.detach_library();
            end = Some(ring.tickets().1);
        }
        let mut any = false;
        while end.is_none_or(|end| ring.tickets().0 < end) {
            let Some(e) = ring.next_event() else { break };
            any = true;
            let stacked = matches!(e.what, What::Alloc { .. } | What::Copy { .. });
            // Under `--native`, a thread that waits is stopped for its native stack (copied
            // now, unwound after the answer).
            let waiting = match (&mut native, reader.as_mut()) {
                (Some(n), Some((p, r))) if stacked && e.wants_ack => n.take(p, r, &e),
                _ => None,
            };
            // A block of at least a window has stacks of its own to carry, so a churn of
            // small objects beside it never charges its events to the block's line, nor the
            // block's to the churn's.
            let large = matches!(e.what, What::Alloc { large: true, .. });
            let carry = if large {
                &mut carried_large
            } else {
                &mut carried
            };
            let (mut frames, mut own) = match &waiting {
                Some(Ok(w)) => {
                    remember(carry, e.tid, e.time_ns, &w.thread.frames);
                    (None, true)
                }
                _ if stacked => {
                    let frames = stack_of_event(&e, reader.as_mut(), carry);
                    // Read while the thread still waited, the stack is its own (later, it
                    // may have gone on to another line).
                    let own = e.wants_ack
                        && frames.is_some()
                        && layout::now_ns() <= e.time_ns.saturating_add(layout::HANDSHAKE_WAIT_NS);
                    (frames, own)
                }
                _ => (None, false),
            };
            ring.ack(&e);
            if e.wants_ack {
                handshakes += 1;
                // The event's time is the program's to write (0, say), so the sums are
                // bounded.
                let waited = layout::now_ns().saturating_sub(e.time_ns);
                waited_ns = waited_ns.saturating_add(waited);
            }
            if let (Some(n), Some((p, _)), Some(w)) = (&mut native, &reader, waiting) {
                match w {
                    Ok(w) => frames = Some(n.finish(p, &w).unwrap_or_else(|python| python)),
                    // Read as without `--native` (above).
                    Err(why) => n.counts.unmerged(&why),
                }
            }
            own &= frames.is_some();
            agg.note_stack_of_large(&e, own);
            let line = frames.as_deref().and_then(|f| line_of(f, cfg.profile_all));
            if let (Some(f), Some(l)) = (&frames, &line) {
                agg.add_native_leaf(&e, l, f);
            }
            agg.add(&e, line);
            if let Some(f) = &frames {
                agg.add_stack(&e, f);
            }
            if matches!(e.what, What::Alloc { .. } | What::Free { .. }) {
                agg.footprint_at(e.time_ns, ring.footprint());
            }
        }
        if let Some(end) = end {
            // Drained to the end, or what is left was reserved and not written (a stuck
            // slot, whose producer died or stopped mid-event).
            if !any || ring.tickets().0 >= end {
                break;
            }
        }
        if end.is_none() {
            ring.heartbeat();
        }
        if last_footprint.elapsed() >= Duration::from_millis(10) {
            last_footprint = Instant::now();
            agg.footprint_at(layout::now_ns(), ring.footprint());
        }
        if live.wanted.load(Ordering::Relaxed)
            && last_copy.is_none_or(|t| t.elapsed() >= LIVE_COPY_EVERY)
        {
            last_copy = Some(Instant::now());
            let copy = (agg.clone(), ring_totals(ring, handshakes, waited_ns));
            *live.copy.lock().unwrap_or_else(|e| e.into_inner()) = Some(copy);
        }
        // A producer that waits rings the doorbell. Idle, we look at other events (frees)
        // less often. A program of many processes has a reader per process, mostly idle.
        let nap = if any { BUSY_NAP } else { IDLE_NAP };
        bell = ring.wait_doorbell(bell, nap);
    }
    // Handshakes were turned off at the stop (the only way out of the loop).
    let totals = ring_totals(ring, handshakes, waited_ns);
    if let Some(n) = native {
        agg.set_native_counts(n.counts);
    }
    (agg, totals)
}

/// The ring's totals now, with the handshakes answered and how long they waited.
fn ring_totals(ring: &Ring, handshakes: u64, waited_ns: u64) -> RingTotals {
    let h = ring.header();
    RingTotals {
        peak_bytes: ring.peak(),
        window: h.window.load(Ordering::Relaxed),
        copy_window: h.copy_window.load(Ordering::Relaxed),
        dropped: ring.dropped(),
        handshake_timeouts: ring.handshake_timeouts(),
        handshakes,
        handshake_wait_ns: waited_ns,
    }
}

/// How long the stack read at a thread's handshake stands for its events sent without
/// waiting (see [`stack_of_event`]).
const CARRY_FOR_NS: u64 = 1_000_000_000;

/// A carried stack younger than this is used as it is. An older one is first replaced by
/// reading the running thread, when that read holds. It is twice the period at which a
/// thread earns handshakes, so a thread that uses its handshakes is never read running, and
/// one whose handshakes stopped (the profiler answered too late and the library gave up on
/// waiting) is read at most this often, not at each of its events (thousands a second, each
/// a full stack read that would put us further behind).
const FRESH_FOR_NS: u64 = 10_000_000;

/// Reader of a process's stacks.
type StackReader = (PythonProcess, ThreadReader);

/// The stack an allocation or copy event is tied to.
/// - A thread that waits (the handshake) is read where it waits, which is exact.
/// - The preload library sends a thread's events without waiting once it has used its
///   handshakes (at most 200 a second after a bank of 256: a thread that allocates a window
///   every few microseconds). Such an event gets the stack of that thread's latest
///   handshake, recent by construction (one is earned every 5 ms), and so a random sample's
///   line among the events of such a dense stretch.
/// - When that stack is older than [`FRESH_FOR_NS`] (no handshakes, because the profiler
///   was not answering), the thread is read as it runs. The read is kept (and carried) only
///   if its stack did not change during the read. Failing that, a stack younger than
///   [`CARRY_FOR_NS`] stands.
fn stack_of_event(
    e: &ring::Event,
    reader: Option<&mut StackReader>,
    carried: &mut HashMap<i32, (u64, Vec<Frame>)>,
) -> Option<Vec<Frame>> {
    let age = carried
        .get(&e.tid)
        .map(|(at, _)| e.time_ns.saturating_sub(*at));
    if !e.wants_ack && age.is_some_and(|a| a < FRESH_FOR_NS) {
        return carried.get(&e.tid).map(|(_, f)| f.clone());
    }
    let read = reader.and_then(|(p, r)| r.stack_of(p, e.tid, !e.wants_ack).ok().flatten());
    match read {
        Some(frames) => {
            remember(carried, e.tid, e.time_ns, &frames);
            Some(frames)
        }
        None if !e.wants_ack && age.is_some_and(|a| a < CARRY_FOR_NS) => {
            carried.get(&e.tid).map(|(_, f)| f.clone())
        }
        None => None,
    }
}

/// Keeps thread `tid`'s Python stack read at `at` for its events sent without waiting
/// (see [`stack_of_event`]). Python frames alone, because a native stack is read only while
/// the thread waits, and the next allocations of the thread may come from another C function.
fn remember(carried: &mut HashMap<i32, (u64, Vec<Frame>)>, tid: i32, at: u64, frames: &[Frame]) {
    if carried.len() > 4096 {
        carried.clear();
    }
    carried.insert(tid, (at, frames.to_vec()));
}

/// The line of a stack. It is its innermost frame, or with library folding the innermost
/// frame of the user's code.
fn line_of(frames: &[Frame], profile_all: bool) -> Option<LineKey> {
    let f = crate::profile::charged_frame(frames, profile_all)?;
    Some((f.filename.to_string(), f.line?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    /// A process that never stops allocating does not keep the recording going. `finish`
    /// returns with the events written before it was called (a recording of `attach
    /// --duration` once ran on for the rest of the worker's 6 s task).
    #[test]
    fn finish_returns_while_the_process_goes_on_writing() {
        let ring = Ring::create(&std::env::temp_dir(), 1024, 1 << 20, 1 << 20).unwrap();
        let path = ring.path().to_path_buf();
        // The producer: this process, through a second mapping of the same file.
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        // SAFETY: a shared mapping of the ring file; every access goes through atomics.
        let map = unsafe { memmap2::MmapMut::map_mut(&file) }.unwrap();
        let recorder = MemoryRecorder::start(ring, None, MemoryConfig::default(), None);
        let stop = Arc::new(AtomicBool::new(false));
        let written = Arc::new(AtomicU64::new(0));
        let producer = {
            let (stop, written) = (stop.clone(), written.clone());
            std::thread::spawn(move || {
                // SAFETY: the mapping starts with the header and holds its slots.
                let h = unsafe { &*(map.as_ptr() as *const layout::Header) };
                while !stop.load(Ordering::Relaxed) {
                    if let Some(t) = h.reserve() {
                        // SAFETY: as above.
                        let s = unsafe { h.slot(t) };
                        s.publish(
                            t,
                            &layout::EventData {
                                kind: layout::EV_ALLOC,
                                tid: 1,
                                a: 1 << 20,
                                b: 1 << 20,
                                ..Default::default()
                            },
                        );
                        written.fetch_add(1, Ordering::Relaxed);
                    }
                    std::hint::spin_loop();
                }
            })
        };
        while written.load(Ordering::Relaxed) < 10_000 {
            std::thread::sleep(Duration::from_millis(1));
        }
        let asked = Instant::now();
        let (agg, _) = recorder.finish();
        let took = asked.elapsed();
        let before = written.load(Ordering::Relaxed);
        stop.store(true, Ordering::Relaxed);
        producer.join().unwrap();
        assert!(took < Duration::from_secs(1), "finish took {took:?}");
        assert!(agg.alloc_bytes() > 0.0);
        assert!(agg.alloc_bytes() <= before as f64 * (1u64 << 20) as f64);
    }
}
