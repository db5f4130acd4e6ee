//! When the default mode reads a thread paused: a state machine over which reads without
//! pausing failed.
//!
//! Owns: [`PauseSchedule`]. When more than [`UNSETTLED_LIMIT`] of a thread's recent samples
//! could not be read without pausing, its next [`PAUSED_STRETCH`] samples are taken paused
//! (that thread only: the others are read as before), at most [`PAUSED_MAX_HZ`] a second.
//! A sample whose read without pausing fails is read paused, a fresh draw; the samples that
//! read cleanly are the states that hold still long enough to be read, so they under-count
//! states that last less than a read (a generator resumed by C code every few hundred
//! nanoseconds, as in bm_mdp's `sum(... for ...)`, whose Python time then shows as the
//! caller's native time). The bias of such a mix is at most the share that failed; past
//! this share every sample of the thread is taken paused, which favours no state, until a
//! probe without pausing finds it readable again.
//! Must not: read anything: its inputs are times and, per thread, whether its read had to
//! pause.

use std::collections::HashMap;
use std::time::Instant;

/// See the module documentation.
const UNSETTLED_LIMIT: f64 = 0.05;
/// Weight of one sample in a thread's share of failed reads (a moving average).
const UNSETTLED_WEIGHT: f64 = 1.0 / 64.0;
/// Samples taken paused once [`UNSETTLED_LIMIT`] is passed, before trying again without.
const PAUSED_STRETCH: u32 = 400;
/// At most this many paused samples a second in such a stretch: a pause costs the target
/// tens of microseconds (see docs/benchmarks.md). The ticks between take no sample; the
/// CPU time of those ticks goes to the next sample, as at a lower rate.
pub const PAUSED_MAX_HZ: f64 = 200.0;

/// One thread's record.
#[derive(Debug, Default, Clone, Copy)]
struct Unsettled {
    /// Moving average of "its read without pausing failed".
    failed: f64,
    /// Samples still to be taken paused.
    stretch: u32,
}

/// Per thread (by `thread_id`): the recent share of its samples whose read without pausing
/// failed, and how many of its samples are still to be taken paused.
#[derive(Debug, Default)]
pub(crate) struct PauseSchedule {
    threads: HashMap<u64, Unsettled>,
    /// When the last sample with a thread in a paused stretch was taken.
    last_paused: Option<Instant>,
}

impl PauseSchedule {
    pub(crate) fn new() -> PauseSchedule {
        PauseSchedule::default()
    }

    /// The threads whose next sample is to be read paused without a try first.
    pub(crate) fn pause_these(&self) -> Vec<u64> {
        self.threads
            .iter()
            .filter(|(_, u)| u.stretch > 0)
            .map(|(&id, _)| id)
            .collect()
    }

    /// Whether the tick at `now` takes no sample: it would pause (`pausing`) sooner than
    /// [`PAUSED_MAX_HZ`] allows after the last one that did.
    pub(crate) fn thin(&self, pausing: bool, now: Instant) -> bool {
        pausing
            && self
                .last_paused
                .is_some_and(|t| now.duration_since(t).as_secs_f64() < 1.0 / PAUSED_MAX_HZ)
    }

    /// A sample that pauses is taken at `now`.
    pub(crate) fn paused_at(&mut self, now: Instant) {
        self.last_paused = Some(now);
    }

    /// Takes one sample's outcome: for each thread (`thread_id`, whether its read had to
    /// pause). Threads not in it are forgotten.
    pub(crate) fn update(&mut self, threads: &[(u64, bool)]) {
        if self.threads.len() > threads.len() {
            self.threads
                .retain(|id, _| threads.iter().any(|&(t, _)| t == *id));
        }
        for &(id, read_paused) in threads {
            let u = self.threads.entry(id).or_default();
            if u.stretch > 0 {
                u.stretch -= 1;
                continue;
            }
            u.failed += UNSETTLED_WEIGHT * (f64::from(u8::from(read_paused)) - u.failed);
            if u.failed > UNSETTLED_LIMIT {
                *u = Unsettled {
                    failed: 0.0,
                    stretch: PAUSED_STRETCH,
                };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn reads_that_keep_failing_start_a_paused_stretch_for_that_thread_only() {
        let mut s = PauseSchedule::new();
        // Thread 1 reads cleanly; thread 2's reads fail one in ten (over the 5% limit).
        let mut i = 0u32;
        while s.pause_these().is_empty() {
            s.update(&[(1, false), (2, i.is_multiple_of(10))]);
            i += 1;
            assert!(i < 1000, "no stretch after {i} samples");
        }
        assert_eq!(s.pause_these(), vec![2]);
        // The stretch lasts PAUSED_STRETCH samples, then the thread is probed again.
        for k in 0..PAUSED_STRETCH {
            assert_eq!(s.pause_these(), vec![2], "sample {k} of the stretch");
            s.update(&[(1, false), (2, true)]);
        }
        assert!(s.pause_these().is_empty(), "stretch after {i} samples");
    }

    #[test]
    fn rare_failures_never_pause() {
        let mut s = PauseSchedule::new();
        for i in 0..10_000u32 {
            s.update(&[(1, i.is_multiple_of(50))]);
            // One in 50 (2%): the moving average peaks near 2.9%, under the 5% limit.
            assert!(s.pause_these().is_empty(), "sample {i}");
        }
    }

    #[test]
    fn gone_threads_are_forgotten() {
        let mut s = PauseSchedule::new();
        for _ in 0..20 {
            s.update(&[(1, true), (2, true)]);
        }
        assert_eq!(s.pause_these().len(), 2);
        s.update(&[(1, true)]);
        assert_eq!(s.pause_these(), vec![1]);
    }

    #[test]
    fn paused_samples_are_thinned_to_the_rate_limit() {
        let mut s = PauseSchedule::new();
        let t0 = Instant::now();
        assert!(!s.thin(true, t0), "nothing paused yet");
        s.paused_at(t0);
        let gap = Duration::from_secs_f64(1.0 / PAUSED_MAX_HZ);
        assert!(s.thin(true, t0 + gap / 2));
        assert!(!s.thin(false, t0 + gap / 2), "a sample that does not pause");
        assert!(!s.thin(true, t0 + gap));
    }
}
