//! Per-thread CPU time from the scheduler itself. A BPF program on `sched_switch` writes a
//! record each time one of the target's threads takes or leaves a CPU (with its total CPU
//! time then), into a ring buffer mapped into our memory. A sample drains the ring. A
//! thread with no record since the last sample did not run, and costs nothing, where the
//! /proc path reads one `schedstat` per thread per sample.
//!
//! Owns: loading and attaching the program ([`BpfCpu::attach`]), and each thread's total as
//! its records tell it. A thread we have no record of (it has not been switched since we
//! attached) is the caller's to read from /proc once. When it is off a CPU then, its total
//! holds until its next switch-in, which the program records ([`BpfCpu::anchor`]).
//!
//! Must not: change anything in the target (the program only reads), or outlive its fds
//! (closing them, as on our exit or kill, detaches it).

mod btf;
mod prog;
mod sys;

use crate::IdMap;
use std::os::fd::OwnedFd;

/// The ring's size: 43,690 records of 16 bytes (and their 8-byte headers), far more than the
/// switches of 10 ms of a busy program. If it fills anyway, records are counted as lost and
/// every thread is read from /proc again once.
const RING_BYTES: usize = 1 << 20;

/// What the records say of one thread.
#[derive(Debug, Clone, Copy)]
struct Known {
    /// Its total CPU time at its last record (or when read from /proc).
    run_ns: u64,
    /// Its last record was a switch-in, so it is on a CPU (or was, a moment ago).
    on_cpu: bool,
}

/// The loaded program and what its records told so far.
pub(crate) struct BpfCpu {
    // Field order is drop order, so detach first.
    _link: OwnedFd,
    _prog: OwnedFd,
    ring: sys::Ring,
    drops: OwnedFd,
    drops_seen: u64,
    threads: IdMap<i32, Known>,
}

impl std::fmt::Debug for BpfCpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BpfCpu")
            .field("threads", &self.threads.len())
            .finish()
    }
}

/// Whether we are in the initial PID namespace. The program sees the kernel's ids there
/// (`task_struct.tgid`), which are ours only then.
fn in_initial_pid_namespace() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("NSpid:"))
            .is_some_and(|ids| ids.split_whitespace().count() == 1)
    })
}

impl BpfCpu {
    /// Loads and attaches the program for process `tgid`; Err says why it cannot be used
    /// (the caller reads /proc instead).
    pub(crate) fn attach(tgid: i32) -> Result<BpfCpu, String> {
        if std::env::var_os("SCALENE_RS_NO_BPF").is_some() {
            return Err("SCALENE_RS_NO_BPF is set".into());
        }
        if !in_initial_pid_namespace() {
            return Err("the profiler runs in a PID namespace of its own".into());
        }
        let offsets = btf::task_offsets().ok_or("no kernel BTF (/sys/kernel/btf/vmlinux)")?;
        let ring = sys::Ring::new(RING_BYTES).map_err(|e| format!("ring buffer: {e}"))?;
        let drops = sys::counter().map_err(|e| format!("counter map: {e}"))?;
        let insns = prog::switch_program(&offsets, tgid, ring.fd(), {
            use std::os::fd::AsRawFd;
            drops.as_raw_fd()
        });
        let prog = sys::load_raw_tracepoint(&insns).map_err(|e| format!("program: {e}"))?;
        let link = sys::attach_raw_tracepoint("sched_switch", &prog)
            .map_err(|e| format!("attach to sched_switch: {e}"))?;
        Ok(BpfCpu {
            _link: link,
            _prog: prog,
            ring,
            drops,
            drops_seen: 0,
            threads: IdMap::default(),
        })
    }

    /// Takes in the records written since the last call. False when some were lost (the
    /// ring was full). Every thread is then unknown again (read from /proc once more).
    pub(crate) fn drain(&mut self) -> bool {
        let threads = &mut self.threads;
        self.ring.consume(|b| {
            if let Some(r) = prog::Record::parse(b) {
                apply(threads, r);
            }
        });
        match sys::read_counter(&self.drops) {
            Ok(n) if n == self.drops_seen => true,
            Ok(n) => {
                self.drops_seen = n;
                self.threads.clear();
                false
            }
            Err(_) => {
                self.threads.clear();
                false
            }
        }
    }

    /// `tid`, read from /proc off a CPU with no record of it. Its total holds until it
    /// is switched in (recorded). Records that come later replace this.
    pub(crate) fn anchor(&mut self, tid: i32, run_ns: u64) {
        self.threads.entry(tid).or_insert(Known {
            run_ns,
            on_cpu: false,
        });
    }

    /// `tid`'s total CPU time now:
    /// - from its last record when it is off a CPU;
    /// - from /proc (`files`) when it is on one (its total moves: at most one such thread a
    ///   CPU) or when no record of it came (a thread found off a CPU then is anchored).
    ///
    /// None when it is gone.
    pub(crate) fn total(
        &mut self,
        pid: i32,
        tid: i32,
        files: &mut super::cputime::ThreadFiles,
    ) -> Option<u64> {
        match self.threads.get(&tid) {
            Some(k) if !k.on_cpu => return Some(k.run_ns),
            Some(_) => return files.read_sched(pid, tid),
            None => {}
        }
        let ns = files.read_sched(pid, tid)?;
        // Its state after its total. Off a CPU then, the total was already final (a switch
        // in between is recorded, and its record replaces the anchor).
        if files
            .read_stat(pid, tid)
            .is_some_and(|(state, _, _)| state != 'R')
        {
            self.anchor(tid, ns);
        }
        Some(ns)
    }

    #[cfg(test)]
    fn has_record(&self, tid: i32) -> bool {
        self.threads.contains_key(&tid)
    }

    /// Forgets threads not in `alive` (ascending; the others exited).
    pub(crate) fn retain(&mut self, alive: &[i32]) {
        self.threads.retain(|t, _| alive.binary_search(t).is_ok());
    }
}

fn apply(threads: &mut IdMap<i32, Known>, r: prog::Record) {
    threads.insert(
        r.tid,
        Known {
            run_ns: r.run_ns,
            on_cpu: r.switch_in,
        },
    );
}

#[cfg(test)]
mod tests;
