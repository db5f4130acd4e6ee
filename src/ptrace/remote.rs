//! Calling a function inside the target.
//!
//! One of its threads, stopped where it holds no lock, is made to call a C function of our
//! choosing. Then it is put back exactly as it was. `attach` with memory uses this twice:
//! - to have the C library's `dlopen` load our library into a process started without it;
//! - to call the library's attach entry point.
//!
//! Owns: [`Hijacked`], which is
//! - the choice of a thread at a safe point;
//! - saving and restoring its registers and its vector state (the XSAVE area, because a
//!   called function clobbers xmm/ymm, which an interrupted thread may hold live);
//! - the call itself, and the detach.
//!
//! A safe point is a thread blocked in a system call that waits without holding a C-library
//! lock:
//! - a condition-variable, semaphore or join wait (futex `FUTEX_WAIT_BITSET`; glibc uses it
//!   for those and for the GIL, never for its internal locks, which wait with `FUTEX_WAIT`);
//! - sleep, poll, select, epoll, wait4, pause, sigsuspend, accept.
//!
//! A thread interrupted anywhere else may hold the allocator's arena lock or the loader's
//! lock. The call would then deadlock the process for good. Only the chosen thread is
//! stopped. The others run on, so that a lock one of them holds is released while the call
//! waits for it.
//!
//! Where no thread waits (one thread that only computes), the thread is caught in code the
//! caller names ([`Hijacked::in_code`]).
//! - The caller names the interpreter's own code, where no C-library lock is held
//!   (`memory/inject.rs` says why).
//! - The thread is found there by stopping it with PTRACE_INTERRUPT now and then.
//! - Such a stop is no signal. A profiler that dies with the thread stopped, or between two
//!   stops, leaves it to run on.
//! - Its way back is the trampoline's second listing. It puts every register back where
//!   the thread was, also in the middle of a function.
//!
//! Why not a breakpoint (measured here):
//! - Debug registers set with PTRACE_POKEUSER stay armed after the tracer detaches or dies.
//!   On Linux 6.18 the thread died of SIGTRAP at its next pass.
//! - A perf-event breakpoint goes with its descriptor, but still stops the thread with a
//!   SIGTRAP. That kills the process when its tracer dies before collecting the stop; the
//!   kill test hit that window.
//!
//! The kernel restarts an interrupted system call by looking at the registers a thread
//! resumes with. The call runs with `orig_rax = -1`, so that it does not.
//!
//! The way back needs no tracer. The function returns into our trampoline
//! (`trampoline.rs`). It puts every register and the vector state back, and restarts the
//! thread's wait (or resumes its code) by itself. So a profiler SIGKILLed mid-call, or one
//! that gives up on a call that takes too long, leaves the thread as if nothing happened.
//! - Everything the way back needs is written before the thread is let run. From the moment
//!   its registers are ours, it returns by itself.
//! - Between two calls the thread is stopped again in its wait (or in the trampoline's
//!   short wait, and set back where it was).
//!
//! Must not:
//! - stop the target longer than the call takes;
//! - leave a thread with anything of ours (registers, a pending signal swallowed);
//! - write stack bytes anywhere but below the red zone (memory a thread does not own until
//!   it grows its stack there).

mod catch;

use crate::error::{Error, Result};
use nix::sys::ptrace;
use nix::sys::signal::{SigSet, SigmaskHow, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use std::time::{Duration, Instant};

/// x86-64 system calls a thread may be hijacked in (see the module's doc).
const SAFE_SYSCALLS: &[i64] = &[
    7,   // poll
    23,  // select
    34,  // pause
    35,  // nanosleep
    43,  // accept
    61,  // wait4
    130, // rt_sigsuspend
    202, // futex (FUTEX_WAIT_BITSET only, see `safe_wait`)
    230, // clock_nanosleep
    232, // epoll_wait
    270, // pselect6
    271, // ppoll
    281, // epoll_pwait
    288, // accept4
    441, // epoll_pwait2
];
const SYS_FUTEX: i64 = 202;
const FUTEX_WAIT_BITSET: u64 = 9;
/// The kernel's "restart this system call" results, seen in `rax` of a thread stopped in one.
const RESTART_RESULTS: &[i64] = &[-4, -512, -513, -514, -516];
/// `NT_X86_XSTATE`: the regset of the XSAVE area.
const NT_X86_XSTATE: libc::c_int = 0x202;
/// Room for the XSAVE area (11 KiB with AVX-512; the kernel says how much it filled).
const XSTATE_BYTES: usize = 64 * 1024;
/// Longest a call may take before we stop waiting for it. The thread comes back by itself
/// whenever it returns (see the trampoline).
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// `SCALENE_RS_TEST_STALL_CALL=patched|stopped|before|after`: tests only. Stalls the
/// profiler for a minute, saying so on stderr, so that a test can kill it at the worst
/// moment on purpose. It stalls:
/// - `patched`: once a computing thread runs with a return address of its stack replaced
///   (it goes on until its callee returns into our catch code);
/// - `stopped`: once it is stopped inside the interpreter;
/// - `before`: just before the thread is let run into a call (the thread stopped with the
///   call's registers set);
/// - `after`: just after the thread is let run into a call.
const STALL_ENV: &str = "SCALENE_RS_TEST_STALL_CALL";

/// Whether a thread blocked in system call `nr` with first two arguments `a0`, `a1` waits
/// without holding a C-library lock.
fn safe_wait(nr: i64, a1: u64) -> bool {
    SAFE_SYSCALLS.contains(&nr) && (nr != SYS_FUTEX || a1 & 0x7f == FUTEX_WAIT_BITSET)
}

/// Whether a thread of `pid` is blocked, now, in one of the waits [`Hijacked::find`] can use
/// (read from /proc without stopping anything).
pub(crate) fn waiting_thread(pid: i32) -> bool {
    crate::proc::threads(pid)
        .unwrap_or_default()
        .into_iter()
        .any(|tid| in_usable_wait(pid, tid))
}

/// The thread of `pid` to stop inside the interpreter's code when none waits, at the
/// `nth` look:
/// - the running threads in turn, the main thread first (the one holding the GIL is among
///   them, in a program of one computing thread; others may be running C code);
/// - the main thread when none runs now.
pub(crate) fn computing_thread(pid: i32, nth: usize) -> i32 {
    let mut tids = crate::proc::threads(pid).unwrap_or_default();
    tids.sort_by_key(|&t| t != pid);
    let running: Vec<i32> = tids
        .into_iter()
        .filter(|&t| crate::proc::thread_state(pid, t) == Some('R'))
        .collect();
    if running.is_empty() {
        return pid;
    }
    running[nth % running.len()]
}

/// Whether thread `tid` of `pid` runs without a shadow stack (x86 CET), on which a
/// replaced return address would fault. Its /proc status names the features it has
/// enabled (a kernel without them says nothing, which reads as none).
fn shadow_stack_off(pid: i32, tid: i32) -> bool {
    let status =
        std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status")).unwrap_or_default();
    !status
        .lines()
        .filter(|l| l.starts_with("x86_Thread_features:"))
        .any(|l| l.split_whitespace().any(|w| w == "shstk"))
}

/// Whether thread `tid` of `pid` is blocked in one of [`SAFE_SYSCALLS`] now (from /proc).
fn in_usable_wait(pid: i32, tid: i32) -> bool {
    crate::proc::blocked_syscall(pid, tid).is_some_and(|(nr, _)| SAFE_SYSCALLS.contains(&nr))
}

/// Where the hijacked thread is.
#[derive(Debug, Clone, Copy, PartialEq)]
enum State {
    /// Stopped in its safe wait; `regs` and `xstate` are its own.
    Parked,
    /// Stopped inside a call that went wrong (a fault). `regs`/`xstate` are put back on drop.
    Faulted,
    /// Not usable: running on its own (back from a call and out of its wait, a call given
    /// up on) or stopped where it cannot be used. Let go on drop.
    Released,
}

/// A thread of the target stopped at a safe point, its state saved; put back as it was and
/// let go on drop.
pub(crate) struct Hijacked {
    pid: i32,
    tid: Pid,
    regs: libc::user_regs_struct,
    xstate: Vec<u8>,
    old_mask: Option<SigSet>,
    state: State,
    /// Where our trampoline is in the process, once written.
    trampoline: Option<u64>,
    /// How the thread was stopped, and so how it is put back.
    way: Way,
}

/// Where a hijacked thread was stopped.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Way {
    /// In a system call that waits. Put back by restarting it ([`super::trampoline::CODE`]).
    Wait,
    /// Anywhere outside a system call (a computing thread, interrupted inside the
    /// interpreter's code). Put back with every register as it was
    /// ([`super::trampoline::RESUME_CODE`]). Between two calls it is stopped in the
    /// trampoline's short wait and set back where it was.
    Running,
}

impl Hijacked {
    /// Stops a thread of `pid` blocked at a safe point, in one pass over its threads, without
    /// waiting. The caller tries again later, because it is the sampler's thread, which must
    /// not stall. None when no thread is at a safe point now.
    pub(crate) fn find(pid: i32) -> Result<Option<Hijacked>> {
        let mut tids = crate::proc::threads(pid)?;
        // The main thread first, because its waits are usually the program's own (a join, a
        // sleep, a select loop).
        tids.sort_by_key(|&t| t != pid);
        for tid in tids.into_iter().filter(|&t| in_usable_wait(pid, t)) {
            if let Some(h) = Hijacked::stop(pid, tid)? {
                return Ok(Some(h));
            }
        }
        Ok(None)
    }

    /// Seizes and stops `tid`. Some when it is stopped in a safe wait (checked again on its
    /// registers, because it may have left the wait before the stop); else it is let go.
    fn stop(pid: i32, tid: i32) -> Result<Option<Hijacked>> {
        let Some(mut h) = Hijacked::seize(pid, tid, Way::Wait)? else {
            return Ok(None);
        };
        Ok(h.park().then_some(h))
    }

    /// Seizes `tid` without stopping it (None when it is gone). Let go on drop.
    fn seize(pid: i32, tid: i32, way: Way) -> Result<Option<Hijacked>> {
        let t = Pid::from_raw(tid);
        match ptrace::seize(t, ptrace::Options::empty()) {
            Ok(()) => {}
            Err(nix::errno::Errno::ESRCH) => return Ok(None),
            Err(nix::errno::Errno::EPERM) => {
                return Err(crate::proc::permission_denied(
                    pid,
                    "loading the memory library into it with ptrace",
                ))
            }
            Err(e) => {
                return Err(crate::proc::os_error(
                    pid,
                    "PTRACE_SEIZE",
                    std::io::Error::from_raw_os_error(e as i32),
                ))
            }
        }
        Ok(Some(Hijacked {
            pid,
            tid: t,
            // SAFETY: an all-zero register set is a valid value; replaced once stopped.
            regs: unsafe { std::mem::zeroed() },
            xstate: Vec::new(),
            old_mask: block_termination_signals(),
            state: State::Released,
            trampoline: None,
            way,
        }))
    }

    /// Stops thread `tid` of `pid`, which computes, inside the interpreter's own code. That is
    /// one of the `ranges` of code (AVMA start, length) where a thread holds no C-library lock
    /// (the caller's choice). It tries for at most `wait`. None when it could not be (it runs
    /// on as it was).
    ///
    /// Two ways, both without a signal (a profiler that dies meanwhile just lets it run on):
    /// - it is stopped with PTRACE_INTERRUPT now and then, until one stop finds it there,
    ///   outside a system call;
    /// - a stop that finds it elsewhere (the C library, the kernel) asks `returns` where its
    ///   stack returns into that code. The caller unwinds it and gives the slot of the
    ///   innermost such return address, and the address. That return address is replaced, so
    ///   that the thread is caught on its way back (`catch.rs`). This is done once per call. A
    ///   thread whose callee does not return within `wait` (from then) is put back as it was.
    pub(crate) fn in_code(
        pid: i32,
        tid: i32,
        ranges: &[(u64, u64)],
        wait: Duration,
        returns: &mut dyn FnMut(&libc::user_regs_struct) -> Option<(u64, u64)>,
    ) -> Result<Option<Hijacked>> {
        use catch::{Patch, Progress};
        let Some(mut h) = Hijacked::seize(pid, tid, Way::Running)? else {
            return Ok(None);
        };
        let mut deadline = Instant::now() + wait;
        let mut patch: Option<Patch> = None;
        let mut patched_once = false;
        // Tests only: a test that stalls us with a return address replaced has the thread
        // caught that way, not stopped inside the code now and then.
        let stops_count = std::env::var(STALL_ENV).map_or(true, |v| v != "patched");
        loop {
            if !h.interrupt() {
                return Ok(None);
            }
            let regs = ptrace::getregs(h.tid).map_err(|e| h.os("PTRACE_GETREGS", e))?;
            let inside = ranges
                .iter()
                .any(|&(at, len)| regs.rip.wrapping_sub(at) < len);
            let mut found = None;
            match patch.as_ref().map(|p| p.progress(pid, &regs)) {
                Some(Progress::Waiting) => {
                    let p = patch.take().expect("a patch");
                    found = p.caught(&mut h, &regs);
                    if found.is_none() {
                        // It goes on through the copy by itself.
                        return Ok(None);
                    }
                }
                Some(Progress::Gone) => {
                    // Returned through the copy and on (we looked too late), or its
                    // stack went elsewhere, so the copy is free again.
                    patch.take().expect("a patch").undo(&h, &regs);
                }
                Some(Progress::OnItsWay | Progress::Leaving) => {}
                // Outside a system call (there orig_rax is the call's number).
                None if stops_count && inside && regs.orig_rax as i64 == -1 => found = Some(regs),
                None if !patched_once && shadow_stack_off(pid, tid) => {
                    patched_once = true;
                    if let Some((slot, ret)) = returns(&regs) {
                        patch = Patch::make(&mut h, slot, ret)?;
                        // The callee gets the whole wait to return, from now (the unwinding
                        // took some of it).
                        deadline = deadline.max(Instant::now() + wait);
                    }
                }
                None => {}
            }
            if let Some(regs) = found {
                let Some(x) = get_xstate(h.tid) else {
                    return Ok(None);
                };
                h.regs = regs;
                h.xstate = x;
                h.state = State::Parked;
                h.stall_for_tests("stopped");
                return Ok(Some(h));
            }
            if Instant::now() >= deadline {
                // Put back as it was, and let go from this stop (a detach needs the thread
                // stopped).
                if let Some(p) = patch {
                    p.undo(&h, &regs);
                }
                return Ok(None);
            }
            ptrace::cont(h.tid, None).map_err(|e| h.os("PTRACE_CONT", e))?;
            if patch.is_some() {
                h.stall_for_tests("patched");
                // Its callee returns within microseconds, usually (a memset, a page fault).
                std::thread::sleep(Duration::from_micros(100));
            } else {
                // Not in step with anything the thread repeats.
                std::thread::sleep(Duration::from_micros(300 + (regs.rip & 0x1ff)));
            }
        }
    }

    /// Stops the (seized, running) thread with PTRACE_INTERRUPT. True once it is stopped
    /// there. A signal's delivery stop that comes first is let through with its signal and
    /// the interrupt's stop awaited.
    fn interrupt(&mut self) -> bool {
        if ptrace::interrupt(self.tid).is_err() {
            return false;
        }
        loop {
            match waitpid(self.tid, Some(WaitPidFlag::__WALL)) {
                Ok(WaitStatus::PtraceEvent(..)) => return true,
                Ok(WaitStatus::Stopped(_, sig)) => {
                    if ptrace::cont(self.tid, Some(sig)).is_err() {
                        return false;
                    }
                }
                Err(nix::errno::Errno::EINTR) => {}
                _ => return false,
            }
        }
    }

    /// Stops the (seized) thread and checks it is in a safe wait, its registers and vector
    /// state saved. Then it is Parked. Else it returns false, and the thread is let go:
    /// - with the signal it was stopping for, if any, here;
    /// - else on drop.
    fn park(&mut self) -> bool {
        let t = self.tid;
        self.state = State::Released;
        if ptrace::interrupt(t).is_err() {
            return false;
        }
        // The interrupt's stop, or a signal's delivery stop first (then the thread is not
        // where we want it, so let it go with its signal).
        loop {
            match waitpid(t, Some(WaitPidFlag::__WALL)) {
                Ok(WaitStatus::PtraceEvent(..)) => break,
                Ok(WaitStatus::Stopped(_, sig)) => {
                    let _ = ptrace::detach(t, Some(sig));
                    return false;
                }
                Err(nix::errno::Errno::EINTR) => continue,
                _ => return false,
            }
        }
        let Ok(regs) = ptrace::getregs(t) else {
            return false;
        };
        let interrupted_wait = RESTART_RESULTS.contains(&(regs.rax as i64))
            && safe_wait(regs.orig_rax as i64, regs.rsi);
        let xstate = if interrupted_wait {
            get_xstate(t)
        } else {
            None
        };
        match xstate {
            Some(x) => {
                self.regs = regs;
                self.xstate = x;
                self.state = State::Parked;
                true
            }
            // Not in a usable wait, so let go as it is (on drop, or at the next park).
            None => false,
        }
    }

    /// Calls `func(args...)` (at most 6 integer arguments) in the thread, with `data`
    /// copied onto its stack first. `args` may name bytes of `data` as [`DATA`]` + offset`.
    /// Returns the function's `rax`.
    ///
    /// The thread returns through our trampoline, which puts it back in its wait. Then it is
    /// stopped there again for the next call. That is an error if it has left its wait
    /// meanwhile ([`Hijacked::released`]).
    pub(crate) fn call(&mut self, func: u64, args: &[u64], data: &[u8]) -> Result<u64> {
        assert!(args.len() <= 6);
        let pid = self.pid;
        if self.state != State::Parked {
            return Err(self.released_error());
        }
        let trampoline = match self.trampoline {
            Some(t) => t,
            None => *self.trampoline.insert(super::trampoline::install(pid)?),
        };
        let running = self.way == Way::Running;
        // A wait the kernel would restart is restarted by the trampoline at its `syscall`
        // instruction, so it must be one.
        let restarts = !running && self.regs.rax as i64 != -(libc::EINTR as i64);
        if restarts {
            use crate::ptrace::ProcessMemory;
            let insn = crate::ptrace::RemoteMemory::new(pid)?.read_vec(self.regs.rip - 2, 2)?;
            if insn != [0x0f, 0x05] {
                return Err(Error::BadState {
                    pid,
                    why: format!(
                        "its wait at {:#x} is not a syscall instruction",
                        self.regs.rip
                    ),
                });
            }
        }
        // From the stack pointer down:
        // - the red zone (128 bytes a leaf function may use);
        // - for a thread stopped while running, the resume address's slot, below the red zone;
        // - the data;
        // - the trampoline's block (64-byte aligned);
        // - the return address (into the trampoline; rsp ≡ 8 mod 16 at the function's entry, as
        //   after a `call`).
        use super::trampoline::{Block, RESUME_AT, RESUME_SLOT_BELOW};
        let (block, below, back) = if running {
            let b = Block::resume_bytes(&self.regs, &self.xstate);
            (b, RESUME_SLOT_BELOW + 16, trampoline + RESUME_AT)
        } else {
            (Block::bytes(&self.regs, &self.xstate), 128, trampoline)
        };
        let data_at = (self.regs.rsp - below - data.len() as u64) & !15;
        let block_at = (data_at - block.len() as u64) & !63;
        let entry_rsp = block_at - 8;
        if running {
            write_memory(
                pid,
                self.regs.rsp - RESUME_SLOT_BELOW,
                &self.regs.rip.to_le_bytes(),
            )?;
        }
        write_memory(pid, data_at, data)?;
        write_memory(pid, block_at, &block)?;
        write_memory(pid, entry_rsp, &back.to_le_bytes())?;
        let mut regs = self.regs;
        let resolve = |a: u64| {
            if a >= DATA && a < DATA + data.len() as u64 + 1 {
                data_at + (a - DATA)
            } else {
                a
            }
        };
        let mut argv = [0u64; 6];
        for (slot, &a) in argv.iter_mut().zip(args) {
            *slot = resolve(a);
        }
        regs.rdi = argv[0];
        regs.rsi = argv[1];
        regs.rdx = argv[2];
        regs.rcx = argv[3];
        regs.r8 = argv[4];
        regs.r9 = argv[5];
        regs.rip = func;
        regs.rsp = entry_rsp;
        regs.rax = 0;
        // No system call restart on resume (the kernel would rewind rip into our function).
        regs.orig_rax = u64::MAX;
        ptrace::setregs(self.tid, regs).map_err(|e| self.os("PTRACE_SETREGS", e))?;
        // From here on the thread comes back by itself, whatever becomes of us.
        self.state = State::Faulted;
        self.stall_for_tests("before");
        ptrace::cont(self.tid, None).map_err(|e| self.os("PTRACE_CONT", e))?;
        self.stall_for_tests("after");
        let result = self.await_return(block_at)?;
        if running {
            // Waiting in the trampoline for us. Stopped there and set back where it was.
            self.repark(trampoline + super::trampoline::RESUME_WAKE);
            return Ok(result);
        }
        // Back in its wait (the trampoline's last instructions take nanoseconds), so stopped
        // there again for the next call.
        self.state = State::Released;
        std::thread::sleep(Duration::from_micros(500));
        self.park();
        Ok(result)
    }

    /// [`Way::Running`], after a call. The thread waits in the trampoline's `futex` at `wake`.
    /// Stopped there, it is set back where it was (every register, its vector state) and
    /// Parked for the next call. Released if it is not there (its wait ended early, so it goes
    /// on by itself).
    fn repark(&mut self, wake: u64) {
        use super::trampoline::RESUME_AT;
        self.state = State::Released;
        // The trampoline's first instructions (the done word written, the wait not yet
        // begun) take nanoseconds, so a stop there is let go and made again.
        let before_wait = (wake - super::trampoline::RESUME_WAKE + RESUME_AT)..wake;
        let mut tries = 0;
        loop {
            if !self.interrupt() {
                return;
            }
            match ptrace::getregs(self.tid) {
                Ok(now) if now.rip == wake => break,
                Ok(now) if before_wait.contains(&now.rip) && tries < 10 => {
                    tries += 1;
                    if ptrace::cont(self.tid, None).is_err() {
                        return;
                    }
                    std::thread::sleep(Duration::from_micros(50));
                }
                _ => return,
            }
        }
        set_xstate(self.tid, &mut self.xstate);
        // orig_rax -1 (saved outside a system call), so the futex is not restarted.
        if ptrace::setregs(self.tid, self.regs).is_ok() {
            self.state = State::Parked;
        }
    }

    /// Waits for the thread to come back through the trampoline (its block's done word),
    /// passing on the signals it gets meanwhile; the function's result.
    fn await_return(&mut self, block_at: u64) -> Result<u64> {
        use super::trampoline::Block;
        use crate::ptrace::ProcessMemory;
        let pid = self.pid;
        let mem = crate::ptrace::RemoteMemory::new(pid)?;
        let deadline = Instant::now() + CALL_TIMEOUT;
        loop {
            match waitpid(self.tid, Some(WaitPidFlag::__WALL | WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::StillAlive) => {
                    let word = |at: usize| -> Result<u64> {
                        let b = mem.read_vec(block_at + at as u64, 8)?;
                        Ok(u64::from_le_bytes(b[..8].try_into().unwrap()))
                    };
                    if word(Block::DONE)? == 1 {
                        return word(Block::RESULT);
                    }
                    if Instant::now() >= deadline {
                        // It returns by itself whenever the function does.
                        self.state = State::Released;
                        return Err(Error::BadState {
                            pid,
                            why: format!(
                                "a call into the process did not return in {} s",
                                CALL_TIMEOUT.as_secs()
                            ),
                        });
                    }
                    std::thread::sleep(Duration::from_micros(200));
                }
                Ok(WaitStatus::Stopped(_, Signal::SIGSEGV)) => {
                    let now =
                        ptrace::getregs(self.tid).map_err(|e| self.os("PTRACE_GETREGS", e))?;
                    // A real fault inside the function. The thread is put back (on drop)
                    // rather than the fault delivered (the process would die of it).
                    return Err(Error::BadState {
                        pid,
                        why: format!("a call into the process faulted at {:#x}", now.rip),
                    });
                }
                Ok(WaitStatus::Stopped(_, sig)) => {
                    // Another signal for this thread meanwhile, delivered as it would be.
                    ptrace::cont(self.tid, Some(sig)).map_err(|e| self.os("PTRACE_CONT", e))?;
                }
                Ok(WaitStatus::PtraceEvent(..)) | Ok(WaitStatus::PtraceSyscall(_)) => {
                    ptrace::cont(self.tid, None).map_err(|e| self.os("PTRACE_CONT", e))?;
                }
                Ok(WaitStatus::Exited(..)) | Ok(WaitStatus::Signaled(..)) => {
                    self.state = State::Released;
                    return Err(Error::ProcessExited(pid));
                }
                Ok(_) => {}
                Err(nix::errno::Errno::EINTR) => {}
                Err(e) => {
                    self.state = State::Released;
                    return Err(self.os("waiting for a call into the process", e));
                }
            }
        }
    }

    /// The process the thread belongs to.
    pub(crate) fn pid(&self) -> i32 {
        self.pid
    }

    /// Whether the thread was stopped while running (not in a wait). See [`Hijacked::in_code`].
    pub(crate) fn stopped_running(&self) -> bool {
        self.way == Way::Running
    }

    /// Whether `e` says the thread left its wait between two calls (try again later, with
    /// a thread found anew).
    pub(crate) fn released(e: &Error) -> bool {
        matches!(e, Error::BadState { why, .. } if why == RELEASED)
    }

    fn released_error(&self) -> Error {
        Error::BadState {
            pid: self.pid,
            why: RELEASED.into(),
        }
    }

    fn os(&self, what: &str, e: nix::errno::Errno) -> Error {
        crate::proc::os_error(self.pid, what, std::io::Error::from_raw_os_error(e as i32))
    }
}

/// An argument of [`Hijacked::call`] that stands for the address of `data` on the stack
/// (plus an offset). It is an address no user-space pointer has.
pub(crate) const DATA: u64 = 0xffff_ff00_0000_0000;

/// Why a call was not made. The thread left its wait after the previous call.
const RELEASED: &str = "the thread left its wait between two calls";

/// Under [`STALL_ENV`] (tests only): whether to stall at `at`, said on stderr.
fn stall_for_tests(at: &str, pid: i32) -> bool {
    let stall = std::env::var(STALL_ENV).is_ok_and(|v| v == at);
    if stall {
        eprintln!("scalene-rs: test stall {at} a call into process {pid}");
    }
    stall
}

impl Hijacked {
    /// Under [`STALL_ENV`] (tests only): stalls a minute at `at`.
    fn stall_for_tests(&self, at: &str) {
        if stall_for_tests(at, self.pid) {
            std::thread::sleep(Duration::from_secs(60));
        }
    }
}

impl Drop for Hijacked {
    fn drop(&mut self) {
        // Stopped inside a call that faulted, so put back as it was. Then let go. Parked, it
        // restarts its wait. Released, a detach finds it running or gone, which does no harm.
        if self.state == State::Faulted {
            if !self.xstate.is_empty() {
                set_xstate(self.tid, &mut self.xstate);
            }
            let _ = ptrace::setregs(self.tid, self.regs);
        }
        let _ = ptrace::detach(self.tid, None);
        if let Some(old) = self.old_mask.take() {
            let _ = nix::sys::signal::pthread_sigmask(SigmaskHow::SIG_SETMASK, Some(&old), None);
        }
    }
}

/// Blocks Ctrl-C and the other termination signals while a thread is ours (they are
/// handled once it is put back); returns the mask to restore.
fn block_termination_signals() -> Option<SigSet> {
    let mut old = SigSet::empty();
    nix::sys::signal::pthread_sigmask(
        SigmaskHow::SIG_BLOCK,
        Some(&super::pause::termination_signals()),
        Some(&mut old),
    )
    .ok()
    .map(|_| old)
}

fn get_xstate(tid: Pid) -> Option<Vec<u8>> {
    let mut buf = vec![0u8; XSTATE_BYTES];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr() as *mut libc::c_void,
        iov_len: buf.len(),
    };
    // SAFETY: PTRACE_GETREGSET writes at most iov_len bytes into our buffer and updates
    // iov_len to what it wrote.
    let r = unsafe {
        libc::ptrace(
            libc::PTRACE_GETREGSET,
            tid.as_raw(),
            NT_X86_XSTATE as usize as *mut libc::c_void,
            &mut iov as *mut libc::iovec as *mut libc::c_void,
        )
    };
    if r != 0 {
        return None;
    }
    buf.truncate(iov.iov_len);
    Some(buf)
}

fn set_xstate(tid: Pid, buf: &mut [u8]) {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr() as *mut libc::c_void,
        iov_len: buf.len(),
    };
    // SAFETY: PTRACE_SETREGSET reads iov_len bytes from our buffer, which GETREGSET filled.
    unsafe {
        libc::ptrace(
            libc::PTRACE_SETREGSET,
            tid.as_raw(),
            NT_X86_XSTATE as usize as *mut libc::c_void,
            &mut iov as *mut libc::iovec as *mut libc::c_void,
        )
    };
}

/// Writes `bytes` at `addr` in `pid` (process_vm_writev; its stack is writable).
fn write_memory(pid: i32, addr: u64, bytes: &[u8]) -> Result<()> {
    let local = [std::io::IoSlice::new(bytes)];
    let remote = [nix::sys::uio::RemoteIoVec {
        base: addr as usize,
        len: bytes.len(),
    }];
    match nix::sys::uio::process_vm_writev(Pid::from_raw(pid), &local, &remote) {
        Ok(n) if n == bytes.len() => Ok(()),
        Ok(n) => Err(Error::BadState {
            pid,
            why: format!("wrote {n} of {} bytes into its stack", bytes.len()),
        }),
        Err(e) => Err(crate::proc::os_error(
            pid,
            "writing into its stack",
            std::io::Error::from_raw_os_error(e as i32),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_lock_free_waits_are_safe() {
        // A GIL / condition wait (FUTEX_WAIT_BITSET | PRIVATE) and a join (| CLOCK_REALTIME).
        assert!(safe_wait(202, 0x89));
        assert!(safe_wait(202, 0x189));
        // A C-library lock's wait (FUTEX_WAIT | PRIVATE), so the thread holds or wants a lock.
        assert!(!safe_wait(202, 0x80));
        assert!(!safe_wait(202, 0));
        assert!(safe_wait(230, 0));
        // read/openat/mmap, because the loader itself does those under its lock.
        assert!(!safe_wait(0, 0));
        assert!(!safe_wait(257, 0));
        assert!(!safe_wait(9, 0));
    }
}
