//! Struct layouts of CPython's runtime objects, one table per minor version.
//!
//! Owns: the [`Layout`] description (byte offsets and sizes of the fields the stack walker
//! reads) and the generated per-version tables `v2_7.rs` ... `v3_13.rs`. Those files are
//! written by `tools/gen_bindings.py`, which compiles a small C probe against each
//! interpreter's own headers; never edit them by hand (see `docs/NEW_PYTHON_VERSION.md`).
//! For 3.13 and later the layout is also read at run time from `_Py_DebugOffsets`
//! (`debug_offsets.rs`), which is what makes an untested 3.14+ target work. What asyncio's
//! tasks need on 3.11–3.13 (before CPython describes them itself) is in a table of its own,
//! [`LegacyAsyncLayout`] (`asyncio_legacy.rs`, written by the same generator).
//!
//! Must not: read process memory (that is `crate::python`'s job) or know about output.

mod asyncio_legacy;
pub mod debug_offsets;
mod debug_offsets_fields;
pub(crate) mod opcodes;

mod v2_7;
mod v3_10;
mod v3_11;
mod v3_12;
mod v3_13;
mod v3_13t;
mod v3_14;
mod v3_15;
mod v3_6;
mod v3_7;
mod v3_8;
mod v3_9;

/// How a frame records its current instruction and how frames are chained.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameModel {
    /// 2.7 – 3.10: heap `PyFrameObject`s chained by `f_back`; `f_lasti` is an int.
    /// `lasti_in_code_units`: 3.10 counts 2-byte code units, older versions count bytes.
    Object { lasti_in_code_units: bool },
    /// 3.11+: `_PyInterpreterFrame`s chained by `previous`; the instruction pointer points
    /// into the code object's `co_code_adaptive`. `instr_is_next`: 3.13+ `instr_ptr`
    /// (the instruction being / about to be executed) vs 3.11–3.12 `prev_instr`
    /// (the last instruction started). Both give the current instruction directly.
    Interpreter,
}

/// Which line-table encoding `code.linetable` holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LineTableFormat {
    /// 2.7 – 3.5: `co_lnotab`, (byte increment, unsigned line increment) pairs.
    LnotabUnsigned,
    /// 3.6 – 3.9: `co_lnotab` with signed line increments.
    LnotabSigned,
    /// 3.10: `co_linetable`, (byte delta, signed line delta, -128 = no line) pairs.
    Linetable310,
    /// 3.11+: the location table (varint entries, PEP 626 / 657).
    Locations311,
}

/// How string objects store text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StringModel {
    /// Python 2: `co_name` / `co_filename` are `PyStringObject` (bytes).
    Bytes2,
    /// Python 3.3+: PEP 393 compact unicode.
    Pep393,
}

/// Offsets of `_PyRuntimeState` fields (3.7+). For 2.7 / 3.6 the interpreter list head is
/// the `interp_head` symbol and the GIL holder is `_PyThreadState_Current`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RuntimeLayout {
    /// `_PyRuntime.interpreters.head`.
    pub interpreters_head: Option<usize>,
    /// `_PyRuntime.gilstate.tstate_current` (3.7 – 3.11): the thread holding the GIL.
    pub gilstate_tstate_current: Option<usize>,
}

/// Offsets inside `PyInterpreterState`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InterpLayout {
    pub(crate) next: usize,
    /// `tstate_head` (≤3.10) or `threads.head` (3.11+).
    pub(crate) tstate_head: usize,
    /// 3.12+: offset of `ceval.gil`, a pointer to the interpreter's `_gil_runtime_state`.
    pub ceval_gil: Option<usize>,
    /// 3.12+: offset of `locked` inside `_gil_runtime_state`.
    pub(crate) gil_locked: Option<usize>,
    /// 3.12+: offset of `last_holder` inside `_gil_runtime_state`.
    pub(crate) gil_last_holder: Option<usize>,
}

/// Offsets inside `PyThreadState`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThreadLayout {
    pub(crate) next: usize,
    pub(crate) interp: usize,
    /// ≤3.10: `frame` (a `PyFrameObject*`). 3.11/3.12: `cframe` (a `_PyCFrame*`, whose
    /// `current_frame` is at [`ThreadLayout::cframe_current_frame`]). 3.13+: `current_frame`.
    pub(crate) frame: usize,
    /// 3.11/3.12 only: offset of `current_frame` inside `_PyCFrame`.
    pub cframe_current_frame: Option<usize>,
    /// 3.11/3.12 only: offset of `previous` inside `_PyCFrame` (the caller's C frame: the
    /// thread's stack while a new `_PyCFrame` is installed but its `current_frame` not yet
    /// written).
    pub(crate) cframe_previous: Option<usize>,
    /// 3.11/3.12 only: offset of `root_cframe` inside the thread state: the C frame `cframe`
    /// points at while the thread runs no call of the evaluation loop. Every other one is a
    /// local of such a call, on the thread's C stack.
    pub(crate) root_cframe: Option<usize>,
    /// `thread_id` (the `pthread_t` of the thread, as an unsigned long).
    pub(crate) thread_id: usize,
    /// 3.11+: `native_thread_id` (the kernel tid).
    pub(crate) native_thread_id: Option<usize>,
}

/// Offsets inside a frame: `PyFrameObject` (≤3.10) or `_PyInterpreterFrame` (3.11+).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameLayout {
    pub model: FrameModel,
    /// `f_back` or `previous`.
    pub back: usize,
    /// `f_code` (≤3.12) or `f_executable` (3.13+).
    pub code: usize,
    /// `f_lasti` (an int) for [`FrameModel::Object`]; `prev_instr` / `instr_ptr`
    /// (a pointer) for [`FrameModel::Interpreter`].
    pub lasti: usize,
    /// 3.11+: `owner` (a char). 3.12+ uses owner == 3 (`FRAME_OWNED_BY_CSTACK`) for shim frames.
    pub owner: Option<usize>,
    /// 3.11 only: `is_entry` (a bool): the frame a `_PyEval_EvalFrameDefault` call started
    /// with, the outermost Python frame that C call runs. (3.12+ marks each such call with
    /// an entry frame of its own, owned by the C stack: [`FrameLayout::owner`].)
    pub is_entry: Option<usize>,
    /// Bytes to read to cover every field above.
    pub size: usize,
    /// 2.7: `f_stacktop`, NULL while the frame executes (set when a generator yields).
    pub(crate) stacktop: Option<usize>,
    /// 3.x ≤ 3.9: `f_executing` (a char, 1 while the frame executes).
    pub(crate) executing: Option<usize>,
    /// 3.10: `f_state` (a char).
    pub(crate) state: Option<usize>,
    /// 3.10+: the value of `FRAME_EXECUTING`.
    pub(crate) executing_state: Option<usize>,
    /// 3.11–3.12: `offsetof(PyGenObject, gi_iframe)`: a generator-owned frame lives inside
    /// its generator at this offset.
    pub(crate) gen_iframe: Option<usize>,
    /// 3.11–3.12: `offsetof(PyGenObject, gi_frame_state)` (an int8).
    pub(crate) gen_frame_state: Option<usize>,
}

/// Offsets inside `PyCodeObject`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CodeLayout {
    pub filename: usize,
    pub name: usize,
    /// 3.11+: `co_qualname`.
    pub qualname: Option<usize>,
    pub firstlineno: usize,
    /// `co_lnotab` (≤3.9) or `co_linetable` (3.10+): a bytes object.
    pub linetable: usize,
    pub linetable_format: LineTableFormat,
    /// ≤3.10: offset of `co_code` (a bytes object holding the bytecode).
    pub co_code: Option<usize>,
    /// 3.11+: offset of the inline bytecode `co_code_adaptive`.
    pub code_adaptive: Option<usize>,
    /// 3.11/3.12: `_co_firsttraceable` (an int); frames before it are "incomplete".
    pub firsttraceable: Option<usize>,
    /// `co_flags` (an int): CO_GENERATOR, CO_COROUTINE, ...
    pub(crate) flags: usize,
    /// Bytes to read to cover every field above (not including the bytecode).
    pub size: usize,
}

/// Layout of string and bytes objects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StringLayout {
    pub model: StringModel,
    /// `ob_type` inside `PyObject`.
    pub ob_type: usize,
    /// `ob_size` of `PyBytesObject` / `PyStringObject`.
    pub bytes_size: usize,
    /// `ob_sval` of `PyBytesObject` / `PyStringObject`.
    pub bytes_sval: usize,
    /// PEP 393: `PyASCIIObject.length`.
    pub unicode_length: usize,
    /// PEP 393: `PyASCIIObject.state` (the bitfield word, read as a u32).
    pub unicode_state: usize,
    /// PEP 393: `sizeof(PyASCIIObject)`: compact ASCII data starts here.
    pub ascii_size: usize,
    /// PEP 393: `sizeof(PyCompactUnicodeObject)`: compact non-ASCII data starts here.
    pub compact_size: usize,
    /// PEP 393: offset of `data.any` in `PyUnicodeObject` (legacy, non-compact strings).
    pub(crate) unicode_data_any: usize,
    /// Bit shifts inside the state word, measured by the probe.
    pub state_kind_shift: u32,
    pub state_compact_shift: u32,
    pub state_ascii_shift: u32,
}

/// Everything the stack walker needs to know about one CPython minor version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// (major, minor) this table was generated for.
    pub version: (u32, u32),
    /// A free-threaded build (`--disable-gil`, 3.13+): 32-byte object headers, and a GIL
    /// that is off unless turned on at run time (`PYTHON_GIL=1`).
    pub free_threaded: bool,
    pub runtime: RuntimeLayout,
    pub interp: InterpLayout,
    pub thread: ThreadLayout,
    pub frame: FrameLayout,
    pub code: CodeLayout,
    pub string: StringLayout,
}

/// Every generated table, oldest first.
pub const GENERATED: &[&Layout] = &[
    &v2_7::LAYOUT,
    &v3_6::LAYOUT,
    &v3_7::LAYOUT,
    &v3_8::LAYOUT,
    &v3_9::LAYOUT,
    &v3_10::LAYOUT,
    &v3_11::LAYOUT,
    &v3_12::LAYOUT,
    &v3_13::LAYOUT,
    &v3_13t::LAYOUT,
    &v3_14::LAYOUT,
    &v3_15::LAYOUT,
];

/// The generated table for `major.minor` (free-threaded or not), if we have one.
pub fn generated(major: u32, minor: u32, free_threaded: bool) -> Option<&'static Layout> {
    GENERATED
        .iter()
        .copied()
        .find(|l| l.version == (major, minor) && l.free_threaded == free_threaded)
}

/// The opcode table of `major.minor`, if we have one.
pub fn opcodes(major: u32, minor: u32) -> Option<&'static opcodes::Opcodes> {
    opcodes::OPCODES
        .iter()
        .find(|o| o.version == (major, minor))
}

/// Minor versions with a generated table, as "2.7, 3.6, ..., 3.13t, ..." for messages.
pub(crate) fn supported_versions() -> String {
    GENERATED
        .iter()
        .map(|l| {
            let t = if l.free_threaded { "t" } else { "" };
            format!("{}.{}{t}", l.version.0, l.version.1)
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// What `dump --async` reads on 3.11–3.13 besides [`Layout`]: the objects from the
/// interpreter's `sys.modules` to the `_asyncio` module's task containers (dicts, sets, weak
/// references, instance attributes) and a suspended coroutine's frame. Byte offsets, sizes and
/// constants, generated from each version's headers (`tools/gen_bindings.py`); the task object
/// itself is no header's (see `python::asyncio_legacy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LegacyAsyncLayout {
    pub(crate) version: (u32, u32),
    pub(crate) free_threaded: bool,
    /// `sizeof(PyObject)`: 16, or 32 in a free-threaded build.
    pub(crate) object_size: i64,
    pub(crate) ob_type: i64,
    /// `PyVarObject.ob_size` (a list's length; a 3.11 int's signed digit count).
    pub(crate) ob_size: i64,
    pub(crate) tp_name: i64,
    pub(crate) tp_basicsize: i64,
    pub(crate) tp_flags: i64,
    pub(crate) tp_base: i64,
    pub(crate) tp_dictoffset: i64,
    /// `PyHeapTypeObject.ht_cached_keys`: the keys an instance's values are ordered by.
    pub(crate) ht_cached_keys: i64,
    pub(crate) flag_managed_dict: i64,
    /// 3.13: `Py_TPFLAGS_INLINE_VALUES` (an instance's values follow it, `tp_basicsize` in).
    pub(crate) flag_inline_values: Option<i64>,
    pub(crate) flag_long: i64,
    pub(crate) flag_unicode: i64,
    /// 3.11: where the values pointer of an instance with a managed dict is (before it).
    pub(crate) managed_values: Option<i64>,
    /// Where the dict pointer of an instance with a managed dict is (before it); 3.12: the
    /// word holds the dict or, tagged by its low bit, the values.
    pub(crate) managed_dict: i64,
    /// 3.12: what to add to a tagged values word to get the values.
    pub(crate) values_untag: Option<i64>,
    /// `offsetof(PyDictValues, values)`.
    pub(crate) values_values: i64,
    /// 3.13: `offsetof(PyDictValues, valid)`.
    pub(crate) values_valid: Option<i64>,
    /// `PyInterpreterState`'s `modules` (3.11) / `imports.modules`: `sys.modules`.
    pub(crate) interp_modules: i64,
    pub(crate) md_dict: i64,
    pub(crate) ma_keys: i64,
    pub(crate) ma_values: i64,
    pub(crate) dk_log2_size: i64,
    pub(crate) dk_log2_index_bytes: i64,
    pub(crate) dk_kind: i64,
    pub(crate) dk_nentries: i64,
    pub(crate) dk_indices: i64,
    pub(crate) dict_keys_general: i64,
    pub(crate) entry_size: i64,
    pub(crate) entry_key: i64,
    pub(crate) entry_value: i64,
    pub(crate) uentry_size: i64,
    pub(crate) uentry_key: i64,
    pub(crate) uentry_value: i64,
    pub(crate) set_mask: i64,
    pub(crate) set_table: i64,
    pub(crate) setentry_size: i64,
    pub(crate) setentry_key: i64,
    pub(crate) wr_object: i64,
    pub(crate) list_items: i64,
    pub(crate) long_digits: i64,
    /// 3.12+: `lv_tag` (digit count above 3 bits of sign); 3.11 keeps the signed count in
    /// `ob_size`.
    pub(crate) long_tag: Option<i64>,
    pub(crate) long_shift: i64,
    pub(crate) gi_iframe: i64,
    pub(crate) gi_frame_state: i64,
    /// `_PyInterpreterFrame.stacktop`: an int, the stack's top as a slot of `localsplus`.
    pub(crate) frame_stacktop: i64,
    pub(crate) frame_localsplus: i64,
    /// `prev_instr` (3.11/3.12: the last instruction started) / `instr_ptr` (3.13).
    pub(crate) frame_instr: i64,
    pub(crate) frame_owner: i64,
    pub(crate) owned_by_generator: i64,
    pub(crate) frame_created: i64,
    /// 3.13: the state of a generator suspended in `yield from` / `await`.
    pub(crate) frame_suspended_yield_from: Option<i64>,
    pub(crate) frame_cleared: i64,
    pub(crate) op_resume: i64,
    pub(crate) op_resume_quick: Option<i64>,
    pub(crate) op_resume_instrumented: Option<i64>,
}

/// The asyncio table of `major.minor` (3.11–3.13; free-threaded or not), if generated.
pub(crate) fn legacy_async(
    major: u32,
    minor: u32,
    free_threaded: bool,
) -> Option<&'static LegacyAsyncLayout> {
    asyncio_legacy::TABLES
        .iter()
        .find(|l| l.version == (major, minor) && l.free_threaded == free_threaded)
}
