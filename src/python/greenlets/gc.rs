//! Every object the target's cycle collector tracks, read from outside. The walk follows the
//! doubly linked lists of its generations (each starts and ends at its
//! `struct gc_generation`'s head), through a page cache of its own (a list visits each
//! pymalloc pool's objects in turn).
//!
//! Owns: [`Tracked`] (the walk and its bounds) and [`generation_heads`] (where the lists
//! of one interpreter are).
//!
//! Must not: know what the objects are (its caller checks their types). Bounded in
//! objects, time and cached pages. A list that is torn (a collection under way, or a
//! read without pausing) or that loops ends the walk with an error or as cut short.

use crate::error::{Error, Result};
use crate::ptrace::ProcessMemory;
use crate::python_bindings::ObjectLayout;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Tracked objects visited at most (a large server has a few million).
pub(super) const MAX_OBJECTS: u64 = 1 << 24;
/// How long the walk of every list may take at most.
pub(super) const MAX_TIME: Duration = Duration::from_secs(10);
/// Bytes of one cached page.
const PAGE: u64 = 4096;
/// Pages cached at most (64 MiB); past that the cache starts afresh.
const MAX_PAGES: usize = 16_384;

fn bad(addr: u64, why: &'static str) -> Error {
    Error::Inconsistent { addr, why }
}

/// Where a process keeps its collector's lists, beyond its version's table.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Places {
    /// `_PyRuntime` (3.7 and 3.8 keep one set of lists there).
    pub(super) runtime: Option<u64>,
    /// 3.13+: where an interpreter's `gc` is, as its debug offsets say (a patch release
    /// may move it).
    pub(super) gc_at: Option<u64>,
    /// 2.7 and 3.6: the first list head (the value of `_PyGC_generation0`).
    pub(super) first_head: Option<u64>,
}

/// The list heads of the generations of the interpreter at `interp` (on 2.7, 3.6, 3.7 and
/// 3.8 the process's), the permanent one (`gc.freeze()`'s, 3.7+) last. `first`: the value
/// of the collector state's `generation0` (see [`generation0_at`]), where the first list
/// really is. It wins over the table's place. None when this version or build keeps no
/// such lists where a layout says (free-threaded) or where they are is not known.
pub(super) fn generation_heads(
    l: &ObjectLayout,
    at: Places,
    interp: u64,
    first: Option<u64>,
) -> Option<Vec<u64>> {
    let size = l.gc_generation_size? as u64;
    let count = l.gc_generations_count? as u64;
    let gens = |first: u64| (0..count).map(move |i| first.wrapping_add(i * size));
    if l.version < (3, 7) {
        return Some(gens(first.or(at.first_head)?).collect());
    }
    let (runtime, gc_at) = (at.runtime, at.gc_at);
    let (table_first, permanent) = match (l.gc_runtime_generations, l.gc_interp_generations) {
        (Some(g), _) => (
            runtime?.wrapping_add(g as u64),
            runtime?.wrapping_add(l.gc_runtime_permanent? as u64),
        ),
        (None, Some(g)) => {
            let state = l.gc_interp_state? as u64;
            let at = interp.wrapping_add(gc_at.unwrap_or(state));
            let permanent = l.gc_interp_permanent? as u64;
            (
                at.wrapping_add((g as u64).wrapping_sub(state)),
                at.wrapping_add(permanent.wrapping_sub(state)),
            )
        }
        (None, None) => return None,
    };
    let mut heads: Vec<u64> = gens(first.unwrap_or(table_first)).collect();
    heads.push(permanent);
    Some(heads)
}

/// Where the collector state's `generation0` pointer is (3.7+: in the runtime, or in the
/// interpreter at `interp`; 2.7 and 3.6: the `_PyGC_generation0` global, `at.first_head`
/// already holds its value). None when not known.
pub(super) fn generation0_at(l: &ObjectLayout, at: Places, interp: u64) -> Option<u64> {
    if let Some(off) = l.gc_runtime_generation0 {
        return Some(at.runtime?.wrapping_add(off as u64));
    }
    let off = l.gc_interp_generation0? as u64;
    let state = l.gc_interp_state? as u64;
    let gc = interp.wrapping_add(at.gc_at.unwrap_or(state));
    Some(gc.wrapping_add(off.wrapping_sub(state)))
}

/// A walk of the tracked objects: what it visited, and why it stopped early.
pub(super) struct Tracked<'a> {
    mem: &'a dyn ProcessMemory,
    pages: HashMap<u64, Box<[u8]>>,
    /// `sizeof(PyGC_Head)`: the object follows its head.
    head_size: u64,
    ob_type: u64,
    /// Objects visited so far.
    pub(super) visited: u64,
    /// The walk stopped at [`MAX_OBJECTS`] or [`MAX_TIME`].
    pub(super) cut_short: bool,
    deadline: Instant,
}

impl<'a> Tracked<'a> {
    pub(super) fn new(mem: &'a dyn ProcessMemory, l: &ObjectLayout) -> Option<Tracked<'a>> {
        Some(Tracked {
            mem,
            pages: HashMap::new(),
            head_size: l.gc_head_size? as u64,
            ob_type: l.ob_type as u64,
            visited: 0,
            cut_short: false,
            deadline: Instant::now() + MAX_TIME,
        })
    }

    /// `out.len()` bytes at `addr`, from the cache when they lie in one page.
    fn read(&mut self, addr: u64, out: &mut [u8]) -> Result<()> {
        let page = addr & !(PAGE - 1);
        let from = (addr - page) as usize;
        if from + out.len() > PAGE as usize {
            return self.mem.read(addr, out);
        }
        if !self.pages.contains_key(&page) {
            if self.pages.len() >= MAX_PAGES {
                self.pages.clear();
            }
            let mut buf = vec![0u8; PAGE as usize].into_boxed_slice();
            if self.mem.read(page, &mut buf).is_err() {
                // The page's end is not mapped (or none of it is), so read the exact bytes alone.
                return self.mem.read(addr, out);
            }
            self.pages.insert(page, buf);
        }
        let buf = &self.pages[&page];
        out.copy_from_slice(&buf[from..from + out.len()]);
        Ok(())
    }

    /// Calls `each(object, its type)` for every object on the list that starts at `head`,
    /// in its order. Stops early (`cut_short`) past the bounds. Returns an error when the list
    /// is torn (a link that is null, unaligned or unreadable).
    pub(super) fn walk(&mut self, head: u64, each: &mut dyn FnMut(u64, u64)) -> Result<()> {
        let mut link = [0u8; 8];
        self.read(head, &mut link)?;
        let mut node = u64::from_le_bytes(link) & !3;
        let mut buf = vec![0u8; (self.ob_type + 8) as usize + self.head_size as usize];
        // The first object links back to the head (its second word; flags in its low
        // bits). Else this is no list head, and the table does not fit this build.
        if node != head {
            let back = self.read(node.wrapping_add(8), &mut link);
            if back.is_err() || u64::from_le_bytes(link) & !3 != head {
                return Err(bad(
                    head,
                    "no list head where this version's table puts the collector's lists \
                     (a build whose collector state differs from the headers')",
                ));
            }
        }
        while node != head {
            if node == 0 {
                return Err(bad(head, "a collector's list that ends in a null link"));
            }
            if self.visited >= MAX_OBJECTS
                || (self.visited.is_multiple_of(4096) && Instant::now() > self.deadline)
            {
                self.cut_short = true;
                return Ok(());
            }
            self.visited += 1;
            self.read(node, &mut buf)?;
            // The low two bits of a link carry flags on 3.8+ (during a collection). A list
            // head may be only 4-aligned (Debian's 3.13.18 places them so).
            let next = u64::from_le_bytes(buf[..8].try_into().expect("8 bytes")) & !3;
            let at = (self.head_size + self.ob_type) as usize;
            let ty = u64::from_le_bytes(buf[at..at + 8].try_into().expect("8 bytes"));
            each(node.wrapping_add(self.head_size), ty);
            node = next;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ptrace::BufferMemory;

    /// A list of three objects (heads of 16 bytes, then refcount and type) read in order,
    /// and one whose link is null read as torn.
    #[test]
    fn walks_a_list_to_its_head_and_rejects_a_torn_one() {
        let l = *crate::python_bindings::object_layout(3, 12, false).expect("3.12's table");
        let base = 0x10_0000u64;
        let mut bytes = vec![0u8; 0x1000];
        let mut put = |at: u64, v: u64| {
            let i = (at - base) as usize;
            bytes[i..i + 8].copy_from_slice(&v.to_le_bytes());
        };
        let head = base;
        let nodes = [base + 0x100, base + 0x200, base + 0x300];
        put(head, nodes[0]);
        for (i, &n) in nodes.iter().enumerate() {
            // Flag bits in the link are ignored.
            put(n, nodes.get(i + 1).copied().unwrap_or(head) | 1);
            put(n + 16 + 8, 0xaa00 + i as u64);
        }
        put(nodes[0] + 8, head);
        let mem = BufferMemory {
            base,
            bytes: bytes.clone(),
        };
        let mut t = Tracked::new(&mem, &l).expect("a layout with lists");
        let mut seen = Vec::new();
        t.walk(head, &mut |o, ty| seen.push((o, ty)))
            .expect("a whole list");
        assert_eq!(
            seen,
            vec![
                (nodes[0] + 16, 0xaa00),
                (nodes[1] + 16, 0xaa01),
                (nodes[2] + 16, 0xaa02)
            ]
        );
        assert_eq!(t.visited, 3);
        let i = (nodes[1] - base) as usize;
        bytes[i..i + 8].copy_from_slice(&0u64.to_le_bytes());
        let mem = BufferMemory { base, bytes };
        let mut t = Tracked::new(&mem, &l).expect("a layout with lists");
        assert!(t.walk(head, &mut |_, _| {}).is_err());
    }

    /// Free-threaded builds have no lists. 2.7 and 3.6 have theirs where their first head
    /// is (none without it). 3.9+ has them in each interpreter, moved by the debug offsets'
    /// `gc`.
    #[test]
    fn where_the_lists_are() {
        let some = Places {
            runtime: Some(0x1000),
            gc_at: None,
            first_head: Some(0x3000),
        };
        let l = crate::python_bindings::object_layout(3, 13, true).expect("a table");
        assert!(generation_heads(l, some, 0x2000, None).is_none());
        for (major, minor) in [(2, 7), (3, 6)] {
            let l = crate::python_bindings::object_layout(major, minor, false).expect("a table");
            let size = l.gc_generation_size.expect("a size") as u64;
            let heads = generation_heads(l, some, 0x2000, None).expect("a static array");
            assert_eq!(heads, vec![0x3000, 0x3000 + size, 0x3000 + 2 * size]);
            assert!(generation_heads(l, Places::default(), 0x2000, None).is_none());
        }
        let l = crate::python_bindings::object_layout(3, 12, false).expect("a table");
        let heads = generation_heads(l, Places::default(), 0x2000, None).expect("3.12 keeps lists");
        assert_eq!(heads.len(), 4);
        let first = 0x2000 + l.gc_interp_generations.expect("3.9+") as u64;
        assert_eq!(heads[0], first);
        // The debug offsets' place of `gc` moves every list with it.
        let state = l.gc_interp_state.expect("3.9+") as u64;
        let moved = Places {
            gc_at: Some(state + 64),
            ..Places::default()
        };
        let moved_heads = generation_heads(l, moved, 0x2000, None).expect("lists");
        assert!(moved_heads.iter().zip(&heads).all(|(m, h)| *m == h + 64));
        // `generation0` names the first list. The generations follow it, and the permanent
        // one stays where the table (and debug offsets) put it.
        let size = l.gc_generation_size.expect("a size") as u64;
        let by_pointer = generation_heads(l, moved, 0x2000, Some(0x9004)).expect("lists");
        assert_eq!(
            &by_pointer[..3],
            &[0x9004, 0x9004 + size, 0x9004 + 2 * size]
        );
        assert_eq!(by_pointer[3], moved_heads[3]);
        let field = generation0_at(l, moved, 0x2000).expect("3.9+ keeps the pointer");
        let off = l.gc_interp_generation0.expect("3.9+") as u64;
        assert_eq!(field, 0x2000 + off + 64);
    }
}
