//! Single threads' stacks, read by kernel id while the rest of the process runs. They are
//! for the memory recorder, whose handshake holds the allocating thread in a futex while it
//! is read.
//!
//! Owns:
//! - [`ThreadReader`] (a walker and what makes reads of the same thread cheap from one to
//!   the next);
//! - [`WaitingThread`] (a handshake's stack, Python and native);
//! - [`waiting_view`] (its native frames merged with its Python ones).
//!
//! Must not: pause more than the one thread it reads, or charge anything.

use super::frame::Frame;
use super::native::{self, view_of};
use super::native_view::NativeView;
use super::process::PythonProcess;
use super::read::{gil_current, hint_from, interp_head_checked};
use super::snapshot::{ThreadError, ThreadResult, ThreadSnapshot, Unread};
use super::stack::{self, StackWalker, Walk};
use super::tids::pthread_to_tid;
use crate::error::Result;
use crate::native::NativeProcess;
use crate::ptrace::{self, pause::PausedThreads, ProcessMemory};
use std::collections::HashMap;

/// Reads single threads' stacks by kernel id, without pausing anything, for the memory
/// recorder (the preload library's handshake holds a thread in a futex while we read it).
/// Keeps what makes such reads cheap from one to the next:
/// - a walker (its code cache);
/// - for each thread the pages its last read used (fetched in one request at the next,
///   instead of one system call per object);
/// - on ≤3.7 the `pthread_t` → kernel id map.
pub(crate) struct ThreadReader {
    walker: StackWalker,
    /// ≤3.7 thread states lack the kernel id. They are matched through glibc's `struct
    /// pthread` (found by scanning memory, so only when a Python thread is not in the map yet).
    pthreads: HashMap<u64, i32>,
    /// The Python threads (`pthread_t`) and the kernel's threads there were when `pthreads`
    /// was made.
    mapped: Vec<u64>,
    mapped_tids: Vec<i32>,
    /// Per kernel id, the pages its last read used.
    hints: HashMap<i32, Vec<(u64, usize)>>,
}

/// Threads whose page hints a [`ThreadReader`] keeps (beyond, it starts afresh).
const MAX_HINTED_THREADS: usize = 1024;

impl ThreadReader {
    pub(crate) fn new(proc: &PythonProcess) -> ThreadReader {
        ThreadReader {
            walker: StackWalker::new(proc.layout, proc.addrs.types),
            pthreads: HashMap::new(),
            mapped: Vec::new(),
            mapped_tids: Vec::new(),
            hints: HashMap::new(),
        }
    }

    /// The stack of thread `tid`. For a thread known to be blocked one walk is consistent.
    /// A `running` one's walk is kept only if its stack is unchanged when read again after
    /// it. Ok(None) when no Python thread has that id, or the running thread's stack changed
    /// while we read.
    pub(crate) fn stack_of(
        &mut self,
        proc: &PythonProcess,
        tid: i32,
        running: bool,
    ) -> Result<Option<Vec<Frame>>> {
        // Everything the thread list and the walk need, as the last read of this thread
        // found it, in one request; what moved since is read on its own.
        let cache = ptrace::PageCache::new(&proc.mem);
        if let Some(hint) = self.hints.get(&tid) {
            cache.prefetch(hint);
        }
        let result = self.read(proc, &cache, tid, running);
        if self.hints.len() >= MAX_HINTED_THREADS && !self.hints.contains_key(&tid) {
            self.hints.clear();
        }
        self.hints.insert(tid, hint_from(&cache));
        result
    }

    /// `run --native`: the stack of thread `tid`, which waits in the handshake, with its
    /// native frames. In order:
    /// - it stops that thread alone (the others run on);
    /// - once it is stopped, it asks `still_waiting` whether it was stopped inside its wait
    ///   (a thread whose wait ended runs on elsewhere, so its registers would not be the
    ///   allocation's);
    /// - it copies its registers and stack and reads its Python stack with what the merge
    ///   needs (the calls of the evaluation loop, their marks);
    /// - it lets it go.
    ///
    /// The unwinding and the merge come after, from the copy ([`waiting_view`]).
    ///
    /// The thread usually sleeps in `FUTEX_WAIT` (after a short spin). A ptrace stop
    /// interrupts the system call, which the kernel restarts when the thread resumes
    /// without a signal to handle (`-ERESTART_RESTARTBLOCK`: `futex_wait_restart`, with the
    /// wait's absolute deadline kept). signal(7) lists `FUTEX_WAIT` among the calls a stop
    /// made fail with EINTR only up to Linux 2.6.21. The library's wait loop checks the
    /// answer and its deadline again after every wake-up anyway, so even an early return
    /// would only wait again.
    pub(crate) fn waiting_native(
        &mut self,
        proc: &PythonProcess,
        process: &mut NativeProcess,
        tid: i32,
        still_waiting: &dyn Fn() -> bool,
    ) -> std::result::Result<Option<WaitingThread>, String> {
        // The event names the thread by its id in the target's PID namespace; /proc and
        // ptrace take ours.
        let ours = if proc.tids.translates() {
            let listed = crate::proc::threads(proc.pid).map_err(|e| e.to_string())?;
            *proc
                .tids
                .inner_to_ours(&listed)
                .get(&tid)
                .ok_or("the thread is not in the process's list")?
        } else {
            tid
        };
        let paused = PausedThreads::pause_threads(proc.pid, &[ours])
            .map_err(|e| format!("the thread could not be stopped: {e}"))?;
        if !still_waiting() {
            return Err("stopped after its wait ended".into());
        }
        let capture = process
            .capture_all(&paused, &proc.mem)
            .into_iter()
            .find(|(t, _)| *t == ours)
            .map(|(_, c)| c)
            .unwrap_or_else(|| Err("the thread exited".into()))?;
        let cache = ptrace::PageCache::new(&proc.mem);
        if let Some(hint) = self.hints.get(&tid) {
            cache.prefetch(hint);
        }
        let anchors = std::mem::replace(&mut self.walker.want_anchors, true);
        let read = self.read_walk(proc, &cache, tid, false);
        self.walker.want_anchors = anchors;
        drop(paused);
        if self.hints.len() >= MAX_HINTED_THREADS && !self.hints.contains_key(&tid) {
            self.hints.clear();
        }
        self.hints.insert(tid, hint_from(&cache));
        let Some((raw, w)) = read.map_err(|e| format!("the Python stack: {e}"))? else {
            return Ok(None);
        };
        let thread = ThreadSnapshot {
            locals: Vec::new(),
            thread_id: raw.thread_id,
            native_id: Some(ours),
            ns_native_id: (ours != tid).then_some(tid),
            name: None,
            python_name: None,
            holds_gil: raw.holds_gil,
            idle: false,
            in_native: None,
            frames: w.frames,
            truncated: w.truncated,
            error: None,
            interpreter: raw.interp_id,
            interp_addr: raw.interp,
            read_paused: true,
            evals: w.evals,
            evals_open: w.evals_open,
            anchors: w.anchors,
            native: None,
            unchanged: false,
            top_frame: raw.top_frame,
        };
        Ok(Some(WaitingThread {
            thread,
            capture: Ok(capture),
        }))
    }

    fn read(
        &mut self,
        proc: &PythonProcess,
        cache: &ptrace::PageCache,
        tid: i32,
        running: bool,
    ) -> Result<Option<Vec<Frame>>> {
        Ok(self
            .read_walk(proc, cache, tid, running)?
            .map(|(_, w)| w.frames))
    }

    /// The walk of thread `tid` (see [`ThreadReader::stack_of`]), with the thread it was
    /// found as; on 3.11 with its `_PyCFrame` marks when the walker wants anchors.
    fn read_walk(
        &mut self,
        proc: &PythonProcess,
        cache: &ptrace::PageCache,
        tid: i32,
        running: bool,
    ) -> Result<Option<(stack::RawThread, Walk)>> {
        let walker = &mut self.walker;
        let head = interp_head_checked(proc, cache)?;
        let mut raw = walker.threads(cache, head, gil_current(proc, cache)?, None)?;
        let t = if raw.iter().any(|t| t.native_id.is_some()) {
            if !raw.iter().any(|t| t.native_id == Some(tid)) {
                correct_stale_ids(proc, cache, walker, &mut raw)?;
            }
            raw.into_iter().find(|t| t.native_id == Some(tid))
        } else {
            // ≤3.7: map again when the thread is not in the map and either it is newer than
            // the last mapping or a Python thread came since (glibc reuses a dead thread's
            // `struct pthread`, so a new thread may have an old `pthread_t`). A thread that
            // was there and is still not mapped is not Python (a native library's, say).
            // Mapping again at each of its events would scan every thread's memory.
            let mapped = self.pthreads.values().any(|&t| t == tid);
            if !mapped
                && (!self.mapped_tids.contains(&tid)
                    || raw.iter().any(|t| !self.mapped.contains(&t.thread_id)))
            {
                self.mapped = raw.iter().map(|t| t.thread_id).collect();
                self.mapped_tids = crate::proc::threads(proc.pid)?;
                let results: Vec<ThreadResult> = raw
                    .iter()
                    .map(|t| (t.clone(), Err(ThreadError::new(Unread::Other, "")), None))
                    .collect();
                self.pthreads = pthread_to_tid(&proc.mem, &self.mapped_tids, &results);
            }
            raw.into_iter()
                .find(|t| self.pthreads.get(&t.thread_id) == Some(&tid))
        };
        let Some(t) = t else { return Ok(None) };
        walker.strict = false;
        let mut w = if running {
            walker.walk(cache, t.top_frame)?
        } else {
            walker.walk_still(cache, t.tstate, t.top_frame)?
        };
        // A thread that did not wait for us may have moved on while we read. So keep its
        // stack only if it is still the one we read (then it was so for the whole read).
        if running && !walker.verify(&proc.mem, t.tstate, &mut w, None)? {
            return Ok(None);
        }
        if walker.want_anchors && w.anchors.is_empty() {
            w.anchors = native::cframe_anchors(walker, cache, t.tstate)?;
        }
        Ok(Some((t, w)))
    }
}

/// A thread stopped in the handshake: its Python stack (as a snapshot's thread, with the
/// merge's groups and marks) and its native registers and stack, copied.
pub(crate) struct WaitingThread {
    pub(crate) thread: ThreadSnapshot,
    /// Always `Ok` (kept as a snapshot's capture is, for the merge).
    pub(crate) capture: std::result::Result<crate::native::Capture, String>,
}

/// The native view of a thread stopped in the memory handshake
/// ([`ThreadReader::waiting_native`]), its copy unwound and merged with its Python
/// frames. Unwinding meets an extension mapped since `native`'s modules were read as code
/// in no module ([`NativeView::has_unknown_code`]). Then read them again and call this
/// again.
pub(crate) fn waiting_view(
    w: &WaitingThread,
    native: &mut NativeProcess,
    version: (u32, u32),
) -> NativeView {
    view_of(&w.thread, native, Some(&w.capture), version)
}

/// A thread not found by its id may be one whose state records a stale id (a fork without
/// `PyOS_AfterFork_Child`). This lists the process's threads and corrects `raw` as a
/// snapshot does ([`super::tids::stale_ids`]), keeping the answer in `walker` for the
/// reads after.
fn correct_stale_ids(
    proc: &PythonProcess,
    mem: &dyn ProcessMemory,
    walker: &mut StackWalker,
    raw: &mut [stack::RawThread],
) -> Result<()> {
    let ours = crate::proc::threads(proc.pid)?;
    let mut inner: Vec<i32> = proc.tids.inner_to_ours(&ours).into_keys().collect();
    inner.sort_unstable();
    let found = super::tids::stale_ids(mem, &inner, &raw.iter().collect::<Vec<_>>());
    for t in raw.iter_mut() {
        if let Some(s) = found.iter().find(|s| s.tstate == t.tstate) {
            t.native_id = Some(s.actual);
        }
    }
    walker.stale_ids.extend(found);
    Ok(())
}
