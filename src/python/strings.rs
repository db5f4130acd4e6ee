//! Reading `str` / `bytes` objects out of the target.
//!
//! Owns: decoding PEP 393 unicode objects (1-, 2- and 4-byte kinds, compact and legacy),
//! Python 2 `str` objects, and `bytes` payloads, with size limits so that a torn or hostile
//! object cannot make us read gigabytes.

use crate::error::{Error, Result};
use crate::ptrace::{field_u32, field_u64, ProcessMemory};
use crate::python_bindings::{StringLayout, StringModel};

/// Longest name or file name we read (in characters).
const MAX_STRING_CHARS: u64 = 16 * 1024;
/// Largest bytes object we read (line tables of huge modules stay well below this).
pub(crate) const MAX_BYTES: u64 = 16 * 1024 * 1024;

fn bad(addr: u64, why: &'static str) -> Error {
    Error::Inconsistent { addr, why }
}

/// A C string of the target at `at` (a type's `tp_name`, say), of at most `N` bytes. It is cut
/// there when it is longer or has no NUL, and cut where the readable memory ends.
pub(crate) fn read_c_str<const N: usize>(mem: &dyn ProcessMemory, at: u64) -> Result<String> {
    let mut buf = [0u8; N];
    let n = mem.read_prefix(at, &mut buf)?;
    let end = buf[..n].iter().position(|&b| b == 0).unwrap_or(n);
    Ok(String::from_utf8_lossy(&buf[..end]).into_owned())
}

/// Type objects used to validate what we read; 0 = unknown (not checked).
#[derive(Debug, Clone, Copy, Default)]
pub struct TypeAddrs {
    pub(crate) code: u64,
    pub(crate) frame: u64,
    pub(crate) unicode: u64,
    pub(crate) bytes: u64,
    /// `dict`, `module` and `int` (2.7: `PyInt_Type`), for the object reader.
    pub(crate) dict: u64,
    pub(crate) module: u64,
    pub(crate) int: u64,
}

fn check_type(
    mem: &dyn ProcessMemory,
    layout: &StringLayout,
    addr: u64,
    want: u64,
    what: &'static str,
) -> Result<()> {
    if want == 0 {
        return Ok(());
    }
    let ty = mem.read_u64(addr.wrapping_add(layout.ob_type as u64))?;
    if ty != want {
        return Err(bad(addr, what));
    }
    Ok(())
}

/// Reads a text object: `str` (PEP 393) on Python 3, `str` (bytes) on Python 2.
pub(crate) fn read_text(
    mem: &dyn ProcessMemory,
    layout: &StringLayout,
    types: &TypeAddrs,
    addr: u64,
) -> Result<String> {
    if addr == 0 {
        return Err(bad(addr, "NULL string pointer"));
    }
    match layout.model {
        StringModel::Bytes2 => {
            let raw = read_bytes(mem, layout, types, addr)?;
            Ok(String::from_utf8_lossy(&raw).into_owned())
        }
        StringModel::Pep393 => read_unicode(mem, layout, types, addr),
    }
}

fn read_unicode(
    mem: &dyn ProcessMemory,
    layout: &StringLayout,
    types: &TypeAddrs,
    addr: u64,
) -> Result<String> {
    // Only the PyASCIIObject header, because a short compact string may end right after it.
    let header = mem.read_vec(addr, layout.ascii_size)?;
    if types.unicode != 0 && field_u64(&header, layout.ob_type) != types.unicode {
        return Err(bad(addr, "not a str"));
    }
    let length = field_u64(&header, layout.unicode_length);
    if length > MAX_STRING_CHARS {
        return Err(bad(
            addr,
            "a string too long to be a name (over 16,384 characters)",
        ));
    }
    let state = field_u32(&header, layout.unicode_state);
    let kind = (state >> layout.state_kind_shift) & 7;
    let compact = (state >> layout.state_compact_shift) & 1 == 1;
    let ascii = (state >> layout.state_ascii_shift) & 1 == 1;
    let width = match kind {
        1 | 2 | 4 => kind as u64,
        // Kind 0 is a legacy string not made "ready"; code objects never hold those.
        _ => {
            return Err(bad(
                addr,
                "a string of a kind not readable (not made ready)",
            ))
        }
    };
    if ascii && width != 1 {
        return Err(bad(addr, "ASCII string with a wide kind"));
    }
    let data = if compact {
        addr.wrapping_add(if ascii {
            layout.ascii_size as u64
        } else {
            layout.compact_size as u64
        })
    } else {
        mem.read_u64(addr.wrapping_add(layout.unicode_data_any as u64))?
    };
    let raw = mem.read_vec(data, (length * width) as usize)?;
    Ok(match width {
        1 => raw.iter().map(|&b| b as char).collect(),
        2 => raw
            .chunks_exact(2)
            .map(|c| {
                char::from_u32(u16::from_le_bytes([c[0], c[1]]) as u32)
                    .unwrap_or(char::REPLACEMENT_CHARACTER)
            })
            .collect(),
        _ => raw
            .chunks_exact(4)
            .map(|c| {
                char::from_u32(u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .unwrap_or(char::REPLACEMENT_CHARACTER)
            })
            .collect(),
    })
}

/// Reads the payload of a `bytes` object (Python 2: `str`).
pub(crate) fn read_bytes(
    mem: &dyn ProcessMemory,
    layout: &StringLayout,
    types: &TypeAddrs,
    addr: u64,
) -> Result<Vec<u8>> {
    if addr == 0 {
        return Err(bad(addr, "NULL bytes pointer"));
    }
    check_type(mem, layout, addr, types.bytes, "not a bytes object")?;
    let size = mem.read_u64(addr.wrapping_add(layout.bytes_size as u64))?;
    if size > MAX_BYTES {
        return Err(bad(
            addr,
            "a bytes object too large to be a line table (over 16 MiB)",
        ));
    }
    mem.read_vec(addr.wrapping_add(layout.bytes_sval as u64), size as usize)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ptrace::BufferMemory;

    fn layout() -> StringLayout {
        StringLayout {
            model: StringModel::Pep393,
            ob_type: 8,
            bytes_size: 16,
            bytes_sval: 32,
            unicode_length: 16,
            unicode_state: 32,
            ascii_size: 40,
            compact_size: 56,
            unicode_data_any: 56,
            state_kind_shift: 2,
            state_compact_shift: 5,
            state_ascii_shift: 6,
        }
    }

    fn unicode(text: &str, kind: u32) -> Vec<u8> {
        let l = layout();
        let ascii = text.is_ascii() && kind == 1;
        let mut b = vec![0u8; if ascii { l.ascii_size } else { l.compact_size }];
        b[8..16].copy_from_slice(&0x5000u64.to_le_bytes());
        let n = text.chars().count() as u64;
        b[16..24].copy_from_slice(&n.to_le_bytes());
        let state = (kind << 2) | (1 << 5) | ((ascii as u32) << 6);
        b[32..36].copy_from_slice(&state.to_le_bytes());
        for c in text.chars() {
            let v = c as u32;
            match kind {
                1 => b.push(v as u8),
                2 => b.extend_from_slice(&(v as u16).to_le_bytes()),
                _ => b.extend_from_slice(&v.to_le_bytes()),
            }
        }
        b
    }

    #[test]
    fn decodes_every_kind() {
        let types = TypeAddrs {
            unicode: 0x5000,
            ..Default::default()
        };
        for (text, kind) in [("hello", 1), ("café", 1), ("中文ж", 2), ("𝔘x😀", 4)] {
            let mem = BufferMemory {
                base: 0x1000,
                bytes: unicode(text, kind),
            };
            assert_eq!(read_text(&mem, &layout(), &types, 0x1000).unwrap(), text);
        }
    }

    #[test]
    fn rejects_wrong_type_and_huge_lengths() {
        let mut bytes = unicode("abc", 1);
        let types = TypeAddrs {
            unicode: 0x6000,
            ..Default::default()
        };
        let mem = BufferMemory {
            base: 0x1000,
            bytes: bytes.clone(),
        };
        assert!(read_text(&mem, &layout(), &types, 0x1000).is_err());
        bytes[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
        let mem = BufferMemory {
            base: 0x1000,
            bytes,
        };
        assert!(read_text(&mem, &layout(), &TypeAddrs::default(), 0x1000).is_err());
    }
}
