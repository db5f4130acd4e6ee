//! The signals `run` and `attach` catch, noted in a bit set and handled between ticks.
//!
//! Owns: [`catch`] (the handlers, leaving alone what was ignored when we started) and
//! [`take_pending`].
//! Must not: do anything in a handler but set a bit.

use nix::sys::signal::{self, SaFlags, SigAction, SigHandler, SigSet, Signal};
use std::sync::atomic::{AtomicU64, Ordering};

/// Signals received and not yet handled, one bit per signal number.
static PENDING: AtomicU64 = AtomicU64::new(0);

extern "C" fn note_signal(sig: libc::c_int) {
    if (0..64).contains(&sig) {
        PENDING.fetch_or(1 << sig, Ordering::SeqCst);
    }
}

pub(super) fn take_pending() -> Vec<Signal> {
    let bits = PENDING.swap(0, Ordering::SeqCst);
    (1..64)
        .filter(|s| bits & (1u64 << s) != 0)
        .filter_map(|s| Signal::try_from(s).ok())
        .collect()
}

/// Catches `signals` with [`note_signal`], except those in `unless_ignored` that are ignored
/// now (as we were started). What the user ignored stays ignored, for us and for the
/// program `run` starts, which inherits it as it would without us. `nohup` ignores SIGHUP,
/// and a script's background job SIGINT and SIGQUIT. A handler of ours in their place would
/// reach the program as the default action. Under `nohup` a hang-up would have killed it,
/// and Python installs its KeyboardInterrupt handler only where SIGINT is not ignored.
pub(super) fn catch(signals: &[Signal], unless_ignored: &[Signal]) {
    let action = SigAction::new(
        SigHandler::Handler(note_signal),
        SaFlags::SA_RESTART,
        SigSet::empty(),
    );
    let keep = |s: Signal| unless_ignored.contains(&s) && ignored(s);
    for &s in signals.iter().filter(|&&s| !keep(s)) {
        // SAFETY: `note_signal` only does an atomic fetch_or, which is async-signal-safe.
        unsafe {
            let _ = signal::sigaction(s, &action);
        }
    }
}

/// Whether `s` is ignored (SIG_IGN) in this process now.
fn ignored(s: Signal) -> bool {
    // SAFETY: `struct sigaction` is plain data, for which all zeroes is a valid value.
    let mut now: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: with a null new action, sigaction only writes the current one into `now`,
    // which is valid for writes.
    let r = unsafe { libc::sigaction(s as libc::c_int, std::ptr::null(), &mut now) };
    r == 0 && now.sa_sigaction == libc::SIG_IGN
}
