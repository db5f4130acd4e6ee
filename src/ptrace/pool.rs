//! Byte buffers reused from one read to the next: [`take_buf`] and [`give_back_buf`].
//!
//! Owns: each thread's stock of spare buffers, bounded in count and in size.
//! Must not: zero a buffer it hands out. The read that follows overwrites it.

thread_local! {
    /// Byte buffers of earlier reads (second looks, a walk's frames read again), reused.
    /// Zeroing kilobytes for every sample only to overwrite them was a visible part of a
    /// sample's own work.
    static SPARE_BUFS: std::cell::RefCell<Vec<Vec<u8>>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Most buffers [`SPARE_BUFS`] keeps, and the largest it keeps.
const SPARE_BUFS_MAX: usize = 64;
const SPARE_BUF_MAX_BYTES: usize = 256 * 1024;

/// A buffer of `len` bytes for a read to fill, a spare one when there is one. Its contents
/// are whatever it held (a read that fails leaves them, and such a buffer is never used for
/// data).
pub(crate) fn take_buf(len: usize) -> Vec<u8> {
    // The same ranges are read sample after sample. So take one of that length first, else
    // one at least as long, so that little is ever zeroed.
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
