//! Finding the CPython interpreter inside a process.
//!
//! Owns:
//! - choosing the binary that holds the interpreter (libpython for shared builds, the
//!   executable for static ones);
//! - computing its load bias;
//! - detecting the version (and saying how);
//! - choosing the layout (generated table, or `_Py_DebugOffsets` for 3.13+);
//! - the addresses the stack walker starts from.
//!
//! Files are opened as the target sees them (`elf::maps::open_target_file`), never as the
//! host sees the same path.
//!
//! Must not: walk threads or frames (that is `stack.rs`).

use super::strings::TypeAddrs;
use super::version::{Version, VersionSource};
use crate::elf::maps;
use crate::elf::ElfFile;
use crate::error::{Error, Result};
use crate::proc::ns::{Namespaces, TidMap};
use crate::proc::{self, MapEntry};
use crate::ptrace::{ProcessMemory, RemoteMemory, TargetMemory};
use crate::python_bindings::{self, debug_offsets, Layout};

/// What the caller may force.
#[derive(Debug, Clone, Default)]
pub struct LocateOptions {
    /// Use this `major.minor` instead of detecting it.
    pub version_override: Option<(u32, u32)>,
}

/// Addresses (AVMAs) the walker needs.
#[derive(Debug, Clone, Copy, Default)]
pub struct Addresses {
    /// `_PyRuntime` (3.7+).
    pub(crate) runtime: Option<u64>,
    /// `interp_head` (2.7, 3.6).
    interp_head: Option<u64>,
    /// `_PyThreadState_Current` (2.7, 3.6): the thread holding the GIL.
    pub(crate) tstate_current: Option<u64>,
    /// `_PyGC_generation0` (2.7, 3.6): the address of the collector's first list head.
    pub(crate) gc_generation0: Option<u64>,
    /// Type objects, to validate what we read.
    pub types: TypeAddrs,
    /// The interpreter's own code where a computing thread spends its time
    /// ([`INTERPRETER_CODE`]: AVMA and length; (0, 0) where absent). `attach` loads our
    /// library into a thread that never waits once it is stopped there (see
    /// `memory/inject.rs`).
    pub(crate) interpreter_code: [(u64, u64); 6],
}

/// The functions of [`Addresses::interpreter_code`]: the bytecode loop (3.6+, and 2.7's),
/// and the C-API functions it calls most when a loop makes, drops or adds objects.
/// Measured on every build of the matrix: a link-time-optimised build inlines most of
/// them into the loop, another calls them.
pub(crate) const INTERPRETER_CODE: [&str; 6] = [
    "_PyEval_EvalFrameDefault",
    "PyEval_EvalFrameEx",
    "PyObject_Malloc",
    "PyObject_Free",
    "_Py_Dealloc",
    "PyNumber_Add",
];

/// A process with a CPython interpreter we know how to read.
pub struct PythonProcess {
    pub(crate) pid: i32,
    pub mem: TargetMemory,
    pub(crate) version: Version,
    /// `version` as text, made once (every snapshot carries it).
    pub(crate) version_text: std::sync::Arc<str>,
    pub(crate) version_source: VersionSource,
    /// True when no layout of ours was generated for this version (3.14+ read through
    /// `_Py_DebugOffsets`). It should work, but we have not tested it.
    pub untested: bool,
    pub layout: Layout,
    /// The executable, as the target sees it.
    pub(crate) executable: std::sync::Arc<str>,
    /// The file that holds the interpreter (libpython or the executable).
    pub(crate) binary: String,
    pub addrs: Addresses,
    /// Which of our namespaces the target shares (a container's process shares none).
    pub(crate) namespaces: Namespaces,
    /// Thread ids between the target's PID namespace and ours.
    pub(crate) tids: TidMap,
}

pub(super) fn libpython_candidate(maps: &[MapEntry]) -> Option<String> {
    maps.iter()
        .filter_map(|m| m.path.as_deref())
        .find(|p| {
            let base = maps::basename(p);
            base.starts_with("libpython") && Version::from_file_name(base).is_some()
        })
        .map(str::to_string)
}

pub(super) fn has_python_symbols(elf: &ElfFile) -> bool {
    ["_PyRuntime", "interp_head", "Py_Version", "PyCode_Type"]
        .iter()
        .any(|s| elf.symbol(s).is_some())
}

/// `r`, or [`Error::ProcessExited`] where it failed and process `pid` is gone.
/// - An exiting process loses its mappings and memory before it is gone.
/// - What looks like "not Python", a failed read or an interpreter not initialized is then
///   the process ending, and says so.
pub(crate) fn exited_if_gone<T>(pid: i32, r: Result<T>) -> Result<T> {
    match r {
        Err(e) if !e.is_process_gone() && !crate::proc::process_exists(pid) => {
            Err(Error::ProcessExited(pid))
        }
        r => r,
    }
}

impl PythonProcess {
    /// A second handle on the same process, with its own memory handle, for another thread.
    /// There is no ELF parsing again, because what `locate` found is copied.
    pub(crate) fn reopen(&self) -> Result<PythonProcess> {
        self.forked(self.pid)
    }

    /// Finds the interpreter in process `pid`.
    pub fn locate(pid: i32, opts: &LocateOptions) -> Result<PythonProcess> {
        exited_if_gone(pid, Self::locate_once(pid, opts))
    }

    /// One attempt at locating the interpreter. Long (about 100 lines) on purpose, because
    /// it is the one sequence of steps, each using the last one's results (maps → the image
    /// that holds Python → its ELF file and load bias → the version → the layout → the
    /// addresses). The error of each step is said where it happens.
    fn locate_once(pid: i32, opts: &LocateOptions) -> Result<PythonProcess> {
        let mut mem = RemoteMemory::new(pid)?;
        let maps = proc::read_maps(pid)?;
        let executable = proc::exe_path(pid)?;

        // Prefer a mapped libpython (shared build); else the executable (static build).
        let mut chosen: Option<(String, ElfFile)> = None;
        let mut candidates = Vec::new();
        if let Some(lib) = libpython_candidate(&maps) {
            candidates.push(lib);
        }
        candidates.push(executable.clone());
        let namespaces = Namespaces::of(pid);
        let mut open_err = None;
        for path in &candidates {
            let elf = maps::open_target_file(pid, path, &maps, namespaces)
                .and_then(|(file, name)| ElfFile::from_file(&file, &name));
            let elf = match elf {
                Ok(elf) => elf,
                Err(e) => {
                    open_err.get_or_insert(e);
                    continue;
                }
            };
            if has_python_symbols(&elf) {
                chosen = Some((path.clone(), elf));
                break;
            }
        }
        let Some((binary, elf)) = chosen else {
            // Files we could not open are the answer when that was for want of permission.
            if let Some(e @ Error::PermissionDenied { .. }) = open_err {
                return Err(e);
            }
            return Err(Error::NotPython {
                pid,
                exe: executable,
                why: "neither its executable nor a mapped libpython has CPython's symbols".into(),
            });
        };
        let bias = maps::load_bias(&maps, &binary, &elf).ok_or_else(|| Error::BadState {
            pid,
            why: format!("cannot find where {binary} is loaded in /proc/{pid}/maps"),
        })?;
        let avma = |name: &str| elf.symbol(name).map(|s| s.wrapping_add(bias));
        if let Some(addr) = avma("PyCode_Type").or(avma("_PyRuntime")) {
            mem.probe(addr)?;
        }
        // A read that proves we may read the process at all, with a good error if not.
        if let Some(addr) = avma("PyCode_Type") {
            mem.read_u64(addr)?;
        }
        let found = interpreter_in(pid, &mem, &elf, &binary, bias, None, opts)?;
        Ok(found.process(pid, TargetMemory::Live(mem), executable, binary, namespaces))
    }

    /// The same interpreter in `pid`, a child forked from this process without an exec
    /// since. A fork copies the address space, so every address and the layout are the
    /// parent's (no ELF file to parse again, which matters when a pool forks workers that
    /// live a second).
    pub(crate) fn forked(&self, pid: i32) -> Result<PythonProcess> {
        let mut mem = RemoteMemory::new(pid)?;
        if let Some(addr) = self.addrs.runtime.or(self.addrs.interp_head) {
            mem.probe(addr)?;
        }
        Ok(PythonProcess {
            pid,
            mem: TargetMemory::Live(mem),
            version: self.version.clone(),
            version_text: self.version_text.clone(),
            version_source: self.version_source,
            untested: self.untested,
            layout: self.layout,
            executable: self.executable.clone(),
            binary: self.binary.clone(),
            addrs: self.addrs,
            // The child may be in namespaces of its own (a fork with CLONE_NEWPID, say).
            namespaces: Namespaces::of(pid),
            tids: TidMap::new(pid, Namespaces::of(pid)),
        })
    }

    /// `--gil` (sample only the thread holding the GIL) cannot be followed in a
    /// free-threaded build, nor `--async` (`tasks`) where tasks are not read. This gives an
    /// error that says so.
    pub(crate) fn check_request(&self, gil_only: bool, tasks: bool) -> Result<()> {
        if gil_only && self.layout.free_threaded {
            return Err(Error::NoGil {
                pid: self.pid,
                version: self.version.to_string(),
            });
        }
        if let Some(why) = tasks
            .then(|| super::asyncio::tasks::unsupported(self.layout.version))
            .flatten()
        {
            return Err(Error::NoAsync { pid: self.pid, why });
        }
        Ok(())
    }

    /// Address of the first `PyInterpreterState`, or 0 when the interpreter is not running
    /// (not yet initialized, or finalized).
    pub fn interp_head(&self) -> Result<u64> {
        self.interp_head_via(&self.mem)
    }

    /// [`PythonProcess::interp_head`] read through `mem` (a page cache of this process).
    pub(crate) fn interp_head_via(&self, mem: &dyn crate::ptrace::ProcessMemory) -> Result<u64> {
        match (self.layout.runtime.interpreters_head, self.addrs.runtime) {
            (Some(off), Some(rt)) => mem.read_u64(rt.wrapping_add(off as u64)),
            _ => match self.addrs.interp_head {
                Some(a) => mem.read_u64(a),
                None => Ok(0),
            },
        }
    }
}

#[cfg(test)]
impl PythonProcess {
    /// This test process read as an interpreter of `layout` whose `_PyRuntime` is at
    /// `runtime` (a buffer of the test's, read as the target's memory).
    pub(crate) fn own_for_tests(layout: Layout, runtime: u64) -> PythonProcess {
        let pid = std::process::id() as i32;
        let namespaces = Namespaces::of(pid);
        let (major, minor) = layout.version;
        let version = Version {
            major,
            minor,
            micro: Some(0),
            suffix: String::new(),
        };
        PythonProcess {
            pid,
            mem: TargetMemory::Live(RemoteMemory::new(pid).expect("our own memory")),
            version_text: version.to_string().into(),
            version,
            version_source: VersionSource::Override,
            untested: false,
            layout,
            executable: "/python".into(),
            binary: "/python".into(),
            addrs: Addresses {
                runtime: Some(runtime),
                ..Addresses::default()
            },
            namespaces,
            tids: TidMap::new(pid, namespaces),
        }
    }
}

/// What [`interpreter_in`] finds: the interpreter's version, layout and addresses.
pub(super) struct Found {
    version: Version,
    version_source: VersionSource,
    untested: bool,
    layout: Layout,
    pub(super) addrs: Addresses,
}

impl Found {
    /// The process of pid `pid` read through `mem`, with this interpreter.
    pub(super) fn process(
        self,
        pid: i32,
        mem: TargetMemory,
        executable: String,
        binary: String,
        namespaces: Namespaces,
    ) -> PythonProcess {
        PythonProcess {
            pid,
            mem,
            version_text: self.version.to_string().into(),
            version: self.version,
            version_source: self.version_source,
            untested: self.untested,
            layout: self.layout,
            executable: executable.into(),
            binary,
            addrs: self.addrs,
            namespaces,
            tids: TidMap::new(pid, namespaces),
        }
    }
}

/// The interpreter in `elf`, the file `binary` loaded with bias `bias` in the process of
/// pid `pid` (for messages), read through `mem`. It gives its version, its layout, and
/// the addresses the walker starts from. `runtime_found`: where `_PyRuntime` is when
/// neither its symbol nor its section says (a core's `_Py_DebugOffsets` cookie, found by
/// a scan).
pub(super) fn interpreter_in(
    pid: i32,
    mem: &dyn ProcessMemory,
    elf: &ElfFile,
    binary: &str,
    bias: u64,
    runtime_found: Option<u64>,
    opts: &LocateOptions,
) -> Result<Found> {
    let avma = |name: &str| elf.symbol(name).map(|s| s.wrapping_add(bias));
    // `_PyRuntime`: its symbol; else its section (3.12+), else where the caller found
    // `_Py_DebugOffsets`' cookie (a core).
    let runtime = avma("_PyRuntime")
        .or_else(|| {
            elf.section(".PyRuntime")
                .map(|(svma, _)| svma.wrapping_add(bias))
        })
        .or(runtime_found);
    let base = maps::basename(binary).to_string();
    let (version, version_source) = detect_version(pid, mem, elf, &base, &avma, opts)?;
    let (layout, untested) = choose_layout(pid, mem, &version, runtime)?;

    let addrs = Addresses {
        runtime,
        interp_head: avma("interp_head"),
        tstate_current: avma("_PyThreadState_Current"),
        gc_generation0: avma("_PyGC_generation0"),
        types: TypeAddrs {
            code: avma("PyCode_Type").unwrap_or(0),
            frame: avma("PyFrame_Type").unwrap_or(0),
            unicode: if version.major == 2 {
                0
            } else {
                avma("PyUnicode_Type").unwrap_or(0)
            },
            bytes: if version.major == 2 {
                avma("PyString_Type").unwrap_or(0)
            } else {
                avma("PyBytes_Type").unwrap_or(0)
            },
            dict: avma("PyDict_Type").unwrap_or(0),
            module: avma("PyModule_Type").unwrap_or(0),
            int: if version.major == 2 {
                avma("PyInt_Type").unwrap_or(0)
            } else {
                avma("PyLong_Type").unwrap_or(0)
            },
        },
        interpreter_code: INTERPRETER_CODE.map(|n| {
            elf.symbol_range(n)
                .filter(|&(_, len)| len > 0)
                .map_or((0, 0), |(at, len)| (at.wrapping_add(bias), len))
        }),
    };
    if layout.runtime.interpreters_head.is_some() && addrs.runtime.is_none() {
        return Err(Error::BadState {
            pid,
            why: format!("{binary} has no _PyRuntime symbol"),
        });
    }
    if layout.runtime.interpreters_head.is_none() && addrs.interp_head.is_none() {
        return Err(Error::BadState {
            pid,
            why: format!("{binary} has no interp_head symbol (a stripped Python {version} build?)"),
        });
    }
    Ok(Found {
        version,
        version_source,
        untested,
        layout,
        addrs,
    })
}

fn detect_version(
    pid: i32,
    mem: &dyn ProcessMemory,
    elf: &ElfFile,
    base: &str,
    avma: &dyn Fn(&str) -> Option<u64>,
    opts: &LocateOptions,
) -> Result<(Version, VersionSource)> {
    if let Some((major, minor)) = opts.version_override {
        let micro = version_strings(elf, Some((major, minor)))
            .first()
            .and_then(|s| Version::parse(s))
            .and_then(|v| v.micro);
        return Ok((
            Version {
                major,
                minor,
                micro,
                suffix: String::new(),
            },
            VersionSource::Override,
        ));
    }
    if let Some(addr) = avma("Py_Version") {
        let hex = mem.read_u32(addr)? as u64;
        return Version::from_hex(hex)
            .map(|v| (v, VersionSource::PyVersionSymbol))
            .ok_or_else(|| Error::BadState {
                pid,
                why: format!("Py_Version holds {hex:#x}, which is not a CPython version"),
            });
    }
    if let Some(v) = Version::from_file_name(base) {
        // Complete the micro version from Py_GetVersion's buffer (filled at start-up with
        // sys.version), else from a string the binary carries, when unambiguous.
        let from_buffer =
            version_buffer(mem, elf, avma).filter(|b| (b.major, b.minor) == (v.major, v.minor));
        let strings = version_strings(elf, Some((v.major, v.minor)));
        let v = match (from_buffer, strings.as_slice()) {
            (Some(b), _) => b,
            (None, [one]) => Version::parse(one).unwrap_or(v),
            _ => v,
        };
        return Ok((v, VersionSource::FileName));
    }
    let strings = version_strings(elf, None);
    let mut minors: Vec<(u32, u32)> = strings
        .iter()
        .filter_map(|s| Version::parse(s))
        .map(|v| (v.major, v.minor))
        .collect();
    minors.dedup();
    match (minors.as_slice(), strings.first()) {
        ([_], Some(s)) => Ok((
            Version::parse(s).expect("parsed above"),
            VersionSource::VersionString,
        )),
        _ => Err(Error::BadState {
            pid,
            why: format!(
                "cannot tell which CPython version {base} is (no Py_Version symbol, no version in its name, {} version strings); pass --python-version X.Y",
                strings.len()
            ),
        }),
    }
}

/// The version at the start of `Py_GetVersion`'s static buffer ("3.8.18 (default, ...").
fn version_buffer(
    mem: &dyn ProcessMemory,
    elf: &ElfFile,
    avma: &dyn Fn(&str) -> Option<u64>,
) -> Option<Version> {
    let svma = elf.symbol_with_prefix("version.")?;
    let bias = avma("PyCode_Type")?.wrapping_sub(elf.symbol("PyCode_Type")?);
    let bytes = mem.read_vec(svma.wrapping_add(bias), 32).ok()?;
    let text: String = bytes
        .iter()
        .take_while(|b| b.is_ascii_graphic())
        .map(|&b| b as char)
        .collect();
    Version::parse(&text)
}

/// Bytes of `_PyRuntime` read for `_Py_DebugOffsets` (the struct is well under this).
pub(crate) const DEBUG_OFFSETS_READ: usize = 4096;

fn choose_layout(
    pid: i32,
    mem: &dyn ProcessMemory,
    version: &Version,
    runtime: Option<u64>,
) -> Result<(Layout, bool)> {
    if (version.major, version.minor) >= (3, 13) {
        let (parsed, generated) = match runtime {
            Some(rt) => {
                let bytes = mem.read_vec(rt, DEBUG_OFFSETS_READ)?;
                let parsed = debug_offsets::parse(&bytes, debug_offsets::fallback_for(&bytes))
                    .map_err(|e| e.to_string());
                let ft = parsed.as_ref().is_ok_and(|l| l.free_threaded);
                (
                    parsed,
                    python_bindings::generated(version.major, version.minor, ft),
                )
            }
            None => (
                Err("no _PyRuntime symbol".to_string()),
                python_bindings::generated(version.major, version.minor, false),
            ),
        };
        return match (parsed, generated) {
            (Ok(layout), _) if layout.version == (version.major, version.minor) => {
                Ok((layout, generated.is_none()))
            }
            (Ok(layout), _) => Err(Error::BadState {
                pid,
                why: format!(
                    "_Py_DebugOffsets describes {}.{} but the interpreter is {version}",
                    layout.version.0, layout.version.1
                ),
            }),
            (Err(why), None) => Err(Error::UnsupportedVersion {
                pid,
                version: format!("{version} ({why})"),
                supported: python_bindings::supported_versions(),
            }),
            (Err(why), Some(_)) => Err(Error::BadState {
                pid,
                why: format!("_Py_DebugOffsets of Python {version} is unreadable: {why}"),
            }),
        };
    }
    match python_bindings::generated(version.major, version.minor, false) {
        Some(l) => Ok((*l, false)),
        None => Err(Error::UnsupportedVersion {
            pid,
            version: version.to_string(),
            supported: python_bindings::supported_versions() + ", and 3.16+ untested",
        }),
    }
}

/// The strings in the file's `.rodata` that look like a CPython version ("3.9.18",
/// "2.7.18+", "3.13.0rc1"), each once, optionally of one `major.minor` only.
fn version_strings(elf: &ElfFile, major_minor: Option<(u32, u32)>) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for s in elf.rodata_strings(5..=16) {
        let Some(v) = Version::parse(s) else { continue };
        if major_minor.is_none_or(|mm| mm == (v.major, v.minor)) && !out.iter().any(|o| o == s) {
            out.push(s.to_string());
        }
    }
    out
}
