//! The preload library, embedded in the profiler at build time (see build.rs) and written
//! out at run time into a private directory, so the shipped binary is self-contained.
//!
//! Owns: [`PreloadFile`] (the written library, removed on drop) and the environment a
//! profiled program gets ([`preload_env`]).
//!
//! Must not: replace the user's own LD_PRELOAD (ours is appended).

use super::config::PythonAllocator;
use super::ring::layout;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// The built library's bytes.
static LIBRARY: &[u8] = include_bytes!(env!("SCALENE_RS_PRELOAD_SO"));

/// The library written to a private (0700) directory of its own; both go away on drop.
#[derive(Debug)]
pub struct PreloadFile {
    dir: PathBuf,
    path: PathBuf,
}

/// The library's bytes (to write it where a process we attach to can load it).
pub(crate) fn library_bytes() -> &'static [u8] {
    LIBRARY
}

impl PreloadFile {
    /// Writes the library under `base` (a fresh `scalene-rs-<pid>-<n>` directory, 0700).
    pub fn write(base: &Path) -> std::io::Result<PreloadFile> {
        static COUNTER: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = base.join(format!("scalene-rs-{}-{n}", std::process::id()));
        std::fs::DirBuilder::new().mode(0o700).create(&dir)?;
        let path = dir.join("libscalene_preload.so");
        let written = (|| {
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o500)
                .open(&path)?;
            // No fsync: the program maps the file through the same page cache, and the
            // file is gone when we are (it cost up to ~7 ms of every run's start).
            f.write_all(LIBRARY)
        })();
        if let Err(e) = written {
            let _ = std::fs::remove_dir_all(&dir);
            return Err(e);
        }
        Ok(PreloadFile { dir, path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for PreloadFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Removes library directories under `base` left by profilers of our user that are no longer
/// running (killed before they could clean up). Returns how many were removed.
pub(crate) fn clean_stale(base: &Path) -> usize {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir(base) else {
        return 0;
    };
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    let mut removed = 0;
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix("scalene-rs-") else {
            continue;
        };
        let mut parts = rest.split('-');
        let (Some(pid), Some(n), None) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        let (Ok(pid), Ok(_)) = (pid.parse::<i32>(), n.parse::<u32>()) else {
            continue;
        };
        let Ok(meta) = std::fs::symlink_metadata(e.path()) else {
            continue;
        };
        if !meta.is_dir() || meta.uid() != uid || crate::proc::process_exists(pid) {
            continue;
        }
        // Only what we write there: the library, then the directory.
        let lib = e.path().join("libscalene_preload.so");
        let _ = std::fs::remove_file(&lib);
        if std::fs::remove_dir(e.path()).is_ok() {
            removed += 1;
        }
    }
    removed
}

/// The value of LD_PRELOAD for the program: the user's own entries first, ours last.
fn ld_preload_value(user: Option<&str>, ours: &Path) -> String {
    match user.map(str::trim).filter(|s| !s.is_empty()) {
        Some(u) => format!("{u}:{}", ours.display()),
        None => ours.display().to_string(),
    }
}

/// The environment variables a program profiled with memory accounting gets: our library,
/// the ring's name, and how Python's objects are to be counted. How they are counted is one
/// of:
/// - by default, `PYTHONMALLOC=malloc` and the request to wrap pymalloc instead where the
///   interpreter allows it (the library then drops `PYTHONMALLOC` in that process; see its
///   `pymem.rs`);
/// - `PYTHONMALLOC=malloc` alone;
/// - nothing (pymalloc, counted by its arenas).
///
/// A `PYTHONMALLOC` of the user's own (`user_pythonmalloc`) is theirs, so it stays,
/// unwrapped.
pub fn preload_env(
    user_ld_preload: Option<&str>,
    user_pythonmalloc: Option<&str>,
    lib: &Path,
    ring: &Path,
    python_allocator: PythonAllocator,
) -> Vec<(String, String)> {
    let mut env = vec![
        ("LD_PRELOAD".into(), ld_preload_value(user_ld_preload, lib)),
        (super::ring::RING_ENV.into(), ring.display().to_string()),
    ];
    if user_pythonmalloc.is_some_and(|v| !v.is_empty()) {
        return env;
    }
    if python_allocator != PythonAllocator::Pymalloc {
        env.push(("PYTHONMALLOC".into(), "malloc".into()));
    }
    match python_allocator {
        PythonAllocator::Wrapped => env.push((layout::PYMEM_ENV.into(), layout::PYMEM_HOOK.into())),
        PythonAllocator::Malloc => {
            env.push((layout::PYMEM_ENV.into(), layout::PYMEM_MALLOC.into()))
        }
        PythonAllocator::Pymalloc => {}
    }
    env
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_allocator_modes_set_the_environment_unless_the_user_chose() {
        let (lib, ring) = (Path::new("/l.so"), Path::new("/r"));
        let get = |env: &[(String, String)], k: &str| {
            env.iter().find(|(key, _)| key == k).map(|(_, v)| v.clone())
        };
        let wrapped = preload_env(None, None, lib, ring, PythonAllocator::Wrapped);
        assert_eq!(get(&wrapped, "PYTHONMALLOC").as_deref(), Some("malloc"));
        assert_eq!(
            get(&wrapped, layout::PYMEM_ENV).as_deref(),
            Some(layout::PYMEM_HOOK)
        );
        let malloc = preload_env(None, None, lib, ring, PythonAllocator::Malloc);
        assert_eq!(get(&malloc, "PYTHONMALLOC").as_deref(), Some("malloc"));
        assert_eq!(
            get(&malloc, layout::PYMEM_ENV).as_deref(),
            Some(layout::PYMEM_MALLOC)
        );
        let kept = preload_env(None, None, lib, ring, PythonAllocator::Pymalloc);
        assert_eq!(get(&kept, "PYTHONMALLOC"), None);
        assert_eq!(get(&kept, layout::PYMEM_ENV), None);
        // The user's own choice stands (and is not wrapped).
        let theirs = preload_env(None, Some("debug"), lib, ring, PythonAllocator::Wrapped);
        assert_eq!(get(&theirs, "PYTHONMALLOC"), None);
        assert_eq!(get(&theirs, layout::PYMEM_ENV), None);
        assert!(get(&theirs, "LD_PRELOAD").is_some());
    }

    #[test]
    fn user_preload_is_kept_first() {
        let ours = Path::new("/run/x/libscalene_preload.so");
        assert_eq!(ld_preload_value(None, ours), "/run/x/libscalene_preload.so");
        assert_eq!(
            ld_preload_value(Some("  "), ours),
            "/run/x/libscalene_preload.so"
        );
        assert_eq!(
            ld_preload_value(Some("/opt/libjemalloc.so"), ours),
            "/opt/libjemalloc.so:/run/x/libscalene_preload.so"
        );
    }

    #[test]
    fn library_is_written_privately_and_removed() {
        use std::os::unix::fs::PermissionsExt;
        let base = std::env::temp_dir();
        let f = PreloadFile::write(&base).unwrap();
        let dir = f.path().parent().unwrap().to_path_buf();
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        assert_eq!(std::fs::read(f.path()).unwrap().len(), LIBRARY.len());
        assert!(LIBRARY.starts_with(b"\x7fELF"));
        drop(f);
        assert!(!dir.exists());
    }

    #[test]
    fn stale_library_directories_are_removed() {
        let base = std::env::temp_dir().join(format!("scalene-rs-libtest-{}", std::process::id()));
        std::fs::create_dir_all(&base).unwrap();
        let dead = base.join("scalene-rs-99999999-0");
        let live = base.join(format!("scalene-rs-{}-7", std::process::id()));
        let other = base.join("scalene-rs-99999999-0-x");
        for d in [&dead, &live, &other] {
            std::fs::create_dir(d).unwrap();
        }
        std::fs::write(dead.join("libscalene_preload.so"), b"x").unwrap();
        assert_eq!(clean_stale(&base), 1);
        assert!(!dead.exists() && live.exists() && other.exists());
        std::fs::remove_dir_all(&base).unwrap();
    }
}
