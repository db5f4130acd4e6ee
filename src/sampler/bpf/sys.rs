//! The `bpf(2)` system call and what it hands back: maps, the loaded program, its
//! attachment to the tracepoint, and the ring buffer's consumer side (mapped into our
//! memory, so reading it costs no system call).
//!
//! Owns: every `unsafe` of the BPF source. Everything is released on drop (file
//! descriptors and mappings; the kernel detaches the program when its last fd closes,
//! also when the profiler is killed).
//! Must not: know what the records mean.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use super::prog::Insn;

const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_MAP_LOOKUP_ELEM: libc::c_long = 1;
const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_RAW_TRACEPOINT_OPEN: libc::c_long = 17;
const MAP_TYPE_ARRAY: u32 = 2;
const MAP_TYPE_RINGBUF: u32 = 27;
const PROG_TYPE_RAW_TRACEPOINT: u32 = 17;

/// `union bpf_attr`, as bytes. Each command reads its own fields at fixed offsets.
#[repr(C, align(8))]
struct Attr([u8; 128]);

impl Attr {
    fn new() -> Attr {
        Attr([0; 128])
    }
    fn u32(&mut self, at: usize, v: u32) -> &mut Self {
        self.0[at..at + 4].copy_from_slice(&v.to_ne_bytes());
        self
    }
    fn u64(&mut self, at: usize, v: u64) -> &mut Self {
        self.0[at..at + 8].copy_from_slice(&v.to_ne_bytes());
        self
    }
}

/// `bpf(cmd, attr)`; the attribute's pointers must be valid for the call.
fn bpf(cmd: libc::c_long, attr: &mut Attr) -> io::Result<libc::c_long> {
    // SAFETY: `attr` is a live, writable buffer of the size passed. The pointers stored in
    // it (set by the callers below) point at buffers that outlive this call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr.0.as_mut_ptr(),
            attr.0.len() as libc::c_uint,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn fd_of(r: libc::c_long) -> OwnedFd {
    // SAFETY: a successful bpf() that creates an object returns a new fd that nothing
    // else owns.
    unsafe { OwnedFd::from_raw_fd(r as i32) }
}

/// A map: type, key and value sizes, entries.
pub(crate) fn map_create(kind: u32, key: u32, value: u32, entries: u32) -> io::Result<OwnedFd> {
    let mut a = Attr::new();
    a.u32(0, kind).u32(4, key).u32(8, value).u32(12, entries);
    bpf(BPF_MAP_CREATE, &mut a).map(fd_of)
}

/// A one-entry array of u64: the program's drop counter.
pub(crate) fn counter() -> io::Result<OwnedFd> {
    map_create(MAP_TYPE_ARRAY, 4, 8, 1)
}

/// The counter's value.
pub(crate) fn read_counter(map: &OwnedFd) -> io::Result<u64> {
    let key = 0u32;
    let mut value = 0u64;
    let mut a = Attr::new();
    a.u32(0, map.as_raw_fd() as u32)
        .u64(8, &key as *const u32 as u64)
        .u64(16, &mut value as *mut u64 as u64);
    bpf(BPF_MAP_LOOKUP_ELEM, &mut a)?;
    Ok(value)
}

/// Loads a raw tracepoint program. The error carries the end of the verifier's log. The
/// load is tried again with a log only when it failed, because a log too small fails a
/// load.
pub(crate) fn load_raw_tracepoint(insns: &[Insn]) -> io::Result<OwnedFd> {
    let code: Vec<u8> = insns.iter().flat_map(|i| i.to_bytes()).collect();
    let license = b"GPL\0";
    let load = |log: &mut [u8]| {
        let mut a = Attr::new();
        a.u32(0, PROG_TYPE_RAW_TRACEPOINT)
            .u32(4, insns.len() as u32)
            .u64(8, code.as_ptr() as u64)
            .u64(16, license.as_ptr() as u64);
        if !log.is_empty() {
            a.u32(24, 1)
                .u32(28, log.len() as u32)
                .u64(32, log.as_mut_ptr() as u64);
        }
        a.0[48..56].copy_from_slice(b"scalene\0");
        bpf(BPF_PROG_LOAD, &mut a).map(fd_of)
    };
    if let Ok(fd) = load(&mut []) {
        return Ok(fd);
    }
    let mut log = vec![0u8; 256 * 1024];
    load(&mut log).map_err(|e| {
        let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
        let text = String::from_utf8_lossy(&log[..end]);
        let last = text.lines().rev().take(3).collect::<Vec<_>>().join(" / ");
        io::Error::new(e.kind(), format!("{e} (verifier: {last})"))
    })
}

/// Attaches `prog` to the raw tracepoint `name`; detached when the returned fd closes.
pub(crate) fn attach_raw_tracepoint(name: &str, prog: &OwnedFd) -> io::Result<OwnedFd> {
    let name = std::ffi::CString::new(name).map_err(io::Error::other)?;
    let mut a = Attr::new();
    a.u64(0, name.as_ptr() as u64)
        .u32(8, prog.as_raw_fd() as u32);
    bpf(BPF_RAW_TRACEPOINT_OPEN, &mut a).map(fd_of)
}

/// A ring buffer map of `size` bytes (a power of two, a multiple of the page size), mapped:
/// - the consumer position (ours to write);
/// - the producer position and data (read-only, the data mapped twice in a row so a record
///   that wraps reads contiguously).
pub(crate) struct Ring {
    map: OwnedFd,
    consumer: *mut u8,
    producer: *const u8,
    page: usize,
    size: usize,
}

impl Ring {
    pub(crate) fn new(size: usize) -> io::Result<Ring> {
        let map = map_create(MAP_TYPE_RINGBUF, 0, 0, size as u32)?;
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
        let mapping = |len: usize, prot, off: usize| -> io::Result<*mut u8> {
            // SAFETY: a new shared mapping of the map's fd chosen by the kernel (null
            // hint). The kernel checks the length and offset against the ring's layout.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    prot,
                    libc::MAP_SHARED,
                    map.as_raw_fd(),
                    off as libc::off_t,
                )
            };
            if p == libc::MAP_FAILED {
                Err(io::Error::last_os_error())
            } else {
                Ok(p.cast())
            }
        };
        let consumer = mapping(page, libc::PROT_READ | libc::PROT_WRITE, 0)?;
        let producer = match mapping(page + 2 * size, libc::PROT_READ, page) {
            Ok(p) => p,
            Err(e) => {
                // SAFETY: the consumer page mapped just above, not used after.
                unsafe { libc::munmap(consumer.cast(), page) };
                return Err(e);
            }
        };
        Ok(Ring {
            map,
            consumer,
            producer,
            page,
            size,
        })
    }

    pub(crate) fn fd(&self) -> i32 {
        self.map.as_raw_fd()
    }

    /// Hands every complete record written since the last call to `each`, then gives
    /// their space back to the producer. Stops at a record still being written.
    pub(crate) fn consume(&mut self, mut each: impl FnMut(&[u8])) {
        const BUSY: u32 = 1 << 31;
        const DISCARD: u32 = 1 << 30;
        // SAFETY: both positions are the first u64 of their page, mapped for the ring's
        // life, 8-aligned (page-aligned). The kernel updates them concurrently, hence the
        // atomics (acquire on the producer's, release on ours, as the kernel expects).
        let (cons_pos, prod_pos) = unsafe {
            (
                &*(self.consumer as *const AtomicU64),
                &*(self.producer as *const AtomicU64),
            )
        };
        let mut cons = cons_pos.load(Ordering::Relaxed);
        let prod = prod_pos.load(Ordering::Acquire);
        let data = self.producer.wrapping_add(self.page);
        while cons < prod {
            let at = (cons as usize) & (self.size - 1);
            // SAFETY: `at` < size, and the header (8 bytes, 8-aligned) lies in the first
            // copy of the data. The kernel writes the length last, with release ordering.
            let hdr = unsafe { &*(data.add(at) as *const AtomicU32) }.load(Ordering::Acquire);
            if hdr & BUSY != 0 {
                break;
            }
            let len = (hdr & !(BUSY | DISCARD)) as usize;
            if hdr & DISCARD == 0 && len <= self.size {
                // SAFETY: the record (committed, not busy) follows its header. With the
                // data mapped twice it is contiguous even when it wraps (len <= size).
                let rec = unsafe { std::slice::from_raw_parts(data.add(at + 8), len) };
                each(rec);
            }
            cons += ((len + 8 + 7) & !7) as u64;
        }
        cons_pos.store(cons, Ordering::Release);
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        // SAFETY: the two mappings made in `new`, with their lengths; nothing refers to
        // them after this.
        unsafe {
            libc::munmap(self.consumer.cast(), self.page);
            libc::munmap(
                self.producer as *mut libc::c_void,
                self.page + 2 * self.size,
            );
        }
    }
}

// SAFETY: the mappings are owned by the Ring alone (no aliasing handles), and the kernel
// side is synchronised through the atomic positions. So moving the Ring to another thread
// is sound.
unsafe impl Send for Ring {}
