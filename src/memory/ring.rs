//! The consumer side of the shared-memory ring. The profiler creates the ring file, the
//! preload library in the program claims it and writes events, and we read them here.
//!
//! Owns:
//! - [`Ring`] (create with O_EXCL and mode 0600 in a private place, map, read events in
//!   order, answer handshakes, remove the file);
//! - opening the rings the program's other processes make ([`Ring::open_child`], named by
//!   [`child_path`]);
//! - [`clean_stale`] (rings left by profilers that died).
//!
//! The format itself is `preload/src/layout.rs`, compiled into both sides.
//!
//! Must not: block the producer (a full ring is the producer's to drop), or trust the
//! file's contents beyond bounds-checked slot indices.

#[path = "../../preload/src/layout.rs"]
#[allow(dead_code)]
pub mod layout;

use layout::{Header, Slot};
use memmap2::MmapMut;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

pub use layout::RING_ENV;

/// A shared view of a ring's `pymem_wrapped` word (see [`Ring::python_allocator_flag`]).
pub(crate) struct PymemFlag {
    map: std::sync::Arc<MmapMut>,
}

impl PymemFlag {
    pub(crate) fn is_set(&self) -> bool {
        // SAFETY: the mapping is page-aligned and at least HEADER_BYTES long; Header is
        // made of atomics, valid for any bit pattern.
        let h = unsafe { &*(self.map.as_ptr() as *const Header) };
        h.pymem_wrapped.load(Ordering::Acquire) != 0
    }
}

/// File name prefix of our rings; the rest is `<profiler pid>-<n>.ring`.
const PREFIX: &str = "scalene-rs-ring-";

/// Default number of slots (64 bytes each, so 4 MiB).
pub(crate) const DEFAULT_CAPACITY: u64 = 1 << 16;
/// Slots of the rings the program's other processes make (1 MiB each). Each has a reader
/// of its own, so it needs less slack than the first process's ring, and a pool of many
/// workers keeps its shared memory small.
pub const CHILD_CAPACITY: u64 = 1 << 14;

/// One event, decoded: what happened, on which thread, when.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event {
    pub(crate) what: What,
    pub(crate) tid: i32,
    pub(crate) time_ns: u64,
    /// The producer waits until [`Ring::ack`] is called for this event (bounded).
    pub(crate) wants_ack: bool,
    pub(crate) ticket: u64,
}

/// What an event says. The ring's slots carry a kind and three numbers whose meaning
/// depends on the kind (the `EV_*` constants of the layout); they are decoded here, once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum What {
    /// A thread allocated a window's worth of bytes.
    /// - `bytes`: the bytes allocated (the window's net allocation, `window`, is the same
    ///   today).
    /// - `python`: how many of them the interpreter's own image allocated.
    /// - The allocation that filled the window is watched for its free (None: the watch
    ///   table was full).
    /// - `large`: that allocation is at least a window by itself (its event had a handshake
    ///   budget of its own, `EV_ALLOC_LARGE`).
    Alloc {
        bytes: u64,
        window: u64,
        python: u64,
        watched: Option<u64>,
        large: bool,
    },
    /// A thread freed a window's worth of bytes.
    Free { bytes: u64 },
    /// A thread copied a copy window's worth of bytes (memcpy / memmove).
    Copy { bytes: u64 },
    /// A watched allocation was freed.
    SampledFree { ptr: u64 },
    /// A watched allocation was moved by realloc from `from` to `to` (it stays watched).
    SampledMove { from: u64, to: u64 },
    /// A kind this profiler does not know (a newer library), which is ignored.
    Unknown { kind: u32 },
}

impl What {
    /// Decodes a slot's kind and numbers.
    pub(crate) fn decode(kind: u32, a: u64, b: u64, c: u64, ptr: u64) -> What {
        match kind {
            layout::EV_ALLOC | layout::EV_ALLOC_LARGE => What::Alloc {
                bytes: a,
                window: b,
                python: c,
                watched: (ptr != 0).then_some(ptr),
                large: kind == layout::EV_ALLOC_LARGE,
            },
            layout::EV_FREE => What::Free { bytes: a },
            layout::EV_COPY => What::Copy { bytes: a },
            layout::EV_SAMPLED_FREE => What::SampledFree { ptr },
            layout::EV_SAMPLED_MOVE => What::SampledMove { from: ptr, to: a },
            kind => What::Unknown { kind },
        }
    }
}

/// A ring we read: created by us (`run`), or taken over from a profiler that is gone
/// (`attach`).
pub struct Ring {
    path: PathBuf,
    /// We created the file, or it is a ring of the program's made for us to read, so we
    /// remove it when done. We do so only if the name still holds this file, because a
    /// process that `exec`s replaces its old ring with a new one of the same name.
    owned: bool,
    /// The file's device and inode.
    id: (u64, u64),
    /// We are its reader (made it, took it over, or were named its reader). When done,
    /// we tell its producer not to wait for us any more.
    reader: bool,
    map: std::sync::Arc<MmapMut>,
    capacity: u64,
    /// Since when the slot at `tail` has been reserved but not yet written.
    stuck_since: Option<Instant>,
}

/// How long a reserved slot may stay unwritten before we skip it (its producer thread died
/// between reserving and writing).
const STUCK_SLOT: Duration = Duration::from_secs(1);

/// Where rings go: /dev/shm when usable, else $XDG_RUNTIME_DIR, else the temp directory.
pub fn ring_dir() -> PathBuf {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() && nix::unistd::access(shm, nix::unistd::AccessFlags::W_OK).is_ok() {
        return shm.to_path_buf();
    }
    if let Some(x) = std::env::var_os("XDG_RUNTIME_DIR").filter(|x| !x.is_empty()) {
        return PathBuf::from(x);
    }
    std::env::temp_dir()
}

impl Ring {
    /// Creates a ring of `capacity` slots (a power of two) in `dir`, private to our user.
    pub fn create(
        dir: &Path,
        capacity: u64,
        window: u64,
        copy_window: u64,
    ) -> std::io::Result<Ring> {
        assert!(capacity.is_power_of_two());
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        // A name taken already is a ring a killed profiler of the same pid left behind (pids
        // come round again), so the next one is tried.
        let (path, file) = loop {
            let n = COUNTER.fetch_add(1, Ordering::Relaxed);
            let path = dir.join(format!("{PREFIX}{}-{n}.ring", std::process::id()));
            match std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(&path)
            {
                Ok(f) => break (path, f),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && n < 4096 => {}
                Err(e) => return Err(e),
            }
        };
        let cleanup = |e| {
            let _ = std::fs::remove_file(&path);
            e
        };
        // Its pages are allocated now, because a ring whose pages could not be had later (a
        // full /dev/shm) would kill the program with SIGBUS at its next event.
        let bytes = layout::file_bytes(capacity) as libc::off_t;
        // SAFETY: fallocate on a descriptor of ours.
        if unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, bytes) } != 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EOPNOTSUPP) {
                return Err(cleanup(e));
            }
            file.set_len(bytes as u64).map_err(cleanup)?;
        }
        // SAFETY: a shared mapping of a file we just created; the other side only touches
        // it through atomics of the layout, and every read here is of atomics too.
        let map = unsafe { MmapMut::map_mut(&file) }.map_err(cleanup)?;
        let meta = file.metadata().map_err(cleanup)?;
        let ring = Ring {
            path,
            owned: true,
            id: (meta.dev(), meta.ino()),
            reader: true,
            map: std::sync::Arc::new(map),
            capacity,
            stuck_since: None,
        };
        let h = ring.header();
        h.version.store(layout::LAYOUT_VERSION, Ordering::Relaxed);
        h.slot_bytes
            .store(std::mem::size_of::<Slot>() as u32, Ordering::Relaxed);
        h.capacity.store(capacity, Ordering::Relaxed);
        h.consumer_pid
            .store(std::process::id() as i32, Ordering::Relaxed);
        h.window.store(window, Ordering::Relaxed);
        h.copy_window.store(copy_window, Ordering::Relaxed);
        // The magic goes last, so a producer that sees it sees a complete header.
        h.magic.store(layout::MAGIC, Ordering::Release);
        Ok(ring)
    }

    /// Opens the ring at `path` that another profiler created, and becomes its reader if
    /// that profiler is gone. The file must be ours and private (mode 0600), well-formed,
    /// and claimed by `producer` (the process being attached to).
    pub(crate) fn take_over(path: &Path, producer: i32) -> Result<Ring, String> {
        let mut ring = Ring::open_checked(path, producer)?;
        ring.owned = false;
        let h = ring.header();
        let me = std::process::id() as i32;
        let reader = h.consumer_pid.load(Ordering::Acquire);
        if reader != me && crate::proc::process_exists(reader) {
            return Err(format!(
                "its memory events are read by scalene-rs process {reader} (the `run` that started it)"
            ));
        }
        h.consumer_pid
            .compare_exchange(reader, me, Ordering::AcqRel, Ordering::Acquire)
            .map_err(|_| "another profiler took the ring over first".to_string())?;
        // What the program wrote while nobody read belongs to no recording of ours.
        h.tail
            .store(h.head.load(Ordering::Acquire), Ordering::Release);
        h.consumer_generation.fetch_add(1, Ordering::AcqRel);
        ring.reader = true;
        Ok(ring)
    }

    /// Opens the ring that process `producer` of the program we run made for us
    /// ([`child_path`]). It must be ours, private, well-formed, claimed by `producer`, and
    /// naming us as its reader. We remove it when done. `Ok(None)`: there is none (yet).
    pub(crate) fn open_child(path: &Path, producer: i32) -> Result<Option<Ring>, String> {
        match std::fs::symlink_metadata(path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(format!("{}: {e}", path.display())),
            Ok(_) => {}
        }
        let mut ring = match Ring::open_checked(path, producer) {
            Ok(r) => r,
            // It is being made (not sized, or its header not complete yet), so look again later.
            Err(_) if Ring::incomplete(path) => return Ok(None),
            Err(e) => return Err(e),
        };
        let me = std::process::id() as i32;
        let reader = ring.header().consumer_pid.load(Ordering::Acquire);
        if reader != me {
            return Err(format!(
                "{} names scalene-rs process {reader} as its reader, not us",
                path.display()
            ));
        }
        ring.owned = true;
        ring.reader = true;
        Ok(Some(ring))
    }

    /// A ring file that is still being made: shorter than a header, or no magic yet.
    fn incomplete(path: &Path) -> bool {
        use std::io::Read;
        let mut magic = [0u8; 8];
        match std::fs::File::open(path).and_then(|mut f| f.read_exact(&mut magic)) {
            Ok(()) => u64::from_ne_bytes(magic) != layout::MAGIC,
            Err(e) => e.kind() == std::io::ErrorKind::UnexpectedEof,
        }
    }

    /// Opens and maps an existing ring after checking it: a private file of our user (no
    /// symbolic link), a header of this layout, slots inside the file, claimed by
    /// `producer`. Not owned.
    fn open_checked(path: &Path, producer: i32) -> Result<Ring, String> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(path)
            .map_err(|e| format!("opening {}: {e}", path.display()))?;
        let meta = file.metadata().map_err(|e| e.to_string())?;
        // SAFETY: getuid has no preconditions.
        let uid = unsafe { libc::getuid() };
        if meta.uid() != uid || meta.mode() & 0o077 != 0 || !meta.is_file() {
            return Err(format!(
                "{} is not a private file of ours; not reading it",
                path.display()
            ));
        }
        if (meta.len() as usize) < layout::HEADER_BYTES {
            return Err(format!("{} is too short for a ring", path.display()));
        }
        // SAFETY: a shared mapping of the file; every access goes through atomics.
        let map = unsafe { MmapMut::map_mut(&file) }.map_err(|e| e.to_string())?;
        let capacity = Ring::check_header(&map, path, producer)?;
        Ok(Ring {
            path: path.to_path_buf(),
            owned: false,
            id: (meta.dev(), meta.ino()),
            reader: false,
            map: std::sync::Arc::new(map),
            capacity,
            stuck_since: None,
        })
    }

    /// The capacity of the ring mapped at `map` (at least a header long) after checking its
    /// header: this layout, slots inside the mapping, claimed by `producer`.
    fn check_header(map: &MmapMut, path: &Path, producer: i32) -> Result<u64, String> {
        // SAFETY: at least a header long (the caller checked), page-aligned, atomics only.
        let h = unsafe { &*(map.as_ptr() as *const Header) };
        let capacity = h.capacity.load(Ordering::Relaxed);
        if h.magic.load(Ordering::Acquire) != layout::MAGIC
            || h.version.load(Ordering::Relaxed) != layout::LAYOUT_VERSION
            || h.slot_bytes.load(Ordering::Relaxed) as usize != std::mem::size_of::<Slot>()
            || !capacity.is_power_of_two()
            // Slots inside the mapping, checked without computing `file_bytes(capacity)`,
            // because the header is the program's to write. A capacity of 2^58 or more
            // overflowed it. With overflow checks that was a panic. Without them it wrapped to
            // a size that passed, and the first event read failed `slot`'s assertion.
            || capacity > ((map.len() - layout::HEADER_BYTES) / std::mem::size_of::<Slot>()) as u64
        {
            return Err(format!(
                "{} is not a ring this scalene-rs reads",
                path.display()
            ));
        }
        if h.producer_pid.load(Ordering::Acquire) != producer {
            return Err(format!(
                "the ring {} is not process {producer}'s",
                path.display()
            ));
        }
        Ok(capacity)
    }

    /// A ring over a private copy of `bytes` (the file's contents, header then slots),
    /// checked as [`Ring::open_checked`] checks a file, claimed by whichever producer its
    /// header names. It is neither owned nor read for anyone (dropping it touches no file). The
    /// fuzz target's way in to the header checks and [`Ring::next_event`].
    #[cfg(any(test, feature = "fuzzing"))]
    pub(crate) fn from_bytes(bytes: &[u8]) -> Result<Ring, String> {
        let mut map =
            MmapMut::map_anon(bytes.len().max(layout::HEADER_BYTES)).map_err(|e| e.to_string())?;
        map[..bytes.len()].copy_from_slice(bytes);
        let at = std::mem::offset_of!(Header, producer_pid);
        let producer = i32::from_ne_bytes(map[at..at + 4].try_into().expect("4 bytes"));
        let path = Path::new("");
        let capacity = Ring::check_header(&map, path, producer)?;
        Ok(Ring {
            path: path.to_path_buf(),
            owned: false,
            id: (0, 0),
            reader: false,
            map: std::sync::Arc::new(map),
            capacity,
            stuck_since: None,
        })
    }

    /// Says whether the program's other Python processes make rings of their own (see
    /// [`child_path`]), and of how many slots (a power of two). Set before the program
    /// starts.
    pub fn set_child_rings(&self, capacity: Option<u64>) {
        let cap = capacity.unwrap_or(0);
        assert!(cap == 0 || cap.is_power_of_two());
        self.header().child_capacity.store(cap, Ordering::Release);
    }

    /// The file stays when this handle is dropped.
    pub(crate) fn keep_file(&mut self) {
        self.owned = false;
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn header(&self) -> &Header {
        // SAFETY: the mapping is page-aligned and at least HEADER_BYTES long; Header is
        // made of atomics, valid for any bit pattern.
        unsafe { &*(self.map.as_ptr() as *const Header) }
    }

    fn slot(&self, ticket: u64) -> &Slot {
        // Our own capacity, not the header's, because the file is writable by the program.
        let i = (ticket & (self.capacity - 1)) as usize;
        let off = layout::HEADER_BYTES + i * std::mem::size_of::<Slot>();
        assert!(off + std::mem::size_of::<Slot>() <= self.map.len());
        // SAFETY: in bounds (checked above), 64-byte aligned, made of atomics (valid for
        // any bit pattern).
        unsafe { &*(self.map.as_ptr().add(off) as *const Slot) }
    }

    /// `attach` with memory (a ring whose heartbeat was started): tells the library in the
    /// process that we are still here. Does nothing for other rings.
    pub(crate) fn heartbeat(&self) {
        let h = self.header();
        if h.heartbeat_ns.load(Ordering::Relaxed) != 0 {
            h.heartbeat_ns.store(layout::now_ns(), Ordering::Release);
        }
    }

    /// `attach` with memory: tells the library to stop counting and put the program's
    /// function pointers back. Does nothing for other rings.
    pub(crate) fn detach_library(&self) {
        let h = self.header();
        if h.heartbeat_ns.load(Ordering::Relaxed) != 0 {
            h.detached.store(1, Ordering::Release);
        }
    }

    /// `attach` with memory: the word that says whether the interpreter's own allocator is
    /// wrapped yet, readable after the ring moved to its reader.
    pub(crate) fn python_allocator_flag(&self) -> PymemFlag {
        PymemFlag {
            map: self.map.clone(),
        }
    }

    /// The pid of the process that claimed the ring (0: none yet).
    pub fn producer_pid(&self) -> i32 {
        self.header().producer_pid.load(Ordering::Acquire)
    }

    /// Tells producers whether we answer handshakes (read the waiting thread's stack), and
    /// wakes those waiting for us to get ready.
    pub fn set_handshake(&self, on: bool) {
        let h = &self.header().handshake;
        let v = if on {
            layout::HANDSHAKE_ON
        } else {
            layout::HANDSHAKE_OFF
        };
        h.store(v, Ordering::Release);
        futex(h, libc::FUTEX_WAKE, i32::MAX as u32, None);
    }

    /// The next event, if one is written. Events come in ticket order; the slot is given
    /// back to producers at once (call [`Ring::ack`] for events that want an answer before
    /// the next `next_event`, so the slot is not reused while the producer waits on it).
    pub fn next_event(&mut self) -> Option<Event> {
        let tail = self.header().tail.load(Ordering::Acquire);
        if self.header().head.load(Ordering::Acquire) == tail {
            self.stuck_since = None;
            return None;
        }
        let Some(d) = self.slot(tail).read(tail) else {
            // Reserved, not written yet, so wait, but not forever.
            let since = *self.stuck_since.get_or_insert_with(Instant::now);
            if since.elapsed() >= STUCK_SLOT {
                self.stuck_since = None;
                self.header()
                    .tail
                    .store(tail.wrapping_add(1), Ordering::Release);
            }
            return None;
        };
        self.stuck_since = None;
        let e = Event {
            what: What::decode(d.kind, d.a, d.b, d.c, d.ptr),
            tid: d.tid,
            time_ns: d.time_ns,
            wants_ack: d.wants_ack,
            ticket: tail,
        };
        if !e.wants_ack {
            self.header()
                .tail
                .store(tail.wrapping_add(1), Ordering::Release);
        }
        Some(e)
    }

    /// The ticket of the next event to read, and the next ticket a producer will reserve.
    /// The events written or being written are those between.
    pub(crate) fn tickets(&self) -> (u64, u64) {
        let h = self.header();
        (
            h.tail.load(Ordering::Acquire),
            h.head.load(Ordering::Acquire),
        )
    }

    /// Answers an event that wants it: wakes its producer and frees the slot.
    pub(crate) fn ack(&mut self, e: &Event) {
        if !e.wants_ack {
            return;
        }
        let s = self.slot(e.ticket);
        s.ack.store(1, Ordering::Release);
        futex(&s.ack, libc::FUTEX_WAKE, i32::MAX as u32, None);
        self.header().answers.fetch_add(1, Ordering::Release);
        self.header()
            .tail
            .store(e.ticket.wrapping_add(1), Ordering::Release);
    }

    /// Waits up to `timeout` for a producer that wants an answer to ring the doorbell.
    pub fn wait_doorbell(&self, seen: u32, timeout: Duration) -> u32 {
        let bell = &self.header().doorbell;
        if bell.load(Ordering::Acquire) == seen {
            futex(bell, libc::FUTEX_WAIT, seen, Some(timeout));
        }
        bell.load(Ordering::Acquire)
    }

    pub(crate) fn footprint(&self) -> i64 {
        self.header().footprint.load(Ordering::Acquire)
    }
    pub(crate) fn peak(&self) -> i64 {
        self.header().peak.load(Ordering::Acquire)
    }
    pub fn dropped(&self) -> u64 {
        self.header().dropped.load(Ordering::Acquire)
    }
    pub(crate) fn handshake_timeouts(&self) -> u64 {
        self.header().handshake_timeouts.load(Ordering::Acquire)
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        if self.reader {
            self.set_handshake(false);
        }
        let ours =
            std::fs::symlink_metadata(&self.path).is_ok_and(|m| (m.dev(), m.ino()) == self.id);
        if self.owned && ours {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// The ring process `pid` of the program makes for itself when `main` (the ring the
/// profiler made) is claimed by another process: `<main>.<pid>`.
pub(crate) fn child_path(main: &Path, pid: i32) -> PathBuf {
    let mut name = main.as_os_str().to_owned();
    name.push(format!("{}{pid}", layout::CHILD_RING_SEP as char));
    PathBuf::from(name)
}

/// Removes the rings processes of the program made beside `main` (`<main>.<pid>`) that
/// are still there (processes we never read, because they ended before we found them or
/// were never followed). Returns how many were removed.
pub(crate) fn remove_children_of(main: &Path) -> usize {
    let (Some(dir), Some(name)) = (main.parent(), main.file_name()) else {
        return 0;
    };
    let mut prefix = name.to_string_lossy().into_owned();
    prefix.push(layout::CHILD_RING_SEP as char);
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    let mut removed = 0;
    for e in entries.flatten() {
        let n = e.file_name().to_string_lossy().into_owned();
        let is_child = n
            .strip_prefix(&prefix)
            .is_some_and(|pid| !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit()));
        let mine = std::fs::symlink_metadata(e.path()).is_ok_and(|m| m.uid() == uid && m.is_file());
        if is_child && mine && std::fs::remove_file(e.path()).is_ok() {
            removed += 1;
        }
    }
    removed
}

fn futex(word: &AtomicU32, op: i32, val: u32, timeout: Option<Duration>) {
    let ts = timeout.map(|t| libc::timespec {
        tv_sec: t.as_secs() as libc::time_t,
        tv_nsec: t.subsec_nanos() as libc::c_long,
    });
    let tsp = ts
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: a shared futex operation on a word of our shared mapping; the timeout, when
    // given, points to a timespec that outlives the call.
    unsafe { libc::syscall(libc::SYS_futex, word.as_ptr(), op, val, tsp) };
}

/// `N` bytes at `at` of a ring file's header, read without mapping or claiming it.
fn header_bytes<const N: usize>(path: &Path, at: usize) -> Option<[u8; N]> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = std::fs::File::open(path).ok()?;
    f.seek(SeekFrom::Start(at as u64)).ok()?;
    let mut out = [0u8; N];
    f.read_exact(&mut out).ok()?;
    Some(out)
}

/// The producer pid written in a ring file's header (0 when unclaimed).
pub fn producer_of(path: &Path) -> Option<i32> {
    header_bytes(path, std::mem::offset_of!(Header, producer_pid)).map(i32::from_ne_bytes)
}

/// How many events the producer of a ring file has reserved so far.
pub fn events_of(path: &Path) -> Option<u64> {
    header_bytes(path, std::mem::offset_of!(Header, head)).map(u64::from_ne_bytes)
}

/// Removes rings in `dir` left by profilers of our user that are no longer running, whose
/// programs are gone too.
/// Returns how many were removed.
pub(crate) fn clean_stale(dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    let mut removed = 0;
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix(PREFIX) else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(meta) = std::fs::symlink_metadata(e.path()) else {
            continue;
        };
        if meta.uid() != uid || !meta.is_file() || crate::proc::process_exists(pid) {
            continue;
        }
        // Its profiler is gone but its program may live on. `attach` can take the ring
        // over, so it stays until the program is gone too.
        if producer_of(&e.path()).is_some_and(|p| p > 0 && crate::proc::process_exists(p)) {
            continue;
        }
        if std::fs::remove_file(e.path()).is_ok() {
            removed += 1;
        }
    }
    removed
}

#[cfg(test)]
mod tests;
