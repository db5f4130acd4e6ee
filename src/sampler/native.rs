//! `run --native` / `attach --native`: every sample's threads read with their native
//! frames merged with the Python ones.
//!
//! Owns: [`NativeSampling`] — when one process's modules are read (again, and the sample
//! unwound again, when a sample meets code mapped since; otherwise at most once a second;
//! the reader holds them), the cache of images shared by the processes of a run, and the
//! count of merged and unmerged thread samples with the reasons.
//! Must not: unwind, name or merge frames (`native`, `python::native` do), or charge time.

use crate::native::NativeCache;
use crate::python::{self, PythonReader, Snapshot, SnapshotOptions};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Images by build id, shared by every sampler of a run (16 workers of one program read
/// libpython's symbols and unwind rules once).
pub(crate) type SharedCache = Arc<Mutex<NativeCache>>;

/// The shortest time between two looks at a process's map after a sample met an address
/// in no known module or unwinding that stopped early: when its code mappings changed (an
/// extension imported since), its modules are read again and the sample unwound again.
/// Code in no module at all (ctypes' closures, a JIT) costs one read of the map per
/// interval, no more (a map of a few hundred lines reads in about 100 µs).
const RECHECK_INTERVAL: Duration = Duration::from_millis(20);

/// After such a sample, or one of a thread with no native stack, the modules are read
/// again anyway when they are this old: what else changed (a new thread's stack mapping,
/// which bounds the copy of its stack) is caught within this time, at a cost of one reading
/// a second at most.
const REREAD_INTERVAL: Duration = Duration::from_secs(1);

/// Most distinct reasons kept for unmerged samples (the rest are counted under "other").
const MAX_REASONS: usize = 32;

/// How many thread samples merged, and why the others did not.
#[derive(Debug, Clone, Default)]
pub struct MergeCounts {
    pub merged: u64,
    pub unmerged: u64,
    /// The reasons, each with how often it was given.
    pub reasons: BTreeMap<String, u64>,
}

impl MergeCounts {
    pub(crate) fn add(&mut self, other: &MergeCounts) {
        self.merged += other.merged;
        self.unmerged += other.unmerged;
        for (why, n) in &other.reasons {
            *self.reasons.entry(why.clone()).or_insert(0) += n;
        }
    }

    pub(crate) fn unmerged(&mut self, why: &str) {
        self.unmerged += 1;
        let why = without_addresses(why);
        let why = why.as_str();
        let key = if self.reasons.len() < MAX_REASONS || self.reasons.contains_key(why) {
            why.to_string()
        } else {
            "other reasons".to_string()
        };
        *self.reasons.entry(key).or_insert(0) += 1;
    }
}

/// `why` with each hexadecimal address replaced by `…`: reasons that differ only by an
/// address count as one.
fn without_addresses(why: &str) -> String {
    let mut out = String::with_capacity(why.len());
    let mut rest = why;
    while let Some(i) = rest.find("0x") {
        out.push_str(&rest[..i]);
        let digits = rest[i + 2..]
            .find(|c: char| !c.is_ascii_hexdigit())
            .unwrap_or(rest.len() - i - 2);
        out.push(if digits > 0 { '…' } else { '0' });
        rest = &rest[i + 2 + digits..];
        if digits == 0 {
            out.push('x');
        }
    }
    out.push_str(rest);
    out
}

/// One process's native side of sampling.
pub(crate) struct NativeSampling {
    cache: SharedCache,
    /// When the reader's modules were read; None until the first sample (the reader holds
    /// none until then; when reading them fails, it is tried again at the next sample).
    read_at: Option<Instant>,
    /// A sample met code outside the modules read: look at the map again when allowed.
    stale: bool,
    /// A thread had no native stack (one started since the map was read, whose stack
    /// mapping is not in it): read the modules again when allowed.
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
    /// they were read), the modules are read again and the same captures unwound again: a
    /// new extension's first samples merge too.
    pub(crate) fn snapshot(
        &mut self,
        reader: &mut PythonReader,
        opts: &SnapshotOptions,
    ) -> crate::error::Result<Snapshot> {
        let reread_due = self.read_at.is_none_or(|t| t.elapsed() >= REREAD_INTERVAL);
        if reader.native().is_none() || ((self.stale || self.missing_stack) && reread_due) {
            self.read_modules(reader)?;
        }
        let mut snap = reader.snapshot(opts)?;
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
                None => counts.unmerged(view.unmerged.as_deref().unwrap_or("not merged")),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_that_differ_by_an_address_count_as_one() {
        let mut c = MergeCounts::default();
        c.unmerged("a call of the evaluation loop (0x7ffd1234) lies in no native frame unwound");
        c.unmerged("a call of the evaluation loop (0x7ffd9999) lies in no native frame unwound");
        c.unmerged("0x");
        assert_eq!(c.unmerged, 3);
        assert_eq!(
            c.reasons
                .get("a call of the evaluation loop (…) lies in no native frame unwound"),
            Some(&2)
        );
        assert_eq!(c.reasons.get("0x"), Some(&1));
    }

    #[test]
    fn reasons_beyond_the_limit_are_counted_together() {
        let mut c = MergeCounts::default();
        for i in 0..MAX_REASONS + 5 {
            c.unmerged(&format!("reason {i}"));
        }
        assert_eq!(c.reasons.len(), MAX_REASONS + 1);
        assert_eq!(c.reasons.get("other reasons"), Some(&5));
        let mut sum = MergeCounts::default();
        sum.add(&c);
        sum.add(&c);
        assert_eq!(sum.unmerged, 2 * c.unmerged);
    }
}
