//! The target's memory map, /proc/PID/maps: one parser for every reader.
//!
//! Owns: [`MapEntry`], [`read_maps`] and the questions asked of a map (where a file is
//! mapped, whether a library is loaded).
//!
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
    /// The kernel marked the file " (deleted)", as removed or replaced since it was mapped.
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
    parse_maps(&text).map_err(|why| Error::BadState {
        pid,
        why: format!("reading /proc/PID/maps: {why}"),
    })
}

/// Parses the text of a maps file: one mapping a line, `START-END PERMS OFFSET MAJ:MIN
/// INODE PATH`, numbers in hex but the inode, the path padded with spaces and possibly
/// empty.
///
/// Ours, not procfs's, whose reader the fuzz target broke three ways:
/// - It fails the whole map on a path that is not UTF-8. The kernel writes a file's name as
///   its bytes, so a process that had mapped one such file could not be profiled at all
///   ("Data incomplete").
/// - It slices pseudo-paths by byte (`[stack:…]`, `/SYSV…`), which panics on a short or
///   non-ASCII one.
/// - It reads smaps' attribute lines, whose size arithmetic overflowed.
///
/// Here a path that is not UTF-8 reads with U+FFFD in place of the bad bytes (its file
/// cannot be opened by it, so its module has no names), and a malformed line is an error.
pub(crate) fn parse_maps(text: &[u8]) -> std::result::Result<Vec<MapEntry>, String> {
    text.split(|&b| b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|line| {
            parse_line(&String::from_utf8_lossy(line)).ok_or_else(|| {
                format!(
                    "a line it cannot parse: {:?}",
                    String::from_utf8_lossy(line)
                )
            })
        })
        .collect()
}

/// One line of a maps file.
fn parse_line(line: &str) -> Option<MapEntry> {
    let mut fields = line.splitn(6, ' ');
    let (range, perms, offset, dev, inode) = (
        fields.next()?,
        fields.next()?.as_bytes(),
        fields.next()?,
        fields.next()?,
        fields.next()?,
    );
    let hex = |s: &str| u64::from_str_radix(s, 16).ok();
    let (start, end) = range.split_once('-')?;
    let (major, minor) = dev.split_once(':')?;
    if perms.len() != 4 {
        return None;
    }
    let name = fields.next().unwrap_or("").trim();
    // The kernel's own names are bracketed (`[heap]`, `[vdso]`, `[anon:…]`), and System V
    // shared memory is `/SYSV` and its key in 8 hex digits. No file is behind either.
    let shm = name
        .strip_prefix("/SYSV")
        .is_some_and(|k| k.len() >= 8 && k.as_bytes()[..8].iter().all(u8::is_ascii_hexdigit));
    let file = !(name.is_empty() || name.starts_with('[') || shm);
    let deleted = file && name.ends_with(" (deleted)");
    Some(MapEntry {
        start: hex(start)?,
        end: hex(end)?,
        offset: hex(offset)?,
        readable: perms[0] == b'r',
        executable: perms[2] == b'x',
        path: file.then(|| name.strip_suffix(" (deleted)").unwrap_or(name).to_string()),
        dev: (
            i32::from_str_radix(major, 16).ok()?,
            i32::from_str_radix(minor, 16).ok()?,
        ),
        inode: inode.parse().ok()?,
        deleted,
        vdso: name == "[vdso]",
    })
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
        // A process that had mapped /tmp/lib\xff.so could not be profiled, because procfs's file
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
        // The fuzz target's find (fuzz/regressions/proc_maps/). procfs's whole-file reader
        // multiplied such a size by 1024 unchecked (a panic with overflow checks).
        let text = b"560d36d7d000-560d36d7e021 r--p 00000002 fe:00 73263 /x\n\
                     S: 99999999999999999999 kB\n";
        assert!(parse_maps(text).is_err());
        let ours = read_maps(std::process::id() as i32).unwrap();
        assert!(ours.iter().any(|m| m.vdso));
    }

    #[test]
    fn pseudo_paths_that_procfs_sliced_by_byte_are_lines_like_any() {
        // The fuzz target's finds (fuzz/regressions/proc_maps/). procfs panicked slicing
        // these names by byte.
        let text = "7f00-7f01 rw-p 00000000 00:00 0   [stack:00 4   7.so.\u{fffd}]\n\
                    7f01-7f02 rw-s 00000000 00:01 5   /SYSV\n\
                    7f02-7f03 rw-s 00000000 00:01 6   /SYSV0000162e (deleted)\n\
                    7f03-7f04 r-xp 00000000 00:00 0   [vdso]\n";
        let maps = parse_maps(text.as_bytes()).unwrap();
        let paths: Vec<_> = maps.iter().map(|m| m.path.as_deref()).collect();
        assert_eq!(paths, [None, Some("/SYSV"), None, None]);
        assert!(maps[3].vdso && maps[3].executable);
        for dir in ["proc_maps"] {
            let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("fuzz/regressions")
                .join(dir);
            for f in std::fs::read_dir(dir).unwrap() {
                let _ = parse_maps(&std::fs::read(f.unwrap().path()).unwrap());
            }
        }
    }

    #[test]
    fn our_parser_reads_a_real_map_as_procfs_does() {
        use procfs::FromBufRead;
        // One read for both (other tests' threads map and unmap meanwhile).
        let text = std::fs::read("/proc/self/maps").unwrap();
        let procfs_maps = procfs::process::MemoryMaps::from_buf_read(&text[..]).unwrap();
        let ours = parse_maps(&text).unwrap();
        assert_eq!(ours.len(), procfs_maps.len());
        for (o, p) in ours.iter().zip(procfs_maps.iter()) {
            assert_eq!(
                (o.start, o.end, o.offset),
                (p.address.0, p.address.1, p.offset)
            );
            assert_eq!((o.dev, o.inode), (p.dev, p.inode));
            assert_eq!(
                o.readable,
                p.perms.contains(procfs::process::MMPermissions::READ)
            );
            assert_eq!(
                o.executable,
                p.perms.contains(procfs::process::MMPermissions::EXECUTE)
            );
            let path = match &p.pathname {
                procfs::process::MMapPath::Path(p) => Some(p.to_string_lossy().to_string()),
                _ => None,
            };
            assert_eq!(o.path.is_some(), path.is_some(), "{o:?}");
            if let Some(path) = path {
                assert_eq!(o.deleted, path.ends_with(" (deleted)"));
                assert!(path.starts_with(o.path.as_deref().unwrap()));
            }
            assert_eq!(o.vdso, p.pathname == procfs::process::MMapPath::Vdso);
        }
    }
}
