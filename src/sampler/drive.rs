//! The schedule of samples: ticks at a steady rate, missed ones counted, never invented.
//!
//! Owns: [`Ticker`] (one process or a tree of them), [`drive`] (the deadline loop, the
//! courtesy hooks, the wait that ends when the target exits) and [`ExitWatch`].
//! Must not: read the target itself.

use super::{Sampler, Stats};
use crate::error::Result;
use std::time::{Duration, Instant};

impl Ticker for Sampler {
    fn tick(&mut self) -> Result<bool> {
        match self.sample_once() {
            Ok(()) => Ok(true),
            Err(e) if e.is_process_gone() => Ok(false),
            Err(e) => Err(e),
        }
    }
    fn stats_mut(&mut self) -> &mut Stats {
        &mut self.stats
    }
}

/// Something sampled on a schedule: one process ([`Sampler`]) or a tree of them.
pub(crate) trait Ticker {
    /// Takes one sample; Ok(false) when there is nothing left to sample.
    fn tick(&mut self) -> Result<bool>;
    fn stats_mut(&mut self) -> &mut Stats;
}

/// Ticks are this much closer together than `1 / rate`.
///
/// - At exactly the period asked for (1 ms, 10 ms), every tick falls at the same few
///   phases of the kernel's clock tick (4 ms at HZ=250).
/// - The kernel charges CPU time by what a thread is doing at its tick.
/// - Measured: a paused read at 1 kHz of fixtures/cpu/flip.py (`--blocking`, system-3.11)
///   reported 51% and 64% system time for the CPU-bound line in 2 runs of 20, and 0.0% in
///   15. The pauses' own kernel time (~1-3%) was either always or never caught.
/// - 97/98 of the period is on no kernel's tick grid (HZ 100, 250, 300, 1000). The phase
///   sweeps the whole tick within ~100 ticks, with every interval equal. Random intervals
///   would add variance to the CPU-time weights.
/// - The achieved rate is reported as such, 1% over the rate asked. A sampler that keeps
///   up thus takes at least the rate asked (98/97, the other side of the period, capped
///   every run at 99% of it).
const OFF_GRID: f64 = 97.0 / 98.0;

/// Ticks `t` at `rate_hz` until `stop()` says so or `t` has nothing left to sample.
///
/// - `progress` is called about four times a second.
/// - `ends` is a process whose exit ends the recording (the program run, or the process
///   attached to). The wait between ticks ends when it exits, so the end is seen at once,
///   not at the next tick. That tick would come a tenth of a second later at 10 Hz, and
///   on average half a period later at any rate. A program run by us would seem to take
///   that much longer.
/// - `courteous` says the recording reads without stopping the program as a rule. This
///   thread may then give way to the program (see [`crate::courtesy`]).
/// - `pauses` says every tick stops the program's threads that ran (`--blocking`,
///   `--native`). After a tick ends, the next one waits at least as long as that tick
///   took. So the program runs at least half the time, whatever the rate. The ticks that
///   fall in that while are missed. (Ticks back to back starved the program. At 20 kHz,
///   where a paused sample takes longer than the period, julia's 3 s took over 90 s.)
#[allow(clippy::too_many_arguments)]
pub(crate) fn drive(
    t: &mut dyn Ticker,
    rate_hz: f64,
    stop: &mut dyn FnMut() -> bool,
    progress: &mut dyn FnMut(&Stats),
    ends: Option<i32>,
    courteous: bool,
    pauses: bool,
) -> Result<()> {
    let mut exit = ends.and_then(ExitWatch::open);
    let period = Duration::from_secs_f64(1.0 / rate_hz.max(0.001)).mul_f64(OFF_GRID);
    let courtesy = courteous
        .then(|| crate::courtesy::Courtesy::begin(period))
        .flatten();
    // Sleeps are of tens of microseconds, and the default timer slack (50 µs) would stretch
    // each one by up to that much, halving a 20 kHz rate.
    // SAFETY: PR_SET_TIMERSLACK only changes this thread's timer slack.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong, 0, 0, 0) };
    let start = Instant::now();
    let mut next = start;
    let mut last_progress = start;
    let mut last_stop_check: Option<Instant> = None;
    loop {
        // `stop` costs system calls (a wait for the program, say), so it is called at most
        // once a millisecond, whatever the rate.
        if last_stop_check.is_none_or(|t| t.elapsed() >= Duration::from_millis(1)) {
            last_stop_check = Some(Instant::now());
            if stop() {
                break;
            }
        }
        if let Some(c) = &courtesy {
            c.tick_begins();
        }
        let began = Instant::now();
        if !t.tick()? {
            break;
        }
        next += period;
        let now = Instant::now();
        // The earliest the next tick may come is at once, or after a paused one as long
        // again.
        let ready = if pauses {
            now + now.duration_since(began)
        } else {
            now
        };
        let fell_behind = ready > next;
        if fell_behind {
            // Fell behind. Ticks stay on their schedule (start + k·period):
            // - every tick whose successor is also already due is missed and counted;
            // - the latest due one is taken as soon as it may be.
            // (Restarting the schedule from `now` would drop the fraction of a period lost
            // on every late sample. A sampler needing 130 µs at 10 kHz would take 7.7 kHz
            // while counting almost nothing as missed.)
            let behind = ready.duration_since(next).as_secs_f64() / period.as_secs_f64();
            let skipped = behind.floor() as u64;
            t.stats_mut().missed += skipped;
            next += period.mul_f64(skipped as f64);
        }
        // When the next tick comes.
        let at = next.max(ready);
        if let Some(c) = &courtesy {
            c.tick_ends(at);
        }
        if at <= now {
            // The latest tick due is taken at once.
        } else if let Some(e) = &exit {
            if e.wait(at) {
                // It exited, so `stop` says so now (a tick would find it gone). It is
                // watched no more, because a process that stays a zombie (its parent not
                // ours, not waiting) would end every wait at once.
                last_stop_check = None;
                exit = None;
            }
        } else {
            std::thread::sleep(at - now);
        }
        t.stats_mut().elapsed = start.elapsed();
        if last_progress.elapsed() >= Duration::from_millis(250) {
            last_progress = Instant::now();
            progress(t.stats_mut());
        }
    }
    t.stats_mut().elapsed = start.elapsed();
    if let Some(c) = &courtesy {
        t.stats_mut().gave_way = Some(c.boosts());
    }
    Ok(())
}

/// A process's exit, as a file descriptor that becomes readable when it has exited
/// (`pidfd_open`, Linux 5.3+).
struct ExitWatch(std::os::fd::OwnedFd);

impl ExitWatch {
    /// None where pidfds are not available (an older kernel) or the process is gone.
    fn open(pid: i32) -> Option<ExitWatch> {
        use std::os::fd::FromRawFd;
        // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        // SAFETY: a descriptor the call just made, owned by nothing else.
        (fd >= 0).then(|| ExitWatch(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as i32) }))
    }

    /// Sleeps until `until`, or until the process exits. True when it has.
    fn wait(&self, until: Instant) -> bool {
        use std::os::fd::AsRawFd;
        let mut fds = [libc::pollfd {
            fd: self.0.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }];
        loop {
            let d = until.saturating_duration_since(Instant::now());
            if d.is_zero() {
                return false;
            }
            let ts = libc::timespec {
                tv_sec: d.as_secs() as libc::time_t,
                tv_nsec: d.subsec_nanos() as libc::c_long,
            };
            // SAFETY: one pollfd we own, a timeout we own, no signal mask.
            let n = unsafe { libc::ppoll(fds.as_mut_ptr(), 1, &ts, std::ptr::null()) };
            if n > 0 {
                return fds[0].revents != 0;
            }
            if n == 0 || std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
                return false;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records when each tick came.
    struct Clock {
        ticks: Vec<Instant>,
        want: usize,
        stats: Stats,
    }

    impl Ticker for Clock {
        fn tick(&mut self) -> Result<bool> {
            self.ticks.push(Instant::now());
            Ok(self.ticks.len() < self.want)
        }
        fn stats_mut(&mut self) -> &mut Stats {
            &mut self.stats
        }
    }

    /// At 1 kHz the ticks fall at every phase of a 4 ms grid (the kernel's clock tick at
    /// HZ=250), not at the same four. Their offsets from the first tick, modulo 4 ms, fill
    /// most of its forty 0.1 ms bins. (Exact 1 ms ticks fill four, and a few beside them
    /// by wake-up delay.)
    #[test]
    fn ticks_sweep_the_phase_of_a_kernel_tick() {
        let mut c = Clock {
            ticks: Vec::new(),
            want: 400,
            stats: Stats::default(),
        };
        drive(
            &mut c,
            1000.0,
            &mut || false,
            &mut |_| {},
            None,
            false,
            false,
        )
        .unwrap();
        let first = c.ticks[0];
        let mut bins = [0u32; 40];
        for t in &c.ticks {
            let us = t.duration_since(first).as_micros() as u64 % 4000;
            bins[(us / 100) as usize] += 1;
        }
        let filled = bins.iter().filter(|&&b| b > 0).count();
        assert!(filled >= 30, "{filled} of 40 phase bins: {bins:?}");
    }

    /// Takes 2 ms a tick (as a paused sample might), recording when each began and ended.
    struct Slow {
        spans: Vec<(Instant, Instant)>,
        stats: Stats,
    }

    impl Ticker for Slow {
        fn tick(&mut self) -> Result<bool> {
            let began = Instant::now();
            std::thread::sleep(Duration::from_millis(2));
            self.spans.push((began, Instant::now()));
            Ok(self.spans.len() < 50)
        }
        fn stats_mut(&mut self) -> &mut Stats {
            &mut self.stats
        }
    }

    /// Ticks that stop the program (`pauses`) and take longer than the period (2 ms at
    /// 1 kHz) are not taken back to back. After each, the program has at least as long
    /// again, and the ticks that fall in it are counted as missed. Without `pauses` the
    /// latest tick due is taken at once.
    #[test]
    fn ticks_that_pause_the_program_leave_it_as_long_to_run() {
        for pauses in [true, false] {
            let mut s = Slow {
                spans: Vec::new(),
                stats: Stats::default(),
            };
            drive(
                &mut s,
                1000.0,
                &mut || false,
                &mut |_| {},
                None,
                false,
                pauses,
            )
            .unwrap();
            let gaps: Vec<Duration> = s
                .spans
                .windows(2)
                .map(|w| w[1].0.duration_since(w[0].1))
                .collect();
            let held = |i: usize| s.spans[i].1.duration_since(s.spans[i].0);
            if pauses {
                for (i, g) in gaps.iter().enumerate() {
                    assert!(*g >= held(i), "tick {i}: {g:?} to run after {:?}", held(i));
                }
                // 50 ticks of ~4 ms where 1 ms ones were asked, so ~3 missed each.
                assert!(s.stats.missed >= 100, "missed {}", s.stats.missed);
            } else {
                let short = gaps
                    .iter()
                    .filter(|g| **g < Duration::from_millis(1))
                    .count();
                assert!(short >= 40, "{short} of 49 ticks back to back: {gaps:?}");
            }
        }
    }
}
