//! Access to another process: memory reads, its thread list, and pausing its threads.
//!
//! Owns: the [`ProcessMemory`] trait (the one way the rest of the crate reads a target, so
//! stack walking can run over byte buffers in tests), [`RemoteMemory`] (process_vm_readv,
//! with a /proc/PID/mem fallback), [`threads`], [`pause::PausedThreads`], and the target's
//! namespaces ([`ns`]: its files as it sees them, its thread ids as we see them).
//! Must not: know anything about Python.

pub(crate) mod pause;
#[cfg(target_arch = "x86_64")]
pub(crate) mod remote;
pub(crate) mod trampoline;

use crate::error::{Error, Result};
use std::collections::HashMap;
use std::fs::File;
use std::io::IoSliceMut;
use std::os::unix::fs::FileExt;

/// Reads bytes from an address space. Implementations never return a short read as success.
pub trait ProcessMemory {
    /// Fills `buf` from address `addr` (an AVMA: an address in the target's address space).
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<()>;

    /// A little-endian u64 at `addr`.
    fn read_u64(&self, addr: u64) -> Result<u64> {
        let mut b = [0u8; 8];
        self.read(addr, &mut b)?;
        Ok(u64::from_le_bytes(b))
    }

    /// A little-endian u32 at `addr`.
    fn read_u32(&self, addr: u64) -> Result<u32> {
        let mut b = [0u8; 4];
        self.read(addr, &mut b)?;
        Ok(u32::from_le_bytes(b))
    }

    /// Fills `buf` from `addr` as far as the memory is readable, in one go: the count of
    /// bytes read, which stops short where the mapping ends (a thread's stack read up to
    /// its top). An error only when not even the first byte is readable.
    fn read_prefix(&self, addr: u64, buf: &mut [u8]) -> Result<usize> {
        self.read(addr, buf).map(|()| buf.len())
    }

    /// `len` bytes at `addr` in a fresh vector.
    fn read_vec(&self, addr: u64, len: usize) -> Result<Vec<u8>> {
        let mut v = vec![0u8; len];
        self.read(addr, &mut v)?;
        Ok(v)
    }

    /// Fills several buffers, each from its own address, in as few system calls as the
    /// implementation can; returns how many of them, counted from the first, were filled
    /// completely (the rest are left unspecified).
    fn read_many(&self, reqs: &mut [(u64, &mut [u8])]) -> usize {
        read_each(self, reqs)
    }

    /// A hint that the ranges `(addr, len)` will be read soon: a caching implementation
    /// fetches them together. Never fails; a range it cannot fetch is read when asked for.
    fn prefetch(&self, _ranges: &[(u64, usize)]) {}

    /// Whether [`ProcessMemory::prefetch`] does anything (callers skip the work of finding
    /// what to prefetch otherwise).
    fn prefetches(&self) -> bool {
        false
    }

    /// Reads `len` bytes at `addr` onto the end of `out` (left as it was on an error).
    fn read_append(&self, addr: u64, len: usize, out: &mut Vec<u8>) -> Result<()> {
        append_by_read(self, addr, len, out)
    }

    /// A hint that the range `(addr, len)` matters to the next snapshot although this one
    /// did not read all of it: a caching implementation counts what it holds of it as used
    /// (so that the next prefetch fetches it again), and reads nothing.
    fn keep(&self, _addr: u64, _len: usize) {}

    /// For memory that serves earlier copies ([`SecondLook`]): the process itself, for a
    /// read that must happen now. None: this memory reads the process when asked.
    fn live(&self) -> Option<&dyn ProcessMemory> {
        None
    }
}

/// [`ProcessMemory::read_append`] through [`ProcessMemory::read`].
fn append_by_read<M: ProcessMemory + ?Sized>(
    mem: &M,
    addr: u64,
    len: usize,
    out: &mut Vec<u8>,
) -> Result<()> {
    let at = out.len();
    out.resize(at + len, 0);
    let r = mem.read(addr, &mut out[at..]);
    if r.is_err() {
        out.truncate(at);
    }
    r
}

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

/// [`ProcessMemory::read_many`] one read at a time.
fn read_each<M: ProcessMemory + ?Sized>(mem: &M, reqs: &mut [(u64, &mut [u8])]) -> usize {
    let mut n = 0;
    for (addr, buf) in reqs.iter_mut() {
        if mem.read(*addr, buf).is_err() {
            break;
        }
        n += 1;
    }
    n
}

/// Little-endian field accessors over a buffer read in one go (e.g. a whole struct).
/// Out-of-range offsets read as zero: callers size buffers from the layout, and a zero
/// pointer is treated as "end of chain" by every walker.
pub(crate) fn field_u64(buf: &[u8], off: usize) -> u64 {
    buf.get(off..off + 8)
        .map(|s| u64::from_le_bytes(s.try_into().unwrap_or([0; 8])))
        .unwrap_or(0)
}

/// See [`field_u64`].
pub(crate) fn field_u32(buf: &[u8], off: usize) -> u32 {
    buf.get(off..off + 4)
        .map(|s| u32::from_le_bytes(s.try_into().unwrap_or([0; 4])))
        .unwrap_or(0)
}

/// See [`field_u64`].
pub(crate) fn field_u8(buf: &[u8], off: usize) -> u8 {
    buf.get(off).copied().unwrap_or(0)
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
/// is about ten): no vectors made for every sample.
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
        // One process_vm_readv for all of them (the kernel takes up to 1024 ranges); it
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
        // One system call: process_vm_readv copies up to the first unreadable page and
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

/// A byte buffer that pretends to be an address space starting at `base` (for tests and
/// for replaying captured memory).
#[cfg(any(test, feature = "fuzzing"))]
pub(crate) struct BufferMemory {
    pub(crate) base: u64,
    pub(crate) bytes: Vec<u8>,
}

#[cfg(any(test, feature = "fuzzing"))]
impl ProcessMemory for BufferMemory {
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<()> {
        let start = addr.checked_sub(self.base).map(|s| s as usize);
        match start.and_then(|s| self.bytes.get(s..s.checked_add(buf.len())?)) {
            Some(src) => {
                buf.copy_from_slice(src);
                Ok(())
            }
            None => Err(Error::Read {
                pid: 0,
                addr,
                len: buf.len(),
                why: "outside the buffer".into(),
            }),
        }
    }
}

/// Page size of the read cache.
pub(crate) const CACHE_PAGE: u64 = 4096;
/// Most pages one cache keeps: a walk touches a handful, a thread list one page or so per
/// thread; this bounds a runaway walk (16 MiB).
const CACHE_MAX_PAGES: usize = 4096;

/// A read-through cache of pages over another [`ProcessMemory`], for the reads of one
/// snapshot: one system call costs about the same for a small read as for a page, and the
/// structures one walk touches (frames in 3.11+'s frame stack, a frame and its neighbours,
/// a code object and its name) often share pages. A page may hold only part of its bytes:
/// a prefetch reads just the ranges asked for (copying whole pages costs the kernel time
/// too), and a read outside what a page holds fetches the whole page. The cache also notes
/// which bytes of each page were used ([`PageCache::used_ranges`]): the next snapshot's
/// prefetch. Only valid while what it read cannot change (threads paused) or for one walk
/// whose result is checked by other means; never keep one across samples.
pub(crate) struct PageCache<'a> {
    inner: &'a dyn ProcessMemory,
    pages: std::cell::RefCell<Pages>,
    /// Reads that went to `inner` after the prefetch (bytes the cache did not hold).
    misses: std::cell::Cell<u32>,
    /// Requests made by prefetches (each one later than what the earlier ones read).
    fetches: std::cell::Cell<u32>,
}

type Page = Box<[u8; CACHE_PAGE as usize]>;

/// One page of a [`PageCache`]: the bytes `valid` hold what the process had; `used` are
/// the bytes reads were served from (an empty range when `.0 >= .1`).
struct CachedPage {
    addr: u64,
    buf: Page,
    valid: (u32, u32),
    used: (u32, u32),
}

impl CachedPage {
    /// It holds the bytes `[lo, hi)` of its page.
    fn holds(&self, lo: u32, hi: u32) -> bool {
        self.valid.0 <= lo && self.valid.1 >= hi
    }

    /// Counts the bytes `[lo, hi)` as used (see [`PageCache::used_ranges`]).
    fn mark_used(&mut self, lo: u32, hi: u32) {
        self.used = (self.used.0.min(lo), self.used.1.max(hi));
    }

    /// The bytes `[lo, hi)`, which it holds, now counted as used.
    fn serve(&mut self, lo: u32, hi: u32) -> &[u8] {
        self.mark_used(lo, hi);
        &self.buf[lo as usize..hi as usize]
    }
}

/// Whether the range `(addr, len)` goes through the cache: not empty, at most a page (larger
/// reads go straight through), and not so near the top of the address space (a torn
/// pointer may be anywhere) that page arithmetic would overflow.
fn cacheable(addr: u64, len: usize) -> bool {
    len > 0 && len as u64 <= CACHE_PAGE && addr <= u64::MAX - 3 * CACHE_PAGE
}

/// The pages the cacheable range `(addr, len)` covers, each with the part of it covered:
/// `(page, lo, hi)`, offsets in the page.
fn page_parts(addr: u64, len: usize) -> impl Iterator<Item = (u64, u32, u32)> {
    let end = addr + len as u64;
    let first = addr & !(CACHE_PAGE - 1);
    (first..end).step_by(CACHE_PAGE as usize).map(move |page| {
        let lo = (addr.max(page) - page) as u32;
        let hi = (end.min(page + CACHE_PAGE) - page) as u32;
        (page, lo, hi)
    })
}

/// A cache's pages in the order they were fetched, found by address: by a look at each
/// while they are few (a sample's walk touches a handful), through an index past
/// [`Pages::FEW`] (a process with a thousand threads has a thousand thread states to read
/// on as many pages).
#[derive(Default)]
struct Pages {
    list: Vec<CachedPage>,
    /// Built once the list outgrows [`Pages::FEW`] (making even an empty map costs a
    /// seeded hasher).
    index: Option<HashMap<u64, usize, ahash::RandomState>>,
    /// The page found last: most reads follow one on the same page (a frame stack's frames).
    last: std::cell::Cell<usize>,
}

impl Pages {
    /// Pages looked up one by one, without the index.
    const FEW: usize = 16;

    fn position(&self, addr: u64) -> Option<usize> {
        let last = self.last.get();
        if self.list.get(last).is_some_and(|p| p.addr == addr) {
            return Some(last);
        }
        let i = match &self.index {
            None => self.list.iter().position(|p| p.addr == addr)?,
            Some(index) => index.get(&addr).copied()?,
        };
        self.last.set(i);
        Some(i)
    }

    fn push(&mut self, page: CachedPage) {
        if self.list.capacity() == 0 {
            self.list.reserve(Self::FEW);
        }
        self.list.push(page);
        let n = self.list.len();
        match &mut self.index {
            Some(index) => {
                index.insert(self.list[n - 1].addr, n - 1);
            }
            None if n > Self::FEW => {
                self.index = Some(
                    self.list
                        .iter()
                        .enumerate()
                        .map(|(i, p)| (p.addr, i))
                        .collect(),
                );
            }
            None => {}
        }
    }
}

impl std::ops::Deref for Pages {
    type Target = [CachedPage];
    fn deref(&self) -> &[CachedPage] {
        &self.list
    }
}

impl std::ops::DerefMut for Pages {
    fn deref_mut(&mut self) -> &mut [CachedPage] {
        &mut self.list
    }
}

const WHOLE: (u32, u32) = (0, CACHE_PAGE as u32);
const UNUSED: (u32, u32) = (u32::MAX, 0);

thread_local! {
    /// Page buffers of dropped caches, reused by the next ones: a sampler makes a few caches
    /// per sample, thousands of times a second.
    static SPARE_PAGES: std::cell::RefCell<Vec<Page>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// A page buffer: a spare one, else a new one. Its old contents are overwritten by the read
/// that fills it (a buffer whose read fails is never used for data).
fn take_page() -> Page {
    SPARE_PAGES
        .with(|s| s.borrow_mut().pop())
        .unwrap_or_else(|| Box::new([0u8; CACHE_PAGE as usize]))
}

thread_local! {
    /// Byte buffers of earlier reads (second looks, a walk's frames read again), reused:
    /// zeroing kilobytes for every sample only to overwrite them was a visible part of a
    /// sample's own work.
    static SPARE_BUFS: std::cell::RefCell<Vec<Vec<u8>>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Most buffers [`SPARE_BUFS`] keeps, and the largest it keeps.
const SPARE_BUFS_MAX: usize = 64;
const SPARE_BUF_MAX_BYTES: usize = 256 * 1024;

/// A buffer of `len` bytes for a read to fill: a spare one when there is one. Its contents
/// are whatever it held (a read that fails leaves them, and such a buffer is never used for
/// data).
pub(crate) fn take_buf(len: usize) -> Vec<u8> {
    // The same ranges are read sample after sample: one of that length first, else one at
    // least as long, so that little is ever zeroed.
    let mut b = SPARE_BUFS.with(|s| {
        let mut spare = s.borrow_mut();
        let pick = spare
            .iter()
            .position(|b| b.len() == len)
            .or_else(|| spare.iter().position(|b| b.len() >= len));
        match pick {
            Some(i) => spare.swap_remove(i),
            None => spare.pop().unwrap_or_default(),
        }
    });
    if b.len() < len {
        b.resize(len, 0);
    } else {
        b.truncate(len);
    }
    b
}

/// Keeps `buf` for [`take_buf`].
pub(crate) fn give_back_buf(buf: Vec<u8>) {
    if buf.capacity() > SPARE_BUF_MAX_BYTES {
        return;
    }
    SPARE_BUFS.with(|s| {
        let mut spare = s.borrow_mut();
        if spare.len() < SPARE_BUFS_MAX {
            spare.push(buf);
        }
    });
}

fn give_back(pages: impl IntoIterator<Item = Page>) {
    SPARE_PAGES.with(|s| {
        let mut spare = s.borrow_mut();
        for p in pages {
            if spare.len() < CACHE_MAX_PAGES {
                spare.push(p);
            }
        }
    });
}

impl Drop for PageCache<'_> {
    fn drop(&mut self) {
        if self.pages.get_mut().list.is_empty() {
            return;
        }
        let pages = std::mem::take(&mut *self.pages.borrow_mut());
        give_back(pages.list.into_iter().map(|p| p.buf));
    }
}

impl<'a> PageCache<'a> {
    pub(crate) fn new(inner: &'a dyn ProcessMemory) -> PageCache<'a> {
        PageCache {
            inner,
            pages: std::cell::RefCell::new(Pages::default()),
            misses: std::cell::Cell::new(0),
            fetches: std::cell::Cell::new(0),
        }
    }

    /// How many requests the prefetches made so far.
    pub(crate) fn fetches(&self) -> u32 {
        self.fetches.get()
    }

    /// Whether the cache holds the `len` bytes at `addr` (on one page).
    pub(crate) fn holds(&self, addr: u64, len: usize) -> bool {
        if !cacheable(addr, len) {
            return false;
        }
        let page = addr & !(CACHE_PAGE - 1);
        let (lo, hi) = ((addr - page) as u32, (addr - page) as u32 + len as u32);
        let pages = self.pages.borrow();
        hi as u64 <= CACHE_PAGE && pages.position(page).is_some_and(|i| pages[i].holds(lo, hi))
    }

    /// How many reads so far needed bytes the cache did not hold (each one a system call
    /// made after the prefetch, so later than anything the prefetch read).
    pub(crate) fn misses(&self) -> u32 {
        self.misses.get()
    }

    fn miss(&self) {
        self.misses.set(self.misses.get().saturating_add(1));
    }

    /// [`ProcessMemory::prefetch`] of `ranges`, and in the same request, after them, the
    /// ranges `again`: what they held a moment after the prefetch read everything else (the
    /// kernel copies the ranges of one request in order). A walk served entirely from the
    /// prefetch can be checked against that second look instead of a read made after the
    /// walk: the two reads are microseconds apart instead of the walk's duration. A range
    /// of `again` that could not be read is left out.
    pub(crate) fn prefetch_with_second_look(
        &'a self,
        ranges: &[(u64, usize)],
        again: &[(u64, usize)],
    ) -> SecondLook<'a> {
        let got = self.fill(ranges, again);
        SecondLook {
            inner: self.inner,
            ranges: got,
        }
    }

    /// The bytes reads were served from, one range per page, in the order the pages were
    /// fetched: what the next snapshot will most likely read, for its prefetch.
    pub(crate) fn used_ranges(&self) -> Vec<(u64, usize)> {
        self.pages
            .borrow()
            .iter()
            .filter(|p| p.used.0 < p.used.1)
            .map(|p| (p.addr + p.used.0 as u64, (p.used.1 - p.used.0) as usize))
            .collect()
    }

    /// Copies what `page` holds at `[from, from + out.len())` into `out`, reading the
    /// whole page first if the cache does not hold those bytes. False when the whole page
    /// cannot be read (its end is not mapped, say): the caller then reads the exact range.
    fn copy_from_page(&self, page: u64, from: usize, out: &mut [u8]) -> bool {
        let (lo, hi) = (from as u32, (from + out.len()) as u32);
        let mut pages = self.pages.borrow_mut();
        if let Some(i) = pages.position(page) {
            let p = &mut pages[i];
            if !p.holds(lo, hi) {
                self.miss();
                if self.inner.read(page, &mut p.buf[..]).is_err() {
                    return false;
                }
                p.valid = WHOLE;
            }
            out.copy_from_slice(p.serve(lo, hi));
            return true;
        }
        if pages.len() >= CACHE_MAX_PAGES {
            return false;
        }
        let mut buf = take_page();
        self.miss();
        if self.inner.read(page, &mut buf[..]).is_err() {
            give_back([buf]);
            return false;
        }
        out.copy_from_slice(&buf[from..from + out.len()]);
        pages.push(CachedPage {
            addr: page,
            buf,
            valid: WHOLE,
            used: (lo, hi),
        });
        true
    }
}

impl PageCache<'_> {
    /// Reads the parts of pages that `ranges` cover (one span per page), then the ranges
    /// `again` into buffers of their own, in one request; returns those of `again` read.
    fn fill(&self, ranges: &[(u64, usize)], again: &[(u64, usize)]) -> Vec<(u64, Vec<u8>)> {
        // (page, from, to) to read: per page, the span covering every range on it (and
        // what the page already holds, so that it stays one span).
        let mut want: Vec<(u64, u32, u32)> = Vec::with_capacity(ranges.len());
        // Where each page is in `want`: by a look at each while they are few.
        let mut wanted: Option<HashMap<u64, usize, ahash::RandomState>> = None;
        {
            let pages = self.pages.borrow();
            for &(addr, len) in ranges.iter().filter(|&&(a, n)| cacheable(a, n)) {
                for (page, lo, hi) in page_parts(addr, len) {
                    let held = pages.position(page).map(|i| &pages[i]);
                    if held.is_some_and(|p| p.holds(lo, hi)) {
                        continue;
                    }
                    let (lo, hi) = match held {
                        Some(p) => (lo.min(p.valid.0), hi.max(p.valid.1)),
                        None => (lo, hi),
                    };
                    let found = if want.len() <= Pages::FEW {
                        want.iter().position(|w| w.0 == page)
                    } else {
                        wanted
                            .get_or_insert_with(|| {
                                want.iter().enumerate().map(|(i, w)| (w.0, i)).collect()
                            })
                            .get(&page)
                            .copied()
                    };
                    match found {
                        Some(i) => {
                            let w = &mut want[i];
                            w.1 = w.1.min(lo);
                            w.2 = w.2.max(hi);
                        }
                        None => {
                            if let Some(wanted) = wanted.as_mut() {
                                wanted.insert(page, want.len());
                            }
                            want.push((page, lo, hi));
                        }
                    }
                }
            }
            let room = CACHE_MAX_PAGES.saturating_sub(pages.len());
            want.truncate(room);
        }
        let again: Vec<(u64, usize)> = again
            .iter()
            .copied()
            .filter(|&(a, len)| {
                len > 0 && len <= 16 * CACHE_PAGE as usize && a.checked_add(len as u64).is_some()
            })
            .collect();
        if want.is_empty() && again.is_empty() {
            return Vec::new();
        }
        let mut bufs: Vec<Page> = want.iter().map(|_| take_page()).collect();
        let mut second: Vec<Vec<u8>> = again.iter().map(|&(_, len)| take_buf(len)).collect();
        let mut reqs: Vec<(u64, &mut [u8])> = Vec::with_capacity(want.len() + again.len());
        reqs.extend(
            want.iter()
                .zip(bufs.iter_mut())
                .map(|(&(a, lo, hi), b)| (a + lo as u64, &mut b[lo as usize..hi as usize])),
        );
        reqs.extend(
            again
                .iter()
                .zip(second.iter_mut())
                .map(|(&(a, _), b)| (a, &mut b[..])),
        );
        // The kernel stops at the first range it cannot read (memory unmapped since: a
        // thread that ended freed its frame stack): the ranges after it are asked for
        // again, in order, up to [`MAX_SKIPS`] times (one bad range among a thousand
        // threads' frames left every thread after it to a system call of its own).
        const MAX_SKIPS: usize = 16;
        let mut ok = vec![false; reqs.len()];
        let mut at = 0;
        for _ in 0..=MAX_SKIPS {
            let n = self.inner.read_many(&mut reqs[at..]);
            ok[at..at + n].iter_mut().for_each(|o| *o = true);
            at += n + 1;
            if at >= reqs.len() {
                break;
            }
        }
        drop(reqs);
        self.fetches.set(self.fetches.get().saturating_add(1));
        let (ok_pages, ok_again) = ok.split_at(want.len());
        let looked: Vec<(u64, Vec<u8>)> = again
            .iter()
            .map(|&(a, _)| a)
            .zip(second)
            .zip(ok_again)
            .filter(|(_, &o)| o)
            .map(|(r, _)| r)
            .collect();
        let mut pages = self.pages.borrow_mut();
        let mut bufs = bufs.into_iter();
        let mut spare = Vec::new();
        for (((addr, lo, hi), buf), &o) in want.into_iter().zip(bufs.by_ref()).zip(ok_pages) {
            if !o {
                spare.push(buf);
                continue;
            }
            match pages.position(addr) {
                Some(i) => {
                    let p = &mut pages[i];
                    let old = std::mem::replace(&mut p.buf, buf);
                    p.valid = (lo, hi);
                    give_back([old]);
                }
                None => pages.push(CachedPage {
                    addr,
                    buf,
                    valid: (lo, hi),
                    used: UNUSED,
                }),
            }
        }
        give_back(bufs.chain(spare));
        looked
    }
}

impl ProcessMemory for PageCache<'_> {
    /// Reads the parts of pages that `ranges` cover (one span per page) in one request.
    fn prefetch(&self, ranges: &[(u64, usize)]) {
        self.fill(ranges, &[]);
    }

    /// Straight from the page when the cache holds the bytes (a walk's frames, every
    /// sample): no zeroing, no copy in between.
    fn read_append(&self, addr: u64, len: usize, out: &mut Vec<u8>) -> Result<()> {
        if cacheable(addr, len) {
            let page = addr & !(CACHE_PAGE - 1);
            let (lo, hi) = ((addr - page) as u32, (addr - page) as u32 + len as u32);
            // On one page (a frame, nearly always): straight from it when it holds them.
            if hi as u64 <= CACHE_PAGE {
                let mut pages = self.pages.borrow_mut();
                if let Some(p) = pages.position(page).map(|i| &mut pages[i]) {
                    if p.holds(lo, hi) {
                        out.extend_from_slice(p.serve(lo, hi));
                        return Ok(());
                    }
                }
            }
        }
        append_by_read(self, addr, len, out)
    }

    fn keep(&self, addr: u64, len: usize) {
        if !cacheable(addr, len) {
            return;
        }
        let mut pages = self.pages.borrow_mut();
        for (page, lo, hi) in page_parts(addr, len) {
            if let Some(i) = pages.position(page) {
                let p = &mut pages[i];
                // What the page holds of the range.
                let (lo, hi) = (lo.max(p.valid.0), hi.min(p.valid.1));
                if lo < hi {
                    p.mark_used(lo, hi);
                }
            }
        }
    }

    fn prefetches(&self) -> bool {
        true
    }

    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<()> {
        let len = buf.len() as u64;
        // Large reads (strings, line tables) go straight through.
        // (A torn pointer may be anywhere: near the top of the address space the page
        // arithmetic below would overflow, so such reads go straight through too.)
        if !cacheable(addr, buf.len()) {
            if len > 0 {
                self.miss();
            }
            return self.inner.read(addr, buf);
        }
        let first = addr & !(CACHE_PAGE - 1);
        let split = ((first + CACHE_PAGE).min(addr + len) - addr) as usize;
        let (a, b) = buf.split_at_mut(split);
        let ok = self.copy_from_page(first, (addr - first) as usize, a)
            && (b.is_empty() || self.copy_from_page(first + CACHE_PAGE, 0, b));
        if ok {
            Ok(())
        } else {
            self.miss();
            self.inner.read(addr, buf)
        }
    }
}

/// What [`PageCache::prefetch_with_second_look`] read the second time: reads it covers are
/// served from it; any other read goes to the process (and so happens later). A request of
/// several ranges is served from it only when it covers them all, so that the order in
/// which they were read (the caller's) holds.
pub(crate) struct SecondLook<'a> {
    inner: &'a dyn ProcessMemory,
    ranges: Vec<(u64, Vec<u8>)>,
}

impl Drop for SecondLook<'_> {
    fn drop(&mut self) {
        for (_, b) in self.ranges.drain(..) {
            give_back_buf(b);
        }
    }
}

impl SecondLook<'_> {
    fn covered(&self, addr: u64, len: usize) -> Option<&[u8]> {
        self.ranges.iter().find_map(|(start, bytes)| {
            let from = addr.checked_sub(*start)? as usize;
            bytes.get(from..from.checked_add(len)?)
        })
    }
}

impl ProcessMemory for SecondLook<'_> {
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<()> {
        match self.covered(addr, buf.len()) {
            Some(src) => {
                buf.copy_from_slice(src);
                Ok(())
            }
            None => self.inner.read(addr, buf),
        }
    }

    fn read_many(&self, reqs: &mut [(u64, &mut [u8])]) -> usize {
        if reqs
            .iter()
            .all(|(a, b)| self.covered(*a, b.len()).is_some())
        {
            for (a, b) in reqs.iter_mut() {
                if let Some(src) = self.covered(*a, b.len()) {
                    b.copy_from_slice(src);
                }
            }
            return reqs.len();
        }
        self.inner.read_many(reqs)
    }

    fn live(&self) -> Option<&dyn ProcessMemory> {
        Some(self.inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffer_memory_bounds() {
        let m = BufferMemory {
            base: 0x1000,
            bytes: (0u8..16).collect(),
        };
        assert_eq!(
            m.read_u32(0x1004).unwrap(),
            u32::from_le_bytes([4, 5, 6, 7])
        );
        assert!(m.read_u64(0x100c).is_err());
        assert!(m.read_u64(0xfff).is_err());
    }

    #[test]
    fn page_cache_reads_what_the_memory_holds() {
        let bytes: Vec<u8> = (0..3 * CACHE_PAGE).map(|i| (i * 7 % 251) as u8).collect();
        let m = BufferMemory {
            base: 0x10000,
            bytes: bytes.clone(),
        };
        let c = PageCache::new(&m);
        // Inside a page, across a page boundary, and twice (the second from the cache).
        for (off, len) in [
            (10u64, 100usize),
            (4090, 20),
            (4090, 20),
            (0, 4096),
            (6000, 6000),
        ] {
            let got = c.read_vec(0x10000 + off, len).unwrap();
            assert_eq!(got, bytes[off as usize..off as usize + len], "{off}+{len}");
        }
        // Past the end: an error, as from the memory itself; a range that ends exactly at
        // the end of the memory reads even though the next page does not exist.
        assert!(c.read_vec(0x10000 + 3 * CACHE_PAGE - 4, 8).is_err());
        assert!(c.read_vec(0x10000 + 3 * CACHE_PAGE - 8, 8).is_ok());
        // Addresses at the very top (torn pointers) are errors, never overflows.
        for addr in [
            u64::MAX - 7,
            u64::MAX - CACHE_PAGE,
            u64::MAX - 3 * CACHE_PAGE,
        ] {
            assert!(c.read_vec(addr, 8).is_err());
            c.prefetch(&[(addr, 8)]);
        }
    }

    /// A range that cannot be read (unmapped since: a thread that ended freed its frame
    /// stack) costs only itself: the ranges after it in the same prefetch are read too.
    #[test]
    fn a_prefetch_reads_past_a_range_it_cannot_read() {
        let page = CACHE_PAGE as usize;
        // SAFETY: a fresh anonymous mapping of three pages, the middle one unmapped again;
        // only the outer two are touched, and all is unmapped at the end.
        let base = unsafe {
            let p = libc::mmap(
                std::ptr::null_mut(),
                3 * page,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            assert_ne!(p, libc::MAP_FAILED);
            let p = p as *mut u8;
            std::ptr::write_bytes(p, 0x5a, page);
            std::ptr::write_bytes(p.add(2 * page), 0xa5, page);
            assert_eq!(libc::munmap(p.add(page) as *mut libc::c_void, page), 0);
            p as u64
        };
        let m = RemoteMemory::new(std::process::id() as i32).unwrap();
        let c = PageCache::new(&m);
        let (first, hole, last) = (base + 8, base + CACHE_PAGE + 8, base + 2 * CACHE_PAGE + 8);
        c.prefetch(&[(first, 16), (hole, 16), (last, 16)]);
        assert_eq!(c.fetches(), 1);
        assert_eq!(c.read_vec(first, 16).unwrap(), vec![0x5a; 16]);
        assert_eq!(c.read_vec(last, 16).unwrap(), vec![0xa5; 16]);
        assert_eq!(c.misses(), 0, "both readable ranges came from the prefetch");
        assert!(c.read_vec(hole, 16).is_err());
        // SAFETY: the two pages mapped above, unmapped once.
        unsafe {
            libc::munmap(base as *mut libc::c_void, page);
            libc::munmap((base + 2 * CACHE_PAGE) as *mut libc::c_void, page);
        }
    }

    #[test]
    fn prefetch_fills_the_cache_in_one_go() {
        // Three values on different pages of our own memory, read through one
        // process_vm_readv, then served from the cache.
        let a = vec![0x11u8; 3 * CACHE_PAGE as usize];
        let m = RemoteMemory::new(std::process::id() as i32).unwrap();
        let c = PageCache::new(&m);
        let base = a.as_ptr() as u64;
        let addrs = [base + 8, base + CACHE_PAGE + 8, base + 2 * CACHE_PAGE + 8];
        c.prefetch(&addrs.iter().map(|&x| (x, 16)).collect::<Vec<_>>());
        let cached = c.pages.borrow().len();
        assert!(cached >= 3, "{cached} pages cached");
        for x in addrs {
            assert_eq!(c.read_vec(x, 16).unwrap(), vec![0x11u8; 16]);
        }
        assert_eq!(
            c.pages.borrow().len(),
            cached,
            "the reads came from the cache"
        );
        // An unreadable range stops the batch there; what came before is kept.
        let mut one = [0u8; 8];
        let mut two = [0u8; 8];
        let mut three = [0u8; 8];
        let mut reqs: Vec<(u64, &mut [u8])> =
            vec![(base, &mut one), (8, &mut two), (base + 16, &mut three)];
        assert_eq!(m.read_many(&mut reqs), 1);
    }

    #[test]
    fn a_second_look_serves_what_it_covers_and_the_rest_comes_from_the_process() {
        let mut a = vec![0x22u8; 2 * CACHE_PAGE as usize];
        let m = RemoteMemory::new(std::process::id() as i32).unwrap();
        let base = a.as_ptr() as u64;
        let (first, second, after) = {
            let c = PageCache::new(&m);
            let look = c.prefetch_with_second_look(&[(base, 64)], &[(base + 64, 32)]);
            // The walk's reads inside the prefetch: no miss.
            assert_eq!(c.read_vec(base, 8).unwrap(), vec![0x22u8; 8]);
            assert_eq!(c.misses(), 0);
            // Outside it: a miss, read now.
            c.read_vec(base + CACHE_PAGE + 8, 8).unwrap();
            assert_eq!(c.misses(), 1);
            // A covered read comes from the copy, whatever the process holds now.
            let first = look.read_vec(base + 64, 8).unwrap();
            // SAFETY: our own buffer, written while nothing else reads it.
            unsafe { std::ptr::write_volatile(a.as_mut_ptr().add(64), 0x33) };
            let second = look.read_vec(base + 64, 8).unwrap();
            // A request with a range it does not cover is read from the process, whole.
            let mut x = [0u8; 8];
            let mut y = [0u8; 8];
            let mut reqs: Vec<(u64, &mut [u8])> = vec![(base + 64, &mut x), (base + 512, &mut y)];
            assert_eq!(look.read_many(&mut reqs), 2);
            assert!(look.live().is_some());
            (first, second, x)
        };
        assert_eq!(first, vec![0x22u8; 8]);
        assert_eq!(second, vec![0x22u8; 8], "served from the second look");
        assert_eq!(after[0], 0x33, "read from the process");
        drop(a);
    }

    #[test]
    fn prefetch_reads_only_the_ranges_and_notes_what_was_used() {
        let bytes: Vec<u8> = (0..2 * CACHE_PAGE).map(|i| (i * 13 % 251) as u8).collect();
        let base = 0x40000u64;
        let m = BufferMemory {
            base,
            bytes: bytes.clone(),
        };
        let c = PageCache::new(&m);
        // Two ranges on the first page and one across into the second: one span per page.
        c.prefetch(&[(base + 100, 16), (base + 300, 8), (base + 4090, 12)]);
        {
            let pages = c.pages.borrow();
            assert_eq!(pages.len(), 2);
            assert_eq!(pages[0].valid, (100, 4096));
            assert_eq!(pages[1].valid, (0, 6));
        }
        assert!(c.used_ranges().is_empty(), "nothing served yet");
        // Inside what was fetched: served as is.
        assert_eq!(c.read_vec(base + 104, 8).unwrap(), bytes[104..112]);
        assert_eq!(c.pages.borrow()[0].valid, (100, 4096));
        // Outside it on the same page: the whole page is fetched, the data still right.
        assert_eq!(c.read_vec(base + 20, 8).unwrap(), bytes[20..28]);
        assert_eq!(c.pages.borrow()[0].valid, (0, CACHE_PAGE as u32));
        // Across the boundary.
        assert_eq!(c.read_vec(base + 4092, 8).unwrap(), bytes[4092..4100]);
        // What was used, per page: the next prefetch.
        assert_eq!(
            c.used_ranges(),
            vec![(base + 20, 4096 - 20), (base + 4096, 4)]
        );
    }

    #[test]
    fn a_cache_of_many_pages_finds_each_and_keeps_counts_only_what_it_holds() {
        // More pages than are looked up one by one: the index takes over, and every page
        // (those before it was built too) is found, in a prefetch and in reads.
        let pages = 3 * Pages::FEW as u64;
        let bytes: Vec<u8> = (0..pages * CACHE_PAGE)
            .map(|i| (i * 31 % 253) as u8)
            .collect();
        let base = 0x100000u64;
        let m = BufferMemory {
            base,
            bytes: bytes.clone(),
        };
        let c = PageCache::new(&m);
        let ranges: Vec<(u64, usize)> = (0..pages)
            .map(|p| (base + p * CACHE_PAGE + 64, 32))
            .collect();
        c.prefetch(&ranges);
        assert_eq!(c.pages.borrow().len(), pages as usize);
        for p in (0..pages).rev() {
            let at = (p * CACHE_PAGE + 72) as usize;
            assert_eq!(c.read_vec(base + at as u64, 8).unwrap(), bytes[at..at + 8]);
        }
        assert_eq!(c.misses(), 0, "every read came from the prefetch");
        // Onto the end of a buffer: from the page, across pages, and past the end (an
        // error that leaves the buffer as it was).
        let mut out = vec![7u8];
        c.read_append(base + 80, 8, &mut out).unwrap();
        c.read_append(base + CACHE_PAGE - 4, 8, &mut out).unwrap();
        assert_eq!(out[0], 7);
        assert_eq!(out[1..9], bytes[80..88]);
        assert_eq!(
            out[9..],
            bytes[CACHE_PAGE as usize - 4..CACHE_PAGE as usize + 4]
        );
        assert!(c
            .read_append(base + pages * CACHE_PAGE - 4, 8, &mut out)
            .is_err());
        assert_eq!(out.len(), 17);
        // The same page twice in one prefetch, past the point where the prefetch indexes
        // what it wants: one span.
        let c = PageCache::new(&m);
        let mut twice = ranges.clone();
        twice.push((base + 5 * CACHE_PAGE + 512, 16));
        c.prefetch(&twice);
        assert_eq!(c.pages.borrow().len(), pages as usize);
        assert_eq!(c.pages.borrow()[5].valid, (64, 528));
        // `keep`: what the cache holds of a range counts as used; what it does not hold, or
        // a page it has not got, is not read and not counted.
        let c = PageCache::new(&m);
        c.prefetch(&[(base + 100, 50)]);
        c.keep(base + 80, 100);
        c.keep(base + 3 * CACHE_PAGE, 8);
        assert_eq!(c.used_ranges(), vec![(base + 100, 50)]);
        assert_eq!(c.pages.borrow().len(), 1);
        assert_eq!(c.misses(), 0);
    }

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
            // An unmapped range in the middle: the ranges before it only.
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

    #[test]
    fn fields_out_of_range_read_zero() {
        let b = [1u8, 0, 0, 0];
        assert_eq!(field_u32(&b, 0), 1);
        assert_eq!(field_u64(&b, 0), 0);
        assert_eq!(field_u8(&b, 9), 0);
    }
}
