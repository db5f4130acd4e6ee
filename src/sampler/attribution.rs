//! Where a thread's time goes, sample after sample: a state machine over observations.
//!
//! Owns: [`Attribution`]. The CPU time a thread used since its last sample is charged where
//! the thread is now when it is running, else where it was last seen running: a thread that
//! went to sleep used that CPU before it slept, not on the line it sleeps on. Time off the
//! CPU (wall mode) is charged where the thread waits now.
//! Must not: read the target or /proc: its input is an [`Observation`], a plain value, so
//! that it can be tested over recorded observations.

use crate::profile::{Activity, Frame};
use crate::IdMap as HashMap;

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
}

/// Where each thread was the last time it was seen running.
#[derive(Debug, Default)]
pub(crate) struct Attribution {
    last_running: HashMap<i32, (Vec<Frame>, Activity)>,
    /// The listing (ascending) the last [`Attribution::retain`] kept threads of.
    retained_for: Vec<i32>,
}

impl Attribution {
    pub(crate) fn new() -> Attribution {
        Attribution::default()
    }

    /// Takes one observation and says what to charge where: the CPU time first, then the
    /// time off the CPU. A charge may carry no time (the caller drops those). The stacks
    /// are moved, not copied: this runs for every thread of every sample.
    pub(crate) fn observe(&mut self, o: Observation, charge: &mut dyn FnMut(Charge<'_>)) {
        let before = self.last_running.remove(&o.tid);
        let (cpu_frames, cpu_activity) = match (o.running, &before) {
            (false, Some((f, a))) => (&f[..], *a),
            _ => (&o.frames[..], o.activity),
        };
        charge(Charge {
            tid: o.tid,
            frames: cpu_frames,
            activity: cpu_activity,
            user_s: o.user_s,
            system_s: o.system_s,
            idle_s: 0.0,
        });
        charge(Charge {
            tid: o.tid,
            frames: &o.frames,
            activity: o.activity,
            user_s: 0.0,
            system_s: 0.0,
            idle_s: o.idle_s,
        });
        match (o.running, before) {
            (true, _) => {
                self.last_running.insert(o.tid, (o.frames, o.activity));
            }
            (false, Some(b)) => {
                self.last_running.insert(o.tid, b);
            }
            (false, None) => {}
        }
    }

    /// Forgets the threads that are gone (not in `tids`, ascending).
    pub(crate) fn retain(&mut self, tids: &[i32]) {
        // The same listing as at the last call: nobody to forget (a thread pool at rest
        // keeps hundreds of entries here, and a search of the listing for each was most
        // of a sample's own work beside a thousand threads).
        if self.retained_for == tids {
            return;
        }
        self.last_running
            .retain(|t, _| tids.binary_search(t).is_ok());
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
                // Asleep on line 20 now: its CPU since was used on line 10.
                obs(1, 20, false, 0.004, 0.006),
                // Still asleep: no CPU, the wait is line 20's.
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
