//! Namespaces of a target process (containers): its files as it sees them, and its thread
//! ids as we see them.
//!
//! Owns:
//! - telling whether a target lives in another mount or PID namespace than we do;
//! - mapping thread ids between its PID namespace and ours (`NSpid` in
//!   /proc/PID/task/TID/status);
//! - opening the target's files from its own view:
//!   - /proc/PID/root, with its symbolic links resolved inside the target's root (openat2
//!     `RESOLVE_IN_ROOT`);
//!   - where that cannot be used, a forked single-threaded helper. It enters the target's
//!     mount namespace with `setns` (which fails with EINVAL in a multithreaded process
//!     such as ours) and passes the opened file back over a unix socket.
//!
//! Must not: fall back to the host's file of the same path when the target has its own
//! view, or know anything about Python or ELF.

use std::collections::HashMap;
use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::sync::Mutex;

/// Which of our namespaces the target shares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Namespaces {
    /// The target is in our mount namespace, so the paths the kernel shows for its mappings
    /// (/proc/PID/maps, /proc/PID/exe, written from our root) name the same files for us.
    pub(crate) same_mounts: bool,
    /// Also from the same root directory, so a path the target uses itself (a code object's
    /// file name) means the same file to it and to us.
    pub(crate) same_files: bool,
    /// The target's thread ids are ours (same PID namespace).
    same_pids: bool,
}

impl Namespaces {
    /// Compares the target's namespaces with ours. What cannot be read (the target is gone,
    /// or we may not look) counts as "not shared", the safe answer.
    pub(crate) fn of(pid: i32) -> Namespaces {
        let same = |what: &str| {
            let ours = std::fs::metadata(format!("/proc/self/{what}"));
            let theirs = std::fs::metadata(format!("/proc/{pid}/{what}"));
            match (ours, theirs) {
                (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
                _ => false,
            }
        };
        let same_mounts = same("ns/mnt");
        Namespaces {
            same_mounts,
            same_files: same_mounts && same("root"),
            same_pids: same("ns/pid"),
        }
    }

    /// A process known only from what was saved of it (a core file). No namespace of
    /// ours is known to be shared (its files are found by the caller, not through /proc),
    /// and its thread ids are taken as saved (no /proc to translate them through).
    pub(crate) fn saved() -> Namespaces {
        Namespaces {
            same_mounts: false,
            same_files: false,
            same_pids: true,
        }
    }

    /// Both namespaces shared, the common case of a process on the same host.
    #[cfg(test)]
    pub(crate) fn host() -> Namespaces {
        Namespaces {
            same_mounts: true,
            same_files: true,
            same_pids: true,
        }
    }
}

/// Whether the target's root directory is the root of its mount namespace (it is not
/// chrooted inside it). The kernel writes the paths of another namespace's mappings from
/// that namespace's root, so only then is /proc/PID/root/PATH the file of a mapping's PATH.
/// (`..` of a namespace's root is itself; of a chroot directory, its parent.)
pub fn root_is_namespace_root(pid: i32) -> bool {
    let root = std::fs::metadata(format!("/proc/{pid}/root"));
    let up = std::fs::metadata(format!("/proc/{pid}/root/.."));
    match (root, up) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

/// Where the setns helper resolves a path from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolve {
    /// The root of the target's mount namespace, for paths the kernel shows
    /// (/proc/PID/maps), which start there even when the target is chrooted.
    NamespaceRoot,
    /// The target's own root directory, for paths the target uses itself.
    ProcessRoot,
}

/// The id a thread has in its own (innermost) PID namespace, which is the last field of
/// `NSpid` in /proc/PID/task/TID/status, where `tid` is its id in ours.
fn inner_tid(pid: i32, tid: i32) -> Option<i32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status")).ok()?;
    parse_nspid(&status)
}

/// The last id on the `NSpid:` line of a status file.
fn parse_nspid(status: &str) -> Option<i32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))?
        .split_ascii_whitespace()
        .next_back()?
        .parse()
        .ok()
}

/// Maps thread ids of a target in another PID namespace to ours. Python's thread states
/// (3.11+ `native_thread_id`) and glibc's `struct pthread` hold the id the thread has in its
/// own namespace. /proc/PID/task and everything we read from /proc use ours.
pub(crate) struct TidMap {
    pid: i32,
    /// False when the target shares our PID namespace. Then every id maps to itself.
    translate: bool,
    /// Our id → its id, for the threads seen so far (an id never changes while its thread
    /// lives; ids of threads that are gone are dropped at each [`TidMap::inner_to_ours`]).
    cache: Mutex<HashMap<i32, i32>>,
}

impl TidMap {
    pub(crate) fn new(pid: i32, ns: Namespaces) -> TidMap {
        TidMap {
            pid,
            translate: !ns.same_pids,
            cache: Mutex::new(HashMap::new()),
        }
    }

    /// Whether ids differ between the target's PID namespace and ours.
    pub(crate) fn translates(&self) -> bool {
        self.translate
    }

    /// Its id → our id for the threads `ours` (ids from /proc/PID/task). Threads whose
    /// `NSpid` cannot be read (exited meanwhile) are left out.
    pub(crate) fn inner_to_ours(&self, ours: &[i32]) -> HashMap<i32, i32> {
        if !self.translate {
            return ours.iter().map(|&t| (t, t)).collect();
        }
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        let listed: std::collections::HashSet<i32> = ours.iter().copied().collect();
        cache.retain(|t, _| listed.contains(t));
        for &t in ours {
            if let std::collections::hash_map::Entry::Vacant(e) = cache.entry(t) {
                if let Some(inner) = inner_tid(self.pid, t) {
                    e.insert(inner);
                }
            }
        }
        cache.iter().map(|(&o, &i)| (i, o)).collect()
    }
}

/// Opens `path` (absolute, as the target sees it) for reading, resolved inside the
/// target's root directory. Symbolic links that point to absolute paths stay inside it
/// (a plain open of /proc/PID/root/PATH would follow them into our own root and could
/// silently read the host's file of the same name). Uses openat2 `RESOLVE_IN_ROOT`. Where
/// the kernel lacks it (before 5.6, or a seccomp filter refuses it), it uses the setns
/// helper.
pub fn open_in_root(pid: i32, path: &str) -> io::Result<File> {
    let rel = relative(path)?;
    let root = File::open(format!("/proc/{pid}/root"))?;
    let crel = CString::new(rel).map_err(|_| invalid("a path with a NUL byte"))?;
    // SAFETY: `open_how` is plain data; all zeroes is a valid value.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (libc::O_RDONLY | libc::O_CLOEXEC | libc::O_NONBLOCK) as u64;
    how.resolve = libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_MAGICLINKS;
    // SAFETY: openat2 reads a NUL-terminated path and an `open_how` of the size we pass,
    // both alive for the call; it returns a new descriptor or -1.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            root.as_raw_fd(),
            crel.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    if fd >= 0 {
        // SAFETY: the kernel just gave us this descriptor; nothing else owns it.
        return Ok(unsafe { File::from_raw_fd(fd as i32) });
    }
    let err = io::Error::last_os_error();
    match err.raw_os_error() {
        Some(libc::ENOSYS) | Some(libc::EPERM) => open_via_setns(pid, path, Resolve::ProcessRoot),
        _ => Err(err),
    }
}

/// Opens `path` in the target's mount namespace from a forked helper. The helper is single
/// threaded, so `setns(CLONE_NEWNS)` is allowed. It:
/// - enters the namespace (which makes the namespace's root its root);
/// - for [`Resolve::ProcessRoot`], also makes the target's root directory its own (the
///   target may be chrooted);
/// - opens the file and sends the descriptor back with SCM_RIGHTS.
///
/// Needs CAP_SYS_ADMIN (and CAP_SYS_CHROOT for a process root).
pub fn open_via_setns(pid: i32, path: &str, from: Resolve) -> io::Result<File> {
    relative(path)?;
    let mnt = File::open(format!("/proc/{pid}/ns/mnt"))?;
    let root = File::open(format!("/proc/{pid}/root"))?;
    let cpath = CString::new(path).map_err(|_| invalid("a path with a NUL byte"))?;
    let root_fd = match from {
        Resolve::ProcessRoot => root.as_raw_fd(),
        Resolve::NamespaceRoot => -1,
    };
    let (ours, theirs) = socket_pair()?;
    // SAFETY: the child below only makes async-signal-safe system calls on values prepared
    // before the fork (no allocation, no locks) and leaves with _exit.
    let child = unsafe { libc::fork() };
    if child < 0 {
        return Err(io::Error::last_os_error());
    }
    if child == 0 {
        // SAFETY: see above; every pointer passed is to memory that lives in this frame.
        unsafe { helper(mnt.as_raw_fd(), root_fd, &cpath, theirs.as_raw_fd()) };
    }
    drop(theirs);
    let got = receive_fd(&ours);
    let mut status = 0;
    loop {
        // SAFETY: waits for our own child, writing its status to a valid int.
        let r = unsafe { libc::waitpid(child, &mut status, libc::__WALL) };
        if r >= 0 || io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            break;
        }
    }
    got
}

/// The body of the forked helper: enter `mnt`, chroot to `root` unless it is -1, open
/// `path`, send the result on `sock`. Never returns.
///
/// # Safety
/// Call only in the child of a fork, because it ends the process.
unsafe fn helper(mnt: i32, root: i32, path: &CString, sock: i32) -> ! {
    let errno = || {
        io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO)
    };
    // SAFETY: plain system calls on descriptors this process holds and a valid C string.
    let result = unsafe {
        if libc::setns(mnt, libc::CLONE_NEWNS) != 0
            || (root >= 0 && (libc::fchdir(root) != 0 || libc::chroot(c".".as_ptr()) != 0))
        {
            Err(errno())
        } else {
            let fd = libc::open(
                path.as_ptr(),
                libc::O_RDONLY | libc::O_CLOEXEC | libc::O_NONBLOCK,
            );
            if fd < 0 {
                Err(errno())
            } else {
                Ok(fd)
            }
        }
    };
    // SAFETY: sends from this frame's buffers, then ends the child without running any
    // of the parent's destructors or atexit handlers.
    unsafe {
        send_fd(sock, result);
        libc::_exit(0)
    }
}

/// Room for one `cmsghdr` carrying one descriptor, aligned for it.
#[repr(C, align(8))]
struct CmsgBuf([u8; 64]);

/// Sends `Ok(fd)` (a zero errno and the descriptor) or `Err(errno)` over `sock`.
///
/// # Safety
/// `sock` must be an open socket; async-signal-safe (used in the forked helper).
unsafe fn send_fd(sock: i32, result: Result<i32, i32>) {
    let mut code: i32 = match result {
        Ok(_) => 0,
        Err(e) => e,
    };
    let mut iov = libc::iovec {
        iov_base: &mut code as *mut i32 as *mut libc::c_void,
        iov_len: std::mem::size_of::<i32>(),
    };
    let mut buf = CmsgBuf([0; 64]);
    // SAFETY: msghdr is plain data; every pointer in it refers to this frame's buffers,
    // and CMSG_* stay inside `buf`, which is large enough for one descriptor.
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        if let Ok(fd) = result {
            let space = libc::CMSG_SPACE(std::mem::size_of::<i32>() as u32) as usize;
            msg.msg_control = buf.0.as_mut_ptr() as *mut libc::c_void;
            msg.msg_controllen = space;
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<i32>() as u32) as usize;
            std::ptr::write_unaligned(libc::CMSG_DATA(cmsg) as *mut i32, fd);
        }
        libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL);
    }
}

/// Receives what [`send_fd`] sent.
fn receive_fd(sock: &OwnedFd) -> io::Result<File> {
    let mut code: i32 = -1;
    let mut iov = libc::iovec {
        iov_base: &mut code as *mut i32 as *mut libc::c_void,
        iov_len: std::mem::size_of::<i32>(),
    };
    let mut buf = CmsgBuf([0; 64]);
    // SAFETY: as in `send_fd`, every pointer in `msg` refers to live buffers of this frame,
    // and the control data is read only inside the length the kernel reported.
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = buf.0.as_mut_ptr() as *mut libc::c_void;
        msg.msg_controllen = buf.0.len();
        let n = loop {
            let n = libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC);
            if n >= 0 || io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
                break n;
            }
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut fd = None;
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                fd = Some(std::ptr::read_unaligned(libc::CMSG_DATA(cmsg) as *const i32));
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
        match (n as usize == std::mem::size_of::<i32>(), code, fd) {
            (true, 0, Some(fd)) => Ok(File::from_raw_fd(fd)),
            (true, e, _) if e > 0 => Err(io::Error::from_raw_os_error(e)),
            _ => Err(io::Error::other(
                "the namespace helper ended without an answer",
            )),
        }
    }
}

fn socket_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0i32; 2];
    // SAFETY: socketpair writes two descriptors into the array we pass.
    let r = unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both descriptors are new and owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

fn relative(path: &str) -> io::Result<&str> {
    path.strip_prefix('/')
        .filter(|r| !r.is_empty())
        .ok_or_else(|| invalid("not an absolute file path"))
}

fn invalid(why: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, why.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nspid_is_the_innermost_id() {
        let status = "Name:\tpython\nTgid:\t812\nNSpid:\t812\t40\t1\nNSpgid:\t812\n";
        assert_eq!(parse_nspid(status), Some(1));
        assert_eq!(parse_nspid("NSpid:\t77\n"), Some(77));
        assert_eq!(parse_nspid("Name:\tx\n"), None);
    }

    #[test]
    fn our_own_namespaces_are_shared_and_ids_map_to_themselves() {
        let pid = std::process::id() as i32;
        assert_eq!(Namespaces::of(pid), Namespaces::host());
        let map = TidMap::new(pid, Namespaces::of(pid));
        assert!(!map.translates());
        assert_eq!(map.inner_to_ours(&[pid]).get(&pid), Some(&pid));
        assert_eq!(inner_tid(pid, pid), Some(pid));
    }

    #[test]
    fn both_ways_of_opening_read_our_own_file() {
        // The target is ourselves, so the file must be the one we see.
        let pid = std::process::id() as i32;
        let path = std::env::current_exe().unwrap();
        let want = std::fs::metadata(&path).unwrap();
        let f = open_in_root(pid, path.to_str().unwrap()).unwrap();
        assert_eq!(f.metadata().unwrap().ino(), want.ino());
        if !nix::unistd::geteuid().is_root() {
            println!("open_via_setns: SKIPPED: setns needs CAP_SYS_ADMIN (not root)");
            return;
        }
        for from in [Resolve::NamespaceRoot, Resolve::ProcessRoot] {
            let g = open_via_setns(pid, path.to_str().unwrap(), from).unwrap();
            assert_eq!(g.metadata().unwrap().ino(), want.ino());
        }
        assert!(root_is_namespace_root(pid));
        let err = open_via_setns(pid, "/no/such/file/here", Resolve::NamespaceRoot).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ENOENT));
    }
}
