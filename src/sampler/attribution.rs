//! Where a thread's time goes, sample after sample: a state machine over observations.
//!
//! Owns: [`Attribution`]. Where the CPU time a thread used since its last sample goes:
//! - a thread running now: where it is now;
//! - else where it was last seen running. A thread that went to sleep used that CPU before
//!   it slept, not on the line it sleeps on.
//! - Time off the CPU (wall mode): where the thread waits now.
//!
//! A running thread's CPU time shows late.
//! - The kernel brings a thread's total up to date at its scheduler tick (every 4 ms at
//!   HZ=250) and when it is switched out, not when another process reads it.
//! - At 1 kHz a busy thread's samples see 0, 0, 0, then 4 ms. Charged as seen, the whole
//!   4 ms would go to the stack of the fourth sample. A profile at 10 kHz weighed one stack
//!   in forty (the statistical worth of 250 samples a second).
//! - So the stacks of samples that found the thread running, but saw none of its CPU time
//!   yet, are held. The CPU time that shows next is shared among them and the sample it
//!   shows at, each by the wall time of its interval. A thread running all along used that
//!   much of it in each.
//!
//! An observation may so give several charges: its CPU time where the thread ran, its time
//! off the CPU where it waits, a share to each held stack. It still counts as one sample of
//! its thread.
//! - The first of its charges that carries time says so ([`Charge::counts`]).
//! - So a thread's samples never exceed the ticks that saw it. Under `--wall` each was
//!   counted twice before: 639 samples of a thread in 336 ticks.
//!
//! Must not: read the target or /proc. Its input is an [`Observation`], a plain value, so
//! that it can be tested over recorded observations.

use crate::profile::{Activity, Frame};
use crate::IdMap;
use std::collections::VecDeque;

/// One thread as one sample saw it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Observation {
    /// Kernel TID.
    pub(crate) tid: i32,
    /// Its stack, innermost first.
    pub(crate) frames: Vec<Frame>,
    /// What the innermost frame was doing.
    pub(crate) activity: Activity,
    /// On a CPU (or holding the GIL, or in the memory handshake) when its stack was read.
    pub(crate) running: bool,
    /// CPU time since its previous sample, user and kernel, seconds.
    pub(crate) user_s: f64,
    pub(crate) system_s: f64,
    /// Time off the CPU since its previous sample (wall mode; 0 otherwise), seconds.
    pub(crate) idle_s: f64,
    /// Wall time since the previous sample, seconds. It is the weight of this sample's stack
    /// in CPU time that shows later (see the module's text).
    pub(crate) wall_s: f64,
}

/// Time to charge to a stack.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Charge<'a> {
    pub(crate) tid: i32,
    pub(crate) frames: &'a [Frame],
    pub(crate) activity: Activity,
    pub(crate) user_s: f64,
    pub(crate) system_s: f64,
    pub(crate) idle_s: f64,
    /// This charge stands for its observation in the thread's sample count. True for
    /// exactly one charge of each observation whose time is charged (the first with time).
    pub(crate) counts: bool,
}

impl Charge<'_> {
    fn has_time(&self) -> bool {
        self.user_s + self.system_s + self.idle_s > 0.0
    }
}

/// Passes `c` on, counting it as its observation's sample when none of that observation's
/// charges has been (`counted`) and it carries time.
fn emit(charge: &mut dyn FnMut(Charge<'_>), mut c: Charge<'_>, counted: &mut bool) {
    c.counts = !*counted && c.has_time();
    *counted |= c.counts;
    charge(c);
}

/// Most stacks held for one thread (at 20 kHz, two scheduler ticks' worth at HZ=250).
/// Past it the oldest give way, because CPU time that long overdue is not coming (a thread
/// that holds the GIL while it blocks, say).
const MOST_HELD: usize = 160;

/// A stack held for CPU time to come, with the wall time of its interval and whether its
/// observation was counted already (by its time off the CPU).
type Held = (Vec<Frame>, Activity, f64, bool);

/// Where each thread was the last time it was seen running.
#[derive(Debug, Default)]
pub(crate) struct Attribution {
    last_running: IdMap<i32, (Vec<Frame>, Activity)>,
    /// The stacks of each thread's samples that found it running and saw no CPU time yet,
    /// oldest first.
    held: IdMap<i32, VecDeque<Held>>,
    /// The listing (ascending) the last [`Attribution::retain`] kept threads of.
    retained_for: Vec<i32>,
}

impl Attribution {
    pub(crate) fn new() -> Attribution {
        Attribution::default()
    }

    /// Takes one observation and says what to charge where: the CPU time first, then the
    /// time off the CPU. A charge may carry no time (the caller drops those). The stacks
    /// are moved, not copied, because this runs for every thread of every sample.
    pub(crate) fn observe(&mut self, o: Observation, charge: &mut dyn FnMut(Charge<'_>)) {
        let cpu_s = o.user_s + o.system_s;
        // Whether this observation's sample was counted (see the module's text).
        let mut counted = false;
        let idle = |charge: &mut dyn FnMut(Charge<'_>), o: &Observation, counted: &mut bool| {
            let c = Charge {
                tid: o.tid,
                frames: &o.frames,
                activity: o.activity,
                user_s: 0.0,
                system_s: 0.0,
                idle_s: o.idle_s,
                counts: false,
            };
            emit(charge, c, counted)
        };
        let mut held = self.held.remove(&o.tid).unwrap_or_default();
        if o.running && cpu_s <= 0.0 && o.wall_s > 0.0 {
            // Running, its CPU time not shown yet, so it is held for the time to come.
            idle(charge, &o, &mut counted);
            self.last_running.remove(&o.tid);
            if held.len() >= MOST_HELD {
                held.pop_front();
            }
            held.push_back((o.frames, o.activity, o.wall_s, counted));
            self.held.insert(o.tid, held);
            return;
        }
        if held.is_empty() {
            let before = self.last_running.remove(&o.tid);
            let (cpu_frames, cpu_activity) = match (o.running, &before) {
                (false, Some((f, a))) => (&f[..], *a),
                _ => (&o.frames[..], o.activity),
            };
            let c = Charge {
                tid: o.tid,
                frames: cpu_frames,
                activity: cpu_activity,
                user_s: o.user_s,
                system_s: o.system_s,
                idle_s: 0.0,
                counts: false,
            };
            emit(charge, c, &mut counted);
            idle(charge, &o, &mut counted);
            match (o.running, before) {
                (true, _) => {
                    self.last_running.insert(o.tid, (o.frames, o.activity));
                }
                (false, Some(b)) => {
                    self.last_running.insert(o.tid, b);
                }
                (false, None) => {}
            }
            return;
        }
        if cpu_s <= 0.0 {
            // Not running now, and its CPU time still not shown, so the held stacks wait on.
            idle(charge, &o, &mut counted);
            self.held.insert(o.tid, held);
            return;
        }
        // Shared by wall time among the held stacks and, when it runs now, this one.
        let own = if o.running { o.wall_s } else { 0.0 };
        let weight = own + held.iter().map(|h| h.2).sum::<f64>();
        let share = |w: f64| if weight > 0.0 { w / weight } else { 0.0 };
        for (frames, activity, w, was_counted) in &held {
            let k = share(*w);
            // Each held stack is an earlier observation. It is counted once, now unless then.
            let mut its_own = *was_counted;
            let c = Charge {
                tid: o.tid,
                frames,
                activity: *activity,
                user_s: o.user_s * k,
                system_s: o.system_s * k,
                idle_s: 0.0,
                counts: false,
            };
            emit(charge, c, &mut its_own);
        }
        let k = share(own);
        let c = Charge {
            tid: o.tid,
            frames: &o.frames,
            activity: o.activity,
            user_s: o.user_s * k,
            system_s: o.system_s * k,
            idle_s: 0.0,
            counts: false,
        };
        emit(charge, c, &mut counted);
        idle(charge, &o, &mut counted);
        let last = if o.running {
            (o.frames, o.activity)
        } else {
            let (f, a, _, _) = held.pop_back().expect("held is not empty here");
            (f, a)
        };
        self.last_running.insert(o.tid, last);
    }

    /// Forgets the threads that are gone (not in `tids`, ascending).
    pub(crate) fn retain(&mut self, tids: &[i32]) {
        // The same listing as at the last call, so nobody to forget (a thread pool at rest
        // keeps hundreds of entries here, and a search of the listing for each was most
        // of a sample's own work beside a thousand threads).
        if self.retained_for == tids {
            return;
        }
        self.last_running
            .retain(|t, _| tids.binary_search(t).is_ok());
        self.held.retain(|t, _| tids.binary_search(t).is_ok());
        self.retained_for.clear();
        self.retained_for.extend_from_slice(tids);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(line: u32) -> Vec<Frame> {
        vec![Frame {
            function: "f".into(),
            filename: "/app/m.py".into(),
            line: Some(line),
            native: false,
        }]
    }

    fn obs(tid: i32, line: u32, running: bool, user_s: f64, idle_s: f64) -> Observation {
        Observation {
            tid,
            frames: at(line),
            activity: Activity::Python,
            running,
            user_s,
            system_s: 0.0,
            idle_s,
            wall_s: 0.01,
        }
    }

    /// (line, user, idle) of every charge that carries time.
    fn replay(a: &mut Attribution, seen: Vec<Observation>) -> Vec<(u32, f64, f64)> {
        let mut out = Vec::new();
        for o in seen {
            a.observe(o, &mut |c| {
                if c.user_s + c.system_s + c.idle_s > 0.0 {
                    out.push((c.frames[0].line.unwrap(), c.user_s, c.idle_s));
                }
            });
        }
        out
    }

    #[test]
    fn cpu_used_before_sleeping_goes_where_the_thread_ran() {
        let mut a = Attribution::new();
        let got = replay(
            &mut a,
            vec![
                obs(1, 10, true, 0.01, 0.0),
                // Asleep on line 20 now. Its CPU since was used on line 10.
                obs(1, 20, false, 0.004, 0.006),
                // Still asleep, so no CPU; the wait is line 20's.
                obs(1, 20, false, 0.0, 0.01),
                // Running on line 30.
                obs(1, 30, true, 0.01, 0.0),
            ],
        );
        assert_eq!(
            got,
            vec![
                (10, 0.01, 0.0),
                (10, 0.004, 0.0),
                (20, 0.0, 0.006),
                (20, 0.0, 0.01),
                (30, 0.01, 0.0)
            ]
        );
    }

    /// A busy thread alternating between lines 10 and 20 at every 1 ms sample, its CPU
    /// time showing 4 ms at a time at every fourth sample (always on line 20). Each line
    /// gets half. (Charged as seen, line 20 got all of it.)
    #[test]
    fn cpu_time_that_shows_late_is_shared_by_the_samples_it_was_used_in() {
        let mut a = Attribution::new();
        let seen = (0..400)
            .map(|k| {
                let mut o = obs(1, if k % 2 == 0 { 10 } else { 20 }, true, 0.0, 0.0);
                o.wall_s = 1e-3;
                if k % 4 == 3 {
                    o.user_s = 4e-3;
                }
                o
            })
            .collect();
        let got = replay(&mut a, seen);
        let on = |line| got.iter().filter(|c| c.0 == line).map(|c| c.1).sum::<f64>();
        assert!(
            (on(10) - 0.2).abs() < 1e-9 && (on(20) - 0.2).abs() < 1e-9,
            "{got:?}"
        );
    }

    /// Held stacks whose CPU time shows once the thread sleeps share it by their intervals'
    /// wall time (the sleeping line gets none), and the last of them is where the thread
    /// last ran.
    #[test]
    fn held_stacks_share_by_wall_time_and_the_last_is_where_it_ran() {
        let mut a = Attribution::new();
        let mut first = obs(1, 10, true, 0.0, 0.0);
        first.wall_s = 3e-3;
        let mut second = obs(1, 11, true, 0.0, 0.0);
        second.wall_s = 1e-3;
        let got = replay(
            &mut a,
            vec![
                first,
                second,
                // Asleep on line 20, nothing shown yet, so the held stacks wait on.
                obs(1, 20, false, 0.0, 0.0),
                // Shown now: 4 ms, 3 to line 10 and 1 to line 11.
                obs(1, 20, false, 4e-3, 0.0),
                // More CPU while asleep goes where it last ran, line 11.
                obs(1, 20, false, 1e-3, 0.0),
            ],
        );
        let close = |x: f64, y: f64| (x - y).abs() < 1e-12;
        assert_eq!(got.len(), 3, "{got:?}");
        assert!(got[0].0 == 10 && close(got[0].1, 3e-3), "{got:?}");
        assert!(got[1].0 == 11 && close(got[1].1, 1e-3), "{got:?}");
        assert!(got[2].0 == 11 && close(got[2].1, 1e-3), "{got:?}");
    }

    #[test]
    fn a_thread_never_seen_running_is_charged_where_it_is() {
        let mut a = Attribution::new();
        let got = replay(&mut a, vec![obs(2, 7, false, 0.002, 0.008)]);
        assert_eq!(got, vec![(7, 0.002, 0.0), (7, 0.0, 0.008)]);
    }

    #[test]
    fn threads_are_followed_apart_and_forgotten_when_gone() {
        let mut a = Attribution::new();
        replay(
            &mut a,
            vec![obs(1, 10, true, 0.01, 0.0), obs(2, 50, true, 0.01, 0.0)],
        );
        let got = replay(
            &mut a,
            vec![obs(1, 11, false, 0.01, 0.0), obs(2, 51, false, 0.01, 0.0)],
        );
        assert_eq!(got, vec![(10, 0.01, 0.0), (50, 0.01, 0.0)]);
        // Thread 2 is gone; a new thread 2 (a reused id) starts afresh.
        a.retain(&[1]);
        let got = replay(&mut a, vec![obs(2, 60, false, 0.01, 0.0)]);
        assert_eq!(got, vec![(60, 0.01, 0.0)]);
    }
}
