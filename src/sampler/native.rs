//! `run --native` / `attach --native`: every sample's threads read with their native
//! frames merged with the Python ones.
//!
//! Owns: [`NativeSampling`], which covers:
//! - when one process's modules are read (again, and the sample unwound again, when a
//!   sample meets code mapped since; otherwise at most once a second; the reader holds
//!   them);
//! - the cache of images shared by the processes of a run;
//! - counting merged and unmerged thread samples with the reasons (in a [`MergeCounts`]).
//!
//! Must not: unwind, name or merge frames (`native`, `python::native` do), or charge time.

use crate::native::NativeCache;
pub(crate) use crate::python::MergeCounts;
use crate::python::{self, MergeFailure, PythonReader, Snapshot, SnapshotOptions};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Images by build id, shared by every sampler of a run (16 workers of one program read
/// libpython's symbols and unwind rules once).
pub(crate) type SharedCache = Arc<Mutex<NativeCache>>;

/// The shortest time between two looks at a process's map after a sample met an address
/// in no known module or unwinding that stopped early. When its code mappings changed (an
/// extension imported since), its modules are read again and the sample unwound again.
/// Code in no module at all (ctypes' closures, a JIT) costs one read of the map per
/// interval, no more (a map of a few hundred lines reads in about 100 µs).
const RECHECK_INTERVAL: Duration = Duration::from_millis(20);

/// After such a sample, or one of a thread with no native stack, the modules are read
/// again anyway when they are this old. So what else changed (a new thread's stack
/// mapping, which bounds the copy of its stack) is caught within this time, at a cost of
/// one reading a second at most.
const REREAD_INTERVAL: Duration = Duration::from_secs(1);

/// One process's native side of sampling.
pub(crate) struct NativeSampling {
    cache: SharedCache,
    /// When the reader's modules were read; None until the first sample (the reader holds
    /// none until then; when reading them fails, it is tried again at the next sample).
    read_at: Option<Instant>,
    /// A sample met code outside the modules read, so look at the map again when allowed.
    stale: bool,
    /// A thread had no native stack (one started since the map was read, whose stack
    /// mapping is not in it), so read the modules again when allowed.
    missing_stack: bool,
    /// When the map was last looked at.
    checked_at: Option<Instant>,
}

impl NativeSampling {
    pub(crate) fn new(cache: SharedCache) -> NativeSampling {
        NativeSampling {
            cache,
            read_at: None,
            stale: false,
            missing_stack: false,
            checked_at: None,
        }
    }

    /// One snapshot of every thread of `opts.threads` with its native frames (the threads
    /// are paused for it whatever `opts.mode` says). When its stacks meet code outside the
    /// modules known and the process's code mappings changed (an extension imported since
    /// they were read), the modules are read again and the same captures unwound again. So
    /// a new extension's first samples merge too.
    pub(crate) fn snapshot(
        &mut self,
        reader: &mut PythonReader,
        opts: &SnapshotOptions,
        rest: &mut python::RestTracker,
    ) -> crate::error::Result<Snapshot> {
        let reread_due = self.read_at.is_none_or(|t| t.elapsed() >= REREAD_INTERVAL);
        if reader.native().is_none() || ((self.stale || self.missing_stack) && reread_due) {
            self.read_modules(reader)?;
        }
        let mut snap = reader.snapshot_resting(opts, rest)?;
        let unknown = snap
            .threads
            .iter()
            .any(|t| t.native.as_ref().is_some_and(|v| v.has_unknown_code()));
        let check_due = self
            .checked_at
            .is_none_or(|t| t.elapsed() >= RECHECK_INTERVAL);
        if unknown && check_due {
            self.checked_at = Some(Instant::now());
            let process = reader.native().expect("read above");
            if process.code_changed().unwrap_or(true) {
                self.read_modules(reader)?;
                reader.attach_native_again(&mut snap, opts.thread_names);
            }
        }
        Ok(snap)
    }

    /// Reads the process's modules (images from the shared cache when it has them), for
    /// `reader` to hold.
    fn read_modules(&mut self, reader: &mut PythonReader) -> crate::error::Result<()> {
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        let process = python::native_process(reader.process(), &mut cache)?.without_lines();
        reader.set_native(Some(process));
        self.read_at = Some(Instant::now());
        self.stale = false;
        self.missing_stack = false;
        Ok(())
    }

    /// Replaces each thread's Python frames in `snap` by its merged stack, counting in
    /// `counts` the threads that merged and those that did not (which keep their Python
    /// frames).
    pub(crate) fn merge_into(&mut self, snap: &mut Snapshot, counts: &mut MergeCounts) {
        for t in &mut snap.threads {
            let Some(view) = t.native.take() else {
                continue;
            };
            if t.error.is_some() || t.unchanged {
                // Lost either way (counted as an error by the sampler); or not read, as it
                // did not run since its last read (whose merged stack it keeps).
                continue;
            }
            self.stale |= view.has_unknown_code();
            self.missing_stack |= view.has_no_stack();
            match view.profile_frames() {
                Some(frames) => {
                    counts.merged += 1;
                    t.frames = frames;
                    if view.runs_extension_code() == Some(true) {
                        t.in_native = Some(true);
                    }
                }
                None => counts.unmerged(view.unmerged.as_ref().unwrap_or(&MergeFailure::NotMerged)),
            }
        }
    }
}
