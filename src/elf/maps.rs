//! The target's memory map (/proc/PID/maps) and the files behind it.
//!
//! Owns: reading the map, finding a file's mappings, the load bias, and resolving a path as
//! the target sees it (through /proc/PID/root, so a process in another mount namespace,
//! e.g. a container, gets its own files, not the host's).
//! Must not: open a path from our own view for a target that has its own.

use super::ElfFile;
use crate::error::Result;
use crate::proc::ns::{self, Namespaces};
use crate::proc::{exe_path, MapEntry};
use std::fs::File;
use std::path::{Path, PathBuf};

/// The load bias (AVMA − SVMA) of `elf`, mapped in the target from `path`.
///
/// The first PT_LOAD segment is mapped at the file offset `first_load_offset`. The mapping
/// with that offset gives its AVMA.
pub(crate) fn load_bias(maps: &[MapEntry], path: &str, elf: &ElfFile) -> Option<u64> {
    maps.iter()
        .filter(|m| m.path.as_deref() == Some(path))
        .find(|m| m.offset == elf.first_load_offset)
        .map(|m| m.start.wrapping_sub(elf.first_load_svma))
}

/// Where a section of a file mapped in the target lies (see [`section_place`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SectionPlace {
    /// The file has no such section.
    Absent,
    /// The loader has not mapped the segment that holds it yet, so look again later.
    NotMapped,
    /// Its AVMA and size.
    At(u64, u64),
}

/// Where section `name` of `elf`, mapped in the target from `path`, lies, only once the
/// mapping at its address shows its bytes. The loader (`dlopen`) maps a library's whole
/// span from the file's start first, then each segment over it. Until the segment holding
/// the section is mapped, its address shows other bytes of the file, or none (past the
/// file's end, where a read fails).
pub(crate) fn section_place(
    maps: &[MapEntry],
    path: &str,
    elf: &ElfFile,
    name: &str,
) -> SectionPlace {
    let (Some((svma, size)), Some(offset)) = (elf.section(name), elf.section_offset(name)) else {
        return SectionPlace::Absent;
    };
    let Some(bias) = load_bias(maps, path, elf) else {
        return SectionPlace::NotMapped;
    };
    let avma = svma.wrapping_add(bias);
    let shows_it = maps
        .iter()
        .filter(|m| m.path.as_deref() == Some(path))
        .find(|m| m.start <= avma && avma < m.end)
        .is_some_and(|m| m.offset.wrapping_add(avma - m.start) == offset);
    if shows_it {
        SectionPlace::At(avma, size)
    } else {
        SectionPlace::NotMapped
    }
}

/// Opens one of the target's files, given its path in /proc/PID/maps. Returns the file and
/// a name for messages.
///
/// The kernel writes such paths canonical (no symbolic links). They are from our root when
/// the target shares our mount namespace, else from the root of the target's namespace
/// (even if the target is chrooted inside it). Tried in order:
/// - /proc/PID/exe, when `path` is the executable;
/// - in our mount namespace, the path itself;
/// - in another: /proc/PID/root/PATH (when the target's root is its namespace's root);
/// - the map_files link (the file was deleted or replaced since it was mapped, or the
///   target is chrooted);
/// - the target's mount namespace, entered from a forked helper.
///
/// Never our own file of that path for a target in another mount namespace. In a
/// container, the host's file of that name may be another build altogether.
pub(crate) fn open_target_file(
    pid: i32,
    path: &str,
    maps: &[MapEntry],
    ns: Namespaces,
) -> Result<(File, PathBuf)> {
    let mut tried: Vec<PathBuf> = Vec::new();
    if exe_path(pid).ok().as_deref() == Some(path) {
        tried.push(PathBuf::from(format!("/proc/{pid}/exe")));
    }
    if ns.same_mounts {
        tried.push(PathBuf::from(path));
    } else if ns::root_is_namespace_root(pid) {
        tried.push(PathBuf::from(format!("/proc/{pid}/root{path}")));
    }
    if let Some(m) = maps.iter().find(|m| m.path.as_deref() == Some(path)) {
        tried.push(PathBuf::from(format!(
            "/proc/{pid}/map_files/{:x}-{:x}",
            m.start, m.end
        )));
    }
    let mut first_err = None;
    for p in tried {
        match File::open(&p) {
            Ok(f) if f.metadata().is_ok_and(|m| m.is_file()) => return Ok((f, p)),
            Ok(_) => {}
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
    }
    let helper_err = if ns.same_mounts {
        None
    } else {
        match ns::open_via_setns(pid, path, ns::Resolve::NamespaceRoot) {
            Ok(f) => return Ok((f, PathBuf::from(path))),
            Err(e) => Some(e),
        }
    };
    // Want of permission explains the rest; else the first failure.
    let denied = |e: &std::io::Error| matches!(e.raw_os_error(), Some(libc::EACCES | libc::EPERM));
    let e = match (first_err, helper_err) {
        (Some(f), Some(h)) if !denied(&f) && denied(&h) => h,
        (Some(f), _) => f,
        (None, Some(h)) => h,
        (None, None) => std::io::Error::from_raw_os_error(libc::ENOENT),
    };
    Err(crate::proc::os_error(
        pid,
        &format!("opening {path} as process {pid} sees it"),
        e,
    ))
}

/// The basename of a path.
pub(crate) fn basename(path: &str) -> &str {
    Path::new(path)
        .file_name()
        .and_then(|s| s.to_str())
        .unwrap_or(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `_asyncio` of Debian's 3.14 (`.AsyncioDebug` at SVMA 0x157c0, file offset 0x147c0,
    /// in the last PT_LOAD: offset 0x12bf0, SVMA 0x13bf0), mapped as `dlopen` maps it.
    /// Each (start, end, file offset) after the first mapping covers part of it.
    #[test]
    fn a_section_is_placed_once_its_segment_is_mapped() {
        let path = "/usr/lib/python3.14/lib-dynload/_asyncio.cpython-314-x86_64-linux-gnu.so";
        let elf = ElfFile::with_section(".AsyncioDebug", 0x157c0, 0x68, 0x147c0);
        let base = 0x7fb1_0227_8000u64;
        let map = |maps: &[(u64, u64, u64)]| -> Vec<MapEntry> {
            maps.iter()
                .map(|&(start, end, offset)| MapEntry {
                    start: base + start,
                    end: base + end,
                    offset,
                    readable: true,
                    executable: false,
                    path: Some(path.into()),
                    dev: (0, 0),
                    inode: 1,
                    deleted: false,
                    vdso: false,
                })
                .collect()
        };
        let place =
            |maps: &[(u64, u64, u64)]| section_place(&map(maps), path, &elf, ".AsyncioDebug");
        // The whole span from the file's start, then the text and read-only segments over
        // it (as seen with the target stopped there). The section's page is past the
        // file's end.
        assert_eq!(place(&[(0, 0x16000, 0)]), SectionPlace::NotMapped);
        let three = [
            (0, 0x4000, 0),
            (0x4000, 0xe000, 0x4000),
            (0xe000, 0x16000, 0xe000),
        ];
        assert_eq!(place(&three), SectionPlace::NotMapped);
        // Its segment mapped (then split by RELRO's mprotect).
        let all = [
            (0, 0x4000, 0),
            (0x4000, 0xe000, 0x4000),
            (0xe000, 0x13000, 0xe000),
            (0x13000, 0x14000, 0x12000),
            (0x14000, 0x16000, 0x13000),
        ];
        assert_eq!(place(&all), SectionPlace::At(base + 0x157c0, 0x68));
        assert_eq!(
            place(&all[..4]),
            SectionPlace::NotMapped,
            "its page not mapped"
        );
        assert_eq!(place(&[]), SectionPlace::NotMapped, "not mapped at all");
        assert_eq!(
            section_place(&map(&all), path, &elf, ".other"),
            SectionPlace::Absent
        );
    }

    #[test]
    fn own_maps_and_bias() {
        let pid = std::process::id() as i32;
        let maps = crate::proc::read_maps(pid).unwrap();
        let exe = exe_path(pid).unwrap();
        let (file, name) = open_target_file(pid, &exe, &maps, Namespaces::host()).unwrap();
        let elf = ElfFile::from_file(&file, &name).unwrap();
        let bias = load_bias(&maps, &exe, &elf).expect("the test binary is mapped");
        // Our own function's AVMA must fall inside an executable mapping of our file.
        let f = own_maps_and_bias as *const () as u64;
        let text = maps
            .iter()
            .find(|m| m.path.as_deref() == Some(&exe) && m.start <= f && f < m.end)
            .expect("function inside our executable");
        assert!(text.executable);
        assert!(bias <= f);
    }
}
