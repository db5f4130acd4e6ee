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
    let proc = procfs::process::Process::new(pid).map_err(|e| proc_error(pid, e))?;
    let maps = proc.maps().map_err(|e| proc_error(pid, e))?;
    Ok(maps
        .into_iter()
        .map(|m| {
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
        })
        .collect())
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
}
