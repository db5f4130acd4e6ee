//! What a prefetch read a second time, just after the rest: [`SecondLook`].
//!
//! Owns: serving the reads that copy covers. Every other read goes to the process.
//!
//! Must not: serve a request of several ranges partly from the copy (their order would not
//! hold).

use super::memory::ProcessMemory;
use super::pool::give_back_buf;
use crate::error::Result;

/// What [`PageCache::prefetch_with_second_look`] read the second time. Reads it covers are
/// served from it. Any other read goes to the process (and so happens later). A request of
/// several ranges is served from it only when it covers them all, so that the order in
/// which they were read (the caller's) holds.
///
/// [`PageCache::prefetch_with_second_look`]: super::PageCache::prefetch_with_second_look
pub(crate) struct SecondLook<'a> {
    pub(super) inner: &'a dyn ProcessMemory,
    pub(super) ranges: Vec<(u64, Vec<u8>)>,
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
    use crate::ptrace::{PageCache, RemoteMemory, CACHE_PAGE};

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
}
