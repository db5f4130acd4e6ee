//! `dump`: one snapshot of every thread of a running process.
//!
//! Owns: [`DumpConfig`] and the reader [`dump`] builds for it (native modules, asyncio).
//! Must not: format the snapshot (the caller does).

use crate::error::{Error, Result};
use crate::python::{self, LocateOptions, PythonProcess, PythonReader, Snapshot, SnapshotOptions};

/// What `dump` reads.
pub struct DumpConfig {
    pub pid: i32,
    /// Native frames too (`--native`): the threads are paused whatever `snapshot.mode` says.
    pub native: bool,
    /// Every event loop's asyncio tasks too (`--async`; not with `native`).
    pub tasks: bool,
    pub locate: LocateOptions,
    pub snapshot: SnapshotOptions,
    /// Python frames per stack at most.
    pub max_depth: usize,
    /// With `native`: native frames per stack at most.
    pub max_native_depth: usize,
}

/// `dump`: one snapshot of every thread of process `cfg.pid`.
pub fn dump(cfg: &DumpConfig) -> Result<Snapshot> {
    if cfg.pid <= 0 {
        return Err(Error::NoSuchProcess(cfg.pid));
    }
    let proc = PythonProcess::locate(cfg.pid, &cfg.locate)?;
    let mut reader = PythonReader::new(proc);
    reader.walker_mut().max_depth = cfg.max_depth;
    if cfg.native {
        let mut cache = crate::native::NativeCache::new();
        let mut native = python::native_process(reader.process(), &mut cache)?;
        native.set_max_frames(cfg.max_native_depth);
        reader.set_native(Some(native));
    } else if cfg.tasks {
        if let Some(why) = python::async_unsupported(reader.process().layout.version) {
            return Err(Error::NoAsync { pid: cfg.pid, why });
        }
        reader = reader.with_tasks(python::AsyncReader::new());
    }
    reader.snapshot(&cfg.snapshot)
}
