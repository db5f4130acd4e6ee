//! `LineTable` against the interpreters themselves.
//!
//! For every interpreter on the machine, `tests/support/linetable_truth.py` compiles the
//! source of 40+ stdlib modules and prints, for every code object, its raw line table and
//! the line the interpreter itself gives for each instruction (co_positions / co_lines /
//! dis.findlinestarts, plus PyCode_Addr2Line through ctypes). We decode each table with
//! `scalene_rs::python::linetable::LineTable` and compare `line_at` at every instruction.

mod common;

use scalene_rs::python::linetable::LineTable;
use scalene_rs::python_bindings::{self, LineTableFormat};
use serde::Deserialize;
use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::process::Command;

/// Fewest modules / code objects / instructions one interpreter must yield.
const MIN_MODULES: usize = 10;
const MIN_CODE_OBJECTS: usize = 1000;
const MIN_INSTRUCTIONS: usize = 50_000;
/// Mismatches quoted per interpreter.
const QUOTED: usize = 8;

#[derive(Deserialize)]
struct Record {
    module: String,
    name: String,
    firstlineno: u32,
    table: String,
    code_len: u64,
    offsets: Vec<u32>,
    lines: Vec<Option<i64>>,
    addr2line: Option<Vec<Option<i64>>>,
    /// (offset, PyCode_Addr2Line) at and past the end of the bytecode.
    past_end: Option<Vec<(u32, Option<i64>)>>,
}

#[derive(Deserialize)]
struct Summary {
    version: String,
    modules: usize,
    code_objects: usize,
    instructions: usize,
    missing: Vec<String>,
    addr2line: bool,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Line {
    Summary { summary: Summary },
    Record(Box<Record>),
}

/// The table format CPython `major.minor` uses.
fn expected_format(major: u32, minor: u32) -> LineTableFormat {
    match (major, minor) {
        (2, _) | (3, 0..=5) => LineTableFormat::LnotabUnsigned,
        (3, 6..=9) => LineTableFormat::LnotabSigned,
        (3, 10) => LineTableFormat::Linetable310,
        _ => LineTableFormat::Locations311,
    }
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// Which table features the interpreter's real tables exercised.
#[derive(Default, Debug)]
struct Features {
    /// lnotab pairs with a negative (signed) line increment.
    negative_deltas: usize,
    /// lnotab / 3.10 pairs with a zero byte increment (split line jumps).
    zero_length_pairs: usize,
    /// 3.10 pairs with -128 ("no line").
    no_line_pairs: usize,
    /// 3.11+ entry heads per code (0..=15).
    location_codes: [usize; 16],
}

impl Features {
    fn scan(&mut self, format: LineTableFormat, table: &[u8]) {
        match format {
            LineTableFormat::LnotabUnsigned
            | LineTableFormat::LnotabSigned
            | LineTableFormat::Linetable310 => {
                for pair in table.chunks_exact(2) {
                    let delta = pair[1] as i8;
                    if pair[0] == 0 {
                        self.zero_length_pairs += 1;
                    }
                    if format == LineTableFormat::Linetable310 && delta == -128 {
                        self.no_line_pairs += 1;
                    } else if format != LineTableFormat::LnotabUnsigned && delta < 0 {
                        self.negative_deltas += 1;
                    }
                }
            }
            LineTableFormat::Locations311 => {
                // In a well-formed table only entry heads have bit 7 set.
                for &b in table.iter().filter(|&&b| b & 0x80 != 0) {
                    self.location_codes[usize::from((b >> 3) & 15)] += 1;
                }
            }
        }
    }

    fn describe(&self, format: LineTableFormat) -> String {
        match format {
            LineTableFormat::Locations311 => {
                let c = &self.location_codes;
                format!(
                    "entries: short {} one-line {} no-column {} long {} no-location {}",
                    c[..10].iter().sum::<usize>(),
                    c[10..13].iter().sum::<usize>(),
                    c[13],
                    c[14],
                    c[15]
                )
            }
            _ => format!(
                "negative deltas {}, zero-length pairs {}, no-line pairs {}",
                self.negative_deltas, self.zero_length_pairs, self.no_line_pairs
            ),
        }
    }
}

/// Outcome of one interpreter.
struct Checked {
    report: String,
    failures: Vec<String>,
}

fn check_interpreter(py: &common::Interpreter) -> Checked {
    let label = format!("{} ({})", py.label, py.path.display());
    let mut failures = Vec::new();
    let fail = |failures: &mut Vec<String>, msg: String| {
        failures.push(format!("{label}: {msg}"));
    };

    let format = expected_format(py.major, py.minor);
    if let Some(layout) = python_bindings::generated(py.major, py.minor, py.free_threaded) {
        if layout.code.linetable_format != format {
            fail(
                &mut failures,
                format!(
                    "python_bindings layout for {}.{} says {:?}, CPython uses {format:?}",
                    py.major, py.minor, layout.code.linetable_format
                ),
            );
        }
    }

    let script = common::repo_root().join("tests/support/linetable_truth.py");
    let out = match Command::new(&py.path).arg(&script).output() {
        Ok(out) => out,
        Err(e) => {
            fail(&mut failures, format!("cannot run: {e}"));
            return Checked {
                report: String::new(),
                failures,
            };
        }
    };
    if !out.status.success() {
        fail(
            &mut failures,
            format!(
                "truth script failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ),
        );
        return Checked {
            report: String::new(),
            failures,
        };
    }

    let stdout = String::from_utf8_lossy(&out.stdout);
    let mut summary = None;
    let mut modules = BTreeSet::new();
    let mut codes = 0usize;
    let mut instructions = 0usize;
    let mut addr2line_checked = 0usize;
    let mut mismatches = 0usize;
    let mut torn_mismatches = 0usize;
    let mut torn_quoted = Vec::new();
    let mut quoted = Vec::new();
    let mut features = Features::default();

    for (lineno, text) in stdout.lines().enumerate() {
        let rec = match serde_json::from_str::<Line>(text) {
            Ok(Line::Summary { summary: s }) => {
                summary = Some(s);
                continue;
            }
            Ok(Line::Record(r)) => r,
            Err(e) => {
                fail(
                    &mut failures,
                    format!("bad output line {}: {e}", lineno + 1),
                );
                continue;
            }
        };
        let Some(table) = unhex(&rec.table) else {
            fail(&mut failures, format!("bad hex in line {}", lineno + 1));
            continue;
        };
        if rec.offsets.len() != rec.lines.len()
            || rec
                .addr2line
                .as_ref()
                .is_some_and(|a| a.len() != rec.offsets.len())
        {
            fail(
                &mut failures,
                format!("ragged record on line {}", lineno + 1),
            );
            continue;
        }
        features.scan(format, &table);
        modules.insert(rec.module.clone());
        codes += 1;

        let lt = LineTable::decode(format, &table, rec.firstlineno);
        // 3.10+ tables describe exactly the bytecode.
        let exact_end = matches!(
            format,
            LineTableFormat::Linetable310 | LineTableFormat::Locations311
        );
        if exact_end && lt.end() != rec.code_len {
            fail(
                &mut failures,
                format!(
                    "{}:{} (line {}): table covers {} bytes, bytecode is {}",
                    rec.module,
                    rec.name,
                    rec.firstlineno,
                    lt.end(),
                    rec.code_len
                ),
            );
        }

        let short_table = if rec.table.len() > 48 {
            format!("{}... ({} bytes)", &rec.table[..48], table.len())
        } else {
            rec.table.clone()
        };
        for (i, &off) in rec.offsets.iter().enumerate() {
            let got = lt.line_at(off).map(i64::from);
            let expected = rec.lines[i];
            let a2l = rec.addr2line.as_ref().map(|a| a[i]);
            instructions += 1;
            addr2line_checked += usize::from(a2l.is_some());
            if got != expected || a2l.is_some_and(|a| a != got) {
                mismatches += 1;
                if quoted.len() < QUOTED {
                    let a2l = a2l
                        .map(|a| format!(", PyCode_Addr2Line {a:?}"))
                        .unwrap_or_default();
                    quoted.push(format!(
                        "{}:{} (firstlineno {}, table {short_table}) offset {off}: \
                         expected {expected:?}{a2l}, line_at gives {got:?}",
                        rec.module, rec.name, rec.firstlineno
                    ));
                }
            }
        }

        // Past the end: the last line on <= 3.9 (co_lnotab has no end), no line on 3.10+.
        for &(off, expected) in rec.past_end.iter().flatten() {
            let got = lt.line_at(off).map(i64::from);
            if got != expected {
                mismatches += 1;
                if quoted.len() < QUOTED {
                    quoted.push(format!(
                        "{}:{} (firstlineno {}, table {short_table}) offset {off} past the \
                         {}-byte bytecode: PyCode_Addr2Line {expected:?}, line_at gives {got:?}",
                        rec.module, rec.name, rec.firstlineno, rec.code_len
                    ));
                }
            }
        }

        // A torn copy (cut in half) must decode to a prefix of the same answers.
        let cut = LineTable::decode(format, &table[..table.len() / 2], rec.firstlineno);
        let agreed_until = match cut.ranges().last() {
            Some((start, end, _)) if end == u64::MAX => u64::from(start),
            Some((_, end, _)) => end,
            None => 0,
        };
        for &off in rec.offsets.iter().filter(|&&o| u64::from(o) < agreed_until) {
            if cut.line_at(off) != lt.line_at(off) {
                torn_mismatches += 1;
                if torn_quoted.len() < QUOTED {
                    torn_quoted.push(format!(
                        "{}:{} offset {off}: half-table gives {:?}, full table {:?}",
                        rec.module,
                        rec.name,
                        cut.line_at(off),
                        lt.line_at(off)
                    ));
                }
            }
        }
    }

    match &summary {
        None => fail(&mut failures, "truth script printed no summary".into()),
        Some(s) => {
            if s.code_objects != codes || s.instructions != instructions {
                fail(
                    &mut failures,
                    format!(
                        "summary says {} code objects / {} instructions, parsed {codes} / {instructions}",
                        s.code_objects, s.instructions
                    ),
                );
            }
            if s.modules != modules.len() {
                fail(
                    &mut failures,
                    format!(
                        "summary says {} modules, records name {}",
                        s.modules,
                        modules.len()
                    ),
                );
            }
        }
    }
    if modules.len() < MIN_MODULES || codes < MIN_CODE_OBJECTS || instructions < MIN_INSTRUCTIONS {
        fail(
            &mut failures,
            format!(
                "too little checked: {} modules, {codes} code objects, {instructions} instructions \
                 (need {MIN_MODULES} / {MIN_CODE_OBJECTS} / {MIN_INSTRUCTIONS})",
                modules.len()
            ),
        );
    }
    if mismatches > 0 {
        let mut msg = format!(
            "{mismatches} of {instructions} instructions get a wrong line ({format:?}); first ones:"
        );
        for q in &quoted {
            let _ = write!(msg, "\n    {q}");
        }
        fail(&mut failures, msg);
    }
    if torn_mismatches > 0 {
        let mut msg = format!(
            "{torn_mismatches} offsets decode differently from a table cut in half; first ones:"
        );
        for q in &torn_quoted {
            let _ = write!(msg, "\n    {q}");
        }
        fail(&mut failures, msg);
    }

    let mut report = format!(
        "{label}: {format:?}, {} modules, {codes} code objects, {instructions} instructions \
         checked against the interpreter",
        modules.len()
    );
    if let Some(s) = &summary {
        let _ = write!(
            report,
            " [Python {}; PyCode_Addr2Line: {}]",
            s.version,
            if s.addr2line {
                format!("{addr2line_checked} offsets")
            } else {
                "unavailable (no ctypes)".into()
            }
        );
        if !s.missing.is_empty() {
            let _ = write!(report, " [modules not found: {}]", s.missing.join(", "));
        }
    }
    let _ = write!(
        report,
        "\n    table features: {}",
        features.describe(format)
    );
    Checked { report, failures }
}

#[test]
fn line_tables_match_every_interpreter() {
    let interpreters = common::interpreters();
    let results: Vec<Checked> = std::thread::scope(|s| {
        let handles: Vec<_> = interpreters
            .iter()
            .map(|py| s.spawn(move || check_interpreter(py)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("checker thread panicked"))
            .collect()
    });

    let mut failures = Vec::new();
    for r in results {
        if !r.report.is_empty() {
            println!("{}", r.report);
        }
        failures.extend(r.failures);
    }
    assert!(
        failures.is_empty(),
        "line tables disagree with the interpreters ({} problems):\n{}",
        failures.len(),
        failures.join("\n")
    );
}
