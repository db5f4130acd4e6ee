//! The parts of an ELF core file: its header, its segments and its notes.
//!
//! Owns: parsing, every field bounds-checked (a damaged core is an error, never a panic):
//! - the ELF header and program headers (64-bit little-endian cores only: x86-64, AArch64);
//! - `PT_LOAD` segments ([`Segment`]), `PT_NOTE` notes:
//!   - `NT_PRSTATUS`: each thread's id, current signal and registers ([`ThreadNote`]);
//!   - `NT_PRPSINFO`: the process's name and command line ([`ProcessNote`]);
//!   - `NT_SIGINFO`: the signal that ended it ([`SigInfo`]), the note after a thread's;
//!   - `NT_FILE`: the files mapped, where, from which offset ([`FileNote`]);
//!   - `NT_AUXV`: the auxiliary vector (the executable's entry point).
//!
//! Offsets of `struct elf_prstatus` and `struct elf_prpsinfo` are those of Linux's
//! 64-bit ABIs (`include/uapi/linux/elfcore.h`, the same on x86-64 and AArch64).
//! Must not: read memory through the segments (`memory.rs` does).

/// `e_machine` of the cores we read.
pub(crate) const EM_X86_64: u16 = 62;
pub(crate) const EM_AARCH64: u16 = 183;

const ET_CORE: u16 = 4;
const PT_LOAD: u32 = 1;
const PT_NOTE: u32 = 4;
const NT_PRSTATUS: u32 = 1;
const NT_PRPSINFO: u32 = 3;
const NT_AUXV: u32 = 6;
const NT_SIGINFO: u32 = 0x5349_4749;
const NT_FILE: u32 = 0x4649_4c45;
/// `AT_ENTRY` of the auxiliary vector: the executable's entry point.
const AT_ENTRY: u64 = 9;

/// `struct elf_prstatus`: where `pr_cursig`, `pr_pid` and `pr_reg` are.
const PR_CURSIG: usize = 12;
const PR_PID: usize = 32;
const PR_REG: usize = 112;
/// `struct elf_prpsinfo`: where `pr_fname` (16 bytes) and `pr_psargs` (80 bytes) are.
const PR_FNAME: usize = 40;
const PR_PSARGS: usize = 56;

/// Most notes, segments and files a core may list (a bound on a damaged one's work).
const MAX_ENTRIES: usize = 1 << 20;

/// One `PT_LOAD` segment: `memsz` bytes at `vaddr`, of which the first `filesz` are in the
/// core at `offset` (the rest was not dumped: read-only file mappings, as a rule).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Segment {
    pub(crate) vaddr: u64,
    pub(crate) memsz: u64,
    pub(crate) offset: u64,
    pub(crate) filesz: u64,
    /// `PF_X`, `PF_W`, `PF_R` of `p_flags`.
    pub(crate) executable: bool,
    pub(crate) writable: bool,
    pub(crate) readable: bool,
}

/// One thread's `NT_PRSTATUS`.
#[derive(Debug, Clone)]
pub(crate) struct ThreadNote {
    pub(crate) tid: i32,
    /// `pr_cursig`: the signal being delivered to it when the core was written (0: none).
    pub(crate) cursig: i32,
    /// `pr_reg`, as many 64-bit words as the note holds (27 on x86-64, 34 on AArch64).
    pub(crate) regs: Vec<u64>,
    /// The `NT_SIGINFO` that follows its note, if any.
    pub(crate) siginfo: Option<SigInfo>,
}

/// The start of a `siginfo_t`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SigInfo {
    pub(crate) signo: i32,
    pub(crate) code: i32,
    /// `si_addr` (bytes 16..24): meaningful for the fault signals raised by the CPU
    /// (SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGTRAP) with a positive `code`.
    pub(crate) addr: u64,
    /// `si_pid` (bytes 16..20): the sender, for a signal sent by a process (`code` ≤ 0).
    pub(crate) sender: i32,
}

/// `NT_PRPSINFO`.
#[derive(Debug, Clone, Default)]
pub(crate) struct ProcessNote {
    pub(crate) pid: i32,
    /// `pr_fname`: the main thread's name (`comm`), at most 15 bytes.
    pub(crate) name: String,
    /// `pr_psargs`: the command line, arguments joined by spaces, its first 80 bytes.
    pub(crate) args: String,
}

/// One mapping of `NT_FILE`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FileNote {
    pub(crate) start: u64,
    pub(crate) end: u64,
    /// Offset in the file, in bytes.
    pub(crate) offset: u64,
    pub(crate) path: String,
}

/// Everything a core's headers and notes say.
#[derive(Debug, Clone, Default)]
pub(crate) struct Parsed {
    pub(crate) machine: u16,
    pub(crate) segments: Vec<Segment>,
    pub(crate) threads: Vec<ThreadNote>,
    pub(crate) process: Option<ProcessNote>,
    pub(crate) files: Vec<FileNote>,
    pub(crate) entry: Option<u64>,
}

fn u16_at(b: &[u8], off: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(off..off + 2)?.try_into().ok()?))
}
fn u32_at(b: &[u8], off: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(off..off + 4)?.try_into().ok()?))
}
fn u64_at(b: &[u8], off: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(off..off + 8)?.try_into().ok()?))
}

/// Text of a fixed-size, NUL-padded field.
fn c_text(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).trim_end().to_string()
}

/// Parses the core `data`. Err: why it is not a core we read (a message).
pub(crate) fn parse(data: &[u8]) -> Result<Parsed, String> {
    if !data.starts_with(b"\x7fELF") {
        return Err("not an ELF file".into());
    }
    let short = || "the ELF header is cut short".to_string();
    let (class, endian) = (data.get(4).copied(), data.get(5).copied());
    if class != Some(2) || endian != Some(1) {
        return Err("not a 64-bit little-endian ELF file (the only cores read)".into());
    }
    let e_type = u16_at(data, 16).ok_or_else(short)?;
    if e_type != ET_CORE {
        return Err(format!(
            "an ELF file of type {e_type}, not a core (type 4): a program or library?"
        ));
    }
    let machine = u16_at(data, 18).ok_or_else(short)?;
    if machine != EM_X86_64 && machine != EM_AARCH64 {
        return Err(format!(
            "a core of machine {machine}: only x86-64 (62) and AArch64 (183) are read"
        ));
    }
    let phoff = u64_at(data, 32).ok_or_else(short)?;
    let phentsize = u16_at(data, 54).ok_or_else(short)? as usize;
    let phnum = u16_at(data, 56).ok_or_else(short)? as usize;
    if phentsize < 56 {
        return Err(format!(
            "program headers of {phentsize} bytes (56 expected)"
        ));
    }
    let mut out = Parsed {
        machine,
        ..Parsed::default()
    };
    for i in 0..phnum {
        let at = usize::try_from(phoff)
            .ok()
            .and_then(|p| p.checked_add(i * phentsize))
            .ok_or("program headers out of range")?;
        let ph = data
            .get(at..at + 56)
            .ok_or("the program headers are cut short (a truncated core?)")?;
        let p_type = u32_at(ph, 0).unwrap_or(0);
        let flags = u32_at(ph, 4).unwrap_or(0);
        let offset = u64_at(ph, 8).unwrap_or(0);
        let vaddr = u64_at(ph, 16).unwrap_or(0);
        let filesz = u64_at(ph, 32).unwrap_or(0);
        let memsz = u64_at(ph, 40).unwrap_or(0);
        match p_type {
            PT_LOAD => out.segments.push(Segment {
                vaddr,
                memsz: memsz.max(filesz),
                offset,
                filesz,
                executable: flags & 1 != 0,
                writable: flags & 2 != 0,
                readable: flags & 4 != 0,
            }),
            PT_NOTE => {
                let notes = usize::try_from(offset)
                    .ok()
                    .zip(usize::try_from(filesz).ok())
                    .and_then(|(o, n)| data.get(o..o.checked_add(n)?))
                    .ok_or("its notes lie past its end (a truncated core?)")?;
                read_notes(notes, &mut out)?;
            }
            _ => {}
        }
    }
    if out.threads.is_empty() {
        return Err("it has no thread (no NT_PRSTATUS note)".into());
    }
    out.segments.sort_by_key(|s| s.vaddr);
    Ok(out)
}

/// Reads one `PT_NOTE` segment's notes into `out`.
fn read_notes(mut b: &[u8], out: &mut Parsed) -> Result<(), String> {
    let align = |n: usize| n.checked_add(3).map(|n| n & !3);
    let mut count = 0;
    while b.len() >= 12 {
        count += 1;
        if count > MAX_ENTRIES {
            return Err("more than a million notes".into());
        }
        let namesz = u32_at(b, 0).unwrap_or(0) as usize;
        let descsz = u32_at(b, 4).unwrap_or(0) as usize;
        let kind = u32_at(b, 8).unwrap_or(0);
        let name_end = align(namesz).and_then(|n| n.checked_add(12));
        let desc_end = name_end.and_then(|e| Some((e, e.checked_add(align(descsz)?)?)));
        let Some((desc_start, desc_end)) = desc_end.filter(|&(s, _)| s + descsz <= b.len()) else {
            return Err("a note is cut short (a damaged core?)".into());
        };
        let name = c_text(&b[12..12 + namesz]);
        let desc = &b[desc_start..desc_start + descsz];
        if name == "CORE" {
            note(kind, desc, out)?;
        }
        b = b.get(desc_end..).unwrap_or(&[]);
    }
    Ok(())
}

fn note(kind: u32, desc: &[u8], out: &mut Parsed) -> Result<(), String> {
    match kind {
        NT_PRSTATUS => {
            let tid = u32_at(desc, PR_PID).ok_or("an NT_PRSTATUS note is cut short")? as i32;
            let cursig = u16_at(desc, PR_CURSIG).unwrap_or(0) as i32;
            let regs = desc
                .get(PR_REG..)
                .unwrap_or(&[])
                .chunks_exact(8)
                .take(34)
                .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
                .collect();
            out.threads.push(ThreadNote {
                tid,
                cursig,
                regs,
                siginfo: None,
            });
        }
        NT_SIGINFO => {
            let info = SigInfo {
                signo: u32_at(desc, 0).ok_or("an NT_SIGINFO note is cut short")? as i32,
                code: u32_at(desc, 8).unwrap_or(0) as i32,
                addr: u64_at(desc, 16).unwrap_or(0),
                sender: u32_at(desc, 16).unwrap_or(0) as i32,
            };
            // The kernel writes it once, after the dumping thread's NT_PRSTATUS (and its
            // NT_PRPSINFO); gdb after each thread's.
            if let Some(t) = out.threads.last_mut() {
                t.siginfo.get_or_insert(info);
            }
        }
        NT_PRPSINFO => {
            out.process = Some(ProcessNote {
                pid: u32_at(desc, 24).unwrap_or(0) as i32,
                name: c_text(desc.get(PR_FNAME..PR_FNAME + 16).unwrap_or(&[])),
                args: c_text(desc.get(PR_PSARGS..PR_PSARGS + 80).unwrap_or(&[])),
            });
        }
        NT_AUXV => {
            out.entry = desc
                .chunks_exact(16)
                .map(|c| (u64_at(c, 0).unwrap_or(0), u64_at(c, 8).unwrap_or(0)))
                .find(|&(k, _)| k == AT_ENTRY)
                .map(|(_, v)| v);
        }
        NT_FILE => out.files = file_note(desc)?,
        _ => {}
    }
    Ok(())
}

/// `NT_FILE`: a count and the page size, then (start, end, offset in pages) per mapping,
/// then the paths, NUL-terminated, in the same order.
fn file_note(desc: &[u8]) -> Result<Vec<FileNote>, String> {
    let bad = || "its NT_FILE note is damaged".to_string();
    let count = u64_at(desc, 0).ok_or_else(bad)? as usize;
    let page = u64_at(desc, 8).ok_or_else(bad)?;
    if count > MAX_ENTRIES || !page.is_power_of_two() {
        return Err(bad());
    }
    let names_at = 16 + count * 24;
    let mut names = desc.get(names_at..).ok_or_else(bad)?.split(|&c| c == 0);
    (0..count)
        .map(|i| {
            let at = 16 + i * 24;
            let (start, end) = (
                u64_at(desc, at).ok_or_else(bad)?,
                u64_at(desc, at + 8).ok_or_else(bad)?,
            );
            let offset = u64_at(desc, at + 16)
                .ok_or_else(bad)?
                .checked_mul(page)
                .ok_or_else(bad)?;
            let path = String::from_utf8_lossy(names.next().ok_or_else(bad)?).into_owned();
            if end < start {
                return Err(bad());
            }
            Ok(FileNote {
                start,
                end,
                offset,
                path,
            })
        })
        .collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// One note's bytes.
    pub(crate) fn note_bytes(kind: u32, desc: &[u8]) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&5u32.to_le_bytes());
        b.extend_from_slice(&(desc.len() as u32).to_le_bytes());
        b.extend_from_slice(&kind.to_le_bytes());
        b.extend_from_slice(b"CORE\0\0\0\0");
        b.extend_from_slice(desc);
        while b.len() % 4 != 0 {
            b.push(0);
        }
        b
    }

    /// An x86-64 core with the segments `loads` ((vaddr, bytes dumped, bytes in memory)),
    /// their bytes in order after the headers, the threads `tids` and the notes `extra`.
    pub(crate) fn core_bytes(loads: &[(u64, &[u8], u64)], tids: &[i32], extra: &[u8]) -> Vec<u8> {
        let mut notes = Vec::new();
        for &tid in tids {
            let mut st = vec![0u8; PR_REG + 27 * 8 + 8];
            st[PR_PID..PR_PID + 4].copy_from_slice(&tid.to_le_bytes());
            notes.extend(note_bytes(NT_PRSTATUS, &st));
        }
        notes.extend_from_slice(extra);
        let phnum = loads.len() + 1;
        let data_at = 64 + phnum * 56;
        let mut out = vec![0u8; 64];
        out[..4].copy_from_slice(b"\x7fELF");
        out[4] = 2;
        out[5] = 1;
        out[16..18].copy_from_slice(&ET_CORE.to_le_bytes());
        out[18..20].copy_from_slice(&EM_X86_64.to_le_bytes());
        out[32..40].copy_from_slice(&64u64.to_le_bytes());
        out[54..56].copy_from_slice(&56u16.to_le_bytes());
        out[56..58].copy_from_slice(&(phnum as u16).to_le_bytes());
        let ph = |t: u32, off: usize, vaddr: u64, filesz: usize, memsz: u64| {
            let mut p = vec![0u8; 56];
            p[0..4].copy_from_slice(&t.to_le_bytes());
            p[4..8].copy_from_slice(&6u32.to_le_bytes());
            p[8..16].copy_from_slice(&(off as u64).to_le_bytes());
            p[16..24].copy_from_slice(&vaddr.to_le_bytes());
            p[32..40].copy_from_slice(&(filesz as u64).to_le_bytes());
            p[40..48].copy_from_slice(&memsz.to_le_bytes());
            p
        };
        out.extend(ph(PT_NOTE, data_at, 0, notes.len(), 0));
        let mut at = data_at + notes.len();
        for &(vaddr, bytes, memsz) in loads {
            out.extend(ph(PT_LOAD, at, vaddr, bytes.len(), memsz));
            at += bytes.len();
        }
        out.extend(notes);
        for &(_, bytes, _) in loads {
            out.extend_from_slice(bytes);
        }
        out
    }

    /// An NT_FILE note of `maps` ((start, end, offset in bytes, path)), 4 KiB pages.
    pub(crate) fn file_note_bytes(maps: &[(u64, u64, u64, &str)]) -> Vec<u8> {
        let mut d = Vec::new();
        d.extend_from_slice(&(maps.len() as u64).to_le_bytes());
        d.extend_from_slice(&4096u64.to_le_bytes());
        for &(s, e, o, _) in maps {
            d.extend_from_slice(&s.to_le_bytes());
            d.extend_from_slice(&e.to_le_bytes());
            d.extend_from_slice(&(o / 4096).to_le_bytes());
        }
        for &(_, _, _, p) in maps {
            d.extend_from_slice(p.as_bytes());
            d.push(0);
        }
        note_bytes(NT_FILE, &d)
    }

    #[test]
    fn parses_threads_segments_and_files() {
        let files = file_note_bytes(&[(0x1000, 0x3000, 0x2000, "/usr/lib/libx.so")]);
        let mut si = vec![0u8; 128];
        si[0..4].copy_from_slice(&11i32.to_le_bytes());
        si[8..12].copy_from_slice(&1i32.to_le_bytes());
        si[16..24].copy_from_slice(&0x10u64.to_le_bytes());
        let mut extra = note_bytes(NT_SIGINFO, &si);
        extra.extend(files);
        let core = core_bytes(&[(0x1000, &[7; 16], 0x2000)], &[42, 43], &extra);
        let p = parse(&core).unwrap();
        assert_eq!(
            p.threads.iter().map(|t| t.tid).collect::<Vec<_>>(),
            [42, 43]
        );
        assert_eq!(
            p.threads[1].siginfo.map(|s| (s.signo, s.code, s.addr)),
            Some((11, 1, 0x10))
        );
        assert!(p.threads[0].siginfo.is_none());
        assert_eq!(p.segments[0].filesz, 16);
        assert_eq!(p.segments[0].memsz, 0x2000);
        assert_eq!(
            p.files,
            [FileNote {
                start: 0x1000,
                end: 0x3000,
                offset: 0x2000,
                path: "/usr/lib/libx.so".into()
            }]
        );
    }

    #[test]
    fn damaged_cores_are_errors() {
        let core = core_bytes(&[(0x1000, &[7; 16], 16)], &[42], &[]);
        assert!(parse(b"#!/bin/sh\n").is_err());
        assert!(parse(&core[..40]).unwrap_err().contains("cut short"));
        // Every truncation is an error or a parse, never a panic.
        for n in 0..core.len() {
            let _ = parse(&core[..n]);
        }
        let mut not_core = core.clone();
        not_core[16] = 3;
        assert!(parse(&not_core).unwrap_err().contains("not a core"));
        let none = core_bytes(&[], &[], &[]);
        assert!(parse(&none).unwrap_err().contains("no thread"));
    }
}
