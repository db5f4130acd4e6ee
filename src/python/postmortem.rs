//! The interpreter of a core file: found without /proc.
//!
//! Owns: [`PythonProcess::from_core`], the steps of `process.rs`'s `locate` over what a
//! core has instead of /proc:
//! - its `NT_FILE` mappings for /proc/PID/maps;
//! - its executable's mapping for /proc/PID/exe;
//! - the files it names (found and checked by build id in `coredump`);
//! - its memory for the process's.
//!
//! `_PyRuntime` is found by its symbol, else its `.PyRuntime` section (3.12+), else (3.13+)
//! by the cookie its `_Py_DebugOffsets` starts with, searched in the interpreter's writable
//! mappings.
//!
//! Must not: walk threads (the same walker reads a core as a live process), or read /proc.

use super::process::{has_python_symbols, interpreter_in, libpython_candidate, LocateOptions};
use super::PythonProcess;
use crate::coredump::Core;
use crate::elf::{maps, ElfFile};
use crate::error::{Error, Result};
use crate::proc::ns::Namespaces;
use crate::ptrace::{ProcessMemory, TargetMemory};

/// What `_Py_DebugOffsets` starts with (3.13+), at the start of `_PyRuntime`.
const COOKIE: &[u8; 8] = b"xdebugpy";

/// Most bytes of the interpreter's writable mappings searched for [`COOKIE`].
const MAX_SCAN: u64 = 64 << 20;

impl PythonProcess {
    /// The interpreter of the process `core` is of. Errors as [`PythonProcess::locate`]'s,
    /// and [`Error::BadCore`] where a file the core needs cannot be used.
    pub fn from_core(core: &Core, opts: &LocateOptions) -> Result<PythonProcess> {
        let pid = core.pid;
        let maps = &core.maps;
        let mut candidates = Vec::new();
        if let Some(lib) = libpython_candidate(maps) {
            candidates.push(lib);
        }
        candidates.push(core.executable.clone());
        let mut chosen = None;
        let mut open_err = None;
        for path in &candidates {
            let file = match core.file(path) {
                Ok(f) => f,
                Err(why) => {
                    open_err.get_or_insert(why);
                    continue;
                }
            };
            let elf = ElfFile::parse(&file.host_path, &file.map)?;
            if has_python_symbols(&elf) {
                chosen = Some((path.clone(), elf));
                break;
            }
        }
        let Some((binary, elf)) = chosen else {
            if let Some(why) = open_err {
                return Err(core.error(why));
            }
            return Err(Error::NotPython {
                pid,
                exe: core.executable.clone(),
                why: "neither its executable nor a mapped libpython has CPython's symbols".into(),
            });
        };
        let bias = maps::load_bias(maps, &binary, &elf).ok_or_else(|| {
            core.error(format!(
                "it does not say where {binary} was loaded (NT_FILE)"
            ))
        })?;
        let mem = core.memory();
        let needs_scan = elf.symbol("_PyRuntime").is_none() && elf.section(".PyRuntime").is_none();
        let runtime = needs_scan
            .then(|| cookie_in(&*mem, maps, &binary))
            .flatten();
        let found = interpreter_in(pid, &*mem, &elf, &binary, bias, runtime, opts)?;
        Ok(found.process(
            pid,
            TargetMemory::Saved(mem),
            core.executable.clone(),
            binary,
            Namespaces::saved(),
        ))
    }
}

/// The address of [`COOKIE`] in the mappings of `binary` that are not executable (its
/// data), 8-byte aligned as `_PyRuntime` is, within [`MAX_SCAN`] bytes.
fn cookie_in(mem: &dyn ProcessMemory, maps: &[crate::proc::MapEntry], binary: &str) -> Option<u64> {
    let mut left = MAX_SCAN;
    let mut page = vec![0u8; 1 << 16];
    for m in maps
        .iter()
        .filter(|m| m.path.as_deref() == Some(binary) && !m.executable)
    {
        let mut at = m.start;
        while at < m.end && left > 0 {
            let n = ((m.end - at) as usize).min(page.len());
            left = left.saturating_sub(n as u64);
            if mem.read(at, &mut page[..n]).is_ok() {
                if let Some(i) = page[..n].chunks_exact(8).position(|c| c == COOKIE) {
                    return Some(at + 8 * i as u64);
                }
            }
            at += n as u64;
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proc::MapEntry;
    use crate::ptrace::BufferMemory;

    fn map(start: u64, end: u64, executable: bool) -> MapEntry {
        MapEntry {
            start,
            end,
            offset: 0,
            readable: true,
            executable,
            path: Some("/lib/libpython3.14.so".into()),
            dev: (0, 0),
            inode: 1,
            deleted: false,
            vdso: false,
        }
    }

    #[test]
    fn the_cookie_is_found_in_data_aligned_and_nowhere_else() {
        let base = 0x10_0000;
        let mut bytes = vec![0u8; 0x3_0000];
        // In the code (executable): not looked at. Unaligned in the data: not taken.
        bytes[0x100..0x108].copy_from_slice(COOKIE);
        bytes[0x2_0003..0x2_000b].copy_from_slice(COOKIE);
        bytes[0x2_8000..0x2_8008].copy_from_slice(COOKIE);
        let mem = BufferMemory { base, bytes };
        let maps = [
            map(base, base + 0x1_0000, true),
            map(base + 0x1_0000, base + 0x3_0000, false),
        ];
        assert_eq!(
            cookie_in(&mem, &maps, "/lib/libpython3.14.so"),
            Some(base + 0x2_8000)
        );
        assert_eq!(cookie_in(&mem, &maps, "/lib/other.so"), None);
        // Unreadable data: no cookie, no error.
        let maps = [map(0x90_0000, 0x91_0000, false)];
        assert_eq!(cookie_in(&mem, &maps, "/lib/libpython3.14.so"), None);
    }
}
