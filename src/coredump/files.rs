//! The files a core's process had mapped, found again: [`Files`].
//!
//! Owns: where each file of `NT_FILE` is looked for, and whether it is the one the
//! process had:
//! - `--executable PATH`: the executable's mappings are read from PATH;
//! - `--lib-root DIR`: every other file from DIR/PATH (the root the process saw: a
//!   container's, a chroot's, a copy from another machine), else from PATH itself;
//! - a file's build id (`NT_GNU_BUILD_ID`) is compared with the one in the core (the
//!   first page of its mapping, which the kernel dumps for this):
//!   - a file that differs is named in a warning and never read;
//!   - one with a build id the core does not hold is read, with a warning that it could
//!     not be checked;
//!   - one with none (not ELF, such as a locale archive) is read as it is.
//!
//! Must not: read the core's own bytes for anything but the build ids (`memory.rs` does).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

/// `n_type` of a GNU build-id note.
const NT_GNU_BUILD_ID: u32 = 3;

/// One file, opened and checked.
pub(crate) struct Opened {
    /// Where it was found on this machine.
    pub(crate) host_path: PathBuf,
    pub(crate) map: memmap2::Mmap,
    /// The file ranges its `PT_LOAD` segments map without write permission, which are bytes
    /// that cannot have changed in the process since they were mapped.
    read_only: Vec<(u64, u64)>,
    /// The file ranges its `PT_LOAD` segments map executable (`PF_X`).
    executable: Vec<(u64, u64)>,
}

impl Opened {
    /// Whether the file maps its offset `at` executable.
    pub(crate) fn executable_at(&self, at: u64) -> bool {
        self.executable.iter().any(|&(s, e)| s <= at && at < e)
    }
}

/// The file ranges (offset, end) of the `PT_LOAD` segments of the ELF file `data` whose
/// flags have none of `without` and all of `with` (none for a file that is not ELF).
fn load_ranges(data: &[u8], with: u32, without: u32) -> Vec<(u64, u64)> {
    let u16_at = |o: usize| Some(u16::from_le_bytes(data.get(o..o + 2)?.try_into().ok()?));
    let u32_at = |o: usize| Some(u32::from_le_bytes(data.get(o..o + 4)?.try_into().ok()?));
    let u64_at = |o: usize| Some(u64::from_le_bytes(data.get(o..o + 8)?.try_into().ok()?));
    if !data.starts_with(b"\x7fELF") || data.get(4) != Some(&2) {
        return Vec::new();
    }
    let (Some(phoff), Some(size), Some(n)) = (u64_at(32), u16_at(54), u16_at(56)) else {
        return Vec::new();
    };
    (0..n as u64)
        .filter_map(|i| {
            let ph = usize::try_from(phoff.checked_add(i * size as u64)?).ok()?;
            let (kind, flags) = (u32_at(ph)?, u32_at(ph + 4)?);
            let (offset, filesz) = (u64_at(ph + 8)?, u64_at(ph + 32)?);
            let wanted = flags & with == with && flags & without == 0;
            (kind == 1 && wanted).then_some((offset, offset.checked_add(filesz)?))
        })
        .collect()
}

/// The files of one core.
pub(crate) struct Files {
    lib_root: Option<PathBuf>,
    /// The executable's path in the core, and the file given for it (`--executable`).
    executable: Option<(String, PathBuf)>,
    /// The build id the core holds for each path (None when the core has not its first
    /// page).
    core_ids: HashMap<String, Option<Vec<u8>>>,
    opened: Mutex<HashMap<String, Result<Arc<Opened>, String>>>,
    warnings: Mutex<Vec<String>>,
}

fn hex(id: &[u8]) -> String {
    id.iter().map(|b| format!("{b:02x}")).collect()
}

/// The build id in the notes `notes` (a `PT_NOTE` segment's bytes).
fn build_id_in_notes(mut b: &[u8]) -> Option<Vec<u8>> {
    while b.len() >= 12 {
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap_or([0; 4]));
        let (namesz, descsz, kind) = (u32_at(0) as usize, u32_at(4) as usize, u32_at(8));
        let desc_at = 12 + namesz.checked_add(3)? / 4 * 4;
        let next = desc_at.checked_add(descsz.checked_add(3)? / 4 * 4)?;
        let desc = b.get(desc_at..desc_at.checked_add(descsz)?)?;
        if kind == NT_GNU_BUILD_ID && b.get(12..12 + namesz)? == b"GNU\0" {
            return Some(desc.to_vec());
        }
        b = b.get(next..)?;
    }
    None
}

/// The build id of the ELF image whose first bytes (file offset 0 on) are `head`, from
/// its `PT_NOTE` segments that lie inside `head`.
pub(crate) fn build_id_of(head: &[u8]) -> Option<Vec<u8>> {
    if !head.starts_with(b"\x7fELF") || head.get(4) != Some(&2) {
        return None;
    }
    let u16_at = |o: usize| Some(u16::from_le_bytes(head.get(o..o + 2)?.try_into().ok()?));
    let u64_at = |o: usize| Some(u64::from_le_bytes(head.get(o..o + 8)?.try_into().ok()?));
    let phoff = usize::try_from(u64_at(32)?).ok()?;
    let (phentsize, phnum) = (u16_at(54)? as usize, u16_at(56)? as usize);
    (0..phnum).find_map(|i| {
        let ph = phoff.checked_add(i.checked_mul(phentsize)?)?;
        let p_type = u32::from_le_bytes(head.get(ph..ph + 4)?.try_into().ok()?);
        if p_type != 4 {
            return None;
        }
        let off = usize::try_from(u64_at(ph + 8)?).ok()?;
        let size = usize::try_from(u64_at(ph + 32)?).ok()?;
        build_id_in_notes(head.get(off..off.checked_add(size)?)?)
    })
}

/// `map`, the file found at `host_path`, with its segments' ranges.
fn opened(host_path: PathBuf, map: memmap2::Mmap) -> Opened {
    Opened {
        read_only: load_ranges(&map, 0, 2),
        executable: load_ranges(&map, 1, 0),
        host_path,
        map,
    }
}

impl Files {
    pub(crate) fn new(
        lib_root: Option<PathBuf>,
        executable: Option<(String, PathBuf)>,
        core_ids: HashMap<String, Option<Vec<u8>>>,
    ) -> Files {
        Files {
            lib_root,
            executable,
            core_ids,
            opened: Mutex::new(HashMap::new()),
            warnings: Mutex::new(Vec::new()),
        }
    }

    /// The root the process's files are under (`--lib-root`), if given.
    pub(crate) fn root(&self) -> Option<&std::path::Path> {
        self.lib_root.as_deref()
    }

    /// Where the process's file `path` is looked for here.
    pub(crate) fn host_path(&self, path: &str) -> PathBuf {
        if let Some((exe, given)) = &self.executable {
            if exe == path {
                return given.clone();
            }
        }
        match &self.lib_root {
            Some(root) => root.join(path.trim_start_matches('/')),
            None => PathBuf::from(path),
        }
    }

    fn warn(&self, what: String) {
        let mut w = self.warnings.lock().unwrap_or_else(|e| e.into_inner());
        if !w.contains(&what) {
            w.push(what);
        }
    }

    /// The warnings so far (each once), taken.
    pub(crate) fn take_warnings(&self) -> Vec<String> {
        std::mem::take(&mut *self.warnings.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// The file the process had mapped from `path`, opened and checked (see the module's
    /// doc), opened once. Err says why it cannot be used (a message naming it).
    pub(crate) fn open(&self, path: &str) -> Result<Arc<Opened>, String> {
        let mut opened = self.opened.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(r) = opened.get(path) {
            return r.clone();
        }
        let r = self.open_now(path).map(Arc::new);
        if let Err(why) = &r {
            self.warn(why.clone());
        }
        opened.insert(path.to_string(), r.clone());
        r
    }

    fn open_now(&self, path: &str) -> Result<Opened, String> {
        let host_path = self.host_path(path);
        let shown = host_path.display();
        let hint = if self.lib_root.is_none() && path.starts_with('/') {
            " (a core from a container or another machine: pass --lib-root DIR, the root the process saw)"
        } else {
            ""
        };
        let file = std::fs::File::open(&host_path).map_err(|e| {
            format!("cannot open {shown}, mapped by the process as {path}: {e}{hint}")
        })?;
        // SAFETY: read-only and private; a file rewritten in place while we read it could
        // fault a read (SIGBUS), the case accepted for every mapped ELF file in the crate.
        let map =
            unsafe { memmap2::Mmap::map(&file) }.map_err(|e| format!("cannot map {shown}: {e}"))?;
        let on_disk = build_id_of(&map[..map.len().min(64 << 10)]);
        match (self.core_ids.get(path).cloned().flatten(), on_disk) {
            (Some(core), Some(disk)) if core != disk => Err(format!(
                "{shown} is not the file the process had mapped as {path}: build id {} in the core, {} on disk{hint}",
                hex(&core),
                hex(&disk)
            )),
            (Some(_), None) => Err(format!(
                "{shown} is not the file the process had mapped as {path}: the core gives it a build id, the file has none{hint}"
            )),
            // A file with a build id the core does not give (it did not dump the first
            // page) is read, and said. A file with none (not ELF, such as a locale archive)
            // is not a build to check.
            (None, Some(_)) if self.core_ids.get(path).is_some_and(Option::is_none) => {
                self.warn(format!(
                    "{shown} (mapped as {path}) is read without a check: the core does not hold its build id"
                ));
                Ok(opened(host_path, map))
            }
            _ => Ok(opened(host_path, map)),
        }
    }

    /// Fills `buf` from offset `at` of the file mapped from `path`, where the file maps
    /// those bytes read-only. Err is a message.
    pub(crate) fn read(&self, path: &str, at: u64, buf: &mut [u8]) -> Result<(), String> {
        let f = self.open(path)?;
        let end = at.saturating_add(buf.len() as u64);
        if !f.read_only.iter().any(|&(s, e)| s <= at && end <= e) {
            return Err(format!(
                "not in the core, and {} maps writable data there (or nothing), which the process may have changed",
                f.host_path.display()
            ));
        }
        let start = usize::try_from(at).map_err(|_| "offset out of range".to_string())?;
        let src = start
            .checked_add(buf.len())
            .and_then(|end| f.map.get(start..end))
            .ok_or_else(|| {
                format!(
                    "not dumped in the core, and past the end of {}",
                    f.host_path.display()
                )
            })?;
        buf.copy_from_slice(src);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn build_id_of_our_own_executable() {
        let exe = std::fs::read("/proc/self/exe").unwrap();
        let id = build_id_of(&exe[..exe.len().min(64 << 10)]);
        // Rust's linker gives test binaries a build id on Linux (`--build-id` is the
        // default of every toolchain we build with).
        assert!(id.as_ref().is_some_and(|i| i.len() >= 16), "{id:?}");
        assert_eq!(build_id_of(b"not elf"), None);
        for n in 0..200 {
            let _ = build_id_of(&exe[..n]);
        }
    }
}
