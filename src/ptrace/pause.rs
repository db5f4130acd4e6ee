//! Pausing every thread of a process for a consistent snapshot.
//!
//! Owns: [`PausedThreads`], which seizes each thread with `PTRACE_SEIZE`, stops it with
//! `PTRACE_INTERRUPT` (no SIGSTOP is sent, so the target sees no signal), and detaches in
//! `Drop`, always, also on error and on panic. While threads are paused, SIGINT / SIGTERM /
//! SIGHUP / SIGQUIT are blocked in the profiler, so Ctrl-C is handled after the threads run
//! again. If the profiler is killed (SIGKILL) the kernel detaches and resumes every tracee.
//! A signal that arrives for a thread while it is stopped is handed back on detach.
//!
//! One profiler thread at a time holds threads stopped ([`with_turn`]): the sampler, or a
//! memory reader stopping the one thread that waits in the handshake (`run --native`).
//!
//! A thread's ptrace stops are reported to a wait by *any* thread of the tracer's process.
//! So a sampler's wait for the program's exit (or a reaping of dead threads) could take the
//! stop report that another profiler thread's pause is waiting for. That pause would wait
//! forever with the target's thread stopped. That is why waits on the program's threads
//! take the same turn.
//!
//! Must not: be used from more than one OS thread of the profiler at once for the same
//! pause (ptrace requests must come from the thread that attached).

use crate::error::{Error, Result};
use nix::sys::ptrace;
use nix::sys::signal::{SigSet, SigmaskHow, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

/// One seized thread and the signal to hand back when detaching.
struct Seized {
    tid: Pid,
    pending: Option<Signal>,
}

/// Every thread of the process, stopped until this value is dropped.
pub(crate) struct PausedThreads {
    seized: Vec<Seized>,
    old_mask: Option<SigSet>,
    /// Held until every thread is let go and reaped (dropped after `Drop::drop` runs).
    _turn: Turn,
    /// The normal scheduling policy for a sampler that otherwise gives way to the program
    /// (see `courtesy`), from before the first thread stops until the last is let go.
    _stand: crate::courtesy::Stand,
}

/// The profiler's one turn at stopping threads and waiting for their reports (see the
/// module's doc).
static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());

thread_local! {
    /// This thread's hold on [`TURN`] and how many [`Turn`]s share it. A thread that
    /// holds the turn may take it again (a pause inside a wait's turn) without deadlock.
    static HELD: std::cell::RefCell<(usize, Option<std::sync::MutexGuard<'static, ()>>)> =
        const { std::cell::RefCell::new((0, None)) };
}

/// A hold on the turn, given back when the last one of this thread drops.
struct Turn;

impl Turn {
    fn take() -> Turn {
        HELD.with(|h| {
            let mut h = h.borrow_mut();
            if h.0 == 0 {
                // A thread that panicked holding it held nothing the turn protects.
                h.1 = Some(TURN.lock().unwrap_or_else(|e| e.into_inner()));
            }
            h.0 += 1;
        });
        Turn
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        HELD.with(|h| {
            let mut h = h.borrow_mut();
            h.0 -= 1;
            if h.0 == 0 {
                h.1 = None;
            }
        });
    }
}

/// Runs `f` (a wait for, or a reaping of, the target's threads) in the profiler's turn, so
/// no other profiler thread holds threads stopped meanwhile (see the module's doc).
pub(crate) fn with_turn<T>(f: impl FnOnce() -> T) -> T {
    let _turn = Turn::take();
    f()
}

pub(crate) fn termination_signals() -> SigSet {
    let mut s = SigSet::empty();
    for sig in [
        Signal::SIGINT,
        Signal::SIGTERM,
        Signal::SIGHUP,
        Signal::SIGQUIT,
    ] {
        s.add(sig);
    }
    s
}

impl PausedThreads {
    /// Stops exactly the threads `tids` of `pid` (threads that exit meanwhile are skipped).
    /// It is for re-reading one thread's own stack, which only that thread changes. Other
    /// threads run on, and the thread list is not read again.
    pub(crate) fn pause_threads(pid: i32, tids: &[i32]) -> Result<PausedThreads> {
        let mut paused = PausedThreads::new_masked();
        for &tid in tids {
            paused.seize_one(pid, tid)?;
        }
        if paused.seized.is_empty() {
            return Err(paused.none_paused(pid));
        }
        Ok(paused)
    }

    /// Stops every thread of `pid`, starting with threads the caller has just listed (it
    /// saves listing them again). Threads that appear while we stop the others are stopped
    /// too (the thread list is still read again until it is stable); threads that exit
    /// meanwhile are skipped.
    pub(crate) fn pause_from(pid: i32, known: &[i32]) -> Result<PausedThreads> {
        let mut paused = PausedThreads::new_masked();
        // Drop (detach + unmask) runs if anything below returns early.
        for round in 0..8 {
            let tids = if round == 0 && !known.is_empty() {
                known.to_vec()
            } else {
                crate::proc::threads(pid)?
            };
            let mut new = 0;
            for tid in tids {
                if paused.seized.iter().any(|s| s.tid.as_raw() == tid) {
                    continue;
                }
                new += 1;
                paused.seize_one(pid, tid)?;
            }
            if new == 0 && (round > 0 || known.is_empty()) {
                break;
            }
        }
        if paused.seized.is_empty() {
            return Err(paused.none_paused(pid));
        }
        Ok(paused)
    }

    /// The kernel ids of the threads held stopped, in the order they were stopped.
    pub(crate) fn tids(&self) -> Vec<i32> {
        self.seized.iter().map(|s| s.tid.as_raw()).collect()
    }

    /// The general-purpose registers of `tid`, one of the threads this pause holds
    /// (`PTRACE_GETREGS`). They say where it stands, for unwinding its native stack.
    #[cfg(target_arch = "x86_64")]
    pub(crate) fn registers(&self, pid: i32, tid: i32) -> Result<libc::user_regs_struct> {
        if !self.seized.iter().any(|s| s.tid.as_raw() == tid) {
            return Err(Error::BadState {
                pid,
                why: format!("thread {tid} is not held by this pause"),
            });
        }
        ptrace::getregs(Pid::from_raw(tid)).map_err(|e| match e {
            nix::errno::Errno::ESRCH if !crate::proc::process_exists(pid) => {
                Error::ProcessExited(pid)
            }
            e => crate::proc::os_error(
                pid,
                &format!("PTRACE_GETREGS of thread {tid}"),
                std::io::Error::from_raw_os_error(e as i32),
            ),
        })
    }

    /// Nothing seized yet, with the termination signals blocked until drop.
    fn new_masked() -> PausedThreads {
        let stand = crate::courtesy::Stand::take();
        let mut old = SigSet::empty();
        // Blocking signals cannot fail with a valid set; if it does, go on unblocked.
        let old_mask = nix::sys::signal::pthread_sigmask(
            SigmaskHow::SIG_BLOCK,
            Some(&termination_signals()),
            Some(&mut old),
        )
        .ok()
        .map(|_| old);
        PausedThreads {
            seized: Vec::new(),
            old_mask,
            _turn: Turn::take(),
            _stand: stand,
        }
    }

    /// The error when no thread could be paused.
    fn none_paused(&self, pid: i32) -> Error {
        if crate::proc::process_exists(pid) {
            Error::BadState {
                pid,
                why: "no thread could be paused".into(),
            }
        } else {
            Error::ProcessExited(pid)
        }
    }

    fn seize_one(&mut self, pid: i32, tid: i32) -> Result<()> {
        let t = Pid::from_raw(tid);
        match ptrace::seize(t, ptrace::Options::empty()) {
            Ok(()) => {}
            // The thread exited between listing and seizing.
            Err(nix::errno::Errno::ESRCH) => return Ok(()),
            Err(nix::errno::Errno::EPERM) => {
                return Err(if crate::proc::process_exists(pid) {
                    crate::proc::permission_denied(pid, "pausing its threads with ptrace")
                } else {
                    Error::ProcessExited(pid)
                });
            }
            Err(e) => {
                return Err(crate::proc::os_error(
                    pid,
                    "PTRACE_SEIZE",
                    std::io::Error::from_raw_os_error(e as i32),
                ))
            }
        }
        let mut entry = Seized {
            tid: t,
            pending: None,
        };
        if let Err(e) = ptrace::interrupt(t) {
            // Still seized: remember it so Drop detaches it.
            self.seized.push(entry);
            if e == nix::errno::Errno::ESRCH {
                return Ok(());
            }
            return Err(crate::proc::os_error(
                pid,
                "PTRACE_INTERRUPT",
                std::io::Error::from_raw_os_error(e as i32),
            ));
        }
        // Wait until it is stopped. A signal-delivery-stop may come first, and then that thread
        // is stopped as well. Remember the signal so it is delivered when we detach.
        loop {
            // Peek first (WNOWAIT). If the thread exited, its exit belongs to whoever waits
            // for the process (for `run`, our own child's status). So it must not be reaped
            // here when it is the thread-group leader.
            match peek_exit(t) {
                Ok(true) => {
                    if tid != pid || !is_our_child(t) {
                        // A non-leader thread: reap it so no zombie thread lingers. A
                        // leader that is not our child: reaping it as its tracer hands its
                        // exit on to its parent, which otherwise waits for it forever (a
                        // multiprocessing worker that exited in a pause hung its parent's
                        // join, fixtures/memory/mp_keep.py on 3.6).
                        let _ = waitpid(t, Some(WaitPidFlag::__WALL));
                    }
                    return Ok(());
                }
                Ok(false) => {}
                Err(nix::errno::Errno::EINTR) => continue,
                Err(nix::errno::Errno::ECHILD) => return Ok(()),
                Err(e) => {
                    self.seized.push(entry);
                    return Err(crate::proc::os_error(
                        pid,
                        "waiting for a paused thread",
                        std::io::Error::from_raw_os_error(e as i32),
                    ));
                }
            }
            match waitpid(t, Some(WaitPidFlag::__WALL)) {
                Ok(WaitStatus::PtraceEvent(..)) | Ok(WaitStatus::PtraceSyscall(_)) => break,
                Ok(WaitStatus::Stopped(_, sig)) => {
                    entry.pending = Some(sig);
                    break;
                }
                Ok(WaitStatus::Exited(..)) | Ok(WaitStatus::Signaled(..)) => return Ok(()),
                Ok(_) => continue,
                Err(nix::errno::Errno::EINTR) => continue,
                Err(nix::errno::Errno::ECHILD) => return Ok(()),
                Err(e) => {
                    self.seized.push(entry);
                    return Err(crate::proc::os_error(
                        pid,
                        "waiting for a paused thread",
                        std::io::Error::from_raw_os_error(e as i32),
                    ));
                }
            }
        }
        self.seized.push(entry);
        Ok(())
    }
}

/// Waits until `tid` has an event and says whether it is an exit, without consuming it.
fn peek_exit(tid: Pid) -> std::result::Result<bool, nix::errno::Errno> {
    // SAFETY: an all-zero siginfo_t is a valid value for waitid to fill in.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: `info` is a valid, writable siginfo_t; the flags ask waitid not to reap.
    let r = unsafe {
        libc::waitid(
            libc::P_PID,
            tid.as_raw() as libc::id_t,
            &mut info,
            libc::WEXITED | libc::WSTOPPED | libc::WNOWAIT | libc::__WALL,
        )
    };
    if r < 0 {
        return Err(nix::errno::Errno::last());
    }
    Ok(matches!(
        info.si_code,
        libc::CLD_EXITED | libc::CLD_KILLED | libc::CLD_DUMPED
    ))
}

impl Drop for PausedThreads {
    fn drop(&mut self) {
        let mut died = Vec::new();
        for s in self.seized.drain(..) {
            // ESRCH here means the thread died (the process was killed while we held it);
            // nothing to resume, but it must be reaped, see below.
            if ptrace::detach(s.tid, s.pending) == Err(nix::errno::Errno::ESRCH) {
                died.push(s.tid);
            }
        }
        if !died.is_empty() {
            reap_died(&died);
        }
        if let Some(old) = self.old_mask.take() {
            let _ = nix::sys::signal::pthread_sigmask(SigmaskHow::SIG_SETMASK, Some(&old), None);
        }
    }
}

/// Reaps threads that exited while we traced them. A traced thread that dies stays a zombie
/// until its tracer waits for it, and while it does its process's exit cannot be reaped by
/// the parent (`run` would wait forever for its program, a shell for a process we attached
/// to). A thread-group leader that is our own child is left to our caller's wait, which
/// reaps it with its exit status once the other threads are gone. Waits at most ~200 ms
/// for a dying thread to become a zombie.
fn reap_died(tids: &[Pid]) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_millis(200);
    for &tid in tids {
        if is_our_child(tid) {
            continue;
        }
        loop {
            match waitpid(tid, Some(WaitPidFlag::__WALL | WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::StillAlive) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
                Err(nix::errno::Errno::EINTR) => {}
                _ => break,
            }
        }
    }
}

/// Whether `tid` is a process we started (its status is ours to wait for: `run`'s program).
fn is_our_child(tid: Pid) -> bool {
    crate::proc::parent(tid.as_raw()) == Some(std::process::id() as i32)
}

/// Reaps every thread of `pid` (except its leader) that died while traced by us and is
/// still waiting for us; harmless for threads we do not trace. Callers waiting for a
/// process to end call it so a thread that died in one of our pauses cannot hold the
/// process's exit back.
pub(crate) fn reap_traced_zombies(pid: i32) {
    with_turn(|| reap_traced_zombies_now(pid))
}

fn reap_traced_zombies_now(pid: i32) {
    let Ok(tids) = crate::proc::threads(pid) else {
        return;
    };
    for tid in tids {
        if tid != pid {
            let _ = waitpid(
                Pid::from_raw(tid),
                Some(WaitPidFlag::__WALL | WaitPidFlag::WNOHANG),
            );
        }
    }
}
