//! The bytes of a core file: mapped as they are, or decompressed first.
//!
//! Owns: telling the format by the file's first bytes (never by its name), decompressing
//! into a private temporary file that no other process can open (unlinked while open),
//! within a bound, and the read-only mapping of the result.
//! Formats:
//! - ELF (`7f 45 4c 46`): mapped as it is;
//! - gzip (`1f 8b`, flate2), several members in a row too;
//! - zstd (`28 b5 2f fd`, ruzstd), several frames in a row too (systemd-coredump's default);
//! - lz4 frames (`04 22 4d 18`, lz4_flex);
//! - xz (`fd 37 7a 58 5a 00`, lzma-rs).
//!
//! Must not: parse the ELF (`mod.rs` does), or keep a decompressed copy anywhere it
//! outlives the mapping.

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;

/// How a core file is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Format {
    Elf,
    Gzip,
    Zstd,
    Lz4,
    Xz,
}

impl Format {
    /// The name a message uses.
    pub(super) fn name(self) -> &'static str {
        match self {
            Format::Elf => "ELF",
            Format::Gzip => "gzip",
            Format::Zstd => "zstd",
            Format::Lz4 => "lz4",
            Format::Xz => "xz",
        }
    }
}

/// The format whose magic number `head` starts with.
pub(super) fn format_of(head: &[u8]) -> Option<Format> {
    let table: [(&[u8], Format); 5] = [
        (b"\x7fELF", Format::Elf),
        (&[0x1f, 0x8b], Format::Gzip),
        (&[0x28, 0xb5, 0x2f, 0xfd], Format::Zstd),
        (&[0x04, 0x22, 0x4d, 0x18], Format::Lz4),
        (&[0xfd, b'7', b'z', b'X', b'Z', 0x00], Format::Xz),
    ];
    table
        .iter()
        .find(|(magic, _)| head.starts_with(magic))
        .map(|&(_, f)| f)
}

/// Most bytes a compressed core may decompress to (64 GiB). It bounds the disk and the time
/// a damaged or hostile stream can take.
pub(super) const MAX_DECOMPRESSED: u64 = 64 << 30;

/// A core's bytes, mapped read-only, and how they were stored.
pub(super) struct CoreBytes {
    pub(super) map: memmap2::Mmap,
    pub(super) format: Format,
}

/// Opens the core at `path` and gives its bytes, decompressed when it is compressed. Err is
/// a message for [`crate::error::Error::BadCore`].
pub(super) fn open(path: &Path) -> Result<CoreBytes, String> {
    let mut file = File::open(path).map_err(|e| format!("cannot open it: {e}"))?;
    let mut head = [0u8; 6];
    let n = read_up_to(&mut file, &mut head).map_err(|e| format!("cannot read it: {e}"))?;
    let format = format_of(&head[..n]).ok_or_else(|| {
        if n == 0 {
            "it is empty".to_string()
        } else {
            "not a core file (neither ELF nor gzip, zstd, lz4 or xz data)".to_string()
        }
    })?;
    let file = match format {
        Format::Elf => file,
        compressed => {
            let file = File::open(path).map_err(|e| format!("cannot open it: {e}"))?;
            decompress(file, compressed, MAX_DECOMPRESSED)?
        }
    };
    // SAFETY: the mapping is read-only and private. A core handed to us is not rewritten
    // while we read it (if it were truncated meanwhile, a read of a lost page would fault,
    // which is the case we accept, as for the ELF files of a live process). A decompressed
    // core is our own unlinked file, which nobody else can open.
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| format!("cannot map it: {e}"))?;
    Ok(CoreBytes { map, format })
}

/// Fills `buf` as far as `r` has bytes, and returns the count read.
fn read_up_to(r: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// A temporary file of ours that no other process can open: `O_TMPFILE` in the temporary
/// directory (never linked), else a file made there and removed at once.
fn private_temp() -> Result<File, String> {
    use std::os::unix::fs::OpenOptionsExt;
    let dir = std::env::temp_dir();
    let tmpfile = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .mode(0o600)
        .custom_flags(libc::O_TMPFILE)
        .open(&dir);
    if let Ok(f) = tmpfile {
        return Ok(f);
    }
    let name = dir.join(format!(
        "scalene-rs-core-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    ));
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&name)
        .map_err(|e| format!("cannot make a temporary file in {}: {e}", dir.display()))?;
    let _ = std::fs::remove_file(&name);
    Ok(f)
}

/// A writer that refuses to grow past `room` bytes.
struct Bounded<W> {
    out: W,
    room: u64,
}

impl<W: Write> Write for Bounded<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if buf.len() as u64 > self.room {
            return Err(std::io::Error::other(format!(
                "it decompresses to more than {} GiB",
                MAX_DECOMPRESSED >> 30
            )));
        }
        let n = self.out.write(buf)?;
        self.room -= n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}

/// Decompresses `file` (of `format`) into a private temporary file, at most `limit`
/// bytes, and returns the file, at its start.
pub(super) fn decompress(file: File, format: Format, limit: u64) -> Result<File, String> {
    let out = private_temp()?;
    let mut sink = Bounded {
        out: std::io::BufWriter::with_capacity(1 << 20, &out),
        room: limit,
    };
    let mut input = BufReader::with_capacity(1 << 20, file);
    let what = format.name();
    let bad = |e: &dyn std::fmt::Display| format!("damaged {what} data: {e}");
    match format {
        Format::Elf => return Err("not compressed".into()),
        Format::Gzip => {
            let mut d = flate2::bufread::MultiGzDecoder::new(input);
            std::io::copy(&mut d, &mut sink).map_err(|e| bad(&e))?;
        }
        Format::Zstd => loop {
            // One frame after another, as `zstd` concatenates them.
            let mut d = ruzstd::decoding::StreamingDecoder::new(&mut input).map_err(|e| bad(&e))?;
            std::io::copy(&mut d, &mut sink).map_err(|e| bad(&e))?;
            if input.fill_buf().map_err(|e| bad(&e))?.is_empty() {
                break;
            }
        },
        Format::Lz4 => {
            let mut d = lz4_flex::frame::FrameDecoder::new(input);
            std::io::copy(&mut d, &mut sink).map_err(|e| bad(&e))?;
        }
        Format::Xz => {
            lzma_rs::xz_decompress(&mut input, &mut sink).map_err(|e| bad(&format!("{e:?}")))?;
        }
    }
    sink.flush().map_err(|e| bad(&e))?;
    drop(sink);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_by_magic() {
        assert_eq!(format_of(b"\x7fELF\x02\x01"), Some(Format::Elf));
        assert_eq!(format_of(&[0x1f, 0x8b, 8, 0]), Some(Format::Gzip));
        assert_eq!(format_of(&[0x28, 0xb5, 0x2f, 0xfd, 0]), Some(Format::Zstd));
        assert_eq!(format_of(&[0x04, 0x22, 0x4d, 0x18]), Some(Format::Lz4));
        assert_eq!(format_of(b"\xfd7zXZ\x00"), Some(Format::Xz));
        assert_eq!(format_of(b"#!/bin/sh"), None);
        assert_eq!(format_of(b""), None);
    }

    fn read_all(mut f: File) -> Vec<u8> {
        use std::io::Seek;
        f.seek(std::io::SeekFrom::Start(0)).unwrap();
        let mut v = Vec::new();
        f.read_to_end(&mut v).unwrap();
        v
    }

    fn temp_with(bytes: &[u8]) -> File {
        use std::io::Seek;
        let mut f = private_temp().unwrap();
        f.write_all(bytes).unwrap();
        f.seek(std::io::SeekFrom::Start(0)).unwrap();
        f
    }

    #[test]
    fn gzip_and_lz4_round_trip_and_bounds_hold() {
        let data: Vec<u8> = (0..200_000u32)
            .flat_map(|i| (i % 251).to_le_bytes())
            .collect();
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&data).unwrap();
        let gz = gz.finish().unwrap();
        let out = decompress(temp_with(&gz), Format::Gzip, 1 << 30).unwrap();
        assert_eq!(read_all(out), data);
        let mut lz = lz4_flex::frame::FrameEncoder::new(Vec::new());
        lz.write_all(&data).unwrap();
        let lz = lz.finish().unwrap();
        let out = decompress(temp_with(&lz), Format::Lz4, 1 << 30).unwrap();
        assert_eq!(read_all(out), data);
        // A bound below the size is an error, not a partial core.
        let e = decompress(temp_with(&gz), Format::Gzip, 1000).unwrap_err();
        assert!(e.contains("more than"), "{e}");
        // Damaged data is an error.
        let mut cut = gz.clone();
        cut.truncate(gz.len() / 2);
        assert!(decompress(temp_with(&cut), Format::Gzip, 1 << 30).is_err());
    }
}
