//! When the default mode reads a thread paused. It is a state machine over which reads
//! without pausing failed.
//!
//! Owns: [`PauseSchedule`].
//! - When more than [`UNSETTLED_LIMIT`] of a thread's recent samples could not be read
//!   without pausing, its samples are taken paused for a while (see [`PAUSED_FOR_FIRST`]).
//!   That applies to that thread only. The others are read as before. Such paused samples
//!   come at most [`PAUSED_MAX_HZ`] a second.
//! - A sample whose read without pausing fails is read paused, as a fresh draw.
//!
//! The samples that read cleanly are the states that hold still long enough to be read. So
//! they under-count states that last less than a read. An example is a generator resumed
//! by C code every few hundred nanoseconds, as in bm_mdp's `sum(... for ...)`. Its Python
//! time then shows as the caller's native time.
//!
//! The bias of such a mix is at most the share that failed. Past this share, every sample
//! of the thread is taken paused, which favours no state. That lasts until a probe without
//! pausing finds the thread readable again.
//!
//! Must not: read anything. Its inputs are times and, per thread, whether its read had to
//! pause.

use crate::IdMap;
use std::time::{Duration, Instant};

/// See the module documentation.
const UNSETTLED_LIMIT: f64 = 0.05;
/// Weight of one sample in a thread's share of failed reads (a moving average).
const UNSETTLED_WEIGHT: f64 = 1.0 / 64.0;
/// A thread's first samples start no stretch, because:
/// - the moving average is a share of nothing before it has seen about
///   `1 / UNSETTLED_WEIGHT` samples (from 0, four failed reads in a row pass the limit);
/// - a new thread's first reads often fail for a moment (julia's main thread, importing,
///   had 13 failed reads in its first 14 ms). A burst that outlasts the warm-up starts a
///   short stretch (see [`PAUSED_FOR_FIRST`]).
///
/// Those reads are still each read paused.
const WARM_AFTER: u32 = 64;
/// How long a thread's samples are taken paused once [`UNSETTLED_LIMIT`] is passed, before
/// trying again without. It is [`PAUSED_FOR_FIRST`], doubled for each stretch that starts
/// within [`PAUSED_FOR_MAX`] of the last one's end, up to that.
///
/// It is a time, not a count of samples. A fixed 400 samples were 2 s at 10 kHz (paused
/// samples are thinned to [`PAUSED_MAX_HZ`]) and 4 s at 100 Hz. So a burst of failed reads
/// of a few milliseconds (julia's start-up, say) took half of a 4-second run's samples at
/// 10 kHz away. A thread that keeps failing (bm_mdp's generators) starts a new stretch
/// within a few samples of each probe, and soon spends its stretches at the longest.
const PAUSED_FOR_FIRST: Duration = Duration::from_millis(20);
const PAUSED_FOR_MAX: Duration = Duration::from_millis(320);
/// At most this many paused samples a second in such a stretch, because a pause costs the target
/// tens of microseconds (see docs/benchmarks.md). The ticks between take no sample; the
/// CPU time of those ticks goes to the next sample, as at a lower rate.
pub const PAUSED_MAX_HZ: f64 = 200.0;

/// One thread's record.
#[derive(Debug, Default, Clone, Copy)]
struct Unsettled {
    /// Moving average of "its read without pausing failed".
    failed: f64,
    /// Until when its samples are taken paused.
    until: Option<Instant>,
    /// Samples of it taken so far (up to [`WARM_AFTER`]).
    seen: u32,
    /// The length of its last stretch.
    last_for: Duration,
}

impl Unsettled {
    /// Its samples at `now` are taken paused.
    fn paused_at(&self, now: Instant) -> bool {
        self.until.is_some_and(|t| now < t)
    }
}

/// Per thread (by `thread_id`): the recent share of its samples whose read without pausing
/// failed, and how many of its samples are still to be taken paused.
#[derive(Debug, Default)]
pub(crate) struct PauseSchedule {
    threads: IdMap<u64, Unsettled>,
    /// When the last sample with a thread in a paused stretch was taken.
    last_paused: Option<Instant>,
    /// The latest end of a stretch so far. Past it no thread is in one, and a sample
    /// looks at none of the records (a thousand threads at rest have one each).
    stretches_end: Option<Instant>,
}

impl PauseSchedule {
    pub(crate) fn new() -> PauseSchedule {
        PauseSchedule::default()
    }

    /// The threads whose sample at `now` is to be read paused without a try first.
    pub(crate) fn pause_these(&self, now: Instant) -> Vec<u64> {
        if self.stretches_end.is_none_or(|end| now >= end) {
            return Vec::new();
        }
        self.threads
            .iter()
            .filter(|(_, u)| u.paused_at(now))
            .map(|(&id, _)| id)
            .collect()
    }

    /// Whether the tick at `now` takes no sample. It takes none when it would pause
    /// (`pausing`) sooner than [`PAUSED_MAX_HZ`] allows after the last one that did.
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

    /// Forgets the threads for which `present` is false (gone from the process).
    pub(crate) fn retain(&mut self, present: impl Fn(u64) -> bool) {
        self.threads.retain(|&id, _| present(id));
    }

    /// Takes one sample's outcome: for each thread it read (`thread_id`, whether its read
    /// had to pause). A thread that was not read (it had not run) keeps its record.
    pub(crate) fn update(&mut self, threads: &[(u64, bool)], now: Instant) {
        for &(id, read_paused) in threads {
            let u = self.threads.entry(id).or_default();
            if u.paused_at(now) {
                continue;
            }
            u.failed += UNSETTLED_WEIGHT * (f64::from(u8::from(read_paused)) - u.failed);
            u.seen = (u.seen + 1).min(WARM_AFTER);
            if u.failed > UNSETTLED_LIMIT && u.seen >= WARM_AFTER {
                let again = u.until.is_some_and(|end| now < end + PAUSED_FOR_MAX);
                let length = if again {
                    (u.last_for * 2).min(PAUSED_FOR_MAX)
                } else {
                    PAUSED_FOR_FIRST
                };
                *u = Unsettled {
                    failed: 0.0,
                    until: Some(now + length),
                    seen: u.seen,
                    last_for: length,
                };
                let end = now + length;
                self.stretches_end = Some(self.stretches_end.map_or(end, |e| e.max(end)));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_that_keep_failing_start_a_paused_stretch_for_that_thread_only() {
        let mut s = PauseSchedule::new();
        let t0 = Instant::now();
        let tick = Duration::from_millis(1);
        // Thread 1 reads cleanly; thread 2's reads fail one in ten (over the 5% limit).
        let mut i = 0u32;
        let (mut now, mut started) = (t0, t0);
        while s.pause_these(now).is_empty() {
            s.update(&[(1, false), (2, i.is_multiple_of(10))], now);
            started = now;
            i += 1;
            now += tick;
            assert!(i < 1000, "no stretch after {i} samples");
        }
        assert_eq!(s.pause_these(now), vec![2]);
        // The stretch lasts PAUSED_FOR_FIRST from the sample that started it, however many
        // samples it holds, then the thread is probed again.
        let end = started + PAUSED_FOR_FIRST;
        while now + tick < end {
            now += tick;
            assert_eq!(
                s.pause_these(now),
                vec![2],
                "{:?} into the stretch",
                now - t0
            );
            s.update(&[(1, false), (2, true)], now);
        }
        assert!(
            s.pause_these(end).is_empty(),
            "stretch past {PAUSED_FOR_FIRST:?}"
        );
        // A thread that still fails starts a new stretch within a few samples, each twice
        // as long as the last, up to PAUSED_FOR_MAX.
        now = end;
        let mut lengths = Vec::new();
        for _ in 0..6 {
            let mut probes = 0;
            while s.pause_these(now).is_empty() {
                s.update(&[(1, false), (2, true)], now);
                started = now;
                probes += 1;
                now += tick;
                assert!(probes < 10, "no new stretch after {probes} failed probes");
            }
            let mut ms = 0;
            while !s.pause_these(now).is_empty() {
                now += tick;
                ms += 1;
            }
            lengths.push(ms);
            assert_eq!(now - started, Duration::from_millis(ms + 1));
        }
        assert_eq!(lengths, [39, 79, 159, 319, 319, 319]);
        // Readable again for longer than the longest stretch, so the next one is short.
        for _ in 0..400 {
            s.update(&[(1, false), (2, false)], now);
            now += tick;
        }
        while s.pause_these(now).is_empty() {
            s.update(&[(1, false), (2, true)], now);
            started = now;
            now += tick;
        }
        while !s.pause_these(now).is_empty() {
            now += tick;
        }
        assert_eq!(now - started, PAUSED_FOR_FIRST);
    }

    #[test]
    fn a_new_thread_s_first_failures_start_no_stretch() {
        let mut s = PauseSchedule::new();
        let now = Instant::now();
        for i in 1..WARM_AFTER {
            s.update(&[(1, true)], now);
            assert!(s.pause_these(now).is_empty(), "sample {i}");
        }
        s.update(&[(1, true)], now);
        assert_eq!(s.pause_these(now), vec![1], "still failing once warm");
    }

    #[test]
    fn rare_failures_never_pause() {
        let mut s = PauseSchedule::new();
        for i in 0..10_000u32 {
            let now = Instant::now();
            s.update(&[(1, i.is_multiple_of(50))], now);
            // One in 50 (2%). The moving average peaks near 2.9%, under the 5% limit.
            assert!(s.pause_these(now).is_empty(), "sample {i}");
        }
    }

    #[test]
    fn gone_threads_are_forgotten() {
        let mut s = PauseSchedule::new();
        let now = Instant::now();
        for _ in 0..WARM_AFTER {
            s.update(&[(1, true), (2, true)], now);
        }
        assert_eq!(s.pause_these(now).len(), 2);
        s.update(&[(1, true)], now);
        assert_eq!(s.pause_these(now).len(), 2, "a thread not read is kept");
        s.retain(|id| id == 1);
        assert_eq!(s.pause_these(now), vec![1]);
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
