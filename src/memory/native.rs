//! `run --native` (and `attach --native`) with memory: an allocation's native frames. They
//! are read while its thread waits in the handshake, so that its bytes go to the C function
//! that asked for them.
//!
//! Owns: [`NativeStacks`], which is
//! - one process's modules for its memory reader, read before the handshakes start and
//!   again when a stack meets code mapped since;
//! - the stop of the waiting thread for its registers and stack (through
//!   `python::ThreadReader`);
//! - the merge with its Python frames;
//! - the removal of the allocation machinery's own frames ([`without_machinery`]);
//! - the count of stacks read with native frames, and of those that kept their Python
//!   frames alone, with why.
//!
//! Must not:
//! - stop a thread that is not waiting in the handshake;
//! - keep it stopped longer than the copy of its registers and stack and the read of its
//!   Python stack (unwinding and naming come after the answer);
//! - guess frames. A stack that does not merge keeps its Python frames, and is counted.

use super::ring::{layout, Event};
use crate::native::{NativeCache, NativeProcess};
use crate::python::{
    native_process, waiting_view, Frame, MergeCounts, MergeFailure, NativeView, PythonProcess,
    StackEntry, ThreadReader, WaitingThread,
};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Images by build id, shared with the run's samplers (libpython is parsed once).
pub(crate) type SharedCache = Arc<Mutex<NativeCache>>;

/// The shortest time between two looks at the process's map after a stack met code in no
/// module known (as the sampler's `RECHECK_INTERVAL`). Such code is an extension imported
/// since.
const RECHECK_INTERVAL: Duration = Duration::from_millis(20);

/// The preload library's file name, as `run` writes it and `attach` loads it.
const PRELOAD_MODULE: &str = crate::PRELOAD_LIBRARY;

/// The C library's allocation entry points (glibc's public names and its `__libc_` ones).
/// The program called one of them, which our library interposes, and the function that
/// called it asked for the memory.
const LIBC_ALLOCATORS: &[&str] = &[
    "malloc",
    "calloc",
    "realloc",
    "reallocarray",
    "free",
    "posix_memalign",
    "aligned_alloc",
    "memalign",
    "valloc",
    "pvalloc",
    "__libc_malloc",
    "__libc_calloc",
    "__libc_realloc",
    "__libc_memalign",
    "__libc_valloc",
    "__libc_pvalloc",
];

/// CPython's memory-allocator API (and its internal forms, and the debug hooks'), functions
/// whose only work is to pass the request on to the allocator installed (pymalloc,
/// mimalloc, malloc; our library wraps it). Their caller asked for the memory:
/// - an object type's constructor (`PyList_New` through `_PyObject_GC_New`, which stay
///   because they say what kind of object);
/// - a resize (`list_resize`);
/// - an extension's buffer.
const PYTHON_ALLOCATORS: &[&str] = &[
    "PyMem_Malloc",
    "PyMem_Calloc",
    "PyMem_Realloc",
    "PyMem_RawMalloc",
    "PyMem_RawCalloc",
    "PyMem_RawRealloc",
    "PyObject_Malloc",
    "PyObject_Calloc",
    "PyObject_Realloc",
    "_PyMem_RawMalloc",
    "_PyMem_RawCalloc",
    "_PyMem_RawRealloc",
    "_PyObject_Malloc",
    "_PyObject_Calloc",
    "_PyObject_Realloc",
    "_PyMem_DebugMalloc",
    "_PyMem_DebugCalloc",
    "_PyMem_DebugRealloc",
    "_PyMem_DebugRawMalloc",
    "_PyMem_DebugRawCalloc",
    "_PyMem_DebugRawRealloc",
    "_PyMem_DebugRawAlloc",
    "_PyMem_MiMalloc",
    "_PyMem_MiCalloc",
    "_PyMem_MiRealloc",
    "_PyObject_MiMalloc",
    "_PyObject_MiCalloc",
    "_PyObject_MiRealloc",
    "_PyObject_MallocWithType",
    "_PyObject_ReallocWithType",
];

/// Whether a native frame's function is one of the allocators' entry points.
fn is_allocator(symbol: &str) -> bool {
    // GCC's split-off parts (`.cold`, `.part.0`) belong to the function.
    let base = symbol.split('.').next().unwrap_or(symbol);
    LIBC_ALLOCATORS.contains(&base) || PYTHON_ALLOCATORS.contains(&base)
}

/// A merged stack (innermost first) of a thread stopped in the handshake without the frames
/// of the allocation machinery. Those are:
/// - every frame up to the outermost frame of our preload library (the library's own, and
///   what it called: the futex or `sched_yield` system call, the vDSO's clock);
/// - then the allocators' entry points right outside it (the C library's malloc family,
///   CPython's `PyMem_*` / `PyObject_Malloc` family).
///
/// The innermost frame left is the function that asked for the memory. Err when no frame of
/// the library is among the innermost native frames, which means the thread was not stopped
/// in the handshake.
pub(crate) fn without_machinery(stack: &[StackEntry]) -> Result<Vec<StackEntry>, MergeFailure> {
    let native_prefix = stack
        .iter()
        .take_while(|e| matches!(e, StackEntry::Native(_)))
        .count();
    let in_library = |e: &StackEntry| matches!(e, StackEntry::Native(n) if n.module.as_deref() == Some(PRELOAD_MODULE));
    let Some(last) = stack[..native_prefix].iter().rposition(in_library) else {
        return Err(MergeFailure::NoPreloadFrame);
    };
    let mut from = last + 1;
    while let Some(StackEntry::Native(n)) = stack.get(from) {
        if !n.symbol.as_deref().is_some_and(is_allocator) {
            break;
        }
        from += 1;
    }
    Ok(stack[from..].to_vec())
}

/// The native side of one process's memory reader.
pub(crate) struct NativeStacks {
    cache: SharedCache,
    /// The process's modules; None until read, or when reading them failed (tried again
    /// at the next handshake).
    process: Option<NativeProcess>,
    checked_at: Option<Instant>,
    /// Handshakes whose stack has native frames, and those that kept Python frames alone.
    pub(crate) counts: MergeCounts,
}

impl NativeStacks {
    pub(crate) fn new(cache: SharedCache) -> NativeStacks {
        NativeStacks {
            cache,
            process: None,
            checked_at: None,
            counts: MergeCounts::default(),
        }
    }

    /// Reads the process's modules, when not read yet. It reads them before the handshakes
    /// start (the first parse of libpython takes a while; the program's first events wait
    /// for us at startup anyway), and at a handshake after a failed read.
    pub(crate) fn prepare(&mut self, proc: &PythonProcess) {
        if self.process.is_none() {
            self.read_modules(proc);
        }
    }

    fn read_modules(&mut self, proc: &PythonProcess) {
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        self.process = native_process(proc, &mut cache)
            .ok()
            .map(NativeProcess::without_lines);
    }

    /// Stops the thread of event `e` (waiting in the handshake; call before answering it)
    /// and copies what its native stack needs, with its Python stack. None when no Python
    /// thread has its id. Err says why its native stack could not be taken.
    pub(crate) fn take(
        &mut self,
        proc: &PythonProcess,
        reader: &mut ThreadReader,
        e: &Event,
    ) -> Option<Result<WaitingThread, MergeFailure>> {
        self.prepare(proc);
        let Some(process) = self.process.as_mut() else {
            return Some(Err(MergeFailure::ModulesNotRead));
        };
        // Stopped before this, the thread was inside its wait (see HANDSHAKE_WAIT_NS).
        let until = e.time_ns.saturating_add(layout::HANDSHAKE_WAIT_NS);
        reader
            .waiting_native(proc, process, e.tid, &|| layout::now_ns() < until)
            .map_err(MergeFailure::NotTaken)
            .transpose()
    }

    /// After the answer, the stack of `w` with its native frames, without the allocation
    /// machinery's (see [`without_machinery`]), counted. Err(its Python frames alone) when
    /// its frames do not merge, also counted.
    pub(crate) fn finish(
        &mut self,
        proc: &PythonProcess,
        w: &WaitingThread,
    ) -> Result<Vec<Frame>, Vec<Frame>> {
        let version = (proc.version.major, proc.version.minor);
        let Some(process) = self.process.as_mut() else {
            return Err(self.python_only(w, &MergeFailure::ModulesNotRead));
        };
        let mut view = waiting_view(w, process, version);
        let due = self
            .checked_at
            .is_none_or(|t| t.elapsed() >= RECHECK_INTERVAL);
        if view.has_unknown_code() && due {
            // For an extension imported since the modules were read, read them again and
            // unwind the same copy again.
            self.checked_at = Some(Instant::now());
            if process.code_changed().unwrap_or(true) {
                self.read_modules(proc);
                if let Some(process) = self.process.as_mut() {
                    view = waiting_view(w, process, version);
                }
            }
        }
        match frames_of(view) {
            Ok(frames) => {
                self.counts.merged += 1;
                Ok(frames)
            }
            Err(why) => Err(self.python_only(w, &why)),
        }
    }

    /// Counts a stack that keeps its Python frames alone, and returns them.
    pub(crate) fn python_only(&mut self, w: &WaitingThread, why: &MergeFailure) -> Vec<Frame> {
        self.counts.unmerged(why);
        w.thread.frames.clone()
    }
}

/// A merged view's frames without the machinery's, for the profile.
fn frames_of(mut view: NativeView) -> Result<Vec<Frame>, MergeFailure> {
    if !view.merged {
        return Err(view.unmerged.unwrap_or(MergeFailure::NotMerged));
    }
    view.stack = without_machinery(&view.stack)?;
    view.profile_frames().ok_or(MergeFailure::NotMerged)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::native::NativeFrame;

    fn native(symbol: Option<&str>, module: &str) -> StackEntry {
        StackEntry::Native(NativeFrame {
            address: 0x1000,
            symbol: symbol.map(Arc::from),
            module: Some(Arc::from(module)),
            offset: 0x1000,
            file: None,
            line: None,
            function_start: None,
            module_note: None,
        })
    }

    fn python(function: &str) -> StackEntry {
        StackEntry::Python(Frame {
            function: function.into(),
            filename: "app.py".into(),
            line: Some(3),
            native: false,
        })
    }

    fn names(stack: &[StackEntry]) -> Vec<String> {
        stack
            .iter()
            .map(|e| match e {
                StackEntry::Native(n) => n.function_label(),
                StackEntry::Python(f) => f.function.to_string(),
            })
            .collect()
    }

    /// With a C extension's malloc, the futex call, the library's frames and libc's malloc
    /// go. The extension's function is innermost.
    #[test]
    fn the_library_its_callees_and_the_malloc_family_are_dropped() {
        let stack = [
            native(Some("syscall"), "libc.so.6"),
            native(None, PRELOAD_MODULE),
            native(Some("emit"), PRELOAD_MODULE),
            native(Some("malloc"), PRELOAD_MODULE),
            native(Some("alloc_big"), "burnext.so"),
            native(Some("alloc_pair"), "burnext.so"),
            native(Some("cfunction_call"), "libpython3.12.so"),
            python("main"),
        ];
        let kept = without_machinery(&stack).unwrap();
        assert_eq!(
            names(&kept),
            ["alloc_big", "alloc_pair", "cfunction_call", "main"]
        );
    }

    /// For an object of the interpreter's wrapped allocator, CPython's allocator API goes
    /// too, and the object's constructor stays. A `.cold` part counts as its function.
    #[test]
    fn cpythons_allocator_api_is_dropped_its_callers_stay() {
        let stack = [
            native(Some("sched_yield"), "libc.so.6"),
            native(Some("wrapped_malloc"), PRELOAD_MODULE),
            native(Some("PyObject_Malloc.cold"), "libpython3.12.so"),
            native(Some("_PyMem_RawMalloc"), "libpython3.12.so"),
            native(Some("list_resize"), "libpython3.12.so"),
            native(Some("malloc"), "libpython3.12.so"),
            python("main"),
        ];
        let kept = without_machinery(&stack).unwrap();
        // Only the allocators right outside the library go; a later `malloc` is a caller's.
        assert_eq!(names(&kept), ["list_resize", "malloc", "main"]);
    }

    #[test]
    fn a_stack_not_in_the_library_is_refused() {
        let stack = [
            native(Some("alloc_big"), "burnext.so"),
            python("main"),
            native(Some("emit"), PRELOAD_MODULE),
        ];
        assert!(without_machinery(&stack).is_err());
        assert!(without_machinery(&[]).is_err());
    }
}
