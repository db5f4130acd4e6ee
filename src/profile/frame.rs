//! The rule that says which frame of a stack is charged for its time and its memory.
//!
//! Owns: [`charged_frame`] and what counts as library code ([`is_library_file`]).
//! [`Frame`] and [`Name`] are `python`'s (a stack walk makes them); the profile re-exports
//! them.
//! Must not: depend on how frames are read (`python`'s walker) or sampled (`sampler`).

pub use crate::python::{Frame, Name};

/// Whether a file belongs to the Python installation or to installed packages rather than to
/// the user's program.
fn is_library_file(path: &str) -> bool {
    if path.starts_with("<frozen ") {
        return true;
    }
    if path.contains("/site-packages/") || path.contains("/dist-packages/") {
        return true;
    }
    // <prefix>/lib/pythonX.Y/...
    if let Some(i) = path.find("/lib/python") {
        let rest = &path[i + "/lib/python".len()..];
        let ver: String = rest.chars().take_while(|c| *c != '/').collect();
        // `3.13t`: a free-threaded build's library directory.
        let ver = ver.strip_suffix('t').unwrap_or(&ver);
        return !ver.is_empty() && ver.chars().all(|c| c.is_ascii_digit() || c == '.');
    }
    false
}

/// The frame a stack's time (or allocation) is charged to (native frames skipped): the
/// innermost frame, or with library folding (`profile_all` off) the innermost frame of the
/// user's own code (else the innermost frame).
pub(crate) fn charged_frame(frames: &[Frame], profile_all: bool) -> Option<&Frame> {
    let mut python = frames.iter().filter(|f| !f.native && !f.is_task());
    if profile_all {
        return python.next();
    }
    let innermost = python.clone().next();
    python.find(|f| !is_library_file(&f.filename)).or(innermost)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn library_files() {
        for lib in [
            "/usr/lib/python3.11/threading.py",
            "/root/.pyenv/versions/3.12.1/lib/python3.12/json/decoder.py",
            "/venv/lib/python3.12/site-packages/numpy/core/numeric.py",
            "/usr/lib/python3/dist-packages/yaml/__init__.py",
            "<frozen importlib._bootstrap>",
            "/root/.cache/scalene-rs/pythons/3.13.15t/lib/python3.13t/threading.py",
        ] {
            assert!(is_library_file(lib), "{lib}");
        }
        for user in [
            "/home/me/app.py",
            "<string>",
            "/srv/lib/python_tools/x.py",
            "/srv/lib/pythont/x.py",
            "app.py",
        ] {
            assert!(!is_library_file(user), "{user}");
        }
    }

    fn f(file: &str) -> Frame {
        crate::python::test_frame(file)
    }

    #[test]
    fn library_frames_fold_into_the_calling_user_line() {
        let stack = [
            f("/usr/lib/python3.11/json/decoder.py"),
            f("/home/me/app.py"),
            f("/home/me/main.py"),
        ];
        assert_eq!(charged_frame(&stack, false), Some(&stack[1]));
        assert_eq!(charged_frame(&stack, true), Some(&stack[0]));
        let all_library = [f("/usr/lib/python3.11/threading.py")];
        assert_eq!(charged_frame(&all_library, false), Some(&all_library[0]));
        assert_eq!(charged_frame(&[], false), None);
    }

    #[test]
    fn native_frames_are_never_charged() {
        let zlib = Frame::of_native("deflate_slow".into(), Some("libz.so.1"));
        let stack = [
            zlib.clone(),
            f("/usr/lib/python3.11/gzip.py"),
            Frame::of_native("list_sort".into(), None),
            f("/home/me/app.py"),
        ];
        assert_eq!(charged_frame(&stack, false), Some(&stack[3]));
        assert_eq!(charged_frame(&stack, true), Some(&stack[1]));
        assert_eq!(charged_frame(&[zlib], true), None);
        let library_only = [stack[0].clone(), stack[1].clone()];
        assert_eq!(charged_frame(&library_only, false), Some(&library_only[1]));
    }
}
