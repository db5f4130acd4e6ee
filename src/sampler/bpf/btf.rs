//! The few field offsets of the kernel's own structures the BPF program reads, from the
//! kernel's BTF (/sys/kernel/btf/vmlinux). The kernel describes its types there, so the
//! program needs no compiler and no headers of this kernel.
//!
//! Owns: walking the BTF type section far enough to find a struct by name and a member's
//! byte offset.
//!
//! Must not: interpret anything else (a malformed or unknown file is None).

/// Byte offsets in `struct task_struct` the program reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TaskOffsets {
    /// `task_struct.pid` (the thread's kernel id, a 4-byte `pid_t`).
    pub(crate) pid: u32,
    /// `task_struct.tgid` (its process's id).
    pub(crate) tgid: u32,
    /// `task_struct.se.sum_exec_runtime`, the total `/proc/.../schedstat` shows first.
    pub(crate) sum_exec_runtime: u32,
}

const BTF_MAGIC: u16 = 0xeb9f;
const KIND_STRUCT: u32 = 4;

/// One struct as found: its members' (name offset, bit offset).
struct Struct {
    members: Vec<(u32, u32)>,
}

/// Reads the offsets from this kernel's BTF (once a run, because the file is megabytes).
/// None when it is missing or unreadable.
pub(crate) fn task_offsets() -> Option<TaskOffsets> {
    static OFFSETS: std::sync::OnceLock<Option<TaskOffsets>> = std::sync::OnceLock::new();
    *OFFSETS.get_or_init(|| {
        let data = std::fs::read("/sys/kernel/btf/vmlinux").ok()?;
        offsets_in(&data)
    })
}

fn u32_at(d: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(d.get(at..at + 4)?.try_into().ok()?))
}

fn name_at(strings: &[u8], off: u32) -> &[u8] {
    let s = strings.get(off as usize..).unwrap_or(&[]);
    &s[..s.iter().position(|&b| b == 0).unwrap_or(s.len())]
}

/// The offsets in a BTF blob (little-endian, as the running kernel writes it).
pub(crate) fn offsets_in(d: &[u8]) -> Option<TaskOffsets> {
    if u16::from_le_bytes(d.get(0..2)?.try_into().ok()?) != BTF_MAGIC {
        return None;
    }
    let hdr_len = u32_at(d, 4)? as usize;
    let (type_off, type_len) = (u32_at(d, 8)? as usize, u32_at(d, 12)? as usize);
    let (str_off, str_len) = (u32_at(d, 16)? as usize, u32_at(d, 20)? as usize);
    let types = d.get(hdr_len + type_off..hdr_len.checked_add(type_off)?.checked_add(type_len)?)?;
    let strings = d.get(hdr_len + str_off..hdr_len.checked_add(str_off)?.checked_add(str_len)?)?;
    let mut task = None;
    let mut entity = None;
    let mut at = 0;
    while at + 12 <= types.len() {
        let name = u32_at(types, at)?;
        let info = u32_at(types, at + 4)?;
        let kind = (info >> 24) & 0x1f;
        let vlen = (info & 0xffff) as usize;
        let kind_flag = info >> 31 == 1;
        at += 12;
        // What follows each kind (include/uapi/linux/btf.h).
        let extra = match kind {
            1 | 14 | 17 => 4,
            3 => 12,
            4 | 5 | 15 | 19 => 12 * vlen,
            6 | 13 => 8 * vlen,
            2 | 7..=12 | 16 | 18 => 0,
            _ => return None,
        };
        if kind == KIND_STRUCT {
            let wanted = match name_at(strings, name) {
                b"task_struct" if task.is_none() => Some(&mut task),
                b"sched_entity" if entity.is_none() => Some(&mut entity),
                _ => None,
            };
            if let Some(slot) = wanted {
                let mut members = Vec::with_capacity(vlen);
                for i in 0..vlen {
                    let m = at + 12 * i;
                    let off = u32_at(types, m + 8)?;
                    // With kind_flag the low 24 bits are the offset (bitfields).
                    let bits = if kind_flag { off & 0xff_ffff } else { off };
                    members.push((u32_at(types, m)?, bits));
                }
                *slot = Some(Struct { members });
            }
        }
        at += extra;
        if task.is_some() && entity.is_some() {
            break;
        }
    }
    let member = |s: &Struct, want: &[u8]| {
        s.members
            .iter()
            .find(|(n, _)| name_at(strings, *n) == want)
            .filter(|(_, bits)| bits % 8 == 0)
            .map(|(_, bits)| bits / 8)
    };
    let (task, entity) = (task?, entity?);
    Some(TaskOffsets {
        pid: member(&task, b"pid")?,
        tgid: member(&task, b"tgid")?,
        sum_exec_runtime: member(&task, b"se")? + member(&entity, b"sum_exec_runtime")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_what_is_not_btf() {
        assert_eq!(offsets_in(b""), None);
        assert_eq!(offsets_in(&[0u8; 64]), None);
    }

    #[test]
    fn finds_this_kernels_task_fields() {
        let Some(o) = task_offsets() else {
            eprintln!("no kernel BTF here: skipped");
            return;
        };
        // pid and tgid are neighbours (pid_t each). The scheduler entity is elsewhere.
        assert_eq!(o.tgid, o.pid + 4, "{o:?}");
        assert_ne!(o.sum_exec_runtime, o.pid);
    }
}
