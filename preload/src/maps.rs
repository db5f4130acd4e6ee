//! The interpreter image's address range in this process, read once from /proc/self/maps
//! at start-up without allocating (raw `open`/`read` into a stack buffer).
//!
//! Owns: deciding whether this process is a Python interpreter and where its code lies.
//! That is libpython's mappings for a shared build, else the executable's when it is named
//! python*.
//!
//! Must not: allocate, or be called on a hot path.

/// `[lo, hi)` of the interpreter image, or None when this process is not Python.
pub fn interpreter_range() -> Option<(usize, usize)> {
    let mut exe = [0u8; 1024];
    // SAFETY: readlink writes at most `exe.len()` bytes into the buffer.
    let n = unsafe {
        libc::readlink(
            c"/proc/self/exe".as_ptr(),
            exe.as_mut_ptr() as *mut libc::c_char,
            exe.len(),
        )
    };
    let exe: &[u8] = if n > 0 && (n as usize) < exe.len() {
        &exe[..n as usize]
    } else {
        &[]
    };
    let exe_is_python = exe
        .rsplit(|&c| c == b'/')
        .next()
        .is_some_and(|base| base.starts_with(b"python"));

    let mut lib: Option<(usize, usize)> = None;
    let mut main: Option<(usize, usize)> = None;
    for_each_mapping(&mut |lo, hi, path| {
        let widen = |r: &mut Option<(usize, usize)>| {
            *r = Some(match *r {
                Some((a, b)) => (a.min(lo), b.max(hi)),
                None => (lo, hi),
            })
        };
        let base = path.rsplit(|&c| c == b'/').next().unwrap_or(path);
        if base.starts_with(b"libpython") {
            widen(&mut lib);
        } else if !exe.is_empty() && path == exe {
            widen(&mut main);
        }
    });
    lib.or(if exe_is_python { main } else { None })
}

/// Calls `f(lo, hi, path)` for every file-backed mapping.
fn for_each_mapping(f: &mut dyn FnMut(usize, usize, &[u8])) {
    // SAFETY: a plain open of a NUL-terminated path.
    let fd = unsafe {
        libc::open(
            c"/proc/self/maps".as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return;
    }
    let mut buf = [0u8; 8192];
    let mut have = 0usize;
    loop {
        // SAFETY: reads into the unused tail of `buf`.
        let n = unsafe {
            libc::read(
                fd,
                buf[have..].as_mut_ptr() as *mut libc::c_void,
                buf.len() - have,
            )
        };
        if n <= 0 {
            if have > 0 {
                parse_line(&buf[..have], f);
            }
            break;
        }
        have += n as usize;
        let mut start = 0;
        while let Some(nl) = buf[start..have].iter().position(|&c| c == b'\n') {
            parse_line(&buf[start..start + nl], f);
            start += nl + 1;
        }
        if start == 0 && have == buf.len() {
            // A line longer than the buffer is skipped.
            have = 0;
            continue;
        }
        buf.copy_within(start..have, 0);
        have -= start;
    }
    // SAFETY: closes the descriptor opened above.
    unsafe { libc::close(fd) };
}

/// "lo-hi perms offset dev inode   path"
fn parse_line(line: &[u8], f: &mut dyn FnMut(usize, usize, &[u8])) {
    let mut fields = line.splitn(6, |&c| c == b' ');
    let Some(range) = fields.next() else { return };
    let path = match fields.nth(4) {
        Some(p) => trim_start(p),
        None => return,
    };
    if !path.starts_with(b"/") {
        return;
    }
    let mut ends = range.splitn(2, |&c| c == b'-');
    let (Some(lo), Some(hi)) = (ends.next().and_then(hex), ends.next().and_then(hex)) else {
        return;
    };
    f(lo, hi, path);
}

fn trim_start(mut s: &[u8]) -> &[u8] {
    while let [b' ', rest @ ..] = s {
        s = rest;
    }
    s
}

fn hex(s: &[u8]) -> Option<usize> {
    if s.is_empty() || s.len() > 16 {
        return None;
    }
    let mut v = 0usize;
    for &c in s {
        let d = match c {
            b'0'..=b'9' => c - b'0',
            b'a'..=b'f' => c - b'a' + 10,
            b'A'..=b'F' => c - b'A' + 10,
            _ => return None,
        };
        v = (v << 4) | d as usize;
    }
    Some(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_maps_line() {
        let mut got = None;
        parse_line(
            b"7f0000001000-7f0000002000 r-xp 00001000 08:01 1234       /usr/lib/libpython3.12.so.1.0",
            &mut |lo, hi, p| got = Some((lo, hi, p.to_vec())),
        );
        let (lo, hi, p) = got.unwrap();
        assert_eq!((lo, hi), (0x7f0000001000, 0x7f0000002000));
        assert_eq!(p, b"/usr/lib/libpython3.12.so.1.0");
        let mut anon = false;
        parse_line(
            b"7f0000001000-7f0000002000 rw-p 00000000 00:00 0 ",
            &mut |_, _, _| anon = true,
        );
        assert!(!anon);
    }
}
