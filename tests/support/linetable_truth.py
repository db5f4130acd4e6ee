# -*- coding: utf-8 -*-
"""Ground truth for tests/linetable.rs: every instruction's line, as the interpreter says.

Runs unchanged on Python 2.7 and 3.6+. For every code object compiled from the source of a
set of stdlib modules (and, recursively, every code object in co_consts), prints one JSON
object per line:

    {"module", "name", "firstlineno", "table" (hex of co_lnotab on <=3.9, co_linetable on
     3.10+), "code_len" (bytes of co_code), "offsets" (byte offsets checked),
     "lines" (the interpreter's line for each offset, null = no line),
     "addr2line" (PyCode_Addr2Line for each offset via ctypes, or null if unavailable),
     "past_end" ([offset, PyCode_Addr2Line] for offsets at and beyond the end of the
     bytecode, or null)}

followed by one {"summary": ...} line.

Where the truth comes from:
  3.11+   code.co_positions(): one entry per 2-byte code unit; its line.
  3.10    code.co_lines(): (start, end, line) byte ranges; every 2-byte offset in them.
  3.6-3.9 dis.findlinestarts(): the line of the last start <= offset, every 2-byte offset.
  2.7     dis.findlinestarts() likewise, at every offset where an instruction starts
          (1 byte, or 3 with an argument: opcode >= dis.HAVE_ARGUMENT).
  If an offset precedes every line start, its line is co_firstlineno.
The second, independent truth is the interpreter's C function PyCode_Addr2Line (byte
offsets on every version), called through ctypes when ctypes is available.
"""
from __future__ import print_function

import binascii
import dis
import json
import sys
import types

MODULES = [
    "os", "re", "json", "json.decoder", "json.encoder", "argparse", "collections",
    "threading", "subprocess", "inspect", "textwrap", "difflib", "tokenize",
    "email.parser", "email.message", "string", "random", "pickle", "tarfile", "zipfile",
    "shutil", "tempfile", "logging", "calendar", "optparse", "fractions", "heapq",
    "ftplib", "smtplib", "pydoc", "unittest.case", "ast", "locale", "gettext",
]
if sys.version_info[0] >= 3:
    MODULES += ["_pydecimal", "asyncio.base_events", "dataclasses", "enum", "typing",
                "pathlib", "statistics", "concurrent.futures.process"]
else:
    MODULES += ["decimal", "sets", "urllib", "urllib2", "HTMLParser", "ConfigParser"]

PY = sys.version_info[:2]


def addr2line_function():
    if hasattr(sys, "gettotalrefcount"):
        return None  # debug build: PyCode_Addr2Line asserts on offsets past the code
    try:
        import ctypes
        f = ctypes.pythonapi.PyCode_Addr2Line
    except Exception:
        return None
    f.argtypes = [ctypes.py_object, ctypes.c_int]
    f.restype = ctypes.c_int
    return f


ADDR2LINE = addr2line_function()


def source_file(module):
    try:
        __import__(module)
    except Exception:
        return None
    path = getattr(sys.modules[module], "__file__", None)
    if not path:
        return None
    if path.endswith((".pyc", ".pyo")):
        path = path[:-1]
    if not path.endswith(".py"):
        return None
    return path


def code_objects(top):
    stack = [top]
    while stack:
        code = stack.pop()
        yield code
        for const in reversed(code.co_consts):
            if isinstance(const, types.CodeType):
                stack.append(const)


def table_bytes(code):
    if PY >= (3, 10):
        return code.co_linetable
    return code.co_lnotab


def instruction_offsets(code):
    n = len(code.co_code)
    if PY >= (3, 6):
        return list(range(0, n, 2))
    # 2.7: variable-length instructions.
    offsets = []
    co = code.co_code
    i = 0
    while i < n:
        offsets.append(i)
        op = ord(co[i])
        i += 3 if op >= dis.HAVE_ARGUMENT else 1
    return offsets


def truth_lines(code, offsets):
    if PY >= (3, 11):
        positions = list(code.co_positions())
        lines = []
        for off in offsets:
            unit = off // 2
            lines.append(positions[unit][0] if unit < len(positions) else None)
        return lines
    if PY == (3, 10):
        by_offset = {}
        for start, end, line in code.co_lines():
            for off in range(start, end, 2):
                by_offset[off] = line
        return [by_offset.get(off) for off in offsets]
    starts = sorted(dis.findlinestarts(code))
    lines = []
    k = 0
    line = code.co_firstlineno
    for off in offsets:
        while k < len(starts) and starts[k][0] <= off:
            line = starts[k][1]
            k += 1
        lines.append(line)
    return lines


def addr2line_lines(code, offsets):
    if ADDR2LINE is None:
        return None
    out = []
    for off in offsets:
        line = ADDR2LINE(code, off)
        out.append(None if line < 0 else line)
    return out


def past_end(code):
    if ADDR2LINE is None:
        return None
    out = []
    for off in (len(code.co_code), len(code.co_code) + 2, len(code.co_code) + 1000):
        line = ADDR2LINE(code, off)
        out.append([off, None if line < 0 else line])
    return out


def main():
    modules = 0
    codes = 0
    instructions = 0
    missing = []
    for module in MODULES:
        path = source_file(module)
        if path is None:
            missing.append(module)
            continue
        with open(path, "rb") as f:
            source = f.read()
        # dont_inherit=True: this script's own `from __future__ import print_function`
        # must not leak into the module being compiled (2.7's print statements).
        top = compile(source, path, "exec", 0, True)
        modules += 1
        for code in code_objects(top):
            offsets = instruction_offsets(code)
            record = {
                "module": module,
                "name": code.co_name,
                "firstlineno": code.co_firstlineno,
                "table": binascii.hexlify(table_bytes(code)).decode("ascii"),
                "code_len": len(code.co_code),
                "offsets": offsets,
                "lines": truth_lines(code, offsets),
                "addr2line": addr2line_lines(code, offsets),
                "past_end": past_end(code),
            }
            print(json.dumps(record, sort_keys=True))
            codes += 1
            instructions += len(offsets)
    print(json.dumps({"summary": {
        "version": "%d.%d.%d" % tuple(sys.version_info[:3]),
        "modules": modules,
        "code_objects": codes,
        "instructions": instructions,
        "missing": missing,
        "addr2line": ADDR2LINE is not None,
    }}, sort_keys=True))


if __name__ == "__main__":
    main()
