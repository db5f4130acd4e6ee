//! The code-object cache: decoded names and line tables of code objects, by address.
//!
//! Owns: [`CodeInfo`] and the reads that fill the cache. An entry is revalidated by a
//! fingerprint of the fields it came from.
//! Must not: decode frames (the walk does).

use super::{torn, StackWalker};
use crate::error::Result;
use crate::ptrace::{field_u32, field_u64, ProcessMemory};
use crate::python::linetable::LineTable;
use crate::python::strings;
use std::sync::Arc;

/// Decoded facts about one code object.
#[derive(Debug)]
pub(super) struct CodeInfo {
    pub(super) function: crate::python::frame::Name,
    pub(super) filename: crate::python::frame::Name,
    pub(super) firstlineno: u32,
    pub(super) table: LineTable,
    /// AVMA of the first bytecode byte (3.11+: `co_code_adaptive`; ≤3.10: the payload of
    /// `co_code`); 0 when unknown.
    pub(super) bytecode: u64,
    /// Length of the bytecode in bytes (≤3.10; `u32::MAX` when not known up front).
    pub(super) bytecode_len: u32,
    /// 3.11/3.12: `_co_firsttraceable` in code units.
    pub(super) firsttraceable: Option<u32>,
    /// `co_flags` (0 when the layout does not know where they are).
    flags: u32,
    /// Pointer fields this was decoded from. A changed fingerprint means a new object.
    fingerprint: [u64; 4],
}

/// Most code objects the cache holds (it starts afresh past this).
const CODE_CACHE_LIMIT: usize = 100_000;

impl StackWalker {
    /// Whether the code object at `code_addr` (already cached by the walk) is a generator,
    /// coroutine or async generator. Such a frame is always entered from a Python frame, so
    /// a chain that ends there was cut by a concurrent change.
    pub(super) fn outermost_is_generator(&self, code_addr: u64) -> bool {
        const CO_GENERATOR: u32 = 0x20;
        const CO_COROUTINE: u32 = 0x80;
        const CO_ASYNC_GENERATOR: u32 = 0x200;
        self.code_cache
            .get(&(code_addr & !7))
            .is_some_and(|c| c.flags & (CO_GENERATOR | CO_COROUTINE | CO_ASYNC_GENERATOR) != 0)
    }

    /// Decoded code object at `addr`, from the cache when its fingerprint still matches.
    fn code(&mut self, mem: &dyn ProcessMemory, addr: u64) -> Result<Arc<CodeInfo>> {
        self.code_or_none(mem, addr)?
            .ok_or_else(|| torn(addr, "not a code object"))
    }

    /// [`StackWalker::code`], or the cached object without reading it when `trust_cache`.
    pub(super) fn code_maybe_cached(
        &mut self,
        mem: &dyn ProcessMemory,
        addr: u64,
        trust_cache: bool,
    ) -> Result<Arc<CodeInfo>> {
        if trust_cache {
            if let Some(c) = self.code_cache.get(&addr) {
                return Ok(c.clone());
            }
        }
        self.code(mem, addr)
    }

    /// Like [`StackWalker::code`], but `None` when the object's type is not `code`.
    pub(super) fn code_or_none(
        &mut self,
        mem: &dyn ProcessMemory,
        addr: u64,
    ) -> Result<Option<Arc<CodeInfo>>> {
        if addr == 0 {
            return Err(torn(addr, "NULL code object"));
        }
        if self.validated.contains(&addr) {
            if let Some(hit) = self.code_cache.get(&addr) {
                return Ok(Some(hit.clone()));
            }
        }
        let c = self.layout.code;
        // The header of a code object is small, so read it into the stack when it fits.
        let mut small = [0u8; 512];
        let mut large = Vec::new();
        let buf: &mut [u8] = if c.size <= small.len() {
            &mut small[..c.size]
        } else {
            large.resize(c.size, 0);
            &mut large
        };
        mem.read(addr, buf)?;
        let buf: &[u8] = buf;
        if self.types.code != 0 && field_u64(buf, self.layout.string.ob_type) != self.types.code {
            return Ok(None);
        }
        let name_ptr = c
            .qualname
            .map(|o| field_u64(buf, o))
            .filter(|&p| p != 0)
            .unwrap_or_else(|| field_u64(buf, c.name));
        let fingerprint = [
            name_ptr,
            field_u64(buf, c.filename),
            field_u64(buf, c.linetable),
            field_u32(buf, c.firstlineno) as u64,
        ];
        if let Some(hit) = self.code_cache.get(&addr) {
            if hit.fingerprint == fingerprint {
                if self.validated.len() < 64 {
                    self.validated.push(addr);
                }
                return Ok(Some(hit.clone()));
            }
        }
        let s = &self.layout.string;
        let function = strings::read_text(mem, s, &self.types, fingerprint[0])?;
        let filename = strings::read_text(mem, s, &self.types, fingerprint[1])?;
        let table_bytes = strings::read_bytes(mem, s, &self.types, fingerprint[2])?;
        // ≤3.10: the bytecode is a separate bytes object. Note where its payload starts.
        let (bytecode, bytecode_len) = match (c.code_adaptive, c.co_code) {
            (Some(o), _) => (addr.wrapping_add(o as u64), u32::MAX),
            (None, Some(o)) => {
                let obj = field_u64(buf, o);
                match (obj != 0).then(|| mem.read_u64(obj.wrapping_add(s.bytes_size as u64))) {
                    Some(Ok(len)) if len <= strings::MAX_BYTES => {
                        (obj.wrapping_add(s.bytes_sval as u64), len as u32)
                    }
                    _ => (0, 0),
                }
            }
            (None, None) => (0, 0),
        };
        let firstlineno = fingerprint[3] as u32;
        // 0 is real (3.13's generated __init__ cleanup shim has no source line).
        if (firstlineno as i32) < 0 {
            return Err(torn(addr, "code object with a negative first line"));
        }
        let info = Arc::new(CodeInfo {
            table: LineTable::decode(c.linetable_format, &table_bytes, firstlineno),
            function: function.into(),
            filename: filename.into(),
            firstlineno,
            bytecode,
            bytecode_len,
            firsttraceable: c.firsttraceable.map(|o| field_u32(buf, o)),
            flags: if c.flags == usize::MAX {
                0
            } else {
                field_u32(buf, c.flags)
            },
            fingerprint,
        });
        if self.code_cache.len() >= CODE_CACHE_LIMIT {
            self.code_cache.clear();
        }
        self.code_cache.insert(addr, info.clone());
        Ok(Some(info))
    }
}
