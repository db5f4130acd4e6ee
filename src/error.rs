//! The library's error type, sorted by how a caller reacts to it.
//!
//! Owns: [`Error`] and the mapping to the CLI's exit codes ([`Error::exit_code`]).
//! Must not: print anything (the binary decides how errors reach the user), or look at
//! the system. Telling why an OS call failed (gone? not allowed?) is `proc::os_error`.

use std::io;

/// Exit codes of the `scalene-rs` binary. Documented in README.md; tests rely on them.
pub mod exit {
    pub const OK: i32 = 0;
    pub const OTHER: i32 = 1;
    pub const USAGE: i32 = 2;
    pub(crate) const NO_SUCH_PROCESS: i32 = 3;
    pub(crate) const NOT_PYTHON: i32 = 4;
    pub(crate) const PERMISSION: i32 = 5;
    pub(crate) const UNSUPPORTED_VERSION: i32 = 6;
    pub(crate) const PROCESS_EXITED: i32 = 7;
    pub(crate) const BAD_CORE: i32 = 8;
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

    /// `--gil` asked of a free-threaded build, which has no GIL to follow.
    #[error(
        "--gil: Python {version} in process {pid} is a free-threaded build: it has no GIL \
         (sample every thread without --gil)"
    )]
    NoGil { pid: i32, version: String },

    /// `--async` asked of a Python whose asyncio tasks we cannot read.
    #[error("--async: process {pid}: {why}")]
    NoAsync { pid: i32, why: String },

    /// `--greenlets` asked of a process whose greenlets we cannot read (its build, or what
    /// it holds).
    #[error("--greenlets: process {pid}: {why}")]
    NoGreenlets { pid: i32, why: String },

    /// `--greenlets` asked of a process that has not imported greenlet.
    #[error(
        "--greenlets: process {0} has not imported greenlet (no greenlet._greenlet in \
         sys.modules)"
    )]
    GreenletNotImported(i32),

    /// The interpreter is there but not in a state we can read (starting up, finalizing,
    /// or memory that does not look like what the layout promises).
    #[error("cannot read the Python interpreter of process {pid}: {why}")]
    BadState { pid: i32, why: String },

    /// A read of the target's memory failed or came back short: an address not (or no
    /// longer) mapped, or a mapping that changed. `why` says what the OS answered. A read
    /// that finds the process gone is [`Error::ProcessExited`] instead, and a refused one
    /// [`Error::PermissionDenied`].
    #[error("reading {len} bytes at {addr:#x} in process {pid} failed: {why}")]
    Read {
        pid: i32,
        addr: u64,
        len: usize,
        why: String,
    },

    /// What was read does not hold together (a pointer to the wrong type, a loop, a size
    /// out of range): memory that changed while it was read, or is not what we expect.
    #[error("inconsistent data at {addr:#x}: {why}")]
    Inconsistent { addr: u64, why: &'static str },

    /// A core file (`dump --core`) that cannot be read as one: not a core, truncated,
    /// damaged, or the files it needs missing or not the ones the process had. `why` says
    /// which, and what to do where something can be done.
    #[error("core file {core}: {why}")]
    BadCore { core: String, why: String },

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
            Error::UnsupportedVersion { .. }
            | Error::NoGil { .. }
            | Error::NoAsync { .. }
            | Error::NoGreenlets { .. } => exit::UNSUPPORTED_VERSION,
            Error::BadCore { .. } => exit::BAD_CORE,
            Error::BadState { .. }
            | Error::Read { .. }
            | Error::GreenletNotImported(_)
            | Error::Inconsistent { .. }
            | Error::Io { .. } => exit::OTHER,
        }
    }

    /// An OS failure in `context` (what we were doing) with its cause.
    pub(crate) fn io(context: impl Into<String>, source: io::Error) -> Error {
        Error::Io {
            context: context.into(),
            source,
        }
    }

    /// Data that is not what it should be (a file that is not ELF, say): an I/O error of
    /// kind `InvalidData` with `why`.
    pub(crate) fn invalid_data(context: impl Into<String>, why: impl Into<String>) -> Error {
        Error::io(
            context,
            io::Error::new(io::ErrorKind::InvalidData, why.into()),
        )
    }

    /// True when the process itself is gone (so every later read will fail too).
    pub(crate) fn is_process_gone(&self) -> bool {
        matches!(self, Error::ProcessExited(_) | Error::NoSuchProcess(_))
    }
}

pub(crate) type Result<T, E = Error> = std::result::Result<T, E>;
