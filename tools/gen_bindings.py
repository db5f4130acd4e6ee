#!/usr/bin/env python3
"""Generates src/python_bindings/vX_Y.rs, one struct-layout table per CPython minor version.

For each interpreter it writes a small C probe that includes that interpreter's own headers
(internal ones with Py_BUILD_CORE), prints offsetof()/sizeof() of every field the stack
walker reads and measures the bit positions of the unicode `state` bitfield, compiles it with
cc, runs it, and renders the Rust table. Nothing in the output is typed by hand.

Usage:
    python3 tools/gen_bindings.py                  # pyenv's interpreters and tools/pythons.sh's
    python3 tools/gen_bindings.py --python /path/to/python3.12
    python3 tools/gen_bindings.py --check          # exit 1 (and print a diff) when a table differs
    python3 tools/gen_bindings.py --out DIR        # write the tables elsewhere

See docs/NEW_PYTHON_VERSION.md for adding a version.
"""
from __future__ import print_function

import argparse
import difflib
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from interpreters import Interpreter, all_interpreters, host_path  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
OUT_DIR = os.path.normpath(os.path.join(HERE, "..", "src", "python_bindings"))

# (name, first version, last version, C expression). A field applies to versions in
# [first, last]; None = no bound. Names are looked up by render() below.
FIELDS = [
    # _PyRuntimeState
    ("runtime.interpreters_head", (3, 7), None, "offsetof(_PyRuntimeState, interpreters.head)"),
    ("runtime.gilstate_tstate_current", (3, 7), (3, 11),
     "offsetof(_PyRuntimeState, gilstate.tstate_current)"),
    # PyInterpreterState
    ("interp.next", None, None, "offsetof(PyInterpreterState, next)"),
    ("interp.tstate_head", None, (3, 10), "offsetof(PyInterpreterState, tstate_head)"),
    ("interp.tstate_head", (3, 11), None, "offsetof(PyInterpreterState, threads.head)"),
    # The interpreter's own id (0: the main one); 2.7 and 3.6 have none.
    ("interp.id", (3, 7), None, "offsetof(PyInterpreterState, id)"),
    ("interp.ceval_gil", (3, 12), None, "offsetof(PyInterpreterState, ceval.gil)"),
    ("interp.gil_locked", (3, 12), None, "offsetof(struct _gil_runtime_state, locked)"),
    ("interp.gil_last_holder", (3, 12), None, "offsetof(struct _gil_runtime_state, last_holder)"),
    # PyThreadState
    ("thread.next", None, None, "offsetof(PyThreadState, next)"),
    ("thread.interp", None, None, "offsetof(PyThreadState, interp)"),
    ("thread.frame", None, (3, 10), "offsetof(PyThreadState, frame)"),
    ("thread.frame", (3, 11), (3, 12), "offsetof(PyThreadState, cframe)"),
    ("thread.frame", (3, 13), None, "offsetof(PyThreadState, current_frame)"),
    ("thread.cframe_current_frame", (3, 11), (3, 12), "offsetof(_PyCFrame, current_frame)"),
    ("thread.cframe_previous", (3, 11), (3, 12), "offsetof(_PyCFrame, previous)"),
    ("thread.root_cframe", (3, 11), (3, 12), "offsetof(PyThreadState, root_cframe)"),
    ("thread.thread_id", None, None, "offsetof(PyThreadState, thread_id)"),
    ("thread.native_thread_id", (3, 11), None, "offsetof(PyThreadState, native_thread_id)"),
    # PyFrameObject (<= 3.10) / _PyInterpreterFrame (3.11+)
    ("frame.back", None, (3, 10), "offsetof(PyFrameObject, f_back)"),
    ("frame.code", None, (3, 10), "offsetof(PyFrameObject, f_code)"),
    ("frame.lasti", None, (3, 10), "offsetof(PyFrameObject, f_lasti)"),
    ("frame.size", None, (3, 10), "sizeof(PyFrameObject)"),
    ("frame.back", (3, 11), None, "offsetof(_PyInterpreterFrame, previous)"),
    ("frame.code", (3, 11), (3, 12), "offsetof(_PyInterpreterFrame, f_code)"),
    ("frame.code", (3, 13), None, "offsetof(_PyInterpreterFrame, f_executable)"),
    ("frame.lasti", (3, 11), (3, 12), "offsetof(_PyInterpreterFrame, prev_instr)"),
    ("frame.lasti", (3, 13), None, "offsetof(_PyInterpreterFrame, instr_ptr)"),
    ("frame.owner", (3, 11), None, "offsetof(_PyInterpreterFrame, owner)"),
    # 3.11: the frame a `_PyEval_EvalFrameDefault` call started with (3.12+ marks that call
    # with an entry frame of its own instead, by its owner): the merge with native frames.
    ("frame.is_entry", (3, 11), (3, 11), "offsetof(_PyInterpreterFrame, is_entry)"),
    ("frame.size", (3, 11), None, "sizeof(_PyInterpreterFrame)"),
    # Is a frame executing? (A chain read without pausing may pass through a suspended
    # generator frame: then it is torn.) 2.7-3.9: f_stacktop is NULL while executing;
    # 3.10: f_state; 3.11-3.12: the owning generator's gi_frame_state.
    ("frame.stacktop", None, (2, 7), "offsetof(PyFrameObject, f_stacktop)"),
    ("frame.executing", (3, 0), (3, 9), "offsetof(PyFrameObject, f_executing)"),
    ("frame.state", (3, 10), (3, 10), "offsetof(PyFrameObject, f_state)"),
    ("frame.executing_state", (3, 10), None, "FRAME_EXECUTING"),
    ("frame.gen_iframe", (3, 11), (3, 12), "offsetof(PyGenObject, gi_iframe)"),
    ("frame.gen_frame_state", (3, 11), (3, 12), "offsetof(PyGenObject, gi_frame_state)"),
    # PyCodeObject
    ("code.filename", None, None, "offsetof(PyCodeObject, co_filename)"),
    ("code.name", None, None, "offsetof(PyCodeObject, co_name)"),
    ("code.qualname", (3, 11), None, "offsetof(PyCodeObject, co_qualname)"),
    ("code.firstlineno", None, None, "offsetof(PyCodeObject, co_firstlineno)"),
    ("code.linetable", None, (3, 9), "offsetof(PyCodeObject, co_lnotab)"),
    ("code.linetable", (3, 10), None, "offsetof(PyCodeObject, co_linetable)"),
    ("code.co_code", None, (3, 10), "offsetof(PyCodeObject, co_code)"),
    ("code.code_adaptive", (3, 11), None, "offsetof(PyCodeObject, co_code_adaptive)"),
    ("code.firsttraceable", (3, 11), (3, 12), "offsetof(PyCodeObject, _co_firsttraceable)"),
    ("code.flags", None, None, "offsetof(PyCodeObject, co_flags)"),
    ("code.size", None, None, "sizeof(PyCodeObject)"),
    # Objects, bytes and strings
    ("string.ob_type", None, None, "offsetof(PyObject, ob_type)"),
    ("string.bytes_size", None, (2, 7), "offsetof(PyStringObject, ob_size)"),
    ("string.bytes_sval", None, (2, 7), "offsetof(PyStringObject, ob_sval)"),
    ("string.bytes_size", (3, 0), None, "offsetof(PyBytesObject, ob_base.ob_size)"),
    ("string.bytes_sval", (3, 0), None, "offsetof(PyBytesObject, ob_sval)"),
    ("string.unicode_length", (3, 0), None, "offsetof(PyASCIIObject, length)"),
    ("string.unicode_state", (3, 0), None, "offsetof(PyASCIIObject, state)"),
    ("string.ascii_size", (3, 0), None, "sizeof(PyASCIIObject)"),
    ("string.compact_size", (3, 0), None, "sizeof(PyCompactUnicodeObject)"),
    ("string.unicode_data_any", (3, 0), None, "offsetof(PyUnicodeObject, data)"),
]

# Headers to include per version range, after <Python.h>.
INCLUDES = [
    (None, (3, 6), ["frameobject.h", "code.h"]),
    ((3, 7), (3, 7), ["internal/pystate.h", "frameobject.h", "code.h"]),
    ((3, 8), (3, 8), ["internal/pycore_pystate.h", "frameobject.h", "code.h"]),
    ((3, 9), (3, 10), ["internal/pycore_interp.h", "internal/pycore_runtime.h",
                       "frameobject.h", "code.h"]),
    ((3, 11), None, ["internal/pycore_interp.h", "internal/pycore_runtime.h",
                     "internal/pycore_frame.h", "internal/pycore_code.h"]),
]

BITFIELD_PROBE = r"""
static int low_bit(uint32_t w) { int i; for (i = 0; i < 32; i++) if (w & (1u << i)) return i; return -1; }
static int state_bit(int which) {
    PyASCIIObject o;
    uint32_t w;
    memset(&o, 0, sizeof o);
    if (which == 0) o.state.kind = 1;
    if (which == 1) o.state.compact = 1;
    if (which == 2) o.state.ascii = 1;
    memcpy(&w, (char *)&o + offsetof(PyASCIIObject, state), sizeof w);
    return low_bit(w);
}
"""


# What `dump --async` reads on 3.11-3.13, where CPython describes no task for outside readers
# (src/python/asyncio_legacy.rs): the objects on the way from the interpreter's sys.modules to
# the `_asyncio` module's task containers, and a suspended coroutine's awaited object.
# Rendered into one table per minor version (and build kind) in asyncio_legacy.rs.
ASYNC_FIRST, ASYNC_LAST = (3, 11), (3, 13)
ASYNC_FIELDS = [
    ("object_size", None, None, "sizeof(PyObject)"),
    ("ob_type", None, None, "offsetof(PyObject, ob_type)"),
    ("ob_size", None, None, "offsetof(PyVarObject, ob_size)"),
    ("tp_name", None, None, "offsetof(PyTypeObject, tp_name)"),
    ("tp_basicsize", None, None, "offsetof(PyTypeObject, tp_basicsize)"),
    ("tp_flags", None, None, "offsetof(PyTypeObject, tp_flags)"),
    ("tp_base", None, None, "offsetof(PyTypeObject, tp_base)"),
    ("tp_dictoffset", None, None, "offsetof(PyTypeObject, tp_dictoffset)"),
    ("ht_cached_keys", None, None, "offsetof(PyHeapTypeObject, ht_cached_keys)"),
    ("flag_managed_dict", None, None, "Py_TPFLAGS_MANAGED_DICT"),
    ("flag_inline_values", (3, 13), None, "Py_TPFLAGS_INLINE_VALUES"),
    ("flag_long", None, None, "Py_TPFLAGS_LONG_SUBCLASS"),
    ("flag_unicode", None, None, "Py_TPFLAGS_UNICODE_SUBCLASS"),
    # Instance attributes of a type with a managed dict (3.11: a values pointer and a dict
    # pointer before the object; 3.12: one word, the values tagged by its low bit; 3.13: a
    # dict pointer before the object, the values inline after tp_basicsize bytes).
    ("managed_values", (3, 11), (3, 11), "(char *)_PyObject_ValuesPointer(FAKE) - (char *)FAKE"),
    ("managed_dict", (3, 11), (3, 11), "(char *)_PyObject_ManagedDictPointer(FAKE) - (char *)FAKE"),
    ("managed_dict", (3, 12), (3, 12), "(char *)_PyObject_DictOrValuesPointer(FAKE) - (char *)FAKE"),
    ("values_untag", (3, 12), (3, 12), "values_untag()"),
    ("managed_dict", (3, 13), None, "MANAGED_DICT_OFFSET"),
    ("values_values", None, None, "offsetof(PyDictValues, values)"),
    ("values_valid", (3, 13), None, "offsetof(PyDictValues, valid)"),
    ("interp_modules", None, (3, 11), "offsetof(PyInterpreterState, modules)"),
    ("interp_modules", (3, 12), None, "offsetof(PyInterpreterState, imports.modules)"),
    ("md_dict", None, None, "offsetof(PyModuleObject, md_dict)"),
    ("ma_keys", None, None, "offsetof(PyDictObject, ma_keys)"),
    ("ma_values", None, None, "offsetof(PyDictObject, ma_values)"),
    ("dk_log2_size", None, None, "offsetof(PyDictKeysObject, dk_log2_size)"),
    ("dk_log2_index_bytes", None, None, "offsetof(PyDictKeysObject, dk_log2_index_bytes)"),
    ("dk_kind", None, None, "offsetof(PyDictKeysObject, dk_kind)"),
    ("dk_nentries", None, None, "offsetof(PyDictKeysObject, dk_nentries)"),
    ("dk_indices", None, None, "offsetof(PyDictKeysObject, dk_indices)"),
    ("dict_keys_general", None, None, "DICT_KEYS_GENERAL"),
    ("entry_size", None, None, "sizeof(PyDictKeyEntry)"),
    ("entry_key", None, None, "offsetof(PyDictKeyEntry, me_key)"),
    ("entry_value", None, None, "offsetof(PyDictKeyEntry, me_value)"),
    ("uentry_size", None, None, "sizeof(PyDictUnicodeEntry)"),
    ("uentry_key", None, None, "offsetof(PyDictUnicodeEntry, me_key)"),
    ("uentry_value", None, None, "offsetof(PyDictUnicodeEntry, me_value)"),
    ("set_mask", None, None, "offsetof(PySetObject, mask)"),
    ("set_table", None, None, "offsetof(PySetObject, table)"),
    ("setentry_size", None, None, "sizeof(setentry)"),
    ("setentry_key", None, None, "offsetof(setentry, key)"),
    ("wr_object", None, None, "offsetof(PyWeakReference, wr_object)"),
    ("list_items", None, None, "offsetof(PyListObject, ob_item)"),
    ("long_digits", None, (3, 11), "offsetof(PyLongObject, ob_digit)"),
    ("long_digits", (3, 12), None, "offsetof(PyLongObject, long_value.ob_digit)"),
    ("long_tag", (3, 12), None, "offsetof(PyLongObject, long_value.lv_tag)"),
    ("long_shift", None, None, "PyLong_SHIFT"),
    ("gi_iframe", None, None, "offsetof(PyGenObject, gi_iframe)"),
    ("gi_frame_state", None, None, "offsetof(PyGenObject, gi_frame_state)"),
    ("frame_stacktop", None, None, "offsetof(_PyInterpreterFrame, stacktop)"),
    ("frame_localsplus", None, None, "offsetof(_PyInterpreterFrame, localsplus)"),
    ("frame_instr", None, (3, 12), "offsetof(_PyInterpreterFrame, prev_instr)"),
    ("frame_instr", (3, 13), None, "offsetof(_PyInterpreterFrame, instr_ptr)"),
    ("frame_owner", None, None, "offsetof(_PyInterpreterFrame, owner)"),
    ("owned_by_generator", None, None, "FRAME_OWNED_BY_GENERATOR"),
    ("frame_created", None, None, "FRAME_CREATED"),
    ("frame_suspended_yield_from", (3, 13), None, "FRAME_SUSPENDED_YIELD_FROM"),
    ("frame_cleared", None, None, "FRAME_CLEARED"),
    ("op_resume", None, None, "RESUME"),
    ("op_resume_quick", (3, 11), (3, 11), "RESUME_QUICK"),
    ("op_resume_instrumented", (3, 12), None, "INSTRUMENTED_RESUME"),
]

ASYNC_INCLUDES = ["opcode.h", "internal/pycore_interp.h", "internal/pycore_runtime.h",
                  "internal/pycore_frame.h", "internal/pycore_code.h",
                  "internal/pycore_dict.h", "internal/pycore_object.h",
                  "internal/pycore_moduleobject.h", "internal/pycore_genobject.h"]

# An object in the middle of a buffer, for the inline functions that locate the words before
# an object (they only compute addresses; NDEBUG keeps their asserts from reading its type).
ASYNC_PROBE_HEAD = r"""
static char fake_buf[512];
#define FAKE ((PyObject *)(fake_buf + 256))
"""

ASYNC_VALUES_TAG_312 = r"""
static long long values_untag(void) {
    PyDictOrValues d;
    d.values = fake_buf + 7;
    if (!_PyDictOrValues_IsValues(d)) return -100;
    return (long long)((char *)_PyDictOrValues_GetValues(d) - (fake_buf + 7));
}
"""

def in_range(v, first, last):
    return (first is None or v >= first) and (last is None or v <= last)


def probe_source(version):
    includes = next(inc for first, last, inc in INCLUDES if in_range(version, first, last))
    lines = ["#define Py_BUILD_CORE 1", "#include <Python.h>"]
    lines += ["#include <%s>" % h for h in includes]
    lines += ["#include <stddef.h>", "#include <stdio.h>", "#include <string.h>",
              "#include <stdint.h>"]
    if version >= (3, 0):
        lines.append(BITFIELD_PROBE)
    lines.append("int main(void) {")
    lines.append('    printf("{\\n");')
    for name, first, last, expr in FIELDS:
        if in_range(version, first, last):
            lines.append('    printf("\\"%s\\": %%zu,\\n", (size_t)(%s));' % (name, expr))
    if version >= (3, 0):
        for i, name in enumerate(["kind", "compact", "ascii"]):
            lines.append('    printf("\\"string.state_%s_shift\\": %%d,\\n", state_bit(%d));'
                         % (name, i))
    lines.append('    printf("\\"end\\": 0\\n}\\n");')
    lines.append("    return 0;")
    lines.append("}")
    return "\n".join(lines) + "\n"



def async_probe_source(version):
    lines = ["#define Py_BUILD_CORE 1", "#define NDEBUG 1", "#include <Python.h>"]
    lines += ["#include <%s>" % h for h in ASYNC_INCLUDES]
    lines += ["#include <stddef.h>", "#include <stdio.h>", "#include <string.h>"]
    lines.append(ASYNC_PROBE_HEAD)
    if version == (3, 12):
        lines.append(ASYNC_VALUES_TAG_312)
    lines.append("int main(void) {")
    lines.append('    printf("{\\n");')
    for name, first, last, expr in ASYNC_FIELDS:
        if in_range(version, first, last):
            lines.append('    printf("\\"%s\\": %%lld,\\n", (long long)(%s));' % (name, expr))
    lines.append('    printf("\\"end\\": 0\\n}\\n");')
    lines.append("    return 0;")
    lines.append("}")
    return "\n".join(lines) + "\n"


def compile_and_run(python, inc, source):
    """The JSON a probe prints, compiled against `inc` (python's headers)."""
    tmp = tempfile.mkdtemp(prefix="scalene-rs-probe-")
    try:
        src = os.path.join(tmp, "probe.c")
        exe = os.path.join(tmp, "probe")
        with open(src, "w") as f:
            f.write(source)
        cmd = [os.environ.get("CC", "cc"), "-w", "-I", inc, "-I", os.path.join(inc, "internal")]
        if python.root not in ("", "/"):
            # A root's own headers (Debian keeps pyconfig.h under its multiarch directory),
            # after this machine's C library's.
            cmd += ["-idirafter", os.path.join(python.root, "usr", "include")]
        cmd += [src, "-o", exe]
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        out, _ = p.communicate()
        if p.returncode != 0:
            sys.exit("probe for %s did not compile:\n%s" % (python.label, out.decode(errors="replace")))
        values = json.loads(subprocess.check_output([exe]).decode())
    finally:
        shutil.rmtree(tmp)
    values.pop("end")
    return values


def render_async(tables):
    """asyncio_legacy.rs: one `LegacyAsyncLayout` per (full version, free-threaded, values).
    A field some version lacks is an Option."""
    names = []
    for name, _, _, _ in ASYNC_FIELDS:
        if name not in names:
            names.append(name)
    minors = [(3, m) for m in range(ASYNC_FIRST[1], ASYNC_LAST[1] + 1)]

    def everywhere(name):
        return all(any(n == name and in_range(m, f, l) for n, f, l, _ in ASYNC_FIELDS)
                   for m in minors)

    out = ["// Generated by tools/gen_bindings.py from the headers of CPython %s. Do not edit by hand."
           % ", ".join("%d.%d.%d%s" % (full + ("t" if ft else "",)) for full, ft, _ in tables),
           "", "use super::LegacyAsyncLayout;", "",
           "/// One table per minor version (and build kind), oldest first.",
           "pub(crate) const TABLES: &[LegacyAsyncLayout] = &["]
    for full, ft, v in tables:
        out.append("    LegacyAsyncLayout {")
        out.append("        version: (%d, %d)," % full[:2])
        out.append("        free_threaded: %s," % ("true" if ft else "false"))
        for name in names:
            if everywhere(name):
                out.append("        %s: %d," % (name, v[name]))
            else:
                out.append("        %s: %s," % (name, "Some(%d)" % v[name] if name in v else "None"))
        out.append("    },")
    out.append("];")
    return "\n".join(out) + "\n"


# What reading objects from outside needs on every version (src/python/objects.rs): from an
# interpreter's sys.modules to a module's dict, an instance's attributes (a type's dict
# offset, or its managed dict and values), dict entries, str keys and int values. Today's
# reader is the threads' names (`threading._active`: ident -> Thread, each one's `_name`).
# Rendered into one table per minor version (and build kind) in objects.rs.
#
# Two structs are in no installed header of some versions; their fields are then given
# from the sources' declarations, in units of the declared types (the reader checks every
# dict it reads against its `ma_used`, so a wrong layout reads as no names, never as
# others'):
# - PyModuleObject before 3.10 (Objects/moduleobject.c): `PyObject_HEAD` then `md_dict`.
# - PyDictKeysObject and PyDictKeyEntry in 3.6-3.10 (Objects/dict-common.h): `dk_refcnt`,
#   `dk_size`, `dk_lookup`, `dk_usable`, `dk_nentries` (each word-sized), then the
#   indices; an entry is `me_hash`, `me_key`, `me_value`.
OBJECT_FIELDS = [
    ("object_size", None, None, "sizeof(PyObject)"),
    ("ob_type", None, None, "offsetof(PyObject, ob_type)"),
    ("ob_size", None, None, "offsetof(PyVarObject, ob_size)"),
    ("tp_name", None, None, "offsetof(PyTypeObject, tp_name)"),
    ("tp_basicsize", None, None, "offsetof(PyTypeObject, tp_basicsize)"),
    ("tp_flags", None, None, "offsetof(PyTypeObject, tp_flags)"),
    ("tp_dictoffset", None, None, "offsetof(PyTypeObject, tp_dictoffset)"),
    ("ht_cached_keys", (3, 0), None, "offsetof(PyHeapTypeObject, ht_cached_keys)"),
    ("flag_dict", None, None, "Py_TPFLAGS_DICT_SUBCLASS"),
    ("flag_int", None, (2, 7), "Py_TPFLAGS_INT_SUBCLASS"),
    ("flag_int", (3, 0), None, "Py_TPFLAGS_LONG_SUBCLASS"),
    ("flag_str", None, (2, 7), "Py_TPFLAGS_STRING_SUBCLASS"),
    ("flag_str", (3, 0), None, "Py_TPFLAGS_UNICODE_SUBCLASS"),
    ("flag_managed_dict", (3, 11), None, "Py_TPFLAGS_MANAGED_DICT"),
    ("flag_inline_values", (3, 13), None, "Py_TPFLAGS_INLINE_VALUES"),
    # 2.7's int; 3.x's int (digits of PyLong_SHIFT bits; 3.12+: a tag, count and sign).
    ("int_value", None, (2, 7), "offsetof(PyIntObject, ob_ival)"),
    ("long_digits", (3, 0), (3, 11), "offsetof(PyLongObject, ob_digit)"),
    ("long_digits", (3, 12), None, "offsetof(PyLongObject, long_value.ob_digit)"),
    ("long_tag", (3, 12), None, "offsetof(PyLongObject, long_value.lv_tag)"),
    ("long_shift", (3, 0), None, "PyLong_SHIFT"),
    ("digit_size", (3, 0), None, "sizeof(digit)"),
    ("interp_modules", None, (3, 11), "offsetof(PyInterpreterState, modules)"),
    ("interp_modules", (3, 12), None, "offsetof(PyInterpreterState, imports.modules)"),
    ("md_dict", None, (3, 9), "sizeof(PyObject)"),
    ("md_dict", (3, 10), None, "offsetof(PyModuleObject, md_dict)"),
    # Dicts: 2.7's open table of entries; 3.6+'s keys object (indices, then entries) and,
    # for a split dict, its values.
    ("ma_used", None, None, "offsetof(PyDictObject, ma_used)"),
    ("ma_mask", None, (2, 7), "offsetof(PyDictObject, ma_mask)"),
    ("ma_table", None, (2, 7), "offsetof(PyDictObject, ma_table)"),
    ("ma_keys", (3, 0), None, "offsetof(PyDictObject, ma_keys)"),
    ("ma_values", (3, 0), None, "offsetof(PyDictObject, ma_values)"),
    ("dk_size", (3, 6), (3, 10), "1 * sizeof(Py_ssize_t)"),
    ("dk_nentries", (3, 6), (3, 10), "4 * sizeof(Py_ssize_t)"),
    ("dk_indices", (3, 6), (3, 10), "5 * sizeof(Py_ssize_t)"),
    ("dk_log2_size", (3, 11), None, "offsetof(PyDictKeysObject, dk_log2_size)"),
    ("dk_log2_index_bytes", (3, 11), None, "offsetof(PyDictKeysObject, dk_log2_index_bytes)"),
    ("dk_kind", (3, 11), None, "offsetof(PyDictKeysObject, dk_kind)"),
    ("dk_nentries", (3, 11), None, "offsetof(PyDictKeysObject, dk_nentries)"),
    ("dk_indices", (3, 11), None, "offsetof(PyDictKeysObject, dk_indices)"),
    ("dict_keys_general", (3, 11), None, "DICT_KEYS_GENERAL"),
    ("entry_size", None, (2, 7), "sizeof(PyDictEntry)"),
    ("entry_key", None, (2, 7), "offsetof(PyDictEntry, me_key)"),
    ("entry_value", None, (2, 7), "offsetof(PyDictEntry, me_value)"),
    ("entry_size", (3, 6), (3, 10), "3 * sizeof(Py_ssize_t)"),
    ("entry_key", (3, 6), (3, 10), "1 * sizeof(Py_ssize_t)"),
    ("entry_value", (3, 6), (3, 10), "2 * sizeof(Py_ssize_t)"),
    ("entry_size", (3, 11), None, "sizeof(PyDictKeyEntry)"),
    ("entry_key", (3, 11), None, "offsetof(PyDictKeyEntry, me_key)"),
    ("entry_value", (3, 11), None, "offsetof(PyDictKeyEntry, me_value)"),
    ("uentry_size", (3, 11), None, "sizeof(PyDictUnicodeEntry)"),
    ("uentry_key", (3, 11), None, "offsetof(PyDictUnicodeEntry, me_key)"),
    ("uentry_value", (3, 11), None, "offsetof(PyDictUnicodeEntry, me_value)"),
    ("values_values", (3, 11), None, "offsetof(PyDictValues, values)"),
    ("values_capacity", (3, 13), None, "offsetof(PyDictValues, capacity)"),
    ("values_valid", (3, 13), None, "offsetof(PyDictValues, valid)"),
    # Instance attributes of a type with a managed dict, as in ASYNC_FIELDS.
    ("managed_values", (3, 11), (3, 11), "(char *)_PyObject_ValuesPointer(FAKE) - (char *)FAKE"),
    ("managed_dict", (3, 11), (3, 11), "(char *)_PyObject_ManagedDictPointer(FAKE) - (char *)FAKE"),
    ("managed_dict", (3, 12), (3, 12), "(char *)_PyObject_DictOrValuesPointer(FAKE) - (char *)FAKE"),
    ("values_untag", (3, 12), (3, 12), "values_untag()"),
    ("managed_dict", (3, 13), None, "MANAGED_DICT_OFFSET"),
    # `dump --locals` (src/python/locals/): a frame's local slots and the names and kinds of
    # them its code object gives, and the built-in types whose values it shows.
    ("flag_heaptype", None, None, "Py_TPFLAGS_HEAPTYPE"),
    ("code_argcount", None, None, "offsetof(PyCodeObject, co_argcount)"),
    ("code_kwonlyargcount", (3, 0), None, "offsetof(PyCodeObject, co_kwonlyargcount)"),
    ("code_flags", None, None, "offsetof(PyCodeObject, co_flags)"),
    ("co_varargs", None, None, "CO_VARARGS"),
    ("co_varkeywords", None, None, "CO_VARKEYWORDS"),
    # <= 3.10: `f_localsplus` holds the locals (`co_nlocals` of them, named by
    # `co_varnames`), then the cells (`co_cellvars`), then the free variables (`co_freevars`).
    ("code_nlocals", None, (3, 10), "offsetof(PyCodeObject, co_nlocals)"),
    ("code_varnames", None, (3, 10), "offsetof(PyCodeObject, co_varnames)"),
    ("code_cellvars", None, (3, 10), "offsetof(PyCodeObject, co_cellvars)"),
    ("code_freevars", None, (3, 10), "offsetof(PyCodeObject, co_freevars)"),
    ("frame_localsplus", None, (3, 10), "offsetof(PyFrameObject, f_localsplus)"),
    # 3.11+: `localsplus` holds `co_nlocalsplus` slots, each named by `co_localsplusnames`
    # and of the kind (local, cell, free, hidden) its byte of `co_localspluskinds` says.
    ("code_nlocalsplus", (3, 11), None, "offsetof(PyCodeObject, co_nlocalsplus)"),
    ("code_localsplusnames", (3, 11), None, "offsetof(PyCodeObject, co_localsplusnames)"),
    ("code_localspluskinds", (3, 11), None, "offsetof(PyCodeObject, co_localspluskinds)"),
    ("frame_localsplus", (3, 11), None, "offsetof(_PyInterpreterFrame, localsplus)"),
    ("fast_local", (3, 11), None, "CO_FAST_LOCAL"),
    ("fast_cell", (3, 11), None, "CO_FAST_CELL"),
    ("fast_free", (3, 11), None, "CO_FAST_FREE"),
    ("fast_hidden", (3, 12), None, "CO_FAST_HIDDEN"),
    # 3.14+: a slot is a `_PyStackRef`, its low bits tags.
    ("stackref_tag_bits", (3, 14), None, "Py_TAG_BITS"),
    ("long_non_size_bits", (3, 12), None, "_PyLong_NON_SIZE_BITS"),
    ("tuple_items", None, None, "offsetof(PyTupleObject, ob_item)"),
    ("list_items", None, None, "offsetof(PyListObject, ob_item)"),
    ("float_value", None, None, "offsetof(PyFloatObject, ob_fval)"),
    ("cell_ref", None, None, "offsetof(PyCellObject, ob_ref)"),
    ("set_used", None, None, "offsetof(PySetObject, used)"),
    ("set_mask", None, None, "offsetof(PySetObject, mask)"),
    ("set_table", None, None, "offsetof(PySetObject, table)"),
    ("setentry_size", None, None, "sizeof(setentry)"),
    ("setentry_key", None, None, "offsetof(setentry, key)"),
    ("setentry_hash", None, None, "offsetof(setentry, hash)"),
    # 2.7's `long` (3.x's `int` above).
    ("long_digits", (2, 7), (2, 7), "offsetof(PyLongObject, ob_digit)"),
    ("long_shift", (2, 7), (2, 7), "PyLong_SHIFT"),
    ("digit_size", (2, 7), (2, 7), "sizeof(digit)"),
    # `dump`'s greenlets (src/python/greenlets.rs): every object the cycle collector tracks,
    # on the lists of its generations (`struct gc_generation`, each a list head then counts),
    # in `_PyRuntime` on 3.7-3.8 and in each interpreter from 3.9. A free-threaded build
    # keeps no such lists ("GIL:": not probed there); 2.7 and 3.6 keep them in a static
    # array of gcmodule.c, found by the global `_PyGC_generation0` (its first head), each
    # a `struct gc_generation` of gcmodule.c's declaration (a head, then two ints) and
    # `NUM_GENERATIONS` (3) of them, as gcmodule.c declares. 3.7+ keep that pointer too
    # (`generation0`, after the array): where the first list really is, which a build may
    # place other than its headers say (Debian's 3.13.18: 4 bytes before). 3.13+ say where an interpreter's `gc` is in their debug offsets
# (`interpreter_state.gc`), which wins over `gc_interp_state`. A type's base (a subclass of greenlet); `_PyErr_StackItem`,
    # which a greenlet's saved state holds one of; a frame object's interpreter frame.
    ("tp_base", None, None, "offsetof(PyTypeObject, tp_base)"),
    ("gc_head_size", None, (3, 6), "sizeof(PyGC_Head)"),
    ("gc_generation_size", None, (3, 6),
     "sizeof(struct { PyGC_Head head; int threshold; int count; })"),
    ("gc_generations_count", None, (3, 6), "3"),
    ("gc_head_size", (3, 7), None, "GIL:sizeof(PyGC_Head)"),
    ("gc_generation_size", (3, 7), None, "GIL:sizeof(struct gc_generation)"),
    ("gc_generations_count", (3, 7), None, "GIL:NUM_GENERATIONS"),
    ("gc_runtime_generations", (3, 7), (3, 8), "offsetof(_PyRuntimeState, gc.generations)"),
    ("gc_runtime_generation0", (3, 7), (3, 8), "offsetof(_PyRuntimeState, gc.generation0)"),
    ("gc_runtime_permanent", (3, 7), (3, 8),
     "offsetof(_PyRuntimeState, gc.permanent_generation)"),
    ("gc_interp_state", (3, 9), None, "GIL:offsetof(PyInterpreterState, gc)"),
    ("gc_interp_generations", (3, 9), None, "GIL:offsetof(PyInterpreterState, gc.generations)"),
    ("gc_interp_generation0", (3, 9), None,
     "GIL:offsetof(PyInterpreterState, gc.generation0)"),
    ("gc_interp_permanent", (3, 9), None,
     "GIL:offsetof(PyInterpreterState, gc.permanent_generation)"),
    ("err_stackitem_size", (3, 7), None, "sizeof(_PyErr_StackItem)"),
    ("frame_object_iframe", (3, 11), None, "offsetof(PyFrameObject, f_frame)"),
]

# Headers the objects probe adds to INCLUDES' (the interpreter state).
OBJECT_INCLUDES = [
    (None, (3, 10), ["longintrepr.h"]),
    ((3, 10), (3, 10), ["internal/pycore_moduleobject.h"]),
    ((3, 11), None, ["internal/pycore_dict.h", "internal/pycore_object.h",
                     "internal/pycore_moduleobject.h"]),
]


def objects_probe_source(version):
    includes = next(inc for first, last, inc in INCLUDES if in_range(version, first, last))
    for first, last, more in OBJECT_INCLUDES:
        if in_range(version, first, last):
            includes = includes + more
    lines = ["#define Py_BUILD_CORE 1", "#define NDEBUG 1", "#include <Python.h>"]
    lines += ["#include <%s>" % h for h in includes]
    lines += ["#include <stddef.h>", "#include <stdio.h>", "#include <string.h>"]
    if version >= (3, 11):
        lines.append(ASYNC_PROBE_HEAD)
    if version == (3, 12):
        lines.append(ASYNC_VALUES_TAG_312)
    lines.append("int main(void) {")
    lines.append('    printf("{\\n");')
    for name, first, last, expr in OBJECT_FIELDS:
        if in_range(version, first, last):
            gil_only = expr.startswith("GIL:")
            if gil_only:
                expr = expr[len("GIL:"):]
                lines.append("#ifndef Py_GIL_DISABLED")
            lines.append('    printf("\\"%s\\": %%lld,\\n", (long long)(%s));' % (name, expr))
            if gil_only:
                lines.append("#endif")
    lines.append('    printf("\\"end\\": 0\\n}\\n");')
    lines.append("    return 0;")
    lines.append("}")
    return "\n".join(lines) + "\n"


def render_objects(tables):
    """objects.rs: one `ObjectLayout` per minor version and build kind, oldest first. A
    field some version lacks is an Option."""
    names = []
    for name, _, _, _ in OBJECT_FIELDS:
        if name not in names:
            names.append(name)
    versions = [full[:2] for full, _, _ in tables]

    def everywhere(name):
        # A field probed on GIL builds alone is an Option, whatever its versions.
        if any(n == name and e.startswith("GIL:") for n, _, _, e in OBJECT_FIELDS):
            return False
        return all(any(n == name and in_range(m, f, l) for n, f, l, _ in OBJECT_FIELDS)
                   for m in versions)

    out = ["// Generated by tools/gen_bindings.py from the headers of CPython %s. Do not edit by hand."
           % ", ".join("%d.%d.%d%s" % (full + ("t" if ft else "",)) for full, ft, _ in tables),
           "", "use super::ObjectLayout;", "",
           "/// One table per minor version (and build kind), oldest first.",
           "pub(crate) const TABLES: &[ObjectLayout] = &["]
    for full, ft, v in tables:
        out.append("    ObjectLayout {")
        out.append("        version: (%d, %d)," % full[:2])
        out.append("        free_threaded: %s," % ("true" if ft else "false"))
        for name in names:
            if everywhere(name):
                out.append("        %s: %d," % (name, v[name]))
            else:
                out.append("        %s: %s," % (name, "Some(%d)" % v[name] if name in v else "None"))
        out.append("    },")
    out.append("];")
    return "\n".join(out) + "\n"


def interpreter_info(python):
    code = ("import sys, sysconfig, json; print(json.dumps({'version': list(sys.version_info[:3]),"
            " 'include': sysconfig.get_paths()['include'],"
            " 'free_threaded': bool(sysconfig.get_config_var('Py_GIL_DISABLED'))}))")
    return json.loads(subprocess.check_output([python.exe, "-c", code]).decode())


def probe(python):
    """(version, include dir, free-threaded, values) of one interpreter's headers."""
    info = interpreter_info(python)
    full = tuple(info["version"])
    version = full[:2]
    inc = host_path(python, info["include"])
    if not os.path.isdir(inc):
        return full, inc, info["free_threaded"], None
    tmp = tempfile.mkdtemp(prefix="scalene-rs-probe-")
    try:
        src = os.path.join(tmp, "probe.c")
        exe = os.path.join(tmp, "probe")
        with open(src, "w") as f:
            f.write(probe_source(version))
        cmd = [os.environ.get("CC", "cc"), "-w", "-I", inc, "-I", os.path.join(inc, "internal")]
        if python.root not in ("", "/"):
            # A root's own headers (Debian keeps pyconfig.h under its multiarch directory),
            # after this machine's C library's.
            cmd += ["-idirafter", os.path.join(python.root, "usr", "include")]
        cmd += [src, "-o", exe]
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        out, _ = p.communicate()
        if p.returncode != 0:
            sys.exit("probe for %s did not compile:\n%s" % (python.label, out.decode(errors="replace")))
        values = json.loads(subprocess.check_output([exe]).decode())
    finally:
        shutil.rmtree(tmp)
    values.pop("end")
    return full, inc, info["free_threaded"], values


def opt(values, key):
    return "Some(%d)" % values[key] if key in values else "None"


def render(full, inc, free_threaded, v):
    major, minor = full[0], full[1]
    version = (major, minor)
    if version <= (3, 10):
        model = "FrameModel::Object { lasti_in_code_units: %s }" % (
            "true" if version == (3, 10) else "false")
    else:
        model = "FrameModel::Interpreter"
    if version < (3, 0):
        table = "LineTableFormat::LnotabUnsigned"
    elif version <= (3, 9):
        table = "LineTableFormat::LnotabSigned"
    elif version == (3, 10):
        table = "LineTableFormat::Linetable310"
    else:
        table = "LineTableFormat::Locations311"
    py3 = major >= 3

    def s(key):
        return v.get(key, 0)

    return """// Generated by tools/gen_bindings.py from the headers of CPython {full} (include/{inc}). Do not edit by hand.

use super::*;

pub(crate) const LAYOUT: Layout = Layout {{
    version: ({major}, {minor}),
    free_threaded: {ft},
    runtime: RuntimeLayout {{
        interpreters_head: {rt_head},
        gilstate_tstate_current: {rt_gil},
    }},
    interp: InterpLayout {{
        next: {i_next},
        tstate_head: {i_head},
        id: {i_id},
        ceval_gil: {i_gil},
        gil_locked: {i_locked},
        gil_last_holder: {i_holder},
    }},
    thread: ThreadLayout {{
        next: {t_next},
        interp: {t_interp},
        frame: {t_frame},
        cframe_current_frame: {t_cframe},
        cframe_previous: {t_cprev},
        root_cframe: {t_root},
        thread_id: {t_id},
        native_thread_id: {t_native},
    }},
    frame: FrameLayout {{
        model: {model},
        back: {f_back},
        code: {f_code},
        lasti: {f_lasti},
        owner: {f_owner},
        is_entry: {f_is_entry},
        size: {f_size},
        stacktop: {f_stacktop},
        executing: {f_executing},
        state: {f_state},
        executing_state: {f_exec},
        gen_iframe: {f_gen_iframe},
        gen_frame_state: {f_gen_state},
    }},
    code: CodeLayout {{
        filename: {c_filename},
        name: {c_name},
        qualname: {c_qualname},
        firstlineno: {c_first},
        linetable: {c_table},
        linetable_format: {table},
        co_code: {c_code},
        code_adaptive: {c_adaptive},
        firsttraceable: {c_traceable},
        flags: {c_flags},
        size: {c_size},
    }},
    string: StringLayout {{
        model: {smodel},
        ob_type: {s_type},
        bytes_size: {s_bsize},
        bytes_sval: {s_bsval},
        unicode_length: {s_len},
        unicode_state: {s_state},
        ascii_size: {s_ascii},
        compact_size: {s_compact},
        unicode_data_any: {s_data},
        state_kind_shift: {s_kind},
        state_compact_shift: {s_cshift},
        state_ascii_shift: {s_ashift},
    }},
}};
""".format(
        full="%d.%d.%d%s" % (full + ("t" if free_threaded else "",)), inc=os.path.basename(inc),
        major=major, minor=minor, ft="true" if free_threaded else "false",
        rt_head=opt(v, "runtime.interpreters_head"),
        rt_gil=opt(v, "runtime.gilstate_tstate_current"),
        i_next=v["interp.next"], i_head=v["interp.tstate_head"], i_id=opt(v, "interp.id"),
        i_gil=opt(v, "interp.ceval_gil"), i_locked=opt(v, "interp.gil_locked"),
        i_holder=opt(v, "interp.gil_last_holder"),
        t_next=v["thread.next"], t_interp=v["thread.interp"], t_frame=v["thread.frame"],
        t_cframe=opt(v, "thread.cframe_current_frame"),
        t_cprev=opt(v, "thread.cframe_previous"), t_root=opt(v, "thread.root_cframe"),
        t_id=v["thread.thread_id"],
        t_native=opt(v, "thread.native_thread_id"),
        model=model, f_back=v["frame.back"], f_code=v["frame.code"], f_lasti=v["frame.lasti"],
        f_owner=opt(v, "frame.owner"), f_is_entry=opt(v, "frame.is_entry"),
        f_size=v["frame.size"],
        f_stacktop=opt(v, "frame.stacktop"), f_state=opt(v, "frame.state"),
        f_executing=opt(v, "frame.executing"), c_flags=v["code.flags"],
        f_exec=opt(v, "frame.executing_state"), f_gen_iframe=opt(v, "frame.gen_iframe"),
        f_gen_state=opt(v, "frame.gen_frame_state"),
        c_filename=v["code.filename"], c_name=v["code.name"], c_qualname=opt(v, "code.qualname"),
        c_first=v["code.firstlineno"], c_table=v["code.linetable"], table=table,
        c_code=opt(v, "code.co_code"), c_adaptive=opt(v, "code.code_adaptive"),
        c_traceable=opt(v, "code.firsttraceable"), c_size=v["code.size"],
        smodel="StringModel::Pep393" if py3 else "StringModel::Bytes2",
        s_type=v["string.ob_type"], s_bsize=v["string.bytes_size"],
        s_bsval=v["string.bytes_sval"], s_len=s("string.unicode_length"),
        s_state=s("string.unicode_state"), s_ascii=s("string.ascii_size"),
        s_compact=s("string.compact_size"), s_data=s("string.unicode_data_any"),
        s_kind=s("string.state_kind_shift"), s_cshift=s("string.state_compact_shift"),
        s_ashift=s("string.state_ascii_shift"),
    )


def rustfmt(text):
    try:
        p = subprocess.Popen(["rustfmt", "--edition", "2021", "--emit", "stdout"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    except OSError as e:
        sys.exit("cannot run rustfmt (install it with `rustup component add rustfmt`): %s" % e)
    out, _ = p.communicate(text.encode())
    if p.returncode != 0:
        sys.exit("rustfmt failed on the generated code:\n" + text)
    return out.decode()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--python", action="append",
                    help="interpreter(s) to probe (default: pyenv's and tools/pythons.sh's)")
    ap.add_argument("--check", action="store_true", help="compare with the checked-in tables")
    ap.add_argument("--out", default=OUT_DIR, help="output directory")
    args = ap.parse_args()
    pythons = ([Interpreter(p, p, "/") for p in args.python] if args.python
               else all_interpreters())
    if not pythons:
        sys.exit("no interpreters found (pass --python)")
    stale = []
    done = set()
    async_tables = []
    object_tables = []
    for python in pythons:
        full, inc, free_threaded, values = probe(python)
        name = "v%d_%d%s.rs" % (full[0], full[1], "t" if free_threaded else "")
        if name in done:
            continue  # one table per minor version (and build kind): the first found
        if values is None:
            print("%s: no headers under %s, skipped" % (python.label, inc), file=sys.stderr)
            continue
        done.add(name)
        if in_range(full[:2], ASYNC_FIRST, ASYNC_LAST):
            async_tables.append((full, free_threaded,
                                 compile_and_run(python, inc, async_probe_source(full[:2]))))
        object_tables.append((full, free_threaded,
                              compile_and_run(python, inc, objects_probe_source(full[:2]))))
        text = rustfmt(render(full, inc, free_threaded, values))
        path = os.path.join(args.out, name)
        if args.check:
            old = open(path).read() if os.path.exists(path) else ""
            if old != text:
                stale.append(path)
                sys.stdout.writelines(difflib.unified_diff(
                    old.splitlines(True), text.splitlines(True), path, "generated"))
            print("%d.%d.%d: %s" % (full + ("differs" if old != text else "up to date",)),
                  file=sys.stderr)
        else:
            with open(path, "w") as f:
                f.write(text)
            print("%d.%d.%d: wrote %s (%d fields)" % (full + (path, len(values))),
                  file=sys.stderr)
    async_tables.sort(key=lambda t: (t[0][:2], t[1]))
    object_tables.sort(key=lambda t: (t[0][:2], t[1]))
    for tables, file_name, renderer in [(async_tables, "asyncio_legacy.rs", render_async),
                                        (object_tables, "objects.rs", render_objects)]:
        if not tables or args.python:
            continue
        path = os.path.join(args.out, file_name)
        text = rustfmt(renderer(tables))
        old = open(path).read() if os.path.exists(path) else ""
        if args.check:
            if old != text:
                stale.append(path)
                sys.stdout.writelines(difflib.unified_diff(
                    old.splitlines(True), text.splitlines(True), path, "generated"))
            print("%s: %s" % (file_name, "differs" if old != text else "up to date"),
                  file=sys.stderr)
        else:
            with open(path, "w") as f:
                f.write(text)
            print("wrote %s (%d tables)" % (path, len(tables)), file=sys.stderr)
    if stale:
        sys.exit("%d table(s) differ from what the headers give" % len(stale))


if __name__ == "__main__":
    main()
