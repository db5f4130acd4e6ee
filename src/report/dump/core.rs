//! `dump --core`'s output: the live `dump`'s text and JSON, with what the core says of the
//! process's end.
//!
//! Owns: the lines a core adds after the process's first line (`Core:`, `Command:`, the
//! crash or its absence), the crashing thread's mark, and the `core` object of the JSON
//! (docs/dump-json.md).
//!
//! Must not: read the core (`session::dump_core` does).

use crate::coredump::{CoreSummary, Crash, Place};
use crate::python::Snapshot;
use std::fmt::Write;

/// `dump --core --json`: the live dump's object, then `core`.
#[derive(serde::Serialize)]
struct CoreJson<'a> {
    schema_version: u32,
    #[serde(flatten)]
    snapshot: &'a Snapshot,
    core: &'a CoreSummary,
}

/// `dump --core --json` as pretty text: the snapshot `s` of the core `core`.
pub fn core_to_json_string(s: &Snapshot, core: &CoreSummary) -> String {
    let view = CoreJson {
        schema_version: super::DUMP_SCHEMA_VERSION,
        snapshot: s,
        core,
    };
    let mut text = serde_json::to_string_pretty(&view).expect("a snapshot always serializes");
    text.push('\n');
    text
}

/// `symbol (module)`, `module+0xOFFSET`, or `module`.
fn place_text(p: &Place) -> String {
    match (&p.symbol, &p.module, p.offset) {
        (Some(s), Some(m), _) => format!("{s} ({m})"),
        (Some(s), None, _) => s.clone(),
        (None, Some(m), Some(o)) => format!("{m}+{o:#x}"),
        (None, Some(m), None) => m.clone(),
        (None, None, _) => "?".into(),
    }
}

/// The crash line: `Crash: SIGSEGV (SEGV_MAPERR) at address 0x0, in thread 7 at
/// __strlen_avx2 (libc.so.6)`.
fn crash_line(c: &Crash) -> String {
    let mut s = format!(
        "Crash: {}",
        c.signal_name
            .map_or_else(|| format!("signal {}", c.signal), str::to_string)
    );
    if let Some(code) = c.code_name {
        let _ = write!(s, " ({code})");
    }
    if let Some(a) = c.address {
        let _ = write!(s, " at address {a:#x}");
        if let Some(p) = c.address_place.as_ref().filter(|p| p.module.is_some()) {
            let _ = write!(s, " in {}", place_text(p));
        }
    }
    if let Some(pid) = c.sender {
        let _ = write!(s, " sent by process {pid}");
    }
    let _ = write!(s, ", in thread {}", c.thread);
    if let Some(pc) = c.pc {
        match &c.pc_place {
            Some(p) => {
                let _ = write!(s, " at {} [{pc:#x}]", place_text(p));
            }
            None => {
                let _ = write!(s, " at {pc:#x}");
            }
        }
    }
    s
}

/// `dump --core`'s text: the live dump's, with the core's lines after the first.
pub fn core_to_text(s: &Snapshot, core: &CoreSummary) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "Process {}: {}", s.pid, s.executable);
    let _ = writeln!(out, "Core: {} ({})", core.file, core.format);
    if let Some(c) = &core.command {
        let _ = writeln!(out, "Command: {c}");
    }
    match &core.crash {
        Some(c) => {
            let _ = writeln!(out, "{}", crash_line(c));
        }
        None => {
            let _ = writeln!(
                out,
                "No crash: no signal that writes a core (taken from a running process, as gcore does)"
            );
        }
    }
    super::details_marking(&mut out, s, core.crash.as_ref().map(|c| c.thread));
    out
}
