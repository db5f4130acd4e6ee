//! The ELF structures of a loaded object, read in place from what `dl_iterate_phdr` gives:
//! program headers, the dynamic section's entries, relocations and symbols.
//!
//! Owns: [`Object`] (one loaded object: its base, name and program headers) and the
//! constants and record layouts the attach's patching reads.
//! Must not: write anything (patching is `attach`'s), allocate or lock, because
//! `mallocstats` reads objects from inside the program's malloc.

use core::ffi::CStr;
use core::sync::atomic::{AtomicUsize, Ordering};

pub(crate) const PT_LOAD: u32 = 1;
pub(crate) const PT_DYNAMIC: u32 = 2;
pub(crate) const PT_GNU_RELRO: u32 = 0x6474_e552;
pub(crate) const DT_NULL: i64 = 0;
pub(crate) const DT_PLTRELSZ: i64 = 2;
pub(crate) const DT_STRTAB: i64 = 5;
pub(crate) const DT_SYMTAB: i64 = 6;
pub(crate) const DT_RELA: i64 = 7;
pub(crate) const DT_RELASZ: i64 = 8;
pub(crate) const DT_STRSZ: i64 = 10;
pub(crate) const DT_JMPREL: i64 = 23;
#[cfg(target_arch = "x86_64")]
pub(crate) const R_JUMP_SLOT: u32 = 7;
#[cfg(target_arch = "x86_64")]
pub(crate) const R_GLOB_DAT: u32 = 6;
#[cfg(target_arch = "aarch64")]
pub(crate) const R_JUMP_SLOT: u32 = 1026;
#[cfg(target_arch = "aarch64")]
pub(crate) const R_GLOB_DAT: u32 = 1025;

#[repr(C)]
pub(crate) struct Dyn {
    pub(crate) tag: i64,
    pub(crate) val: u64,
}

#[repr(C)]
pub(crate) struct Rela {
    pub(crate) offset: u64,
    pub(crate) info: u64,
    pub(crate) _addend: i64,
}

#[repr(C)]
pub(crate) struct Sym {
    pub(crate) name: u32,
    pub(crate) _info: u8,
    pub(crate) _other: u8,
    pub(crate) _shndx: u16,
    pub(crate) _value: u64,
    pub(crate) _size: u64,
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Libc,
    Loader,
    Vdso,
    Other,
}

/// One loaded object as dl_iterate_phdr describes it.
pub(crate) struct Object<'a> {
    pub(crate) base: usize,
    pub(crate) name: &'a [u8],
    pub(crate) phdrs: &'a [libc::Elf64_Phdr],
}

impl<'a> Object<'a> {
    pub(crate) fn of(info: &'a libc::dl_phdr_info) -> Object<'a> {
        let name = if info.dlpi_name.is_null() {
            &[][..]
        } else {
            // SAFETY: the dynamic linker's NUL-terminated name of the object.
            unsafe { CStr::from_ptr(info.dlpi_name) }.to_bytes()
        };
        let phdrs = if info.dlpi_phdr.is_null() {
            &[][..]
        } else {
            // SAFETY: the object's program headers, `dlpi_phnum` of them, mapped.
            unsafe { core::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum as usize) }
        };
        Object {
            base: info.dlpi_addr as usize,
            name,
            phdrs,
        }
    }

    pub(crate) fn contains(&self, addr: usize) -> bool {
        self.phdrs.iter().any(|p| {
            p.p_type == PT_LOAD
                && addr.wrapping_sub(self.base + p.p_vaddr as usize) < p.p_memsz as usize
        })
    }

    pub(crate) fn kind(&self) -> Kind {
        let base = self.name.rsplit(|&c| c == b'/').next().unwrap_or(self.name);
        if base.starts_with(b"libc.so")
            || base.starts_with(b"libc-2.")
            || base.starts_with(b"ld-musl")
        {
            Kind::Libc
        } else if base.starts_with(b"ld-linux")
            || base.starts_with(b"ld.so")
            || base.starts_with(b"ld64.so")
        {
            Kind::Loader
        } else if base.starts_with(b"linux-vdso") || base.starts_with(b"linux-gate") {
            Kind::Vdso
        } else {
            Kind::Other
        }
    }

    /// The object's `[lo, hi)` that the dynamic linker made read-only after relocation,
    /// whole pages only (as it does). (0, 0) when none.
    pub(crate) fn relro(&self) -> (usize, usize) {
        let page = page_size();
        self.phdrs
            .iter()
            .find(|p| p.p_type == PT_GNU_RELRO)
            .map_or((0, 0), |p| {
                let lo = (self.base + p.p_vaddr as usize) & !(page - 1);
                let hi = (self.base + (p.p_vaddr + p.p_memsz) as usize) & !(page - 1);
                (lo, hi)
            })
    }
}

pub(crate) fn page_size() -> usize {
    static PAGE: AtomicUsize = AtomicUsize::new(0);
    let p = PAGE.load(Ordering::Relaxed);
    if p != 0 {
        return p;
    }
    // SAFETY: sysconf has no preconditions.
    let p = match unsafe { libc::sysconf(libc::_SC_PAGESIZE) } {
        n if n > 0 && (n as usize).is_power_of_two() => n as usize,
        _ => 4096,
    };
    PAGE.store(p, Ordering::Relaxed);
    p
}
