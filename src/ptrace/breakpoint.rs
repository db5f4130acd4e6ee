//! A hardware breakpoint on one thread of another process that goes away with us: the
//! kernel's breakpoint perf event (`perf_event_open`, `PERF_TYPE_BREAKPOINT`), which stops
//! the thread with a synchronous SIGTRAP (`sigtrap`, Linux 5.13+) at the instruction, before
//! it runs, and belongs to our file descriptor.
//!
//! Why not the debug registers through `PTRACE_POKEUSER`: the kernel keeps those in the
//! thread after the tracer detaches or dies (measured on Linux 6.18: a thread whose tracer
//! was SIGKILLed with DR0/DR7 armed died of SIGTRAP at its next pass), so a profiler killed
//! while waiting would kill its target. The perf event is released with the last copy of
//! its descriptor: a profiler killed while armed leaves nothing armed.
//!
//! The stop: the thread, which we trace, stops in a signal-delivery stop for SIGTRAP
//! (`si_code` TRAP_PERF, `si_perf_data` our cookie). Collecting that stop with `waitpid`
//! clears the signal the stop would deliver: a tracer that dies after it leaves the thread
//! to run on without it. Between the stop and its collection (microseconds: the profiler
//! waits for it) a tracer's death would let the SIGTRAP through.
//!
//! Owns: [`Breakpoint`] (arming, disarming on drop) and the recognition of its stop.
//! Must not: stop anything itself, or outlive the hijack that armed it.

use std::os::fd::{FromRawFd, OwnedFd};

/// `PERF_TYPE_BREAKPOINT`.
const PERF_TYPE_BREAKPOINT: u32 = 5;
/// `HW_BREAKPOINT_X`: an instruction breakpoint.
const HW_BREAKPOINT_X: u32 = 4;
/// `PERF_ATTR_SIZE_VER7`: the attribute with `sig_data`.
const ATTR_SIZE: usize = 128;
/// Flag bits of the attribute's bit field: exclude_kernel, exclude_hv, remove_on_exec, sigtrap.
const FLAGS: u64 = 1 << 5 | 1 << 6 | 1 << 36 | 1 << 37;
/// `PERF_FLAG_FD_CLOEXEC`.
const PERF_FLAG_FD_CLOEXEC: libc::c_ulong = 8;
/// `TRAP_PERF`: the `si_code` of a perf event's SIGTRAP.
pub(crate) const TRAP_PERF: i32 = 6;
/// Our events' `sig_data`, seen in the SIGTRAP's `si_perf_data`.
pub(crate) const COOKIE: u64 = 0x5ca1_e0b5_b4ea_4b00;

/// An armed instruction breakpoint on one thread; disarmed when dropped.
pub(crate) struct Breakpoint {
    _fd: OwnedFd,
}

impl Breakpoint {
    /// Arms a breakpoint at `addr` (an AVMA of code) on thread `tid` of another process.
    pub(crate) fn arm(tid: i32, addr: u64) -> std::io::Result<Breakpoint> {
        let mut attr = [0u8; ATTR_SIZE];
        let mut put32 = |at: usize, v: u32| attr[at..at + 4].copy_from_slice(&v.to_le_bytes());
        put32(0, PERF_TYPE_BREAKPOINT);
        put32(4, ATTR_SIZE as u32);
        put32(52, HW_BREAKPOINT_X);
        let mut put64 = |at: usize, v: u64| attr[at..at + 8].copy_from_slice(&v.to_le_bytes());
        put64(16, 1); // sample_period: every hit
        put64(40, FLAGS);
        put64(56, addr); // bp_addr
        put64(64, 8); // bp_len: sizeof(long), as the kernel wants for X
        put64(120, COOKIE); // sig_data
        // SAFETY: perf_event_open reads ATTR_SIZE bytes of our attribute; the other
        // arguments are plain integers (this thread's process is not the target: no group).
        let fd = unsafe {
            libc::syscall(
                libc::SYS_perf_event_open,
                attr.as_ptr(),
                tid as libc::c_long,
                -1 as libc::c_long,
                -1 as libc::c_long,
                PERF_FLAG_FD_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Breakpoint {
            // SAFETY: a descriptor the kernel just gave us, owned by nothing else.
            _fd: unsafe { OwnedFd::from_raw_fd(fd as i32) },
        })
    }
}

/// Whether a stopped tracee's signal information is one of our breakpoints' SIGTRAP.
pub(crate) fn is_ours(info: &libc::siginfo_t) -> bool {
    if info.si_signo != libc::SIGTRAP || info.si_code != TRAP_PERF {
        return false;
    }
    // `si_perf_data` follows `si_addr` in the fault part of the union (offset 24).
    // SAFETY: siginfo_t is 128 plain bytes; we read one aligned word inside it.
    let data = unsafe { *(info as *const libc::siginfo_t as *const u64).add(3) };
    data == COOKIE
}

/// A sentence for a refusal of `perf_event_open`.
pub(crate) fn refusal(e: &std::io::Error) -> String {
    match e.raw_os_error() {
        Some(libc::EACCES) | Some(libc::EPERM) => {
            "the kernel refused a breakpoint on it (perf_event_open: permission denied; \
             kernel.perf_event_paranoid above 2 or a seccomp filter; run as root or lower it)"
                .to_string()
        }
        Some(libc::ENOSYS) | Some(libc::ENOENT) | Some(libc::EOPNOTSUPP) => {
            "the kernel offers no hardware breakpoints here (perf_event_open)".to_string()
        }
        Some(libc::EINVAL) | Some(libc::E2BIG) => {
            "the kernel cannot stop a thread at a breakpoint that goes away with us (a perf \
             breakpoint with sigtrap needs Linux 5.13 or later)"
                .to_string()
        }
        Some(libc::ENOSPC) => {
            "the thread's hardware breakpoints are all in use (a debugger?)".to_string()
        }
        _ => format!("a breakpoint on it failed: {e}"),
    }
}
