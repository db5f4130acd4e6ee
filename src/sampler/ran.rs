//! Which threads ran since the last sample, without reading every thread's CPU time.
//!
//! Owns: [`ProcessClock`]. It checks the target's process CPU clock against the per-thread
//! `schedstat` times. The clock is read with `clock_gettime` on the clock id of another
//! process, which Linux lets anyone read.
//!
//! Why the check works:
//! - The kernel keeps one total per thread (`sum_exec_runtime`), and `schedstat` shows it.
//! - The process clock of another process is the sum of its threads' totals, plus what its
//!   exited threads used.
//! - So when the process total moved by exactly what the threads that ran lately moved by,
//!   no other thread ran.
//!
//! A sample then reads `schedstat` only for those threads, plus one clock read. It does not
//! read the thousand threads of a pool at rest. It does no work per thread at rest either,
//! because what they add up to is kept.
//!
//! When the sums disagree, or a thread left:
//! - Every thread is read, as without the clock.
//! - The exited threads' part is measured again when the clock held still meanwhile.
//!   Otherwise the last one measured is kept, while no thread left.
//! - While the sums keep failing (threads starting or ending in numbers), such a full read
//!   comes at most once per [`FULL_READ_EVERY`]. The samples between read only the threads
//!   that ran lately and the new ones, and say so.
//!
//! Either way, [`ProcessClock::moved`] tells the caller what changed.
//!
//! Must not: take an unchecked sum for a proof.
//! - A sum that cannot be checked exactly is never a short read. That is the case when the
//!   clock moved while we read, or when a thread's time was unreadable.
//! - What a sample between full reads keeps of a thread at rest is its last reading. The
//!   next full read corrects it.

use super::cputime::ThreadFiles;
use crate::IdMap;
use std::time::{Duration, Instant};

/// A thread whose time has not changed for this long is left out of the threads read at
/// each sample. It is still seen running, because the sums tell. The kernel adds a running
/// thread's time up at each scheduler tick (every 1 to 10 ms). This is several ticks, so
/// that a busy thread sampled faster than the ticks stays among those read.
const QUIET_FOR: Duration = Duration::from_millis(50);

/// Below this many threads every thread's time is read without the clock. A reading of it
/// costs about one `schedstat` read, so with one or two threads it saves nothing (and a
/// sample of a single busy thread, the most common target, paid them for nothing).
pub(crate) const CLOCK_FROM_THREADS: usize = 3;

/// How a short read went.
enum Short {
    /// The clock proves that the threads read are the only ones that ran.
    Proven,
    /// Every thread that ran lately was read (at the time given), but the clock's sum
    /// disagrees, so another may have run.
    Unproven(Instant),
    /// It could not read them all, or the listing lost a thread, or the exited part is
    /// unknown.
    Failed,
}

/// While the sums fail, at most one read of every thread in this long. The sums fail while
/// threads start or end in numbers:
/// - a pool of a thousand starting takes a hundred milliseconds;
/// - every thread it starts breaks the sum of the sample it runs in;
/// - each thread that ends loses the exited part.
///
/// The samples between read the threads that ran lately and the new ones, and keep the
/// other threads' last readings unproven. A thread at rest that ran meanwhile is seen at
/// the next full read, this much later at most. Its CPU time is not lost, because it is
/// charged then, as to a thread sampled at that rate. This is instead of every sample
/// reading a thousand threads (as much work as the rest of such a sample).
const FULL_READ_EVERY: Duration = Duration::from_millis(50);

/// The target's process CPU clock, and since when each thread has had the CPU time of its
/// last reading (the times themselves are in the caller's map, see [`ProcessClock::times`]).
/// A short read costs in the threads that ran lately only, not in the threads there are.
/// What a thousand threads at rest add up to is kept, not summed again.
pub(crate) struct ProcessClock {
    pid: i32,
    clock: libc::clockid_t,
    /// What the process's exited threads used (the clock less its threads' sum), when
    /// known exactly.
    exited_ns: Option<u64>,
    /// The threads of the last reading, ascending, and since when each has had its time.
    tids: Vec<i32>,
    since: Vec<Instant>,
    /// Where in `tids` the threads whose time moved within [`QUIET_FOR`] are (those a
    /// short read reads), and the sum of the others' times.
    lately: Vec<usize>,
    quiet_ns: u64,
    /// A reading's (position in `tids`, time) pairs (room kept from one to the next).
    read: Vec<(usize, u64)>,
    /// The threads whose time the last reading changed. None: any may have (a full read).
    moved: Option<Vec<i32>>,
    /// When the last full read was.
    last_full: Option<Instant>,
    /// Samples that read every thread, those that read only the threads that ran lately,
    /// and those that read only these without the clock's proof (see [`FULL_READ_EVERY`]).
    pub(crate) full_reads: u64,
    pub(crate) short_reads: u64,
    pub(crate) partial_reads: u64,
}

impl ProcessClock {
    /// The clock of process `pid`. One that cannot be read makes every sample read every
    /// thread (see [`ProcessClock::works`]).
    pub(crate) fn new(pid: i32) -> ProcessClock {
        ProcessClock {
            pid,
            clock: process_clock_id(pid),
            exited_ns: None,
            tids: Vec::new(),
            since: Vec::new(),
            lately: Vec::new(),
            quiet_ns: 0,
            read: Vec::new(),
            moved: None,
            last_full: None,
            full_reads: 0,
            short_reads: 0,
            partial_reads: 0,
        }
    }

    /// Whether the clock can be read (else no sample is a short one).
    pub(crate) fn works(&mut self) -> bool {
        self.now().is_some()
    }

    /// The process's CPU time so far, nanoseconds.
    fn now(&mut self) -> Option<u64> {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: clock_gettime writes into the timespec we own; an invalid clock id is an
        // error return, nothing else.
        let rc = unsafe { libc::clock_gettime(self.clock, &mut ts) };
        (rc == 0).then(|| ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64)
    }

    /// Sets `times` to every thread of `tids` (ascending) with its CPU time in nanoseconds (a
    /// thread that could not be read, gone meanwhile, is missing).
    ///
    /// When the process clock shows that no other thread ran, it reads `schedstat` through
    /// `files` only for the threads that ran lately. Then only their entries change.
    ///
    /// `times` must be the map this clock filled last (it holds the other threads' times).
    pub(crate) fn times(
        &mut self,
        tids: &[i32],
        files: &mut ThreadFiles,
        times: &mut IdMap<i32, u64>,
    ) {
        if tids.len() >= CLOCK_FROM_THREADS {
            let short = self.short_read(tids, files, times);
            if let Short::Proven = short {
                self.short_reads += 1;
                return;
            }
            if self
                .last_full
                .is_some_and(|t| t.elapsed() < FULL_READ_EVERY)
            {
                match short {
                    // What was read holds (only unproven), so it is taken as it is.
                    Short::Unproven(now) => self.take_read(tids, times, now),
                    _ => self.partial_read(tids, files, times),
                }
                self.partial_reads += 1;
                return;
            }
        }
        self.full_reads += 1;
        self.moved = None;
        self.last_full = Some(Instant::now());
        // No thread of the last reading gone, so none exited since.
        let none_left = times.len() == self.tids.len() && includes(tids, &self.tids);
        // With a thread or two the clock is not used, but the exited part is measured
        // while unknown (two clock readings), so that it is known when a pool starts.
        let few = tids.len() < CLOCK_FROM_THREADS;
        let measure = !few || self.exited_ns.is_none() || !none_left;
        let before = if measure { self.now() } else { None };
        self.read_all(tids, files, times);
        let after = if measure { self.now() } else { None };
        let all_read = times.len() == tids.len();
        // Exact only if nothing changed meanwhile (the clock did not move) and every thread
        // was read.
        let sum: u64 = self.read.iter().map(|&(_, ns)| ns).sum();
        let measured = match (before, after) {
            (Some(b), Some(a)) if a == b && all_read => b.checked_sub(sum),
            _ => None,
        };
        // Else, while no thread exited, the exited part is still the one measured last. A busy
        // thread, or a pool starting, moves the clock during most full reads, so each would
        // leave the next sample a full read too. A thread that started and ended unlisted
        // meanwhile adds to it unseen. The sums then come out short of the clock, never over
        // it, and fail (read every thread) until a read measures it again.
        self.exited_ns = measured.or(self.exited_ns.filter(|_| none_left && all_read));
    }

    /// Between full reads (see [`FULL_READ_EVERY`]): takes `tids` as the threads, reads
    /// the new ones and those that ran lately, and keeps the others' last readings
    /// unproven. A thread that left is forgotten (and with it what the exited part was).
    fn partial_read(&mut self, tids: &[i32], files: &mut ThreadFiles, times: &mut IdMap<i32, u64>) {
        let now = Instant::now();
        if tids != self.tids.as_slice() {
            self.take_listing(tids, now, true, times);
        }
        self.settle(now, times);
        self.read.clear();
        let mut lost = Vec::new();
        for &i in &self.lately {
            match files.read_sched(self.pid, tids[i]) {
                Some(ns) => self.read.push((i, ns)),
                None => {
                    // Gone meanwhile (the next listing will say), so out of the map.
                    if times.remove(&tids[i]).is_some() {
                        lost.push(tids[i]);
                    }
                }
            }
        }
        self.take_read(tids, times, now);
        if let Some(m) = self.moved.as_mut() {
            m.extend(lost);
        }
    }

    /// The threads whose entry the last [`ProcessClock::times`] changed in the map (a new
    /// time, or none because it could not be read), when it read only the threads that ran
    /// lately. None after a read of every thread.
    pub(crate) fn moved(&self) -> Option<&[i32]> {
        self.moved.as_deref()
    }

    /// Reads every thread of `tids` into `times`, and takes the readings as each one's
    /// last, noting which ran lately and what the others add up to.
    fn read_all(&mut self, tids: &[i32], files: &mut ThreadFiles, times: &mut IdMap<i32, u64>) {
        let now = Instant::now();
        let mut since = Vec::with_capacity(tids.len());
        self.read.clear();
        for (i, &t) in tids.iter().enumerate() {
            let Some(ns) = files.read_sched(self.pid, t) else {
                since.push(now);
                continue;
            };
            self.read.push((i, ns));
            // Unchanged since the last reading: since when it had that time.
            let was = self
                .tids
                .binary_search(&t)
                .ok()
                .filter(|_| times.get(&t) == Some(&ns))
                .map(|j| self.since[j]);
            since.push(was.unwrap_or(now));
        }
        times.clear();
        times.extend(self.read.iter().map(|&(i, ns)| (tids[i], ns)));
        self.tids.clear();
        self.tids.extend_from_slice(tids);
        self.since = since;
        self.lately.clear();
        self.quiet_ns = 0;
        for &(i, ns) in &self.read {
            if now.duration_since(self.since[i]) >= QUIET_FOR {
                self.quiet_ns += ns;
            } else {
                self.lately.push(i);
            }
        }
    }

    /// The short read. None when it cannot tell exactly that only the threads read ran.
    fn short_read(
        &mut self,
        tids: &[i32],
        files: &mut ThreadFiles,
        times: &mut IdMap<i32, u64>,
    ) -> Short {
        let Some(exited) = self.exited_ns else {
            return Short::Failed;
        };
        if times.len() != self.tids.len() {
            return Short::Failed;
        }
        let now = Instant::now();
        if tids != self.tids.as_slice() && self.add_new(tids, now).is_none() {
            return Short::Failed;
        }
        self.settle(now, times);
        self.read.clear();
        for &i in &self.lately {
            match files.read_sched(self.pid, tids[i]) {
                Some(ns) => self.read.push((i, ns)),
                None => return Short::Failed,
            }
        }
        // One reading of the clock, after the threads' (each costs a walk of the process's
        // threads in the kernel). Every term only grows. So when the clock equals the sum of
        // what was read before it, each term still had the value read (any later CPU
        // would make the clock larger), and the threads not read had not run.
        let read_sum: u64 = self.read.iter().map(|&(_, ns)| ns).sum();
        let proven = self.now().is_some_and(|clock| {
            exited
                .checked_add(self.quiet_ns)
                .and_then(|n| n.checked_add(read_sum))
                == Some(clock)
        });
        if !proven {
            return Short::Unproven(now);
        }
        self.take_read(tids, times, now);
        Short::Proven
    }

    /// Puts the readings in `read` into `times`, noting which moved.
    fn take_read(&mut self, tids: &[i32], times: &mut IdMap<i32, u64>, now: Instant) {
        let mut moved = self.moved.take().unwrap_or_default();
        moved.clear();
        for &(i, ns) in &self.read {
            let e = times.entry(tids[i]).or_insert(ns);
            if *e != ns {
                *e = ns;
                self.since[i] = now;
                moved.push(tids[i]);
            }
        }
        self.moved = Some(moved);
    }

    /// Threads quiet for long enough join the sum of the quiet ones (a full read counts it
    /// again, should this read fail).
    fn settle(&mut self, now: Instant, times: &IdMap<i32, u64>) {
        let (since, ids) = (&self.since, &self.tids);
        let mut quiet_ns = self.quiet_ns;
        self.lately.retain(|&i| {
            if now.duration_since(since[i]) < QUIET_FOR {
                return true;
            }
            quiet_ns += times.get(&ids[i]).copied().unwrap_or(0);
            false
        });
        self.quiet_ns = quiet_ns;
    }

    /// Takes `tids` (ascending) as the threads, when they are the last reading's and more.
    /// The new ones join those read at each sample (a thread pool starting up is read in the
    /// threads it adds, not in all it has). None when a thread of the last reading is not
    /// among them. It exited, so what it used went into the exited part, unknown until a
    /// full read.
    fn add_new(&mut self, tids: &[i32], now: Instant) -> Option<()> {
        self.take_listing(tids, now, false, &mut IdMap::default())
    }

    /// Takes `tids` (ascending) as the threads:
    /// - those of the last reading keep their places in `lately` and their `since`;
    /// - new ones join `lately` (since `now`);
    /// - a thread of the last reading not among them exited. With `gone_ok` it is forgotten
    ///   (its entry in `times`, its part of the quiet sum, and the exited part). Without, the
    ///   listing is refused (None) and nothing changes.
    fn take_listing(
        &mut self,
        tids: &[i32],
        now: Instant,
        gone_ok: bool,
        times: &mut IdMap<i32, u64>,
    ) -> Option<()> {
        // Both ascending, so one merge. `at[j]`: where the last reading's thread `j` is now
        // (None: gone).
        let mut at: Vec<Option<usize>> = Vec::with_capacity(self.tids.len());
        let mut since = Vec::with_capacity(tids.len());
        let mut new = Vec::new();
        let mut old = self.tids.iter().zip(&self.since).peekable();
        for (j, &t) in tids.iter().enumerate() {
            while old.next_if(|&(&o, _)| o < t).is_some() {
                at.push(None);
            }
            match old.next_if(|&(&o, _)| o == t) {
                Some((_, &s)) => {
                    at.push(Some(j));
                    since.push(s);
                }
                None => {
                    new.push(j);
                    since.push(now);
                }
            }
        }
        at.extend(old.map(|_| None));
        if !gone_ok && at.contains(&None) {
            return None;
        }
        let mut lately = vec![false; self.tids.len()];
        for &i in &self.lately {
            lately[i] = true;
        }
        for (j, &t) in self.tids.iter().enumerate() {
            if at[j].is_none() {
                self.exited_ns = None;
                if let Some(ns) = times.remove(&t) {
                    if !lately[j] {
                        self.quiet_ns = self.quiet_ns.saturating_sub(ns);
                    }
                }
            }
        }
        self.lately = self.lately.iter().filter_map(|&i| at[i]).collect();
        self.lately.extend(new);
        self.tids.clear();
        self.tids.extend_from_slice(tids);
        self.since = since;
        Some(())
    }
}

/// Whether ascending `all` holds every element of ascending `some`.
fn includes(all: &[i32], some: &[i32]) -> bool {
    let mut rest = all.iter();
    some.iter().all(|t| rest.any(|a| a == t))
}

/// The clock id of process `pid`'s CPU time. It is what `clock_getcpuclockid` returns: the
/// pid, complemented, above the clock kind. Kind 2 is the scheduler's precise sum.
fn process_clock_id(pid: i32) -> libc::clockid_t {
    ((!pid) << 3) | 2
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Command, Stdio};
    use std::time::Duration;

    /// New threads join the last reading's (those read at each sample, since now), and the
    /// others keep their places in it. A listing without one of the last reading's threads
    /// is not taken (it exited, so a full read is due).
    #[test]
    fn new_threads_join_the_last_reading() {
        let t0 = Instant::now();
        let later = t0 + Duration::from_millis(5);
        let mut c = ProcessClock::new(0);
        c.tids = vec![10, 30, 50];
        c.since = vec![t0, t0, t0];
        c.lately = vec![1];
        assert_eq!(c.add_new(&[10, 20, 30, 50, 60], later), Some(()));
        assert_eq!(c.tids, vec![10, 20, 30, 50, 60]);
        assert_eq!(c.since, vec![t0, later, t0, t0, later]);
        assert_eq!(c.lately, vec![2, 1, 4], "30 moved to 2; 20 and 60 are new");
        let kept = (c.tids.clone(), c.since.clone(), c.lately.clone());
        // Without 50, without 60 (each with a new thread), and without 60 alone.
        for gone in [
            &[10, 20, 30, 60, 70][..],
            &[5, 10, 20, 30, 50],
            &[10, 20, 30, 50],
        ] {
            assert_eq!(c.add_new(gone, later), None, "{gone:?}");
        }
        assert_eq!((c.tids.clone(), c.since.clone(), c.lately.clone()), kept);
    }

    /// Between full reads:
    /// - a thread that left is forgotten (its part of the quiet sum too, and the exited part
    ///   with it);
    /// - a new one is read with those that ran lately;
    /// - one that cannot be read is left out of the times.
    #[test]
    fn a_partial_read_takes_the_new_listing() {
        let me = nix::unistd::gettid().as_raw();
        let (gone, new) = (me + 1_000_000, me + 2_000_000);
        // Some CPU time of our own, counted at the switch a sleep makes.
        let spin = Instant::now();
        while spin.elapsed() < Duration::from_millis(2) {}
        std::thread::sleep(Duration::from_millis(1));
        let t0 = Instant::now();
        let mut c = ProcessClock::new(std::process::id() as i32);
        c.tids = vec![me, gone];
        c.since = vec![t0, t0 - Duration::from_secs(1)];
        c.lately = vec![0];
        c.quiet_ns = 500;
        c.exited_ns = Some(7);
        let mut times: IdMap<i32, u64> = [(me, 1), (gone, 500)].into_iter().collect();
        let mut files = ThreadFiles::new();
        c.partial_read(&[me, new], &mut files, &mut times);
        assert_eq!(c.tids, vec![me, new]);
        assert_eq!(c.quiet_ns, 0, "the thread that left was a quiet one");
        assert_eq!(c.exited_ns, None);
        assert_eq!(c.lately, vec![0, 1]);
        assert!(times[&me] > 1, "our own thread has run: {times:?}");
        assert!(
            !times.contains_key(&gone) && !times.contains_key(&new),
            "{times:?}"
        );
        assert_eq!(c.moved(), Some(&[me][..]));
        // A thread that ran lately and cannot be read any more leaves the map, which counts as
        // moved.
        let mut again: IdMap<i32, u64> = [(me, times[&me]), (gone, 9)].into_iter().collect();
        c.tids = vec![me, gone];
        c.since = vec![t0, Instant::now()];
        c.lately = vec![0, 1];
        c.partial_read(&[me, gone], &mut files, &mut again);
        assert!(!again.contains_key(&gone));
        assert!(
            c.moved().is_some_and(|m| m.contains(&gone)),
            "{:?}",
            c.moved()
        );
    }

    /// A child with a busy thread and parked ones. The process clock is the sum of its
    /// threads' schedstat times (no thread exited). Once the parked threads have been quiet,
    /// samples read only the busy thread (and the main one while it ran). Still, a parked
    /// thread that wakes to compute is seen at the next sample.
    #[test]
    fn the_sums_tell_which_threads_ran() {
        let code = "import threading, sys, time\n\
                    go = threading.Event()\n\
                    def parked():\n    go.wait()\n    x = 0\n    for i in range(3000000):\n        x += i\n    time.sleep(3600)\n\
                    def busy():\n    x = 0\n    while True:\n        x += 1\n\
                    for _ in range(20):\n    threading.Thread(target=parked, daemon=True).start()\n\
                    threading.Thread(target=busy, daemon=True).start()\n\
                    print('ready', flush=True)\n\
                    sys.stdin.readline()\n\
                    go.set()\n\
                    time.sleep(3600)\n";
        let mut child = Command::new("python3")
            .args(["-c", code])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3");
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.take().unwrap()),
            &mut line,
        )
        .unwrap();
        let pid = child.id() as i32;
        std::thread::sleep(Duration::from_millis(100));
        let tids = crate::proc::threads(pid).unwrap();
        assert_eq!(tids.len(), 22);
        let mut clock = ProcessClock::new(pid);
        assert!(clock.works(), "the process clock of a child");
        let mut files = ThreadFiles::new();
        let mut short = 0;
        let mut t = IdMap::default();
        for _ in 0..40 {
            clock.times(&tids, &mut files, &mut t);
            assert_eq!(t.len(), tids.len());
            std::thread::sleep(Duration::from_millis(5));
        }
        short += clock.short_reads;
        assert!(
            short >= 20,
            "{short} short reads of 40 ({} full)",
            clock.full_reads
        );
        // The parked threads compute for a while, and each is seen at the next samples.
        let quiet: Vec<(i32, u64)> = {
            clock.times(&tids, &mut files, &mut t);
            tids.iter().map(|&tid| (tid, t[&tid])).collect()
        };
        use std::io::Write;
        child.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
        std::thread::sleep(Duration::from_millis(1500));
        let mut now = t;
        for _ in 0..5 {
            clock.times(&tids, &mut files, &mut now);
            std::thread::sleep(Duration::from_millis(5));
        }
        let woke = quiet.iter().filter(|(t, was)| now[t] > *was).count();
        let _ = child.kill();
        let _ = child.wait();
        // All 20 parked threads, the main one and the busy one ran.
        assert_eq!(woke, 22, "{quiet:?} {now:?}");
    }
}
