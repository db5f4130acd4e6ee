//! The layout tables: generated ones match the headers, and for every 3.13+ interpreter of
//! the matrix (free-threaded and Debian's own builds included) the run-time
//! `_Py_DebugOffsets` agrees with the generated table, read from the file and from a live
//! process.
//!
//! The checks need at least one CPython 3.13+ in the matrix; without one they fail, unless
//! `SCALENE_RS_ALLOW_MISSING_313=1` is set.

mod common;

use scalene_rs::python::{LocateOptions, PythonProcess};
use scalene_rs::python_bindings::{
    debug_offsets, generated, FrameModel, Layout, LineTableFormat, StringModel, GENERATED,
};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};

/// The fields `_Py_DebugOffsets` carries must equal the generated table's.
fn assert_agrees(from_debug: &Layout, generated: &Layout, what: &str) {
    let (d, g) = (from_debug, generated);
    assert_eq!(d.version, g.version, "{what}: version");
    assert_eq!(
        d.runtime.interpreters_head, g.runtime.interpreters_head,
        "{what}"
    );
    assert_eq!(d.interp, g.interp, "{what}: interpreter state");
    assert_eq!(d.thread, g.thread, "{what}: thread state");
    assert_eq!(d.frame, g.frame, "{what}: interpreter frame");
    let (dc, gc) = (&d.code, &g.code);
    assert_eq!(
        (
            dc.filename,
            dc.name,
            dc.qualname,
            dc.firstlineno,
            dc.linetable,
            dc.code_adaptive,
            dc.size
        ),
        (
            gc.filename,
            gc.name,
            gc.qualname,
            gc.firstlineno,
            gc.linetable,
            gc.code_adaptive,
            gc.size
        ),
        "{what}: code object"
    );
    let (ds, gs) = (&d.string, &g.string);
    assert_eq!(
        (
            ds.ob_type,
            ds.bytes_size,
            ds.bytes_sval,
            ds.unicode_length,
            ds.unicode_state,
            ds.ascii_size
        ),
        (
            gs.ob_type,
            gs.bytes_size,
            gs.bytes_sval,
            gs.unicode_length,
            gs.unicode_state,
            gs.ascii_size
        ),
        "{what}: objects and strings"
    );
    // The rest comes from the fallback table, so the whole Layout must be equal too.
    assert_eq!(d, g, "{what}: whole layout");
}

/// Every 3.13+ interpreter of the matrix (none only when explicitly allowed).
fn pythons_313_plus() -> Vec<common::Interpreter> {
    let found: Vec<_> = common::interpreters()
        .into_iter()
        .filter(|i| i.version() >= (3, 13))
        .collect();
    if found.is_empty() {
        assert!(
            std::env::var_os("SCALENE_RS_ALLOW_MISSING_313").is_some(),
            "no CPython 3.13+ found: the _Py_DebugOffsets checks cannot run \
             (run tools/pythons.sh, or set SCALENE_RS_ALLOW_MISSING_313=1 to skip)"
        );
        common::skip_or_fail(
            "bindings (3.13+ debug offsets)",
            "no CPython 3.13+ on this machine (SCALENE_RS_ALLOW_MISSING_313 is set)",
        );
    }
    found
}

/// The ELF file that holds `_PyRuntime` for `py`: its libpython (a shared build), or the
/// executable itself (Debian's static builds), seen from this machine.
fn runtime_file(py: &common::Interpreter) -> std::path::PathBuf {
    let t = if py.free_threaded { "t" } else { "" };
    let lib = format!("libpython{}.{}{t}.so.1.0", py.major, py.minor);
    match &py.root {
        Some(root) if py.label.ends_with("-shared") => {
            root.join("usr/lib/x86_64-linux-gnu").join(lib)
        }
        Some(root) => root.join(format!("usr/bin/python{}.{}", py.major, py.minor)),
        None => py
            .path
            .parent()
            .unwrap()
            .parent()
            .unwrap()
            .join("lib")
            .join(lib),
    }
}

/// The bytes of `_PyRuntime` in an ELF file: from the `_PyRuntime` symbol, which must be the
/// start of the `.PyRuntime` section when the library has one.
fn runtime_bytes_from_file(lib: &Path) -> Vec<u8> {
    let data = std::fs::read(lib)
        .unwrap_or_else(|e| panic!("{}: {e} (the file that holds _PyRuntime)", lib.display()));
    let elf = goblin::elf::Elf::parse(&data).unwrap();
    let sym = elf
        .dynsyms
        .iter()
        .map(|s| (s, elf.dynstrtab.get_at(s.st_name)))
        .chain(elf.syms.iter().map(|s| (s, elf.strtab.get_at(s.st_name))))
        .find(|(_, name)| *name == Some("_PyRuntime"))
        .map(|(s, _)| s)
        .unwrap_or_else(|| panic!("{} has no _PyRuntime symbol", lib.display()));
    let section = elf
        .section_headers
        .iter()
        .find(|sh| elf.shdr_strtab.get_at(sh.sh_name) == Some(".PyRuntime"));
    if let Some(sh) = section {
        assert_eq!(
            sym.st_value, sh.sh_addr,
            "_PyRuntime is not at the start of the .PyRuntime section"
        );
    }
    let holder = elf
        .section_headers
        .iter()
        .find(|sh| sh.sh_addr <= sym.st_value && sym.st_value < sh.sh_addr + sh.sh_size)
        .expect("a section holds _PyRuntime");
    assert_ne!(
        holder.sh_type,
        goblin::elf::section_header::SHT_NOBITS,
        "_PyRuntime is in a NOBITS section: its initial bytes are not in the file"
    );
    let start = (sym.st_value - holder.sh_addr + holder.sh_offset) as usize;
    let len = (sym.st_size as usize).max(4096).min(data.len() - start);
    data[start..start + len].to_vec()
}

#[test]
fn debug_offsets_in_every_313_plus_file_agree_with_the_generated_table() {
    for py in pythons_313_plus() {
        let file = runtime_file(&py);
        let bytes = runtime_bytes_from_file(&file);
        let what = format!("{} ({})", py.label, file.display());
        let hex = debug_offsets::version_hex(&bytes).expect("_PyRuntime starts with the cookie");
        assert_eq!(
            (hex >> 24, (hex >> 16) & 0xff),
            (py.major as u64, py.minor as u64),
            "{what}: version in _Py_DebugOffsets: {hex:#x}"
        );
        let gen = generated(py.major, py.minor, py.free_threaded)
            .unwrap_or_else(|| panic!("{what}: no generated table"));
        let parsed = debug_offsets::parse(&bytes, debug_offsets::fallback_for(&bytes))
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(parsed.free_threaded, py.free_threaded, "{what}");
        assert_agrees(&parsed, gen, &what);
        // The objects table (threads' names) where the debug offsets carry its fields.
        let objects = scalene_rs::python_bindings::objects_disagree_with_debug_offsets(&bytes)
            .unwrap_or_else(|| panic!("{what}: no objects table"));
        assert!(objects.is_empty(), "{what}: objects table: {objects:?}");
        eprintln!("{what}: agrees");
    }
}

#[test]
fn debug_offsets_read_from_every_live_313_plus_process_agree_with_the_generated_table() {
    for py in pythons_313_plus() {
        let mut child = Command::new(&py.path)
            .args([
                "-c",
                "import sys, time; print('ready'); sys.stdout.flush(); time.sleep(60)",
            ])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let located = PythonProcess::locate(child.id() as i32, &LocateOptions::default());
        let _ = child.kill();
        let _ = child.wait();
        let proc = located.unwrap_or_else(|e| panic!("{}: {e}", py.label));
        assert!(
            !proc.untested,
            "{}: a generated table exists: it is a tested version",
            py.label
        );
        let gen = generated(py.major, py.minor, py.free_threaded).unwrap();
        assert_agrees(&proc.layout, gen, &format!("live {} process", py.label));
    }
}

/// Structural checks on every generated table: the models match the version, and each
/// `size` covers the fields the walker reads with it.
#[test]
fn generated_tables_are_self_consistent() {
    let mut previous = ((0, 0), false);
    for l in GENERATED {
        let v = l.version;
        assert!(
            (v, l.free_threaded) > previous,
            "GENERATED is oldest first, a version's free-threaded table after its own: {v:?}"
        );
        previous = (v, l.free_threaded);
        let t = if l.free_threaded { "t" } else { "" };
        let what = format!("{}.{}{t}", v.0, v.1);
        match l.frame.model {
            FrameModel::Object {
                lasti_in_code_units,
            } => {
                assert!(v <= (3, 10), "{what}: frame objects end at 3.10");
                assert_eq!(lasti_in_code_units, v == (3, 10), "{what}");
                assert!(
                    l.frame.owner.is_none() && l.code.co_code.is_some(),
                    "{what}"
                );
            }
            FrameModel::Interpreter => {
                assert!(v >= (3, 11), "{what}: interpreter frames start at 3.11");
                assert!(
                    l.frame.owner.is_some() && l.code.code_adaptive.is_some(),
                    "{what}"
                );
                assert!(l.code.qualname.is_some(), "{what}");
            }
        }
        let format = match v {
            (2, _) => LineTableFormat::LnotabUnsigned,
            (3, 0..=9) => LineTableFormat::LnotabSigned,
            (3, 10) => LineTableFormat::Linetable310,
            _ => LineTableFormat::Locations311,
        };
        assert_eq!(l.code.linetable_format, format, "{what}");
        assert_eq!(l.string.model == StringModel::Bytes2, v.0 == 2, "{what}");
        assert_eq!(
            l.thread.cframe_current_frame.is_some(),
            ((3, 11)..=(3, 12)).contains(&v),
            "{what}: cframe"
        );
        assert_eq!(
            l.runtime.gilstate_tstate_current.is_some(),
            ((3, 7)..=(3, 11)).contains(&v),
            "{what}: gilstate"
        );
        assert_eq!(l.runtime.interpreters_head.is_some(), v >= (3, 7), "{what}");
        assert_eq!(l.interp.ceval_gil.is_some(), v >= (3, 12), "{what}");
        assert!(
            !l.free_threaded || v >= (3, 13),
            "{what}: free-threading began in 3.13"
        );
        assert_eq!(
            l.code.firsttraceable.is_some(),
            ((3, 11)..=(3, 12)).contains(&v),
            "{what}: firsttraceable"
        );
        let ptr = 8;
        for (field, width) in [
            (l.frame.back, ptr),
            (l.frame.code, ptr),
            (l.frame.lasti, if v <= (3, 10) { 4 } else { ptr }),
            (l.frame.owner.unwrap_or(0), 1),
        ] {
            assert!(field + width <= l.frame.size, "{what}: frame.size");
        }
        for field in [
            Some(l.code.filename),
            Some(l.code.name),
            l.code.qualname,
            Some(l.code.linetable),
            l.code.co_code,
        ]
        .into_iter()
        .flatten()
        {
            assert!(field + ptr <= l.code.size, "{what}: code.size");
        }
        assert!(l.code.firstlineno + 4 <= l.code.size, "{what}: code.size");
        if let Some(adaptive) = l.code.code_adaptive {
            assert!(adaptive < l.code.size, "{what}: co_code_adaptive");
        }
        // 16-byte object header; 32 bytes in a free-threaded build.
        let ob_type = if l.free_threaded { 24 } else { 8 };
        assert_eq!(l.string.ob_type, ob_type, "{what}: ob_type");
        if l.string.model == StringModel::Pep393 {
            let s = &l.string;
            assert!(s.unicode_state + 4 <= s.ascii_size, "{what}: state");
            assert!(s.ascii_size < s.compact_size, "{what}: compact size");
            let shifts = [
                s.state_kind_shift,
                s.state_compact_shift,
                s.state_ascii_shift,
            ];
            assert!(shifts.iter().all(|&b| b < 32), "{what}: shifts {shifts:?}");
        }
    }
}

fn run_generator_check(script: &str) {
    let out = Command::new("python3")
        .arg(common::repo_root().join("tools").join(script))
        .arg("--check")
        .output()
        .expect("python3 runs the generator");
    assert!(
        out.status.success(),
        "{script} --check: the checked-in tables differ from what this machine's headers give:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn generated_layouts_match_the_headers() {
    run_generator_check("gen_bindings.py");
}

#[test]
fn generated_opcode_tables_match_the_interpreters() {
    run_generator_check("gen_opcodes.py");
}

#[test]
fn debug_offsets_field_orders_match_the_headers() {
    run_generator_check("gen_debug_offsets.py");
}

#[test]
fn every_interpreter_of_the_matrix_has_a_table() {
    for py in common::interpreters() {
        assert!(
            generated(py.major, py.minor, py.free_threaded).is_some(),
            "{}: no generated layout",
            py.label
        );
        assert!(
            scalene_rs::python_bindings::opcodes(py.major, py.minor).is_some(),
            "{}: no opcode table",
            py.label
        );
    }
}
