//! Per-thread CPU time of another process, from /proc, and of our own threads.
//!
//! Owns:
//! - reading a thread's precise CPU time (`schedstat`, nanoseconds) and its user/system
//!   tick counts (`stat`);
//! - turning successive readings into per-interval deltas;
//! - [`own_thread_cpu`] (what a piece of our own work costs).
//!
//! Kernel time is measured here, never guessed. `stime` ticks are what the kernel charged
//! to the thread while it ran in kernel mode.

use crate::IdMap;

/// The CPU time the calling thread has used (`CLOCK_THREAD_CPUTIME_ID`). That is what our
/// own work costs, where wall time would count the while another program had the CPU.
pub(crate) fn own_thread_cpu() -> std::time::Duration {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec through a valid pointer.
    let r = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    if r != 0 {
        return std::time::Duration::ZERO;
    }
    std::time::Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

/// One reading of one thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct CpuReading {
    /// Total CPU time in nanoseconds (`schedstat` field 1), precise.
    pub(crate) run_ns: u64,
    /// User and system time in clock ticks (`stat` fields 14 and 15).
    pub(crate) utime: u64,
    pub(crate) stime: u64,
    /// Scheduler state ('R', 'S', 'D', ...).
    pub(crate) state: char,
}

/// Time a thread spent since its previous reading, in seconds.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub(crate) struct CpuDelta {
    pub(crate) user_s: f64,
    pub(crate) system_s: f64,
}

/// Seconds per clock tick (`sysconf(_SC_CLK_TCK)`, 100 on Linux).
fn tick_seconds() -> f64 {
    // SAFETY: sysconf has no preconditions; it returns -1 on error, handled below.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if hz > 0 {
        1.0 / hz as f64
    } else {
        0.01
    }
}

/// Parses the fields we need out of `/proc/PID/task/TID/stat`.
fn parse_stat(stat: &str) -> Option<(char, u64, u64)> {
    let mut it = crate::proc::stat_fields(stat)?;
    let state = it.next()?.chars().next()?;
    // After the state (field 3) come fields 4..; utime is field 14, stime field 15.
    let mut it = it.skip(10);
    let utime = it.next()?.parse().ok()?;
    let stime = it.next()?.parse().ok()?;
    Some((state, utime, stime))
}

/// Reads threads' `stat` and `schedstat` through files kept open between samples. A read
/// at offset 0 of an open /proc file gives fresh values, and saves the open and close (the
/// costly part) on every sample.
#[derive(Debug, Default)]
pub struct ThreadFiles {
    open: IdMap<i32, (std::fs::File, Option<std::fs::File>)>,
}

impl ThreadFiles {
    pub fn new() -> ThreadFiles {
        ThreadFiles::default()
    }

    fn files(&mut self, pid: i32, tid: i32) -> Option<&(std::fs::File, Option<std::fs::File>)> {
        use std::collections::hash_map::Entry;
        match self.open.entry(tid) {
            Entry::Occupied(e) => Some(e.into_mut()),
            Entry::Vacant(e) => {
                let stat = std::fs::File::open(format!("/proc/{pid}/task/{tid}/stat")).ok()?;
                let sched = std::fs::File::open(format!("/proc/{pid}/task/{tid}/schedstat")).ok();
                Some(e.insert((stat, sched)))
            }
        }
    }

    fn read_at0(f: &std::fs::File, buf: &mut [u8]) -> Option<usize> {
        use std::os::unix::fs::FileExt;
        f.read_at(buf, 0).ok().filter(|&n| n > 0)
    }

    /// One thread's reading; None when it is gone (its files are then closed).
    #[cfg(test)]
    fn read(&mut self, pid: i32, tid: i32) -> Option<CpuReading> {
        let run_ns = self.read_sched(pid, tid)?;
        let (state, utime, stime) = self.read_stat(pid, tid)?;
        Some(CpuReading {
            run_ns,
            utime,
            stime,
            state,
        })
    }

    /// A thread's total CPU time in nanoseconds from `schedstat` (the cheap file, about a
    /// quarter of the cost of `stat` here). 0 when the kernel has no schedstat. None when
    /// the thread is gone (its files are then closed).
    pub fn read_sched(&mut self, pid: i32, tid: i32) -> Option<u64> {
        let mut buf = [0u8; 128];
        let (stat, sched) = self.files(pid, tid)?;
        let Some(sched) = sched else {
            // No schedstat, so the stat file tells whether the thread is still there.
            let alive = Self::read_at0(stat, &mut [0u8; 1024]).is_some();
            if !alive {
                self.open.remove(&tid);
            }
            return alive.then_some(0);
        };
        let Some(n) = Self::read_at0(sched, &mut buf) else {
            self.open.remove(&tid);
            return None;
        };
        std::str::from_utf8(&buf[..n])
            .ok()?
            .split_ascii_whitespace()
            .next()?
            .parse()
            .ok()
    }

    /// A thread's scheduler state and user/system ticks from `stat`; None when it is gone.
    pub(crate) fn read_stat(&mut self, pid: i32, tid: i32) -> Option<(char, u64, u64)> {
        let mut buf = [0u8; 1024];
        let (stat, _) = self.files(pid, tid)?;
        let Some(n) = Self::read_at0(stat, &mut buf) else {
            self.open.remove(&tid);
            return None;
        };
        parse_stat(std::str::from_utf8(&buf[..n]).ok()?)
    }

    /// Just the scheduler state ('R', 'S', ...); None when the thread is gone.
    #[cfg(test)]
    fn state(&mut self, pid: i32, tid: i32) -> Option<char> {
        self.read_stat(pid, tid).map(|(state, _, _)| state)
    }

    /// Closes the files of threads not in `alive` (ascending).
    pub(crate) fn retain(&mut self, alive: &[i32]) {
        self.open.retain(|t, _| alive.binary_search(t).is_ok());
    }
}

/// Keeps each thread's previous reading and yields deltas.
#[derive(Debug, Default)]
pub(crate) struct CpuTracker {
    /// Previous reading and the kernel time counted in ticks but not yet attributed.
    last: IdMap<i32, (CpuReading, f64)>,
    /// `--wall`: CPU seconds each thread was seen to use beyond the wall time of its
    /// intervals, not yet taken off its time off the CPU (see [`off_cpu_s`](Self::off_cpu_s)).
    ahead: IdMap<i32, f64>,
    tick_s: f64,
}

impl CpuTracker {
    pub(crate) fn new() -> CpuTracker {
        CpuTracker {
            last: IdMap::default(),
            ahead: IdMap::default(),
            tick_s: tick_seconds(),
        }
    }

    /// `--wall`: the seconds `tid` spent off the CPU in an interval of `wall_s` in which
    /// its CPU time moved by `cpu_s`.
    /// - A running thread's schedstat total moves only at the scheduler's tick (every 4 ms
    ///   at HZ=250) and at context switches.
    /// - So at 1 kHz a busy thread's intervals read 0, 0, 0, then 4 ms. Taken one by one,
    ///   the first three were charged as time off the CPU and the fourth was not made up
    ///   for. A busy thread's wall time came to 128% of the time elapsed.
    /// - CPU seen beyond an interval's wall time is kept, and taken off the thread's time
    ///   off the CPU in the intervals that follow.
    /// - Over a run, CPU and time off it add up to the time elapsed (plus at most the CPU
    ///   still kept).
    pub(crate) fn off_cpu_s(&mut self, tid: i32, wall_s: f64, cpu_s: f64) -> f64 {
        let ahead = self.ahead.entry(tid).or_insert(0.0);
        let gap = wall_s - cpu_s;
        if gap >= 0.0 {
            let made_up = gap.min(*ahead);
            *ahead -= made_up;
            gap - made_up
        } else {
            *ahead -= gap;
            0.0
        }
    }

    /// Seconds of CPU (schedstat) `tid` used since its last reading, left for its next
    /// [`delta`](Self::delta); None for a thread not read before.
    pub(crate) fn pending_s(&self, tid: i32, run_ns: u64) -> Option<f64> {
        let (prev, _) = self.last.get(&tid)?;
        Some(run_ns.saturating_sub(prev.run_ns) as f64 * 1e-9)
    }

    /// Whether `tid` used no CPU since its last reading (`run_ns`: its schedstat total
    /// now). False for a thread not read before, and without schedstat (0: nothing to tell
    /// by). The total moves at the scheduler's ticks and at context switches. So a thread
    /// that woke and has run less than a tick may still look unchanged, and the CPU it used
    /// shows at a later sample.
    pub(crate) fn unchanged(&self, tid: i32, run_ns: u64) -> bool {
        run_ns != 0
            && self
                .last
                .get(&tid)
                .is_some_and(|(prev, _)| prev.run_ns == run_ns)
    }

    /// Takes `run_ns` as `tid`'s schedstat total without counting what it used since its
    /// last reading (CPU that our own pause of it cost, not the program's).
    pub(crate) fn absorb(&mut self, tid: i32, run_ns: u64) {
        if let Some((prev, _)) = self.last.get_mut(&tid) {
            prev.run_ns = run_ns;
        }
    }

    /// The time `tid` spent since its last reading. The first reading of a thread yields
    /// zero (we do not know when its interval began).
    ///
    /// - Total CPU time comes from `schedstat` (nanoseconds).
    /// - The kernel part comes from `stime` ticks, at most the interval's total, with any
    ///   excess carried to the thread's next interval. Ticks arrive in 10 ms steps, so one
    ///   interval may see two ticks and the next none. Dropping the excess would bias system
    ///   time down.
    /// - The rest is user time.
    pub(crate) fn delta(&mut self, tid: i32, now: CpuReading) -> CpuDelta {
        let mut pending = 0.0;
        let d = match self.last.get(&tid) {
            Some(&(prev, carried)) => {
                let total = now.run_ns.saturating_sub(prev.run_ns) as f64 * 1e-9;
                let total = if now.run_ns == 0 {
                    // No schedstat (kernel without it), so fall back to ticks.
                    (now.utime + now.stime).saturating_sub(prev.utime + prev.stime) as f64
                        * self.tick_s
                } else {
                    total
                };
                let owed = carried + now.stime.saturating_sub(prev.stime) as f64 * self.tick_s;
                let sys = owed.min(total);
                pending = owed - sys;
                CpuDelta {
                    user_s: total - sys,
                    system_s: sys,
                }
            }
            None => CpuDelta::default(),
        };
        self.last.insert(tid, (now, pending));
        d
    }

    /// Forgets threads not in `alive` (ascending; the others exited).
    pub(crate) fn retain(&mut self, alive: &[i32]) {
        self.last.retain(|t, _| alive.binary_search(t).is_ok());
        self.ahead.retain(|t, _| alive.binary_search(t).is_ok());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_stat_with_odd_names() {
        let line =
            "1234 (my (weird) name) S 1 1234 1234 0 -1 4194304 100 0 0 0 250 17 0 0 20 0 3 0";
        assert_eq!(parse_stat(line), Some(('S', 250, 17)));
        assert_eq!(parse_stat("garbage"), None);
    }

    /// A busy thread whose CPU time shows a tick late, in intervals of 1 ms reading 0, 0, 0
    /// and 4 ms, over and over. After the first three (nothing to make up for yet), no
    /// interval is charged time off the CPU, and CPU plus time off it is the time elapsed
    /// plus what is still kept. A thread that then sleeps is charged its sleep, less what
    /// was kept.
    #[test]
    fn cpu_seen_late_is_not_charged_as_time_off_the_cpu() {
        let mut t = CpuTracker::new();
        let (mut off, mut cpu) = (Vec::new(), 0.0);
        for k in 0..40 {
            let c = if k % 4 == 3 { 4e-3 } else { 0.0 };
            cpu += c;
            off.push(t.off_cpu_s(7, 1e-3, c));
        }
        let total: f64 = off.iter().sum();
        assert!((total - 3e-3).abs() < 1e-12, "{off:?}");
        assert!(off[4..].iter().all(|&o| o == 0.0), "{off:?}");
        assert!((cpu + total - 40e-3 - t.ahead[&7]).abs() < 1e-12);
        let kept = t.ahead[&7];
        assert!((t.off_cpu_s(7, 10e-3, 0.0) - (10e-3 - kept)).abs() < 1e-12);
        assert_eq!(t.off_cpu_s(7, 10e-3, 0.0), 10e-3);
    }

    #[test]
    fn deltas_split_user_and_system() {
        let mut t = CpuTracker {
            tick_s: 0.01,
            ..CpuTracker::default()
        };
        let r = |ns, u, s| CpuReading {
            run_ns: ns,
            utime: u,
            stime: s,
            state: 'R',
        };
        assert_eq!(t.delta(1, r(0, 0, 0)), CpuDelta::default());
        let d = t.delta(1, r(50_000_000, 3, 2));
        assert!((d.system_s - 0.02).abs() < 1e-12);
        assert!((d.user_s - 0.03).abs() < 1e-12);
        // System ticks beyond the precise total are capped, and the excess carried over.
        let d = t.delta(1, r(51_000_000, 3, 4));
        assert!((d.system_s - 0.001).abs() < 1e-12 && d.user_s.abs() < 1e-12);
        let d = t.delta(1, r(81_000_000, 3, 4));
        assert!((d.system_s - 0.019).abs() < 1e-12, "{d:?}");
        assert!((d.user_s - 0.011).abs() < 1e-12, "{d:?}");
    }

    #[test]
    fn open_files_give_fresh_readings() {
        let pid = std::process::id() as i32;
        // SAFETY: gettid takes no arguments and cannot fail.
        let tid = unsafe { libc::syscall(libc::SYS_gettid) } as i32;
        let mut files = ThreadFiles::new();
        let a = files.read(pid, tid).expect("this thread");
        // Burn 30 ms of this thread's CPU time (its own clock, not the wall's: beside other
        // tests a 30 ms wall-clock loop got 7 ms of CPU). The same open files must show it.
        let cpu_start = own_thread_cpu();
        let wall_start = std::time::Instant::now();
        let mut x = 0u64;
        while own_thread_cpu() < cpu_start + std::time::Duration::from_millis(30) {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
            assert!(
                wall_start.elapsed() < std::time::Duration::from_secs(30),
                "30 ms of CPU time took over 30 s"
            );
        }
        let b = files.read(pid, tid).expect("this thread");
        assert!(b.run_ns > a.run_ns + 10_000_000, "{a:?} then {b:?}");
        assert_eq!(files.state(pid, tid), Some('R'));
        assert!(files.read(pid, i32::MAX).is_none());
    }

    #[test]
    fn reads_own_thread() {
        let pid = std::process::id() as i32;
        let r = ThreadFiles::new().read(pid, pid).expect("own main thread");
        assert!(r.run_ns > 0 || r.utime + r.stime > 0);
    }
}
