//! Memory of a process started without us (`attach`): our library is loaded into it and
//! handed a ring, so that it counts from then on as it does under `run`.
//!
//! How:
//! - A ring is made where the target can open it, in a directory of its own root. That is
//!   the host's `/dev/shm` for a process of ours, the container's for one in a container.
//! - The library is written beside it.
//! - One thread of the target, stopped where it holds no lock, calls the C library's
//!   `dlopen` on it, then the library's `scalene_rs_attach(ring)`. The thread is one in a
//!   lock-free wait, or, where none waits, one running the interpreter's own code (see
//!   [`crate::ptrace::remote`] and [`hijack`]).
//! - `scalene_rs_attach` patches the program's calls of the allocation and copy functions,
//!   and has the interpreter's own allocator wrapped with the GIL held.
//! - Both files are removed at once; the process keeps what it mapped.
//! - A second `attach` finds the library already loaded and only calls it again.
//!
//! When we stop, the consumer sets the ring's `detached` word, and the library puts every
//! patched function pointer back. A profiler killed outright stops its heartbeat, which the
//! library notices at its next sampled event (see the layout's `HEARTBEAT_*`).
//!
//! Owns:
//! - the decision whether to load code into the target (never when its owner turned remote
//!   debugging off, never into a free-threaded build);
//! - the placing of the files;
//! - the remote calls, and the meaning of the library's answers.
//!
//! Must not: read the ring (the consumer does), or leave a file behind.
use super::config::MemoryConfig;
use super::ring::{self, layout, Ring};
use crate::python::PythonProcess;
use crate::PRELOAD_LIBRARY;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::Duration;

/// Directories of the target's root where the files may go, in order of preference.
const PLACES: &[&str] = &["/dev/shm", "/tmp", "/var/tmp"];
/// `RTLD_NOW`.
const RTLD_NOW: u64 = 2;
/// glibc's private flag that `__libc_dlopen_mode` callers pass (`__RTLD_DLOPEN`).
const RTLD_DLOPEN_PRIVATE: u64 = 0x8000_0000;
/// How long to look for a thread at a safe point (one look per scan of the sampler).
pub(crate) const PATIENCE: Duration = Duration::from_secs(2);
/// How long one look stops a computing thread now and then to find it in the
/// interpreter's code (a Python program is there most of the time; this is the sampler's
/// thread, which must not stall long).
const LOOK_WAIT: Duration = Duration::from_millis(10);
/// Least time between two such looks at a process (at most a fifth of the sampler's time
/// goes to them while [`PATIENCE`] lasts).
const LOOK_EVERY: Duration = Duration::from_millis(50);

/// Why the library was not (or could not be) put into the target. It is the sentence said to
/// the user ("no memory data: ..."), time being recorded anyway.
pub(crate) type Refusal = String;

/// What became of an attempt to put our library into a process.
pub(crate) enum Attach {
    /// Counting: the ring, claimed by the process, ready to be read.
    Counting(Ring),
    /// No thread is at a safe point now, so try again at the next scan (until [`PATIENCE`]).
    NotNow,
    /// Never, for this reason.
    Refused(Refusal),
}

/// Why no thread could be used, once [`PATIENCE`] has run out.
pub(crate) const NO_SAFE_THREAD: &str = "no thread could call into our library: within 2 s \
     none of its threads waited in a system call where it holds no lock (a sleep, a lock or \
     condition wait, select/poll, a join), and its running thread was never found in the \
     interpreter's own code (it runs C code that does not call back into the interpreter)";

/// Loads the library into `proc` (unless it is there already) and hands it a new ring.
pub(crate) fn attach_library(proc: &PythonProcess, cfg: &MemoryConfig) -> Attach {
    if let Err(why) = refuse_unless_allowed(proc) {
        return Attach::Refused(why);
    }
    // When no thread waits, a look for the computing thread is made when one is due (the ring
    // and the files are made for a try that may find a thread, not at every scan).
    #[cfg(target_arch = "x86_64")]
    let look = if crate::ptrace::remote::waiting_thread(proc.pid) {
        None
    } else if interpreter_code(proc).is_empty() {
        return Attach::NotNow;
    } else {
        match next_look(proc.pid) {
            Some(n) => Some(n),
            None => return Attach::NotNow,
        }
    };
    #[cfg(not(target_arch = "x86_64"))]
    let look = None;
    match try_attach(proc, cfg, look) {
        Ok(Some(ring)) => Attach::Counting(ring),
        Ok(None) => Attach::NotNow,
        Err(why) => Attach::Refused(why),
    }
}

/// The interpreter's own code in `proc` (see [`hijack`]).
fn interpreter_code(proc: &PythonProcess) -> Vec<(u64, u64)> {
    proc.addrs
        .interpreter_code
        .iter()
        .copied()
        .filter(|&(_, len)| len > 0)
        .collect()
}

/// A thread of `proc` stopped where it may call into our library. None when no thread was
/// there now.
///
/// The thread is one of two:
/// - one blocked in a wait that holds no lock (`remote.rs`);
/// - else the computing thread, in the interpreter's own code
///   (`python::process::INTERPRETER_CODE`: the bytecode loop, its allocator, deallocation
///   and addition). It is stopped (PTRACE_INTERRUPT) now and then, and taken where a stop
///   finds it in that code, or else caught where it returns into that code. A stop in the
///   C library or the kernel has its native stack unwound ([`ReturnFinder`]) to the
///   innermost return address into that code, which is replaced for the time of the look
///   (`ptrace/remote/catch.rs`). A thread that spends 99.9% of its time in memset and page
///   faults is caught at its next return.
///
/// A thread running there holds no C-library lock. The interpreter runs none of that code
/// (no bytecode, none of those functions) from inside the C library, its loader or a signal
/// handler.
///
/// The locks it may hold are the interpreter's:
/// - the GIL, which our call does not need;
/// - where the loop inlines its pending-call code, the pending-call lock. Our library's
///   `Py_AddPendingCall` would wait for it. So our library makes that call from a thread of
///   its own (`preload/src/attach.rs`).
///
/// The thread is put back with every register as it was. An allocator call it was in goes
/// on afterwards as if nothing happened, for two reasons:
/// - our library wraps the interpreter's allocator only later, at a pending call;
/// - a C-library function reached after the attach reaches ours, which forwards every block
///   to the very function it went to before.
#[cfg(target_arch = "x86_64")]
fn hijack(
    proc: &PythonProcess,
    code: &[(u64, u64)],
    look: Option<usize>,
) -> Result<Option<crate::ptrace::remote::Hijacked>, Refusal> {
    use crate::ptrace::remote::{computing_thread, waiting_thread, Hijacked};
    let pid = proc.pid;
    if let Some(t) = Hijacked::find(pid).map_err(said)? {
        return Ok(Some(t));
    }
    let Some(nth) = look else {
        return Ok(None);
    };
    if code.is_empty() || waiting_thread(pid) {
        return Ok(None);
    }
    let tid = computing_thread(pid, nth);
    let mut finder = ReturnFinder::lock();
    let code = finder.with_split_parts(proc, code);
    let code = &code[..];
    let mut returns = |regs: &libc::user_regs_struct| finder.return_into(proc, tid, regs, code);
    let found = Hijacked::in_code(pid, tid, code, LOOK_WAIT, &mut returns).map_err(said)?;
    if found.is_some() {
        // Not needed again for this process, so its images are let go.
        *finder.0 = None;
    }
    Ok(found)
}

/// How deep a stop may be below its return into the interpreter's code: the stack copied
/// (bytes) and the frames unwound. A C function called from the interpreter rarely goes
/// deeper. A thread that is deeper is found by the stops alone.
#[cfg(target_arch = "x86_64")]
const RETURN_SEARCH: (usize, usize) = (1 << 20, 64);

/// The native modules of the process being looked at, kept from one look to the next
/// (reading them takes milliseconds), to unwind a stopped thread's stack to its return
/// into the interpreter's code (see [`hijack`]).
#[cfg(target_arch = "x86_64")]
struct ReturnFinder(std::sync::MutexGuard<'static, Option<Modules>>);

/// What [`ReturnFinder`] keeps of one process.
#[cfg(target_arch = "x86_64")]
struct Modules {
    pid: i32,
    native: crate::native::NativeProcess,
    /// The interpreter's code with its split-off parts, once found
    /// ([`ReturnFinder::with_split_parts`]).
    code: Option<Vec<(u64, u64)>>,
}

#[cfg(target_arch = "x86_64")]
impl ReturnFinder {
    fn lock() -> ReturnFinder {
        static MODULES: std::sync::Mutex<Option<Modules>> = std::sync::Mutex::new(None);
        ReturnFinder(MODULES.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// `code` and the parts of its functions that the compiler split off (a stripped
    /// binary names none of them), found once per process and its modules. Debian's static
    /// 3.15 has its bytecode loop in such a part: without it, 1 attach in 3 found no thread
    /// in 2 s under the test suite's load, the stops catching the thread only on its rare
    /// returns into the allocator.
    fn with_split_parts(&mut self, proc: &PythonProcess, code: &[(u64, u64)]) -> Vec<(u64, u64)> {
        let Some(m) = self.modules(proc) else {
            return code.to_vec();
        };
        m.code
            .get_or_insert_with(|| {
                let mut all = code.to_vec();
                for &(at, len) in code {
                    all.extend(m.native.split_parts(&proc.mem, at, len));
                }
                all
            })
            .clone()
    }

    /// The slot and value of the innermost return address into `code` of thread `tid` of
    /// `proc`, stopped with `regs`.
    fn return_into(
        &mut self,
        proc: &PythonProcess,
        tid: i32,
        regs: &libc::user_regs_struct,
        code: &[(u64, u64)],
    ) -> Option<(u64, u64)> {
        let m = self.modules(proc)?;
        let wanted = |avma: u64| code.iter().any(|&(at, len)| avma.wrapping_sub(at) < len);
        m.native
            .return_slot(tid, regs, &proc.mem, RETURN_SEARCH, &wanted)
    }

    /// The modules of `proc`, read again when they are another process's or changed.
    fn modules(&mut self, proc: &PythonProcess) -> Option<&mut Modules> {
        let pid = proc.pid;
        let stale = match &*self.0 {
            Some(m) => m.pid != pid || m.native.code_changed().unwrap_or(true),
            None => true,
        };
        if stale {
            let mut cache = crate::native::NativeCache::new();
            *self.0 =
                crate::native::NativeProcess::new(pid, &proc.mem, proc.namespaces, &mut cache)
                    .ok()
                    .map(|native| Modules {
                        pid,
                        native,
                        code: None,
                    });
        }
        self.0.as_mut()
    }
}

/// Whether a look for the computing thread of `pid` is due ([`LOOK_EVERY`] since the
/// last), and then the how-manyth it is (the running threads are looked at in turn).
#[cfg(target_arch = "x86_64")]
fn next_look(pid: i32) -> Option<usize> {
    // The last look: at which process, when, and how many looks it had.
    static LAST_LOOK: std::sync::Mutex<Option<(i32, std::time::Instant, usize)>> =
        std::sync::Mutex::new(None);
    let mut last = LAST_LOOK.lock().unwrap_or_else(|e| e.into_inner());
    let nth = match *last {
        Some((p, at, _)) if p == pid && at.elapsed() < LOOK_EVERY => return None,
        Some((p, _, n)) if p == pid => n + 1,
        _ => 0,
    };
    *last = Some((pid, std::time::Instant::now(), nth));
    Some(nth)
}

/// [`attach_library`] once allowed (`look`: a look for the computing thread is due, see
/// [`hijack`]). None when no thread was at a safe point after all.
#[cfg(target_arch = "x86_64")]
fn try_attach(
    proc: &PythonProcess,
    cfg: &MemoryConfig,
    look: Option<usize>,
) -> Result<Option<Ring>, Refusal> {
    let pid = proc.pid;
    let maps = crate::proc::read_maps(pid).map_err(|e| e.to_string())?;
    let place = Place::choose(pid)?;
    let loaded = loaded_library(&maps);
    let dlopen = match loaded {
        Some(_) => None,
        None => Some(find_dlopen(pid, &maps, proc.namespaces)?),
    };
    let mut ring = Ring::create(
        &place.host_dir,
        ring::DEFAULT_CAPACITY,
        cfg.window,
        cfg.copy_window,
    )
    .map_err(|e| {
        format!(
            "making the memory ring in {}: {e}",
            place.host_dir.display()
        )
    })?;
    let ring_name = ring
        .path()
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let ring_in_target = format!("{}/{ring_name}", place.target_dir);
    give_to_target_user(ring.path(), pid)?;
    // The heartbeat marks an attach ring. The library judges us by it, not by our pid.
    ring.header()
        .heartbeat_ns
        .store(layout::now_ns(), Ordering::Release);
    let files = match loaded {
        Some(_) => None,
        None => Some(LibraryFiles::write(&place, pid)?),
    };
    let code = interpreter_code(proc);
    let answer = (|| -> Result<Option<i32>, Refusal> {
        let Some(mut t) = hijack(proc, &code, look)? else {
            return Ok(None);
        };
        match (loaded, dlopen, &files) {
            (Some(base), _, _) => call_attach(&mut t, base, &ring_in_target),
            (None, Some(dl), Some(files)) => {
                load_and_attach(&mut t, dl, &files.target_path, &ring_in_target)
            }
            _ => unreachable!("dlopen and the files are there when the library is not loaded"),
        }
    })()?;
    drop(files);
    let Some(code) = answer else {
        return Ok(None);
    };
    // The target has it mapped (or refused it), so the file's name is no longer needed.
    let _ = std::fs::remove_file(ring.path());
    ring.keep_file();
    match code {
        layout::ATTACH_OK => Ok(Some(ring)),
        layout::ATTACH_PRELOADED => Err("the program runs under `scalene-rs run`".into()),
        layout::ATTACH_NO_RING => Err("the process could not open the memory ring".into()),
        layout::ATTACH_NOT_PYTHON => {
            Err("our library found no Python interpreter in the process".into())
        }
        layout::ATTACH_FREE_THREADED => Err(free_threaded_refusal()),
        layout::ATTACH_NO_LIBC => {
            Err("our library found no C allocator in the process (not glibc?)".into())
        }
        layout::ATTACH_BUSY => {
            Err("another scalene-rs attach is recording its memory (one at a time)".into())
        }
        other => Err(format!("our library refused to attach (code {other})")),
    }
}

fn free_threaded_refusal() -> Refusal {
    "a free-threaded interpreter's object allocator cannot be wrapped while it runs \
     (start the program with `scalene-rs run` for its memory)"
        .into()
}

/// The cases where no code of ours goes into the process.
fn refuse_unless_allowed(proc: &PythonProcess) -> Result<(), Refusal> {
    let pid = proc.pid;
    if proc.layout.free_threaded {
        return Err(free_threaded_refusal());
    }
    // 3.14+: the interpreter's own switch says it all.
    if remote_debugging_flag(proc) == Some(0) {
        return Err("the interpreter has remote debugging turned off (its \
                    remote_debugging_enabled flag is 0: PYTHON_DISABLE_REMOTE_DEBUG, \
                    -X disable_remote_debug, or a build without it): no code of ours is loaded \
                    into it"
            .into());
    }
    // Its owner said no code is to be run in it from outside (PEP 768's switches; we honour
    // them for every version, whatever the way in).
    if crate::proc::environ_var(pid, "PYTHON_DISABLE_REMOTE_DEBUG").is_some_and(|v| !v.is_empty()) {
        return Err(
            "the process disabled remote debugging (PYTHON_DISABLE_REMOTE_DEBUG is \
                    set): no code of ours is loaded into it"
                .into(),
        );
    }
    let args = crate::proc::arguments(pid);
    if args
        .windows(2)
        .any(|w| w[0] == "-X" && w[1] == "disable_remote_debug")
        || args.iter().any(|a| a == "-Xdisable_remote_debug")
    {
        return Err(
            "the process disabled remote debugging (-X disable_remote_debug): no \
                    code of ours is loaded into it"
                .into(),
        );
    }
    #[cfg(not(target_arch = "x86_64"))]
    return Err("loading our library into a running process is implemented for x86-64 only".into());
    #[cfg(target_arch = "x86_64")]
    Ok(())
}

/// The interpreter's own PEP 768 switch (3.14+, read through its `_Py_DebugOffsets`). The
/// flag's value; None where there is none or it cannot be read.
fn remote_debugging_flag(proc: &PythonProcess) -> Option<u32> {
    use crate::ptrace::ProcessMemory;
    let runtime = proc.addrs.runtime?;
    let bytes = proc.mem.read_vec(runtime, 4096).ok()?;
    let off = crate::python_bindings::debug_offsets::remote_debugging_enabled_offset(&bytes)?;
    let interp = proc.interp_head().ok().filter(|&a| a != 0)?;
    // Both are read from the process and may hold any value at all (a wrong address fails
    // to read).
    proc.mem.read_u32(interp.wrapping_add(off)).ok()
}

/// Where the files go, a directory of the target's root:
/// - that we can write;
/// - that the target can read;
/// - whose file system lets a library be mapped executable.
struct Place {
    /// The directory as we reach it (through /proc/PID/root).
    host_dir: PathBuf,
    /// The same directory as the target names it.
    target_dir: String,
}

impl Place {
    fn choose(pid: i32) -> Result<Place, Refusal> {
        let root = PathBuf::from(format!("/proc/{pid}/root"));
        for dir in PLACES {
            let host = root.join(dir.trim_start_matches('/'));
            let Ok(c) = std::ffi::CString::new(host.as_os_str().as_encoded_bytes()) else {
                continue;
            };
            // SAFETY: statvfs fills the struct we own; `c` is NUL-terminated.
            let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
            // SAFETY: as above.
            if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
                continue;
            }
            let writable = nix::unistd::access(&host, nix::unistd::AccessFlags::W_OK).is_ok();
            if writable && st.f_flag & libc::ST_NOEXEC == 0 && st.f_flag & libc::ST_RDONLY == 0 {
                return Ok(Place {
                    host_dir: host,
                    target_dir: dir.to_string(),
                });
            }
        }
        Err(format!(
            "none of {} in the process's root is writable and allows executable mappings \
             (needed to put our library there)",
            PLACES.join(", ")
        ))
    }
}

/// Makes `path` the target's user's when that is not us (the library accepts only a ring
/// of its own user; we can do this only as root).
fn give_to_target_user(path: &Path, pid: i32) -> Result<(), Refusal> {
    let Some((uid, gid)) = crate::proc::owner(pid) else {
        return Ok(());
    };
    if uid == nix::unistd::geteuid().as_raw() {
        return Ok(());
    }
    nix::unistd::chown(
        path,
        Some(nix::unistd::Uid::from_raw(uid)),
        Some(nix::unistd::Gid::from_raw(gid)),
    )
    .map_err(|e| {
        format!(
            "the process runs as user {uid}, and handing it our files needs CAP_CHOWN \
             (run scalene-rs as root or as that user): {e}"
        )
    })
}

/// The load address of our library when the process has it already (an earlier attach).
/// It is the start of its mapping at file offset 0.
fn loaded_library(maps: &[crate::proc::maps::MapEntry]) -> Option<u64> {
    maps.iter()
        .find(|m| {
            m.offset == 0
                && m.path.as_deref().is_some_and(|p| {
                    Path::new(p)
                        .file_name()
                        .is_some_and(|n| n == PRELOAD_LIBRARY)
                })
        })
        .map(|m| m.start)
}

/// Offset of the library's attach function from its load address.
fn attach_offset() -> Result<u64, Refusal> {
    let syms = crate::elf::ElfFile::exported(
        Path::new(PRELOAD_LIBRARY),
        super::preload::library_bytes(),
        &[layout::ATTACH_SYMBOL],
    )
    .map_err(|e| e.to_string())?;
    syms.get(layout::ATTACH_SYMBOL)
        .copied()
        .ok_or_else(|| format!("our library has no {}", layout::ATTACH_SYMBOL))
}

/// `scalene_rs_attach(ring)`, called by `t`, in the process whose library is loaded at
/// `base`.
#[cfg(target_arch = "x86_64")]
fn call_attach(
    t: &mut crate::ptrace::remote::Hijacked,
    base: u64,
    ring_in_target: &str,
) -> Result<Option<i32>, Refusal> {
    let func = base + attach_offset()?;
    attach_call(t, func, ring_in_target)
}

/// `scalene_rs_attach(ring, how)` at `func`, called by the stopped thread `t`. Returns its
/// answer, or None when the thread left its wait since an earlier call (the library is
/// loaded; the next try calls it with a thread found anew).
#[cfg(target_arch = "x86_64")]
fn attach_call(
    t: &mut crate::ptrace::remote::Hijacked,
    func: u64,
    ring_in_target: &str,
) -> Result<Option<i32>, Refusal> {
    // The library is told how the thread was stopped (how it may have the interpreter's
    // allocator wrapped; see `preload/src/attach.rs`).
    let how = if t.stopped_running() {
        layout::ATTACH_FROM_RUNNING_CODE
    } else {
        0
    };
    match t.call(
        func,
        &[crate::ptrace::remote::DATA, how],
        &c_string(ring_in_target),
    ) {
        Ok(rax) => Ok(Some(rax as u32 as i32)),
        Err(e) if crate::ptrace::remote::Hijacked::released(&e) => Ok(None),
        Err(e) => Err(said(e)),
    }
}

/// The C library's loader entry in the process: (address, whether it is glibc's private
/// `__libc_dlopen_mode`, `dlerror` if there is one).
fn find_dlopen(
    pid: i32,
    maps: &[crate::proc::maps::MapEntry],
    ns: crate::proc::ns::Namespaces,
) -> Result<(u64, bool, Option<u64>), Refusal> {
    let bases = |stem: &str| {
        maps.iter()
            .filter(|m| m.offset == 0)
            .filter_map(|m| {
                let p = m.path.as_deref()?;
                let name = Path::new(p).file_name()?.to_str()?;
                (name.starts_with(stem) && name.contains(".so")).then(|| (p.to_string(), m.start))
            })
            .next()
    };
    // As the process sees the file (a container's or a chroot's own C library).
    let read = |path: &str| {
        let (mut f, _) =
            crate::elf::maps::open_target_file(pid, path, maps, ns).map_err(|e| e.to_string())?;
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(&mut f, &mut bytes)
            .map_err(|e| format!("reading the process's {path}: {e}"))?;
        Ok::<_, Refusal>(bytes)
    };
    let mut tried = Vec::new();
    for stem in ["libc.so", "libc-2.", "libdl.so", "libdl-2."] {
        let Some((path, base)) = bases(stem) else {
            continue;
        };
        let bytes = read(&path)?;
        let syms = crate::elf::ElfFile::exported(
            Path::new(&path),
            &bytes,
            &["dlopen", "dlerror", "__libc_dlopen_mode"],
        )
        .map_err(|e| e.to_string())?;
        let dlerror = syms.get("dlerror").map(|o| base + o);
        if let Some(o) = syms.get("dlopen") {
            return Ok((base + o, false, dlerror));
        }
        if let Some(o) = syms.get("__libc_dlopen_mode") {
            return Ok((base + o, true, None));
        }
        tried.push(path);
    }
    Err(if tried.is_empty() {
        "the process has no shared C library (a static or non-glibc build): our library \
         cannot be loaded into it"
            .into()
    } else {
        format!("no dlopen in the process's {}", tried.join(", "))
    })
}

/// Has the process (thread `t`) load our library, written at `library_in_target`, with
/// `dlopen` (from [`find_dlopen`]) and attach to `ring_in_target`.
#[cfg(target_arch = "x86_64")]
fn load_and_attach(
    t: &mut crate::ptrace::remote::Hijacked,
    (dlopen, private, dlerror): (u64, bool, Option<u64>),
    library_in_target: &str,
    ring_in_target: &str,
) -> Result<Option<i32>, Refusal> {
    let pid = t.pid();
    let offset = attach_offset()?;
    let mode = if private {
        RTLD_NOW | RTLD_DLOPEN_PRIVATE
    } else {
        RTLD_NOW
    };
    let handle = t
        .call(
            dlopen,
            &[crate::ptrace::remote::DATA, mode],
            &c_string(library_in_target),
        )
        .map_err(said)?;
    if handle == 0 {
        let why = match dlerror {
            Some(f) => t
                .call(f, &[], &[])
                .ok()
                .filter(|&p| p != 0)
                .and_then(|p| read_c_string(pid, p)),
            None => None,
        };
        return Err(format!(
            "the process could not load our library: {}",
            why.unwrap_or_else(|| "dlopen failed".into())
        ));
    }
    // The handle is the loader's map of the library, whose first word is its load address.
    let base = {
        use crate::ptrace::ProcessMemory;
        crate::ptrace::RemoteMemory::new(pid)
            .and_then(|m| m.read_u64(handle))
            .map_err(|e| e.to_string())?
    };
    // Read from the process, it may hold any value at all.
    let func = base
        .checked_add(offset)
        .ok_or_else(|| format!("the loader's map of our library holds no address ({base:#x})"))?;
    attach_call(t, func, ring_in_target)
}

#[cfg(not(target_arch = "x86_64"))]
fn try_attach(
    _: &PythonProcess,
    _: &MemoryConfig,
    _: Option<usize>,
) -> Result<Option<Ring>, Refusal> {
    Err("loading our library into a running process is implemented for x86-64 only".into())
}

/// The library written into the target's root for it to load: a directory of its own
/// (`scalene-rs-attach-<our pid>-<n>`), both removed on drop.
struct LibraryFiles {
    dir: PathBuf,
    target_path: String,
}

impl LibraryFiles {
    fn write(place: &Place, pid: i32) -> Result<LibraryFiles, Refusal> {
        static COUNTER: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        // A name taken already is a directory a killed profiler of the same pid left behind
        // (pids come round again), so the next one is taken.
        let (name, dir, made) = loop {
            let n = COUNTER.fetch_add(1, Ordering::Relaxed);
            let name = format!("scalene-rs-attach-{}-{n}", std::process::id());
            let dir = place.host_dir.join(&name);
            match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && n < 4096 => {}
                made => break (name, dir, made),
            }
        };
        let written = (|| {
            made?;
            let path = dir.join(PRELOAD_LIBRARY);
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o500)
                .open(&path)?;
            std::io::Write::write_all(&mut f, super::preload::library_bytes())?;
            Ok::<_, std::io::Error>(path)
        })();
        let files = LibraryFiles {
            dir: dir.clone(),
            target_path: format!("{}/{name}/{PRELOAD_LIBRARY}", place.target_dir),
        };
        let path =
            written.map_err(|e| format!("writing our library into {}: {e}", dir.display()))?;
        give_to_target_user(&dir, pid)?;
        give_to_target_user(&path, pid)?;
        Ok(files)
    }
}

impl Drop for LibraryFiles {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// An error of a remote call as a reason (a state of the process is said as itself, not as
/// a failure to read the interpreter).
fn said(e: crate::error::Error) -> Refusal {
    match e {
        crate::error::Error::BadState { why, .. } => why,
        other => other.to_string(),
    }
}

fn c_string(s: &str) -> Vec<u8> {
    let mut v = s.as_bytes().to_vec();
    v.push(0);
    v
}

/// A NUL-terminated string at `addr` in `pid` (at most 512 bytes).
fn read_c_string(pid: i32, addr: u64) -> Option<String> {
    use crate::ptrace::ProcessMemory;
    let mem = crate::ptrace::RemoteMemory::new(pid).ok()?;
    let mut buf = vec![0u8; 512];
    for len in [512usize, 64] {
        if mem.read(addr, &mut buf[..len]).is_ok() {
            let end = buf[..len].iter().position(|&b| b == 0).unwrap_or(len);
            return Some(String::from_utf8_lossy(&buf[..end]).into_owned());
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The interpreter's address and the flag's offset are both read from the process. An
    /// address near `u64::MAX` reads no flag (it wrapped past the top before, a panic with
    /// overflow checks).
    #[test]
    fn a_torn_interpreter_address_reads_no_remote_debugging_flag() {
        use crate::python_bindings::debug_offsets::{runtime_3_14_for_tests, set_3_14_field};
        let layout = *crate::python_bindings::generated(3, 14, false).expect("3.14's table");
        let mut runtime = runtime_3_14_for_tests(4096);
        set_3_14_field(
            &mut runtime,
            "debugger_support.remote_debugging_enabled",
            0x100,
        );
        let head = layout.runtime.interpreters_head.expect("3.14 has it");
        // An interpreter state of ours, its flag set.
        let interp = vec![1u8; 0x200];
        let proc = PythonProcess::own_for_tests(layout, runtime.as_ptr() as u64);
        runtime[head..head + 8].copy_from_slice(&(interp.as_ptr() as u64).to_le_bytes());
        assert_eq!(remote_debugging_flag(&proc), Some(0x0101_0101));
        runtime[head..head + 8].copy_from_slice(&(u64::MAX - 0x80).to_le_bytes());
        assert_eq!(remote_debugging_flag(&proc), None);
    }
}
