//! The page cache of one snapshot's reads: [`PageCache`].
//!
//! Owns:
//! - the cached pages, found by address, each holding part or all of its bytes;
//! - prefetches, which read many ranges in one request;
//! - the note of which bytes reads used, for the next snapshot's prefetch;
//! - the spare page buffers that dropped caches leave to the next ones.
//!
//! Must not: be kept across samples; what it holds is stale once the target runs on.

use super::memory::{append_by_read, ProcessMemory};
use super::pool::take_buf;
use super::second_look::SecondLook;
use crate::error::Result;

/// Page size of the read cache.
pub(crate) const CACHE_PAGE: u64 = 4096;
/// Most pages one cache keeps. A walk touches a handful, a thread list one page or so per
/// thread. This bounds a runaway walk (16 MiB).
const CACHE_MAX_PAGES: usize = 4096;

/// A read-through cache of pages over another [`ProcessMemory`], for the reads of one
/// snapshot.
/// - One system call costs about the same for a small read as for a page.
/// - The structures one walk touches often share pages: frames in 3.11+'s frame stack, a
///   frame and its neighbours, a code object and its name.
/// - A page may hold only part of its bytes. A prefetch reads just the ranges asked for
///   (copying whole pages costs the kernel time too). A read outside what a page holds
///   fetches the whole page.
/// - The cache notes which bytes of each page were used ([`PageCache::used_ranges`]), for
///   the next snapshot's prefetch.
/// - Only valid while what it read cannot change (threads paused), or for one walk whose
///   result is checked by other means. Never keep one across samples.
pub(crate) struct PageCache<'a> {
    inner: &'a dyn ProcessMemory,
    pages: std::cell::RefCell<Pages>,
    /// Reads that went to `inner` after the prefetch (bytes the cache did not hold).
    misses: std::cell::Cell<u32>,
    /// Requests made by prefetches (each one later than what the earlier ones read).
    fetches: std::cell::Cell<u32>,
}

type Page = Box<[u8; CACHE_PAGE as usize]>;

/// One page of a [`PageCache`]. The bytes `valid` hold what the process had. `used` are
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

/// Whether the range `(addr, len)` goes through the cache. It does when it is:
/// - not empty;
/// - at most a page (larger reads go straight through);
/// - not so near the top of the address space (a torn pointer may be anywhere) that page
///   arithmetic would overflow.
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

/// A cache's pages in the order they were fetched, found by address:
/// - by a look at each while they are few (a sample's walk touches a handful);
/// - through an index past [`Pages::FEW`] (a process with a thousand threads has a thousand
///   thread states to read on as many pages).
#[derive(Default)]
struct Pages {
    list: Vec<CachedPage>,
    /// Built once the list outgrows [`Pages::FEW`] (making even an empty map costs a
    /// seeded hasher).
    index: Option<crate::IdMap<u64, usize>>,
    /// The page found last. Most reads follow one on the same page (a frame stack's frames).
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
    /// Page buffers of dropped caches, reused by the next ones. A sampler makes a few caches
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
    /// ranges `again`, which give what they held a moment after the prefetch read everything
    /// else (the kernel copies the ranges of one request in order). A walk served entirely
    /// from the prefetch can be checked against that second look instead of a read made
    /// after the walk. The two reads are then microseconds apart instead of the walk's
    /// duration. A range of `again` that could not be read is left out.
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
    /// fetched. That is what the next snapshot will most likely read, for its prefetch.
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
    /// cannot be read (its end is not mapped, say). The caller then reads the exact range.
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
        // Where each page is in `want`, found by a look at each while they are few.
        let mut wanted: Option<crate::IdMap<u64, usize>> = None;
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
        // The kernel stops at the first range it cannot read (memory unmapped since, as
        // when a thread that ended freed its frame stack). The ranges after it are asked for
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
    /// sample), with no zeroing and no copy in between.
    fn read_append(&self, addr: u64, len: usize, out: &mut Vec<u8>) -> Result<()> {
        if cacheable(addr, len) {
            let page = addr & !(CACHE_PAGE - 1);
            let (lo, hi) = ((addr - page) as u32, (addr - page) as u32 + len as u32);
            // On one page (a frame, nearly always), straight from it when it holds them.
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ptrace::{BufferMemory, RemoteMemory};

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
        // Past the end is an error, as from the memory itself. A range that ends exactly at
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

    /// A range that cannot be read (unmapped since, as when a thread that ended freed its
    /// frame stack) costs only itself. The ranges after it in the same prefetch are read
    /// too.
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
    fn prefetch_reads_only_the_ranges_and_notes_what_was_used() {
        let bytes: Vec<u8> = (0..2 * CACHE_PAGE).map(|i| (i * 13 % 251) as u8).collect();
        let base = 0x40000u64;
        let m = BufferMemory {
            base,
            bytes: bytes.clone(),
        };
        let c = PageCache::new(&m);
        // Two ranges on the first page and one across into the second make one span per
        // page.
        c.prefetch(&[(base + 100, 16), (base + 300, 8), (base + 4090, 12)]);
        {
            let pages = c.pages.borrow();
            assert_eq!(pages.len(), 2);
            assert_eq!(pages[0].valid, (100, 4096));
            assert_eq!(pages[1].valid, (0, 6));
        }
        assert!(c.used_ranges().is_empty(), "nothing served yet");
        // Inside what was fetched, served as is.
        assert_eq!(c.read_vec(base + 104, 8).unwrap(), bytes[104..112]);
        assert_eq!(c.pages.borrow()[0].valid, (100, 4096));
        // Outside it on the same page, the whole page is fetched, the data still right.
        assert_eq!(c.read_vec(base + 20, 8).unwrap(), bytes[20..28]);
        assert_eq!(c.pages.borrow()[0].valid, (0, CACHE_PAGE as u32));
        // Across the boundary.
        assert_eq!(c.read_vec(base + 4092, 8).unwrap(), bytes[4092..4100]);
        // What was used, per page, is the next prefetch.
        assert_eq!(
            c.used_ranges(),
            vec![(base + 20, 4096 - 20), (base + 4096, 4)]
        );
    }

    #[test]
    fn a_cache_of_many_pages_finds_each_and_keeps_counts_only_what_it_holds() {
        // With more pages than are looked up one by one, the index takes over, and every page
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
        // what it wants, makes one span.
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
}
