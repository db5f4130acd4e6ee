//! The layout tables: generated ones match the headers, and for 3.13 the run-time
//! `_Py_DebugOffsets` agrees with the generated table.

mod common;

use scalene_rs::python::{LocateOptions, PythonProcess};
use scalene_rs::python_bindings::{debug_offsets, generated, Layout};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

/// The fields `_Py_DebugOffsets` carries must equal the generated table's.
fn assert_agrees(from_debug: &Layout, generated: &Layout, what: &str) {
    let (d, g) = (from_debug, generated);
    assert_eq!(d.version, g.version, "{what}: version");
    assert_eq!(d.runtime.interpreters_head, g.runtime.interpreters_head, "{what}");
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
    assert_eq!(d.string, g.string, "{what}: strings");
}

fn python313() -> Option<common::Interpreter> {
    common::interpreters()
        .into_iter()
        .find(|i| i.version() == (3, 13) && i.label.starts_with("pyenv"))
}

fn require_313() -> Option<common::Interpreter> {
    let found = python313();
    if found.is_none() {
        assert!(
            std::env::var_os("SCALENE_RS_ALLOW_MISSING_313").is_some(),
            "no CPython 3.13 found: the _Py_DebugOffsets check cannot run (set SCALENE_RS_ALLOW_MISSING_313=1 to skip)"
        );
        eprintln!("skipped: no CPython 3.13 on this machine");
    }
    found
}

#[test]
fn debug_offsets_in_the_313_library_file_agree_with_the_generated_table() {
    let Some(py) = require_313() else { return };
    let lib = py
        .path
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("lib/libpython3.13.so.1.0");
    let data = std::fs::read(&lib).unwrap();
    let elf = goblin::elf::Elf::parse(&data).unwrap();
    let sh = elf
        .section_headers
        .iter()
        .find(|s| elf.shdr_strtab.get_at(s.sh_name) == Some(".PyRuntime"))
        .expect("libpython3.13 has a .PyRuntime section");
    let bytes = &data[sh.sh_offset as usize..(sh.sh_offset + sh.sh_size) as usize];
    let gen = generated(3, 13).expect("a generated 3.13 table");
    let parsed = debug_offsets::parse(bytes, gen).unwrap();
    assert_agrees(&parsed, gen, "libpython3.13 file");
}

#[test]
fn debug_offsets_read_from_a_live_313_process_agree_with_the_generated_table() {
    let Some(py) = require_313() else { return };
    let mut child = Command::new(&py.path)
        .args(["-c", "import sys, time; print('ready'); sys.stdout.flush(); time.sleep(60)"])
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
    let proc = located.unwrap();
    assert!(!proc.untested, "3.13 has a generated table: it is a tested version");
    assert_agrees(&proc.layout, generated(3, 13).unwrap(), "live 3.13 process");
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
fn every_interpreter_of_the_matrix_has_a_table() {
    for py in common::interpreters() {
        assert!(
            generated(py.major, py.minor).is_some(),
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
