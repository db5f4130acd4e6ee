//! The handshake budget: how often a thread's sampled events may wait for the profiler.
//!
//! A handshake costs the thread the profiler's answer time (see `ring::SPIN_NS`).
//! - A thread that allocates a window every few microseconds (churn of small objects, a
//!   loop of large temporary buffers) would spend most of its time waiting.
//! - Its waits, all on the allocating lines, would skew the CPU shares the sampler sees.
//! - So a thread earns one handshake per HANDSHAKE_PERIOD_NS of time, banking at most
//!   HANDSHAKE_BANK of them.
//! - An event that finds none left is sent without waiting. The profiler ties it to the
//!   stack of the thread's latest handshake (at most a few milliseconds old in such a
//!   stretch).
//! - Counting handshakes, not their time, keeps what gets a handshake independent of how
//!   fast the profiler answers.
//!
//! Large blocks have an account of their own.
//! - An event whose window was filled by one block of at least a window (a large buffer,
//!   an array) draws on a second account of the same terms (`credit_large`).
//! - With one account, a loop churning small objects spent it all. A line allocating 8 MiB
//!   blocks beside that loop was charged 27-99% of its bytes; the rest went to the churning
//!   line's latest handshake (issue 39).
//! - Its own account gives such a block a stack of its own, unless large blocks alone come
//!   faster than one per period after a bank of them. Then they get the stack of the
//!   thread's latest large one, and the report says how much that was.
//!
//! Owns: the accounts' terms ([`HANDSHAKE_PERIOD_NS`], [`HANDSHAKE_BANK`]) and their
//! bookkeeping.
//!
//! Must not: allocate, or read the clock more than once per event.

use crate::layout;
use core::cell::Cell;

/// One handshake earned per 5 ms, so at most 200 a second once the bank is spent (1–3% of
/// the thread's time at the answer times above).
const HANDSHAKE_PERIOD_NS: i64 = 5_000_000;
/// Handshakes banked while the thread allocates little, for a burst of this many exact events
/// (a program building its data, a worker starting up) after a quiet spell.
const HANDSHAKE_BANK: i64 = 256;

/// Whether this event may wait for the profiler's answer. It may when the thread's account
/// (`credit` as of `at`), credited for the time since it was last updated, holds a
/// handshake.
pub(crate) fn handshake_allowed(credit: &Cell<i64>, at: &Cell<u64>) -> bool {
    handshake_allowed_at(credit, at, layout::now_ns())
}

/// [`handshake_allowed`] at monotonic time `now` (ns, > 0).
fn handshake_allowed_at(credit: &Cell<i64>, at: &Cell<u64>, now: u64) -> bool {
    const FULL: i64 = HANDSHAKE_BANK * HANDSHAKE_PERIOD_NS;
    let last = at.get();
    let c = if last == 0 {
        FULL
    } else {
        let earned = now.saturating_sub(last).min(FULL as u64) as i64;
        credit.get().saturating_add(earned).min(FULL)
    };
    credit.set(c);
    at.set(now);
    c >= HANDSHAKE_PERIOD_NS
}

/// Charges an answered handshake to the account `credit`.
pub(crate) fn spend(credit: &Cell<i64>, answered: bool) {
    if answered {
        credit.set(credit.get() - HANDSHAKE_PERIOD_NS);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tls::ThreadState;

    fn fresh_thread() -> ThreadState {
        // SAFETY: all-zero is a ThreadState's initial state (Cells of integers and a bool).
        unsafe { core::mem::zeroed() }
    }

    #[test]
    fn the_handshake_budget_banks_a_burst_then_allows_one_per_period() {
        let t = fresh_thread();
        let start = 1_000_000_000u64;
        // A burst at one instant: the whole bank, then nothing.
        let mut granted = 0;
        while handshake_allowed_at(&t.credit, &t.credit_at, start) {
            spend(&t.credit, true);
            granted += 1;
            assert!(granted <= HANDSHAKE_BANK, "the bank never runs out");
        }
        assert_eq!(granted, HANDSHAKE_BANK);
        // Unanswered waits cost nothing.
        spend(&t.credit, false);
        assert!(!handshake_allowed_at(&t.credit, &t.credit_at, start + 1));
        // Then one per period, however often the thread asks.
        let mut now = start;
        let mut granted = 0;
        for _ in 0..1000 {
            now += HANDSHAKE_PERIOD_NS as u64 / 10;
            if handshake_allowed_at(&t.credit, &t.credit_at, now) {
                spend(&t.credit, true);
                granted += 1;
            }
        }
        assert_eq!(granted, 100, "1000 asks over 100 periods");
        // A long quiet spell refills the bank, no more.
        now += 3600 * 1_000_000_000;
        let mut granted = 0;
        while handshake_allowed_at(&t.credit, &t.credit_at, now) {
            spend(&t.credit, true);
            granted += 1;
        }
        assert_eq!(granted, HANDSHAKE_BANK);
    }

    /// A churn of small objects that spends the thread's handshakes leaves those of its
    /// large blocks (at least a window each) untouched, because they have an account of
    /// their own.
    #[test]
    fn a_churn_of_small_objects_never_spends_the_large_blocks_handshakes() {
        let t = fresh_thread();
        let mut now = 1_000_000_000u64;
        while handshake_allowed_at(&t.credit, &t.credit_at, now) {
            spend(&t.credit, true);
            now += 1000;
        }
        let mut large = 0;
        for _ in 0..24 {
            assert!(!handshake_allowed_at(&t.credit, &t.credit_at, now));
            if handshake_allowed_at(&t.credit_large, &t.credit_large_at, now) {
                spend(&t.credit_large, true);
                large += 1;
            }
            now += 1000;
        }
        assert_eq!(large, 24);
    }
}
