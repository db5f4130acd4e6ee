//! Which threads ran since the last sample, without reading every thread's CPU time.
//!
//! Owns: [`ProcessClock`] — the target's process CPU clock (`clock_gettime` on the clock
//! id of another process, which Linux lets anyone read) against the per-thread `schedstat`
//! times. The kernel keeps one total per thread (`sum_exec_runtime`); `schedstat` shows it,
//! and the process clock of another process is the sum of those of its threads plus what
//! its exited threads used. So when the process total moved by exactly what the threads
//! that ran lately moved by, no other thread ran: a sample reads `schedstat` only for those
//! (plus one clock read), not for the thousand threads of a pool at rest, and does no work
//! per thread at rest (what they add up to is kept). When the sums
//! disagree, or the thread set changed, every thread is read, as without the clock, and the
//! exited threads' part is measured again.
//! Must not: guess. A sum that cannot be checked exactly (the clock moved while we read, a
//! thread's time unreadable) means a read of every thread.

use super::cputime::ThreadFiles;
use crate::IdMap as HashMap;
use std::time::{Duration, Instant};

/// A thread whose time has not changed for this long is left out of the threads read at
/// each sample (it is still seen running: the sums tell). The kernel adds a running
/// thread's time up at each scheduler tick (every 1 to 10 ms): this is several ticks, so
/// that a busy thread sampled faster than the ticks stays among those read.
const QUIET_FOR: Duration = Duration::from_millis(50);

/// Below this many threads every thread's time is read without the clock: a reading of it
/// costs about one `schedstat` read, so with one or two threads it saves nothing (and a
/// sample of a single busy thread, the most common target, paid them for nothing).
const CLOCK_FROM_THREADS: usize = 3;

/// The target's process CPU clock, and since when each thread has had the CPU time of its
/// last reading (the times themselves are in the caller's map, see [`ProcessClock::times`]).
/// A short read costs in the threads that ran lately only, not in the threads there are:
/// what a thousand threads at rest add up to is kept, not summed again.
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
    /// Samples that read every thread, and those that read only the threads that ran lately.
    pub(crate) full_reads: u64,
    pub(crate) short_reads: u64,
}

impl ProcessClock {
    /// The clock of process `pid` (one that cannot be read makes every sample read every
    /// thread: see [`ProcessClock::works`]).
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
            full_reads: 0,
            short_reads: 0,
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

    /// Sets `times` to every thread of `tids` (ascending) with its CPU time in nanoseconds
    /// (a thread that could not be read, gone meanwhile, is missing), reading `schedstat`
    /// through `files` only for the threads that ran lately when the process clock shows
    /// that no other thread ran: then only their entries change. `times` must be the map
    /// this clock filled last (it holds the other threads' times).
    pub(crate) fn times(
        &mut self,
        tids: &[i32],
        files: &mut ThreadFiles,
        times: &mut HashMap<i32, u64>,
    ) {
        if tids.len() < CLOCK_FROM_THREADS {
            // Threads that exit meanwhile go unmeasured: the next read with the clock
            // measures the exited part again.
            self.full_reads += 1;
            self.exited_ns = None;
            self.read_all(tids, files, times);
            return;
        }
        if self.short_read(tids, files, times).is_some() {
            self.short_reads += 1;
            return;
        }
        self.full_reads += 1;
        let before = self.now();
        self.read_all(tids, files, times);
        let after = self.now();
        // Exact only if nothing changed meanwhile (the clock did not move) and every thread
        // was read.
        let sum: u64 = self.read.iter().map(|&(_, ns)| ns).sum();
        self.exited_ns = match (before, after) {
            (Some(b), Some(a)) if a == b && times.len() == tids.len() => b.checked_sub(sum),
            _ => None,
        };
    }

    /// Reads every thread of `tids` into `times`, and takes the readings as each one's
    /// last: which ran lately, and what the others add up to.
    fn read_all(&mut self, tids: &[i32], files: &mut ThreadFiles, times: &mut HashMap<i32, u64>) {
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

    /// The short read: None when it cannot tell exactly that only the threads read ran.
    fn short_read(
        &mut self,
        tids: &[i32],
        files: &mut ThreadFiles,
        times: &mut HashMap<i32, u64>,
    ) -> Option<()> {
        let exited = self.exited_ns?;
        if times.len() != self.tids.len() {
            return None;
        }
        let now = Instant::now();
        if tids != self.tids.as_slice() {
            self.add_new(tids, now)?;
        }
        // Threads quiet for long enough join the sum (a full read counts it again, should
        // this read fail).
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
        self.read.clear();
        for &i in &self.lately {
            self.read.push((i, files.read_sched(self.pid, tids[i])?));
        }
        // One reading of the clock, after the threads' (each costs a walk of the process's
        // threads in the kernel). Every term only grows: when the clock equals the sum of
        // what was read before it, each term still had the value read (any later CPU
        // would make the clock larger), and the threads not read had not run.
        let clock = self.now()?;
        let read_sum: u64 = self.read.iter().map(|&(_, ns)| ns).sum();
        if exited.checked_add(self.quiet_ns)?.checked_add(read_sum)? != clock {
            return None;
        }
        for &(i, ns) in &self.read {
            let e = times.entry(tids[i]).or_insert(ns);
            if *e != ns {
                *e = ns;
                self.since[i] = now;
            }
        }
        Some(())
    }

    /// Takes `tids` (ascending) as the threads, when they are the last reading's and
    /// more: the new ones join those read at each sample (a thread pool starting up is
    /// read in the threads it adds, not in all it has). None when a thread of the last
    /// reading is not among them (it exited: what it used went into the exited part,
    /// unknown until a full read).
    fn add_new(&mut self, tids: &[i32], now: Instant) -> Option<()> {
        if tids.len() <= self.tids.len() {
            return None;
        }
        // Where each old thread goes among the new (both ascending: one merge).
        let mut moved = Vec::with_capacity(self.tids.len());
        let mut since = Vec::with_capacity(tids.len());
        let mut old = self.tids.iter().zip(&self.since).peekable();
        let mut new = Vec::new();
        for (j, &t) in tids.iter().enumerate() {
            match old.peek() {
                Some(&(&o, &s)) if o == t => {
                    moved.push(j);
                    since.push(s);
                    old.next();
                }
                Some(&(&o, _)) if o < t => return None,
                _ => {
                    new.push(j);
                    since.push(now);
                }
            }
        }
        if old.next().is_some() {
            return None;
        }
        for i in &mut self.lately {
            *i = moved[*i];
        }
        self.lately.extend(new);
        self.tids.clear();
        self.tids.extend_from_slice(tids);
        self.since = since;
        Some(())
    }
}

/// The clock id of process `pid`'s CPU time (what `clock_getcpuclockid` returns: the pid,
/// complemented, above the clock kind; kind 2 is the scheduler's precise sum).
fn process_clock_id(pid: i32) -> libc::clockid_t {
    ((!pid) << 3) | 2
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Command, Stdio};
    use std::time::Duration;

    /// New threads join the last reading's (those read at each sample, since now), the
    /// others keep their places in it; a listing without one of the last reading's threads
    /// is not taken (it exited: a full read is due).
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

    /// A child with a busy thread and parked ones: the process clock is the sum of its
    /// threads' schedstat times (no thread exited), and once the parked threads have been
    /// quiet, samples read only the busy thread (and the main one while it ran) — while a
    /// parked thread that wakes to compute is seen at the next sample.
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
        let mut t = HashMap::default();
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
        // The parked threads compute for a while: seen, each, at the next samples.
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
