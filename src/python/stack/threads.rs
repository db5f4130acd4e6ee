//! The thread list: every interpreter's thread states, read whole or in part.
//!
//! Owns: [`RawThread`], the cache of thread states as last read ([`KnownStates`]), and the
//! prefetch hints for the next read of the list.
//! Must not: walk frames, or map thread ids to kernel ones (the caller does).

use super::{torn, LoopCheck, StackWalker};
use crate::error::Result;
use crate::ptrace::{field_u64, ProcessMemory};

/// One thread state as found in the interpreter.
#[derive(Debug, Clone)]
pub(crate) struct RawThread {
    /// Address of the `PyThreadState`.
    pub(crate) tstate: u64,
    /// `thread_id`: the thread's `pthread_t`.
    pub(crate) thread_id: u64,
    /// Kernel TID when the version records it (3.11+).
    pub(crate) native_id: Option<i32>,
    /// Address of the innermost frame when we read the thread state.
    pub(crate) top_frame: u64,
    /// Address of its `PyInterpreterState`.
    pub(crate) interp: u64,
    /// The interpreter's own id (`PyInterpreterState.id`; 0 = main). On 2.7 and 3.6, which
    /// record none, it is its place counted from the end of the list (the main interpreter is
    /// the last, because a new one goes in at the head).
    pub(crate) interp_id: i64,
    /// Whether this thread holds its interpreter's GIL.
    pub(crate) holds_gil: bool,
    /// Taken as the last read found it, unread. The thread is in the `reuse` map the list
    /// was read with, with this innermost frame, and does not hold the GIL (see
    /// [`KnownStates`]). Saves the callers a look-up of that map per thread.
    pub(crate) rested: bool,
}

/// A thread state whose recorded kernel id (3.11+ `native_thread_id`) is no thread of its
/// process, and the thread it is.
/// - Cause: a process forked without `PyOS_AfterFork_Child` (uWSGI's workers by default)
///   keeps the parent's thread states, ids and all. The child's one thread is the forking
///   one under a new id.
/// - Found by the state's `pthread_t`, because fork keeps the forking thread's
///   `struct pthread` where it was and glibc writes the new id into it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct StaleId {
    /// The id the thread state records (in the target's PID namespace).
    pub(crate) recorded: i32,
    /// The thread it is (in the target's PID namespace, as `recorded`).
    pub(crate) actual: i32,
    /// The thread state.
    #[serde(skip)]
    pub(crate) tstate: u64,
}

/// The thread states as reads of the thread list found them, by address.
/// - A thread that has not run since its state was read left that state as it was (its
///   innermost frame, its ids).
/// - Its link to the next state changes only when the next thread leaves the list (a new
///   thread goes in at the head).
///
/// So a list of a thousand threads of which two ran is read in three states (the two and
/// the head), not a thousand. Each state is a request's range and a page the kernel pins,
/// at every sample.
///
/// A thread that leaves the list while its neighbour rests would be found again through
/// the neighbour's old link (it is read, as a thread that changed, until the list is read
/// whole). So every [`FULL_LIST_EVERY`], and after a read that failed, every state is read.
#[derive(Default)]
pub(super) struct KnownStates {
    by_addr: crate::IdMap<u64, KnownState>,
    /// When every state of the list was last read (None: never, or a read failed since).
    full_at: Option<std::time::Instant>,
    /// The number of the current read of the list (marks the entries it met).
    read: u32,
    /// The list as the last read of a sample found it, for the next sample's read of only
    /// the threads that ran (see [`StackWalker::threads_in_sample`]); None after any other
    /// read.
    shape: Option<Shape>,
}

/// The thread list of one interpreter as a sample's read found it, against the caller's
/// map of threads at rest (`reuse`) as of `epoch`. The next sample is given what changed
/// in that map since ([`crate::python::ReuseDelta`]). It reads the states of the threads
/// that did not rest and those whose entry changed, and counts the others, instead of
/// following a thousand links and looking each thread up.
struct Shape {
    /// The interpreter (the only one), its id and its first thread state (a new thread
    /// goes in at the head).
    interp: u64,
    interp_id: i64,
    head: u64,
    /// States on the list.
    len: usize,
    /// The states that were not taken as they were, in list order.
    unrested: Vec<u64>,
    /// Each state by its `thread_id`.
    by_thread: crate::IdMap<u64, u64>,
    epoch: u64,
}

/// A thread state as last read: the thread found, and what its `next` field held.
struct KnownState {
    raw: RawThread,
    interp: u64,
    next: u64,
    /// Its `frame` field (on 3.11/3.12 the `_PyCFrame` that names the top frame).
    frame_field: u64,
    /// The read of the list that last met it.
    met: u32,
    /// Where that read met it in the list (0: the head).
    pos: u32,
}

impl KnownState {
    /// `reuse` names its thread with the innermost frame it was last read with, so it has not
    /// run since (the GIL aside, which the caller checks).
    fn rests_in(&self, reuse: &crate::IdMap<u64, u64>) -> bool {
        reuse.get(&self.raw.thread_id) == Some(&self.raw.top_frame)
    }
}

impl KnownStates {
    /// Whether the next read of the list is to be a whole one (asked for, due, or after
    /// a failed read).
    fn whole(&self, asked: bool) -> bool {
        asked || self.full_at.is_none_or(|t| t.elapsed() >= FULL_LIST_EVERY)
    }

    /// A read of the list begins: whether it is to be a whole one.
    fn begin(&mut self, asked: bool) -> bool {
        self.read = self.read.wrapping_add(1);
        self.whole(asked)
    }

    /// A read of the list ended. States it did not meet are forgotten.
    fn end(&mut self, read: &Result<Vec<RawThread>>, whole: bool) {
        match read {
            Ok(list) => {
                if whole {
                    self.full_at = Some(std::time::Instant::now());
                }
                if self.by_addr.len() > list.len() {
                    let now = self.read;
                    self.by_addr.retain(|_, k| k.met == now);
                }
            }
            Err(_) => self.full_at = None,
        }
    }
}

impl Shape {
    /// The shape of `list` as a read of interpreter `interp` found it, against the map of
    /// `epoch`; None for a list that spans interpreters or names a thread twice.
    fn of(list: &[RawThread], interp: u64, epoch: u64) -> Option<Shape> {
        if list.iter().any(|t| t.interp != interp) {
            return None;
        }
        let mut by_thread = crate::IdMap::default();
        for t in list {
            if by_thread.insert(t.thread_id, t.tstate).is_some() {
                return None;
            }
        }
        Some(Shape {
            interp,
            interp_id: list.first().map_or(0, |t| t.interp_id),
            head: list.first().map_or(0, |t| t.tstate),
            len: list.len(),
            unrested: list
                .iter()
                .filter(|t| !t.rested)
                .map(|t| t.tstate)
                .collect(),
            by_thread,
            epoch,
        })
    }
}

/// How often a sample reads every thread state of the list, whatever the threads did
/// (see [`KnownStates`]). It bounds how long a list changed behind a resting thread goes
/// unseen. A read of a thousand states once a second is a few hundred microseconds.
const FULL_LIST_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// Limits that stop a walk of corrupt or torn memory from running forever.
const MAX_INTERPRETERS: usize = 4096;
/// The largest interpreter id taken as read right (CPython counts them from 0, one per
/// interpreter made).
const MAX_INTERP_ID: u64 = 1 << 32;
const MAX_THREADS: usize = 1 << 16;

impl StackWalker {
    /// Every thread state of every interpreter, starting from the first interpreter.
    /// `gil_tstate_current`: the value of `_PyThreadState_Current` (2.7/3.6) or
    /// `_PyRuntime.gilstate.tstate_current` (3.7–3.11), when the caller has it.
    pub(crate) fn threads(
        &mut self,
        mem: &dyn ProcessMemory,
        interp_head: u64,
        gil_tstate_current: Option<u64>,
        reuse: Option<&crate::IdMap<u64, u64>>,
    ) -> Result<Vec<RawThread>> {
        // A state whose thread is in `reuse` with the innermost frame it was last read
        // with, and which does not hold the GIL, is taken as the last read found it (see
        // [`KnownStates`]); but not at a whole read.
        self.read_threads(mem, interp_head, gil_tstate_current, reuse)
            .0
    }

    /// [`StackWalker::threads`], and whether it read every state (a whole read).
    fn read_threads(
        &mut self,
        mem: &dyn ProcessMemory,
        interp_head: u64,
        gil_tstate_current: Option<u64>,
        reuse: Option<&crate::IdMap<u64, u64>>,
    ) -> (Result<Vec<RawThread>>, bool) {
        self.known_states.shape = None;
        let whole = self.known_states.begin(reuse.is_none());
        let reuse = reuse.filter(|_| !whole);
        let read = self.read_list(mem, interp_head, gil_tstate_current, reuse);
        self.known_states.end(&read, whole);
        (read, whole)
    }

    /// A sample's read of the thread list. It is [`StackWalker::threads`], or only the threads
    /// that did not rest when `delta` says how `reuse` changed since the last sample's read
    /// and that read found one interpreter. Then it reads the states of:
    /// - threads whose entry in `reuse` changed;
    /// - those that ran last time;
    /// - the GIL holder.
    ///
    /// Each is read as `threads` reads it. The result comes with the number of threads at
    /// rest left out. It is what `threads` would give, the threads taken as they were aside.
    ///
    /// The list is read the whole way (every link followed) when:
    /// - its head moved (a thread started);
    /// - a state read shows another link or another thread than last time;
    /// - or every [`FULL_LIST_EVERY`].
    pub(crate) fn threads_in_sample(
        &mut self,
        mem: &dyn ProcessMemory,
        interp_head: u64,
        gil_tstate_current: Option<u64>,
        reuse: Option<&crate::IdMap<u64, u64>>,
        delta: Option<&crate::python::ReuseDelta>,
    ) -> Result<(Vec<RawThread>, usize)> {
        if let (Some(reuse), Some(delta), Some(shape)) =
            (reuse, delta, self.known_states.shape.take())
        {
            let fits = shape.epoch.wrapping_add(1) == delta.epoch
                && shape.interp == interp_head
                && !self.known_states.whole(false);
            if fits {
                match self.ran_since(mem, shape, gil_tstate_current, reuse, delta) {
                    Ok(Some(read)) => return Ok(read),
                    Ok(None) => {}
                    Err(e) => {
                        self.known_states.full_at = None;
                        return Err(e);
                    }
                }
            }
        }
        let (list, whole) = self.read_threads(mem, interp_head, gil_tstate_current, reuse);
        let list = list?;
        // A whole read takes no thread as it was, so it is not a shape to go on from.
        if let (false, Some(_), Some(delta)) = (whole, reuse, delta) {
            self.known_states.shape = Shape::of(&list, interp_head, delta.epoch);
        }
        Ok((list, 0))
    }

    /// [`StackWalker::threads_in_sample`]'s read of the threads that did not rest. None:
    /// the list is to be read the whole way.
    fn ran_since(
        &mut self,
        mem: &dyn ProcessMemory,
        mut shape: Shape,
        gil: Option<u64>,
        reuse: &crate::IdMap<u64, u64>,
        delta: &crate::python::ReuseDelta,
    ) -> Result<Option<(Vec<RawThread>, usize)>> {
        let l = &self.layout;
        let interp = shape.interp;
        if mem.read_u64(interp.wrapping_add(l.interp.tstate_head as u64))? != shape.head
            || mem.read_u64(interp.wrapping_add(l.interp.next as u64))? != 0
        {
            return Ok(None);
        }
        let holder = match gil {
            Some(h) => h,
            None => self.gil_holder_312(mem, interp)?,
        };
        let known = &self.known_states.by_addr;
        let at = |tstate: u64| known.get(&tstate).map(|k| (k.pos, tstate));
        let mut look: Vec<(u32, u64)> =
            Vec::with_capacity(shape.unrested.len() + delta.threads.len() + 1);
        look.extend(shape.unrested.iter().filter_map(|&t| at(t)));
        for thread in &delta.threads {
            if let Some(&t) = shape.by_thread.get(thread) {
                look.extend(at(t));
            }
        }
        if holder != 0 {
            // A state not on the list holds the GIL, so the list changed.
            let Some(h) = at(holder) else { return Ok(None) };
            look.push(h);
        }
        look.sort_unstable();
        look.dedup();
        // Every state left unlooked at is one the way through the links would take as it
        // was. This is checked at every sample of the debug build's tests, because a change of
        // the map missing from `delta` would leave a thread that ran unread.
        #[cfg(debug_assertions)]
        for (addr, k) in &self.known_states.by_addr {
            if !look.iter().any(|&(_, t)| t == *addr) {
                assert!(
                    k.rests_in(reuse),
                    "a thread at rest left out of a sample's read of the list"
                );
            }
        }
        let mut out = Vec::with_capacity(look.len());
        shape.unrested.clear();
        for (_, tstate) in look {
            let holds_gil = tstate == holder;
            let Some(k) = self.known_states.by_addr.get(&tstate) else {
                return Ok(None);
            };
            if !holds_gil && k.rests_in(reuse) {
                // At rest, so taken as it was and left out.
                continue;
            }
            let (was_thread, was_next) = (k.raw.thread_id, k.next);
            let (t, next, frame_field) = self.read_thread(mem, tstate, interp, shape.interp_id)?;
            if next != was_next || t.thread_id != was_thread {
                return Ok(None);
            }
            if let Some(k) = self.known_states.by_addr.get_mut(&tstate) {
                k.raw = t.clone();
                k.frame_field = frame_field;
            }
            shape.unrested.push(tstate);
            out.push(RawThread { holds_gil, ..t });
        }
        let left_out = shape.len - out.len();
        shape.epoch = delta.epoch;
        self.known_states.shape = Some(shape);
        Ok(Some((out, left_out)))
    }

    /// What the next read of the thread list will read of the states as last found, when
    /// it is to be a whole one (`asked`, or due). That is each state's fields and on
    /// 3.11/3.12 its `_PyCFrame`'s, for the caller's prefetch. Read one at a time, a thousand
    /// resting states cost a thousand system calls once a second. None otherwise.
    pub(crate) fn list_hint(&self, asked: bool) -> Option<Vec<(u64, usize)>> {
        let known = &self.known_states;
        if known.by_addr.is_empty() || !known.whole(asked) {
            return None;
        }
        Some(self.state_ranges(|_| true))
    }

    /// What the next read of the thread list will read of the states as last found when
    /// it is not a whole one, for the caller's prefetch. That is the states of the threads
    /// not in `reuse` (they ran), when there are more than a few (a pool waking at once has
    /// hundreds, each a system call of its own otherwise). None otherwise, without a look
    /// at every state.
    pub(crate) fn ran_hint(&self, reuse: &crate::IdMap<u64, u64>) -> Option<Vec<(u64, usize)>> {
        const FEW: usize = 8;
        let known = &self.known_states;
        if known.by_addr.len() <= reuse.len() + FEW {
            return None;
        }
        Some(self.state_ranges(|k| !k.rests_in(reuse)))
    }

    /// What a read of the known states `pick` chooses reads: each one's fields and on
    /// 3.11/3.12 its `_PyCFrame`'s.
    fn state_ranges(&self, pick: impl Fn(&KnownState) -> bool) -> Vec<(u64, usize)> {
        let size = self.state_size();
        let cframe = self.layout.thread.cframe_current_frame;
        let mut out = Vec::new();
        for (&addr, k) in self.known_states.by_addr.iter().filter(|(_, k)| pick(k)) {
            out.push((addr, size));
            if let Some(off) = cframe.filter(|_| k.frame_field != 0) {
                out.push((k.frame_field.wrapping_add(off as u64), 8));
            }
        }
        out
    }

    /// The bytes of a thread state the list reads (up to its last field read).
    fn state_size(&self) -> usize {
        let t = &self.layout.thread;
        [
            t.next,
            t.interp,
            t.frame,
            t.thread_id,
            t.native_thread_id.unwrap_or(0),
        ]
        .into_iter()
        .max()
        .unwrap_or(0)
            + 8
    }

    /// [`StackWalker::threads`]' walk of the lists.
    fn read_list(
        &mut self,
        mem: &dyn ProcessMemory,
        interp_head: u64,
        gil: Option<u64>,
        reuse: Option<&crate::IdMap<u64, u64>>,
    ) -> Result<Vec<RawThread>> {
        let l = &self.layout;
        // Room for as many threads as the last read met.
        let mut out = Vec::with_capacity(self.known_states.by_addr.len());
        let mut interps = LoopCheck::new();
        let mut interp = interp_head;
        let mut index = 0;
        let now = self.known_states.read;
        while interp != 0 {
            if !interps.step(interp) || interps.steps > MAX_INTERPRETERS {
                return Err(torn(interp, "the interpreter list loops"));
            }
            // The place in the list for now. The ids are given once the list is known.
            let interp_id = index;
            let holder = match gil {
                Some(h) => h,
                None => self.gil_holder_312(mem, interp)?,
            };
            let mut tstate = mem.read_u64(interp.wrapping_add(l.interp.tstate_head as u64))?;
            let mut tstates = LoopCheck::new();
            while tstate != 0 {
                if !tstates.step(tstate) || tstates.steps > MAX_THREADS {
                    return Err(torn(tstate, "the thread list loops"));
                }
                let holds_gil = holder != 0 && holder == tstate;
                let rested = match (reuse, self.known_states.by_addr.get_mut(&tstate)) {
                    (Some(reuse), Some(k))
                        if !holds_gil && k.interp == interp && k.rests_in(reuse) =>
                    {
                        k.met = now;
                        k.pos = out.len() as u32;
                        let raw = RawThread {
                            rested: true,
                            ..k.raw.clone()
                        };
                        Some((raw, k.next))
                    }
                    _ => None,
                };
                let (t, next) = match rested {
                    Some(known) => known,
                    None => {
                        let (t, next, frame_field) =
                            self.read_thread(mem, tstate, interp, interp_id)?;
                        let k = KnownState {
                            raw: t.clone(),
                            interp,
                            next,
                            frame_field,
                            met: now,
                            pos: out.len() as u32,
                        };
                        self.known_states.by_addr.insert(tstate, k);
                        (t, next)
                    }
                };
                out.push(RawThread {
                    interp,
                    interp_id,
                    holds_gil,
                    ..t
                });
                tstate = next;
            }
            interp = mem.read_u64(interp.wrapping_add(l.interp.next as u64))?;
            index += 1;
        }
        self.name_interpreters(mem, &mut out, index)?;
        Ok(out)
    }

    /// Gives the threads of a list of `count` interpreters (each `interp_id` its place in
    /// the list) their interpreters' ids.
    /// - One interpreter is the main one (id 0), without a read. The other ids are read only
    ///   where there are subinterpreters.
    /// - Where the version records none (2.7, 3.6), the id is the place counted from the end
    ///   (the main interpreter is the last, because a new one goes in at the head).
    fn name_interpreters(
        &self,
        mem: &dyn ProcessMemory,
        threads: &mut [RawThread],
        count: i64,
    ) -> Result<()> {
        if count <= 1 {
            for t in threads.iter_mut() {
                t.interp_id = 0;
            }
            return Ok(());
        }
        let Some(off) = self.layout.interp.id else {
            for t in threads.iter_mut() {
                t.interp_id = count - 1 - t.interp_id;
            }
            return Ok(());
        };
        let mut ids: Vec<(u64, i64)> = Vec::new();
        for t in threads.iter_mut() {
            if let Some(&(_, id)) = ids.iter().find(|(i, _)| *i == t.interp) {
                t.interp_id = id;
                continue;
            }
            let id = mem.read_u64(t.interp.wrapping_add(off as u64))?;
            if id >= MAX_INTERP_ID {
                return Err(torn(t.interp, "an interpreter id out of range"));
            }
            ids.push((t.interp, id as i64));
            t.interp_id = id as i64;
        }
        Ok(())
    }

    /// 3.12+: the GIL lives in the interpreter (`ceval.gil`). The holder is `last_holder`
    /// while `locked` is set. Returns 0 when nobody holds it or the layout lacks it.
    fn gil_holder_312(&self, mem: &dyn ProcessMemory, interp: u64) -> Result<u64> {
        let i = &self.layout.interp;
        let (Some(gil_ptr), Some(locked), Some(holder)) =
            (i.ceval_gil, i.gil_locked, i.gil_last_holder)
        else {
            return Ok(0);
        };
        let gil = mem.read_u64(interp.wrapping_add(gil_ptr as u64))?;
        if gil == 0 {
            return Ok(0);
        }
        if mem.read_u32(gil.wrapping_add(locked as u64))? == 0 {
            return Ok(0);
        }
        mem.read_u64(gil.wrapping_add(holder as u64))
    }

    /// The thread state at `tstate` of interpreter `interp` (whose id is `interp_id`), and
    /// its `next` and `frame` fields.
    fn read_thread(
        &self,
        mem: &dyn ProcessMemory,
        tstate: u64,
        interp: u64,
        interp_id: i64,
    ) -> Result<(RawThread, u64, u64)> {
        let t = &self.layout.thread;
        let size = self.state_size();
        // On the stack, because a thread state's first fields are a few hundred bytes.
        let mut small = [0u8; 512];
        let large;
        let buf: &[u8] = if size <= small.len() {
            mem.read(tstate, &mut small[..size])?;
            &small[..size]
        } else {
            large = mem.read_vec(tstate, size)?;
            &large
        };
        if field_u64(buf, t.interp) != interp {
            return Err(torn(
                tstate,
                "a thread state does not point back to its interpreter",
            ));
        }
        let frame_field = field_u64(buf, t.frame);
        let top_frame = self.top_frame_from(mem, frame_field)?;
        let raw = RawThread {
            tstate,
            thread_id: field_u64(buf, t.thread_id),
            native_id: t
                .native_thread_id
                .map(|o| field_u64(buf, o) as i32)
                .filter(|&n| n > 0)
                .map(|n| self.corrected_id(tstate, n)),
            top_frame,
            interp,
            interp_id,
            holds_gil: false,
            rested: false,
        };
        Ok((raw, field_u64(buf, t.next), frame_field))
    }

    /// The kernel id of thread state `tstate`, which records `recorded`: the thread it is
    /// when a snapshot found `recorded` stale (see [`StackWalker::stale_ids`]).
    fn corrected_id(&self, tstate: u64, recorded: i32) -> i32 {
        self.stale_ids
            .iter()
            .find(|s| s.tstate == tstate && s.recorded == recorded)
            .map_or(recorded, |s| s.actual)
    }

    /// The innermost frame address from the thread state's `frame` field value
    /// (following `cframe` on 3.11/3.12).
    pub(super) fn top_frame_from(&self, mem: &dyn ProcessMemory, field: u64) -> Result<u64> {
        match self.layout.thread.cframe_current_frame {
            Some(off) if field != 0 => mem.read_u64(field.wrapping_add(off as u64)),
            _ => Ok(field),
        }
    }

    /// Re-reads a thread's innermost frame address (to detect a stack that changed while
    /// it was walked without pausing).
    pub(crate) fn current_top_frame(&self, mem: &dyn ProcessMemory, tstate: u64) -> Result<u64> {
        let field = mem.read_u64(tstate.wrapping_add(self.layout.thread.frame as u64))?;
        self.top_frame_from(mem, field)
    }
}
