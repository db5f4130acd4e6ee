//! One ELF image (a shared library, an executable, the vDSO) as the unwinder and the
//! symbolizer need it.
//!
//! Owns: [`Image`], which holds:
//! - the file's bytes, mapped (or, for the vDSO, copied from the target's memory);
//! - its GNU build id;
//! - the sections that hold unwind rules (`.eh_frame_hdr`, `.eh_frame`, `.debug_frame`,
//!   `.text`, `.got`), as SVMA ranges and file ranges;
//! - its symbols, parsed the first time a name is asked for ([`Image::symbols`]);
//! - its DWARF line tables ([`Image::line`]). They are made through addr2line the first
//!   time a line is asked for, over the mapped sections. Nothing is copied but compressed
//!   sections. Only the units asked about are decoded.
//!
//! Symbols come from these:
//! - the file's `.symtab` and `.dynsym`;
//! - its separate debug file's `.symtab`, attached by `native::modules`
//!   ([`Image::set_debug_file`]);
//! - when neither has a `.symtab`, its MiniDebugInfo (`.gnu_debugdata`, decompressed then).
//!
//! Lines come from its own DWARF, else from its debug file's.
//!
//! It also owns the build id of an image read from the target's memory
//! ([`build_id_in_memory`]). That id says whether the file on disk is the one that was
//! loaded.
//!
//! Must not:
//! - open files by path (the caller hands it an open file, found by `native::modules` as
//!   the target sees it);
//! - know about processes beyond the one memory read above.

use super::sections;
use super::symbols::{Found, Symbols, Tables};
use crate::error::{Error, Result};
use crate::ptrace::ProcessMemory;
use goblin::container::{Container, Ctx, Endian};
use goblin::elf::header::{Header, EM_X86_64, ET_DYN, ET_EXEC};
use goblin::elf::program_header::{ProgramHeader, PT_LOAD, PT_NOTE};
use goblin::elf::section_header::{SectionHeader, SHT_NOBITS};
use std::ops::Range;
use std::path::Path;
use std::sync::{Arc, OnceLock};

/// The bytes of an image: a read-only mapping of its file, or a copy.
pub(crate) enum Bytes {
    Mapped(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl std::ops::Deref for Bytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Bytes::Mapped(m) => m,
            Bytes::Owned(v) => v,
        }
    }
}

/// A section's bytes, shared with the image they come from (what the unwinder and the
/// line tables keep).
#[derive(Clone)]
pub(crate) struct SectionBytes {
    bytes: Arc<Bytes>,
    range: Range<usize>,
}

impl std::ops::Deref for SectionBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.bytes[self.range.clone()]
    }
}

impl std::fmt::Debug for SectionBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SectionBytes({:?})", self.range)
    }
}

// SAFETY: `deref` points into the mapping or vector behind the `Arc`, which neither moves
// nor changes while any `SectionBytes` holds it. Moving a `SectionBytes` moves only the
// `Arc` pointer and the range.
unsafe impl stable_deref_trait::StableDeref for SectionBytes {}
// SAFETY: a clone shares the same `Arc` and range, so it derefs to the same address.
unsafe impl stable_deref_trait::CloneStableDeref for SectionBytes {}

/// What DWARF is read through: sections shared with their image, never copied.
type DwarfReader = gimli::EndianReader<gimli::LittleEndian, SectionBytes>;

/// A source position: file and line.
pub(crate) type SourceLine = (Arc<str>, u32);

/// A section: where the ELF says it is loaded (SVMA) and where its bytes are in the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Section {
    pub(crate) svma: Range<u64>,
    file: Range<usize>,
}

/// The sections the unwinder reads.
#[derive(Debug, Clone, Default)]
pub(crate) struct UnwindSections {
    pub(crate) text: Option<Section>,
    pub(crate) eh_frame: Option<Section>,
    pub(crate) eh_frame_hdr: Option<Section>,
    pub(crate) debug_frame: Option<Section>,
    pub(crate) got: Option<Section>,
}

/// A GNU build id (the bytes of the NT_GNU_BUILD_ID note).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct BuildId(pub(crate) Vec<u8>);

impl std::fmt::Display for BuildId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for b in &self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

/// A `.debug_*` section of an image.
struct DebugSection {
    name: String,
    /// Its bytes in the file.
    file: Range<usize>,
    /// `SHF_COMPRESSED`: the bytes are an `Elf64_Chdr` and compressed data.
    compressed: bool,
}

/// The symbols of an image and of what goes with it (its debug file, its MiniDebugInfo).
struct SymbolTable {
    symbols: Symbols,
    /// The bytes each [`Found::source`] names: the image's own, then the others'.
    sources: Vec<Arc<Bytes>>,
}

/// One parsed ELF image.
pub(crate) struct Image {
    name: String,
    bytes: Arc<Bytes>,
    pub(crate) build_id: Option<BuildId>,
    /// SVMA and file offset of the first PT_LOAD segment, rounded down to its page. The
    /// mapping of that file offset in the target gives the load bias.
    pub(crate) first_load_svma: u64,
    pub(crate) first_load_offset: u64,
    pub(crate) sections: UnwindSections,
    /// `.symtab` and `.dynsym` as (file range of the table, file range of its strings).
    tables: Tables,
    /// Whether `tables` has a `.symtab` (the first of them then).
    has_symtab: bool,
    symbols: OnceLock<SymbolTable>,
    /// The `.debug_*` sections.
    debug: Vec<DebugSection>,
    /// The line tables, made on first use (None: no usable DWARF). They are behind a lock so
    /// that an image can be shared, because addr2line fills its caches as it is asked.
    lines: OnceLock<Option<std::sync::Mutex<addr2line::Context<DwarfReader>>>>,
    /// `.gnu_debugdata` (MiniDebugInfo), xz-compressed: its file range.
    mini_debuginfo: Option<Range<usize>>,
    /// `.gnu_debuglink`: the name of the separate debug file and its CRC32.
    pub(crate) debuglink: Option<(String, u32)>,
    /// The separate debug file, when one was found ([`Image::set_debug_file`]).
    debug_file: Option<Box<Image>>,
}

/// Little-endian 64-bit ELF, the only kind this profiler reads.
fn ctx() -> Ctx {
    Ctx::new(Container::Big, Endian::Little)
}

const PAGE_MASK: u64 = !0xfff;

fn bad(name: &str, why: impl Into<String>) -> Error {
    Error::invalid_data(format!("parsing ELF file {name}"), why)
}

impl Image {
    /// Maps an open file (read-only, private) and parses its headers.
    pub(crate) fn from_file(file: &std::fs::File, name: &Path) -> Result<Image> {
        // SAFETY: a read-only private mapping. A file changed in place while mapped could
        // show other bytes or fault (SIGBUS) on a truncated page. Libraries and executables
        // are replaced by rename, not rewritten, which is the case accepted here (as in
        // `elf::ElfFile::from_file`). The build id check in `native::modules` catches a
        // file that is not the one loaded.
        let map = unsafe { memmap2::Mmap::map(file) }
            .map_err(|e| Error::io(format!("mapping {}", name.display()), e))?;
        Image::parse(name.display().to_string(), Bytes::Mapped(map))
    }

    /// Maps and parses a separate debug file (see [`Image::parse_debug_file`]).
    pub(crate) fn debug_file_from(file: &std::fs::File, name: &Path) -> Result<Image> {
        // SAFETY: as in `from_file`, a read-only private mapping of a file that is replaced,
        // not rewritten. The build id or CRC32 check in `native::debuginfo` catches one that
        // is not the module's.
        let map = unsafe { memmap2::Mmap::map(file) }
            .map_err(|e| Error::io(format!("mapping {}", name.display()), e))?;
        Image::parse_debug_file(name.display().to_string(), Bytes::Mapped(map))
    }

    /// Parses an image from bytes (the vDSO, copied from the target's memory; tests).
    pub(crate) fn parse(name: String, bytes: Bytes) -> Result<Image> {
        Image::parse_as(name, bytes, false)
    }

    /// Parses a file that only goes with an image (a separate debug file or the ELF file
    /// MiniDebugInfo holds). Only its symbols, DWARF and build id are read, and it need not
    /// have a loadable segment.
    pub(crate) fn parse_debug_file(name: String, bytes: Bytes) -> Result<Image> {
        Image::parse_as(name, bytes, true)
    }

    fn parse_as(name: String, bytes: Bytes, debug_only: bool) -> Result<Image> {
        let data: &[u8] = &bytes;
        let header = goblin::elf::Elf::parse_header(data).map_err(|e| bad(&name, e.to_string()))?;
        if header.e_ident[goblin::elf::header::EI_CLASS] != goblin::elf::header::ELFCLASS64
            || header.e_ident[goblin::elf::header::EI_DATA] != goblin::elf::header::ELFDATA2LSB
            || header.e_machine != EM_X86_64
            || !matches!(header.e_type, ET_DYN | ET_EXEC)
        {
            return Err(bad(&name, "not an x86-64 executable or shared library"));
        }
        let phdrs = ProgramHeader::parse(
            data,
            header.e_phoff as usize,
            header.e_phnum as usize,
            ctx(),
        )
        .map_err(|e| bad(&name, e.to_string()))?;
        let first = phdrs
            .iter()
            .filter(|p| p.p_type == PT_LOAD)
            .min_by_key(|p| p.p_vaddr);
        let (first_load_svma, first_load_offset) = match first {
            Some(first) => (first.p_vaddr & PAGE_MASK, first.p_offset & PAGE_MASK),
            None if debug_only => (0, 0),
            None => return Err(bad(&name, "no PT_LOAD segment")),
        };
        let mut build_id = phdrs.iter().filter(|p| p.p_type == PT_NOTE).find_map(|p| {
            let start = p.p_offset as usize;
            data.get(start..start.checked_add(p.p_filesz as usize)?)
                .and_then(build_id_in_notes)
        });
        // Section headers are absent from the vDSO of some kernels and from stripped-to-the-
        // bone files. The unwinder then has no rules (frame pointers only), and no symbols.
        let shdrs = if header.e_shoff != 0 && header.e_shnum != 0 {
            SectionHeader::parse(
                data,
                header.e_shoff as usize,
                header.e_shnum as usize,
                ctx(),
            )
            .unwrap_or_default()
        } else {
            Vec::new()
        };
        let shstr = shdrs
            .get(header.e_shstrndx as usize)
            .and_then(|s| file_range(data, s));
        let name_of = |sh: &SectionHeader| -> Option<&[u8]> {
            let strs = &data[shstr.clone()?];
            let rest = strs.get(sh.sh_name..)?;
            Some(&rest[..rest.iter().position(|&b| b == 0)?])
        };
        let mut sections = UnwindSections::default();
        let mut tables = Vec::new();
        let mut has_symtab = false;
        let mut debug = Vec::new();
        let (mut mini_debuginfo, mut debuglink) = (None, None);
        for sh in &shdrs {
            let Some(n) = name_of(sh) else { continue };
            const SHF_COMPRESSED: u64 = 0x800;
            if n.starts_with(b".debug_") {
                if let (Ok(name), Some(file)) = (std::str::from_utf8(n), file_range(data, sh)) {
                    debug.push(DebugSection {
                        name: name.to_string(),
                        file,
                        compressed: sh.sh_flags & SHF_COMPRESSED != 0,
                    });
                }
            }
            let section = || {
                Some(Section {
                    svma: sh.sh_addr..sh.sh_addr.checked_add(sh.sh_size)?,
                    file: if sh.sh_type == SHT_NOBITS {
                        0..0
                    } else {
                        file_range(data, sh)?
                    },
                })
            };
            match n {
                b".text" => sections.text = section(),
                b".eh_frame" => sections.eh_frame = section(),
                b".eh_frame_hdr" => sections.eh_frame_hdr = section(),
                b".debug_frame" => sections.debug_frame = section(),
                b".got" => sections.got = section(),
                b".gnu_debugdata" => mini_debuginfo = file_range(data, sh),
                b".gnu_debuglink" => {
                    debuglink =
                        file_range(data, sh).and_then(|r| sections::parse_debuglink(&data[r]));
                }
                // A debug file's notes may lie outside any PT_NOTE segment's file bytes.
                b".note.gnu.build-id" if build_id.is_none() => {
                    build_id = file_range(data, sh).and_then(|r| build_id_in_notes(&data[r]));
                }
                b".symtab" | b".dynsym" => {
                    let strings = shdrs
                        .get(sh.sh_link as usize)
                        .and_then(|s| file_range(data, s));
                    if let (Some(table), Some(strings)) = (file_range(data, sh), strings) {
                        // .symtab first, because it has the local (static) functions too.
                        if n == b".symtab" {
                            tables.insert(0, (table, strings));
                            has_symtab = true;
                        } else {
                            tables.push((table, strings));
                        }
                    }
                }
                _ => {}
            }
        }
        Ok(Image {
            name,
            bytes: Arc::new(bytes),
            build_id,
            first_load_svma,
            first_load_offset,
            sections,
            tables,
            has_symtab,
            symbols: OnceLock::new(),
            debug,
            lines: OnceLock::new(),
            mini_debuginfo,
            debuglink,
            debug_file: None,
        })
    }

    /// Whether a separate debug file could add to what this image has, that is, whether it
    /// lacks a `.symtab` (the local functions' names) or DWARF (lines).
    pub(crate) fn wants_debug_file(&self) -> bool {
        !self.has_symtab || !self.has_dwarf()
    }

    fn has_dwarf(&self) -> bool {
        [".debug_info", ".debug_line"]
            .iter()
            .all(|want| self.debug.iter().any(|d| d.name == *want))
    }

    /// Attaches the separate debug file found for this image (`native::debuginfo`). Its
    /// `.symtab` and DWARF are read when first needed.
    pub(crate) fn set_debug_file(&mut self, debug: Image) {
        self.debug_file = Some(Box::new(debug));
    }

    /// The file's whole bytes (a debuglink's CRC32 is over them).
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The source file and line of the instruction at SVMA `svma` in the function that
    /// holds it (where code inlined into it was inlined, not the inlined code's own line,
    /// so that it goes with the function's symbol), from the image's DWARF (read the first
    /// time a line is asked for, and then only the units asked about); None without it.
    pub(crate) fn line(&self, svma: u64) -> Option<SourceLine> {
        self.own_line(svma)
            .or_else(|| self.debug_file.as_ref()?.own_line(svma))
    }

    /// [`Image::line`] from this file's own DWARF.
    fn own_line(&self, svma: u64) -> Option<SourceLine> {
        let lines = self
            .lines
            .get_or_init(|| self.line_context().map(std::sync::Mutex::new));
        let context = lines.as_ref()?.lock().ok()?;
        // Innermost inlined function first, the function itself last.
        let mut frames = context.find_frames(svma).skip_all_loads().ok()?;
        let mut outermost = None;
        while let Ok(Some(frame)) = frames.next() {
            if let Some(at) = frame.location {
                outermost = Some((at.file, at.line));
            }
        }
        match outermost {
            Some((Some(file), Some(line))) => Some((Arc::from(file), line)),
            _ => None,
        }
    }

    /// addr2line over this image's `.debug_*` sections. None when it has no line table.
    /// A compressed section is decompressed here (bounded, so one too large is left out).
    fn line_context(&self) -> Option<addr2line::Context<DwarfReader>> {
        if !self.has_dwarf() {
            return None;
        }
        let section = |id: gimli::SectionId| -> std::result::Result<DwarfReader, ()> {
            use gimli::SectionId::{DebugLoc, DebugLocLists, DebugMacinfo, DebugMacro};
            let found = self.debug.iter().find(|d| d.name == id.name());
            let bytes = match found {
                // Location lists and macros are not worth inflating, because addr2line reads
                // neither.
                Some(d)
                    if d.compressed
                        && matches!(id, DebugLoc | DebugLocLists | DebugMacinfo | DebugMacro) =>
                {
                    None
                }
                Some(d) if d.compressed => sections::inflate_section(
                    &self.bytes[d.file.clone()],
                    sections::MAX_INFLATED_SECTION,
                )
                .ok()
                .map(|v| SectionBytes {
                    range: 0..v.len(),
                    bytes: Arc::new(Bytes::Owned(v)),
                }),
                Some(d) => Some(SectionBytes {
                    bytes: self.bytes.clone(),
                    range: d.file.clone(),
                }),
                None => None,
            };
            let bytes = bytes.unwrap_or_else(|| SectionBytes {
                bytes: self.bytes.clone(),
                range: 0..0,
            });
            Ok(gimli::EndianReader::new(bytes, gimli::LittleEndian))
        };
        let dwarf = gimli::Dwarf::load(section).ok()?;
        addr2line::Context::from_dwarf(dwarf).ok()
    }

    /// The bytes of `section`, shared with this image.
    pub(crate) fn section_bytes(&self, section: &Section) -> Option<SectionBytes> {
        (!section.file.is_empty()).then(|| SectionBytes {
            bytes: self.bytes.clone(),
            range: section.file.clone(),
        })
    }

    /// The symbols, parsed on first use:
    /// - this file's `.symtab` and `.dynsym`;
    /// - its debug file's `.symtab`;
    /// - when neither file has a `.symtab`, its MiniDebugInfo's (decompressed now).
    ///
    /// Aliases of one range fold into one name (`symbols`).
    pub(crate) fn symbols(&self) -> &Symbols {
        &self.symbol_table().symbols
    }

    fn symbol_table(&self) -> &SymbolTable {
        self.symbols.get_or_init(|| {
            let mut sources = vec![(self.bytes.clone(), self.tables.clone())];
            if let Some(debug) = &self.debug_file {
                sources.push((debug.bytes.clone(), debug.tables.clone()));
            }
            let has_symtab =
                self.has_symtab || self.debug_file.as_ref().is_some_and(|d| d.has_symtab);
            if !has_symtab {
                // A damaged or oversized one adds nothing, so .dynsym's names stay.
                let mini = self
                    .mini_debuginfo
                    .clone()
                    .and_then(|r| mini_debuginfo(&self.name, &self.bytes[r]).ok());
                if let Some(mini) = mini {
                    sources.push((mini.bytes.clone(), mini.tables.clone()));
                }
            }
            let views: Vec<(&[u8], &Tables)> = sources.iter().map(|(b, t)| (&b[..], t)).collect();
            SymbolTable {
                symbols: Symbols::parse(&views),
                sources: sources.into_iter().map(|(b, _)| b).collect(),
            }
        })
    }

    /// The name of a symbol found by [`Image::symbols`] (its bytes in the string table of
    /// the file it was found in).
    pub(crate) fn symbol_name(&self, found: &Found) -> &str {
        self.symbol_table()
            .sources
            .get(found.source)
            .and_then(|bytes| bytes.get(found.name.clone()))
            .and_then(|b| std::str::from_utf8(b).ok())
            .unwrap_or("")
    }
}

/// The file range of a section's bytes, when it lies inside the file.
fn file_range(data: &[u8], sh: &SectionHeader) -> Option<Range<usize>> {
    if sh.sh_type == SHT_NOBITS {
        return None;
    }
    let start = usize::try_from(sh.sh_offset).ok()?;
    let end = start.checked_add(usize::try_from(sh.sh_size).ok()?)?;
    (end <= data.len()).then_some(start..end)
}

/// The NT_GNU_BUILD_ID note among the notes `notes` (a PT_NOTE segment's bytes).
fn build_id_in_notes(notes: &[u8]) -> Option<BuildId> {
    const NT_GNU_BUILD_ID: u32 = 3;
    let align4 = |n: usize| n.checked_add(3).map(|n| n & !3);
    let u32_at = |at: usize| -> Option<u32> {
        Some(u32::from_le_bytes(notes.get(at..at + 4)?.try_into().ok()?))
    };
    let mut at = 0usize;
    while at + 12 <= notes.len() {
        let namesz = u32_at(at)? as usize;
        let descsz = u32_at(at + 4)? as usize;
        let kind = u32_at(at + 8)?;
        let name_at = at + 12;
        let desc_at = name_at.checked_add(align4(namesz)?)?;
        let next = desc_at.checked_add(align4(descsz)?)?;
        if kind == NT_GNU_BUILD_ID && notes.get(name_at..name_at + namesz) == Some(b"GNU\0") {
            let desc = notes.get(desc_at..desc_at + descsz)?;
            return (!desc.is_empty()).then(|| BuildId(desc.to_vec()));
        }
        at = next;
    }
    None
}

/// Most bytes of ELF and program headers read from memory.
const MAX_HEADERS: usize = 64 * 1024;

/// The program headers of the image whose ELF header the target has mapped at `base` (the
/// mapping of file offset 0), read from the target's memory, and the SVMA of its first
/// loaded page. An SVMA `v` of the image is at AVMA `base + v − that`.
fn loaded_headers(mem: &dyn ProcessMemory, base: u64) -> Option<(Vec<ProgramHeader>, u64)> {
    let mut head = [0u8; 64];
    mem.read(base, &mut head).ok()?;
    let header: Header = goblin::elf::Elf::parse_header(&head).ok()?;
    if header.e_ident[goblin::elf::header::EI_CLASS] != goblin::elf::header::ELFCLASS64 {
        return None;
    }
    let len = (header.e_phnum as usize).checked_mul(header.e_phentsize as usize)?;
    if len == 0 || len > MAX_HEADERS {
        return None;
    }
    let table = mem.read_vec(base.checked_add(header.e_phoff)?, len).ok()?;
    let phdrs = ProgramHeader::parse(&table, 0, header.e_phnum as usize, ctx()).ok()?;
    let first = phdrs
        .iter()
        .filter(|p| p.p_type == PT_LOAD)
        .min_by_key(|p| p.p_vaddr)?;
    let first_svma = first.p_vaddr & PAGE_MASK;
    Some((phdrs, first_svma))
}

/// The build id of the image whose ELF header the target has mapped at `base` (its first
/// page, the mapping of file offset 0), read from the target's memory. It is the build id
/// of what was loaded, whatever the file on disk holds now. None when the image has no
/// build id note or it cannot be read.
pub(crate) fn build_id_in_memory(mem: &dyn ProcessMemory, base: u64) -> Option<BuildId> {
    let (phdrs, first_svma) = loaded_headers(mem, base)?;
    // Notes are in a loaded segment.
    phdrs.iter().filter(|p| p.p_type == PT_NOTE).find_map(|p| {
        let len = usize::try_from(p.p_memsz)
            .ok()
            .filter(|&l| l <= MAX_HEADERS)?;
        let at = base.checked_add(p.p_vaddr.checked_sub(first_svma)?)?;
        build_id_in_notes(&mem.read_vec(at, len).ok()?)
    })
}

/// Most bytes of `.eh_frame` read from a target's memory.
const MAX_EH_FRAME: u64 = 32 << 20;

/// An image with only the unwind rules of what the target loaded at `base`, read from its
/// memory (`.eh_frame_hdr` through PT_GNU_EH_FRAME, and `.eh_frame` from where the header
/// says up to the end of its segment). It is for a module whose file cannot be trusted
/// (changed on disk since it was loaded) or read. No symbols. None when the image has no
/// PT_GNU_EH_FRAME or it cannot be read.
pub(crate) fn unwind_image_in_memory(mem: &dyn ProcessMemory, base: u64) -> Option<Image> {
    const PT_GNU_EH_FRAME: u32 = 0x6474_e550;
    let (phdrs, first_svma) = loaded_headers(mem, base)?;
    let avma = |svma: u64| base.checked_add(svma.checked_sub(first_svma)?);
    let hdr_ph = phdrs.iter().find(|p| p.p_type == PT_GNU_EH_FRAME)?;
    let hdr_len = usize::try_from(hdr_ph.p_memsz)
        .ok()
        .filter(|&l| l >= 8 && l <= MAX_EH_FRAME as usize)?;
    let hdr = mem.read_vec(avma(hdr_ph.p_vaddr)?, hdr_len).ok()?;
    // version 1, then the encoding of eh_frame_ptr: 0x1b (pc-relative signed 4 bytes) as
    // every linker writes it, or 0x03 / 0x0b (absolute, 4 bytes).
    let field = i32::from_le_bytes(hdr.get(4..8)?.try_into().ok()?);
    let eh_frame_svma = match (hdr[0], hdr[1]) {
        (1, 0x1b) => hdr_ph
            .p_vaddr
            .checked_add(4)?
            .checked_add_signed(field as i64)?,
        (1, 0x03) => field as u32 as u64,
        (1, 0x0b) => u64::try_from(field).ok()?,
        _ => return None,
    };
    // The headers are the target's memory, anything at all. So no sum of two of their fields
    // may overflow (a segment at the top of the address space did; it was the `elf` fuzz
    // target's find, fuzz/regressions/elf/).
    let segment = phdrs.iter().find(|p| {
        p.p_type == PT_LOAD && p.p_vaddr <= eh_frame_svma && eh_frame_svma - p.p_vaddr < p.p_memsz
    })?;
    let eh_len = segment
        .p_vaddr
        .checked_add(segment.p_filesz)?
        .checked_sub(eh_frame_svma)?
        .min(MAX_EH_FRAME);
    let mut bytes = hdr;
    let mut eh_frame = vec![0u8; eh_len as usize];
    let got = mem.read_prefix(avma(eh_frame_svma)?, &mut eh_frame).ok()?;
    bytes.extend_from_slice(&eh_frame[..got]);
    let first = phdrs
        .iter()
        .filter(|p| p.p_type == PT_LOAD)
        .min_by_key(|p| p.p_vaddr)?;
    let sections = UnwindSections {
        eh_frame_hdr: Some(Section {
            svma: hdr_ph.p_vaddr..hdr_ph.p_vaddr.checked_add(hdr_len as u64)?,
            file: 0..hdr_len,
        }),
        eh_frame: Some(Section {
            svma: eh_frame_svma..eh_frame_svma.checked_add(got as u64)?,
            file: hdr_len..hdr_len + got,
        }),
        ..UnwindSections::default()
    };
    Some(Image {
        name: format!("the image loaded at {base:#x}"),
        bytes: Arc::new(Bytes::Owned(bytes)),
        build_id: build_id_in_memory(mem, base),
        first_load_svma: first_svma,
        first_load_offset: first.p_offset & PAGE_MASK,
        sections,
        tables: Vec::new(),
        has_symtab: false,
        symbols: OnceLock::new(),
        debug: Vec::new(),
        lines: OnceLock::new(),
        mini_debuginfo: None,
        debuglink: None,
        debug_file: None,
    })
}

/// Parses the ELF file MiniDebugInfo decompresses to.
fn mini_debuginfo(name: &str, xz: &[u8]) -> Result<Image, String> {
    let elf = sections::unxz_bounded(xz, sections::MAX_MINI_DEBUGINFO)?;
    Image::parse_debug_file(format!("{name} [.gnu_debugdata]"), Bytes::Owned(elf))
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This test binary's memory and where its executable is mapped (its first mapping).
    fn own_executable_in_memory() -> (crate::ptrace::RemoteMemory, u64) {
        let pid = std::process::id() as i32;
        let maps = crate::proc::read_maps(pid).unwrap();
        let exe = crate::proc::exe_path(pid).unwrap();
        let base = maps
            .iter()
            .find(|m| m.path.as_deref() == Some(exe.as_str()) && m.offset == 0)
            .unwrap()
            .start;
        (crate::ptrace::RemoteMemory::new(pid).unwrap(), base)
    }

    #[test]
    fn headers_whose_fields_overflow_when_added_give_no_image() {
        // The `elf` fuzz target's find: an image read from memory whose loaded segment
        // ends past the top of the address space (p_vaddr + p_memsz overflowed).
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/fuzz/regressions/elf/eh_frame_segment_at_the_top.so"
        );
        let base = 0x7f00_0000_0000;
        let mem = crate::ptrace::BufferMemory {
            base,
            bytes: std::fs::read(path).unwrap(),
        };
        let _ = build_id_in_memory(&mem, base);
        let _ = unwind_image_in_memory(&mem, base);
    }

    #[test]
    fn our_own_executable_parses_and_its_build_id_matches_memory() {
        let exe = std::env::current_exe().unwrap();
        let file = std::fs::File::open(&exe).unwrap();
        let image = Image::from_file(&file, &exe).unwrap();
        assert!(image.sections.eh_frame.is_some());
        assert!(image.sections.text.is_some());
        // The running copy's headers, read from our own memory, carry the same build id
        // (rustc's linker writes one on Linux).
        let (mem, base) = own_executable_in_memory();
        let in_memory = build_id_in_memory(&mem, base);
        assert!(image.build_id.is_some());
        assert_eq!(in_memory, image.build_id);
    }

    #[test]
    fn unwind_rules_read_from_memory_are_the_files() {
        let exe = std::env::current_exe().unwrap();
        let file = std::fs::File::open(&exe).unwrap();
        let image = Image::from_file(&file, &exe).unwrap();
        let (mem, base) = own_executable_in_memory();
        let loaded = unwind_image_in_memory(&mem, base).expect("PT_GNU_EH_FRAME");
        let bytes = |img: &Image, s: &Option<Section>| {
            img.section_bytes(s.as_ref().unwrap()).unwrap().to_vec()
        };
        let (ours, file_s) = (&loaded.sections, &image.sections);
        assert_eq!(
            ours.eh_frame_hdr.as_ref().unwrap().svma,
            file_s.eh_frame_hdr.as_ref().unwrap().svma
        );
        assert_eq!(
            bytes(&loaded, &ours.eh_frame_hdr),
            bytes(&image, &file_s.eh_frame_hdr)
        );
        // .eh_frame from memory runs to the end of its segment: the file's is its start.
        let from_memory = bytes(&loaded, &ours.eh_frame);
        let from_file = bytes(&image, &file_s.eh_frame);
        assert_eq!(
            ours.eh_frame.as_ref().unwrap().svma.start,
            file_s.eh_frame.as_ref().unwrap().svma.start
        );
        assert_eq!(&from_memory[..from_file.len()], &from_file[..]);
        assert_eq!(
            (loaded.first_load_svma, loaded.first_load_offset),
            (image.first_load_svma, image.first_load_offset)
        );
        assert!(loaded.symbols().find(0).is_none());
    }

    #[test]
    fn notes_are_walked_to_the_build_id() {
        let mut notes = Vec::new();
        // An ABI tag note first (name "GNU", type 1), then the build id (type 3).
        for (kind, desc) in [(1u32, vec![0u8; 16]), (3, vec![0xab, 0xcd, 0xef])] {
            notes.extend_from_slice(&4u32.to_le_bytes());
            notes.extend_from_slice(&(desc.len() as u32).to_le_bytes());
            notes.extend_from_slice(&kind.to_le_bytes());
            notes.extend_from_slice(b"GNU\0");
            notes.extend_from_slice(&desc);
            while notes.len() % 4 != 0 {
                notes.push(0);
            }
        }
        assert_eq!(
            build_id_in_notes(&notes),
            Some(BuildId(vec![0xab, 0xcd, 0xef]))
        );
        assert_eq!(build_id_in_notes(&notes[..20]), None);
        assert_eq!(BuildId(vec![0xab, 0x01]).to_string(), "ab01");
    }

    #[test]
    fn rejects_what_is_not_an_x86_64_image() {
        assert!(
            Image::parse("x".into(), Bytes::Owned(b"not an elf file at all".to_vec())).is_err()
        );
    }
}
