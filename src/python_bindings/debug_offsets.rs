//! Layouts read at run time from `_Py_DebugOffsets` (CPython 3.13+).
//!
//! Since 3.13, `_PyRuntime` begins with a struct of offsets meant for out-of-process tools:
//! a cookie ("xdebugpy"), the version (`PY_VERSION_HEX`), a free-threading flag, then
//! sections of `uint64_t` offsets (runtime, interpreter, thread, frame, code, objects...).
//! Reading it, rather than trusting a table built into this binary, is what lets a newer
//! interpreter work untested.
//!
//! Owns: [`parse`], which turns the first bytes of `_PyRuntime` into a [`Layout`]. The field
//! order of the struct is data ([`FIELDS_3_13`]), checked against structural invariants so
//! that a layout we do not know is refused with a clear error instead of producing garbage.
//! Must not: read process memory (the caller passes the bytes).

use super::{
    CodeLayout, FrameLayout, FrameModel, InterpLayout, Layout, LineTableFormat, RuntimeLayout,
    StringLayout, StringModel, ThreadLayout,
};

/// The cookie at the start of `_Py_DebugOffsets`.
pub const COOKIE: &[u8; 8] = b"xdebugpy";

/// Why the debug offsets could not be used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DebugOffsetsError {
    #[error("_PyRuntime does not start with the _Py_DebugOffsets cookie")]
    NoCookie,
    #[error("_Py_DebugOffsets is truncated ({0} bytes)")]
    Truncated(usize),
    #[error("_Py_DebugOffsets carries version {0:#x}, which is not a CPython 3.13+ version")]
    BadVersion(u64),
    #[error("free-threaded (no-GIL) builds are not supported yet")]
    FreeThreaded,
    #[error("the _Py_DebugOffsets layout of Python {0} is not one we know ({1})")]
    UnknownLayout(String, String),
}

/// The fields of `_Py_DebugOffsets` after the header, in declaration order, as
/// "section.field" names. CPython 3.13 (`Include/internal/pycore_runtime.h`).
pub const FIELDS_3_13: &[&str] = &[
    "runtime_state.size",
    "runtime_state.finalizing",
    "runtime_state.interpreters_head",
    "interpreter_state.size",
    "interpreter_state.id",
    "interpreter_state.next",
    "interpreter_state.threads_head",
    "interpreter_state.gc",
    "interpreter_state.imports_modules",
    "interpreter_state.sysdict",
    "interpreter_state.builtins",
    "interpreter_state.ceval_gil",
    "interpreter_state.gil_runtime_state",
    "interpreter_state.gil_runtime_state_enabled",
    "interpreter_state.gil_runtime_state_locked",
    "interpreter_state.gil_runtime_state_holder",
    "thread_state.size",
    "thread_state.prev",
    "thread_state.next",
    "thread_state.interp",
    "thread_state.current_frame",
    "thread_state.thread_id",
    "thread_state.native_thread_id",
    "thread_state.datastack_chunk",
    "thread_state.status",
    "interpreter_frame.size",
    "interpreter_frame.previous",
    "interpreter_frame.executable",
    "interpreter_frame.instr_ptr",
    "interpreter_frame.localsplus",
    "interpreter_frame.owner",
    "code_object.size",
    "code_object.filename",
    "code_object.name",
    "code_object.qualname",
    "code_object.linetable",
    "code_object.firstlineno",
    "code_object.argcount",
    "code_object.localsplusnames",
    "code_object.localspluskinds",
    "code_object.co_code_adaptive",
    "pyobject.size",
    "pyobject.ob_type",
    "type_object.size",
    "type_object.tp_name",
    "type_object.tp_repr",
    "type_object.tp_flags",
    "tuple_object.size",
    "tuple_object.ob_item",
    "tuple_object.ob_size",
    "list_object.size",
    "list_object.ob_item",
    "list_object.ob_size",
    "dict_object.size",
    "dict_object.ma_keys",
    "dict_object.ma_values",
    "float_object.size",
    "float_object.ob_fval",
    "long_object.size",
    "long_object.lv_tag",
    "long_object.ob_digit",
    "bytes_object.size",
    "bytes_object.ob_size",
    "bytes_object.ob_sval",
    "unicode_object.size",
    "unicode_object.state",
    "unicode_object.length",
    "unicode_object.asciiobject_size",
    "gc.size",
    "gc.collecting",
];

/// Bytes before the first offset: cookie, version, free_threaded.
const HEADER: usize = 24;

/// The `PY_VERSION_HEX` in the header, when the cookie is there.
pub fn version_hex(bytes: &[u8]) -> Option<u64> {
    if bytes.len() < 16 || &bytes[..8] != COOKIE {
        return None;
    }
    Some(u64::from_le_bytes(bytes[8..16].try_into().ok()?))
}

struct Fields<'a> {
    names: &'a [&'a str],
    bytes: &'a [u8],
}

impl Fields<'_> {
    fn get(&self, name: &str) -> u64 {
        let i = self
            .names
            .iter()
            .position(|n| *n == name)
            .expect("field names come from our own table");
        let off = HEADER + i * 8;
        u64::from_le_bytes(self.bytes[off..off + 8].try_into().expect("8 bytes"))
    }
    fn us(&self, name: &str) -> usize {
        self.get(name) as usize
    }
}

/// Builds a [`Layout`] from the first bytes of `_PyRuntime`. Fields the debug offsets do not
/// carry (compact unicode size, bitfield positions, `co_code`) come from `fallback`, the
/// newest generated table.
pub fn parse(bytes: &[u8], fallback: &Layout) -> Result<Layout, DebugOffsetsError> {
    let hex = version_hex(bytes).ok_or(if bytes.len() < 16 {
        DebugOffsetsError::Truncated(bytes.len())
    } else {
        DebugOffsetsError::NoCookie
    })?;
    let (major, minor) = ((hex >> 24) & 0xff, (hex >> 16) & 0xff);
    if major != 3 || minor < 13 || hex >> 32 != 0 {
        return Err(DebugOffsetsError::BadVersion(hex));
    }
    let need = HEADER + FIELDS_3_13.len() * 8;
    if bytes.len() < need {
        return Err(DebugOffsetsError::Truncated(bytes.len()));
    }
    if u64::from_le_bytes(bytes[16..24].try_into().expect("8 bytes")) != 0 {
        return Err(DebugOffsetsError::FreeThreaded);
    }
    let f = Fields {
        names: FIELDS_3_13,
        bytes,
    };
    let version = format!("{major}.{minor}");
    check_invariants(&f).map_err(|why| DebugOffsetsError::UnknownLayout(version, why))?;

    let gil_base = f.get("interpreter_state.gil_runtime_state");
    let layout = Layout {
        version: (major as u32, minor as u32),
        runtime: RuntimeLayout {
            interpreters_head: Some(f.us("runtime_state.interpreters_head")),
            gilstate_tstate_current: None,
        },
        interp: InterpLayout {
            next: f.us("interpreter_state.next"),
            tstate_head: f.us("interpreter_state.threads_head"),
            ceval_gil: Some(f.us("interpreter_state.ceval_gil")),
            // Given relative to the interpreter's own `_gil`; we need them inside the struct
            // that `ceval.gil` points to.
            gil_locked: Some(
                (f.get("interpreter_state.gil_runtime_state_locked") - gil_base) as usize,
            ),
            gil_last_holder: Some(
                (f.get("interpreter_state.gil_runtime_state_holder") - gil_base) as usize,
            ),
        },
        thread: ThreadLayout {
            next: f.us("thread_state.next"),
            interp: f.us("thread_state.interp"),
            frame: f.us("thread_state.current_frame"),
            cframe_current_frame: None,
            thread_id: f.us("thread_state.thread_id"),
            native_thread_id: Some(f.us("thread_state.native_thread_id")),
        },
        frame: FrameLayout {
            model: FrameModel::Interpreter,
            back: f.us("interpreter_frame.previous"),
            code: f.us("interpreter_frame.executable"),
            lasti: f.us("interpreter_frame.instr_ptr"),
            owner: Some(f.us("interpreter_frame.owner")),
            size: f.us("interpreter_frame.size"),
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
            size: f.us("code_object.size"),
        },
        string: StringLayout {
            model: StringModel::Pep393,
            ob_type: f.us("pyobject.ob_type"),
            bytes_size: f.us("bytes_object.ob_size"),
            bytes_sval: f.us("bytes_object.ob_sval"),
            unicode_length: f.us("unicode_object.length"),
            unicode_state: f.us("unicode_object.state"),
            ascii_size: f.us("unicode_object.asciiobject_size"),
            ..fallback.string
        },
    };
    Ok(layout)
}

/// Checks that the bytes read as a 3.13-shaped struct make sense: every offset lies inside
/// its section's size and the sizes are in sane ranges. A newer CPython that inserted
/// fields fails here instead of being misread.
fn check_invariants(f: &Fields) -> Result<(), String> {
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
        for name in f.names.iter().filter(|n| {
            n.starts_with(section)
                && n.as_bytes().get(section.len()) == Some(&b'.')
                && !n.ends_with(".size")
                && !n.ends_with("gil_runtime_state_enabled")
        }) {
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
        if f.get(name) < base {
            return Err(format!("{name} lies before the GIL state"));
        }
    }
    if f.get("pyobject.ob_type") != 8 {
        return Err("PyObject.ob_type is not at offset 8".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(COOKIE);
        b.extend_from_slice(&0x030d00f0u64.to_le_bytes());
        b.extend_from_slice(&0u64.to_le_bytes());
        for name in FIELDS_3_13 {
            let v: u64 = match *name {
                "runtime_state.size" | "interpreter_state.size" => 100_000,
                "thread_state.size" => 400,
                "interpreter_frame.size" => 80,
                "code_object.size" => 200,
                "pyobject.size" => 16,
                "pyobject.ob_type" => 8,
                "bytes_object.size" => 40,
                "unicode_object.size" => 80,
                "interpreter_state.gil_runtime_state" => 5000,
                "interpreter_state.gil_runtime_state_locked" => 5016,
                "interpreter_state.gil_runtime_state_holder" => 5008,
                n if n.ends_with(".size") => 1000,
                _ => 8,
            };
            b.extend_from_slice(&v.to_le_bytes());
        }
        b
    }

    fn fallback() -> Layout {
        **super::super::GENERATED.last().unwrap()
    }

    #[test]
    fn parses_a_3_13_struct() {
        let l = parse(&sample(), &fallback()).unwrap();
        assert_eq!(l.version, (3, 13));
        assert_eq!(l.interp.gil_locked, Some(16));
        assert_eq!(l.interp.gil_last_holder, Some(8));
    }

    #[test]
    fn rejects_bad_input() {
        let mut b = sample();
        b[0] = b'y';
        assert_eq!(parse(&b, &fallback()), Err(DebugOffsetsError::NoCookie));
        assert!(matches!(
            parse(&sample()[..100], &fallback()),
            Err(DebugOffsetsError::Truncated(100))
        ));
        let mut b = sample();
        b[16] = 1;
        assert_eq!(parse(&b, &fallback()), Err(DebugOffsetsError::FreeThreaded));
        let mut b = sample();
        b[8..16].copy_from_slice(&0x030c01f0u64.to_le_bytes());
        assert!(matches!(
            parse(&b, &fallback()),
            Err(DebugOffsetsError::BadVersion(_))
        ));
        // A field pushed outside its struct (as inserted fields in a newer version would).
        let mut b = sample();
        let i = FIELDS_3_13
            .iter()
            .position(|n| *n == "thread_state.next")
            .unwrap();
        b[HEADER + i * 8..HEADER + i * 8 + 8].copy_from_slice(&9999u64.to_le_bytes());
        assert!(matches!(
            parse(&b, &fallback()),
            Err(DebugOffsetsError::UnknownLayout(..))
        ));
    }
}
