//! The one way in to reading a live interpreter's threads.
//!
//! Owns: [`PythonReader`], which holds what one process's reads share (the process, its
//! stack walker, the native modules, the asyncio reader, where the threads' names are),
//! and its one read, [`PythonReader::snapshot`].
//! Must not: list threads, keep what is known of threads at rest (its caller passes a
//! [`RestTracker`]), or format output.

use super::asyncio::AsyncReader;
use super::native;
use super::process::PythonProcess;
use super::read;
use super::read::still::SavedThread;
use super::rest::RestTracker;
use super::snapshot::{ReadMode, Snapshot, SnapshotOptions};
use super::stack::StackWalker;
use super::thread_names::{NamesRead, ThreadNames};
use crate::error::Result;
use crate::native::{Captures, NativeProcess};

/// Reads the stacks of every thread of one Python process, one snapshot at a time.
///
/// What it holds decides what a snapshot has besides the Python stacks:
/// - Native modules ([`PythonReader::set_native`]): every thread's native frames, merged
///   with its Python ones. The threads are paused whatever [`SnapshotOptions::mode`]
///   says, and asyncio tasks are not read.
/// - An asyncio reader ([`PythonReader::with_tasks`]): every event loop's tasks, read in
///   the same pause (without pausing, right after the stacks).
///
/// The walker keeps its caches from one snapshot to the next (code objects, page hints,
/// the thread list as last found).
pub struct PythonReader {
    proc: PythonProcess,
    walker: StackWalker,
    native: Option<NativeProcess>,
    /// The last native snapshot's registers and stacks, as copied in its pause (see
    /// [`PythonReader::attach_native_again`]).
    captures: Captures,
    tasks: Option<AsyncReader>,
    /// Where each interpreter's `threading` keeps its threads, as last found.
    names: ThreadNames,
}

impl PythonReader {
    /// A reader of `proc`'s Python stacks alone.
    pub fn new(proc: PythonProcess) -> PythonReader {
        let walker = StackWalker::new(proc.layout, proc.addrs.types);
        PythonReader {
            proc,
            walker,
            native: None,
            captures: Vec::new(),
            tasks: None,
            names: ThreadNames::default(),
        }
    }

    /// Reads every event loop's asyncio tasks too, with `tasks`.
    pub fn with_tasks(mut self, tasks: AsyncReader) -> PythonReader {
        self.tasks = Some(tasks);
        self
    }

    /// Reads native frames too, with `modules` (see [`native_process`]); with None, no more.
    /// The modules replace those held before.
    ///
    /// [`native_process`]: super::native::native_process
    pub fn set_native(&mut self, modules: Option<NativeProcess>) {
        self.native = modules;
    }

    /// The native modules held, if native frames are read.
    pub fn native(&mut self) -> Option<&mut NativeProcess> {
        self.native.as_mut()
    }

    /// Whether snapshots read asyncio tasks.
    pub fn reads_tasks(&self) -> bool {
        self.tasks.is_some()
    }

    /// The process read.
    pub fn process(&self) -> &PythonProcess {
        &self.proc
    }

    /// The stack walker (its depth limit, its counts of the last snapshot).
    pub fn walker(&self) -> &StackWalker {
        &self.walker
    }

    /// The stack walker, to set its depth limit.
    pub fn walker_mut(&mut self) -> &mut StackWalker {
        &mut self.walker
    }

    /// Reads the stacks of every thread, as `opts` says and with what the reader holds.
    ///
    /// With native modules, the threads are paused, each one's registers and stack copied
    /// in the same pause, and once they run again each stack is unwound and merged with
    /// its Python frames. The copies are kept until the next snapshot (to be unwound again
    /// with modules read anew, `attach_native_again`).
    pub fn snapshot(&mut self, opts: &SnapshotOptions) -> Result<Snapshot> {
        self.snapshot_resting(opts, &mut RestTracker::default())
    }

    /// The names the program gave the threads `wanted` ((interpreter address, thread id)
    /// each), read from each interpreter's `threading` module while the target runs. It
    /// costs a few reads per thread, and a look through `sys.modules` when where `threading`
    /// keeps them is not known yet. Not for every sample, only when the threads change, and
    /// now and then for renames.
    pub(crate) fn python_names(&mut self, wanted: &[(u64, u64)]) -> NamesRead {
        self.names.read(&self.proc, &self.proc.mem, wanted)
    }

    /// Fills each thread's `python_name` (`opts.python_names`), after the read.
    fn name_threads(&mut self, snap: &mut Snapshot) {
        let wanted: Vec<(u64, u64)> = snap
            .threads
            .iter()
            .map(|t| (t.interp_addr, t.thread_id))
            .collect();
        let mut read = self.python_names(&wanted);
        for t in &mut snap.threads {
            t.python_name = read.names.remove(&(t.interp_addr, t.thread_id));
        }
        snap.python_names_unavailable = read.unavailable;
    }

    /// [`PythonReader::snapshot`], for a caller that reads again and again. Threads that
    /// `rest` says have not run since their last read are not walked again (see
    /// [`RestTracker`]), and what this read finds is left in it.
    pub fn snapshot_resting(
        &mut self,
        opts: &SnapshotOptions,
        rest: &mut RestTracker,
    ) -> Result<Snapshot> {
        let Some(process) = self.native.as_mut() else {
            let mut snap = read::snapshot(
                &self.proc,
                &mut self.walker,
                opts,
                rest,
                None,
                self.tasks.as_mut(),
            )?;
            if opts.python_names {
                self.name_threads(&mut snap);
            }
            return Ok(snap);
        };
        let opts = SnapshotOptions {
            mode: ReadMode::Paused,
            ..opts.clone()
        };
        // The last snapshot's copies go before this one's are taken (not both held).
        self.captures.clear();
        let anchors = std::mem::replace(&mut self.walker.want_anchors, true);
        let snap = read::snapshot(
            &self.proc,
            &mut self.walker,
            &opts,
            rest,
            Some((&mut *process, &mut self.captures)),
            None,
        );
        self.walker.want_anchors = anchors;
        let mut snap = snap?;
        native::attach(
            &mut snap,
            process,
            &self.captures,
            (self.proc.version.major, self.proc.version.minor),
            opts.thread_names,
        );
        if opts.python_names {
            self.name_threads(&mut snap);
        }
        Ok(snap)
    }

    /// Reads the stacks of every thread of a saved process (a core's; see
    /// [`PythonProcess::from_core`]), `threads` as saved, with the Python names of
    /// threads when `opts.python_names` asks and each frame's locals when `opts.locals`
    /// does (the rest of `opts` is for live processes).
    /// With native modules ([`PythonReader::set_native`]), `captures` (each thread's
    /// registers and stack, as saved) are unwound and merged with the Python frames.
    pub(crate) fn snapshot_saved(
        &mut self,
        threads: &[SavedThread],
        opts: &SnapshotOptions,
        captures: Captures,
    ) -> Result<Snapshot> {
        let native = self.native.is_some();
        let anchors = std::mem::replace(&mut self.walker.want_anchors, native);
        let snap =
            read::still::snapshot(&self.proc, &mut self.walker, threads, opts.locals.as_ref());
        self.walker.want_anchors = anchors;
        let mut snap = snap?;
        if let Some(process) = self.native.as_mut() {
            self.captures = captures;
            let version = (self.proc.version.major, self.proc.version.minor);
            // No thread names from /proc, because the process is gone.
            native::attach(&mut snap, process, &self.captures, version, false);
        }
        if opts.python_names {
            self.name_threads(&mut snap);
        }
        Ok(snap)
    }

    /// Merges the last native snapshot's stacks into `snap` again, unwound with the
    /// modules held now, after the modules were read again ([`PythonReader::set_native`])
    /// because the stacks met code outside them (an extension mapped since).
    pub(crate) fn attach_native_again(&mut self, snap: &mut Snapshot, thread_names: bool) {
        if let Some(process) = self.native.as_mut() {
            let version = (self.proc.version.major, self.proc.version.minor);
            native::attach(snap, process, &self.captures, version, thread_names);
        }
    }
}
