//! Layouts read at run time from `_Py_DebugOffsets` (CPython 3.13+).
//!
//! Since 3.13, `_PyRuntime` begins with a struct of offsets meant for out-of-process tools:
//! a cookie ("xdebugpy"), the version (`PY_VERSION_HEX`), a free-threading flag, then
//! sections of `uint64_t` offsets (runtime, interpreter, thread, frame, code, objects...).
//! Reading it, rather than trusting a table built into this binary, is what keeps us right
//! across patch releases and lets a minor version we have no generated table for work.
//!
//! The struct is only stable within a minor version. 3.14 inserts fields in the middle of
//! several sections. So its field order is data, one [`OffsetsTable`] per minor version
//! ([`TABLES`]), chosen by the version in the header. A minor version with no table is
//! refused by name ([`DebugOffsetsError::UnsupportedVersion`]). As a second line of defence
//! the values are checked against structural invariants (every offset inside its struct,
//! sizes plausible), so a table that does not fit the bytes is refused instead of producing
//! garbage.
//!
//! Owns: [`parse`], which turns the first bytes of `_PyRuntime` into a [`Layout`].
//! Must not: read process memory (the caller passes the bytes).

pub(crate) use super::debug_offsets_fields::{FIELDS_3_13, FIELDS_3_14, FIELDS_3_15};
use super::{
    CodeLayout, FrameLayout, FrameModel, InterpLayout, Layout, LineTableFormat, RuntimeLayout,
    StringLayout, StringModel, ThreadLayout,
};

/// The cookie at the start of `_Py_DebugOffsets`.
const COOKIE: &[u8; 8] = b"xdebugpy";

/// Bytes before the first offset: `char cookie[8]`, `uint64_t version`,
/// `uint64_t free_threaded` (the same in every version so far).
const HEADER: usize = 24;

/// Why the debug offsets could not be used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DebugOffsetsError {
    #[error("_PyRuntime does not start with the _Py_DebugOffsets cookie \"xdebugpy\"")]
    NoCookie,
    #[error("_Py_DebugOffsets is truncated: {got} bytes, {need} needed")]
    Truncated { got: usize, need: usize },
    #[error("_Py_DebugOffsets carries version {0:#x}, which is not a CPython 3.13+ version")]
    BadVersion(u64),
    #[error(
        "Python {0} is not supported: its _Py_DebugOffsets layout is unknown to this build \
         (known: {1})"
    )]
    UnsupportedVersion(String, String),
    #[error("the _Py_DebugOffsets of Python {0} does not have the expected layout ({1})")]
    UnknownLayout(String, String),
}

/// The field order of one minor version's `_Py_DebugOffsets`.
#[derive(Debug, Clone, Copy)]
struct OffsetsTable {
    /// The CPython 3.x minor version this order belongs to.
    minor: u32,
    /// Every `uint64_t` after the header, in declaration order, as "section.field".
    fields: &'static [&'static str],
}

/// Every layout we know, oldest first.
const TABLES: &[OffsetsTable] = &[
    // From CPython 3.13.0 Include/internal/pycore_runtime.h; tested against libpython3.13.
    OffsetsTable {
        minor: 13,
        fields: FIELDS_3_13,
    },
    // From CPython 3.14 Include/internal/pycore_debug_offsets.h; tested against Debian's 3.14.
    OffsetsTable {
        minor: 14,
        fields: FIELDS_3_14,
    },
    // From CPython 3.15 Include/internal/pycore_debug_offsets.h; tested against Debian's 3.15.
    OffsetsTable {
        minor: 15,
        fields: FIELDS_3_15,
    },
];

/// Offsets that may legitimately be 0 or lie outside their section's `size` (values that are
/// not offsets into the section's struct, or are only meaningful in free-threaded builds).
const NOT_CHECKED: &[&str] = &[
    "interpreter_state.gil_runtime_state_enabled",
    "interpreter_state.tlbc_generation",
    "interpreter_frame.tlbc_index",
    "code_object.co_tlbc",
];

/// The generated table that supplies what `_Py_DebugOffsets` does not carry for the struct
/// in `bytes`: the same version and build kind's when we have it, else the newest of the
/// same build kind (free-threaded or not), else the newest.
pub fn fallback_for(bytes: &[u8]) -> &'static Layout {
    let newest = |ft: bool| {
        super::GENERATED
            .iter()
            .rev()
            .copied()
            .find(|l| l.free_threaded == ft)
    };
    let ft = free_threaded_flag(bytes);
    let minor = version_hex(bytes).and_then(|h| check_version(h).ok());
    minor
        .and_then(|m| super::generated(3, m, ft))
        .or_else(|| newest(ft))
        .or_else(|| super::GENERATED.last().copied())
        .expect("at least one generated layout")
}

/// The header's `free_threaded` flag (false when the header is cut short).
fn free_threaded_flag(bytes: &[u8]) -> bool {
    bytes.len() >= HEADER && read_u64(bytes, 16) != 0
}

/// The `PY_VERSION_HEX` in the header, when the cookie is there.
pub fn version_hex(bytes: &[u8]) -> Option<u64> {
    if bytes.len() < 16 || &bytes[..8] != COOKIE {
        return None;
    }
    Some(read_u64(bytes, 8))
}

/// Offset in the interpreter state of its `remote_debugging_enabled` flag (PEP 768, 3.14+),
/// from the first bytes of `_PyRuntime`; None before 3.14 or when these are not debug offsets.
pub fn remote_debugging_enabled_offset(bytes: &[u8]) -> Option<u64> {
    field(bytes, "debugger_support.remote_debugging_enabled")
}

/// The value of one field ("section.field", as in the tables) of the debug offsets at the
/// start of `bytes`; None when these are not debug offsets of a version we know, or that
/// version has no such field.
pub fn field(bytes: &[u8], name: &str) -> Option<u64> {
    let minor = check_version(version_hex(bytes)?).ok()?;
    let i = table(minor)?.fields.iter().position(|n| *n == name)?;
    (bytes.len() >= HEADER + (i + 1) * 8).then(|| read_u64(bytes, HEADER + i * 8))
}

/// The table for CPython 3.`minor`, if we know its layout.
fn table(minor: u32) -> Option<&'static OffsetsTable> {
    TABLES.iter().find(|t| t.minor == minor)
}

fn read_u64(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"))
}

/// "3.13.0", "3.14.0b4", ... for messages.
fn version_string(hex: u64) -> String {
    let (major, minor, micro) = ((hex >> 24) & 0xff, (hex >> 16) & 0xff, (hex >> 8) & 0xff);
    let (level, serial) = ((hex >> 4) & 0xf, hex & 0xf);
    let suffix = match level {
        0xa => format!("a{serial}"),
        0xb => format!("b{serial}"),
        0xc => format!("rc{serial}"),
        _ => String::new(),
    };
    format!("{major}.{minor}.{micro}{suffix}")
}

/// Checks the `PY_VERSION_HEX`: major 3, minor ≥ 13, a valid release level, nothing above
/// the low 32 bits. Returns the minor version.
fn check_version(hex: u64) -> Result<u32, DebugOffsetsError> {
    let (major, minor, level) = ((hex >> 24) & 0xff, (hex >> 16) & 0xff, (hex >> 4) & 0xf);
    let level_ok = matches!(level, 0xa | 0xb | 0xc | 0xf);
    if hex >> 32 != 0 || major != 3 || minor < 13 || !level_ok {
        return Err(DebugOffsetsError::BadVersion(hex));
    }
    Ok(minor as u32)
}

struct Fields<'a> {
    table: &'a OffsetsTable,
    bytes: &'a [u8],
}

impl Fields<'_> {
    fn get(&self, name: &str) -> u64 {
        let i = self
            .table
            .fields
            .iter()
            .position(|n| *n == name)
            .unwrap_or_else(|| panic!("{name} is missing from the 3.{} table", self.table.minor));
        read_u64(self.bytes, HEADER + i * 8)
    }
    fn us(&self, name: &str) -> usize {
        self.get(name) as usize
    }
    fn has(&self, name: &str) -> bool {
        self.table.fields.contains(&name)
    }
}

/// Builds a [`Layout`] from the first bytes of `_PyRuntime` (at least the whole
/// `_Py_DebugOffsets`). Fields the debug offsets do not carry (the compact unicode size,
/// the legacy unicode data offset, the `state` bit positions) come from `fallback` (see
/// [`fallback_for`]), the newest generated table. `co_code` and `_co_firsttraceable` do
/// not exist in 3.13+ and are `None`.
///
/// Long (about 120 lines) on purpose. Most of it is the one `Layout` literal, a field per
/// line, each named by the debug-offsets field it comes from. Split, the mapping from one
/// to the other would no longer read in one place.
pub fn parse(bytes: &[u8], fallback: &Layout) -> Result<Layout, DebugOffsetsError> {
    if bytes.len() < HEADER {
        if bytes.len() >= 8 && &bytes[..8] != COOKIE {
            return Err(DebugOffsetsError::NoCookie);
        }
        return Err(DebugOffsetsError::Truncated {
            got: bytes.len(),
            need: HEADER,
        });
    }
    let hex = version_hex(bytes).ok_or(DebugOffsetsError::NoCookie)?;
    let minor = check_version(hex)?;
    let version = version_string(hex);
    let free_threaded = free_threaded_flag(bytes);
    let table = table(minor).ok_or_else(|| {
        let known = TABLES
            .iter()
            .map(|t| format!("3.{}", t.minor))
            .collect::<Vec<_>>()
            .join(", ");
        DebugOffsetsError::UnsupportedVersion(version.clone(), known)
    })?;
    let need = HEADER + table.fields.len() * 8;
    if bytes.len() < need {
        return Err(DebugOffsetsError::Truncated {
            got: bytes.len(),
            need,
        });
    }
    let f = Fields { table, bytes };
    check_invariants(&f, free_threaded)
        .map_err(|why| DebugOffsetsError::UnknownLayout(version, why))?;
    // Sizes the struct does not carry before 3.15, from the fallback's distances to what it
    // does carry (a compact string's header adds the same fields to an ASCII one's whatever
    // the object header's size).
    let ascii_size = f.us("unicode_object.asciiobject_size");
    let compact_size = if f.has("unicode_object.compactunicodeobject_size") {
        f.us("unicode_object.compactunicodeobject_size")
    } else {
        ascii_size + (fallback.string.compact_size - fallback.string.ascii_size)
    };
    let unicode_data_any =
        compact_size + (fallback.string.unicode_data_any - fallback.string.compact_size);

    // `gil_runtime_state_locked` / `_holder` are offsets inside PyInterpreterState of the
    // interpreter's own `_gil` struct's fields; we need them relative to the struct that
    // `ceval.gil` points to (which is the start of a `_gil_runtime_state`).
    let gil_base = f.get("interpreter_state.gil_runtime_state");
    // A free-threaded build has the same GIL state, unused (never locked) unless the GIL is
    // turned on at run time (PYTHON_GIL=1). So reading it gives no holder, or the real one.
    let gil = |name: &str| Some((f.get(name) - gil_base) as usize);
    Ok(Layout {
        version: (3, minor),
        free_threaded,
        runtime: RuntimeLayout {
            interpreters_head: Some(f.us("runtime_state.interpreters_head")),
            gilstate_tstate_current: None,
        },
        interp: InterpLayout {
            next: f.us("interpreter_state.next"),
            tstate_head: f.us("interpreter_state.threads_head"),
            id: Some(f.us("interpreter_state.id")),
            ceval_gil: Some(f.us("interpreter_state.ceval_gil")),
            gil_locked: gil("interpreter_state.gil_runtime_state_locked"),
            gil_last_holder: gil("interpreter_state.gil_runtime_state_holder"),
        },
        thread: ThreadLayout {
            next: f.us("thread_state.next"),
            interp: f.us("thread_state.interp"),
            frame: f.us("thread_state.current_frame"),
            cframe_current_frame: None,
            cframe_previous: None,
            root_cframe: None,
            thread_id: f.us("thread_state.thread_id"),
            native_thread_id: Some(f.us("thread_state.native_thread_id")),
        },
        frame: FrameLayout {
            model: FrameModel::Interpreter,
            back: f.us("interpreter_frame.previous"),
            code: f.us("interpreter_frame.executable"),
            lasti: f.us("interpreter_frame.instr_ptr"),
            owner: Some(f.us("interpreter_frame.owner")),
            is_entry: None,
            size: f.us("interpreter_frame.size"),
            // Not carried by _Py_DebugOffsets (nor in 3.13's installed headers).
            stacktop: None,
            executing: None,
            state: None,
            executing_state: fallback.frame.executing_state,
            gen_iframe: None,
            gen_frame_state: None,
        },
        code: CodeLayout {
            filename: f.us("code_object.filename"),
            name: f.us("code_object.name"),
            qualname: Some(f.us("code_object.qualname")),
            firstlineno: f.us("code_object.firstlineno"),
            linetable: f.us("code_object.linetable"),
            linetable_format: LineTableFormat::Locations311,
            co_code: None,
            code_adaptive: Some(f.us("code_object.co_code_adaptive")),
            firsttraceable: None,
            // Not in _Py_DebugOffsets: `int co_flags` sits right before `int co_argcount`
            // in every 3.11+ code object (checked against each generated table by tests).
            flags: f.us("code_object.argcount") - 4,
            size: f.us("code_object.size"),
        },
        string: StringLayout {
            model: StringModel::Pep393,
            ob_type: f.us("pyobject.ob_type"),
            bytes_size: f.us("bytes_object.ob_size"),
            bytes_sval: f.us("bytes_object.ob_sval"),
            unicode_length: f.us("unicode_object.length"),
            unicode_state: f.us("unicode_object.state"),
            ascii_size,
            compact_size,
            unicode_data_any,
            ..fallback.string
        },
    })
}

/// Checks that the bytes read with this table make sense: every offset of a sized section
/// lies inside that section's struct, and the sizes are in sane ranges. Bytes of another
/// layout (a table chosen wrongly, a misread address) fail here.
fn check_invariants(f: &Fields, free_threaded: bool) -> Result<(), String> {
    let sections = [
        ("runtime_state", 1024..16 << 20),
        ("interpreter_state", 1024..16 << 20),
        ("thread_state", 64..65536),
        ("interpreter_frame", 32..1024),
        ("code_object", 64..4096),
        ("pyobject", 16..64),
        ("bytes_object", 24..128),
        ("unicode_object", 24..256),
    ];
    for (section, range) in sections {
        let size = f.get(&format!("{section}.size"));
        if !range.contains(&size) {
            return Err(format!("{section}.size = {size} is implausible"));
        }
        let prefix = format!("{section}.");
        for name in
            f.table.fields.iter().filter(|n| {
                n.starts_with(&prefix) && !n.ends_with(".size") && !NOT_CHECKED.contains(n)
            })
        {
            let off = f.get(name);
            if off >= size {
                return Err(format!(
                    "{name} = {off} lies outside its struct ({size} bytes)"
                ));
            }
        }
    }
    let base = f.get("interpreter_state.gil_runtime_state");
    for name in [
        "interpreter_state.gil_runtime_state_locked",
        "interpreter_state.gil_runtime_state_holder",
    ] {
        let off = f.get(name);
        if off < base || off - base >= 4096 {
            return Err(format!(
                "{name} = {off} is not inside the GIL state at {base}"
            ));
        }
    }
    // The object header: refcount then type (16 bytes), or a free-threaded build's owner
    // thread, flags, local and shared refcounts then type (32 bytes).
    let ob_type = if free_threaded { 24 } else { 8 };
    if f.get("pyobject.ob_type") != ob_type {
        return Err(format!("PyObject.ob_type is not at offset {ob_type}"));
    }
    if f.get("code_object.argcount") < 4 + ob_type + 8 {
        return Err("PyCodeObject.co_argcount lies inside the object header".into());
    }
    if f.get("unicode_object.asciiobject_size") <= f.get("unicode_object.state") {
        return Err("sizeof(PyASCIIObject) does not cover its state field".into());
    }
    Ok(())
}

/// For tests: the first `len` bytes of a CPython 3.14 `_PyRuntime` (at least its debug
/// offsets), the header written and every offset 0.
#[cfg(test)]
pub(crate) fn runtime_3_14_for_tests(len: usize) -> Vec<u8> {
    let mut b = vec![0u8; len.max(HEADER + FIELDS_3_14.len() * 8)];
    b[..8].copy_from_slice(COOKIE);
    b[8..16].copy_from_slice(&0x030e_00f0u64.to_le_bytes());
    b
}

/// For tests: sets the 3.14 debug offset `name` ("section.field") in `bytes` (see
/// [`runtime_3_14_for_tests`]) to `value`.
#[cfg(test)]
pub(crate) fn set_3_14_field(bytes: &mut [u8], name: &str, value: u64) {
    let i = FIELDS_3_14
        .iter()
        .position(|n| *n == name)
        .unwrap_or_else(|| panic!("3.14 has no debug offset {name}"));
    bytes[HEADER + i * 8..HEADER + (i + 1) * 8].copy_from_slice(&value.to_le_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A plausible `_Py_DebugOffsets` for `table`, every field set, then `overrides`.
    fn build(table: &OffsetsTable, hex: u64, overrides: &[(&str, u64)]) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(COOKIE);
        b.extend_from_slice(&hex.to_le_bytes());
        b.extend_from_slice(&0u64.to_le_bytes());
        for (i, name) in table.fields.iter().enumerate() {
            let v: u64 = match *name {
                "runtime_state.size" | "interpreter_state.size" => 100_000,
                "thread_state.size" => 400,
                "interpreter_frame.size" => 80,
                "code_object.size" => 200,
                "pyobject.size" => 16,
                "pyobject.ob_type" => 8,
                "bytes_object.size" => 120,
                "unicode_object.size" => 200,
                "unicode_object.state" => 32,
                "unicode_object.asciiobject_size" => 40,
                "interpreter_state.gil_runtime_state" => 5000,
                "interpreter_state.gil_runtime_state_locked" => 5016,
                "interpreter_state.gil_runtime_state_holder" => 5008,
                n if n.ends_with(".size") => 1000,
                // Distinct small values, so a field read from the wrong slot shows.
                _ => 1 + i as u64,
            };
            b.extend_from_slice(&v.to_le_bytes());
        }
        for (name, v) in overrides {
            let i = table.fields.iter().position(|n| n == name).unwrap();
            b[HEADER + i * 8..HEADER + i * 8 + 8].copy_from_slice(&v.to_le_bytes());
        }
        b
    }

    fn sample() -> Vec<u8> {
        build(table(13).unwrap(), 0x030d00f0, &[])
    }

    fn fallback() -> Layout {
        **super::super::GENERATED.last().unwrap()
    }

    fn slot(table: &OffsetsTable, name: &str) -> usize {
        1 + table.fields.iter().position(|n| *n == name).unwrap()
    }

    #[test]
    fn the_tables_are_consistent() {
        assert_eq!(FIELDS_3_13.len(), 70);
        assert_eq!(FIELDS_3_14.len(), 92);
        assert_eq!(FIELDS_3_15.len(), 108);
        for t in TABLES {
            for (i, a) in t.fields.iter().enumerate() {
                assert!(a.contains('.'), "{a}");
                assert!(!t.fields[i + 1..].contains(a), "3.{}: {a} twice", t.minor);
            }
        }
        let minors: Vec<u32> = TABLES.iter().map(|t| t.minor).collect();
        assert!(minors.windows(2).all(|w| w[0] < w[1]), "oldest first");
    }

    #[test]
    fn parses_a_3_13_struct() {
        let t = table(13).unwrap();
        let l = parse(&sample(), &fallback()).unwrap();
        assert_eq!(l.version, (3, 13));
        assert_eq!(l.interp.gil_locked, Some(16));
        assert_eq!(l.interp.gil_last_holder, Some(8));
        assert_eq!(
            l.interp.tstate_head,
            slot(t, "interpreter_state.threads_head")
        );
        assert_eq!(l.thread.frame, slot(t, "thread_state.current_frame"));
        assert_eq!(l.frame.code, slot(t, "interpreter_frame.executable"));
        assert_eq!(l.frame.owner, Some(slot(t, "interpreter_frame.owner")));
        assert_eq!(
            l.code.code_adaptive,
            Some(slot(t, "code_object.co_code_adaptive"))
        );
        assert_eq!(l.string.bytes_sval, slot(t, "bytes_object.ob_sval"));
        assert_eq!(l.string.unicode_length, slot(t, "unicode_object.length"));
        assert_eq!(l.string.compact_size, fallback().string.compact_size);
        assert_eq!(l.code.firsttraceable, None);
    }

    #[test]
    fn parses_a_3_14_struct_with_its_own_field_order() {
        let t = table(14).unwrap();
        let b = build(t, 0x030e00f0, &[]);
        let l = parse(&b, &fallback()).unwrap();
        assert_eq!(l.version, (3, 14));
        // Fields after the 3.14 insertions come from their 3.14 slots.
        assert_eq!(
            l.interp.tstate_head,
            slot(t, "interpreter_state.threads_head")
        );
        assert_eq!(
            l.interp.ceval_gil,
            Some(slot(t, "interpreter_state.ceval_gil"))
        );
        assert_eq!(l.thread.frame, slot(t, "thread_state.current_frame"));
        assert_eq!(l.code.size, 200);
        assert_eq!(l.string.bytes_sval, slot(t, "bytes_object.ob_sval"));
        assert_ne!(
            slot(t, "bytes_object.ob_sval"),
            slot(table(13).unwrap(), "bytes_object.ob_sval")
        );
        // The whole 3.14 struct is required.
        assert_eq!(
            parse(&b[..HEADER + FIELDS_3_13.len() * 8], &fallback()),
            Err(DebugOffsetsError::Truncated {
                got: HEADER + 70 * 8,
                need: HEADER + 92 * 8
            })
        );
    }

    #[test]
    fn finds_the_remote_debugging_switch_from_3_14_on() {
        let t = table(14).unwrap();
        let b = build(t, 0x030e00f0, &[]);
        assert_eq!(
            remote_debugging_enabled_offset(&b),
            Some(slot(t, "debugger_support.remote_debugging_enabled") as u64)
        );
        // 3.13 has no such switch; bytes that are not debug offsets have none either.
        assert_eq!(remote_debugging_enabled_offset(&sample()), None);
        assert_eq!(remote_debugging_enabled_offset(&b[..HEADER]), None);
        assert_eq!(
            remote_debugging_enabled_offset(b"not offsets at all......"),
            None
        );
    }

    #[test]
    fn rejects_a_bad_cookie() {
        let mut b = sample();
        b[0] = b'y';
        assert_eq!(parse(&b, &fallback()), Err(DebugOffsetsError::NoCookie));
        assert_eq!(
            parse(&[0u8; 4096], &fallback()),
            Err(DebugOffsetsError::NoCookie)
        );
        assert_eq!(
            parse(b"ydebugpy", &fallback()),
            Err(DebugOffsetsError::NoCookie)
        );
    }

    #[test]
    fn rejects_truncated_buffers() {
        let b = sample();
        for len in [0, 7, 8, 16, 23] {
            assert!(
                matches!(
                    parse(&b[..len], &fallback()),
                    Err(DebugOffsetsError::Truncated { need: HEADER, .. })
                ),
                "{len} bytes"
            );
        }
        assert_eq!(
            parse(&b[..100], &fallback()),
            Err(DebugOffsetsError::Truncated {
                got: 100,
                need: HEADER + 70 * 8
            })
        );
        assert!(parse(&b[..b.len() - 1], &fallback()).is_err());
    }

    #[test]
    fn reads_free_threaded_builds() {
        // A free-threaded 3.13: 32-byte object headers, so every object field is 16 further.
        let t = table(13).unwrap();
        let mut b = build(
            t,
            0x030d00f0,
            &[
                ("pyobject.size", 32),
                ("pyobject.ob_type", 24),
                ("unicode_object.state", 48),
                ("unicode_object.asciiobject_size", 56),
            ],
        );
        b[16] = 1;
        let l = parse(&b, &fallback()).unwrap();
        assert!(l.free_threaded);
        assert_eq!(l.string.ob_type, 24);
        assert_eq!(l.string.ascii_size, 56);
        let f = fallback();
        assert_eq!(
            l.string.compact_size,
            56 + f.string.compact_size - f.string.ascii_size
        );
        // The GIL state is read as in a GIL build (it is never locked while the GIL is off).
        assert_eq!(l.interp.gil_locked, Some(16));
        assert_eq!(
            l.code.flags,
            slot(t, "code_object.argcount") - 4,
            "co_flags is the int before co_argcount"
        );
        // A free-threaded header with a 16-byte object header is not a layout we know.
        let mut b = sample();
        b[16] = 1;
        assert!(matches!(
            parse(&b, &fallback()),
            Err(DebugOffsetsError::UnknownLayout(..))
        ));
        // The fallback for a free-threaded 3.13 is the generated 3.13t table.
        let mut b = sample();
        b[16] = 1;
        let fb = fallback_for(&b);
        assert_eq!((fb.version, fb.free_threaded), ((3, 13), true));
        assert!(!fallback_for(&sample()).free_threaded);
    }

    #[test]
    fn rejects_bad_versions() {
        for hex in [
            0x030c01f0u64,         // 3.12.1: has no debug offsets
            0x020700f0,            // 2.7
            0x040000f0,            // 4.0
            0x030d0000,            // release level 0: garbage
            0xdead_beef_030d_00f0, // bits above PY_VERSION_HEX
            0xffff_ffff_ffff_ffff, // garbage
        ] {
            let mut b = sample();
            b[8..16].copy_from_slice(&hex.to_le_bytes());
            assert_eq!(
                parse(&b, &fallback()),
                Err(DebugOffsetsError::BadVersion(hex)),
                "{hex:#x}"
            );
        }
    }

    #[test]
    fn names_an_unsupported_newer_version() {
        let mut b = sample();
        b[8..16].copy_from_slice(&0x031000a2u64.to_le_bytes());
        let err = parse(&b, &fallback()).unwrap_err();
        assert_eq!(
            err,
            DebugOffsetsError::UnsupportedVersion("3.16.0a2".into(), "3.13, 3.14, 3.15".into())
        );
        assert!(err.to_string().contains("Python 3.16.0a2 is not supported"));
    }

    #[test]
    fn rejects_bytes_that_do_not_fit_the_table() {
        // A field pushed outside its struct (as a wrongly chosen table would read).
        let b = build(
            table(13).unwrap(),
            0x030d00f0,
            &[("thread_state.next", 9999)],
        );
        assert!(matches!(
            parse(&b, &fallback()),
            Err(DebugOffsetsError::UnknownLayout(..))
        ));
        // 3.13 bytes labelled 3.14, which the 3.14 order reads at the wrong slots.
        let mut b = sample();
        b[8..16].copy_from_slice(&0x030e00f0u64.to_le_bytes());
        b.resize(HEADER + FIELDS_3_14.len() * 8, 0);
        assert!(matches!(
            parse(&b, &fallback()),
            Err(DebugOffsetsError::UnknownLayout(..))
        ));
    }

    #[test]
    fn version_hex_reads_the_header() {
        assert_eq!(version_hex(&sample()), Some(0x030d00f0));
        assert_eq!(version_hex(b"xdebugpy"), None);
        assert_eq!(version_hex(&[0u8; 32]), None);
        assert_eq!(version_string(0x030e00c1), "3.14.0rc1");
    }
}
