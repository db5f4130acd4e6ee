//! Native frames merged with Python's: each call of the evaluation loop among a thread's
//! native frames is replaced by the Python frames it runs.
//!
//! Owns:
//! - [`merge`]: the rule, per version;
//! - [`attach`]: every thread of a snapshot given its merged stack, and the threads with no
//!   Python thread state their native one;
//! - [`view_of`]: one thread's merged stack;
//! - the process's modules for a reader ([`native_process`], [`check_can_stop`]);
//! - reading 3.11's `_PyCFrame` chain ([`cframe_anchors`]).
//!
//! What a snapshot carries of it is `native_view`'s; a native snapshot is taken by
//! `PythonReader`.
//!
//! The walker says how many Python frames each call of the loop runs (`Walk::evals`):
//! - ≤3.10: one each;
//! - 3.11: up to the `is_entry` frame;
//! - 3.12+: up to an entry frame.
//!
//! Which native frame is which call:
//! - 3.11+: the call's own C frame holds a mark the Python stack points to (3.12+: the
//!   entry frame, a local of `_PyEval_EvalFrameDefault`; 3.11: its `_PyCFrame`). The
//!   native frame whose stack range holds the mark is that call's, symbols or not
//!   (Debian's 3.13+ do not export the loop's symbol).
//! - ≤3.10: the frames of `_PyEval_EvalFrameDefault` (`PyEval_EvalFrameEx` on 2.7), by
//!   symbol.
//!
//! When the calls do not pair up one to one, nothing is guessed. The thread is marked
//! unmerged, shows its Python frames alone, and is counted.
//!
//! Must not: unwind or name native frames (`native` does), or format output.

use super::frame::Frame;
use super::native_view::{NativeSummary, NativeView, OtherThread, StackEntry};
use super::process::PythonProcess;
use super::snapshot::{Snapshot, ThreadSnapshot};
use super::stack::StackWalker;
use crate::error::Result;
use crate::native::{Capture, Captures, NativeCache, NativeFrame, NativeProcess, NativeStack};
use crate::ptrace::ProcessMemory;
use std::collections::HashMap;

pub(super) mod merge_failure;
pub(crate) use merge_failure::{MergeCounts, MergeFailure};

/// The modules of `proc`'s process, for `PythonReader::set_native` (read once, used for
/// many snapshots while the process maps nothing new).
pub fn native_process(proc: &PythonProcess, cache: &mut NativeCache) -> Result<NativeProcess> {
    NativeProcess::new(proc.pid, &proc.mem, proc.namespaces, cache)
}

/// Whether the profiler may stop `proc`'s threads, as `--native` must at every sample. It
/// stops its main thread once and lets it go (Err says why not, e.g. the permission
/// missing), so that a recording that could never read a native frame is refused before it
/// starts.
pub fn check_can_stop(proc: &PythonProcess) -> Result<()> {
    crate::ptrace::pause::PausedThreads::pause_threads(proc.pid, &[proc.pid]).map(drop)
}

/// 3.11: the thread's `_PyCFrame`s, innermost first, without the root one (in the
/// thread state). There is one per call of the evaluation loop, each a local of that call's
/// C frame (see `Walk::anchors`). Empty on other versions (3.12 has them too, but marks its
/// calls by their entry frames).
pub(crate) fn cframe_anchors(
    walker: &StackWalker,
    mem: &dyn ProcessMemory,
    tstate: u64,
) -> Result<Vec<u64>> {
    if walker.layout.version != (3, 11) {
        return Ok(Vec::new());
    }
    walker.cframes(mem, tstate)
}

/// What a native frame is to the merge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    /// A call of the evaluation loop, replaced by the Python frames it runs.
    Eval,
    /// A handler of the tail-call interpreter (3.14+ built with clang, `_TAIL_CALL_*`),
    /// part of the evaluation loop's call below it.
    TailCall,
    Other,
}

fn role(f: &NativeFrame, major: u32) -> Role {
    let Some(name) = f.symbol.as_deref() else {
        return Role::Other;
    };
    // GCC's split-off parts (`.cold`, `.part.0`) belong to the function.
    let base = name.split('.').next().unwrap_or(name);
    let eval = if major == 2 {
        "PyEval_EvalFrameEx"
    } else {
        "_PyEval_EvalFrameDefault"
    };
    if base == eval {
        Role::Eval
    } else if major >= 3 && base.starts_with("_TAIL_CALL_") {
        Role::TailCall
    } else {
        Role::Other
    }
}

/// A merged stack, or why there is none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Merged {
    pub(crate) stack: Vec<StackEntry>,
    pub(crate) truncated: bool,
}

/// The Python frames of one thread, as the walker grouped them.
pub(crate) struct PythonSide<'a> {
    pub(crate) frames: &'a [Frame],
    /// Frames per call of the evaluation loop, innermost first (`Walk::evals`).
    pub(crate) evals: &'a [u32],
    /// Frames after the last complete call (`Walk::evals_open`).
    pub(crate) open: u32,
    /// The Python walk was cut at its depth limit.
    pub(crate) truncated: bool,
    /// 3.11+: an address in each call's own C frame, innermost first (`Walk::anchors`).
    /// The native frame whose stack holds it is that call's. With None (≤3.10), the calls
    /// are the frames of the evaluation loop's symbol.
    pub(crate) anchors: Option<&'a [u64]>,
}

/// Merges a thread's native frames (innermost first) with its Python frames. The native
/// frame of each call of the evaluation loop is replaced by the Python frames of that call,
/// innermost first. Tail-call handlers right above it go with it. Err(why) when the calls
/// do not pair up one to one. A Python stack cut at its depth limit merges as far as it
/// goes and is cut there.
pub(crate) fn merge(
    native: &NativeStack,
    py: &PythonSide,
    major: u32,
) -> std::result::Result<Merged, MergeFailure> {
    let grouped = py.evals.iter().map(|&n| n as usize).sum::<usize>() + py.open as usize;
    if grouped != py.frames.len() {
        return Err(MergeFailure::Ungrouped);
    }
    let roles: Vec<Role> = native.frames.iter().map(|f| role(f, major)).collect();
    let (mut evals, mut anchors) = (py.evals, py.anchors);
    if let (Some(marks @ [.., last]), [.., 0]) = (anchors, evals) {
        // 3.15+ ends every thread's chain with a sentinel frame in the thread state
        // (`base_frame`), owned like an entry frame. A call of the loop has its entry frame
        // among its locals on the C stack; the sentinel never does, and runs no frame.
        if !py.truncated && evals.len() == marks.len() && !native.stack_range.contains(last) {
            evals = &evals[..evals.len() - 1];
            anchors = Some(&marks[..marks.len() - 1]);
        }
    }
    let want = evals.len();
    if let Some(marks @ [first, rest @ ..]) = anchors {
        // 3.11 marks each call by its `_PyCFrame`, which a call pushes (`tstate->cframe`)
        // a few instructions before it links its first frame. Caught between the two, the
        // thread has one mark more than calls with frames. That mark is the innermost, in a
        // native frame inner to the next mark's (or the only mark: the thread's first call
        // of the loop, a main thread starting its module, with no Python frame at all yet).
        // That call runs no Python frame yet, so its frame of the loop is shown as it is,
        // like any call of the loop starting (see below).
        let frame_of = |a: u64| native.sps.partition_point(|&sp| sp <= a);
        if !py.truncated
            && marks.len() == want + 1
            && native.stack_range.contains(first)
            && rest
                .first()
                .is_none_or(|next| frame_of(*first) < frame_of(*next))
        {
            anchors = Some(&marks[1..]);
        }
    }
    let mut calls: Vec<usize> = match anchors {
        Some(anchors) => anchored_calls(native, &roles, anchors, want, py.truncated)?,
        None => (0..roles.len())
            .filter(|&i| roles[i] == Role::Eval)
            .collect(),
    };
    // The innermost call of the loop may be starting (its frame not linked into the
    // thread's Python stack yet) or ending (unlinked already). Either way it is a frame of
    // the loop with no Python frame of its own, shown as it is. This holds only for the
    // innermost, because every other call is in the middle of running its frames.
    match anchors {
        None if !py.truncated && calls.len() == want + 1 && py.open == 0 => {
            calls.remove(0);
        }
        Some(_) => {
            // By mark, the loop's frames known by symbol that hold no mark are at most the
            // innermost one. (Past the last call found, in a stack cut on either side, the
            // calls are not known.)
            let cut = py.truncated || native.truncated;
            let innermost = |i: usize| calls.first().is_none_or(|&first| i < first);
            let unpaired: Vec<usize> = (0..roles.len())
                .filter(|&i| roles[i] == Role::Eval && !calls.contains(&i))
                .filter(|&i| !cut || innermost(i) || calls.last() > Some(&i))
                .collect();
            if unpaired.len() > 1 || unpaired.first().is_some_and(|&i| !innermost(i)) {
                return Err(MergeFailure::UnpairedLoopFrames(unpaired.len()));
            }
        }
        None => {}
    }
    // Cut inside a call:
    // - when the calls are known by symbol, that call's frame is the next one;
    // - by anchor, only the complete calls are known, and the stack is cut after them.
    let open_call = py.truncated && py.open > 0 && anchors.is_none();
    let needed = want + usize::from(open_call);
    // When the native stack is cut at its depth limit before the Python one ends, the calls
    // found are the innermost ones (those past the cut are not unwound), and the merged stack
    // ends where the native frames do.
    let cut_short = native.truncated && calls.len() < needed;
    let pairs = if cut_short {
        py.truncated || py.open == 0
    } else if py.truncated {
        calls.len() >= needed
    } else {
        py.open == 0 && calls.len() == want
    };
    if !pairs {
        return Err(MergeFailure::CallsDiffer {
            native: calls.len(),
            python: want,
            outside: (py.open > 0 && !py.truncated).then_some(py.open),
            stopped: native.stopped.clone(),
            native_cut: native.truncated,
        });
    }
    let paired = if cut_short { calls.len() } else { want };
    let mut stack = Vec::with_capacity(native.frames.len() + py.frames.len());
    let mut at = 0usize;
    let mut call = 0usize;
    let mut truncated = native.truncated;
    for (i, f) in native.frames.iter().enumerate() {
        if calls.get(call) == Some(&i) && call < paired {
            let n = evals[call] as usize;
            stack.extend(
                py.frames[at..at + n]
                    .iter()
                    .cloned()
                    .map(StackEntry::Python),
            );
            at += n;
            call += 1;
            if py.truncated && call == want && !open_call {
                break;
            }
            continue;
        }
        if call == want && calls.get(call) == Some(&i) {
            // The call the Python walk was cut in.
            break;
        }
        let next_other = (i + 1..roles.len()).find(|&j| roles[j] != Role::TailCall);
        if roles[i] == Role::TailCall
            && next_other.is_some_and(|j| calls[call..].first() == Some(&j))
        {
            continue;
        }
        stack.push(StackEntry::Native(f.clone()));
    }
    if py.truncated {
        // - Found by symbol, the frames of the call cut off part way go where its frame is.
        // - By anchor, where that call's frame is is not known, so the stack ends with the
        //   last complete call, exact as far as it goes.
        // (Cut short natively, where the call cut off part way is is not known either.)
        if anchors.is_none() && !cut_short {
            stack.extend(py.frames[at..].iter().cloned().map(StackEntry::Python));
        }
        truncated = true;
    }
    Ok(Merged { stack, truncated })
}

/// The native frames that hold each of the first `want` anchors (see
/// [`PythonSide::anchors`]), innermost first. Err when:
/// - one lies in no frame unwound;
/// - two share a frame;
/// - a frame named by its symbol is not the evaluation loop's (a tail-call handler's
///   included).
///
/// A native stack cut at its depth limit holds only the innermost calls, so the list stops
/// at the first anchor past its outermost frame (whose end is not known).
fn anchored_calls(
    native: &NativeStack,
    roles: &[Role],
    anchors: &[u64],
    want: usize,
    truncated: bool,
) -> std::result::Result<Vec<usize>, MergeFailure> {
    if anchors.len() < want || (!truncated && anchors.len() != want) {
        return Err(MergeFailure::MarksDiffer {
            marks: anchors.len(),
            calls: want,
        });
    }
    let mut calls: Vec<usize> = Vec::with_capacity(want);
    for &a in &anchors[..want] {
        // The frame whose stack range [sps[i], sps[i + 1]) holds the anchor; the
        // outermost frame has no upper bound and so proves nothing.
        let i = native.sps.partition_point(|&sp| sp <= a);
        if i >= native.sps.len() && i > 0 && native.truncated {
            break;
        }
        if i == 0 || i >= native.sps.len() {
            return Err(MergeFailure::MarkInNoFrame {
                mark: a,
                stopped: native.stopped.clone(),
            });
        }
        let i = i - 1;
        if calls.last().is_some_and(|&last| last >= i) {
            return Err(MergeFailure::TwoCallsInOneFrame);
        }
        // Named, it must be the loop's (a tail-call handler runs on a C frame of its own,
        // above the call's, so the mark is never among its locals).
        if let (Some(name), Role::Other | Role::TailCall) = (&native.frames[i].symbol, roles[i]) {
            return Err(MergeFailure::MarkInOtherFunction {
                function: name.clone(),
            });
        }
        calls.push(i);
    }
    Ok(calls)
}

/// Gives every thread of `snap` its native stack (from `captures`, taken while the threads
/// were paused), merged with its Python frames where they pair up, and lists the threads
/// with no Python thread state.
pub(crate) fn attach(
    snap: &mut Snapshot,
    native: &mut NativeProcess,
    captures: &Captures,
    version: (u32, u32),
    thread_names: bool,
) {
    let mut by_tid: HashMap<i32, &std::result::Result<Capture, String>> =
        captures.iter().map(|(tid, c)| (*tid, c)).collect();
    let mut summary = NativeSummary::default();
    // Thread states that share one kernel thread (nested subinterpreters) have one native
    // stack, shared out among them.
    let mut states_of: HashMap<i32, Vec<usize>> = HashMap::new();
    for (i, t) in snap.threads.iter().enumerate() {
        if let Some(tid) = t.native_id {
            states_of.entry(tid).or_default().push(i);
        }
    }
    for i in 0..snap.threads.len() {
        if snap.threads[i].native.is_some() {
            continue;
        }
        let shared = snap.threads[i]
            .native_id
            .and_then(|tid| states_of.get(&tid))
            .filter(|states| states.len() > 1)
            .cloned();
        let views = match shared {
            Some(states) => {
                let capture = snap.threads[i]
                    .native_id
                    .and_then(|tid| by_tid.remove(&tid));
                let ts: Vec<&ThreadSnapshot> = states.iter().map(|&j| &snap.threads[j]).collect();
                let views = views_of_one_thread(&ts, native, capture, version);
                states.into_iter().zip(views).collect::<Vec<_>>()
            }
            None => {
                let capture = snap.threads[i]
                    .native_id
                    .and_then(|tid| by_tid.remove(&tid));
                vec![(i, view_of(&snap.threads[i], native, capture, version))]
            }
        };
        for (j, view) in views {
            if view.merged {
                summary.merged += 1;
            } else {
                summary.unmerged += 1;
            }
            snap.threads[j].native = Some(view);
        }
    }
    let mut others: Vec<_> = by_tid.into_iter().collect();
    others.sort_by_key(|(tid, _)| *tid);
    for (tid, capture) in others {
        let (stack, error) = match capture {
            Ok(c) => (native.stack(c), None),
            Err(e) => (NativeStack::default(), Some(e.clone())),
        };
        summary.other_threads.push(OtherThread {
            native_id: tid,
            name: thread_names
                .then(|| crate::proc::thread_name(snap.pid, tid))
                .flatten(),
            frames: stack.frames,
            truncated: stack.truncated,
            unwind_stopped: stack.stopped,
            error,
        });
    }
    snap.native = Some(summary);
}

/// One Python thread's native view.
pub(super) fn view_of(
    t: &ThreadSnapshot,
    native: &mut NativeProcess,
    capture: Option<&std::result::Result<Capture, String>>,
    version: (u32, u32),
) -> NativeView {
    let python_alone = |why: MergeFailure, native_frames: Vec<NativeFrame>, stopped| NativeView {
        merged: false,
        stack: t.frames.iter().cloned().map(StackEntry::Python).collect(),
        truncated: t.truncated,
        unmerged: Some(why),
        native_frames,
        unwind_stopped: stopped,
    };
    let stack = match capture {
        Some(Ok(c)) => native.stack(c),
        Some(Err(e)) => {
            return python_alone(MergeFailure::NoNativeStack(e.clone()), Vec::new(), None)
        }
        None => return python_alone(MergeFailure::UnknownKernelId, Vec::new(), None),
    };
    if let Some(err) = &t.error {
        return python_alone(
            MergeFailure::PythonNotRead(err.to_string()),
            stack.frames,
            stack.stopped,
        );
    }
    let side = PythonSide {
        frames: &t.frames,
        evals: &t.evals,
        open: t.evals_open,
        truncated: t.truncated,
        anchors: (version >= (3, 11)).then_some(t.anchors.as_slice()),
    };
    match merge(&stack, &side, version.0) {
        Ok(m) => NativeView {
            merged: true,
            stack: m.stack,
            truncated: m.truncated,
            unmerged: None,
            native_frames: Vec::new(),
            unwind_stopped: stack.stopped,
        },
        Err(why) => python_alone(why, stack.frames, stack.stopped),
    }
}

/// The native views of thread states that one kernel thread runs (an interpreter entered
/// from a frame of another, i.e. nested subinterpreters), in `states`' order. One native
/// stack holds the evaluation loop's calls of them all, innermost interpreter first:
/// - the states are put innermost first. The innermost is found by their first mark on the
///   C stack (3.11+, the lowest address is the innermost), else it is the interpreter
///   entered last (highest id);
/// - their Python frames, joined in that order, are merged with the stack as one thread's;
/// - each state shows its part, which is its Python frames and the native frames inner to
///   them up to the next state's (the C code through which its frame runs the next
///   interpreter). The outermost also shows the frames outer to all (`main`, the thread's
///   start).
///
/// Where they cannot be joined (a state not read, cut at its depth, or with frames outside
/// any call) or the joined frames do not pair up, each state says why.
pub(super) fn views_of_one_thread(
    states: &[&ThreadSnapshot],
    native: &mut NativeProcess,
    capture: Option<&std::result::Result<Capture, String>>,
    version: (u32, u32),
) -> Vec<NativeView> {
    let alone = |t: &ThreadSnapshot, why: MergeFailure, stack: &NativeStack| NativeView {
        merged: false,
        stack: t.frames.iter().cloned().map(StackEntry::Python).collect(),
        truncated: t.truncated,
        unmerged: Some(why),
        native_frames: stack.frames.clone(),
        unwind_stopped: stack.stopped.clone(),
    };
    let stack = match capture {
        Some(Ok(c)) => native.stack(c),
        Some(Err(e)) => {
            let why = MergeFailure::NoNativeStack(e.clone());
            let none = NativeStack::default();
            return states
                .iter()
                .map(|t| alone(t, why.clone(), &none))
                .collect();
        }
        None => {
            let none = NativeStack::default();
            let why = MergeFailure::UnknownKernelId;
            return states
                .iter()
                .map(|t| alone(t, why.clone(), &none))
                .collect();
        }
    };
    let anchored = version >= (3, 11);
    let mut order: Vec<usize> = (0..states.len()).collect();
    if anchored && states.iter().all(|t| !t.anchors.is_empty()) {
        order.sort_by_key(|&i| states[i].anchors[0]);
    } else {
        order.sort_by_key(|&i| std::cmp::Reverse(states[i].interpreter));
    }
    let joinable = |t: &ThreadSnapshot| t.error.is_none() && !t.truncated && t.evals_open == 0;
    if let Some(t) = states.iter().find(|t| !joinable(t)) {
        let why = match &t.error {
            Some(e) => MergeFailure::PythonNotRead(e.to_string()),
            None => MergeFailure::Ungrouped,
        };
        return states
            .iter()
            .map(|t| alone(t, why.clone(), &stack))
            .collect();
    }
    let (mut frames, mut evals, mut anchors) = (Vec::new(), Vec::new(), Vec::new());
    for (k, &i) in order.iter().enumerate() {
        let t = states[i];
        let (mut e, mut a) = (&t.evals[..], &t.anchors[..]);
        // 3.15+: every chain but the outermost ends in its thread state's sentinel frame
        // (a call with no frames, no mark on the stack). Only the last is for `merge`.
        if k + 1 < order.len() {
            if let ([.., 0], [.., last]) = (e, a) {
                if e.len() == a.len() && !stack.stack_range.contains(last) {
                    e = &e[..e.len() - 1];
                    a = &a[..a.len() - 1];
                }
            }
        }
        frames.extend(t.frames.iter().cloned());
        evals.extend_from_slice(e);
        anchors.extend_from_slice(a);
    }
    let side = PythonSide {
        frames: &frames,
        evals: &evals,
        open: 0,
        truncated: false,
        anchors: anchored.then_some(anchors.as_slice()),
    };
    let merged = match merge(&stack, &side, version.0) {
        Ok(m) => m,
        Err(why) => {
            return states
                .iter()
                .map(|t| alone(t, why.clone(), &stack))
                .collect()
        }
    };
    // Shares the merged entries out. A native entry goes with the Python frame outer to
    // it; the ones past the last Python frame go with the outermost state.
    let mut parts: Vec<Vec<StackEntry>> = vec![Vec::new(); states.len()];
    let mut owner_of_frame = Vec::with_capacity(frames.len());
    for &i in &order {
        owner_of_frame.extend(std::iter::repeat_n(i, states[i].frames.len()));
    }
    let mut pending = Vec::new();
    let mut seen = 0usize;
    for e in merged.stack {
        match e {
            StackEntry::Python(_) => {
                let owner = owner_of_frame[seen];
                seen += 1;
                parts[owner].append(&mut pending);
                parts[owner].push(e);
            }
            StackEntry::Native(_) => pending.push(e),
        }
    }
    if let Some(&outermost) = order.last() {
        parts[outermost].append(&mut pending);
    }
    parts
        .into_iter()
        .enumerate()
        .map(|(i, part)| NativeView {
            merged: true,
            stack: part,
            truncated: merged.truncated && Some(&i) == order.last(),
            unmerged: None,
            native_frames: Vec::new(),
            unwind_stopped: stack.stopped.clone().filter(|_| Some(&i) == order.last()),
        })
        .collect()
}

#[cfg(test)]
#[path = "native_tests.rs"]
mod tests;
