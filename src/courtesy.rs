//! The sampler gives way to the program. While it reads without stopping anything, its
//! thread runs under `SCHED_IDLE`. So any thread of the program (or of anything else) that
//! wakes takes the CPU from it at once, instead of waiting for the end of the sampler's
//! time slice.
//!
//! Why:
//! - The program's threads hand work to each other (a thread started waits for the one
//!   that starts it to run, a pool woken to end hands the GIL round).
//! - On a machine with few CPUs each hand-over that lands on the CPU the sampler is using
//!   waited for it.
//! - Beside a pool of 1,000 threads starting, that wait, not the CPU we used, was what the
//!   program lost. The start took 110 ms under the sampler against 84 ms bare, and 81 ms
//!   with the sampler at `SCHED_IDLE`. Nice 19 did not help, because a niced thread still
//!   runs to the end of its slice.
//!
//! Samples then wait for a free CPU. Their CPU time is charged all the same, at the next
//! sample.
//!
//! The danger of the idle policy is an inversion. A sampler holds something the program
//! needs (threads it stopped; the target's memory map lock, for the moment a read of its
//! memory pins pages) and cannot run because the program keeps every CPU busy. So:
//! - every stop of the program's threads ([`Stand`], taken by `ptrace::pause`) runs under
//!   the normal policy, from before the first thread stops until the last is let go;
//! - a watchdog thread of ours, under the normal policy, gives the sampler the normal
//!   policy back when a tick has run for [`STUCK`] or the sampler woke [`STUCK`] late.
//!   The sampler keeps it for [`HOLD`] (a busy machine, so it takes its share, as before).
//!
//! The courtesy applies only:
//! - where the sampler can give the normal policy back to itself (root, or
//!   `CAP_SYS_NICE`, or an `RLIMIT_NICE` that allows nice 0), because the kernel lets an
//!   unprivileged thread into `SCHED_IDLE` but not out of it;
//! - for recordings that read without stopping the program as a rule (not `--blocking`,
//!   `--native` or memory, whose allocation handshake makes the program wait for the
//!   sampler);
//! - not with `SCALENE_RS_NO_YIELD=1`.
//!
//! Owns: [`Courtesy`] (the policy of the sampler's thread, the watchdog) and [`Stand`].
//! Must not: change anything of the program's (its threads' policies are theirs), or leave
//! the watchdog running after the recording.

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A tick that has run this long gives the sampler the normal policy back. The program (or
/// the machine) keeps every CPU busy.
pub(crate) const STUCK: Duration = Duration::from_millis(50);
/// How long the normal policy is kept once given back by the watchdog, at first.
/// - A boost within this of the last one doubles the hold, up to [`MAX_HOLD`], because
///   the machine is still busy.
/// - A boost after a longer calm starts again from this.
const HOLD: Duration = Duration::from_millis(250);
const MAX_HOLD: Duration = Duration::from_secs(4);
/// How often the watchdog looks.
const WATCH_EVERY: Duration = Duration::from_millis(5);

/// What the sampler's thread and the watchdog share.
struct Shared {
    /// The sampler's thread (its kernel id).
    tid: i32,
    base: Instant,
    /// Nanoseconds since `base`: when the running tick began (0: none running), and when
    /// the next one is due (0: not known yet).
    tick_since: AtomicU64,
    due: AtomicU64,
    stop: AtomicBool,
    /// Times the watchdog gave the normal policy back.
    boosts: AtomicU64,
    /// A wake-up this late (nanoseconds) gives the normal policy back. It is one period of
    /// the rate, at most [`STUCK`]. A sampler that waits longer for a free CPU misses ticks,
    /// and the ones it takes come when a CPU frees, not on the clock.
    ///
    /// Measured (`run --cpu-only` of split.py on 2.7 beside two CPU hogs, 3 runs each):
    /// - with 50 ms here, 10-15% of ticks missed and the Python line's share was 0.1-3.1
    ///   points off the truth;
    /// - without the courtesy, 0-2% missed, 0.1-1.1 points.
    late_after: u64,
    policy: Mutex<Policy>,
}

/// The sampler thread's policy and why.
struct Policy {
    idle: bool,
    /// Stops of the program's threads under way ([`Stand`]s held).
    stands: u32,
    /// The watchdog's normal policy holds until then.
    held_until: Option<Instant>,
    /// How long the next boost holds, and when the last hold was given up.
    hold: Duration,
    released: Option<Instant>,
}

impl Shared {
    /// The policy's record. A thread that panicked holding it left it whole, because every
    /// change to it is one assignment after the system call.
    fn lock(&self) -> std::sync::MutexGuard<'_, Policy> {
        self.policy.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn ns(&self, t: Instant) -> u64 {
        (t.saturating_duration_since(self.base).as_nanos() as u64).max(1)
    }

    /// Sets the sampler thread's policy, true when the kernel took it.
    fn set(&self, p: &mut Policy, idle: bool) -> bool {
        if p.idle == idle {
            return true;
        }
        let ok = set_policy(self.tid, idle);
        if ok {
            p.idle = idle;
        }
        ok
    }
}

fn set_policy(tid: i32, idle: bool) -> bool {
    let param = libc::sched_param { sched_priority: 0 };
    let policy = if idle {
        libc::SCHED_IDLE
    } else {
        libc::SCHED_OTHER
    };
    // SAFETY: a thread id of ours, a policy constant and a parameter we own.
    unsafe { libc::sched_setscheduler(tid, policy, &param) == 0 }
}

thread_local! {
    /// The recording this thread samples for, while it is courteous.
    static CURRENT: RefCell<Option<Arc<Shared>>> = const { RefCell::new(None) };
}

/// The sampler thread's courtesy for one recording (see the module's doc).
pub(crate) struct Courtesy {
    shared: Arc<Shared>,
    watchdog: Option<std::thread::JoinHandle<()>>,
}

impl Courtesy {
    /// Puts the calling thread (the sampler's, which ticks every `period`) under
    /// `SCHED_IDLE` and starts the watchdog; None where it cannot be done safely (see the
    /// module's doc) or was turned off.
    pub(crate) fn begin(period: Duration) -> Option<Courtesy> {
        if std::env::var_os("SCALENE_RS_NO_YIELD").is_some_and(|v| v != "0") || !can_return() {
            return None;
        }
        // SAFETY: gettid has no arguments and cannot fail. (The system call, not glibc's
        // wrapper, because the wheel links against glibc 2.17, which has none.)
        let tid = unsafe { libc::syscall(libc::SYS_gettid) } as i32;
        let shared = Arc::new(Shared {
            tid,
            base: Instant::now(),
            tick_since: AtomicU64::new(0),
            due: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            boosts: AtomicU64::new(0),
            late_after: period.min(STUCK).as_nanos() as u64,
            policy: Mutex::new(Policy {
                idle: false,
                stands: 0,
                held_until: None,
                hold: HOLD,
                released: None,
            }),
        });
        // The watchdog is started first, because a thread inherits its creator's policy.
        let s = shared.clone();
        let watchdog = std::thread::Builder::new()
            .name("scalene-rs-watch".into())
            .spawn(move || watch(&s))
            .ok()?;
        let mut c = Courtesy {
            shared,
            watchdog: Some(watchdog),
        };
        let took = {
            let mut p = c.shared.lock();
            c.shared.set(&mut p, true)
        };
        if !took {
            c.finish();
            return None;
        }
        CURRENT.with(|cur| *cur.borrow_mut() = Some(c.shared.clone()));
        Some(c)
    }

    /// A tick begins. One that begins [`Shared::late_after`] after it was due takes the
    /// normal policy back at once, because the sampler waited for a free CPU. (The watchdog,
    /// a thread among the busy machine's others, may see it later than the sampler itself.)
    pub(crate) fn tick_begins(&self) {
        let s = &self.shared;
        let now = s.ns(Instant::now());
        s.tick_since.store(now, Ordering::Relaxed);
        let due = s.due.load(Ordering::Relaxed);
        if due != 0 && now.saturating_sub(due) >= s.late_after {
            boost(s);
        }
    }

    /// The tick ended; the next is due at `next`. A normal policy the watchdog gave back
    /// is given up once held for [`HOLD`].
    pub(crate) fn tick_ends(&self, next: Instant) {
        let s = &self.shared;
        s.due.store(s.ns(next), Ordering::Relaxed);
        s.tick_since.store(0, Ordering::Relaxed);
        let mut p = self.shared.lock();
        if !p.idle && p.stands == 0 && p.held_until.is_none_or(|t| Instant::now() >= t) {
            if p.held_until.take().is_some() {
                p.released = Some(Instant::now());
            }
            s.set(&mut p, true);
        }
    }

    /// Times the watchdog gave the normal policy back so far.
    pub(crate) fn boosts(&self) -> u64 {
        self.shared.boosts.load(Ordering::Relaxed)
    }

    /// Back to the normal policy; the watchdog stops.
    fn finish(&mut self) {
        CURRENT.with(|cur| cur.borrow_mut().take());
        {
            let mut p = self.shared.lock();
            self.shared.set(&mut p, false);
        }
        self.shared.stop.store(true, Ordering::Relaxed);
        if let Some(w) = self.watchdog.take() {
            w.thread().unpark();
            let _ = w.join();
        }
    }
}

impl Drop for Courtesy {
    fn drop(&mut self) {
        self.finish();
    }
}

/// The watchdog's loop (see the module's doc).
fn watch(s: &Shared) {
    while !s.stop.load(Ordering::Relaxed) {
        std::thread::park_timeout(WATCH_EVERY);
        let now = s.ns(Instant::now());
        let stuck = STUCK.as_nanos() as u64;
        let since = s.tick_since.load(Ordering::Relaxed);
        let due = s.due.load(Ordering::Relaxed);
        let late = if since != 0 {
            now.saturating_sub(since) >= stuck
        } else {
            due != 0 && now.saturating_sub(due) >= s.late_after
        };
        if late {
            boost(s);
        }
    }
}

/// The normal policy back, held for a while: [`HOLD`], doubled (up to [`MAX_HOLD`]) when the
/// last hold ended less than [`HOLD`] ago.
fn boost(s: &Shared) {
    let mut p = s.lock();
    if p.idle && s.set(&mut p, false) {
        s.boosts.fetch_add(1, Ordering::Relaxed);
        let at = Instant::now();
        p.hold = match p.released {
            Some(r) if at.duration_since(r) < HOLD => (p.hold * 2).min(MAX_HOLD),
            _ => HOLD,
        };
        p.held_until = Some(at + p.hold);
    }
}

/// While held, the thread that took it (a sampler stopping the program's threads) runs
/// under the normal policy. A stopped thread must not wait for a sampler the program's
/// other threads keep from running. A no-op on a thread that is not courteous.
pub(crate) struct Stand {
    shared: Option<Arc<Shared>>,
}

impl Stand {
    pub(crate) fn take() -> Stand {
        let shared = CURRENT.with(|cur| cur.borrow().clone());
        if let Some(s) = &shared {
            let mut p = s.lock();
            p.stands += 1;
            s.set(&mut p, false);
        }
        Stand { shared }
    }
}

impl Drop for Stand {
    fn drop(&mut self) {
        if let Some(s) = &self.shared {
            let mut p = s.lock();
            p.stands -= 1;
            if p.stands == 0 && p.held_until.is_none() {
                s.set(&mut p, true);
            }
        }
    }
}

/// Whether this thread could leave `SCHED_IDLE` for the normal policy at nice 0 again:
/// `CAP_SYS_NICE` in its effective set, or an `RLIMIT_NICE` of 20 or more.
fn can_return() -> bool {
    const CAP_SYS_NICE: u32 = 23;
    let cap = std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("CapEff:"))
            .and_then(|h| u64::from_str_radix(h.trim(), 16).ok())
            .is_some_and(|bits| bits & (1 << CAP_SYS_NICE) != 0)
    });
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we own.
    let rlimit_ok = unsafe { libc::getrlimit(libc::RLIMIT_NICE, &mut lim) } == 0
        && (lim.rlim_cur == libc::RLIM_INFINITY || lim.rlim_cur >= 20);
    cap || rlimit_ok
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy_of_this_thread() -> i32 {
        // SAFETY: 0 is the calling thread.
        unsafe { libc::sched_getscheduler(0) }
    }

    /// A courteous thread runs idle, stands up (normal) while a stop is under way and
    /// sits down after, and is normal again when the recording ends.
    #[test]
    fn the_sampler_runs_idle_but_stops_threads_under_the_normal_policy() {
        let Some(c) = Courtesy::begin(Duration::from_millis(10)) else {
            eprintln!("skipped: cannot return from SCHED_IDLE here (no CAP_SYS_NICE)");
            return;
        };
        assert_eq!(policy_of_this_thread(), libc::SCHED_IDLE);
        {
            let _stand = Stand::take();
            assert_eq!(policy_of_this_thread(), libc::SCHED_OTHER);
            {
                let _inner = Stand::take();
                assert_eq!(policy_of_this_thread(), libc::SCHED_OTHER);
            }
            assert_eq!(
                policy_of_this_thread(),
                libc::SCHED_OTHER,
                "one stand still held"
            );
        }
        assert_eq!(policy_of_this_thread(), libc::SCHED_IDLE);
        drop(c);
        assert_eq!(policy_of_this_thread(), libc::SCHED_OTHER);
        // Not courteous any more, so a stand changes nothing.
        let _stand = Stand::take();
        assert_eq!(policy_of_this_thread(), libc::SCHED_OTHER);
    }

    /// A tick that runs past `STUCK` gets the normal policy back from the watchdog, and
    /// keeps it for `HOLD` after the tick.
    #[test]
    fn a_stuck_tick_gets_the_normal_policy_back() {
        let Some(c) = Courtesy::begin(Duration::from_millis(10)) else {
            eprintln!("skipped: cannot return from SCHED_IDLE here (no CAP_SYS_NICE)");
            return;
        };
        c.tick_begins();
        let t0 = Instant::now();
        while policy_of_this_thread() == libc::SCHED_IDLE && t0.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(policy_of_this_thread(), libc::SCHED_OTHER);
        assert!(
            t0.elapsed() >= STUCK,
            "not before {STUCK:?}: {:?}",
            t0.elapsed()
        );
        assert_eq!(c.boosts(), 1);
        c.tick_ends(Instant::now());
        assert_eq!(
            policy_of_this_thread(),
            libc::SCHED_OTHER,
            "held for a while"
        );
        std::thread::sleep(HOLD);
        c.tick_begins();
        c.tick_ends(Instant::now() + Duration::from_millis(10));
        assert_eq!(policy_of_this_thread(), libc::SCHED_IDLE);
    }
}
