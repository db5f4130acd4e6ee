//! Debug information kept apart from a module's file, in a separate debug file (what
//! Debian's `-dbgsym` packages install under /usr/lib/debug).
//!
//! Owns:
//! - where a module's separate debug file is looked for ([`find_debug_file`]), in order:
//!   by build id (`DIR/.build-id/xx/yyyy….debug`), then by the name in its
//!   `.gnu_debuglink`;
//! - the check that what is found is the module's: the same build id, else the CRC32 its
//!   `.gnu_debuglink` names;
//! - the debug directories: the target's /usr/lib/debug seen through /proc/PID/root, or
//!   `SCALENE_RS_DEBUG_DIRS`.
//!
//! Decompressing MiniDebugInfo and compressed sections is `sections`'s.
//!
//! Must not:
//! - parse symbol tables or DWARF (that is `image` and `symbols`);
//! - open a debug file by the host's path for a target that sees another file there. A
//!   container's libraries get the container's debug files, never the host's of the same
//!   build id.

use super::image::{BuildId, Image};
use std::path::{Path, PathBuf};

/// The variable that replaces the target's /usr/lib/debug by other directories (as this
/// process sees them, `:`-separated), like gdb's `debug-file-directory`.
pub(crate) const DEBUG_DIRS_VAR: &str = "SCALENE_RS_DEBUG_DIRS";

/// The directories separate debug files are looked for in: `SCALENE_RS_DEBUG_DIRS` when
/// set, else the target's own /usr/lib/debug (through /proc/PID/root, because a
/// containerised or chrooted target's debug files are its root's).
fn debug_dirs(pid: i32) -> Vec<PathBuf> {
    match std::env::var_os(DEBUG_DIRS_VAR) {
        Some(dirs) => std::env::split_paths(&dirs)
            .filter(|d| !d.as_os_str().is_empty())
            .collect(),
        None => vec![PathBuf::from(format!("/proc/{pid}/root/usr/lib/debug"))],
    }
}

/// Where a debug directory keeps the debug file of build id `id`:
/// `.build-id/` + the first byte in hex + `/` + the rest in hex + `.debug`. None for a
/// build id too short to be split so.
pub(crate) fn build_id_path(id: &BuildId) -> Option<PathBuf> {
    let (first, rest) = id.0.split_first()?;
    if rest.is_empty() {
        return None;
    }
    let rest: String = rest.iter().map(|b| format!("{b:02x}")).collect();
    Some(PathBuf::from(format!(".build-id/{first:02x}/{rest}.debug")))
}

/// `path`, as /proc/PID/maps names it, as the target names it itself and as we can open
/// it. The kernel writes map paths from the root of the target's mount namespace (ours
/// when it shares it), the target's root directory in front when it is chrooted, the
/// same way it writes /proc/PID/root's link. Returns (the path in the target's view,
/// /proc/PID/root + that), or None for a file outside the target's root.
fn in_target_root(pid: i32, path: &str) -> Option<(String, PathBuf)> {
    let proc_root = PathBuf::from(format!("/proc/{pid}/root"));
    let root = std::fs::read_link(&proc_root).ok()?;
    let rest = Path::new(path).strip_prefix(&root).ok()?;
    let seen = proc_root.join(rest);
    Some((format!("/{}", rest.to_str()?), seen))
}

/// The places a `.gnu_debuglink` name is looked for, in order:
/// - under each debug directory at the module's own directory
///   (`/usr/lib/debug/usr/lib/x86_64-linux-gnu/NAME`);
/// - then the module's directory's `.debug/NAME`;
/// - then its directory itself.
///
/// `module_dir` is the module's directory as the target names it, `seen_dir` the same as
/// this process can open it.
fn debuglink_places(
    dirs: &[PathBuf],
    module_dir: &str,
    seen_dir: &Path,
    name: &str,
) -> Vec<PathBuf> {
    let mut places: Vec<PathBuf> = dirs
        .iter()
        .map(|d| d.join(module_dir.trim_start_matches('/')).join(name))
        .collect();
    places.push(seen_dir.join(".debug").join(name));
    places.push(seen_dir.join(name));
    places
}

/// Opens and parses a candidate debug file; None when it is not there or not an ELF file.
fn open_debug_file(path: &Path) -> Option<Image> {
    let file = std::fs::File::open(path).ok()?;
    if !file.metadata().is_ok_and(|m| m.is_file()) {
        return None;
    }
    Image::debug_file_from(&file, path).ok()
}

/// The separate debug file of `image`, the module the target maps from `module_path` (as
/// /proc/PID/maps names it), or None. It is looked for:
/// - by build id first, `DIR/.build-id/xx/yyyy….debug` in each debug directory, used only
///   if its own build id is the module's;
/// - then by the name in the module's `.gnu_debuglink`, used only if it is the module's
///   (the same build id when both have one, else the CRC32 the link names).
pub(crate) fn find_debug_file(pid: i32, module_path: &str, image: &Image) -> Option<Image> {
    let dirs = debug_dirs(pid);
    let found = |module_dir: &str, seen_dir: &Path| -> Option<Image> {
        find_in(&dirs, module_dir, seen_dir, image)
    };
    if let Some(debug) = by_build_id(&dirs, image) {
        return Some(debug);
    }
    let (module_dir, seen_dir) = in_target_root(pid, Path::new(module_path).parent()?.to_str()?)?;
    found(&module_dir, &seen_dir)
}

/// [`find_debug_file`] for a process known from its core. The files it saw are under
/// `root` (`--lib-root`, else `/`), and its debug directory is `root/usr/lib/debug` (or
/// those of the environment's list, as for a live process).
pub(crate) fn find_debug_file_under(
    root: &Path,
    module_path: &str,
    image: &Image,
) -> Option<Image> {
    let dirs = match std::env::var_os(DEBUG_DIRS_VAR) {
        Some(_) => debug_dirs(0),
        None => vec![root.join("usr/lib/debug")],
    };
    if let Some(debug) = by_build_id(&dirs, image) {
        return Some(debug);
    }
    let module_dir = Path::new(module_path).parent()?.to_str()?.to_string();
    let seen_dir = root.join(module_dir.trim_start_matches('/'));
    find_in(&dirs, &module_dir, &seen_dir, image)
}

/// The debug file of `image` by its build id, in `dirs`.
fn by_build_id(dirs: &[PathBuf], image: &Image) -> Option<Image> {
    let rel = image.build_id.as_ref().and_then(build_id_path)?;
    dirs.iter()
        .filter_map(|dir| open_debug_file(&dir.join(&rel)))
        .find(|debug| debug.build_id == image.build_id)
}

/// The debug file `image`'s `.gnu_debuglink` names, among the places of
/// [`debuglink_places`], checked to be the module's.
fn find_in(dirs: &[PathBuf], module_dir: &str, seen_dir: &Path, image: &Image) -> Option<Image> {
    let (name, crc) = image.debuglink.as_ref()?;
    debuglink_places(dirs, module_dir, seen_dir, name)
        .into_iter()
        .filter_map(|p| open_debug_file(&p))
        .find(|debug| match (&debug.build_id, &image.build_id) {
            (Some(a), Some(b)) => a == b,
            _ => crc32fast::hash(debug.bytes()) == *crc,
        })
}

#[cfg(test)]
mod tests {
    use super::super::sections::parse_debuglink;
    use super::*;

    #[test]
    fn debug_files_are_named_by_build_id_and_debuglink() {
        let id = BuildId(vec![0xab, 0xcd, 0xef, 0x01]);
        assert_eq!(
            build_id_path(&id),
            Some(PathBuf::from(".build-id/ab/cdef01.debug"))
        );
        assert_eq!(build_id_path(&BuildId(vec![0xab])), None);
        // "libz.so.debug\0", padded to 16, then the CRC.
        let mut link = b"libz.so.debug\0\0\0".to_vec();
        link.extend_from_slice(&0x1234_5678u32.to_le_bytes());
        assert_eq!(
            parse_debuglink(&link),
            Some(("libz.so.debug".to_string(), 0x1234_5678))
        );
        // A name of exactly 3 bytes: NUL at 3, the CRC at 4.
        let mut short = b"abc\0".to_vec();
        short.extend_from_slice(&7u32.to_le_bytes());
        assert_eq!(parse_debuglink(&short), Some(("abc".to_string(), 7)));
        assert_eq!(parse_debuglink(&link[..17]), None);
        let mut escape = b"../../etc/x\0".to_vec();
        escape.extend_from_slice(&[0; 4]);
        assert_eq!(parse_debuglink(&escape), None);
        // Our own root is /, so a path is ours, seen through /proc/PID/root.
        let pid = std::process::id() as i32;
        assert_eq!(
            in_target_root(pid, "/usr/lib"),
            Some((
                "/usr/lib".to_string(),
                PathBuf::from(format!("/proc/{pid}/root/usr/lib"))
            ))
        );
        let places = debuglink_places(
            &[PathBuf::from("/proc/7/root/usr/lib/debug")],
            "/usr/lib/x86_64-linux-gnu",
            Path::new("/proc/7/root/usr/lib/x86_64-linux-gnu"),
            "libz.so.debug",
        );
        assert_eq!(
            places,
            [
                "/proc/7/root/usr/lib/debug/usr/lib/x86_64-linux-gnu/libz.so.debug",
                "/proc/7/root/usr/lib/x86_64-linux-gnu/.debug/libz.so.debug",
                "/proc/7/root/usr/lib/x86_64-linux-gnu/libz.so.debug",
            ]
            .map(PathBuf::from)
        );
    }
}
