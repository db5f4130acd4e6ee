//! The CPython interpreter of a live process: find it, and read every thread's stack.
//!
//! Owns: [`Snapshot`] (what `dump` prints and what the sampler will build on) and
//! [`take_snapshot`], which combines the pure walker (`stack.rs`) with the live-process
//! parts: pausing threads, thread ids from /proc, idle detection, and, without pausing,
//! detecting and retrying torn stacks.
//! Must not: format output.

mod asyncio;
mod asyncio_legacy;
#[cfg(feature = "fuzzing")]
pub(crate) use asyncio::fuzz_tasks;
pub mod linetable;
pub use asyncio::{
    unsupported as async_unsupported, AsyncReader, AsyncSnapshot, LoopTasks, TaskInfo,
};
mod native;
mod process;
pub(crate) use native::StackEntry;
pub(crate) use native::{
    attach as attach_native, take_native_snapshot_with_tids, waiting_view, MergeCounts,
    MergeFailure, NativeView,
};
pub use native::{check_can_stop, native_process, take_native_snapshot, take_native_snapshot_with};
mod stack;
mod strings;
mod thread_reader;
#[cfg(feature = "fuzzing")]
pub(crate) use strings::TypeAddrs;
pub(crate) use thread_reader::{ThreadReader, WaitingThread};
pub(crate) mod version;

use crate::error::{Error, Result};
use crate::native::{Captures, NativeProcess};
use crate::ptrace::{self, pause::PausedThreads, ProcessMemory};
pub use process::{LocateOptions, PythonProcess};
pub use stack::StackWalker;
pub(crate) use stack::{Frame, Walk};
use std::collections::HashMap;

/// How to read.
#[derive(Debug, Clone)]
pub struct SnapshotOptions {
    /// Whether and when the target is paused. [`ReadMode::Auto`]: a thread whose first
    /// read without pausing fails is read paused at once, not tried again without pausing.
    /// A profile wants this: which states fail to read depends on the state (one that lasts
    /// less than a read fails more often), so retries drawn until one succeeds favour the
    /// states that are easy to read, whereas a paused read is a fresh draw that favours
    /// none.
    pub mode: ReadMode,
    /// Tries per thread when a stack changes while being read ([`ReadMode::Nonblocking`]).
    pub retries: usize,
    /// Read each thread's OS name from /proc (costs a file read per thread).
    pub thread_names: bool,
    /// [`ReadMode::Auto`]: threads (by `thread_id`) read paused without a try first.
    pub pause_these: Vec<u64>,
    /// Threads that did not run since their last read (the sampler knows from their CPU
    /// time), by `thread_id` (their `pthread_t`, which every version records and no PID
    /// namespace changes), with the innermost frame that read found: one whose thread
    /// state still names that frame, and that does not hold the GIL, is not walked again
    /// (`ThreadSnapshot::unchanged`): a thread's stack changes only when it runs.
    pub reuse: crate::IdMap<u64, u64>,
    /// Kernel ids (ours) of threads by `thread_id`, as an earlier snapshot matched them:
    /// before 3.11 a thread state does not record its kernel id, and a stack to be read
    /// again paused would otherwise pause every thread (waking those that wait, at a cost
    /// of CPU charged to them).
    pub tids_by_thread: crate::IdMap<u64, i32>,
    /// [`ReadMode::Paused`]: kernel ids (ours) of the threads the caller expects to find
    /// unchanged (those of `reuse`): they are not paused. A thread among them that turns out
    /// to have changed (its top frame moved, or it holds the GIL) cannot be read unpaused:
    /// the process is then paused whole and read again. So a thousand parked threads cost a
    /// paused read nothing (no stop and restart of each, no wake-up charged to them).
    pub unpaused: crate::IdSet<i32>,
    /// Leave the threads found unchanged (see `reuse`) out of the snapshot: a caller that
    /// keeps their last reads and needs nothing of them this time (the sampler, when it
    /// charges CPU time only) saves an entry per thread of a pool at rest at every sample.
    pub omit_unchanged: bool,
    /// Read every thread state of the thread list, those of threads at rest too (the
    /// walker otherwise takes them as it last found them): a caller that saw a thread
    /// leave asks for it, as the state before the one that left still links to it.
    pub list_whole: bool,
    /// Under `omit_unchanged`, the most threads walked (the GIL holder aside): the others
    /// that need a walk are left out of this snapshot (counted in `walker.deferred`), and
    /// the next snapshot starts where this one stopped. A pool of a thousand threads that
    /// start, or wake to end, together costs each sample this many walks, not a thousand.
    pub max_walks: Option<usize>,
    /// How `reuse` differs from the map of the caller's last snapshot, under
    /// `omit_unchanged`: then the thread list is read for the threads that did not rest
    /// only (see [`ReuseDelta`]). None: not known (the map was made anew).
    pub reuse_delta: Option<ReuseDelta>,
}

/// What changed in [`SnapshotOptions::reuse`] since the caller's snapshot before: the
/// `thread_id`s whose entry was added, removed or changed. `epoch` counts the caller's
/// snapshots (one more than that of the map before): a snapshot that missed one, or a
/// read of the list in between, reads the list the whole way.
#[derive(Debug, Clone, Default)]
pub struct ReuseDelta {
    pub epoch: u64,
    pub threads: Vec<u64>,
}

/// How stacks are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReadMode {
    /// Without pausing; a stack whose read fails validation is read once more with the
    /// threads paused (a profile's default: the sampler also pauses for a while the
    /// threads whose reads often fail, at a bounded rate).
    #[default]
    Auto,
    /// Pause every thread for every read (`--blocking`; `dump`'s default).
    Paused,
    /// Never pause: a stack that keeps changing is retried, then reported as unreadable
    /// (`--nonblocking`).
    Nonblocking,
}

impl SnapshotOptions {
    /// The threads the thread list may take as last found (none for a whole read).
    fn rested(&self) -> Option<&crate::IdMap<u64, u64>> {
        (!self.list_whole).then_some(&self.reuse)
    }
}

impl Default for SnapshotOptions {
    fn default() -> Self {
        SnapshotOptions {
            mode: ReadMode::Paused,
            retries: 5,
            thread_names: true,
            pause_these: Vec::new(),
            reuse: crate::IdMap::default(),
            tids_by_thread: crate::IdMap::default(),
            unpaused: crate::IdSet::default(),
            omit_unchanged: false,
            list_whole: false,
            max_walks: None,
            reuse_delta: None,
        }
    }
}

/// One thread's state and stack.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ThreadSnapshot {
    /// The thread's `pthread_t` as CPython records it (`threading.get_ident()`).
    pub(crate) thread_id: u64,
    /// Kernel TID (as seen from our PID namespace: /proc/PID/task/TID).
    pub(crate) native_id: Option<i32>,
    /// The thread's TID inside the target's own PID namespace (a container's), what the
    /// thread itself and Python (`threading.get_native_id()`) see; only when it differs
    /// from ours.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) ns_native_id: Option<i32>,
    /// OS thread name (/proc/PID/task/TID/comm).
    pub(crate) name: Option<String>,
    pub(crate) holds_gil: bool,
    /// Not running on a CPU and not holding the GIL.
    pub(crate) idle: bool,
    /// The innermost Python frame is inside a call (its current instruction is a CALL of
    /// some form): the thread runs native code or blocks in a C function on behalf of that
    /// line. None when unknown (no opcode table for this version, or no frame).
    pub(crate) in_native: Option<bool>,
    /// Innermost first.
    pub frames: Vec<Frame>,
    /// The stack was deeper than the limit and was cut.
    pub(crate) truncated: bool,
    /// Set when the stack could not be read consistently; `frames` is then empty.
    pub(crate) error: Option<ThreadError>,
    /// Index of the interpreter the thread belongs to (0 = main).
    pub(crate) interpreter: usize,
    /// Read with the threads paused after a read without pausing could not be validated
    /// (the "auto" mode's fallback).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub(crate) read_paused: bool,
    /// Frames per call of the evaluation loop, and frames after the last (`Walk::evals`).
    #[serde(skip)]
    pub(crate) evals: Vec<u32>,
    #[serde(skip)]
    pub(crate) evals_open: u32,
    #[serde(skip)]
    pub(crate) anchors: Vec<u64>,
    /// With native frames (`dump --native`): the merged stack.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) native: Option<native::NativeView>,
    /// Not walked: it did not run since its last read (`SnapshotOptions::reuse`), so its
    /// stack is that read's (`frames` is empty).
    #[serde(skip)]
    pub(crate) unchanged: bool,
    /// The innermost frame its thread state named when read.
    #[serde(skip)]
    pub(crate) top_frame: u64,
}

/// Every thread of a Python process at one moment.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Snapshot {
    pub(crate) pid: i32,
    pub(crate) python_version: std::sync::Arc<str>,
    pub(crate) version_source: version::VersionSource,
    /// No generated layout for this version: read through `_Py_DebugOffsets`, untested.
    pub(crate) untested_version: bool,
    /// A free-threaded build (no GIL).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub(crate) free_threaded: bool,
    pub(crate) executable: std::sync::Arc<str>,
    pub threads: Vec<ThreadSnapshot>,
    /// With native frames (`dump --native`): how many threads merged, and the threads with
    /// no Python thread state.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) native: Option<native::NativeSummary>,
    /// With asyncio tasks (`dump --async`): every event loop's tasks.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) asyncio: Option<AsyncSnapshot>,
    /// Threads found unchanged and left out of `threads` ([`SnapshotOptions::omit_unchanged`]).
    #[serde(skip)]
    pub(crate) left_out: usize,
    /// Kernel ids (ours) of the threads a paused read stopped in the middle of a wait (a
    /// system call that had blocked): the pause woke them, and the CPU time they spend on
    /// leaving the wait and entering it again is ours, not theirs ([`woke_from_wait`]).
    #[serde(skip)]
    pub(crate) woken: Vec<i32>,
}

/// Reads the stacks of every thread of `proc`.
pub fn take_snapshot(
    proc: &PythonProcess,
    walker: &mut StackWalker,
    opts: &SnapshotOptions,
) -> Result<Snapshot> {
    snapshot(proc, walker, opts, None, None, None)
}

/// Native captures, taken during the pause of a blocking read: the process's modules and
/// where its threads' captures go.
pub(crate) type NativeCapture<'a> = Option<(&'a mut NativeProcess, &'a mut Captures)>;

/// Like [`take_snapshot`], for a caller that has just listed the threads (`known_tids`,
/// ascending: the sampler), and under `--async` (`tasks`), each thread that runs
/// an asyncio task gets the task's stack instead of its own (see
/// [`LoopTasks::task_stack`]): the event loop's frames give way to the tasks that await
/// the running one. `waiting` (`--wall`) gets the stack of every task that waits, by the
/// `thread_id` of its loop's thread.
pub(crate) fn take_sample_snapshot(
    proc: &PythonProcess,
    walker: &mut StackWalker,
    opts: &SnapshotOptions,
    known_tids: Option<&[i32]>,
    tasks: Option<&mut AsyncReader>,
    mut waiting: Option<&mut Vec<(u64, Vec<Frame>)>>,
) -> Result<Snapshot> {
    let mut snap = snapshot(proc, walker, opts, known_tids, None, tasks)?;
    if let Some(a) = snap.asyncio.take() {
        for lt in &a.threads {
            if let Some(w) = waiting.as_deref_mut().filter(|_| lt.thread_id != 0) {
                w.extend(lt.waiting_stacks().into_iter().map(|s| (lt.thread_id, s)));
            }
            let Some(stack) = lt.task_stack() else {
                continue;
            };
            if let Some(t) = snap
                .threads
                .iter_mut()
                .find(|t| t.thread_id == lt.thread_id && !t.unchanged && t.error.is_none())
            {
                t.frames = stack;
            }
        }
    }
    Ok(snap)
}

/// Like [`take_snapshot`], with every event loop's asyncio tasks read in the same pause
/// (or, without pausing, right after the stacks).
pub fn take_snapshot_with_tasks(
    proc: &PythonProcess,
    walker: &mut StackWalker,
    opts: &SnapshotOptions,
    tasks: &mut AsyncReader,
) -> Result<Snapshot> {
    snapshot(proc, walker, opts, None, None, Some(tasks))
}

pub(crate) fn snapshot(
    proc: &PythonProcess,
    walker: &mut StackWalker,
    opts: &SnapshotOptions,
    known_tids: Option<&[i32]>,
    mut native: NativeCapture,
    mut tasks: Option<&mut AsyncReader>,
) -> Result<Snapshot> {
    let pid = proc.pid;
    // Scheduler states first: pausing turns every thread into 't'. A caller that lists
    // the threads itself (the sampler) does not need them (only `idle` tells them).
    // Sorted: a paused read looks threads up in it.
    let mut tids: Vec<i32> = match known_tids {
        Some(t) => t.to_vec(),
        None => crate::proc::threads(pid)?,
    };
    tids.sort_unstable();
    let states: crate::IdMap<i32, char> = match known_tids {
        Some(_) => crate::IdMap::default(),
        None => tids
            .iter()
            .filter_map(|&t| Some((t, crate::proc::thread_state(pid, t)?)))
            .collect(),
    };

    let opcodes = crate::python_bindings::opcodes(proc.version.major, proc.version.minor);
    let nonblocking = opts.mode != ReadMode::Paused;
    walker.strict = nonblocking;
    let mut threads = None;
    let mut async_tasks = None;
    let mut woken = Vec::new();
    for attempt in 0..2 {
        let read = if nonblocking {
            read_nonblocking(proc, walker, opts).and_then(|mut t| {
                if opts.mode == ReadMode::Auto && t.iter().any(|(_, w, _)| w.is_err()) {
                    reread_paused(proc, walker, &tids, &opts.tids_by_thread, &mut t)?;
                }
                tag_native(&proc.mem, opcodes, &mut t);
                if let Some(reader) = tasks.as_deref_mut() {
                    async_tasks = Some(read_tasks(reader, proc, &proc.mem, walker, &t));
                }
                Ok(t)
            })
        } else {
            let extra = PausedReads {
                native: native.as_mut(),
                tasks: tasks.as_deref_mut().map(|r| (r, &mut async_tasks)),
                woken: &mut woken,
            };
            read_blocking(proc, walker, &tids, opts, opcodes, extra)
        };
        match read {
            // Python is starting up or shutting down (no interpreter yet, or no more).
            Err(Error::BadState { .. }) if attempt == 0 && matches!(proc.interp_head(), Ok(0)) => {
                settle_uninitialized(proc)?;
            }
            r => {
                threads = Some(r?);
                break;
            }
        }
    }
    let threads = threads.expect("the second attempt always ends the loop");

    let threads = thread_snapshots(proc, &tids, &states, threads, opts.thread_names);
    if let Some(a) = async_tasks.as_mut() {
        // Kernel ids as the snapshot has them (ours, where the target's PID namespace differs).
        for lt in &mut a.threads {
            lt.native_id = threads
                .iter()
                .find(|t| t.thread_id == lt.thread_id && lt.thread_id != 0)
                .and_then(|t| t.native_id);
        }
    }
    Ok(Snapshot {
        pid,
        python_version: proc.version_text.clone(),
        version_source: proc.version_source,
        untested_version: proc.untested,
        free_threaded: proc.layout.free_threaded,
        executable: proc.executable.clone(),
        threads,
        native: None,
        asyncio: async_tasks,
        left_out: walker.left_out,
        woken,
    })
}

/// The tasks of every thread of `threads`.
fn read_tasks(
    reader: &mut AsyncReader,
    proc: &PythonProcess,
    mem: &dyn ProcessMemory,
    walker: &mut StackWalker,
    threads: &[ThreadResult],
) -> AsyncSnapshot {
    let views: Vec<_> = threads
        .iter()
        .map(|(raw, walk, _)| (raw, walk.as_ref().ok()))
        .collect();
    reader.read(proc, mem, walker, &views)
}

/// Whether `tid`, held stopped by `paused`, was stopped in the middle of a wait: a system
/// call that had blocked (a lock, a sleep, a read that waits), which the stop interrupts
/// and the thread restarts when let go. Such a thread was woken by the pause; one stopped
/// while it ran its own code, or between a quick system call's entry and exit, was not.
fn woke_from_wait(paused: &PausedThreads, pid: i32, tid: i32) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        // Interrupted in a system call that had blocked, the thread stops with the call's
        // number in `orig_rax` and one of the kernel's "restart" codes in `rax` (they are
        // replaced only after the stop, to restart the call); in its own code, `orig_rax`
        // is -1, and after a quick call `rax` holds the call's result.
        const RESTART_CODES: std::ops::RangeInclusive<i64> = -516..=-512;
        paused
            .registers(pid, tid)
            .is_ok_and(|r| (r.orig_rax as i64) >= 0 && RESTART_CODES.contains(&(r.rax as i64)))
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = paused;
        crate::proc::blocked_syscall(pid, tid).is_some_and(|(nr, _)| nr >= 0)
    }
}

/// What a blocking read reads besides the stacks, while the threads are paused: native
/// registers and stacks, asyncio tasks (and where each goes).
struct PausedReads<'a, 'b> {
    native: Option<&'a mut (&'b mut NativeProcess, &'b mut Captures)>,
    tasks: Option<(&'a mut AsyncReader, &'a mut Option<AsyncSnapshot>)>,
    /// The threads the pause found waiting (see [`Snapshot::woken`]).
    woken: &'a mut Vec<i32>,
}

/// The threads of a snapshot as reported: each with its id in our PID namespace (and in
/// the target's, when they differ), its state, its stack or why there is none.
fn thread_snapshots(
    proc: &PythonProcess,
    tids: &[i32],
    states: &crate::IdMap<i32, char>,
    threads: Vec<ThreadResult>,
    thread_names: bool,
) -> Vec<ThreadSnapshot> {
    let pid = proc.pid;
    // Thread states (3.8+ `native_thread_id`) and glibc's `struct pthread` hold the id a
    // thread has in the target's own PID namespace; /proc (`tids`, `states`) has ours.
    let translate = proc.tids.translates();
    let inner_to_ours = if translate {
        proc.tids.inner_to_ours(tids)
    } else {
        HashMap::new()
    };
    let pthread_map = if proc.layout.thread.native_thread_id.is_none() {
        let inner: Vec<i32> = if translate {
            inner_to_ours.keys().copied().collect()
        } else {
            tids.to_vec()
        };
        pthread_to_tid(&proc.mem, &inner, &threads)
    } else {
        HashMap::new()
    };
    threads
        .into_iter()
        .map(|(raw, frames, in_native)| {
            let inner_id = raw
                .native_id
                .or_else(|| pthread_map.get(&raw.thread_id).copied());
            let native_id = if translate {
                inner_id.and_then(|i| inner_to_ours.get(&i).copied())
            } else {
                inner_id
            };
            let running = native_id
                .and_then(|t| states.get(&t))
                .map(|&s| s == 'R')
                .unwrap_or(false);
            let (w, error) = match frames {
                Ok(w) => (w, None),
                Err(e) => (stack::Walk::default(), Some(e)),
            };
            ThreadSnapshot {
                thread_id: raw.thread_id,
                native_id,
                ns_native_id: inner_id.filter(|_| translate),
                name: native_id
                    .filter(|_| thread_names)
                    .and_then(|t| crate::proc::thread_name(pid, t)),
                holds_gil: raw.holds_gil,
                idle: !running && !raw.holds_gil,
                in_native,
                frames: w.frames,
                truncated: w.truncated,
                error,
                interpreter: raw.interp_index,
                read_paused: w.paused,
                evals: w.evals,
                evals_open: w.evals_open,
                anchors: w.anchors,
                native: None,
                unchanged: w.unchanged,
                top_frame: raw.top_frame,
            }
        })
        .collect()
}

type ThreadResult = (
    stack::RawThread,
    std::result::Result<stack::Walk, ThreadError>,
    Option<bool>,
);

/// Why a thread's stack was not read, as a small value: what lost samples are counted by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Unread {
    /// Read without pausing, it changed under every try.
    Changed,
    /// What was read did not hold together: why.
    Torn(&'static str),
    /// A read of its memory failed (an address no longer mapped, a short read).
    Memory,
    /// Its thread state could not be read again.
    ThreadState,
    /// Left for a read with the thread paused (not a loss unless that read fails too).
    Deferred,
    /// The interpreter was not in a state to read (starting, finalizing).
    Interpreter,
    /// Anything else the OS said.
    Other,
}

impl Unread {
    /// The kind of a read's error.
    pub(crate) fn of(e: &Error) -> Unread {
        match e {
            Error::Inconsistent { why, .. } => Unread::Torn(why),
            Error::Read { .. } => Unread::Memory,
            Error::BadState { .. } => Unread::Interpreter,
            _ => Unread::Other,
        }
    }
}

impl std::fmt::Display for Unread {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unread::Changed => f.write_str("the stack changed under every read without pausing"),
            Unread::Torn(why) => write!(f, "inconsistent data: {why}"),
            Unread::Memory => f.write_str("a read of the target's memory failed"),
            Unread::ThreadState => f.write_str("the thread state could not be read again"),
            Unread::Deferred => f.write_str("left for a paused read"),
            Unread::Interpreter => f.write_str("the interpreter was not in a readable state"),
            Unread::Other => f.write_str("another error"),
        }
    }
}

/// A thread whose stack was not read: the kind, and the whole story for a person.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ThreadError {
    pub(crate) kind: Unread,
    message: String,
}

impl ThreadError {
    fn new(kind: Unread, message: impl Into<String>) -> ThreadError {
        ThreadError {
            kind,
            message: message.into(),
        }
    }

    /// `e`, after `context` (what we were doing).
    fn from_error(context: &str, e: &Error) -> ThreadError {
        let message = if context.is_empty() {
            e.to_string()
        } else {
            format!("{context}: {e}")
        };
        ThreadError::new(Unread::of(e), message)
    }
}

impl std::fmt::Display for ThreadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl serde::Serialize for ThreadError {
    /// As its message (the dump's JSON has a string).
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(&self.message)
    }
}

/// Reads the opcode at each thread's innermost instruction and tags CALLs as native.
fn tag_native(
    mem: &dyn ProcessMemory,
    opcodes: Option<&crate::python_bindings::opcodes::Opcodes>,
    threads: &mut [ThreadResult],
) {
    let Some(ops) = opcodes else { return };
    for (_, walk, tag) in threads.iter_mut() {
        let Ok(w) = walk else { continue };
        if let Some(op) = w.top_op {
            *tag = Some(ops.calls.contains(&op));
            continue;
        }
        let Some(addr) = w.top_instr else { continue };
        let mut op = [0u8; 1];
        if mem.read(addr, &mut op).is_ok() {
            *tag = Some(ops.calls.contains(&op[0]));
        }
    }
}

fn gil_current(proc: &PythonProcess, mem: &dyn ProcessMemory) -> Result<Option<u64>> {
    let l = &proc.layout;
    if let (Some(off), Some(rt)) = (l.runtime.gilstate_tstate_current, proc.addrs.runtime) {
        return mem.read_u64(rt.wrapping_add(off as u64)).map(Some);
    }
    if l.runtime.interpreters_head.is_none() {
        if let Some(sym) = proc.addrs.tstate_current {
            return mem.read_u64(sym).map(Some);
        }
    }
    Ok(None)
}

/// The interpreter pointer is NULL: Python is starting up or shutting down. Waits (with the
/// target running, never while paused) up to 200 ms: Ok when it comes up, "exited" when the
/// process goes away meanwhile (a finishing program), else the not-initialized error.
fn settle_uninitialized(proc: &PythonProcess) -> Result<()> {
    let until = std::time::Instant::now() + std::time::Duration::from_millis(200);
    loop {
        if !crate::proc::process_exists(proc.pid) {
            return Err(Error::ProcessExited(proc.pid));
        }
        if matches!(proc.interp_head(), Ok(h) if h != 0) {
            return Ok(());
        }
        if std::time::Instant::now() >= until {
            return interp_head_checked(proc, &proc.mem).map(|_| ());
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

fn interp_head_checked(proc: &PythonProcess, mem: &dyn ProcessMemory) -> Result<u64> {
    let head = proc.interp_head_via(mem)?;
    if head == 0 {
        return Err(Error::BadState {
            pid: proc.pid,
            why: "the interpreter is not initialized (starting up or shutting down)".into(),
        });
    }
    Ok(head)
}

/// How many times a blocking snapshot pauses the process at most (see [`read_blocking`]).
const BLOCKING_PAUSES: usize = 3;

/// How long a blocking snapshot waits at most, before it pauses the process again, for the
/// threads it could not read to run (see [`read_blocking`]).
const RUN_AGAIN_WAIT: std::time::Duration = std::time::Duration::from_millis(20);

/// Pauses every thread and reads them all. A thread can be stopped where its own frame
/// pointers are half written: 3.11's evaluation loop stores `tstate->cframe` (pointing at
/// its new C frame) eight instructions before it fills that C frame's `current_frame` and
/// `previous` (seen in Debian's static 3.11 under load: one dump in ~1,500 read a stale
/// stack word as a frame), and no memory says where the stack was then. Such a thread has
/// no stack to report at that instant, so the process runs again and is paused anew, up to
/// [`BLOCKING_PAUSES`] times in all; what still fails after that is reported as the thread's
/// error. The first pause leaves out the threads of [`SnapshotOptions::unpaused`]; one that
/// turns out to have changed is an error of this kind, and the next pause takes every thread.
/// `tids` is sorted.
fn read_blocking(
    proc: &PythonProcess,
    walker: &mut StackWalker,
    tids: &[i32],
    opts: &SnapshotOptions,
    opcodes: Option<&crate::python_bindings::opcodes::Opcodes>,
    mut extra: PausedReads,
) -> Result<Vec<ThreadResult>> {
    let mut pauses = 0;
    let mut leave_out = !opts.unpaused.is_empty();
    loop {
        pauses += 1;
        let paused_tids: Vec<i32> = if leave_out {
            tids.iter()
                .copied()
                .filter(|t| !opts.unpaused.contains(t))
                .collect()
        } else {
            tids.to_vec()
        };
        // A thread left running: one of `unpaused`, or one not listed (it appeared since).
        // (By our kernel id: the one a thread state records is the target's, which in a
        // PID namespace of its own is another.)
        let ids = KernelIds::new(proc, tids, &opts.tids_by_thread);
        let not_paused = |t: &stack::RawThread| -> bool {
            leave_out
                && ids.of(t).is_none_or(|tid| {
                    opts.unpaused.contains(&tid) || tids.binary_search(&tid).is_err()
                })
        };
        let read = {
            // Left out, the threads expected unchanged are not stopped, nor is any thread
            // that appears meanwhile (read unpaused, it is an error of its own); when none
            // is left to stop, the read is made with none stopped.
            let _paused = match (leave_out, paused_tids.is_empty()) {
                (false, _) => Some(PausedThreads::pause_from(proc.pid, &paused_tids)?),
                (true, false) => Some(PausedThreads::pause_threads(proc.pid, &paused_tids)?),
                (true, true) => None,
            };
            // Nothing changes while paused: one page cache serves the whole snapshot,
            // starting with the pages the last snapshot needed, fetched in one request.
            let cache = ptrace::PageCache::new(&proc.mem);
            if let Some(states) = walker.list_hint(opts.list_whole) {
                cache.prefetch(&states);
            }
            cache.prefetch(&walker.page_hint);
            let read = read_all(proc, &cache, walker, opts, &not_paused).map(|mut t| {
                tag_native(&cache, opcodes, &mut t);
                t
            });
            walker.page_hint = hint_from(&cache);
            if let (Some((reader, out)), Ok(t)) = (extra.tasks.as_mut(), &read) {
                **out = Some(read_tasks(reader, proc, &cache, walker, t));
            }
            // Which of the threads stopped were waiting: the pause woke them (each pause
            // of a snapshot that pauses again does).
            if let Some(p) = &_paused {
                let waited = |&tid: &i32| woke_from_wait(p, proc.pid, tid);
                extra.woken.extend(p.tids().iter().filter(|t| waited(t)));
            }
            // Registers and stacks, straight from the process (not the page cache).
            if let Some((process, out)) = extra.native.as_mut() {
                **out = match &_paused {
                    Some(p) => process.capture_all(p, &proc.mem),
                    None => Vec::new(),
                };
            }
            // The CPU time of each thread that could not be read while it ran its own code
            // (stopped outside any system call), taken while it cannot run.
            let torn: Vec<(i32, u64)> = match &read {
                Ok(t) if pauses < BLOCKING_PAUSES => {
                    let failed = t.iter().filter(|(_, w, _)| w.is_err());
                    failed.filter_map(|(r, _, _)| ids.of(r)).collect()
                }
                _ => Vec::new(),
            }
            .into_iter()
            .filter(|&tid| {
                crate::proc::blocked_syscall(proc.pid, tid).is_some_and(|(nr, _)| nr < 0)
            })
            .filter_map(|tid| Some((tid, crate::proc::thread_run_ns(proc.pid, tid)?)))
            .collect();
            (read, torn)
            // `_paused` drops here: every thread runs again before we do anything else.
        };
        match read {
            (Ok(t), torn) if pauses < BLOCKING_PAUSES && t.iter().any(|(_, w, _)| w.is_err()) => {
                leave_out = false;
                // Caught mid-way (a frame half linked), a thread needs to run a few
                // instructions before it can be read: on a loaded machine it may wait for a
                // CPU longer than we take to pause again (seen: three pauses in a row found
                // the same thread at the same instant).
                crate::proc::wait_until_ran(proc.pid, &torn, RUN_AGAIN_WAIT);
            }
            (r, _) => return r,
        }
    }
}

/// Whether thread `t` is one [`SnapshotOptions::reuse`] lets go unread: it did not run
/// since its last read, its thread state still names the frame that read started from, and
/// it does not hold the GIL (a thread that holds it is about to run, if it is not running).
/// A thread the list took as it was ([`stack::RawThread::rested`]) is one, without a look.
fn is_unchanged(t: &stack::RawThread, reuse: &crate::IdMap<u64, u64>) -> bool {
    t.rested || (!t.holds_gil && reuse.get(&t.thread_id) == Some(&t.top_frame))
}

/// A thread found unchanged: its entry (a walk marked unchanged), or under
/// `omit_unchanged` none, counted in `walker.left_out`.
fn keep_unchanged(
    walker: &mut StackWalker,
    opts: &SnapshotOptions,
    out: &mut Vec<ThreadResult>,
    t: stack::RawThread,
) {
    if opts.omit_unchanged {
        walker.left_out += 1;
    } else {
        out.push((t, Ok(stack::Walk::unchanged()), None));
    }
}

/// Reads everything while the threads are paused (one pause).
fn read_all(
    proc: &PythonProcess,
    mem: &dyn ProcessMemory,
    walker: &mut StackWalker,
    opts: &SnapshotOptions,
    not_paused: &dyn Fn(&stack::RawThread) -> bool,
) -> Result<Vec<ThreadResult>> {
    let reuse = &opts.reuse;
    let head = interp_head_checked(proc, mem)?;
    let raw = walker.threads(mem, head, gil_current(proc, mem)?, opts.rested())?;
    let mut out = Vec::with_capacity(raw.len());
    walker.left_out = 0;
    for t in raw {
        if is_unchanged(&t, reuse) {
            keep_unchanged(walker, opts, &mut out, t);
            continue;
        }
        if not_paused(&t) {
            // Expected unchanged, left running, yet it moved: not to be walked unpaused.
            let e = ThreadError::new(Unread::Changed, "it ran while it was not paused");
            out.push((t, Err(e), None));
            continue;
        }
        let walk = match walker
            .walk_still(mem, t.tstate, t.top_frame)
            .and_then(|mut w| {
                if walker.want_anchors && w.anchors.is_empty() {
                    w.anchors = native::cframe_anchors(walker, mem, t.tstate)?;
                }
                Ok(w)
            }) {
            Ok(w) => Ok(w),
            Err(e) if e.is_process_gone() => return Err(e),
            Err(e) => Err(ThreadError::from_error("", &e)),
        };
        out.push((t, walk, None));
    }
    Ok(out)
}

/// The interpreter's threads, read without pausing from `cache` first, then afresh, in up to
/// `tries` tries; and whether the first try found everything in the cache (then `verify`
/// may check a walk against the cache's second look), and how many threads at rest were
/// left out (under `omit_unchanged`, see [`StackWalker::threads_in_sample`]).
fn thread_list(
    proc: &PythonProcess,
    walker: &mut StackWalker,
    cache: &ptrace::PageCache,
    opts: &SnapshotOptions,
) -> Result<(Vec<stack::RawThread>, bool, usize)> {
    let delta = opts.reuse_delta.as_ref().filter(|_| opts.omit_unchanged);
    let mut last_err = None;
    for attempt in 0..opts.retries.max(1) {
        let fresh = ptrace::PageCache::new(&proc.mem);
        // A try after a failed one reads every state (see `stack::KnownStates`): the
        // states as last found, in one request (not one system call each).
        if attempt > 0 {
            if let Some(states) = walker.list_hint(true) {
                fresh.prefetch(&states);
            }
        }
        let mem = first_then_fresh(attempt, cache, &fresh);
        let read = interp_head_checked(proc, mem).and_then(|head| {
            let gil = gil_current(proc, mem)?;
            walker.threads_in_sample(mem, head, gil, opts.rested(), delta)
        });
        match read {
            Ok((r, left_out)) => return Ok((r, attempt == 0 && cache.misses() == 0, left_out)),
            Err(e) if e.is_process_gone() => return Err(e),
            Err(e) => last_err = Some(e),
        }
    }
    Err(last_err.expect("at least one try"))
}

/// Reads without pausing: a thread's stack is accepted only when, after the walk, every
/// frame of its chain read again (in one request) gives the same frame, line and link, and
/// then the thread's innermost frame is still the one the walk started from — what a second
/// walk would show, at the cost of one system call. (An unchanged top pointer alone proves
/// nothing: ≤3.10 reuses a function's frame object at the same address for its next call,
/// and 3.11+ reuses the same slots of the frame stack.) Otherwise it is read again, and
/// after `retries` tries reported as unreadable; never guessed.
fn read_nonblocking(
    proc: &PythonProcess,
    walker: &mut StackWalker,
    opts: &SnapshotOptions,
) -> Result<Vec<ThreadResult>> {
    // One page cache for the thread list and every thread's first walk, filled at once
    // with the pages the last snapshot needed: what it holds is checked by `verify`. The
    // same request reads the last snapshot's frames and top-frame fields a second time
    // (`second`): a first walk that found everything in the cache is verified against that,
    // microseconds after what it read, without another system call.
    let cache = ptrace::PageCache::new(&proc.mem);
    // A whole read of the thread list is due: the states of the threads at rest come in
    // one request (once a second; no hint has them).
    if let Some(states) = walker
        .list_hint(opts.list_whole)
        .or_else(|| opts.rested().and_then(|r| walker.ran_hint(r)))
    {
        cache.prefetch(&states);
    }
    let second = cache.prefetch_with_second_look(&walker.page_hint, &walker.recheck_hint);
    let (raw, clean, left_out) = thread_list(proc, walker, &cache, opts)?;
    walker.left_out = left_out;
    let auto = opts.mode == ReadMode::Auto;
    walker.deferred = 0;
    // Under a bound on walks, from where the last snapshot stopped (in list order).
    let bound = opts.max_walks.filter(|_| opts.omit_unchanged);
    let mut raw = raw;
    let start = match bound {
        Some(_) if !raw.is_empty() => walker.walk_cursor % raw.len(),
        _ => 0,
    };
    raw.rotate_left(start);
    // The innermost frames of the threads to walk, in one request: those of threads new
    // or back from a rest are in no hint (one system call each otherwise; a pool of a
    // thousand threads starting, or woken at once, has hundreds of them in a sample).
    let fetched = cache.fetches();
    let tops: Vec<(u64, usize)> = raw
        .iter()
        .filter(|t| {
            t.top_frame != 0
                && !is_unchanged(t, &opts.reuse)
                && !(auto && opts.pause_these.contains(&t.thread_id))
        })
        .take(bound.map_or(usize::MAX, |b| b + 1))
        // A busy thread's frames came with the first request (the last snapshot's pages).
        .filter(|t| !cache.holds(t.top_frame, walker.layout.frame.size))
        .map(|t| walker.top_span(t.top_frame))
        .collect();
    cache.prefetch(&tops);
    // That request came after the second look: a walk may hold bytes read after it, and
    // is then verified by a read of its own.
    let late = cache.fetches() > fetched;
    let mut recheck = Recheck::default();
    let mut out = Vec::with_capacity(raw.len());
    let stack_tries = if auto { 1 } else { opts.retries.max(1) };
    let mut skipped = false;
    let (n, mut walks, mut stopped_at) = (raw.len(), 0, None);
    for (k, mut t) in raw.into_iter().enumerate() {
        if is_unchanged(&t, &opts.reuse) {
            keep_unchanged(walker, opts, &mut out, t);
            continue;
        }
        if let Some(most) = bound {
            if walks >= most && !t.holds_gil {
                walker.deferred += 1;
                stopped_at.get_or_insert((start + k) % n);
                continue;
            }
            walks += 1;
        }
        if auto && opts.pause_these.contains(&t.thread_id) {
            skipped = true;
            out.push((
                t,
                Err(ThreadError::new(Unread::Deferred, "to be read paused")),
                None,
            ));
            continue;
        }
        let mut result = Err(ThreadError::new(Unread::Other, "not read"));
        for attempt in 0..stack_tries {
            if attempt > 0 {
                match walker.current_top_frame(&proc.mem, t.tstate) {
                    Ok(top) => t.top_frame = top,
                    Err(e) if e.is_process_gone() => return Err(e),
                    Err(e) => {
                        result = Err(ThreadError::new(
                            Unread::ThreadState,
                            format!("thread state unreadable: {e}"),
                        ));
                        break;
                    }
                }
            }
            let tries = attempt + 1;
            // A retry reads afresh: the shared cache may hold what changed.
            let fresh = ptrace::PageCache::new(&proc.mem);
            let mem = first_then_fresh(attempt, &cache, &fresh);
            let misses = cache.misses();
            let walk = walker.walk(mem, t.top_frame).and_then(|mut w| {
                // Everything this walk read came from the prefetch: the second look, taken
                // after it, can verify it. Otherwise (a miss was read after the second look)
                // the process is read again now.
                let early = attempt == 0 && clean && !late && cache.misses() == misses;
                let again: &dyn ProcessMemory = if early { &second } else { &proc.mem };
                let same = walker.verify(again, t.tstate, &mut w, Some(mem))?;
                Ok((w, same))
            });
            match walk {
                Ok((w, true)) => {
                    recheck.add(walker, t.tstate, &w);
                    result = Ok(w);
                    break;
                }
                Ok((_, false)) => {
                    result = Err(ThreadError::new(
                        Unread::Changed,
                        format!("the stack changed while being read ({tries} tries)"),
                    ))
                }
                Err(e) if e.is_process_gone() || !crate::proc::process_exists(proc.pid) => {
                    return Err(Error::ProcessExited(proc.pid))
                }
                Err(e) => {
                    result = Err(ThreadError::from_error(
                        &format!("the stack changed while being read ({tries} tries)"),
                        &e,
                    ))
                }
            }
        }
        out.push((t, result, None));
    }
    walker.walk_cursor = stopped_at.unwrap_or(0);
    // A thread left to be read paused used nothing here: the pages it needs are in the
    // last hint, kept for that read, right after (and only for it: merged into the next
    // hint, the pages of threads read once would stay in every hint after).
    let hint = hint_from(&cache);
    let last = std::mem::replace(&mut walker.page_hint, hint);
    walker.reread_hint = if skipped { last } else { Vec::new() };
    // Into the last hint's room (it was read by the prefetch above).
    recheck.ranges_into(&mut walker.recheck_hint);
    Ok(out)
}

/// What the next snapshot's second look reads: every verified thread's frames (the ranges
/// its verification read), then the fields that name its innermost frame, in that order
/// (verification reads the frames before the field). Bounded.
#[derive(Default)]
struct Recheck {
    frames: Vec<(u64, usize)>,
    fields: Vec<(u64, usize)>,
}

impl Recheck {
    const MAX_RANGES: usize = 64;
    const MAX_BYTES: usize = 64 * 1024;

    fn add(&mut self, walker: &StackWalker, tstate: u64, w: &Walk) {
        let l = &walker.layout;
        let size = l.frame.size as u64;
        // 3.11+ keeps frames side by side in a frame stack that grows upwards: a little
        // room above the innermost one covers a stack one or two calls deeper next time.
        let room = if matches!(
            l.frame.model,
            crate::python_bindings::FrameModel::Interpreter
        ) {
            4 * size
        } else {
            0
        };
        // The ranges verification read the chain in (`stack::spans` of it).
        for &(start, end) in &w.spans {
            self.frames.push((start, (end - start + room) as usize));
        }
        self.fields
            .push((tstate.wrapping_add(l.thread.frame as u64), 8));
        if let (Some(off), Some(cframe)) = (l.thread.cframe_current_frame, w.top_field) {
            if cframe != 0 {
                self.fields.push((cframe.wrapping_add(off as u64), 8));
            }
        }
    }

    /// The ranges, bounded, in place of what `out` held.
    fn ranges_into(self, out: &mut Vec<(u64, usize)>) {
        out.clear();
        let mut bytes = 0;
        for r in self.frames.into_iter().chain(self.fields) {
            if out.len() >= Self::MAX_RANGES || bytes + r.1 > Self::MAX_BYTES {
                break;
            }
            bytes += r.1;
            out.push(r);
        }
    }
}

/// The shared, pre-filled cache for a first attempt; an empty one for a retry (the shared
/// one may hold what changed). An unused cache costs nothing: pages are read on demand.
fn first_then_fresh<'a>(
    attempt: usize,
    shared: &'a ptrace::PageCache<'a>,
    fresh: &'a ptrace::PageCache<'a>,
) -> &'a dyn ProcessMemory {
    if attempt == 0 {
        shared
    } else {
        fresh
    }
}

/// Most pages a snapshot's prefetch asks for: a thousand thread states on as many pages,
/// each thread's frames besides (two requests of 1,024 ranges; one page's span each).
const MAX_HINT_PAGES: usize = 2048;

/// Most threads a snapshot re-reads paused (see [`reread_paused`]): a pool whose threads
/// all wake at once (to end, say) fails hundreds of reads without pausing in one sample,
/// and pausing each would cost the target and us a millisecond per twenty. The others
/// are lost (counted) for that sample.
const MAX_REREADS: usize = 16;

/// Most pages a paused re-read fetches up front (see [`reread_paused`]).
const REREAD_PREFETCH_PAGES: usize = 64;

/// What is worth fetching up front next time: the bytes `cache` served this time, one
/// range per page (bounded).
fn hint_from(cache: &ptrace::PageCache) -> Vec<(u64, usize)> {
    let mut ranges = cache.used_ranges();
    ranges.truncate(MAX_HINT_PAGES);
    ranges
}

/// `hint` and `more` together, one range per page as each of them is (on a page both
/// name, the span covering both ranges), bounded.
fn with_hint(mut hint: Vec<(u64, usize)>, more: Vec<(u64, usize)>) -> Vec<(u64, usize)> {
    let page = |a: u64| a & !(ptrace::CACHE_PAGE - 1);
    let mut at: HashMap<u64, usize> = hint
        .iter()
        .enumerate()
        .map(|(i, h)| (page(h.0), i))
        .collect();
    for (addr, len) in more {
        let end = addr + len as u64;
        if let Some(h) = at.get(&page(addr)).map(|&i| &mut hint[i]) {
            let start = h.0.min(addr);
            h.1 = ((h.0 + h.1 as u64).max(end) - start) as usize;
            h.0 = start;
        } else if hint.len() < MAX_HINT_PAGES {
            at.insert(page(addr), hint.len());
            hint.push((addr, len));
        }
    }
    hint
}

/// Our kernel ids of thread states (of threads listed in `tids`), None when unknown: the
/// id a thread state records (3.8+), translated when the target lives in another PID
/// namespace (the map made once, when first needed), else the one an earlier snapshot
/// matched (`by_thread`).
struct KernelIds<'a> {
    proc: &'a PythonProcess,
    tids: &'a [i32],
    by_thread: &'a crate::IdMap<u64, i32>,
    inner_to_ours: std::cell::OnceCell<HashMap<i32, i32>>,
}

impl<'a> KernelIds<'a> {
    fn new(
        proc: &'a PythonProcess,
        tids: &'a [i32],
        by_thread: &'a crate::IdMap<u64, i32>,
    ) -> KernelIds<'a> {
        KernelIds {
            proc,
            tids,
            by_thread,
            inner_to_ours: std::cell::OnceCell::new(),
        }
    }

    fn of(&self, t: &stack::RawThread) -> Option<i32> {
        match t.native_id {
            Some(id) if self.proc.tids.translates() => self
                .inner_to_ours
                .get_or_init(|| self.proc.tids.inner_to_ours(self.tids))
                .get(&id)
                .copied(),
            Some(id) => Some(id),
            None => self.by_thread.get(&t.thread_id).copied(),
        }
    }
}

/// Reads again, with the threads paused, the stacks that a read without pausing could not
/// validate (they kept changing). Paused, nothing is torn: the strict checks (meant to catch
/// torn reads) are off, as in `--blocking` — they would reject the transitional states a
/// thread can be stopped in (a generator marked suspended one instruction before its frame
/// leaves the chain). A failure to pause leaves the results as they were (unreadable).
fn reread_paused(
    proc: &PythonProcess,
    walker: &mut StackWalker,
    tids: &[i32],
    tids_by_thread: &crate::IdMap<u64, i32>,
    threads: &mut [ThreadResult],
) -> Result<()> {
    // Only a thread itself changes its stack: pausing the threads to re-read is enough,
    // when their kernel ids are known (recorded in the thread state on 3.11+, else as an
    // earlier snapshot matched them); else every thread is paused.
    //
    // 3.11+ records every thread's kernel id once it runs: a thread state without one
    // (0) belongs to a thread not started yet (or ending), with no frame to read; it is
    // left unread rather than pausing every thread for it (a thousand threads starting
    // would each cost a pause of them all).
    let reread = |t: &stack::RawThread, w: &std::result::Result<stack::Walk, ThreadError>| {
        w.is_err() && (t.native_id.is_some() || walker.layout.thread.native_thread_id.is_none())
    };
    let mut marks: Vec<bool> = threads.iter().map(|(t, w, _)| reread(t, w)).collect();
    if !marks.contains(&true) {
        return Ok(());
    }
    let ids = KernelIds::new(proc, tids, tids_by_thread);
    // A kernel id read from the target's memory is paused only when it is one of the
    // target's threads: listed (`tids` is sorted), or new since and in its task list.
    let of_target = |t: &i32| {
        tids.binary_search(t).is_ok()
            || std::path::Path::new(&format!("/proc/{}/task/{t}", proc.pid)).exists()
    };
    // Whose kernel id is known but no longer the target's has exited: nothing to read (a
    // pool of threads ending together once paused every thread for it, a thousand at a
    // time). Past [`MAX_REREADS`] the others are left unread too.
    let mut only = Some(Vec::new());
    let mut kept = 0;
    for ((t, _, _), m) in threads.iter().zip(marks.iter_mut()).filter(|(_, m)| **m) {
        match ids.of(t) {
            Some(id) if !of_target(&id) => *m = false,
            _ if kept >= MAX_REREADS => *m = false,
            Some(id) => {
                kept += 1;
                if let Some(o) = only.as_mut() {
                    o.push(id);
                }
            }
            None => {
                kept += 1;
                only = None;
            }
        }
    }
    if kept == 0 {
        return Ok(());
    }
    // Two thread states can name one thread: 3.11 starts a new thread's state with the id
    // of the thread that creates it, until the new thread runs. A thread is paused once.
    let only = only.map(|mut ours| {
        ours.sort_unstable();
        ours.dedup();
        ours
    });
    let paused = match &only {
        Some(ours) => PausedThreads::pause_threads(proc.pid, ours),
        None => PausedThreads::pause_from(proc.pid, tids),
    };
    let _paused = match paused {
        Ok(p) => p,
        Err(e) if e.is_process_gone() => return Err(e),
        Err(_) => return Ok(()),
    };
    // What the reads without pausing needed, fetched in one request — unless that is
    // mostly other threads' (a thread list of hundreds): then the few threads re-read
    // fetch their pages as they go.
    let cache = ptrace::PageCache::new(&proc.mem);
    let earlier = std::mem::take(&mut walker.reread_hint);
    if walker.page_hint.len() + earlier.len() <= REREAD_PREFETCH_PAGES {
        cache.prefetch(&walker.page_hint);
        cache.prefetch(&earlier);
    }
    let strict = std::mem::replace(&mut walker.strict, false);
    let result = reread_each(walker, &cache, threads, &marks);
    walker.strict = strict;
    drop(_paused);
    // The next snapshot's prefetch: what this paused read used as well as what the read
    // without pausing did (which, for a thread read paused without a try, is only the
    // thread list: the next paused read would fetch every frame page on its own, one
    // system call each, while the thread waits). What neither used is left out.
    let kept = std::mem::take(&mut walker.page_hint);
    walker.page_hint = with_hint(hint_from(&cache), kept);
    result
}

/// The paused re-read proper of [`reread_paused`].
fn reread_each(
    walker: &mut StackWalker,
    cache: &ptrace::PageCache,
    threads: &mut [ThreadResult],
    marks: &[bool],
) -> Result<()> {
    for ((t, walk, _), _) in threads.iter_mut().zip(marks).filter(|(_, &m)| m) {
        let read = walker
            .current_top_frame(cache, t.tstate)
            .and_then(|top| {
                t.top_frame = top;
                walker.walk_still(cache, t.tstate, top)
            })
            .map(|mut w| {
                // The opcode too, while the thread cannot move on.
                if let Some(at) = w.top_instr {
                    let mut op = [0u8; 1];
                    if cache.read(at, &mut op).is_ok() {
                        w.top_op = Some(op[0]);
                    }
                }
                w.paused = true;
                w
            });
        match read {
            Ok(w) => *walk = Ok(w),
            Err(e) if e.is_process_gone() => return Err(e),
            Err(e) => {
                *walk = Err(ThreadError::from_error(
                    "unreadable even with the thread paused",
                    &e,
                ))
            }
        }
    }
    Ok(())
}

/// glibc on x86-64 keeps the kernel TID at this offset of `struct pthread`; used only to
/// break ties when the scan below finds more than one candidate.
const GLIBC_X86_64_TID_OFFSET: usize = 0x2d0;
/// How much of `struct pthread` to scan for the TID.
const PTHREAD_SCAN: usize = 0x800;

/// ≤3.7 records only the `pthread_t`, which glibc makes the address of `struct pthread`;
/// that struct holds the kernel TID. Find the offset where, for every thread, a TID of
/// this process is stored, and read each thread's TID from it. `tids` are the ids in the
/// target's own PID namespace (what glibc stores), and so are the results.
fn pthread_to_tid(
    mem: &dyn ProcessMemory,
    tids: &[i32],
    threads: &[ThreadResult],
) -> HashMap<u64, i32> {
    let mut blocks = Vec::new();
    for (t, _, _) in threads {
        if t.thread_id == 0 {
            continue;
        }
        if let Ok(b) = mem.read_vec(t.thread_id, PTHREAD_SCAN) {
            blocks.push((t.thread_id, b));
        }
    }
    if blocks.is_empty() {
        return HashMap::new();
    }
    let is_tid = |v: u32| tids.contains(&(v as i32));
    let mut candidates: Vec<usize> = (0..PTHREAD_SCAN - 4)
        .step_by(4)
        .filter(|&off| {
            let values: Vec<u32> = blocks
                .iter()
                .map(|(_, b)| ptrace::field_u32(b, off))
                .collect();
            let mut distinct = values.clone();
            distinct.sort_unstable();
            distinct.dedup();
            values.iter().all(|&v| is_tid(v)) && distinct.len() == values.len()
        })
        .collect();
    if candidates.len() > 1 && candidates.contains(&GLIBC_X86_64_TID_OFFSET) {
        candidates = vec![GLIBC_X86_64_TID_OFFSET];
    }
    let Some(&off) = candidates.first() else {
        return HashMap::new();
    };
    blocks
        .iter()
        .map(|(id, b)| (*id, ptrace::field_u32(b, off) as i32))
        .collect()
}
