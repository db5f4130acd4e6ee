//! The library's error type, sorted by how a caller reacts to it.
//!
//! Owns: [`Error`] and the mapping to the CLI's exit codes ([`Error::exit_code`]).
//! Must not: print anything; the binary decides how errors reach the user.

use std::io;

/// Exit codes of the `scalene-rs` binary. Documented in README.md; tests rely on them.
pub mod exit {
    pub const OK: i32 = 0;
    pub const OTHER: i32 = 1;
    pub const USAGE: i32 = 2;
    pub const NO_SUCH_PROCESS: i32 = 3;
    pub const NOT_PYTHON: i32 = 4;
    pub const PERMISSION: i32 = 5;
    pub const UNSUPPORTED_VERSION: i32 = 6;
    pub const PROCESS_EXITED: i32 = 7;
}

/// Everything that can go wrong while reading a Python process from outside.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No process has this PID (or it is a zombie with nothing left to read).
    #[error("no process with PID {0}")]
    NoSuchProcess(i32),

    /// The process existed when we started and is gone now.
    #[error("process {0} exited while it was being read")]
    ProcessExited(i32),

    /// We may not read the process. `fix` says which permission is missing and how to get it.
    #[error("permission denied reading process {pid} ({what}): {fix}")]
    PermissionDenied { pid: i32, what: String, fix: String },

    /// The process runs no CPython interpreter we can find.
    #[error("process {pid} ({exe}) is not a Python process: {why}")]
    NotPython { pid: i32, exe: String, why: String },

    /// A CPython we recognise but have no layout for.
    #[error("unsupported Python version {version} in process {pid}; supported: {supported}")]
    UnsupportedVersion {
        pid: i32,
        version: String,
        supported: String,
    },

    /// The interpreter is there but not in a state we can read (starting up, finalizing,
    /// or memory that does not look like what the layout promises).
    #[error("cannot read the Python interpreter of process {pid}: {why}")]
    BadState { pid: i32, why: String },

    /// A read of the target's memory failed; `torn` says whether retrying may help
    /// (the process changed under us) or not.
    #[error("reading {len} bytes at {addr:#x} in process {pid} failed: {why}")]
    Read {
        pid: i32,
        addr: u64,
        len: usize,
        why: String,
    },

    /// Anything else from the OS.
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: io::Error,
    },
}

impl Error {
    /// The binary's exit code for this error.
    pub fn exit_code(&self) -> i32 {
        match self {
            Error::NoSuchProcess(_) => exit::NO_SUCH_PROCESS,
            Error::ProcessExited(_) => exit::PROCESS_EXITED,
            Error::PermissionDenied { .. } => exit::PERMISSION,
            Error::NotPython { .. } => exit::NOT_PYTHON,
            Error::UnsupportedVersion { .. } => exit::UNSUPPORTED_VERSION,
            Error::BadState { .. } | Error::Read { .. } | Error::Io { .. } => exit::OTHER,
        }
    }

    /// Builds the error for an OS failure on something belonging to process `pid`, telling
    /// apart "gone", "not allowed" and the rest.
    pub fn from_os(pid: i32, what: &str, err: io::Error) -> Error {
        match err.raw_os_error() {
            Some(libc::ESRCH) | Some(libc::ENOENT) => {
                if process_exists(pid) {
                    Error::Io {
                        context: what.to_string(),
                        source: err,
                    }
                } else {
                    Error::ProcessExited(pid)
                }
            }
            Some(libc::EPERM) | Some(libc::EACCES) => permission_denied(pid, what),
            _ => Error::Io {
                context: format!("{what} of process {pid}"),
                source: err,
            },
        }
    }

    /// True when the process itself is gone (so every later read will fail too).
    pub fn is_process_gone(&self) -> bool {
        matches!(self, Error::ProcessExited(_) | Error::NoSuchProcess(_))
    }
}

/// Whether `/proc/PID` exists and the process is neither a zombie nor on its way out.
///
/// A process that is exiting releases its memory and `/proc/PID/exe` before it becomes a
/// zombie; in that window its state still reads 'R' or 'D' but its flags carry PF_EXITING,
/// and every read fails. We call such a process gone.
pub fn process_exists(pid: i32) -> bool {
    const PF_EXITING: u64 = 0x4;
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => {
            // Fields after the parenthesised command name: state (3), ppid, pgrp, session,
            // tty_nr, tpgid, flags (9).
            let Some(rest) = s.rfind(')').map(|i| &s[i + 1..]) else {
                return false;
            };
            let mut fields = rest.split_ascii_whitespace();
            let state = fields.next().and_then(|f| f.chars().next());
            let flags: u64 = fields.nth(5).and_then(|f| f.parse().ok()).unwrap_or(0);
            !matches!(state, Some('Z') | Some('X') | None) && flags & PF_EXITING == 0
        }
        Err(_) => false,
    }
}

/// The permission error with the capability that is missing and how to grant it.
pub fn permission_denied(pid: i32, what: &str) -> Error {
    let euid = nix::unistd::geteuid();
    let owner = std::fs::metadata(format!("/proc/{pid}"))
        .ok()
        .map(|m| std::os::unix::fs::MetadataExt::uid(&m));
    let yama = std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope")
        .ok()
        .map(|s| s.trim().to_string());
    let mut fix = String::from("reading another process needs ptrace access (CAP_SYS_PTRACE)");
    match owner {
        Some(uid) if uid != euid.as_raw() => fix.push_str(&format!(
            "; the process belongs to uid {uid} and we run as uid {}: run scalene-rs as that user or as root (sudo)",
            euid.as_raw()
        )),
        _ => fix.push_str("; run scalene-rs as root (sudo)"),
    }
    if let Some(scope) = yama.filter(|s| s != "0") {
        fix.push_str(&format!(
            ", or allow it with `sysctl kernel.yama.ptrace_scope=0` (now {scope})"
        ));
    }
    fix.push_str("; inside a container, start it with `--cap-add SYS_PTRACE`");
    Error::PermissionDenied {
        pid,
        what: what.to_string(),
        fix,
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
