//! Native frames merged with Python's: each call of the evaluation loop among a thread's
//! native frames is replaced by the Python frames it runs.
//!
//! Owns: [`merge`] (the rule, per version), [`attach`] (every thread of a snapshot given
//! its merged stack, and the threads with no Python thread state their native one),
//! [`view_of`] (one thread's merged stack), the process's modules for a reader
//! ([`native_process`], [`check_can_stop`]), and reading 3.11's `_PyCFrame` chain
//! ([`cframe_anchors`]). What a snapshot carries of it is `native_view`'s; a native
//! snapshot is taken by `PythonReader`.
//!
//! The walker says how many Python frames each call of the loop runs (`Walk::evals`: one
//! each on ≤3.10; up to the `is_entry` frame on 3.11; up to an entry frame on 3.12+). Which
//! native frame is which call: on 3.11+ the call's own C frame holds a mark the Python
//! stack points to (3.12+: the entry frame, a local of `_PyEval_EvalFrameDefault`; 3.11:
//! its `_PyCFrame`), so the native frame whose stack range holds the mark is that call's,
//! symbols or not (Debian's 3.13+ do not export the loop's symbol); on ≤3.10 the frames of
//! `_PyEval_EvalFrameDefault` (`PyEval_EvalFrameEx` on 2.7), by symbol. When the calls do
//! not pair up one to one nothing is guessed: the thread is marked unmerged, shows its
//! Python frames alone, and is counted.
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

/// Whether the profiler may stop `proc`'s threads, as `--native` must at every sample:
/// stops its main thread once and lets it go (Err: why not, e.g. the permission missing),
/// so that a recording that could never read a native frame is refused before it starts.
pub fn check_can_stop(proc: &PythonProcess) -> Result<()> {
    crate::ptrace::pause::PausedThreads::pause_threads(proc.pid, &[proc.pid]).map(drop)
}

/// 3.11: the thread's `_PyCFrame`s, innermost first, without the root one (in the
/// thread state): one per call of the evaluation loop, each a local of that call's C
/// frame (see `Walk::anchors`). Empty on other versions (3.12 has them too, but marks its
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
    /// A call of the evaluation loop: replaced by the Python frames it runs.
    Eval,
    /// A handler of the tail-call interpreter (3.14+ built with clang, `_TAIL_CALL_*`):
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
    /// 3.11+: an address in each call's own C frame, innermost first (`Walk::anchors`):
    /// the native frame whose stack holds it is that call's. None (≤3.10): the calls are
    /// the frames of the evaluation loop's symbol.
    pub(crate) anchors: Option<&'a [u64]>,
}

/// Merges a thread's native frames (innermost first) with its Python frames: the native
/// frame of each call of the evaluation loop is replaced by the Python frames of that call,
/// innermost first; tail-call handlers right above it go with it. Err(why) when the calls
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
        // (`base_frame`), owned like an entry frame: a call of the loop has its entry frame
        // among its locals on the C stack, the sentinel never does, and runs no frame.
        if !py.truncated && evals.len() == marks.len() && !native.stack_range.contains(last) {
            evals = &evals[..evals.len() - 1];
            anchors = Some(&marks[..marks.len() - 1]);
        }
    }
    let want = evals.len();
    if let Some(marks @ [first, rest @ ..]) = anchors {
        // 3.11 marks each call by its `_PyCFrame`, which a call pushes (`tstate->cframe`)
        // a few instructions before it links its first frame: caught between the two, the
        // thread has one mark more than calls with frames, the innermost, in a native frame
        // inner to the next mark's (or the only mark: the thread's first call of the loop,
        // a main thread starting its module, with no Python frame at all yet). That call
        // runs no Python frame yet: its frame of the loop is shown as it is, like any call
        // of the loop starting (see below).
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
    // thread's Python stack yet) or ending (unlinked already): a frame of the loop with no
    // Python frame of its own, shown as it is. Only the innermost: every other call is in
    // the middle of running its frames.
    match anchors {
        None if !py.truncated && calls.len() == want + 1 && py.open == 0 => {
            calls.remove(0);
        }
        Some(_) => {
            // By mark, the loop's frames known by symbol that hold no mark: at most the
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
    // Cut inside a call: that call's frame is the next one, when the calls are known by
    // symbol; by anchor, only the complete calls are known, and the stack is cut after them.
    let open_call = py.truncated && py.open > 0 && anchors.is_none();
    let needed = want + usize::from(open_call);
    // The native stack cut at its depth limit before the Python one ends: the calls found
    // are the innermost ones (those past the cut are not unwound), and the merged stack
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
        // Found by symbol, the frames of the call cut off part way go where its frame is;
        // by anchor, where that call's frame is is not known: the stack ends with the last
        // complete call, exact as far as it goes. (Cut short natively, where the call
        // cut off part way is is not known either.)
        if anchors.is_none() && !cut_short {
            stack.extend(py.frames[at..].iter().cloned().map(StackEntry::Python));
        }
        truncated = true;
    }
    Ok(Merged { stack, truncated })
}

/// The native frames that hold each of the first `want` anchors (see
/// [`PythonSide::anchors`]), innermost first. Err when one lies in no frame unwound, two
/// share a frame, or a frame named by its symbol is not the evaluation loop's (a tail-call
/// handler's included). A native
/// stack cut at its depth limit holds only the innermost calls: the list stops at the
/// first anchor past its outermost frame (whose end is not known).
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
        // above the call's: the mark is never among its locals).
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
    for t in &mut snap.threads {
        let capture = t.native_id.and_then(|tid| by_tid.remove(&tid));
        let view = view_of(t, native, capture, version);
        if view.merged {
            summary.merged += 1;
        } else {
            summary.unmerged += 1;
        }
        t.native = Some(view);
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

#[cfg(test)]
#[path = "native_tests.rs"]
mod tests;
