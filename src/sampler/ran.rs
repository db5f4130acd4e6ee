//! Which threads ran since the last sample, without reading every thread's CPU time.
//!
//! Owns: [`ProcessClock`] — the target's process CPU clock (`clock_gettime` on the clock
//! id of another process, which Linux lets anyone read) against the per-thread `schedstat`
//! times. The kernel keeps one total per thread (`sum_exec_runtime`); `schedstat` shows it,
//! and the process clock of another process is the sum of those of its threads plus what
//! its exited threads used. So when the process total moved by exactly what the threads
//! that ran lately moved by, no other thread ran: a sample reads `schedstat` only for those
//! (plus two clock reads), not for the thousand threads of a pool at rest. When the sums
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

/// Below this many threads every thread's time is read without the clock: its two reads
/// cost about one `schedstat` read, so with one or two threads they save nothing (and a
/// sample of a single busy thread, the most common target, paid them for nothing).
const CLOCK_FROM_THREADS: usize = 3;

/// The target's process CPU clock and what each thread had used at its last reading.
pub(crate) struct ProcessClock {
    pid: i32,
    clock: libc::clockid_t,
    /// What the process's exited threads used (the clock less its threads' sum), when
    /// known exactly.
    exited_ns: Option<u64>,
    /// Every thread's CPU time at its last reading, and since when it has had that value.
    last: HashMap<i32, (u64, Instant)>,
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
            last: HashMap::default(),
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

    /// Every thread of `tids` with its CPU time in nanoseconds (a thread that could not be
    /// read, gone meanwhile, is missing), reading `schedstat` through `files` only for the
    /// threads that ran lately when the process clock shows that no other thread ran.
    pub(crate) fn times(&mut self, tids: &[i32], files: &mut ThreadFiles) -> HashMap<i32, u64> {
        if tids.len() < CLOCK_FROM_THREADS {
            // Threads that exit meanwhile go unmeasured: the next read with the clock
            // measures the exited part again.
            self.full_reads += 1;
            self.exited_ns = None;
            let out = read_all(self.pid, tids, files);
            self.remember(&out);
            return out;
        }
        if let Some(out) = self.short_read(tids, files) {
            self.short_reads += 1;
            return out;
        }
        self.full_reads += 1;
        let before = self.now();
        let out = read_all(self.pid, tids, files);
        let after = self.now();
        // Exact only if nothing changed meanwhile (the clock did not move) and every thread
        // was read.
        let sum: u64 = out.values().sum();
        self.exited_ns = match (before, after) {
            (Some(b), Some(a)) if a == b && out.len() == tids.len() => b.checked_sub(sum),
            _ => None,
        };
        self.remember(&out);
        out
    }

    /// Takes a reading of every thread as each one's last.
    fn remember(&mut self, out: &HashMap<i32, u64>) {
        let now = Instant::now();
        self.last.retain(|t, _| out.contains_key(t));
        for (&t, &ns) in out {
            let e = self.last.entry(t).or_insert((ns, now));
            if e.0 != ns {
                *e = (ns, now);
            }
        }
    }

    /// The short read: None when it cannot tell exactly that only the threads read ran.
    fn short_read(&mut self, tids: &[i32], files: &mut ThreadFiles) -> Option<HashMap<i32, u64>> {
        let exited = self.exited_ns?;
        if tids.len() != self.last.len() || tids.iter().any(|t| !self.last.contains_key(t)) {
            return None;
        }
        let now = Instant::now();
        let quiet = |since: Instant| now.duration_since(since) >= QUIET_FOR;
        let lately: Vec<i32> = tids
            .iter()
            .copied()
            .filter(|t| !quiet(self.last[t].1))
            .collect();
        let before = self.now()?;
        let mut read = Vec::with_capacity(lately.len());
        for &t in &lately {
            read.push((t, files.read_sched(self.pid, t)?));
        }
        let after = self.now()?;
        if before != after {
            return None;
        }
        let quiet_sum: u64 = self
            .last
            .values()
            .filter(|&&(_, since)| quiet(since))
            .map(|&(ns, _)| ns)
            .sum();
        let read_sum: u64 = read.iter().map(|&(_, ns)| ns).sum();
        if exited.checked_add(quiet_sum)?.checked_add(read_sum)? != before {
            return None;
        }
        for &(t, ns) in &read {
            let e = self.last.get_mut(&t)?;
            if e.0 != ns {
                *e = (ns, now);
            }
        }
        Some(self.last.iter().map(|(&t, &(ns, _))| (t, ns)).collect())
    }
}

/// Every thread of `tids` with its CPU time (a thread that could not be read is left out).
fn read_all(pid: i32, tids: &[i32], files: &mut ThreadFiles) -> HashMap<i32, u64> {
    tids.iter()
        .filter_map(|&t| Some((t, files.read_sched(pid, t)?)))
        .collect()
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
        for _ in 0..40 {
            let t = clock.times(&tids, &mut files);
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
            let t = clock.times(&tids, &mut files);
            tids.iter().map(|&tid| (tid, t[&tid])).collect()
        };
        use std::io::Write;
        child.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
        std::thread::sleep(Duration::from_millis(1500));
        let mut now = HashMap::default();
        for _ in 0..5 {
            now = clock.times(&tids, &mut files);
            std::thread::sleep(Duration::from_millis(5));
        }
        let woke = quiet.iter().filter(|(t, was)| now[t] > *was).count();
        let _ = child.kill();
        let _ = child.wait();
        // All 20 parked threads, the main one and the busy one ran.
        assert_eq!(woke, 22, "{quiet:?} {now:?}");
    }
}
