//! What a snapshot carries of native frames (`dump --native`, `--native` samples).
//!
//! Owns:
//! - a thread's merged stack ([`NativeView`], its entries [`StackEntry`]);
//! - the threads with no Python thread state ([`OtherThread`]);
//! - the snapshot's native side ([`NativeSummary`]);
//! - which modules hold code of their own ([`is_extension_module`]).
//!
//! Must not: unwind or merge (`native` and `python::native` do), or format output.

use super::frame::Frame;
use super::native::merge_failure::MergeFailure;
use crate::native::NativeFrame;

/// One entry of a merged stack.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub(crate) enum StackEntry {
    Python(Frame),
    Native(NativeFrame),
}

/// A Python thread's stack with its native frames (`dump --native`).
#[derive(Debug, Clone, Default, serde::Serialize)]
pub(crate) struct NativeView {
    /// The native frames were merged with the Python ones.
    pub(crate) merged: bool,
    /// Innermost first: native and Python frames merged; when not merged, the thread's
    /// Python frames alone.
    pub(crate) stack: Vec<StackEntry>,
    /// The merged stack was cut, at the Python walk's depth limit or the native stack's.
    pub(crate) truncated: bool,
    /// Why the frames were not merged.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) unmerged: Option<MergeFailure>,
    /// The native frames as unwound, when they were not merged (for the record).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) native_frames: Vec<NativeFrame>,
    /// The native unwinder stopped before the outermost frame: why.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) unwind_stopped: Option<String>,
}

impl NativeView {
    /// The merged stack as a profile's frames, innermost first (native frames by their
    /// label and module, see [`Frame::of_native`]); None when it was not merged.
    pub(crate) fn profile_frames(&self) -> Option<Vec<Frame>> {
        if !self.merged {
            return None;
        }
        let frames = self
            .stack
            .iter()
            .map(|e| match e {
                StackEntry::Python(f) => f.clone(),
                StackEntry::Native(n) => Frame::of_native(n.function_label(), n.module.as_deref()),
            })
            .collect();
        Some(frames)
    }

    /// Whether the merged stack shows the thread running an extension's or a library's
    /// code for its innermost Python frame. That is when a native frame above that frame
    /// lies in a module that is neither the interpreter's own (its executable, `libpython`)
    /// nor a system library the interpreter calls for itself (the C library, the loader, our
    /// memory library). Then the sample's time is native whatever instruction the Python
    /// frame is at. For example, `a @ a` runs BLAS from a `BINARY_OP`, not a call. None when
    /// not merged, or when the stack shows only the interpreter's own code there (the
    /// instruction decides, as without `--native`).
    pub(crate) fn runs_extension_code(&self) -> Option<bool> {
        if !self.merged {
            return None;
        }
        // No Python frame at all, so nothing to charge.
        let innermost_python = self
            .stack
            .iter()
            .position(|e| matches!(e, StackEntry::Python(_)))?;
        self.stack[..innermost_python]
            .iter()
            .any(|e| {
                matches!(e, StackEntry::Native(n)
                    if n.module.as_deref().is_some_and(is_extension_module))
            })
            .then_some(true)
    }

    /// A native frame in no module the profiler knew (code mapped since its modules were
    /// read, or code in no file), or unwinding that stopped early (in such code).
    pub(crate) fn has_unknown_code(&self) -> bool {
        let unknown = |f: &NativeFrame| f.module.is_none();
        self.unwind_stopped.is_some()
            || self.native_frames.iter().any(unknown)
            || self
                .stack
                .iter()
                .any(|e| matches!(e, StackEntry::Native(n) if unknown(n)))
    }

    /// The thread's native stack could not be taken (a thread started since the map was
    /// read, so its stack is not in it).
    pub(crate) fn has_no_stack(&self) -> bool {
        self.unmerged
            .as_ref()
            .is_some_and(MergeFailure::is_no_stack)
    }
}

/// A thread with no Python thread state (a C library's worker, say): its native stack.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct OtherThread {
    /// Kernel TID, as seen from the profiler's PID namespace.
    pub(crate) native_id: i32,
    pub(crate) name: Option<String>,
    /// Innermost first.
    pub(crate) frames: Vec<NativeFrame>,
    pub(crate) truncated: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) unwind_stopped: Option<String>,
    /// Its stack could not be taken, and why (then `frames` is empty).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) error: Option<String>,
}

/// The native side of a snapshot.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub(crate) struct NativeSummary {
    /// Python threads whose native frames were merged with their Python frames.
    pub(crate) merged: usize,
    /// Python threads whose frames could not be merged (shown with Python frames alone).
    pub(crate) unmerged: usize,
    /// Threads with no Python thread state, each with its native stack.
    pub(crate) other_threads: Vec<OtherThread>,
}

/// Whether module file `name` holds code of its own rather than the interpreter's
/// (`python3.11`, `libpython3.11.so.1.0`) or a system library's that the interpreter calls
/// for itself (`libc.so.6`, `libm.so.6`, the loader, `[vdso]`, our memory library).
pub(crate) fn is_extension_module(name: &str) -> bool {
    const OWN: &[&str] = &[
        "python",
        "libpython",
        "libc.so",
        "libc-",
        "libm.so",
        "libm-",
        "ld-linux",
        "ld-musl",
        "libpthread",
        "libdl.so",
        "librt.so",
        "[vdso]",
        crate::PRELOAD_LIBRARY,
    ];
    !OWN.iter().any(|own| name.starts_with(own))
}
