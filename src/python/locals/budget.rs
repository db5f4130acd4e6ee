//! The budget of one dump's locals: how many bytes they may read and until when.
//!
//! Owns: [`Budgeted`], a [`ProcessMemory`] that counts what passes through it and refuses
//! reads past its budget, and [`Budget`], the limits it is made with.
//! Must not: make a system call of its own (the clock is read through `Instant`, which the
//! C library serves from the vDSO), or keep anything from one dump to the next.

use crate::error::{Error, Result};
use crate::ptrace::ProcessMemory;
use std::cell::Cell;
use std::time::{Duration, Instant};

/// The limits of one dump's reads of locals.
#[derive(Debug, Clone, Copy)]
pub struct Budget {
    /// Bytes read at most, every frame of every thread together.
    pub bytes: u64,
    /// Time at most, from the first read of locals (the target is paused meanwhile).
    pub time: Duration,
}

impl Default for Budget {
    /// 64 MiB and 2 s: a few thousand frames of rich locals, and a pause nobody waits on.
    fn default() -> Budget {
        Budget {
            bytes: 64 << 20,
            time: Duration::from_secs(2),
        }
    }
}

/// What a read past the budget reads as.
const SPENT: Error = Error::Inconsistent {
    addr: 0,
    why: "the dump's budget for reading locals is spent",
};

/// Memory read under a [`Budget`].
pub(crate) struct Budgeted<'a> {
    inner: &'a dyn ProcessMemory,
    left: Cell<u64>,
    until: Instant,
}

impl<'a> Budgeted<'a> {
    pub(crate) fn new(inner: &'a dyn ProcessMemory, budget: Budget) -> Budgeted<'a> {
        Budgeted {
            inner,
            left: Cell::new(budget.bytes),
            until: Instant::now() + budget.time,
        }
    }

    /// An error once the time is up.
    pub(crate) fn check_time(&self) -> Result<()> {
        if Instant::now() > self.until {
            return Err(SPENT);
        }
        Ok(())
    }
}

impl ProcessMemory for Budgeted<'_> {
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<()> {
        let len = buf.len() as u64;
        let left = self.left.get();
        if len > left {
            self.left.set(0);
            return Err(SPENT);
        }
        self.left.set(left - len);
        self.inner.read(addr, buf)
    }

    fn read_prefix(&self, addr: u64, buf: &mut [u8]) -> Result<usize> {
        let len = buf.len() as u64;
        let left = self.left.get();
        if len > left {
            self.left.set(0);
            return Err(SPENT);
        }
        self.left.set(left - len);
        self.inner.read_prefix(addr, buf)
    }

    /// Checked against the budget before anything is allocated.
    fn read_vec(&self, addr: u64, len: usize) -> Result<Vec<u8>> {
        if len as u64 > self.left.get() {
            self.left.set(0);
            return Err(SPENT);
        }
        let mut v = vec![0u8; len];
        self.read(addr, &mut v)?;
        Ok(v)
    }
}
