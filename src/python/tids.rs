//! Which kernel thread each thread state is, in our PID namespace.
//!
//! Owns: [`KernelIds`] (a thread state's kernel id: recorded by 3.8+, translated when the
//! target lives in another PID namespace, else as an earlier snapshot matched it) and
//! [`pthread_to_tid`] (≤3.7: the kernel id found in glibc's `struct pthread`).
//! Must not: pause threads or walk stacks.

use super::process::PythonProcess;
use super::snapshot::ThreadResult;
use super::stack;
use crate::ptrace::{self, ProcessMemory};
use std::collections::HashMap;

/// glibc on x86-64 keeps the kernel TID at this offset of `struct pthread`; used only to
/// break ties when the scan below finds more than one candidate.
const GLIBC_X86_64_TID_OFFSET: usize = 0x2d0;

/// How much of `struct pthread` to scan for the TID.
const PTHREAD_SCAN: usize = 0x800;

/// ≤3.7 records only the `pthread_t`, which glibc makes the address of `struct pthread`;
/// that struct holds the kernel TID. Find the offset where, for every thread, a TID of
/// this process is stored, and read each thread's TID from it. `tids` are the ids in the
/// target's own PID namespace (what glibc stores), and so are the results.
pub(super) fn pthread_to_tid(
    mem: &dyn ProcessMemory,
    tids: &[i32],
    threads: &[ThreadResult],
) -> HashMap<u64, i32> {
    let mut blocks = Vec::new();
    for (t, _, _) in threads {
        if t.thread_id == 0 {
            continue;
        }
        if let Ok(b) = mem.read_vec(t.thread_id, PTHREAD_SCAN) {
            blocks.push((t.thread_id, b));
        }
    }
    if blocks.is_empty() {
        return HashMap::new();
    }
    let is_tid = |v: u32| tids.contains(&(v as i32));
    let mut candidates: Vec<usize> = (0..PTHREAD_SCAN - 4)
        .step_by(4)
        .filter(|&off| {
            let values: Vec<u32> = blocks
                .iter()
                .map(|(_, b)| ptrace::field_u32(b, off))
                .collect();
            let mut distinct = values.clone();
            distinct.sort_unstable();
            distinct.dedup();
            values.iter().all(|&v| is_tid(v)) && distinct.len() == values.len()
        })
        .collect();
    if candidates.len() > 1 && candidates.contains(&GLIBC_X86_64_TID_OFFSET) {
        candidates = vec![GLIBC_X86_64_TID_OFFSET];
    }
    let Some(&off) = candidates.first() else {
        return HashMap::new();
    };
    blocks
        .iter()
        .map(|(id, b)| (*id, ptrace::field_u32(b, off) as i32))
        .collect()
}

/// Our kernel ids of thread states (of threads listed in `tids`), None when unknown: the
/// id a thread state records (3.8+), translated when the target lives in another PID
/// namespace (the map made once, when first needed), else the one an earlier snapshot
/// matched (`by_thread`).
pub(super) struct KernelIds<'a> {
    proc: &'a PythonProcess,
    tids: &'a [i32],
    by_thread: &'a crate::IdMap<u64, i32>,
    inner_to_ours: std::cell::OnceCell<HashMap<i32, i32>>,
}

impl<'a> KernelIds<'a> {
    pub(super) fn new(
        proc: &'a PythonProcess,
        tids: &'a [i32],
        by_thread: &'a crate::IdMap<u64, i32>,
    ) -> KernelIds<'a> {
        KernelIds {
            proc,
            tids,
            by_thread,
            inner_to_ours: std::cell::OnceCell::new(),
        }
    }

    pub(super) fn of(&self, t: &stack::RawThread) -> Option<i32> {
        match t.native_id {
            Some(id) if self.proc.tids.translates() => self
                .inner_to_ours
                .get_or_init(|| self.proc.tids.inner_to_ours(self.tids))
                .get(&id)
                .copied(),
            Some(id) => Some(id),
            None => self.by_thread.get(&t.thread_id).copied(),
        }
    }
}
