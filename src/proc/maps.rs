//! The target's memory map, /proc/PID/maps: one parser for every reader.
//!
//! Owns: [`MapEntry`], [`read_maps`] and the questions asked of a map (where a file is
//! mapped, whether a library is loaded).
//! Must not: open the mapped files (that is `elf::maps`).

use crate::error::{Error, Result};

/// One line of /proc/PID/maps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MapEntry {
    pub(crate) start: u64,
    pub(crate) end: u64,
    pub(crate) offset: u64,
    pub(crate) readable: bool,
    pub(crate) executable: bool,
    /// The file path as the target sees it, without a " (deleted)" suffix.
    pub(crate) path: Option<String>,
    /// The mapped file's device (major, minor) and inode, as the kernel wrote them (0 for
    /// an anonymous mapping).
    pub(crate) dev: (i32, i32),
    pub(crate) inode: u64,
    /// The kernel marked the file " (deleted)": removed or replaced since it was mapped.
    pub(crate) deleted: bool,
    /// The vDSO, the kernel's code mapped into every process (no file behind it).
    pub(crate) vdso: bool,
}

/// Reads /proc/PID/maps.
pub(crate) fn read_maps(pid: i32) -> Result<Vec<MapEntry>> {
    use std::io::Read;
    let proc = procfs::process::Process::new(pid).map_err(|e| proc_error(pid, e))?;
    let mut text = Vec::new();
    proc.open_relative("maps")
        .map_err(|e| proc_error(pid, e))?
        .read_to_end(&mut text)
        .map_err(|e| proc_error(pid, procfs::ProcError::Io(e, None)))?;
    parse_maps(&text).map_err(|e| proc_error(pid, e))
}

/// Parses the text of a maps file, one line at a time through procfs's parser. Not the
/// whole file at once: procfs's reader fails the whole map on a path that is not UTF-8
/// (the kernel writes a file's name as its bytes), so a process that had mapped one such
/// file could not be profiled at all; here that path reads with U+FFFD in place of the bad
/// bytes (and the file cannot be opened by it: its module has no names). One line at a
/// time also keeps smaps' attribute lines (which maps never has) out of its size
/// arithmetic, which overflowed on an absurd size (the fuzz target's first find).
pub(crate) fn parse_maps(text: &[u8]) -> std::result::Result<Vec<MapEntry>, procfs::ProcError> {
    use procfs::FromBufRead;
    let mut out = Vec::new();
    for line in text.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
        let line = String::from_utf8_lossy(line);
        let maps = procfs::process::MemoryMaps::from_buf_read(line.as_bytes())?;
        out.extend(maps.into_iter().map(entry));
    }
    Ok(out)
}

/// Our entry from procfs's.
fn entry(m: procfs::process::MemoryMap) -> MapEntry {
    let mut deleted = false;
    let vdso = m.pathname == procfs::process::MMapPath::Vdso;
    let path = match m.pathname {
        procfs::process::MMapPath::Path(p) => {
            let s = p.to_string_lossy().to_string();
            deleted = s.ends_with(" (deleted)");
            Some(s.strip_suffix(" (deleted)").unwrap_or(&s).to_string())
        }
        _ => None,
    };
    MapEntry {
        dev: m.dev,
        inode: m.inode,
        deleted,
        vdso,
        start: m.address.0,
        end: m.address.1,
        offset: m.offset,
        readable: m.perms.contains(procfs::process::MMPermissions::READ),
        executable: m.perms.contains(procfs::process::MMPermissions::EXECUTE),
        path,
    }
}

fn proc_error(pid: i32, e: procfs::ProcError) -> Error {
    // Whatever /proc said, a process that is gone (or exiting) by now simply exited.
    if !super::process_exists(pid) {
        return Error::ProcessExited(pid);
    }
    match e {
        procfs::ProcError::NotFound(_) => {
            if super::process_exists(pid) {
                Error::BadState {
                    pid,
                    why: "its /proc entry vanished".into(),
                }
            } else {
                Error::NoSuchProcess(pid)
            }
        }
        procfs::ProcError::PermissionDenied(_) => {
            super::permission_denied(pid, "reading /proc/PID/maps")
        }
        procfs::ProcError::Io(io, _) => super::os_error(pid, "reading /proc/PID/maps", io),
        other => Error::BadState {
            pid,
            why: format!("reading /proc/PID/maps: {other}"),
        },
    }
}

/// The address range covering every mapping of the file whose path ends with `name`
/// (a deleted file's mappings included).
pub(crate) fn range_of(maps: &[MapEntry], name: &str) -> Option<(u64, u64)> {
    maps.iter()
        .filter(|m| m.path.as_deref().is_some_and(|p| p.ends_with(name)))
        .fold(None, |acc, m| {
            Some(acc.map_or((m.start, m.end), |(a, b): (u64, u64)| {
                (a.min(m.start), b.max(m.end))
            }))
        })
}

/// Whether a file whose base name is `name` is mapped.
pub(crate) fn maps_file_named(maps: &[MapEntry], name: &str) -> bool {
    maps.iter().filter_map(|m| m.path.as_deref()).any(|p| {
        std::path::Path::new(p)
            .file_name()
            .is_some_and(|b| b.to_str() == Some(name))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(start: u64, end: u64, path: Option<&str>) -> MapEntry {
        MapEntry {
            start,
            end,
            offset: 0,
            readable: true,
            executable: false,
            path: path.map(str::to_string),
            dev: (0, 0),
            inode: 0,
            deleted: false,
            vdso: false,
        }
    }

    #[test]
    fn a_files_range_spans_its_mappings() {
        let maps = [
            entry(0x1000, 0x2000, Some("/tmp/r/ring")),
            entry(0x3000, 0x4000, None),
            entry(0x5000, 0x6000, Some("/tmp/r/ring")),
            entry(0x7000, 0x8000, Some("/usr/lib/libc.so.6")),
        ];
        assert_eq!(range_of(&maps, "/r/ring"), Some((0x1000, 0x6000)));
        assert_eq!(range_of(&maps, "nothing"), None);
        assert!(maps_file_named(&maps, "libc.so.6"));
        assert!(!maps_file_named(&maps, "c.so.6"));
    }

    #[test]
    fn a_path_that_is_not_utf8_does_not_fail_the_map() {
        // A process that had mapped /tmp/lib\xff.so could not be profiled: procfs's file
        // reader failed the whole map ("Data incomplete").
        let text = b"7f6ed2e7c000-7f6ed2e7d000 r--p 00000000 fe:00 10010771   /tmp/lib\xff.so\n\
                     7f6ed2e7d000-7f6ed2e7e000 r-xp 00001000 fe:00 10010771   /usr/lib/libc.so.6\n";
        let maps = parse_maps(text).unwrap();
        assert_eq!(maps.len(), 2);
        assert_eq!(maps[0].path.as_deref(), Some("/tmp/lib\u{fffd}.so"));
        assert_eq!(maps[1].path.as_deref(), Some("/usr/lib/libc.so.6"));
        assert!(maps[1].executable && !maps[0].executable);
    }

    #[test]
    fn an_smaps_attribute_with_an_absurd_size_is_refused_not_overflowed() {
        // The fuzz target's find (fuzz/regressions/proc_maps/): procfs's whole-file reader
        // multiplied such a size by 1024 unchecked (a panic with overflow checks).
        let text = b"560d36d7d000-560d36d7e021 r--p 00000002 fe:00 73263 /x\n\
                     S: 99999999999999999999 kB\n";
        assert!(parse_maps(text).is_err());
        let ours = read_maps(std::process::id() as i32).unwrap();
        assert!(ours.iter().any(|m| m.vdso));
    }
}
