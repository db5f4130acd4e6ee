//! Entry points for the coverage-guided fuzz targets in `fuzz/` (docs/testing.md,
//! "Fuzzing"). Each takes the fuzzer's bytes and feeds them to one reader of untrusted
//! input, the same code the profiler runs on a target's memory, files or a saved profile.
//!
//! Owns:
//! - how the fuzzer's bytes are cut into the arguments of each reader (which line-table
//!   format, which interpreter layout, which registers);
//! - the invariants checked on what comes back (a broken one panics, which the fuzzer
//!   reports like any crash).
//!
//! Must not: hold logic of its own that the readers lack (a target that parsed differently
//! from the profiler would test nothing), touch files or other processes, or be built
//! without the `fuzzing` feature (it widens what the library exports).

use crate::native;
use crate::proc::maps;
use crate::ptrace::{BufferMemory, PageCache, ProcessMemory};
use crate::python::linetable::LineTable;
use crate::python::StackWalker;
use crate::python_bindings::{self, debug_offsets, LineTableFormat};
use crate::report;

/// The first `N` bytes of `data` as an array, and the rest; zeros when `data` is short
/// (so every input, however short, reaches the reader).
fn take<const N: usize>(data: &[u8]) -> ([u8; N], &[u8]) {
    let mut head = [0u8; N];
    let n = data.len().min(N);
    head[..n].copy_from_slice(&data[..n]);
    (head, &data[n..])
}

/// Line tables: byte 0 picks the format (`co_lnotab` unsigned and signed, the 3.10 line
/// table, the 3.11+ location table), bytes 1–4 are `co_firstlineno`, the rest the table.
/// Checks that the ranges tile the bytecode from 0 and that each offset reads its range's
/// line.
pub fn line_table(data: &[u8]) {
    let ([format, l0, l1, l2, l3], table) = take::<5>(data);
    let format = match format % 4 {
        0 => LineTableFormat::LnotabUnsigned,
        1 => LineTableFormat::LnotabSigned,
        2 => LineTableFormat::Linetable310,
        _ => LineTableFormat::Locations311,
    };
    let first = u32::from_le_bytes([l0, l1, l2, l3]);
    let t = LineTable::decode(format, table, first);
    let mut at = 0u64;
    for (start, end, line) in t.ranges() {
        assert_eq!(u64::from(start), at, "ranges must be contiguous from 0");
        assert!(u64::from(start) < end, "a range must not be empty");
        assert_eq!(t.line_at(start), line);
        if let Ok(last) = u32::try_from(end - 1) {
            assert_eq!(t.line_at(last), line);
        }
        at = end;
    }
    assert_eq!(at.max(t.end()), t.end());
    if let Ok(past) = u32::try_from(t.end()) {
        assert_eq!(t.line_at(past), None, "past the table: no line");
    }
}

/// The memory ring's consumer side. `data` is the ring file's contents (header, then
/// slots). A well-formed header gets every written event read, the ones that want an
/// answer answered, as the memory consumer does.
pub fn ring(data: &[u8]) {
    let Ok(mut ring) = crate::memory::ring::Ring::from_bytes(data) else {
        return;
    };
    // A ring holds at most its capacity of events before the producer must wait. The bound
    // only keeps a header whose head and tail are far apart from running long.
    for _ in 0..4096 {
        let Some(e) = ring.next_event() else { break };
        ring.ack(&e);
    }
    let _ = (
        ring.tickets(),
        ring.dropped(),
        ring.footprint(),
        ring.peak(),
    );
}

/// /proc/PID/maps text, parsed as the profiler parses it, then the questions asked of it.
pub fn proc_maps(data: &[u8]) {
    let Ok(entries) = maps::parse_maps(data) else {
        return;
    };
    for m in &entries {
        if let Some(p) = &m.path {
            let _ = maps::range_of(&entries, p);
            let _ = maps::maps_file_named(&entries, crate::elf::maps::basename(p));
        }
    }
}

/// An ELF file, read:
/// - as the interpreter finder reads it (symbols, `.rodata` strings, the load bias against
///   a map that names it);
/// - as the native unwinder reads it (sections, build id, symbols, DWARF lines);
/// - as a separate debug file;
/// - as loaded in memory (program headers and notes, read through the memory trait).
pub fn elf(data: &[u8]) {
    let name = std::path::Path::new("fuzz.so");
    if let Ok(f) = crate::elf::ElfFile::parse(name, data) {
        let _ = f.symbol("_PyRuntime");
        let _ = f.symbol_with_prefix("version.");
        let _ = f.rodata_strings(4..=64).count();
        let map = maps::MapEntry {
            start: 0x5555_0000_0000,
            end: 0x5555_0010_0000,
            offset: 0,
            readable: true,
            executable: true,
            path: Some("/fuzz.so".into()),
            dev: (0, 0),
            inode: 1,
            deleted: false,
            vdso: false,
        };
        let _ = crate::elf::maps::load_bias(&[map], "/fuzz.so", &f);
    }
    native::fuzz::fuzz_image(data);
}

/// A profile JSON as `scalene-rs view` reads it, then rendered in every format, as `view`
/// may be asked to. A profile that reads back must be written and read again unchanged.
pub fn profile_json(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(p) = report::profile_json::from_json(text) else {
        return;
    };
    let again = report::profile_json::from_json(&report::profile_json::to_json(&p))
        .expect("a profile read back is written readably");
    assert_eq!(
        report::profile_json::to_json(&again),
        report::profile_json::to_json(&p)
    );
    use report::Format::*;
    for format in [
        Terminal, Json, Flamegraph, Speedscope, Collapsed, Pprof, Html,
    ] {
        for memory in [false, true] {
            let opts = report::RenderOptions {
                color: memory,
                width: 100,
                threads: memory,
                memory,
            };
            let _ = report::render(&p, format, &opts);
        }
    }
}

/// Where the fuzzer's memory lies in the stack walker's address space (as in the walker's
/// own tests, `python/stack/verify_tests.rs`, which write this target's seeds).
pub const STACK_BASE: u64 = 0x5500_0000_0000;
/// Type objects' addresses, as in those tests: code, frame, str, bytes.
pub const STACK_TYPES: [u64; 4] = [0x7000_0010, 0x7000_0020, 0x7000_0030, 0x7000_0040];

/// Python stacks over random memory.
/// - Byte 0 picks the layout (a generated table, or with its top bit set `_Py_DebugOffsets`
///   parsed from the memory itself, as for a 3.13+ interpreter).
/// - Bytes 1–8 are a thread state's address, bytes 9–16 its innermost frame's.
/// - The rest is the address space at [`STACK_BASE`].
///
/// The thread is walked as a paused one is, then as an unpaused one is (strict, through the
/// read cache) and verified. The interpreter list is read from `STACK_BASE`. The object
/// graph: the locals of the frames
/// of the paused walk are read as `dump --locals` reads them (see [`object_graph`]).
pub fn stack_walk(data: &[u8]) {
    let ([pick], rest) = take::<1>(data);
    let (tstate, rest) = take::<8>(rest);
    let (top, memory) = take::<8>(rest);
    let (tstate, top) = (u64::from_le_bytes(tstate), u64::from_le_bytes(top));
    let layout = if pick & 0x80 != 0 {
        match debug_offsets::parse(memory, debug_offsets::fallback_for(memory)) {
            Ok(l) => l,
            Err(_) => return,
        }
    } else {
        let all = python_bindings::GENERATED;
        *all[usize::from(pick) % all.len()]
    };
    let mem = BufferMemory {
        base: STACK_BASE,
        bytes: memory.to_vec(),
    };
    let [code, frame, unicode, bytes] = STACK_TYPES;
    let types = crate::python::TypeAddrs {
        code,
        frame,
        unicode,
        bytes,
        dict: 0,
        module: 0,
        int: 0,
    };
    let mut w = StackWalker::new(layout, types);
    w.max_depth = 512;
    w.want_anchors = true;
    if let Ok(walk) = w.walk_still(&mem, tstate, top) {
        object_graph(&layout, &types, &mem, &walk.chain, top);
    }
    if let Ok(threads) = w.threads(&mem, STACK_BASE, None, None) {
        for t in threads.iter().take(4) {
            let _ = w.walk_still(&mem, t.tstate, t.top_frame);
        }
    }
    w.strict = true;
    let cache = PageCache::new(&mem);
    if let Ok(mut walk) = w.walk(&cache, top) {
        let _ = w.verify(&cache, tstate, &mut walk, Some(&mem as &dyn ProcessMemory));
    }
}

/// The locals of frames `chain` (and, as an object, the word at `top`) read from `mem`
/// under tight bounds and a small budget. Every value's text stays bounded, whatever the
/// objects claim (sizes, cycles, pointers).
fn object_graph(
    layout: &python_bindings::Layout,
    types: &crate::python::TypeAddrs,
    mem: &dyn ProcessMemory,
    chain: &[u64],
    top: u64,
) {
    use crate::python::locals::{self, Budget, Budgeted, LocalsLayout, ReprBounds, Values};
    let (major, minor) = layout.version;
    let Some(objects) = python_bindings::object_layout(major, minor, layout.free_threaded) else {
        return;
    };
    let l = LocalsLayout {
        layout,
        objects,
        types,
    };
    let bounds = ReprBounds { depth: 3, len: 8 };
    let budget = Budget {
        bytes: 1 << 20,
        time: std::time::Duration::from_secs(1),
    };
    let budgeted = Budgeted::new(mem, budget);
    // Text grows with what is read: at most `len` items per level and characters per
    // string, each type name (128 bytes at most) read once, and an int's decimal digits
    // (about 2.3 per byte of digits read). So 1 MiB of budget writes well under 4 MiB.
    const MOST: usize = 4 << 20;
    let frames: Vec<u64> = chain.iter().copied().take(16).collect();
    for f in locals::read_frames(&l, &budgeted, &frames, bounds)
        .into_iter()
        .flatten()
    {
        for local in f {
            assert!(
                local.repr.len() < MOST,
                "a repr of {} bytes",
                local.repr.len()
            );
        }
    }
    let values = Values::new(objects, &budgeted, &layout.string, types, bounds);
    if let Ok((_, text)) = values.repr(top) {
        assert!(text.len() < MOST, "a repr of {} bytes", text.len());
    }
}

/// Asyncio task graphs over random memory. Byte 0 picks 3.14's or 3.15's layout (frames,
/// strings). The rest goes to `python::fuzz_tasks` (the offsets, the thread state's place,
/// the address space at [`STACK_BASE`]). What it reads is rendered as `dump --async`
/// renders it (the await tree, cycles and all).
pub fn async_tasks(data: &[u8]) {
    let ([pick], rest) = take::<1>(data);
    let Some(layout) = python_bindings::generated(3, 14 + u32::from(pick & 1), false) else {
        return;
    };
    let [code, frame, unicode, bytes] = STACK_TYPES;
    let types = crate::python::TypeAddrs {
        code,
        frame,
        unicode,
        bytes,
        dict: 0,
        module: 0,
        int: 0,
    };
    let mut w = StackWalker::new(*layout, types);
    w.max_depth = 256;
    let threads = crate::python::fuzz_tasks(rest, STACK_BASE, &mut w);
    let snap = crate::python::Snapshot {
        pid: 1,
        python_version: "3.14.0".into(),
        version_source: crate::python::version::VersionSource::PyVersionSymbol,
        untested_version: false,
        free_threaded: false,
        executable: "/fuzz".into(),
        threads: Vec::new(),
        native: None,
        asyncio: Some(crate::python::AsyncSnapshot {
            threads,
            unavailable: None,
        }),
        greenlets: None,
        python_names_unavailable: None,
        left_out: 0,
        woken: Vec::new(),
        stale_ids: Vec::new(),
    };
    let _ = report::dump::to_text(&snap);
    let _ = report::dump::to_json_string(&snap);
}

/// A native stack. Bytes 0–15 pick the instruction pointer (a module of this process, and
/// an offset into it) and the frame pointer. The rest is the stack from the stack pointer
/// up. It is unwound with this process's own modules' rules, as a captured thread's is.
pub fn unwind(data: &[u8]) {
    native::fuzz::fuzz_unwind(data);
}
