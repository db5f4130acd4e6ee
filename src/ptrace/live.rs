//! Memory of a live process: [`RemoteMemory`].
//!
//! Owns:
//! - reads through `process_vm_readv`, many ranges in one call where it can;
//! - the fallback to /proc/PID/mem where that call is missing or refused by seccomp;
//! - the typed error of a failed read (process gone, permission denied, range unreadable).
//!
//! Must not: cache what it reads ([`PageCache`](super::PageCache) does that).

use super::memory::{read_each, ProcessMemory};
use crate::error::{Error, Result};
use std::fs::File;
use std::io::IoSliceMut;
use std::os::unix::fs::FileExt;

/// How many of the leading buffers of lengths `lens` a request that copied `got` bytes
/// filled whole (the kernel stops at the first range it cannot read).
fn whole_leading(got: usize, lens: impl Iterator<Item = usize>) -> usize {
    let mut left = got;
    let mut whole = 0;
    for len in lens {
        if left < len {
            break;
        }
        left -= len;
        whole += 1;
    }
    whole
}

/// Memory of a live process.
pub struct RemoteMemory {
    pid: i32,
    /// Set when process_vm_readv is unavailable (ENOSYS) or refused by a seccomp filter.
    mem_file: Option<File>,
}

impl RemoteMemory {
    /// Opens the process's memory. Checks that the process exists; permission is checked by
    /// the first read (process_vm_readv asks the kernel's ptrace access check itself).
    pub(crate) fn new(pid: i32) -> Result<RemoteMemory> {
        if !crate::proc::process_exists(pid) {
            return Err(Error::NoSuchProcess(pid));
        }
        Ok(RemoteMemory {
            pid,
            mem_file: None,
        })
    }

    fn read_vm(&self, addr: u64, buf: &mut [u8]) -> std::io::Result<usize> {
        let len = buf.len();
        let mut local = [IoSliceMut::new(buf)];
        let remote = [nix::sys::uio::RemoteIoVec {
            base: addr as usize,
            len,
        }];
        nix::sys::uio::process_vm_readv(nix::unistd::Pid::from_raw(self.pid), &mut local, &remote)
            .map_err(|e| std::io::Error::from_raw_os_error(e as i32))
    }

    /// Switches to /proc/PID/mem (used when process_vm_readv is not allowed by seccomp).
    fn open_mem_file(&mut self) -> Result<()> {
        let f = File::open(format!("/proc/{}/mem", self.pid))
            .map_err(|e| crate::proc::os_error(self.pid, "opening /proc/PID/mem", e))?;
        self.mem_file = Some(f);
        Ok(())
    }

    /// Probes the read path once: falls back to /proc/PID/mem when process_vm_readv is
    /// missing (ENOSYS) or refused by a seccomp filter we run under (a container's profile
    /// answers EPERM; reading /proc/PID/mem needs the same ptrace access, but no system
    /// call a filter would single out).
    pub(crate) fn probe(&mut self, addr: u64) -> Result<()> {
        let mut b = [0u8; 1];
        match self.read_vm(addr, &mut b).map_err(|e| e.raw_os_error()) {
            Err(Some(libc::ENOSYS)) => self.open_mem_file(),
            Err(Some(libc::EPERM)) if crate::proc::access::seccomp_filtered() => {
                self.open_mem_file()
            }
            _ => Ok(()),
        }
    }

    fn classify(&self, addr: u64, len: usize, err: std::io::Error) -> Error {
        match err.raw_os_error() {
            // process_vm_readv says ESRCH when the process, or its address space, is gone
            // (an exiting process loses its memory before it becomes a zombie).
            Some(libc::ESRCH) => Error::ProcessExited(self.pid),
            Some(libc::EPERM) | Some(libc::EACCES) => {
                crate::proc::permission_denied(self.pid, "reading its memory")
            }
            _ => {
                if !crate::proc::process_exists(self.pid) {
                    return Error::ProcessExited(self.pid);
                }
                Error::Read {
                    pid: self.pid,
                    addr,
                    len,
                    why: err.to_string(),
                }
            }
        }
    }
}

/// Requests of at most this many ranges are described on the stack (a sample's prefetch
/// is about ten), so no vectors are made for every sample.
const FEW_RANGES: usize = 16;

impl RemoteMemory {
    /// [`ProcessMemory::read_many`] of at most [`FEW_RANGES`] ranges, in one
    /// process_vm_readv.
    fn read_few(&self, reqs: &mut [(u64, &mut [u8])]) -> usize {
        let n = reqs.len();
        let mut remote = [nix::sys::uio::RemoteIoVec { base: 0, len: 0 }; FEW_RANGES];
        for (r, (addr, buf)) in remote.iter_mut().zip(reqs.iter()) {
            *r = nix::sys::uio::RemoteIoVec {
                base: *addr as usize,
                len: buf.len(),
            };
        }
        let mut bufs = reqs.iter_mut();
        let mut local: [IoSliceMut; FEW_RANGES] = std::array::from_fn(|_| {
            IoSliceMut::new(bufs.next().map_or(&mut [][..], |(_, b)| &mut b[..]))
        });
        let got = nix::sys::uio::process_vm_readv(
            nix::unistd::Pid::from_raw(self.pid),
            &mut local[..n],
            &remote[..n],
        )
        .unwrap_or(0);
        whole_leading(got, remote[..n].iter().map(|r| r.len))
    }
}

impl ProcessMemory for RemoteMemory {
    fn read_many(&self, reqs: &mut [(u64, &mut [u8])]) -> usize {
        if self.mem_file.is_some() || reqs.len() < 2 {
            return read_each(self, reqs);
        }
        // One process_vm_readv for all of them (the kernel takes up to 1024 ranges). It
        // stops at the first range it cannot read, so what it returns counts whole
        // leading buffers plus maybe part of the next.
        if reqs.len() <= FEW_RANGES {
            return self.read_few(reqs);
        }
        let mut done = 0;
        for chunk in reqs.chunks_mut(1024) {
            let remote: Vec<nix::sys::uio::RemoteIoVec> = chunk
                .iter()
                .map(|(addr, buf)| nix::sys::uio::RemoteIoVec {
                    base: *addr as usize,
                    len: buf.len(),
                })
                .collect();
            let mut local: Vec<IoSliceMut> =
                chunk.iter_mut().map(|(_, b)| IoSliceMut::new(b)).collect();
            let n = nix::sys::uio::process_vm_readv(
                nix::unistd::Pid::from_raw(self.pid),
                &mut local,
                &remote,
            )
            .unwrap_or(0);
            let whole = whole_leading(n, remote.iter().map(|r| r.len));
            done += whole;
            if whole < chunk.len() {
                break;
            }
        }
        done
    }

    fn read_prefix(&self, addr: u64, buf: &mut [u8]) -> Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let len = buf.len();
        // One system call. process_vm_readv copies up to the first unreadable page and
        // says how far it got; a read of /proc/PID/mem likewise.
        let got = match &self.mem_file {
            Some(f) => f.read_at(buf, addr),
            None => self.read_vm(addr, buf),
        };
        match got {
            Ok(0) => Err(Error::Read {
                pid: self.pid,
                addr,
                len,
                why: "nothing readable there".into(),
            }),
            Ok(n) => Ok(n),
            Err(e) => Err(self.classify(addr, len, e)),
        }
    }

    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<()> {
        if buf.is_empty() {
            return Ok(());
        }
        let len = buf.len();
        let got = match &self.mem_file {
            Some(f) => f.read_at(buf, addr),
            None => self.read_vm(addr, buf),
        };
        match got {
            Ok(n) if n == len => Ok(()),
            Ok(n) => Err(Error::Read {
                pid: self.pid,
                addr,
                len,
                why: format!("short read ({n} of {len} bytes): the mapping ends or changed"),
            }),
            Err(e) => Err(self.classify(addr, len, e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn many_ranges_read_in_one_request_stop_at_the_first_unreadable_one() {
        // Fewer ranges than are described on the stack, and more.
        let a: Vec<u8> = (0..4096u32).map(|i| (i % 251) as u8).collect();
        let m = RemoteMemory::new(std::process::id() as i32).unwrap();
        let base = a.as_ptr() as u64;
        for n in [2usize, FEW_RANGES, FEW_RANGES + 1, 40] {
            let mut bufs = vec![[0u8; 16]; n];
            let mut reqs: Vec<(u64, &mut [u8])> = bufs
                .iter_mut()
                .enumerate()
                .map(|(i, b)| (base + 64 * i as u64, &mut b[..]))
                .collect();
            assert_eq!(m.read_many(&mut reqs), n, "{n} ranges");
            for (i, b) in bufs.iter().enumerate() {
                assert_eq!(b[..], a[64 * i..64 * i + 16], "{n} ranges, range {i}");
            }
            // With an unmapped range in the middle, only the ranges before it are read.
            let mut bufs = vec![[0u8; 8]; n];
            let mut reqs: Vec<(u64, &mut [u8])> = bufs
                .iter_mut()
                .enumerate()
                .map(|(i, b)| (if i == n / 2 { 8 } else { base + 8 * i as u64 }, &mut b[..]))
                .collect();
            assert_eq!(m.read_many(&mut reqs), n / 2, "{n} ranges, one unmapped");
        }
    }

    #[test]
    fn reads_own_memory() {
        let value: u64 = 0x1122_3344_5566_7788;
        let m = RemoteMemory::new(std::process::id() as i32).unwrap();
        let addr = &value as *const u64 as u64;
        assert_eq!(m.read_u64(addr).unwrap(), value);
        // An unmapped page reads as an error, never as success.
        assert!(m.read_u64(8).is_err());
    }
}
