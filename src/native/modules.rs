//! The target's code modules. They are every file with executable code it has mapped (the
//! executable, libpython, extension modules, the C library), and the vDSO.
//!
//! Owns: [`Modules`], built from /proc/PID/maps (or a core's `NT_FILE`, the files opened
//! by an `Opener`). For each module it keeps the address range, the load bias and the
//! [`Image`].
//!
//! The image's file is opened as the target sees it:
//! - by /proc/PID/map_files/START-END, the very file mapped;
//! - else by its path, through `elf::maps::open_target_file`. That goes through
//!   /proc/PID/root for a target in another mount namespace.
//!
//! The file is checked against the build id of the image in the target's memory.
//! - A file that changed on disk since it was loaded is [`FileState::Changed`]. It is never
//!   read. Its unwind rules are read from the target's memory (PT_GNU_EH_FRAME), and it
//!   has no names.
//! - A file deleted or replaced on disk, whose loaded file can still be read, is
//!   [`FileState::Replaced`]. It is read, and its frames say so.
//!
//! The vDSO's image is read from the target's memory.
//!
//! A trusted image that lacks a `.symtab` or DWARF gets its separate debug file, when the
//! target has one (`native::debuginfo`).
//!
//! Images are kept in a [`NativeCache`] by build id. So processes that load the same
//! library parse it once, and look for its debug file once.
//!
//! Must not: pause threads or unwind (that is `native::unwind`).

use super::debuginfo::find_debug_file;
use super::image::{build_id_in_memory, unwind_image_in_memory, BuildId, Bytes, Image};
use crate::elf::maps::{basename, open_target_file};
use crate::proc::ns::Namespaces;
use crate::proc::MapEntry;
use crate::ptrace::ProcessMemory;
use std::collections::HashMap;
use std::ops::Range;
use std::os::unix::fs::MetadataExt;
use std::sync::Arc;

/// Images by build id, shared by every process a run reads.
#[derive(Default)]
pub struct NativeCache {
    images: HashMap<BuildId, Arc<Image>>,
}

impl NativeCache {
    pub fn new() -> NativeCache {
        NativeCache::default()
    }
}

/// Whether a module's file can be trusted for its unwind rules and names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum FileState {
    /// The file is the one loaded (same build id, or the mapped file itself).
    Loaded,
    /// The file at the module's path was deleted or replaced since it was loaded. The file
    /// read is the loaded one all the same (the mapped file itself, or an image of the
    /// same build id), so it is trusted, and the frames say so.
    Replaced,
    /// The file on disk is not the one loaded (another build id, or replaced): why.
    Changed(String),
    /// The file could not be opened or parsed: why.
    Unreadable(String),
}

/// One mapped image.
pub(crate) struct Module {
    /// Its path as the target sees it (/proc/PID/maps), or `[vdso]`.
    pub(crate) path: Arc<str>,
    /// Its file name, for frames (`libc.so.6`).
    pub(crate) name: Arc<str>,
    /// Every mapping of it, first to last byte.
    pub(crate) avma: Range<u64>,
    /// AVMA − SVMA. Without a trusted image: the AVMA of its first mapping (so offsets
    /// shown are from the start of the file's image).
    pub(crate) bias: u64,
    /// Its parsed file, when [`FileState::Loaded`] or [`FileState::Replaced`]; otherwise
    /// only the unwind rules of the loaded image, read from the target's memory (no
    /// symbols), when it has them.
    pub(crate) image: Option<Arc<Image>>,
    pub(crate) state: FileState,
}

/// The modules of one process, sorted by address.
#[derive(Default)]
pub(crate) struct Modules {
    pub(crate) list: Vec<Module>,
}

impl Modules {
    /// The module whose mappings hold `avma`.
    pub(crate) fn find(&self, avma: u64) -> Option<&Module> {
        let i = self.list.partition_point(|m| m.avma.start <= avma);
        self.list[..i].last().filter(|m| avma < m.avma.end)
    }

    /// Reads the modules of process `pid` from its map (`maps`, just read).
    pub(crate) fn read(
        pid: i32,
        maps: &[MapEntry],
        mem: &dyn ProcessMemory,
        ns: Namespaces,
        cache: &mut NativeCache,
    ) -> Modules {
        Modules::read_from(Opener::Live { pid, ns }, maps, mem, cache)
    }

    /// [`Modules::read`], the files opened by `opener`.
    pub(crate) fn read_from(
        opener: Opener,
        maps: &[MapEntry],
        mem: &dyn ProcessMemory,
        cache: &mut NativeCache,
    ) -> Modules {
        let mut list = Vec::new();
        for group in file_groups(maps) {
            if !group.iter().any(|m| m.executable) {
                continue;
            }
            list.push(open_module(opener, maps, group, mem, cache));
        }
        if let Some(vdso) = maps.iter().find(|m| m.vdso) {
            list.push(vdso_module(vdso, mem));
        }
        list.sort_by_key(|m| m.avma.start);
        Modules { list }
    }
}

/// The mappings of each file, one group per time it is mapped: consecutive entries with the
/// same path and inode, a new group where the file's offset 0 is mapped again.
fn file_groups(maps: &[MapEntry]) -> Vec<&[MapEntry]> {
    let mut groups = Vec::new();
    let mut start = 0;
    for i in 1..=maps.len() {
        let ends = i == maps.len() || {
            let (first, m) = (&maps[start], &maps[i]);
            m.path != first.path || m.inode != first.inode || m.offset == 0
        };
        if ends {
            if maps[start].path.is_some() && maps[start].inode != 0 {
                groups.push(&maps[start..i]);
            }
            start = i;
        }
    }
    groups
}

/// One file's module: its image from the cache (by the build id in memory) or from its
/// file, checked to be the file that was loaded.
fn open_module(
    opener: Opener,
    maps: &[MapEntry],
    group: &[MapEntry],
    mem: &dyn ProcessMemory,
    cache: &mut NativeCache,
) -> Module {
    let path: &str = group[0].path.as_deref().unwrap_or("?");
    let avma = group[0].start..group.last().map_or(group[0].end, |m| m.end);
    let head = group.iter().find(|m| m.offset == 0);
    let in_memory = head.and_then(|h| build_id_in_memory(mem, h.start));
    let cached = in_memory
        .as_ref()
        .and_then(|id| cache.images.get(id))
        .cloned();
    let (image, mut state) = match cached {
        Some(image) => (Some(image), FileState::Loaded),
        None => match opener.open(maps, group) {
            Ok((mut image, exact)) => {
                let state = judge(&image, in_memory.as_ref(), exact, group);
                if state == FileState::Loaded {
                    if image.wants_debug_file() {
                        if let Some(debug) = opener.debug_file(path, &image) {
                            image.set_debug_file(debug);
                        }
                    }
                    let image = Arc::new(image);
                    if let Some(id) = &image.build_id {
                        cache.images.insert(id.clone(), image.clone());
                    }
                    (Some(image), state)
                } else {
                    (None, state)
                }
            }
            Err(why) => (None, FileState::Unreadable(why)),
        },
    };
    // A file that cannot be trusted or read gets the unwind rules of what was loaded, from
    // the target's memory (no names).
    let image = image.or_else(|| {
        head.and_then(|h| unwind_image_in_memory(mem, h.start))
            .map(Arc::new)
    });
    if state == FileState::Loaded && group[0].deleted {
        state = FileState::Replaced;
    }
    let bias = image
        .as_ref()
        .and_then(|img| {
            group
                .iter()
                .find(|m| m.offset == img.first_load_offset)
                .map(|m| m.start.wrapping_sub(img.first_load_svma))
        })
        .unwrap_or_else(|| head.map_or(avma.start, |h| h.start));
    Module {
        path: path.into(),
        name: basename(path).into(),
        avma,
        bias,
        image,
        state,
    }
}

/// Opens and parses the file of `group`: first the mapped file itself (map_files, which
/// needs CAP_SYS_ADMIN), then by path as the target sees it. Also says whether the file is
/// exactly the mapped one (map_files).
/// Where the files of a process's modules are opened.
#[derive(Clone, Copy)]
pub(crate) enum Opener<'a> {
    /// A live process's, as it sees them (/proc/PID/map_files, its root).
    Live { pid: i32, ns: Namespaces },
    /// A core's, found and checked by build id (`coredump::Files`).
    Saved(&'a crate::coredump::Files),
}

impl Opener<'_> {
    /// The image of the file of `group` (see [`open_image`]), and whether it is the very
    /// file that was mapped.
    fn open(&self, maps: &[MapEntry], group: &[MapEntry]) -> Result<(Image, bool), String> {
        match *self {
            Opener::Live { pid, ns } => open_image(pid, maps, group, ns),
            Opener::Saved(files) => {
                let path = group[0].path.as_deref().unwrap_or("?");
                let found = files.open(path)?;
                let file = std::fs::File::open(&found.host_path)
                    .map_err(|e| format!("{}: {e}", found.host_path.display()))?;
                let image = Image::from_file(&file, &found.host_path).map_err(|e| e.to_string())?;
                // Checked by build id where the core holds one (else said in a warning).
                Ok((image, true))
            }
        }
    }

    /// The separate debug file of `image`, the module mapped from `path`.
    fn debug_file(&self, path: &str, image: &Image) -> Option<Image> {
        match *self {
            Opener::Live { pid, .. } => find_debug_file(pid, path, image),
            Opener::Saved(files) => {
                let root = files.root().unwrap_or(std::path::Path::new("/"));
                super::debuginfo::find_debug_file_under(root, path, image)
            }
        }
    }
}

fn open_image(
    pid: i32,
    maps: &[MapEntry],
    group: &[MapEntry],
    ns: Namespaces,
) -> Result<(Image, bool), String> {
    let first = &group[0];
    let mapped = format!("/proc/{pid}/map_files/{:x}-{:x}", first.start, first.end);
    if let Ok(f) = std::fs::File::open(&mapped) {
        if let Ok(image) = Image::from_file(&f, std::path::Path::new(&mapped)) {
            return Ok((image, true));
        }
    }
    let path = first.path.as_deref().unwrap_or("?");
    let (file, name) = open_target_file(pid, path, maps, ns).map_err(|e| e.to_string())?;
    // The file at that path now is the mapped one only if it is the same inode.
    let same_inode = file
        .metadata()
        .is_ok_and(|m| m.ino() == first.inode && !first.deleted);
    let image = Image::from_file(&file, &name).map_err(|e| e.to_string())?;
    Ok((image, same_inode))
}

/// Whether the file read is the image that was loaded. That is judged by build id when
/// the image in memory has one. Else only the mapped file itself (or the same inode, not
/// deleted) is.
fn judge(image: &Image, in_memory: Option<&BuildId>, exact: bool, group: &[MapEntry]) -> FileState {
    match (in_memory, &image.build_id) {
        (Some(loaded), Some(on_disk)) if loaded != on_disk => FileState::Changed(format!(
            "changed on disk since it was loaded (build id {loaded} loaded, {on_disk} on disk)"
        )),
        (Some(loaded), None) => FileState::Changed(format!(
            "changed on disk since it was loaded (build id {loaded} loaded, none on disk)"
        )),
        (Some(_), Some(_)) => FileState::Loaded,
        (None, _) if exact => FileState::Loaded,
        (None, _) => FileState::Changed(if group[0].deleted {
            "deleted or replaced since it was loaded".into()
        } else {
            "replaced on disk since it was loaded (another file at its path)".into()
        }),
    }
}

/// The vDSO: its image is only in the target's memory.
fn vdso_module(m: &MapEntry, mem: &dyn ProcessMemory) -> Module {
    let len = (m.end - m.start) as usize;
    let image = mem
        .read_vec(m.start, len)
        .map_err(|e| e.to_string())
        .and_then(|bytes| {
            Image::parse("[vdso]".into(), Bytes::Owned(bytes)).map_err(|e| e.to_string())
        });
    let (image, state, bias) = match image {
        Ok(img) => {
            let bias = m
                .start
                .wrapping_add(img.first_load_offset)
                .wrapping_sub(img.first_load_svma);
            (Some(Arc::new(img)), FileState::Loaded, bias)
        }
        Err(why) => (None, FileState::Unreadable(why), m.start),
    };
    Module {
        path: "[vdso]".into(),
        name: "[vdso]".into(),
        avma: m.start..m.end,
        bias,
        image,
        state,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(
        start: u64,
        end: u64,
        offset: u64,
        path: Option<&str>,
        inode: u64,
        x: bool,
    ) -> MapEntry {
        MapEntry {
            start,
            end,
            offset,
            readable: true,
            executable: x,
            path: path.map(str::to_string),
            dev: (8, 1),
            inode,
            deleted: false,
            vdso: false,
        }
    }

    #[test]
    fn mappings_group_by_file_and_by_each_time_it_is_mapped() {
        let maps = vec![
            entry(0x1000, 0x2000, 0, Some("/lib/a.so"), 7, false),
            entry(0x2000, 0x3000, 0x1000, Some("/lib/a.so"), 7, true),
            entry(0x3000, 0x4000, 0, None, 0, false),
            entry(0x5000, 0x6000, 0, Some("/lib/b.so"), 8, false),
            entry(0x6000, 0x7000, 0x1000, Some("/lib/b.so"), 8, true),
            // b.so mapped a second time (dlopen of a copy under the same path).
            entry(0x8000, 0x9000, 0, Some("/lib/b.so"), 8, false),
            entry(0x9000, 0xa000, 0x1000, Some("/lib/b.so"), 8, true),
        ];
        let groups = file_groups(&maps);
        let spans: Vec<(u64, u64)> = groups
            .iter()
            .map(|g| (g[0].start, g.last().unwrap().end))
            .collect();
        assert_eq!(
            spans,
            vec![(0x1000, 0x3000), (0x5000, 0x7000), (0x8000, 0xa000)]
        );
    }

    #[test]
    fn a_file_is_trusted_only_when_it_is_the_one_loaded() {
        let exe = std::env::current_exe().unwrap();
        let f = std::fs::File::open(&exe).unwrap();
        let image = Image::from_file(&f, &exe).unwrap();
        let own = image.build_id.clone().unwrap();
        let other = BuildId(vec![1, 2, 3]);
        let group = [entry(0, 1, 0, Some("/x"), 1, true)];
        assert_eq!(judge(&image, Some(&own), false, &group), FileState::Loaded);
        assert!(
            matches!(judge(&image, Some(&other), true, &group), FileState::Changed(w) if w.contains("010203"))
        );
        // No build id in memory, so only the mapped file itself is trusted.
        assert_eq!(judge(&image, None, true, &group), FileState::Loaded);
        assert!(matches!(
            judge(&image, None, false, &group),
            FileState::Changed(_)
        ));
    }

    #[test]
    fn our_own_modules_are_found_with_their_images() {
        let pid = std::process::id() as i32;
        let maps = crate::proc::read_maps(pid).unwrap();
        let mem = crate::ptrace::RemoteMemory::new(pid).unwrap();
        let mut cache = NativeCache::new();
        let modules = Modules::read(pid, &maps, &mem, Namespaces::host(), &mut cache);
        let here = our_own_modules_are_found_with_their_images as *const () as u64;
        let m = modules.find(here).expect("this function is in a module");
        assert_eq!(m.state, FileState::Loaded);
        let image = m.image.as_ref().unwrap();
        // Its own symbol covers this function's address.
        let found = image.symbols().find(here - m.bias).expect("a symbol");
        assert!(image
            .symbol_name(&found)
            .contains("our_own_modules_are_found"));
        assert!(modules
            .list
            .iter()
            .any(|m| &*m.name == "[vdso]" && m.image.is_some()));
        // A second read of the same process takes the images from the cache.
        let before = cache.images.len();
        let again = Modules::read(pid, &maps, &mem, Namespaces::host(), &mut cache);
        assert_eq!(cache.images.len(), before);
        let m2 = again.find(here).unwrap();
        assert!(Arc::ptr_eq(m2.image.as_ref().unwrap(), image));
    }
}
