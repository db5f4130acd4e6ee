//! ELF files of the target and where they are loaded.
//!
//! Owns:
//! - symbol lookup (`.dynsym` and `.symtab`);
//! - section lookup;
//! - the load bias of a file in a running process computed from /proc/PID/maps.
//!
//! Must not: read process memory.
//!
//! Glossary (used across the crate):
//! - *file offset*: a position in the ELF file.
//! - *SVMA* (stated virtual memory address): an address as written in the ELF file
//!   (`st_value`, `p_vaddr`, `sh_addr`).
//! - *AVMA* (actual virtual memory address): the address in the running process.
//! - *bias*: AVMA − SVMA for one loaded file (0 for a non-PIE executable).

pub(crate) mod maps;

use crate::error::{Error, Result};
use goblin::elf::program_header::PT_LOAD;
use std::collections::HashMap;
use std::path::Path;

/// The parts of one ELF file we use.
#[derive(Debug, Clone)]
pub(crate) struct ElfFile {
    /// Symbol name → SVMA, from `.dynsym` and `.symtab` (local symbols included).
    symbols: HashMap<String, (u64, u64)>,
    /// Section name → (SVMA, size, file offset).
    sections: HashMap<String, (u64, u64, u64)>,
    /// SVMA of the first PT_LOAD segment, rounded down to its page.
    first_load_svma: u64,
    /// File offset of the first PT_LOAD segment, rounded down to its page.
    first_load_offset: u64,
    /// The contents of read-only data, for version strings (only `.rodata`).
    rodata: Option<(u64, Vec<u8>)>,
}

const PAGE_MASK: u64 = !0xfff;

/// Symbols we look for. Keeping only these saves memory on large libraries.
fn wanted(name: &str) -> bool {
    // `version.0` (or `version.1234` from older compilers): Py_GetVersion's static buffer.
    if let Some(suffix) = name.strip_prefix("version.") {
        return suffix.bytes().all(|b| b.is_ascii_digit());
    }
    matches!(
        name,
        "_PyRuntime"
            | "Py_Version"
            | "interp_head"
            | "_PyThreadState_Current"
            // 2.7 and 3.6: the cycle collector's first list head (dump's greenlets).
            | "_PyGC_generation0"
            | "PyCode_Type"
            | "PyFrame_Type"
            | "PyUnicode_Type"
            | "PyString_Type"
            | "PyBytes_Type"
            | "Py_GetVersion"
            | "Py_Initialize"
            | "Py_Main"
            | "PyEval_EvalFrameEx"
            | "_PyEval_EvalFrameDefault"
            // python::process::INTERPRETER_CODE
            | "PyObject_Malloc"
            | "PyObject_Free"
            | "_Py_Dealloc"
            | "PyNumber_Add"
    )
}

impl ElfFile {
    /// Maps and parses an ELF file (mapped, not read, because libpython with debug info is
    /// tens of MB and we touch only its headers, symbol tables and .rodata).
    #[cfg(test)]
    fn open(path: &Path) -> Result<ElfFile> {
        let io = |e| Error::io(format!("reading {}", path.display()), e);
        let file = std::fs::File::open(path).map_err(io)?;
        Self::from_file(&file, path)
    }

    /// Maps and parses an ELF file that is already open; `path` names it in messages.
    pub(crate) fn from_file(file: &std::fs::File, path: &Path) -> Result<ElfFile> {
        let io = |e| Error::io(format!("reading {}", path.display()), e);
        // SAFETY: the mapping is read-only and private; if another process truncates the
        // file while we parse it, reads of the lost pages fault (SIGBUS). Interpreter
        // binaries are not rewritten in place while they run (installers replace them by
        // rename), which is the case we accept.
        let map = unsafe { memmap2::Mmap::map(file) }.map_err(io)?;
        Self::parse(path, &map)
    }

    /// Parses ELF bytes that were read from `path`.
    pub(crate) fn parse(path: &Path, data: &[u8]) -> Result<ElfFile> {
        let elf = goblin::elf::Elf::parse(data).map_err(|e| {
            Error::invalid_data(
                format!("parsing ELF file {}", path.display()),
                e.to_string(),
            )
        })?;
        let mut symbols = HashMap::new();
        for (syms, strtab) in [(&elf.dynsyms, &elf.dynstrtab), (&elf.syms, &elf.strtab)] {
            for sym in syms.iter() {
                if sym.st_value == 0 {
                    continue;
                }
                if let Some(name) = strtab.get_at(sym.st_name) {
                    if wanted(name) {
                        symbols
                            .entry(name.to_string())
                            .or_insert((sym.st_value, sym.st_size));
                    }
                }
            }
        }
        let mut sections = HashMap::new();
        let mut rodata = None;
        for sh in &elf.section_headers {
            if let Some(name) = elf.shdr_strtab.get_at(sh.sh_name) {
                sections.insert(name.to_string(), (sh.sh_addr, sh.sh_size, sh.sh_offset));
                if name == ".rodata" {
                    let start = sh.sh_offset as usize;
                    let end = start.saturating_add(sh.sh_size as usize);
                    if let Some(bytes) = data.get(start..end) {
                        rodata = Some((sh.sh_addr, bytes.to_vec()));
                    }
                }
            }
        }
        let first = elf
            .program_headers
            .iter()
            .filter(|p| p.p_type == PT_LOAD)
            .min_by_key(|p| p.p_vaddr)
            .ok_or_else(|| {
                Error::invalid_data(
                    format!("{} has no PT_LOAD segment", path.display()),
                    "not loadable",
                )
            })?;
        Ok(ElfFile {
            symbols,
            sections,
            first_load_svma: first.p_vaddr & PAGE_MASK,
            first_load_offset: first.p_offset & PAGE_MASK,
            rodata,
        })
    }

    /// The dynamic (exported) symbols among `names` of the ELF image `data`, by name, with
    /// their value relative to the image's load bias (its first PT_LOAD's page is at
    /// bias + that page's vaddr). They are for functions of a library to call in another
    /// process.
    pub(crate) fn exported(
        path: &Path,
        data: &[u8],
        names: &[&str],
    ) -> Result<HashMap<String, u64>> {
        let elf = goblin::elf::Elf::parse(data).map_err(|e| {
            Error::invalid_data(
                format!("parsing ELF file {}", path.display()),
                e.to_string(),
            )
        })?;
        let mut found = HashMap::new();
        for sym in elf.dynsyms.iter() {
            if sym.st_value == 0 || sym.st_shndx == 0 {
                continue;
            }
            if let Some(name) = elf.dynstrtab.get_at(sym.st_name) {
                if names.contains(&name) {
                    found.entry(name.to_string()).or_insert(sym.st_value);
                }
            }
        }
        Ok(found)
    }

    /// SVMA of the first symbol whose name starts with `prefix`.
    pub(crate) fn symbol_with_prefix(&self, prefix: &str) -> Option<u64> {
        let mut names: Vec<&String> = self
            .symbols
            .keys()
            .filter(|n| n.starts_with(prefix))
            .collect();
        names.sort();
        names.first().map(|n| self.symbols[*n].0)
    }

    /// SVMA of a symbol.
    pub(crate) fn symbol(&self, name: &str) -> Option<u64> {
        self.symbols.get(name).map(|s| s.0)
    }

    /// SVMA and size of a symbol.
    pub(crate) fn symbol_range(&self, name: &str) -> Option<(u64, u64)> {
        self.symbols.get(name).copied()
    }

    /// (SVMA, size) of a section.
    pub(crate) fn section(&self, name: &str) -> Option<(u64, u64)> {
        self.sections.get(name).map(|&(svma, size, _)| (svma, size))
    }

    /// File offset of a section.
    pub(crate) fn section_offset(&self, name: &str) -> Option<u64> {
        self.sections.get(name).map(|s| s.2)
    }

    /// An ELF file of one section (name, SVMA, size, file offset) whose first PT_LOAD
    /// segment is at SVMA and file offset 0.
    #[cfg(test)]
    pub(crate) fn with_section(name: &str, svma: u64, size: u64, offset: u64) -> ElfFile {
        ElfFile {
            symbols: HashMap::new(),
            sections: HashMap::from([(name.to_string(), (svma, size, offset))]),
            first_load_svma: 0,
            first_load_offset: 0,
            rodata: None,
        }
    }

    /// The NUL-terminated UTF-8 strings in `.rodata` whose length is in `len`, in order.
    pub(crate) fn rodata_strings(
        &self,
        len: std::ops::RangeInclusive<usize>,
    ) -> impl Iterator<Item = &str> + '_ {
        let bytes: &[u8] = self.rodata.as_ref().map_or(&[], |(_, b)| b);
        bytes
            .split(|&b| b == 0)
            .filter(move |s| len.contains(&s.len()))
            .filter_map(|s| std::str::from_utf8(s).ok())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_own_executable() {
        let exe = std::env::current_exe().unwrap();
        let elf = ElfFile::open(&exe).unwrap();
        assert!(elf.section(".text").is_some());
        assert_eq!(elf.first_load_svma & 0xfff, 0);
    }

    #[test]
    fn rejects_non_elf() {
        assert!(ElfFile::parse(Path::new("x"), b"not an elf file at all").is_err());
    }
}
