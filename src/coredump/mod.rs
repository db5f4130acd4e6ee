//! Core files (`dump --core`): a dead process's memory, threads and crash, read so that the
//! same stack walker reads them as it reads a live process.
//!
//! Owns:
//! - [`Core`] (opened from a core file: the kernel's, gdb's `gcore`, `coredumpctl dump`'s,
//!   compressed or not);
//! - [`CoreOptions`] (where the process's files are);
//! - what a core says beyond its memory: each thread's registers, the signal that ended it
//!   ([`Crash`]), its command line ([`CoreSummary`]).
//!
//! The parts:
//! - `source`: the file's bytes, decompressed by their magic number;
//! - `notes`: the ELF header, segments and notes, parsed and bounds-checked;
//! - `memory`: [`CoreMemory`], one more `ProcessMemory`;
//! - `files`: the files the process had mapped, found (`--lib-root`) and checked by build
//!   id.
//!
//! Must not: know about Python (the interpreter is found in `python`, the same way as in a
//! live process), read /proc (nothing of a core is there), or format output.

mod files;
mod memory;
mod notes;
mod source;

use crate::error::{Error, Result};
use crate::proc::MapEntry;
pub(crate) use files::Files;
pub(crate) use memory::CoreMemory;
pub(crate) use notes::ThreadNote;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Where the files of a core's process are (see `files.rs`).
#[derive(Debug, Clone, Default)]
pub struct CoreOptions {
    /// The executable (`--executable`), when it is not at its path (or under `lib_root`).
    pub executable: Option<PathBuf>,
    /// The root the process saw (`--lib-root`). Its files are read from under it.
    pub lib_root: Option<PathBuf>,
}

/// A place in the process's code or data, named from the files it had mapped.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Place {
    /// The function or object whose symbol covers the address (None: no symbol does).
    pub symbol: Option<String>,
    /// The file name of the module the address is in (None: in no file).
    pub module: Option<String>,
    /// SVMA of the address in its module (what `addr2line -e MODULE` takes).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub offset: Option<u64>,
}

/// The signal that ended the process, as the core records it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Crash {
    /// The thread it was delivered to (kernel id, as the core records it).
    pub thread: i32,
    pub signal: i32,
    /// `SIGSEGV` and kin; None for a number without a name.
    pub signal_name: Option<&'static str>,
    /// `si_code`: why (for SIGSEGV, 1 `SEGV_MAPERR`: no mapping there; 2 `SEGV_ACCERR`:
    /// not allowed). None when the core has no `NT_SIGINFO`.
    pub code: Option<i32>,
    pub code_name: Option<&'static str>,
    /// The faulting address (`si_addr`) of a fault the CPU raised (SIGSEGV, SIGBUS,
    /// SIGILL, SIGFPE, SIGTRAP); None for a signal a process sent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub address: Option<u64>,
    /// What the faulting address is in (when a file's symbols say).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub address_place: Option<Place>,
    /// The process that sent the signal (`si_pid`), for a signal sent by a process.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sender: Option<i32>,
    /// The crashing thread's instruction pointer.
    pub pc: Option<u64>,
    /// The function it was in.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pc_place: Option<Place>,
}

/// What a core says of the process beyond its stacks (`core` in `dump --core --json`).
#[derive(Debug, Clone, serde::Serialize)]
pub struct CoreSummary {
    /// The core file, as named.
    pub file: String,
    /// How it was stored: `ELF`, or the compression it was decompressed from.
    pub format: &'static str,
    /// The main thread's name (`comm`), as saved.
    pub name: Option<String>,
    /// The command line: its first 80 bytes, arguments joined by spaces, as saved.
    pub command: Option<String>,
    /// The signal that ended the process and wrote the core; None for a core taken from a
    /// running process (`gcore`).
    pub crash: Option<Crash>,
}

/// A core file, opened: its memory and what its notes say.
pub struct Core {
    /// The core file, as named to us.
    pub(crate) path: String,
    /// How it was stored (ELF, or compressed).
    pub(crate) format: &'static str,
    pub(crate) memory: Arc<CoreMemory>,
    pub(crate) machine: u16,
    pub(crate) pid: i32,
    /// In the core's order, which puts the thread that dumped it (the one that crashed) first,
    /// for a core the kernel wrote.
    pub(crate) threads: Vec<ThreadNote>,
    /// The mappings of files, as /proc/PID/maps would list them (from `NT_FILE`).
    pub(crate) maps: Vec<MapEntry>,
    /// The executable's path, as the process saw it.
    pub(crate) executable: String,
    /// `pr_fname`: the main thread's name.
    pub(crate) name: Option<String>,
    /// `pr_psargs`: the command line's first 80 bytes.
    pub(crate) command: Option<String>,
    pub(crate) files: Arc<Files>,
}

/// The signals whose default action writes a core, by number (Linux's, the same on x86-64
/// and AArch64), with their names.
const CORE_SIGNALS: [(i32, &str); 10] = [
    (3, "SIGQUIT"),
    (4, "SIGILL"),
    (5, "SIGTRAP"),
    (6, "SIGABRT"),
    (7, "SIGBUS"),
    (8, "SIGFPE"),
    (11, "SIGSEGV"),
    (24, "SIGXCPU"),
    (25, "SIGXFSZ"),
    (31, "SIGSYS"),
];

/// The name of `si_code` `code` of signal `signo`.
fn code_name(signo: i32, code: i32) -> Option<&'static str> {
    let any = match code {
        0 => Some("SI_USER"),
        0x80 => Some("SI_KERNEL"),
        -1 => Some("SI_QUEUE"),
        -6 => Some("SI_TKILL"),
        _ => None,
    };
    let specific: &[&str] = match signo {
        11 => &["SEGV_MAPERR", "SEGV_ACCERR", "SEGV_BNDERR", "SEGV_PKUERR"],
        7 => &["BUS_ADRALN", "BUS_ADRERR", "BUS_OBJERR"],
        4 => &[
            "ILL_ILLOPC",
            "ILL_ILLOPN",
            "ILL_ILLADR",
            "ILL_ILLTRP",
            "ILL_PRVOPC",
        ],
        8 => &[
            "FPE_INTDIV",
            "FPE_INTOVF",
            "FPE_FLTDIV",
            "FPE_FLTOVF",
            "FPE_FLTUND",
        ],
        _ => &[],
    };
    any.or_else(|| specific.get(usize::try_from(code - 1).ok()?).copied())
}

/// Strips the " (deleted)" the kernel adds to the path of a file removed since mapped.
fn undeleted(path: &str) -> (&str, bool) {
    match path.strip_suffix(" (deleted)") {
        Some(p) => (p, true),
        None => (path, false),
    }
}

impl Core {
    /// Opens the core at `path`. Err: [`Error::BadCore`], one line saying why.
    pub fn open(path: &Path, opts: &CoreOptions) -> Result<Core> {
        let name = path.display().to_string();
        let bad = |why: String| Error::BadCore {
            core: name.clone(),
            why,
        };
        let bytes = source::open(path).map_err(bad)?;
        let parsed = notes::parse(&bytes.map).map_err(|why| match bytes.format {
            source::Format::Elf => bad(why),
            f => bad(format!("decompressed from {}: {why}", f.name())),
        })?;
        let len = bytes.map.len() as u64;
        if let Some(s) = parsed
            .segments
            .iter()
            .find(|s| s.offset.checked_add(s.filesz).is_none_or(|e| e > len))
        {
            let need = parsed
                .segments
                .iter()
                .map(|s| s.offset.saturating_add(s.filesz))
                .max()
                .unwrap_or(0);
            return Err(bad(format!(
                "truncated: {len} bytes, its segments need {need} (the segment at {:#x} lies past \
                 its end: cut short while written, or by a core size limit, ulimit -c?)",
                s.vaddr
            )));
        }
        let mut files_sorted = parsed.files.clone();
        files_sorted.sort_by_key(|f| f.start);
        for f in &mut files_sorted {
            f.path = undeleted(&f.path).0.to_string();
        }
        let executable = parsed
            .entry
            .and_then(|e| files_sorted.iter().find(|f| f.start <= e && e < f.end))
            .or(files_sorted.first())
            .map(|f| f.path.clone())
            .ok_or_else(|| {
                bad("it names no mapped file (no NT_FILE note): not a core of a program we can read".into())
            })?;
        let core_ids: HashMap<String, Option<Vec<u8>>> = files_sorted
            .iter()
            .filter(|f| f.offset == 0)
            .map(|f| {
                let head = memory::dumped(&bytes.map, &parsed.segments, f.start, 4096)
                    .or_else(|| memory::dumped(&bytes.map, &parsed.segments, f.start, 1024));
                (f.path.clone(), head.and_then(files::build_id_of))
            })
            .collect();
        let files = Arc::new(Files::new(
            opts.lib_root.clone(),
            opts.executable.clone().map(|e| (executable.clone(), e)),
            core_ids,
        ));
        // Each file gets an inode number of its own (1, 2, ..., because the core has none), which
        // tells one file's mappings from the next one's, as /proc/PID/maps' do.
        let mut inodes: HashMap<&str, u64> = HashMap::new();
        let maps = parsed
            .files
            .iter()
            .map(|f| {
                let (p, deleted) = undeleted(&f.path);
                let next = inodes.len() as u64 + 1;
                let inode = *inodes.entry(p).or_insert(next);
                let seg = parsed.segments.iter().find(|s| s.vaddr == f.start);
                MapEntry {
                    start: f.start,
                    end: f.end,
                    offset: f.offset,
                    readable: seg.is_none_or(|s| s.readable),
                    executable: seg.is_some_and(|s| s.executable),
                    path: Some(p.to_string()),
                    dev: (0, 0),
                    inode,
                    deleted,
                    vdso: false,
                }
            })
            .collect();
        let pid = parsed
            .process
            .as_ref()
            .map(|p| p.pid)
            .filter(|&p| p > 0)
            .unwrap_or(parsed.threads[0].tid);
        let memory = Arc::new(CoreMemory {
            pid,
            bytes: Arc::new(bytes.map),
            segments: parsed.segments,
            maps: files_sorted,
            files: files.clone(),
        });
        Ok(Core {
            path: name.clone(),
            format: bytes.format.name(),
            memory,
            machine: parsed.machine,
            pid,
            threads: parsed.threads,
            maps,
            executable,
            name: parsed.process.as_ref().map(|p| p.name.clone()),
            command: parsed.process.map(|p| p.args),
            files,
        })
    }

    /// The process's id, as the core records it.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// The core's memory, to be read as the process's.
    pub(crate) fn memory(&self) -> Arc<CoreMemory> {
        self.memory.clone()
    }

    /// What was said of the process's files (one that differs from the core's, one that
    /// could not be checked or opened), each once, taken.
    pub fn take_warnings(&self) -> Vec<String> {
        self.files.take_warnings()
    }

    /// Whether thread `t` was inside a system call (blocked in it, as a rule) when the
    /// core was written, from its registers. On x86-64 `orig_rax` holds the call's number
    /// there and -1 in the thread's own code. None where the registers do not tell
    /// (AArch64's `pr_reg` has no such field).
    pub(crate) fn in_syscall(&self, t: &ThreadNote) -> Option<bool> {
        match self.machine {
            notes::EM_X86_64 => t.regs.get(15).map(|&r| (r as i64) >= 0),
            _ => None,
        }
    }

    /// Whether the core is of an x86-64 process.
    pub(crate) fn is_x86_64(&self) -> bool {
        self.machine == notes::EM_X86_64
    }

    /// Thread `t`'s instruction pointer, stack pointer and frame pointer.
    pub(crate) fn registers(&self, t: &ThreadNote) -> Option<(u64, u64, u64)> {
        let r = &t.regs;
        match self.machine {
            notes::EM_X86_64 => Some((*r.get(16)?, *r.get(19)?, *r.get(4)?)),
            notes::EM_AARCH64 => Some((*r.get(32)?, *r.get(31)?, *r.get(29)?)),
            _ => None,
        }
    }

    /// The signal that ended the process, when it was one that writes a core (a core
    /// taken from a running process, `gcore`'s, has none). It comes from the first thread
    /// that records one (the kernel writes the thread that crashed first).
    pub fn crash(&self) -> Option<Crash> {
        self.threads.iter().find_map(|t| {
            // Without NT_SIGINFO (kernels before 3.7), only the number (`pr_cursig`).
            let (signo, code, addr, sender) = match t.siginfo {
                Some(s) => (s.signo, Some(s.code), s.addr, s.sender),
                None => (t.cursig, None, 0, 0),
            };
            let name = CORE_SIGNALS.iter().find(|(n, _)| *n == signo)?.1;
            let fault = matches!(signo, 4 | 5 | 7 | 8 | 11) && code.is_some_and(|c| c > 0);
            Some(Crash {
                thread: t.tid,
                signal: signo,
                signal_name: Some(name),
                code,
                code_name: code.and_then(|c| code_name(signo, c)),
                address: fault.then_some(addr),
                address_place: None,
                sender: code.is_some_and(|c| c <= 0).then_some(sender),
                pc: self.registers(t).map(|r| r.0),
                pc_place: None,
            })
        })
    }

    /// The mappings of files with their `executable` flag as the process had it. The flag
    /// comes from the segment where the core has one (the kernel's), else from the file's own
    /// segments (gdb leaves out the segments it does not dump, code as a rule). Opens the
    /// files.
    pub(crate) fn maps_with_code(&self) -> Vec<MapEntry> {
        let mut maps = self.maps.clone();
        for m in &mut maps {
            if self.memory.segment_at(m.start).is_some() {
                continue;
            }
            if let Some(path) = &m.path {
                m.executable = self
                    .files
                    .open(path)
                    .is_ok_and(|f| f.executable_at(m.offset));
            }
        }
        maps
    }

    /// The mapped file `path` of the process, opened and checked (see `files.rs`).
    pub(crate) fn file(&self, path: &str) -> std::result::Result<Arc<files::Opened>, String> {
        self.files.open(path)
    }

    /// A `BadCore` error about this core.
    pub(crate) fn error(&self, why: impl Into<String>) -> Error {
        Error::BadCore {
            core: self.path.clone(),
            why: why.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::notes::tests::{core_bytes, file_note_bytes, note_bytes};
    use super::*;
    use crate::ptrace::ProcessMemory;

    fn write(bytes: &[u8]) -> PathBuf {
        let p = std::env::temp_dir().join(format!(
            "scalene-rs-core-test-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        ));
        std::fs::write(&p, bytes).unwrap();
        p
    }

    #[test]
    fn reads_dumped_bytes_and_files_and_refuses_the_rest() {
        // An ELF "file" of 3 pages mapped at 0x10000: two read-only pages, then a writable
        // one. The core dumped only its second page.
        let mut lib: Vec<u8> = (0..3 * 4096u32).map(|i| (i / 7) as u8).collect();
        lib[..64].fill(0);
        lib[..5].copy_from_slice(b"\x7fELF\x02");
        lib[32..40].copy_from_slice(&64u64.to_le_bytes());
        lib[54..56].copy_from_slice(&56u16.to_le_bytes());
        lib[56..58].copy_from_slice(&2u16.to_le_bytes());
        for (i, (flags, offset, size)) in [(4u32, 0u64, 0x2000u64), (6, 0x2000, 0x1000)]
            .iter()
            .enumerate()
        {
            let ph = 64 + 56 * i;
            lib[ph..ph + 56].fill(0);
            lib[ph..ph + 4].copy_from_slice(&1u32.to_le_bytes());
            lib[ph + 4..ph + 8].copy_from_slice(&flags.to_le_bytes());
            lib[ph + 8..ph + 16].copy_from_slice(&offset.to_le_bytes());
            lib[ph + 32..ph + 40].copy_from_slice(&size.to_le_bytes());
        }
        let lib_path = write(&lib);
        let lib_name = lib_path.to_str().unwrap().to_string();
        let dumped = vec![0xaa; 4096];
        let files = file_note_bytes(&[(0x10000, 0x13000, 0, &lib_name)]);
        let core = core_bytes(
            &[
                (0x10000, &[], 0x1000),
                (0x11000, &dumped, 0x1000),
                (0x12000, &[], 0x1000),
                (0x20000, &[1, 2, 3, 4], 4),
            ],
            &[7],
            &files,
        );
        let path = write(&core);
        let c = Core::open(&path, &CoreOptions::default()).unwrap();
        let m = c.memory();
        let mut b = [0u8; 8];
        m.read(0x20000, &mut b[..4]).unwrap();
        assert_eq!(&b[..4], &[1, 2, 3, 4]);
        m.read(0x11ff8, &mut b).unwrap();
        assert_eq!(&b, &[0xaa; 8], "from the core");
        m.read(0x10ffc, &mut b).unwrap();
        assert_eq!(&b[..4], &lib[0xffc..0x1000], "from the file");
        assert_eq!(&b[4..], &[0xaa; 4], "from the core");
        m.read(0x10010, &mut b).unwrap();
        assert_eq!(&b, &lib[0x10..0x18]);
        // Writable data the core did not dump is not taken from the file.
        let e = m.read(0x11ffc, &mut b).unwrap_err().to_string();
        assert!(e.contains("writable"), "{e}");
        assert!(m.read(0x20002, &mut b).is_err(), "past the segment");
        assert!(m.read(0x30000, &mut b).is_err(), "unmapped");
        assert_eq!(c.executable, lib_name);
        // With the file gone, its bytes are an error. The core's are still read.
        std::fs::remove_file(&lib_path).unwrap();
        let c = Core::open(&path, &CoreOptions::default()).unwrap();
        assert!(c.memory().read(0x10010, &mut b).is_err());
        c.memory().read(0x11000, &mut b).unwrap();
        assert!(c.take_warnings().iter().any(|w| w.contains("cannot open")));
        // Truncated: an error that says so.
        let cut = write(&core[..core.len() - 2]);
        match Core::open(&cut, &CoreOptions::default()) {
            Err(Error::BadCore { why, .. }) => assert!(why.contains("truncated"), "{why}"),
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("a truncated core opened"),
        }
        for p in [path, cut] {
            let _ = std::fs::remove_file(p);
        }
    }

    #[test]
    fn the_crash_is_the_thread_with_a_core_signal() {
        let exe = file_note_bytes(&[(0x1000, 0x2000, 0, "/bin/x")]);
        let mut si = vec![0u8; 128];
        si[0..4].copy_from_slice(&11i32.to_le_bytes());
        si[8..12].copy_from_slice(&1i32.to_le_bytes());
        si[16..24].copy_from_slice(&0x10u64.to_le_bytes());
        let mut notes = exe.clone();
        notes.extend(note_bytes(0x5349_4749, &si));
        let path = write(&core_bytes(&[], &[42, 43], &notes));
        let c = Core::open(&path, &CoreOptions::default()).unwrap();
        let crash = c.crash().expect("a crash");
        assert_eq!((crash.thread, crash.signal), (43, 11));
        assert_eq!(crash.signal_name, Some("SIGSEGV"));
        assert_eq!(
            (crash.code, crash.code_name),
            (Some(1), Some("SEGV_MAPERR"))
        );
        assert_eq!((crash.address, crash.sender), (Some(0x10), None));
        // SIGSTOP (gdb's stop of a running process) writes no core, so no crash.
        si[0..4].copy_from_slice(&19i32.to_le_bytes());
        let mut notes = exe;
        notes.extend(note_bytes(0x5349_4749, &si));
        let stopped = write(&core_bytes(&[], &[42], &notes));
        assert!(Core::open(&stopped, &CoreOptions::default())
            .unwrap()
            .crash()
            .is_none());
        for p in [path, stopped] {
            let _ = std::fs::remove_file(p);
        }
    }
}
