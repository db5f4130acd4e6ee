//! The one way the crate reads another address space: the [`ProcessMemory`] trait.
//!
//! Owns:
//! - the trait, whose default methods are built on its `read`;
//! - little-endian field accessors over a buffer read in one go ([`field_u64`] and kin);
//! - `BufferMemory`, bytes that pretend to be an address space (tests, fuzzing).
//!
//! Stack walking is generic over the trait, so tests walk frames from byte buffers.
//!
//! Must not: make a system call (a live process is read in `live.rs`).

#[cfg(any(test, feature = "fuzzing"))]
use crate::error::Error;
use crate::error::Result;

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

    /// Fills `buf` from `addr` as far as the memory is readable, in one go. Returns the count
    /// of bytes read, which stops short where the mapping ends (a thread's stack read up to
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
    /// implementation can. Returns how many of them, counted from the first, were filled
    /// completely (the rest are left unspecified).
    fn read_many(&self, reqs: &mut [(u64, &mut [u8])]) -> usize {
        read_each(self, reqs)
    }

    /// A hint that the ranges `(addr, len)` will be read soon, so a caching implementation
    /// fetches them together. Never fails. A range it cannot fetch is read when asked for.
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
    /// did not read all of it. A caching implementation counts what it holds of it as used
    /// (so that the next prefetch fetches it again), and reads nothing.
    fn keep(&self, _addr: u64, _len: usize) {}

    /// For memory that serves earlier copies (`SecondLook`), the process itself, for a
    /// read that must happen now. None: this memory reads the process when asked.
    fn live(&self) -> Option<&dyn ProcessMemory> {
        None
    }
}

/// [`ProcessMemory::read_append`] through [`ProcessMemory::read`].
pub(super) fn append_by_read<M: ProcessMemory + ?Sized>(
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

/// [`ProcessMemory::read_many`] one read at a time.
pub(super) fn read_each<M: ProcessMemory + ?Sized>(
    mem: &M,
    reqs: &mut [(u64, &mut [u8])],
) -> usize {
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
/// Out-of-range offsets read as zero, because callers size buffers from the layout, and a zero
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
    fn fields_out_of_range_read_zero() {
        let b = [1u8, 0, 0, 0];
        assert_eq!(field_u32(&b, 0), 1);
        assert_eq!(field_u64(&b, 0), 0);
        assert_eq!(field_u8(&b, 9), 0);
    }
}
