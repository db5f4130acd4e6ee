//! The read of memory that cannot change: a core file's, every thread walked once.
//!
//! Owns: [`snapshot`], the one read of a saved process:
//! - its threads as the core lists them (no /proc);
//! - their states from their registers (inside a system call or not);
//! - the rest as a paused read of a live process does it (`paused::read_all`, the CALL
//!   tag, the thread ids).
//!
//! So a core's snapshot is the live one's to the byte where the core holds what /proc
//! would have said.
//!
//! A 3.11+ stack cut short (memory the core lacks or holds as zeros) is the thread's error,
//! never a shorter stack.
//!
//! Must not: pause, retry (nothing changes), or read /proc.

use super::paused::read_all;
use super::{correct_stale_ids, tag_native, thread_snapshots};
use crate::error::Result;
use crate::python::process::PythonProcess;
use crate::python::rest::RestTracker;
use crate::python::snapshot::{Snapshot, ThreadError, Unread};
use crate::python::stack::StackWalker;

/// Why a 3.11+ stack whose chain ends past its last call of the evaluation loop is not
/// shown. A whole stack ends with the frame its first call entered (`Walk::evals_open`
/// is 0), so its outermost frames are missing, and a shorter stack would be a wrong one.
/// Seen: gdb 13's core of a process in another mount namespace holds zeros on its threads'
/// stacks, where the entry frames of 3.12+ are.
const CUT_SHORT: &str = "its outermost frames are not in the core: the chain of frames ends \
     inside a call of the evaluation loop (memory the core holds as zeros?)";

/// One thread of a saved process.
#[derive(Debug, Clone)]
pub(crate) struct SavedThread {
    /// Its kernel id, as saved.
    pub(crate) tid: i32,
    /// Whether it was inside a system call (None: not known). One that was, not holding
    /// the GIL, is idle, as a live thread that is not running (state other than `R`).
    pub(crate) in_syscall: Option<bool>,
    /// Its name (`comm`), where saved.
    pub(crate) name: Option<String>,
}

/// Every thread of `proc`, read through its saved memory. `threads` are the kernel's
/// threads as saved.
pub(crate) fn snapshot(
    proc: &PythonProcess,
    walker: &mut StackWalker,
    threads: &[SavedThread],
    locals: Option<&crate::python::locals::LocalsOptions>,
) -> Result<Snapshot> {
    let mut tids: Vec<i32> = threads.iter().map(|t| t.tid).collect();
    tids.sort_unstable();
    let states: crate::IdMap<i32, char> = threads
        .iter()
        .map(|t| (t.tid, if t.in_syscall == Some(true) { 'S' } else { 'R' }))
        .collect();
    let opcodes = crate::python_bindings::opcodes(proc.version.major, proc.version.minor);
    walker.strict = false;
    let mut read = read_all(proc, &proc.mem, walker, &RestTracker::default(), &|_| false)?;
    tag_native(&proc.mem, opcodes, &mut read);
    if proc.layout.version >= (3, 11) {
        for (_, walk, _) in read.iter_mut() {
            if matches!(walk, Ok(w) if !w.truncated && w.evals_open > 0) {
                *walk = Err(ThreadError::new(Unread::Memory, CUT_SHORT));
            }
        }
    }
    correct_stale_ids(proc, walker, &tids, &mut read);
    if let Some(opts) = locals {
        super::paused::read_locals(proc, &proc.mem, opts, &mut read);
    }
    let os_name = |tid: i32| threads.iter().find(|t| t.tid == tid)?.name.clone();
    let threads = thread_snapshots(proc, &tids, &states, read, &os_name);
    Ok(Snapshot {
        pid: proc.pid,
        python_version: proc.version_text.clone(),
        version_source: proc.version_source,
        untested_version: proc.untested,
        free_threaded: proc.layout.free_threaded,
        executable: proc.executable.clone(),
        threads,
        native: None,
        asyncio: None,
        greenlets: None,
        python_names_unavailable: None,
        left_out: walker.left_out,
        woken: Vec::new(),
        stale_ids: walker.stale_ids.clone(),
    })
}
