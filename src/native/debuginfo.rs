//! Debug information kept apart from a module's file: a separate debug file (what Debian's
//! `-dbgsym` packages install under /usr/lib/debug) and MiniDebugInfo (Fedora's
//! `.gnu_debugdata` section, an xz-compressed ELF file holding the `.symtab` entries of the
//! functions `.dynsym` lacks); and the compressed debug sections such files often have.
//!
//! Owns: where a module's separate debug file is looked for, in order
//! ([`find_debug_file`]: by build id, `DIR/.build-id/xx/yyyy….debug`, then by the name in
//! its `.gnu_debuglink`, checked by CRC32), and the check that what is found is the
//! module's (the same build id, else the CRC32 its `.gnu_debuglink` names); the debug
//! directories (the target's /usr/lib/debug, seen through /proc/PID/root, or
//! `SCALENE_RS_DEBUG_DIRS`); bounded decompression of MiniDebugInfo ([`unxz_bounded`]) and
//! of `SHF_COMPRESSED` sections ([`inflate_section`]).
//! Must not: parse symbol tables or DWARF (that is `image` and `symbols`); open a debug file
//! by the host's path for a target that sees another file there (a container's libraries
//! get the container's debug files, never the host's of the same build id).

use super::image::{BuildId, Bytes, Image};
use std::io::Read;
use std::path::{Path, PathBuf};

/// Most bytes MiniDebugInfo may decompress to. Its `.symtab` holds only functions, some
/// tens of bytes each with their names: a few MiB for the largest libraries. The xz
/// decoder keeps a block whole before handing it over, so the peak is twice this.
pub(crate) const MAX_MINI_DEBUGINFO: u64 = 128 << 20;

/// Most bytes one compressed debug section may decompress to (a section that says more
/// is left out, and the lines it would give with it).
pub(crate) const MAX_INFLATED_SECTION: u64 = 256 << 20;

/// The variable that replaces the target's /usr/lib/debug by other directories (as this
/// process sees them, `:`-separated), like gdb's `debug-file-directory`.
pub(crate) const DEBUG_DIRS_VAR: &str = "SCALENE_RS_DEBUG_DIRS";

/// The directories separate debug files are looked for in: `SCALENE_RS_DEBUG_DIRS` when
/// set, else the target's own /usr/lib/debug (through /proc/PID/root: a containerised or
/// chrooted target's debug files are its root's).
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

/// The contents of a `.gnu_debuglink` section: the debug file's name (a file name, no
/// directory), NUL-terminated and padded to 4 bytes, then the CRC32 of the whole debug
/// file (little-endian: the only ELF files read here).
pub(crate) fn parse_debuglink(section: &[u8]) -> Option<(String, u32)> {
    let len = section.iter().position(|&b| b == 0)?;
    let name = std::str::from_utf8(&section[..len]).ok()?;
    // A name with a directory in it would reach outside the places looked in.
    if name.is_empty() || name.contains('/') || name == "." || name == ".." {
        return None;
    }
    let crc_at = (len + 1).checked_add(3)? & !3;
    let crc = section.get(crc_at..crc_at + 4)?;
    Some((name.to_string(), u32::from_le_bytes(crc.try_into().ok()?)))
}

/// `path`, as /proc/PID/maps names it, as the target names it itself and as we can open
/// it: the kernel writes map paths from the root of the target's mount namespace (ours
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

/// The places a `.gnu_debuglink` name is looked for, in order: under each debug directory
/// at the module's own directory (`/usr/lib/debug/usr/lib/x86_64-linux-gnu/NAME`), then
/// the module's directory's `.debug/NAME`, then its directory itself. `module_dir` is the
/// module's directory as the target names it, `seen_dir` the same as this process can
/// open it.
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
/// /proc/PID/maps names it), or None. By build id first: `DIR/.build-id/xx/yyyy….debug`
/// in each debug directory, used only if its own build id is the module's; then by the
/// name in the module's `.gnu_debuglink`, used only if it is the module's (the same build
/// id when both have one, else the CRC32 the link names).
pub(crate) fn find_debug_file(pid: i32, module_path: &str, image: &Image) -> Option<Image> {
    let dirs = debug_dirs(pid);
    if let Some(rel) = image.build_id.as_ref().and_then(build_id_path) {
        for dir in &dirs {
            if let Some(debug) = open_debug_file(&dir.join(&rel)) {
                if debug.build_id == image.build_id {
                    return Some(debug);
                }
            }
        }
    }
    let (name, crc) = image.debuglink.as_ref()?;
    let (module_dir, seen_dir) = in_target_root(pid, Path::new(module_path).parent()?.to_str()?)?;
    debuglink_places(&dirs, &module_dir, &seen_dir, name)
        .into_iter()
        .filter_map(|p| open_debug_file(&p))
        .find(|debug| match (&debug.build_id, &image.build_id) {
            (Some(a), Some(b)) => a == b,
            _ => crc32fast::hash(debug.bytes()) == *crc,
        })
}

/// A `Write` that refuses to take more than `room` bytes.
struct Bounded {
    out: Vec<u8>,
    room: u64,
}

impl std::io::Write for Bounded {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if buf.len() as u64 > self.room {
            return Err(std::io::Error::other("decompresses to more than allowed"));
        }
        self.room -= buf.len() as u64;
        self.out.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The number of bytes the first stream of the xz data `xz` decompresses to, read from
/// its framing without decoding anything: the sum of the sizes its LZMA2 chunks declare
/// (each chunk says how many bytes it holds, and a decoder stops there). Refuses a stream
/// whose blocks have any filter but LZMA2 alone, and one that declares more than `limit`.
pub(crate) fn xz_unpacked_size(xz: &[u8], limit: u64) -> Result<u64, String> {
    const MAGIC: &[u8] = b"\xfd7zXZ\0";
    const LZMA2: u64 = 0x21;
    let byte = |at: usize| xz.get(at).copied().ok_or("truncated xz data");
    if !xz.starts_with(MAGIC) || xz.len() < 12 {
        return Err("not xz data".into());
    }
    // The check after each block: none, CRC32, CRC64, SHA-256 (and reserved kinds of the
    // same four sizes).
    let check_len = match byte(7)? & 0x0f {
        0 => 0,
        1..=3 => 4,
        4..=6 => 8,
        7..=9 => 16,
        10..=12 => 32,
        _ => 64,
    };
    // A multibyte integer (7 bits a byte, least significant first, at most 9 bytes).
    let varint = |at: &mut usize| -> Result<u64, String> {
        let mut v = 0u64;
        for i in 0..9 {
            let b = byte(*at)?;
            *at += 1;
            v |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err("bad xz integer".into())
    };
    let be16 = |at: usize| -> Result<u64, String> {
        Ok((u64::from(byte(at)?) << 8) | u64::from(byte(at + 1)?))
    };
    let mut total = 0u64;
    let mut at = 12;
    loop {
        let size_byte = byte(at)?;
        if size_byte == 0 {
            return Ok(total); // the index: no more blocks
        }
        let block = at;
        let header_len = (usize::from(size_byte) + 1) * 4;
        let flags = byte(at + 1)?;
        if flags & 0x03 != 0 || flags & 0x3c != 0 {
            return Err("an xz block with a filter other than LZMA2 alone".into());
        }
        let mut f = at + 2;
        if flags & 0x40 != 0 {
            varint(&mut f)?;
        }
        if flags & 0x80 != 0 {
            varint(&mut f)?;
        }
        if varint(&mut f)? != LZMA2 {
            return Err("an xz block with a filter other than LZMA2".into());
        }
        at = block + header_len;
        // LZMA2 chunks, up to the end marker.
        loop {
            let control = byte(at)?;
            at += 1;
            let (unpacked, skip) = match control {
                0 => break,
                1 | 2 => {
                    let n = be16(at)? + 1;
                    (n, 2 + n)
                }
                0x80..=0xff => {
                    let n = ((u64::from(control & 0x1f) << 16) | be16(at)?) + 1;
                    let packed = be16(at + 2)? + 1;
                    let props = u64::from((control >> 5) & 3 >= 2);
                    (n, 4 + props + packed)
                }
                _ => return Err(format!("bad LZMA2 chunk (control byte {control:#x})")),
            };
            total += unpacked;
            if total > limit {
                return Err(format!("decompresses to more than {limit} bytes"));
            }
            at = usize::try_from(skip)
                .ok()
                .and_then(|s| at.checked_add(s))
                .ok_or("truncated xz data")?;
        }
        // Padding to 4 bytes, then the check.
        at = at.next_multiple_of(4) + check_len;
        if at > xz.len() || at <= block {
            return Err("truncated xz data".into());
        }
    }
}

/// Decompresses xz data (MiniDebugInfo) of at most `limit` bytes once decompressed: the
/// size is read from the framing first ([`xz_unpacked_size`]), so that no more is ever
/// decoded than that; the decoder checks the block checks and the index.
pub(crate) fn unxz_bounded(xz: &[u8], limit: u64) -> Result<Vec<u8>, String> {
    let size = xz_unpacked_size(xz, limit)?;
    let mut out = Bounded {
        out: Vec::with_capacity(size as usize),
        room: size,
    };
    lzma_rs::xz_decompress(&mut std::io::BufReader::new(xz), &mut out)
        .map_err(|e| format!("xz: {e:?}"))?;
    Ok(out.out)
}

/// The bytes of an `SHF_COMPRESSED` section (`section`: its bytes in the file, an
/// `Elf64_Chdr` then the compressed data): zlib only (what `objcopy
/// --compress-debug-sections` writes by default and Debian's debug files have), at most
/// `limit` bytes, and exactly as many as the header says.
pub(crate) fn inflate_section(section: &[u8], limit: u64) -> Result<Vec<u8>, String> {
    const ELFCOMPRESS_ZLIB: u32 = 1;
    const CHDR_LEN: usize = 24;
    let header = section.get(..CHDR_LEN).ok_or("truncated section header")?;
    let kind = u32::from_le_bytes(header[0..4].try_into().unwrap_or_default());
    let size = u64::from_le_bytes(header[8..16].try_into().unwrap_or_default());
    if kind != ELFCOMPRESS_ZLIB {
        return Err(format!("compressed with kind {kind}, not zlib"));
    }
    if size > limit {
        return Err(format!("decompresses to {size} bytes, more than {limit}"));
    }
    let mut out = Vec::with_capacity(size as usize);
    flate2::read::ZlibDecoder::new(&section[CHDR_LEN..])
        .take(size + 1)
        .read_to_end(&mut out)
        .map_err(|e| format!("zlib: {e}"))?;
    if out.len() as u64 != size {
        return Err(format!("decompresses to {} bytes, not {size}", out.len()));
    }
    Ok(out)
}

/// Parses the ELF file MiniDebugInfo decompresses to.
pub(crate) fn mini_debuginfo(name: &str, xz: &[u8]) -> Result<Image, String> {
    let elf = unxz_bounded(xz, MAX_MINI_DEBUGINFO)?;
    Image::parse_debug_file(format!("{name} [.gnu_debugdata]"), Bytes::Owned(elf))
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The text [`XZ_OF_TEXT`] holds.
    fn text() -> Vec<u8> {
        (0..3000)
            .flat_map(|i| format!("line {} of a symbol table\n", i % 37).into_bytes())
            .collect()
    }

    /// `xz -9` of [`text`] (liblzma 5, as MiniDebugInfo is made): one block, LZMA2 chunks,
    /// CRC64.
    const XZ_OF_TEXT: &[u8] = &[
        0xfd, 0x37, 0x7a, 0x58, 0x5a, 0x00, 0x00, 0x04, 0xe6, 0xd6, 0xb4, 0x46, 0x02, 0x00, 0x21,
        0x01, 0x1c, 0x00, 0x00, 0x00, 0x10, 0xcf, 0x58, 0xcc, 0xe1, 0x2d, 0x82, 0x00, 0xb9, 0x5d,
        0x00, 0x36, 0x1a, 0x4a, 0x1f, 0x08, 0xa0, 0x26, 0x03, 0x4d, 0x06, 0x9d, 0xef, 0xed, 0x8c,
        0x69, 0xd3, 0xd6, 0x61, 0xa0, 0x75, 0xbd, 0x7a, 0xe5, 0x4d, 0x4f, 0x92, 0x0e, 0xff, 0x8a,
        0x5a, 0xb5, 0x74, 0x17, 0x50, 0xeb, 0x5f, 0x72, 0x27, 0x27, 0xf1, 0x40, 0xd6, 0xe1, 0x12,
        0xa0, 0x65, 0x3e, 0x92, 0x7e, 0xe4, 0xbe, 0xd1, 0xe7, 0xb8, 0xb5, 0x4f, 0x8b, 0xac, 0x7e,
        0xec, 0x03, 0xc5, 0x90, 0xb5, 0x6b, 0x28, 0x13, 0x39, 0x09, 0x3d, 0xd8, 0xd4, 0x27, 0x6f,
        0x8d, 0x78, 0x26, 0x4a, 0x48, 0x5e, 0xa9, 0x87, 0xc0, 0x20, 0x34, 0x60, 0xbd, 0xdf, 0x37,
        0x2c, 0x32, 0xfc, 0x65, 0x8d, 0x7d, 0x56, 0xa7, 0x27, 0xd6, 0x33, 0x5a, 0xee, 0x7c, 0x90,
        0xfe, 0xfb, 0xeb, 0xb9, 0x03, 0x5a, 0x84, 0xd2, 0x73, 0xfc, 0x71, 0xc4, 0xaa, 0x65, 0xfa,
        0x8e, 0xda, 0x20, 0xb8, 0x94, 0x10, 0x8f, 0x0f, 0x2c, 0x39, 0xf5, 0x59, 0xc3, 0x48, 0xb0,
        0xa2, 0xc8, 0x3b, 0x2d, 0xcd, 0x3f, 0x69, 0x08, 0xc5, 0x16, 0x99, 0x77, 0x61, 0xb2, 0xf1,
        0x6a, 0xcb, 0x9d, 0xde, 0xf3, 0x93, 0xc5, 0x99, 0x37, 0x26, 0x3c, 0x72, 0x8a, 0xdc, 0x4a,
        0xf8, 0x61, 0x40, 0x08, 0x7f, 0x42, 0xa8, 0x38, 0xb8, 0x00, 0xf3, 0xf7, 0x4e, 0xda, 0x1f,
        0xbd, 0xb6, 0xce, 0xd1, 0xd7, 0x00, 0x00, 0x00, 0x00, 0x00, 0xd3, 0x7f, 0x68, 0xe8, 0x0d,
        0x09, 0xf3, 0xca, 0x00, 0x01, 0xd5, 0x01, 0x83, 0xdb, 0x04, 0x00, 0xf1, 0x76, 0x9a, 0xa6,
        0xb1, 0xc4, 0x67, 0xfb, 0x02, 0x00, 0x00, 0x00, 0x00, 0x04, 0x59, 0x5a,
    ];

    #[test]
    fn xz_data_decompresses_within_its_bound_and_not_beyond() {
        let text = text();
        let xz = XZ_OF_TEXT;
        assert_eq!(xz_unpacked_size(xz, u64::MAX), Ok(text.len() as u64));
        assert_eq!(unxz_bounded(xz, text.len() as u64).unwrap(), text);
        // One byte short of what it declares: refused before anything is decoded.
        let refused = unxz_bounded(xz, text.len() as u64 - 1).unwrap_err();
        assert!(refused.contains("more than"), "{refused}");
        // Not xz, truncated, damaged (in the compressed data, then in the check).
        assert!(unxz_bounded(b"\x7fELF", 1 << 20).is_err());
        assert!(unxz_bounded(&xz[..xz.len() / 2], 1 << 20).is_err());
        for at in [xz.len() / 2, xz.len() - 40] {
            let mut bad = xz.to_vec();
            bad[at] ^= 0x55;
            assert!(unxz_bounded(&bad, 1 << 30).is_err(), "damage at {at}");
        }
    }

    #[test]
    fn a_tiny_xz_stream_that_declares_gigabytes_is_refused_unread() {
        // Stream header (no check), one block of LZMA2 alone whose chunks each declare the
        // most a chunk can (2 MiB) with a 1-byte body: 10,000 of them declare ~20 GiB in
        // 60 kB. Only the framing is read: the bodies are never decoded.
        let mut xz = b"\xfd7zXZ\0\0\0".to_vec();
        xz.extend_from_slice(&crc32fast::hash(&[0, 0]).to_le_bytes());
        let header = [2u8, 0x00, 0x21, 0x01, 0x16, 0, 0, 0];
        let crc = crc32fast::hash(&header);
        xz.extend_from_slice(&header);
        xz.extend_from_slice(&crc.to_le_bytes());
        for i in 0..10_000 {
            // Control 0xff (the first: resets everything, a properties byte follows) or
            // 0x9f (goes on), then 2 MiB unpacked, 1 byte packed.
            let control = if i == 0 { 0xffu8 } else { 0x9f };
            xz.extend_from_slice(&[control, 0xff, 0xff, 0, 0]);
            if i == 0 {
                xz.push(0x5d);
            }
            xz.push(0);
        }
        xz.push(0);
        let refused = xz_unpacked_size(&xz, MAX_MINI_DEBUGINFO).unwrap_err();
        assert!(refused.contains("more than"), "{refused}");
        assert!(unxz_bounded(&xz, MAX_MINI_DEBUGINFO).is_err());
    }

    #[test]
    fn compressed_sections_inflate_to_exactly_their_declared_size() {
        use std::io::Write;
        let text = b"a line table, in a manner of speaking ".repeat(1000);
        let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
        z.write_all(&text).unwrap();
        let body = z.finish().unwrap();
        let section = |kind: u32, size: u64| {
            let mut s = kind.to_le_bytes().to_vec();
            s.extend_from_slice(&[0; 4]);
            s.extend_from_slice(&size.to_le_bytes());
            s.extend_from_slice(&1u64.to_le_bytes());
            s.extend_from_slice(&body);
            s
        };
        let n = text.len() as u64;
        assert_eq!(inflate_section(&section(1, n), n).unwrap(), text);
        // Declares more than allowed; says less or more than it holds; zstd.
        assert!(inflate_section(&section(1, n), n - 1).is_err());
        assert!(inflate_section(&section(1, n - 1), n).is_err());
        assert!(inflate_section(&section(1, n + 1), n + 1).is_err());
        assert!(inflate_section(&section(2, n), n).is_err());
        assert!(inflate_section(&[1, 0, 0], n).is_err());
    }

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
        // Our own root is /: a path is ours, seen through /proc/PID/root.
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
