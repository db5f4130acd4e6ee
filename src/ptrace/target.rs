//! The memory a target is read through: [`TargetMemory`], a live process's or one saved
//! (a core file's).
//!
//! Owns: the choice between the two, and handing every read to the one chosen (each
//! method of the trait, so that what a live process's reads do best, many ranges in one
//! system call, is kept).
//! Must not: know where saved memory comes from (`coredump` makes it), or cache.

use super::live::RemoteMemory;
use super::memory::ProcessMemory;
use crate::error::Result;
use std::sync::Arc;

/// A target's memory: a live process's, or memory saved from one.
pub enum TargetMemory {
    /// A running process, read as it runs.
    Live(RemoteMemory),
    /// Memory that cannot change (a core file's).
    Saved(Arc<dyn ProcessMemory + Send + Sync>),
}

impl TargetMemory {
    fn inner(&self) -> &dyn ProcessMemory {
        match self {
            TargetMemory::Live(m) => m,
            TargetMemory::Saved(m) => &**m,
        }
    }
}

impl ProcessMemory for TargetMemory {
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<()> {
        self.inner().read(addr, buf)
    }
    fn read_prefix(&self, addr: u64, buf: &mut [u8]) -> Result<usize> {
        self.inner().read_prefix(addr, buf)
    }
    fn read_many(&self, reqs: &mut [(u64, &mut [u8])]) -> usize {
        self.inner().read_many(reqs)
    }
    fn prefetch(&self, ranges: &[(u64, usize)]) {
        self.inner().prefetch(ranges)
    }
    fn prefetches(&self) -> bool {
        self.inner().prefetches()
    }
    fn read_append(&self, addr: u64, len: usize, out: &mut Vec<u8>) -> Result<()> {
        self.inner().read_append(addr, len, out)
    }
    fn keep(&self, addr: u64, len: usize) {
        self.inner().keep(addr, len)
    }
    fn live(&self) -> Option<&dyn ProcessMemory> {
        self.inner().live()
    }
}
