//! Which kernel thread each thread state is, in our PID namespace.
//!
//! Owns:
//! - [`KernelIds`], a thread state's kernel id (recorded by 3.11+, translated when the
//!   target lives in another PID namespace, else as an earlier snapshot matched it);
//! - [`pthread_to_tid`] (≤3.7: the kernel id found in glibc's `struct pthread`).
//!
//! Must not: pause threads or walk stacks.

use super::process::PythonProcess;
use super::snapshot::ThreadResult;
use super::stack::{self, StaleId};
use crate::ptrace::{self, ProcessMemory};
use std::collections::HashMap;

/// glibc on x86-64 keeps the kernel TID at this offset of `struct pthread`. It is used only
/// to break ties when the scan below finds more than one candidate.
const GLIBC_X86_64_TID_OFFSET: usize = 0x2d0;

/// How much of `struct pthread` to scan for the TID.
const PTHREAD_SCAN: usize = 0x800;

/// ≤3.7 records only the `pthread_t`, which glibc makes the address of `struct pthread`.
/// That struct holds the kernel TID. Find the offset where, for every thread, a TID of
/// this process is stored, and read each thread's TID from it. `tids` are the ids in the
/// target's own PID namespace (what glibc stores), and so are the results.
pub(super) fn pthread_to_tid(
    mem: &dyn ProcessMemory,
    tids: &[i32],
    threads: &[ThreadResult],
) -> HashMap<u64, i32> {
    pthreads_to_tids(mem, tids, threads.iter().map(|(t, _, _)| t.thread_id))
}

/// [`pthread_to_tid`] of the `pthread_t`s given.
fn pthreads_to_tids(
    mem: &dyn ProcessMemory,
    tids: &[i32],
    pthreads: impl Iterator<Item = u64>,
) -> HashMap<u64, i32> {
    let mut blocks: Vec<(u64, Vec<u8>)> = Vec::new();
    for id in pthreads {
        // One thread with several states (nested subinterpreters) is one block, because the
        // scan asks each block for a thread id of its own.
        if id == 0 || blocks.iter().any(|(b, _)| *b == id) {
            continue;
        }
        if let Ok(b) = mem.read_vec(id, PTHREAD_SCAN) {
            blocks.push((id, b));
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

/// Our kernel ids of thread states (of threads listed in `tids`), None when unknown. Each
/// is:
/// - the id a thread state records (3.11+), translated when the target lives in another PID
///   namespace (the map made once, when first needed);
/// - else the one an earlier snapshot matched (`by_thread`).
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

/// The [`StaleId`]s among `raws`: states whose recorded id is not in `inner` (the process's
/// threads in its own PID namespace, ascending), each with the thread it is.
/// - Each gets a thread no other state records: the one its `pthread_t` names, else the
///   only one left when one state and one thread are left.
/// - A state whose thread cannot be told is left out (its id stays unknown to callers
///   that check it against the listing).
pub(super) fn stale_ids(
    mem: &dyn ProcessMemory,
    inner: &[i32],
    raws: &[&stack::RawThread],
) -> Vec<StaleId> {
    let listed = |n: i32| inner.binary_search(&n).is_ok();
    let stale: Vec<&stack::RawThread> = raws
        .iter()
        .copied()
        .filter(|t| t.native_id.is_some_and(|n| !listed(n)))
        .collect();
    if stale.is_empty() {
        return Vec::new();
    }
    let claimed: Vec<i32> = raws
        .iter()
        .filter_map(|t| t.native_id.filter(|&n| listed(n)))
        .collect();
    let free: Vec<i32> = inner
        .iter()
        .copied()
        .filter(|t| !claimed.contains(t))
        .collect();
    let by_pthread = pthreads_to_tids(mem, &free, stale.iter().map(|t| t.thread_id));
    let mut out: Vec<StaleId> = Vec::new();
    for t in &stale {
        let found = by_pthread
            .get(&t.thread_id)
            .copied()
            .or_else(|| (stale.len() == 1 && free.len() == 1).then(|| free[0]));
        let Some(actual) = found else { continue };
        if out.iter().any(|s| s.actual == actual) {
            continue;
        }
        out.push(StaleId {
            recorded: t.native_id.unwrap_or_default(),
            actual,
            tstate: t.tstate,
        });
    }
    out
}

#[cfg(test)]
mod stale_tests {
    use super::*;
    use crate::ptrace::BufferMemory;

    fn raw(tstate: u64, pthread: u64, native_id: i32) -> stack::RawThread {
        stack::RawThread {
            tstate,
            thread_id: pthread,
            native_id: Some(native_id),
            top_frame: 0,
            interp: 0,
            interp_id: 0,
            holds_gil: false,
            rested: false,
        }
    }

    /// A `struct pthread` at `base` with `tid` at glibc's offset.
    fn pthread_block(base: u64, tid: i32) -> BufferMemory {
        let mut bytes = vec![0u8; PTHREAD_SCAN];
        bytes[GLIBC_X86_64_TID_OFFSET..GLIBC_X86_64_TID_OFFSET + 4]
            .copy_from_slice(&tid.to_le_bytes());
        BufferMemory { base, bytes }
    }

    #[test]
    fn a_state_of_the_parent_is_the_child_s_one_thread() {
        let mem = pthread_block(0x7000, 4321);
        let t = raw(0x100, 0x7000, 1234);
        let got = stale_ids(&mem, &[4321], &[&t]);
        assert_eq!(
            got,
            [StaleId {
                recorded: 1234,
                actual: 4321,
                tstate: 0x100
            }]
        );
    }

    #[test]
    fn listed_ids_are_left_alone_and_an_unreadable_pthread_falls_back_to_the_one_left() {
        let mem = pthread_block(0x7000, 10);
        let ok = raw(0x100, 0x7000, 10);
        let stale = raw(0x200, 0x9000, 99);
        // 0x9000 cannot be read, so the one state and the one thread left are paired.
        let got = stale_ids(&mem, &[10, 11], &[&ok, &stale]);
        assert_eq!(got.len(), 1);
        assert_eq!((got[0].recorded, got[0].actual), (99, 11));
        // Nothing stale means nothing read, nothing said.
        assert!(stale_ids(&mem, &[10, 11], &[&ok]).is_empty());
    }

    #[test]
    fn two_stale_states_and_no_pthread_to_tell_them_apart_stay_unknown() {
        let mem = BufferMemory {
            base: 0,
            bytes: vec![],
        };
        let (a, b) = (raw(0x100, 0x7000, 98), raw(0x200, 0x8000, 99));
        assert!(stale_ids(&mem, &[10, 11], &[&a, &b]).is_empty());
    }
}
