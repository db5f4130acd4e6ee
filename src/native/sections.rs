//! The contents of an image's debug sections, decoded, with no ELF parse of its own.
//!
//! - MiniDebugInfo: Fedora's `.gnu_debugdata` section, an xz-compressed ELF file holding
//!   the `.symtab` entries of the functions `.dynsym` lacks.
//! - Compressed debug sections (`SHF_COMPRESSED`), which separate debug files often have.
//!
//! Owns:
//! - bounded decompression of MiniDebugInfo, xz ([`unxz_bounded`]), read from its framing
//!   first ([`xz_unpacked_size`]);
//! - bounded decompression of `SHF_COMPRESSED` sections, zlib ([`inflate_section`]);
//! - the `.gnu_debuglink` record ([`parse_debuglink`]).
//!
//! Must not: parse ELF files (that is `image`) or look for files (that is `debuginfo`).

use std::io::Read;

/// Most bytes MiniDebugInfo may decompress to. Its `.symtab` holds only functions, some
/// tens of bytes each with their names, so a few MiB for the largest libraries. The xz
/// decoder keeps a block whole before handing it over, so the peak is twice this.
pub(crate) const MAX_MINI_DEBUGINFO: u64 = 128 << 20;

/// Most bytes one compressed debug section may decompress to (a section that says more
/// is left out, and the lines it would give with it).
pub(crate) const MAX_INFLATED_SECTION: u64 = 256 << 20;

/// The contents of a `.gnu_debuglink` section: the debug file's name (a file name, no
/// directory), NUL-terminated and padded to 4 bytes, then the CRC32 of the whole debug
/// file (little-endian, the only ELF files read here).
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
/// its framing without decoding anything. It is the sum of the sizes its LZMA2 chunks
/// declare (each chunk says how many bytes it holds, and a decoder stops there). Refuses
/// a stream whose blocks have any filter but LZMA2 alone, and one that declares more than
/// `limit`.
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

/// Decompresses xz data (MiniDebugInfo) of at most `limit` bytes once decompressed. The
/// size is read from the framing first ([`xz_unpacked_size`]), so that no more is ever
/// decoded than that. The decoder checks the block checks and the index.
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
/// `Elf64_Chdr` then the compressed data). Only zlib (what `objcopy
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
        // One byte short of what it declares, so refused before anything is decoded.
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
        // most a chunk can (2 MiB) with a 1-byte body. 10,000 of them declare ~20 GiB in
        // 60 kB. Only the framing is read, and the bodies are never decoded.
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
}
