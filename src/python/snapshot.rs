//! What a read of a Python process gives, and how to ask for one.
//!
//! Owns:
//! - [`Snapshot`] and [`ThreadSnapshot`] (what `dump` prints and what the sampler builds
//!   on);
//! - [`TreeSnapshot`] (`dump --subprocesses`: one per Python process of a tree);
//! - [`SnapshotOptions`] with [`ReadMode`] (how to read);
//! - why a thread's stack was not read ([`Unread`], [`ThreadError`]).
//!
//! Must not: read a process (`read` does), or format output.

use super::asyncio::AsyncSnapshot;
use super::frame::Frame;
use super::native_view::{NativeSummary, NativeView};
use super::stack;
use super::version;
use crate::error::Error;

/// How to read. What the caller knows of threads at rest is in a
/// [`super::RestTracker`] instead.
#[derive(Debug, Clone)]
pub struct SnapshotOptions {
    /// Whether and when the target is paused. With [`ReadMode::Auto`], a thread whose first
    /// read without pausing fails is read paused at once, not tried again without pausing.
    /// A profile wants this. Which states fail to read depends on the state (one that lasts
    /// less than a read fails more often). So retries drawn until one succeeds favour the
    /// states that are easy to read, whereas a paused read is a fresh draw that favours
    /// none.
    pub mode: ReadMode,
    /// Tries per thread when a stack changes while being read ([`ReadMode::Nonblocking`]).
    pub retries: usize,
    /// Read each thread's OS name from /proc (costs a file read per thread).
    pub thread_names: bool,
    /// Read the names the program gave its threads, from each interpreter's `threading`
    /// module (a few reads per thread; see [`super::PythonReader::python_names`]).
    pub python_names: bool,
    /// [`ReadMode::Auto`]: threads (by `thread_id`) read paused without a try first.
    pub pause_these: Vec<u64>,
    /// The target's threads (kernel ids, ours), ascending, for a caller that has just
    /// listed them (the sampler). They are not listed again, and a native read pauses
    /// these. Their scheduler states are then not read (only `idle` tells them). None:
    /// listed from /proc, with each thread's state.
    pub threads: Option<Vec<i32>>,
    /// Each frame's locals too (`dump --locals`), read while the threads are paused (only
    /// in [`ReadMode::Paused`]).
    pub locals: Option<super::locals::LocalsOptions>,
    /// Every greenlet's stack too, where greenlet is imported (`dump`), read in the same
    /// pause as the threads' (without pausing, right after them).
    pub greenlets: bool,
}

/// How stacks are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReadMode {
    /// Without pausing. A stack whose read fails validation is read once more with the
    /// threads paused. This is a profile's default (the sampler also pauses for a while the
    /// threads whose reads often fail, at a bounded rate).
    #[default]
    Auto,
    /// Pause every thread for every read (`--blocking`; `dump`'s default).
    Paused,
    /// Never pause. A stack that keeps changing is retried, then reported as unreadable
    /// (`--nonblocking`).
    Nonblocking,
}

impl Default for SnapshotOptions {
    fn default() -> Self {
        SnapshotOptions {
            mode: ReadMode::Paused,
            retries: 5,
            thread_names: true,
            python_names: true,
            pause_these: Vec::new(),
            threads: None,
            locals: None,
            greenlets: false,
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
    /// The name the program gave the thread (`threading.Thread(name=...)`, read from the
    /// `threading` module of its interpreter); None when not read or not known.
    pub(crate) python_name: Option<String>,
    pub(crate) holds_gil: bool,
    /// Not running on a CPU and not holding the GIL.
    pub(crate) idle: bool,
    /// The innermost Python frame is inside a call (its current instruction is a CALL of
    /// some form). So the thread runs native code or blocks in a C function on behalf of that
    /// line. None when unknown (no opcode table for this version, or no frame).
    pub(crate) in_native: Option<bool>,
    /// Innermost first. In JSON after the other fields, each frame with its locals when
    /// they were read (see [`threads_json`]).
    #[serde(skip)]
    pub frames: Vec<Frame>,
    /// With `dump --locals`: each of `frames`' locals; empty when not read.
    #[serde(skip)]
    pub(crate) locals: Vec<super::locals::FrameLocals>,
    /// The stack was deeper than the limit and was cut.
    pub(crate) truncated: bool,
    /// Set when the stack could not be read consistently; `frames` is then empty.
    pub(crate) error: Option<ThreadError>,
    /// The id of the interpreter the thread state belongs to (0 = main).
    pub(crate) interpreter: i64,
    /// That interpreter's address.
    #[serde(skip)]
    pub(crate) interp_addr: u64,
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
    pub(crate) native: Option<NativeView>,
    /// Not walked, because it did not run since its last read (`RestTracker`'s `reuse`). So
    /// its stack is that read's (`frames` is empty).
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
    /// No generated layout for this version, so read through `_Py_DebugOffsets`, untested.
    pub(crate) untested_version: bool,
    /// A free-threaded build (no GIL).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub(crate) free_threaded: bool,
    pub(crate) executable: std::sync::Arc<str>,
    #[serde(serialize_with = "threads_json")]
    pub threads: Vec<ThreadSnapshot>,
    /// With native frames (`dump --native`): how many threads merged, and the threads with
    /// no Python thread state.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) native: Option<NativeSummary>,
    /// With asyncio tasks (`dump --async`): every event loop's tasks.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) asyncio: Option<AsyncSnapshot>,
    /// Every greenlet's stack (`dump`, where greenlet is imported; not `--greenlets=no`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) greenlets: Option<super::greenlets::GreenletSnapshot>,
    /// Why the threads' Python names could not be read, when they were asked for and
    /// could not be (not when the program has no `threading` module).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) python_names_unavailable: Option<String>,
    /// Threads found unchanged and left out of `threads`
    /// ([`super::RestTracker`]: `omit_unchanged`).
    #[serde(skip)]
    pub(crate) left_out: usize,
    /// Kernel ids (ours) of the threads a paused read stopped in the middle of a wait (a
    /// system call that had blocked). The pause woke them. The CPU time they spend on
    /// leaving the wait and entering it again is ours, not theirs (see
    /// `read::paused::woke_from_wait`).
    #[serde(skip)]
    pub(crate) woken: Vec<i32>,
    /// Thread states that record a kernel id no thread of the process has (a fork without
    /// `PyOS_AfterFork_Child`, as uWSGI's workers), each with the thread it is. Ids as the
    /// target's PID namespace has them.
    #[serde(skip_serializing_if = "Vec::is_empty", rename = "stale_thread_ids")]
    pub(crate) stale_ids: Vec<crate::python::stack::StaleId>,
}

impl Snapshot {
    /// Keeps one thread state per kernel thread. A thread that runs code of another
    /// interpreter (a subinterpreter's `exec` or `run_string`) has a state in each, and
    /// its time is spent in one. That is the state that holds its interpreter's GIL, else
    /// the one of the interpreter with the highest id (as a rule the one entered last,
    /// because an interpreter is made before code runs in it). Threads without a kernel id
    /// stay.
    pub(crate) fn one_state_per_thread(&mut self) {
        // Without a subinterpreter (nearly always) no thread has two states, so one look.
        if self.threads.iter().all(|t| t.interpreter == 0) {
            return;
        }
        let rank = |t: &ThreadSnapshot| (t.holds_gil, t.interpreter);
        let mut best: crate::IdMap<i32, usize> = crate::IdMap::default();
        for (i, t) in self.threads.iter().enumerate() {
            let Some(tid) = t.native_id else { continue };
            match best.get(&tid) {
                Some(&j) if rank(&self.threads[j]) >= rank(t) => {}
                _ => {
                    best.insert(tid, i);
                }
            }
        }
        let mut i = 0;
        self.threads.retain(|t| {
            let keep = t.native_id.is_none_or(|tid| best.get(&tid) == Some(&i));
            i += 1;
            keep
        });
    }

    /// Under `--async` (tasks read, see `PythonReader::with_tasks`), each thread that
    /// runs an asyncio task gets the task's stack instead of its own (see
    /// [`LoopTasks::task_stack`]). The event loop's frames give way to the tasks that await
    /// the running one. `waiting` (`--wall`) gets the stack of every task that waits, by
    /// the `thread_id` of its loop's thread. The tasks leave the snapshot.
    ///
    /// [`LoopTasks::task_stack`]: super::asyncio::LoopTasks::task_stack
    pub(crate) fn use_task_stacks(&mut self, mut waiting: Option<&mut Vec<(u64, Vec<Frame>)>>) {
        if let Some(a) = self.asyncio.take() {
            for lt in &a.threads {
                if let Some(w) = waiting.as_deref_mut().filter(|_| lt.thread_id != 0) {
                    w.extend(lt.waiting_stacks().into_iter().map(|s| (lt.thread_id, s)));
                }
                let Some(stack) = lt.task_stack() else {
                    continue;
                };
                if let Some(t) = self
                    .threads
                    .iter_mut()
                    .find(|t| t.thread_id == lt.thread_id && !t.unchanged && t.error.is_none())
                {
                    t.frames = stack;
                }
            }
        }
    }
}

/// Every Python process of a process tree (`dump --subprocesses`), each read in turn.
/// So the stacks of two processes are not of one moment.
#[derive(Debug, Clone)]
pub struct TreeSnapshot {
    /// The process the tree is of.
    pub(crate) root: i32,
    /// The root's executable when it is not Python itself (then it is not among
    /// `processes`).
    pub(crate) root_not_python: Option<String>,
    /// Each Python process, parents before children.
    pub processes: Vec<ProcessSnapshot>,
}

/// One Python process of a [`TreeSnapshot`].
#[derive(Debug, Clone)]
pub struct ProcessSnapshot {
    pub(crate) pid: i32,
    /// Its parent (None when it could not be read).
    pub(crate) parent: Option<i32>,
    /// Its command line, arguments joined by spaces.
    pub(crate) command: String,
    /// Its executable (/proc/PID/exe).
    pub(crate) executable: String,
    /// Its threads, or why they could not be read (no permission, an unsupported
    /// version).
    pub(crate) read: std::result::Result<Snapshot, String>,
}

pub(super) type ThreadResult = (
    stack::RawThread,
    std::result::Result<stack::Walk, ThreadError>,
    Option<bool>,
);

/// Why a thread's stack was not read, as a small value. Lost samples are counted by it.
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
    pub(super) fn new(kind: Unread, message: impl Into<String>) -> ThreadError {
        ThreadError {
            kind,
            message: message.into(),
        }
    }

    /// `e`, after `context` (what we were doing).
    pub(super) fn from_error(context: &str, e: &Error) -> ThreadError {
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

/// A thread as JSON: its fields, then its frames, each with its locals when read.
#[derive(serde::Serialize)]
struct ThreadJson<'a> {
    #[serde(flatten)]
    thread: &'a ThreadSnapshot,
    frames: Vec<FrameJson<'a>>,
}

/// A frame as JSON: `function`, `filename`, `line`, then `locals` (an array), or
/// `locals_error` (why they were not read), when `dump --locals` read them.
#[derive(serde::Serialize)]
struct FrameJson<'a> {
    #[serde(flatten)]
    frame: &'a Frame,
    #[serde(skip_serializing_if = "Option::is_none")]
    locals: Option<&'a [super::locals::Local]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    locals_error: Option<&'a str>,
}

fn threads_json<S: serde::Serializer>(
    threads: &[ThreadSnapshot],
    s: S,
) -> std::result::Result<S::Ok, S::Error> {
    s.collect_seq(threads.iter().map(|t| {
        ThreadJson {
            thread: t,
            frames: t
                .frames
                .iter()
                .enumerate()
                .map(|(i, frame)| {
                    let l = t.locals.get(i);
                    FrameJson {
                        frame,
                        locals: l.and_then(|l| l.as_ref().ok()).map(|v| &v[..]),
                        locals_error: l.and_then(|l| l.as_ref().err()).map(|e| &e[..]),
                    }
                })
                .collect(),
        }
    }))
}
