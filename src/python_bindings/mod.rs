//! Struct layouts of CPython's runtime objects, one table per minor version.
//!
//! Owns:
//! - the [`Layout`] description (byte offsets and sizes of the fields the stack walker reads);
//! - the generated per-version tables `v2_7.rs` ... `v3_13.rs`.
//!
//! Those files are written by `tools/gen_bindings.py`, which compiles a small C probe against
//! each interpreter's own headers. Never edit them by hand (see `docs/NEW_PYTHON_VERSION.md`).
//!
//! For 3.13 and later the layout is also read at run time from `_Py_DebugOffsets`
//! (`debug_offsets.rs`), which is what makes an untested 3.14+ target work.
//!
//! What asyncio's tasks need on 3.11–3.13 (before CPython describes them itself) is in a table
//! of its own, [`LegacyAsyncLayout`] (`asyncio_legacy.rs`, written by the same generator). So
//! is what reading dicts, instance attributes and ints needs on every version
//! ([`ObjectLayout`], `objects.rs`).
//!
//! Must not: read process memory (that is `crate::python`'s job) or know about output.

mod asyncio_legacy;
pub mod debug_offsets;
mod debug_offsets_fields;
mod objects;
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
    /// into the code object's `co_code_adaptive`. It is 3.13+'s `instr_ptr` (the
    /// instruction being or about to be executed) or 3.11–3.12's `prev_instr` (the last
    /// instruction started). Both give the current instruction directly.
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
    /// `_PyRuntime.gilstate.tstate_current` (3.7 – 3.11), the thread holding the GIL.
    pub gilstate_tstate_current: Option<usize>,
}

/// Offsets inside `PyInterpreterState`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InterpLayout {
    pub(crate) next: usize,
    /// `tstate_head` (≤3.10) or `threads.head` (3.11+).
    pub(crate) tstate_head: usize,
    /// 3.7+: `id`, the interpreter's own id (an int64; 0 is the main interpreter). 2.7 and
    /// 3.6 have none. There the main interpreter is the last of the list (a new one goes
    /// in at its head).
    pub id: Option<usize>,
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
    /// 3.11/3.12 only: offset of `previous` inside `_PyCFrame` (the caller's C frame, which
    /// is the thread's stack while a new `_PyCFrame` is installed but its `current_frame` not
    /// yet written).
    pub(crate) cframe_previous: Option<usize>,
    /// 3.11/3.12 only: offset of `root_cframe` inside the thread state. That is the C frame
    /// `cframe` points at while the thread runs no call of the evaluation loop. Every other one
    /// is a local of such a call, on the thread's C stack.
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
    /// 3.11 only: `is_entry` (a bool), which marks the frame a `_PyEval_EvalFrameDefault` call
    /// started with, the outermost Python frame that C call runs. (3.12+ marks each such call
    /// with an entry frame of its own, owned by the C stack; see [`FrameLayout::owner`].)
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
    /// 3.11–3.12: `offsetof(PyGenObject, gi_iframe)`. A generator-owned frame lives inside
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
    /// `co_lnotab` (≤3.9) or `co_linetable` (3.10+), a bytes object.
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
    /// PEP 393: `sizeof(PyASCIIObject)`, where compact ASCII data starts.
    pub ascii_size: usize,
    /// PEP 393: `sizeof(PyCompactUnicodeObject)`, where compact non-ASCII data starts.
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
    /// A free-threaded build (`--disable-gil`, 3.13+), with 32-byte object headers and a GIL
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

/// What `dump --async` reads on 3.11–3.13 besides [`Layout`]. These are the objects from the
/// interpreter's `sys.modules` to the `_asyncio` module's task containers (dicts, sets, weak
/// references, instance attributes), and a suspended coroutine's frame.
///
/// Byte offsets, sizes and constants, generated from each version's headers
/// (`tools/gen_bindings.py`). The task object itself is no header's (see
/// `python::asyncio_legacy`).
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
    /// `PyHeapTypeObject.ht_cached_keys`, the keys an instance's values are ordered by.
    pub(crate) ht_cached_keys: i64,
    pub(crate) flag_managed_dict: i64,
    /// 3.13: `Py_TPFLAGS_INLINE_VALUES` (an instance's values follow it, `tp_basicsize` in).
    pub(crate) flag_inline_values: Option<i64>,
    pub(crate) flag_long: i64,
    pub(crate) flag_unicode: i64,
    /// 3.11: where the values pointer of an instance with a managed dict is (before it).
    pub(crate) managed_values: Option<i64>,
    /// Where the dict pointer of an instance with a managed dict is (before it). On 3.12 the
    /// word holds the dict or, tagged by its low bit, the values.
    pub(crate) managed_dict: i64,
    /// 3.12: what to add to a tagged values word to get the values.
    pub(crate) values_untag: Option<i64>,
    /// `offsetof(PyDictValues, values)`.
    pub(crate) values_values: i64,
    /// 3.13: `offsetof(PyDictValues, valid)`.
    pub(crate) values_valid: Option<i64>,
    /// `PyInterpreterState`'s `modules` (3.11) / `imports.modules`, that is `sys.modules`.
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
    /// 3.12+: `lv_tag` (digit count above 3 bits of sign). 3.11 keeps the signed count in
    /// `ob_size`.
    pub(crate) long_tag: Option<i64>,
    pub(crate) long_shift: i64,
    pub(crate) gi_iframe: i64,
    pub(crate) gi_frame_state: i64,
    /// `_PyInterpreterFrame.stacktop`, an int giving the stack's top as a slot of `localsplus`.
    pub(crate) frame_stacktop: i64,
    pub(crate) frame_localsplus: i64,
    /// `prev_instr` (3.11/3.12, the last instruction started) / `instr_ptr` (3.13).
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

/// What reading objects from outside needs, on every version. That covers a module's dict from
/// an interpreter's `sys.modules`, instance attributes, dict entries, `str` keys and `int`
/// values (`python::objects`).
///
/// Byte offsets, sizes and constants, generated from each version's headers
/// (`tools/gen_bindings.py`). Two structs some versions do not install are given there from
/// the sources' declarations.
///
/// Which dict layout a version has:
/// - 2.7: one table of entries (`ma_mask`, `ma_table`).
/// - 3.6–3.10: a keys object of word-sized fields (`dk_size`), indices, then entries.
/// - 3.11+: a keys object with byte-sized log2 sizes (`dk_log2_size`) and a kind (entries
///   with or without a hash).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ObjectLayout {
    pub(crate) version: (u32, u32),
    pub(crate) free_threaded: bool,
    /// `sizeof(PyObject)`: 16, or 32 in a free-threaded build.
    pub(crate) object_size: i64,
    pub(crate) ob_type: i64,
    pub(crate) ob_size: i64,
    pub(crate) tp_name: i64,
    pub(crate) tp_basicsize: i64,
    pub(crate) tp_flags: i64,
    pub(crate) tp_dictoffset: i64,
    /// 3.x: `PyHeapTypeObject.ht_cached_keys`, the keys an instance's values are ordered by.
    pub(crate) ht_cached_keys: Option<i64>,
    pub(crate) flag_dict: i64,
    /// `Py_TPFLAGS_INT_SUBCLASS` (2.7) / `Py_TPFLAGS_LONG_SUBCLASS`.
    pub(crate) flag_int: i64,
    /// `Py_TPFLAGS_STRING_SUBCLASS` (2.7's `str`) / `Py_TPFLAGS_UNICODE_SUBCLASS`.
    pub(crate) flag_str: i64,
    pub(crate) flag_managed_dict: Option<i64>,
    /// 3.13+: `Py_TPFLAGS_INLINE_VALUES` (an instance's values follow it, `tp_basicsize` in).
    pub(crate) flag_inline_values: Option<i64>,
    /// 2.7: `PyIntObject.ob_ival`.
    pub(crate) int_value: Option<i64>,
    /// Where an `int`'s digits start (2.7: a `long`'s).
    pub(crate) long_digits: i64,
    /// 3.12+: `lv_tag` (digit count above 3 bits of sign); before, `ob_size` is the signed
    /// digit count.
    pub(crate) long_tag: Option<i64>,
    pub(crate) long_shift: i64,
    pub(crate) digit_size: i64,
    /// `PyInterpreterState`'s `modules` (≤3.11) / `imports.modules`, that is `sys.modules`.
    pub(crate) interp_modules: i64,
    pub(crate) md_dict: i64,
    pub(crate) ma_used: i64,
    /// 2.7: `ma_mask` (slots − 1) and `ma_table` (the entries).
    pub(crate) ma_mask: Option<i64>,
    pub(crate) ma_table: Option<i64>,
    pub(crate) ma_keys: Option<i64>,
    pub(crate) ma_values: Option<i64>,
    /// 3.6–3.10: `dk_size`, the number of index slots.
    pub(crate) dk_size: Option<i64>,
    pub(crate) dk_nentries: Option<i64>,
    pub(crate) dk_indices: Option<i64>,
    pub(crate) dk_log2_size: Option<i64>,
    pub(crate) dk_log2_index_bytes: Option<i64>,
    pub(crate) dk_kind: Option<i64>,
    pub(crate) dict_keys_general: Option<i64>,
    /// An entry with a hash (2.7's `PyDictEntry`, 3.x's `PyDictKeyEntry`).
    pub(crate) entry_size: i64,
    pub(crate) entry_key: i64,
    pub(crate) entry_value: i64,
    /// 3.11+: an entry of a keys object of `str` keys (no hash).
    pub(crate) uentry_size: Option<i64>,
    pub(crate) uentry_key: Option<i64>,
    pub(crate) uentry_value: Option<i64>,
    /// 3.11+: `offsetof(PyDictValues, values)` (before, a split dict's `ma_values` is the
    /// array itself).
    pub(crate) values_values: Option<i64>,
    /// 3.13+: `offsetof(PyDictValues, capacity)` (a byte, the slots the values have).
    pub(crate) values_capacity: Option<i64>,
    /// 3.13+: `offsetof(PyDictValues, valid)`.
    pub(crate) values_valid: Option<i64>,
    /// 3.11: where the values pointer of an instance with a managed dict is (before it).
    pub(crate) managed_values: Option<i64>,
    /// 3.11+: where the dict pointer of an instance with a managed dict is (before it).
    /// On 3.12 the word holds the dict or, tagged by its low bit, the values.
    pub(crate) managed_dict: Option<i64>,
    /// 3.12: what to add to a tagged values word to get the values.
    pub(crate) values_untag: Option<i64>,
    /// `Py_TPFLAGS_HEAPTYPE`, the flag of a type made at run time (a class), not one of C's.
    pub(crate) flag_heaptype: i64,
    /// `PyCodeObject`'s argument counts and flags (`CO_VARARGS`, `CO_VARKEYWORDS` among
    /// them), each a C `int`.
    pub(crate) code_argcount: i64,
    pub(crate) code_kwonlyargcount: Option<i64>,
    pub(crate) code_flags: i64,
    pub(crate) co_varargs: i64,
    pub(crate) co_varkeywords: i64,
    /// ≤3.10: `co_nlocals` (an `int`) and the tuples naming the slots of `f_localsplus`.
    pub(crate) code_nlocals: Option<i64>,
    pub(crate) code_varnames: Option<i64>,
    pub(crate) code_cellvars: Option<i64>,
    pub(crate) code_freevars: Option<i64>,
    /// Where a frame's local slots start (`f_localsplus` ≤3.10, `localsplus` 3.11+).
    pub(crate) frame_localsplus: i64,
    /// 3.11+: `co_nlocalsplus` (an `int`), the names tuple and the kinds bytes.
    pub(crate) code_nlocalsplus: Option<i64>,
    pub(crate) code_localsplusnames: Option<i64>,
    pub(crate) code_localspluskinds: Option<i64>,
    /// 3.11+: the kinds of a slot (`CO_FAST_*`; hidden ones from 3.12).
    pub(crate) fast_local: Option<i64>,
    pub(crate) fast_cell: Option<i64>,
    pub(crate) fast_free: Option<i64>,
    pub(crate) fast_hidden: Option<i64>,
    /// 3.14+: `Py_TAG_BITS`, the tag bits of a `_PyStackRef` slot.
    pub(crate) stackref_tag_bits: Option<i64>,
    /// 3.12+: `_PyLong_NON_SIZE_BITS`, the bits of `lv_tag` below the digit count.
    pub(crate) long_non_size_bits: Option<i64>,
    pub(crate) tuple_items: i64,
    pub(crate) list_items: i64,
    pub(crate) float_value: i64,
    pub(crate) cell_ref: i64,
    pub(crate) set_used: i64,
    pub(crate) set_mask: i64,
    pub(crate) set_table: i64,
    pub(crate) setentry_size: i64,
    pub(crate) setentry_key: i64,
    pub(crate) setentry_hash: i64,
    /// `PyTypeObject.tp_base`, the type a type derives from.
    pub(crate) tp_base: i64,
    /// Not free-threaded: `sizeof(PyGC_Head)`, the words before a tracked object (the
    /// first one links it to the next object of its generation's list). 2.7 and 3.6 keep
    /// the generations in a static array (first head: `_PyGC_generation0`'s value).
    pub(crate) gc_head_size: Option<i64>,
    /// `sizeof(struct gc_generation)`, which covers a list head, then the generation's counts.
    pub(crate) gc_generation_size: Option<i64>,
    /// `NUM_GENERATIONS`, the count of generations in a row from `gc_*_generations`.
    pub(crate) gc_generations_count: Option<i64>,
    /// 3.7–3.8: the generations (and the permanent one, `gc.freeze()`'s) in `_PyRuntime`.
    pub(crate) gc_runtime_generations: Option<i64>,
    /// 3.7+: `generation0`, a pointer to the first list head (in `_PyRuntime` on 3.7–3.8,
    /// each interpreter from 3.9). It says where the lists are, whatever a build's layout.
    pub(crate) gc_runtime_generation0: Option<i64>,
    pub(crate) gc_runtime_permanent: Option<i64>,
    /// 3.9+: `PyInterpreterState.gc` (3.13+ debug offsets say it too, and theirs wins; the
    /// generations' place in it is the same), and the generations (and the permanent
    /// one) in each `PyInterpreterState`.
    pub(crate) gc_interp_state: Option<i64>,
    pub(crate) gc_interp_generations: Option<i64>,
    pub(crate) gc_interp_generation0: Option<i64>,
    pub(crate) gc_interp_permanent: Option<i64>,
    /// 3.7+: `sizeof(_PyErr_StackItem)` (a greenlet's saved exception state holds one).
    pub(crate) err_stackitem_size: Option<i64>,
    /// 3.11+: `PyFrameObject.f_frame`, the interpreter frame a frame object stands for.
    pub(crate) frame_object_iframe: Option<i64>,
}

/// The fields both `_Py_DebugOffsets` (the bytes at the start of `_PyRuntime`) and the
/// generated objects table of its version carry, where they differ, each as "field: debug
/// offsets N, table M". None when there is no objects table of that version and build kind.
/// CPython's own description checks the headers' layout wherever it has the same field.
pub fn objects_disagree_with_debug_offsets(bytes: &[u8]) -> Option<Vec<String>> {
    let hex = debug_offsets::version_hex(bytes)?;
    let g = debug_offsets::fallback_for(bytes);
    if (g.version.0 as u64, g.version.1 as u64) != (hex >> 24, (hex >> 16) & 0xff) {
        return None;
    }
    let l = object_layout(g.version.0, g.version.1, g.free_threaded)?;
    let both = [
        ("interpreter_state.imports_modules", Some(l.interp_modules)),
        ("pyobject.ob_type", Some(l.ob_type)),
        ("type_object.tp_name", Some(l.tp_name)),
        ("type_object.tp_flags", Some(l.tp_flags)),
        ("dict_object.ma_keys", l.ma_keys),
        ("dict_object.ma_values", l.ma_values),
        ("long_object.lv_tag", l.long_tag),
        ("long_object.ob_digit", Some(l.long_digits)),
    ];
    Some(
        both.iter()
            .filter_map(|&(name, ours)| {
                let theirs = debug_offsets::field(bytes, name)?;
                let ours = ours?;
                (theirs != ours as u64)
                    .then(|| format!("{name}: debug offsets {theirs}, table {ours}"))
            })
            .collect(),
    )
}

/// The objects table of `major.minor` (free-threaded or not), if generated.
pub(crate) fn object_layout(
    major: u32,
    minor: u32,
    free_threaded: bool,
) -> Option<&'static ObjectLayout> {
    objects::TABLES
        .iter()
        .find(|l| l.version == (major, minor) && l.free_threaded == free_threaded)
}
