//! Pausing every thread of a process for a consistent snapshot.
//!
//! Owns: [`PausedThreads`], which seizes each thread with `PTRACE_SEIZE`, stops it with
//! `PTRACE_INTERRUPT` (no SIGSTOP is sent, so the target sees no signal), and detaches in
//! `Drop`, always, also on error and on panic. While threads are paused, SIGINT / SIGTERM /
//! SIGHUP / SIGQUIT are blocked in the profiler, so Ctrl-C is handled after the threads run
//! again. If the profiler is killed (SIGKILL) the kernel detaches and resumes every tracee.
//! A signal that arrives for a thread while it is stopped is handed back on detach.
//!
//! Must not: be used from more than one OS thread of the profiler (ptrace requests must come
//! from the thread that attached).

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
pub struct PausedThreads {
    seized: Vec<Seized>,
    old_mask: Option<SigSet>,
}

fn termination_signals() -> SigSet {
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
    /// Stops every thread of `pid`. Threads that appear while we stop the others are stopped
    /// too (the thread list is read again until it is stable); threads that exit meanwhile
    /// are skipped.
    pub fn pause(pid: i32) -> Result<PausedThreads> {
        let mut old = SigSet::empty();
        // Blocking signals cannot fail with a valid set; if it does, go on unblocked.
        let old_mask = nix::sys::signal::pthread_sigmask(
            SigmaskHow::SIG_BLOCK,
            Some(&termination_signals()),
            Some(&mut old),
        )
        .ok()
        .map(|_| old);
        let mut paused = PausedThreads {
            seized: Vec::new(),
            old_mask,
        };
        // Drop (detach + unmask) runs if anything below returns early.
        for _round in 0..8 {
            let tids = super::threads(pid)?;
            let mut new = 0;
            for tid in tids {
                if paused.seized.iter().any(|s| s.tid.as_raw() == tid) {
                    continue;
                }
                new += 1;
                paused.seize_one(pid, tid)?;
            }
            if new == 0 {
                break;
            }
        }
        if paused.seized.is_empty() {
            return Err(if crate::error::process_exists(pid) {
                Error::BadState {
                    pid,
                    why: "no thread could be paused".into(),
                }
            } else {
                Error::ProcessExited(pid)
            });
        }
        Ok(paused)
    }

    fn seize_one(&mut self, pid: i32, tid: i32) -> Result<()> {
        let t = Pid::from_raw(tid);
        match ptrace::seize(t, ptrace::Options::empty()) {
            Ok(()) => {}
            // The thread exited between listing and seizing.
            Err(nix::errno::Errno::ESRCH) => return Ok(()),
            Err(nix::errno::Errno::EPERM) => {
                return Err(if crate::error::process_exists(pid) {
                    crate::error::permission_denied(pid, "pausing its threads with ptrace")
                } else {
                    Error::ProcessExited(pid)
                });
            }
            Err(e) => {
                return Err(Error::from_os(
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
            return Err(Error::from_os(
                pid,
                "PTRACE_INTERRUPT",
                std::io::Error::from_raw_os_error(e as i32),
            ));
        }
        // Wait until it is stopped. A signal-delivery-stop may come first: that thread is
        // stopped as well; remember the signal so it is delivered when we detach.
        loop {
            // Peek first (WNOWAIT): if the thread exited, its exit belongs to whoever waits
            // for the process (for `run`, our own child's status), so it must not be reaped
            // here when it is the thread-group leader.
            match peek_exit(t) {
                Ok(true) => {
                    if tid != pid {
                        // A non-leader thread: reap it so no zombie thread lingers.
                        let _ = waitpid(t, Some(WaitPidFlag::__WALL));
                    }
                    return Ok(());
                }
                Ok(false) => {}
                Err(nix::errno::Errno::EINTR) => continue,
                Err(nix::errno::Errno::ECHILD) => return Ok(()),
                Err(e) => {
                    self.seized.push(entry);
                    return Err(Error::from_os(
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
                    return Err(Error::from_os(
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

    /// Number of threads stopped.
    pub fn len(&self) -> usize {
        self.seized.len()
    }

    pub fn is_empty(&self) -> bool {
        self.seized.is_empty()
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
        for s in self.seized.drain(..) {
            // ESRCH here means the thread died; nothing to resume.
            let _ = ptrace::detach(s.tid, s.pending);
        }
        if let Some(old) = self.old_mask.take() {
            let _ = nix::sys::signal::pthread_sigmask(SigmaskHow::SIG_SETMASK, Some(&old), None);
        }
    }
}
