//! Rendering a [`Snapshot`] for `scalene-rs dump`: a debugger-style backtrace, or JSON
//! (a process tree's, `dump --subprocesses`: `tree.rs`).
//!
//! Must not: read process memory.

use crate::native::NativeFrame;
use crate::python::{Frame, Snapshot, StackEntry};

mod tasks;
mod tree;
use std::fmt::Write;
pub use tree::{tree_to_json_string, tree_to_text};

/// JSON schema version of `dump --json` output (documented in docs/dump-json.md).
const DUMP_SCHEMA_VERSION: u32 = 1;

/// `dump --json`: the schema version, then the snapshot's fields in their declared order.
#[derive(serde::Serialize)]
struct DumpJson<'a> {
    schema_version: u32,
    #[serde(flatten)]
    snapshot: &'a Snapshot,
}

/// `dump --json` as a JSON value.
#[cfg(test)]
fn to_json(s: &Snapshot) -> serde_json::Value {
    serde_json::to_value(json_view(s)).expect("a snapshot always serializes")
}

/// `dump --json` as pretty text, fields in a stable, documented order.
pub fn to_json_string(s: &Snapshot) -> String {
    let mut text =
        serde_json::to_string_pretty(&json_view(s)).expect("a snapshot always serializes");
    text.push('\n');
    text
}

fn json_view(s: &Snapshot) -> DumpJson<'_> {
    DumpJson {
        schema_version: DUMP_SCHEMA_VERSION,
        snapshot: s,
    }
}

/// The human backtrace.
pub fn to_text(s: &Snapshot) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "Process {}: {}", s.pid, s.executable);
    details(&mut out, s);
    out
}

/// What follows a process's first line: its Python, then every thread's stack (and the
/// tasks).
fn details(out: &mut String, s: &Snapshot) {
    let _ = write!(
        out,
        "Python {} (version from {})",
        s.python_version,
        s.version_source.describe()
    );
    if s.free_threaded {
        let _ = write!(out, ", free-threaded build (no GIL)");
    }
    if s.untested_version {
        let _ = write!(
            out,
            " — untested version: read through _Py_DebugOffsets, results may be incomplete"
        );
    }
    out.push('\n');
    if let Some(n) = &s.native {
        let _ = writeln!(
            out,
            "Native frames merged with Python's on {} of {} threads{}",
            n.merged,
            n.merged + n.unmerged,
            if n.unmerged > 0 {
                " (the others show their Python frames alone)"
            } else {
                ""
            }
        );
    }
    for t in &s.threads {
        out.push('\n');
        let mut state = Vec::new();
        state.push(if t.idle { "idle" } else { "active" });
        if t.in_native == Some(true) {
            state.push("in native code");
        }
        if t.holds_gil {
            state.push("holds the GIL");
        }
        if t.interpreter != 0 {
            state.push("subinterpreter");
        }
        let _ = write!(
            out,
            "Thread {} ",
            t.native_id
                .map(|n| n.to_string())
                .unwrap_or_else(|| format!("{:#x}", t.thread_id))
        );
        if let Some(inner) = t.ns_native_id {
            let _ = write!(out, "[{inner} in its PID namespace] ");
        }
        if let Some(name) = &t.name {
            let _ = write!(out, "\"{name}\" ");
        }
        let _ = writeln!(out, "({})", state.join(", "));
        if let Some(err) = &t.error {
            let _ = writeln!(out, "    <stack not read: {err}>");
            continue;
        }
        if let Some(n) = &t.native {
            if let Some(why) = &n.unmerged {
                let _ = writeln!(out, "    <native frames not merged: {why}>");
            }
            if n.stack.is_empty() {
                let _ = writeln!(out, "    <no frames>");
            }
            for (i, e) in n.stack.iter().enumerate() {
                match e {
                    StackEntry::Python(f) => python_line(out, i, f),
                    StackEntry::Native(f) => native_line(out, i, f),
                }
            }
            if n.truncated {
                let _ = writeln!(
                    out,
                    "    ... stack truncated after {} frames",
                    n.stack.len()
                );
            }
            if let Some(why) = &n.unwind_stopped {
                let _ = writeln!(out, "    <native unwinding stopped: {why}>");
            }
            continue;
        }
        if t.frames.is_empty() {
            let _ = writeln!(out, "    <no Python frames>");
        }
        for (i, f) in t.frames.iter().enumerate() {
            python_line(out, i, f);
        }
        if t.truncated {
            let _ = writeln!(
                out,
                "    ... stack truncated after {} frames",
                t.frames.len()
            );
        }
    }
    for t in s.native.iter().flat_map(|n| &n.other_threads) {
        out.push('\n');
        let _ = write!(out, "Thread {} ", t.native_id);
        if let Some(name) = &t.name {
            let _ = write!(out, "\"{name}\" ");
        }
        let _ = writeln!(out, "(no Python thread state)");
        if let Some(err) = &t.error {
            let _ = writeln!(out, "    <stack not read: {err}>");
        }
        for (i, f) in t.frames.iter().enumerate() {
            native_line(out, i, f);
        }
        if t.truncated {
            let _ = writeln!(
                out,
                "    ... stack truncated after {} frames",
                t.frames.len()
            );
        }
        if let Some(why) = &t.unwind_stopped {
            let _ = writeln!(out, "    <native unwinding stopped: {why}>");
        }
    }
    if let Some(a) = &s.asyncio {
        tasks::to_text(out, a, s);
    }
}

/// `    #3   function (file:line)`.
fn python_line(out: &mut String, i: usize, f: &Frame) {
    let line = f.line.map(|l| l.to_string()).unwrap_or_else(|| "?".into());
    let _ = writeln!(out, "    #{i:<3} {} ({}:{line})", f.function, f.filename);
}

/// `    #3   symbol (file:line) [module]`, `    #3   module+0xOFFSET`, or the bare address.
fn native_line(out: &mut String, i: usize, f: &NativeFrame) {
    let _ = write!(out, "    #{i:<3} {}", f.label());
    if let (Some(file), Some(line)) = (&f.file, f.line) {
        let _ = write!(out, " ({file}:{line})");
    }
    if let (Some(_), Some(m)) = (&f.symbol, &f.module) {
        let _ = write!(out, " [{m}]");
    }
    if let Some(note) = &f.module_note {
        let _ = write!(out, " ({note})");
    }
    out.push('\n');
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::python::version::VersionSource;
    use crate::python::{Frame, ThreadSnapshot};

    pub(super) fn sample() -> Snapshot {
        Snapshot {
            pid: 42,
            python_version: "3.12.1".into(),
            version_source: VersionSource::PyVersionSymbol,
            untested_version: false,
            free_threaded: false,
            executable: "/usr/bin/python3.12".into(),
            threads: vec![ThreadSnapshot {
                thread_id: 0x7f00,
                native_id: Some(42),
                ns_native_id: None,
                name: Some("python3.12".into()),
                holds_gil: true,
                idle: false,
                in_native: Some(false),
                frames: vec![
                    Frame {
                        function: "inner".into(),
                        filename: "/tmp/a.py".into(),
                        line: Some(3),
                        native: false,
                    },
                    Frame {
                        function: "<module>".into(),
                        filename: "/tmp/a.py".into(),
                        line: Some(10),
                        native: false,
                    },
                ],
                truncated: false,
                error: None,
                interpreter: 0,
                read_paused: false,
                evals: vec![1, 1],
                evals_open: 0,
                anchors: Vec::new(),
                native: None,
                unchanged: false,
                top_frame: 0,
            }],
            native: None,
            asyncio: None,
            left_out: 0,
            woken: Vec::new(),
        }
    }

    #[test]
    fn text_is_a_backtrace() {
        let text = to_text(&sample());
        assert_eq!(
            text,
            "Process 42: /usr/bin/python3.12\n\
             Python 3.12.1 (version from the Py_Version symbol)\n\
             \n\
             Thread 42 \"python3.12\" (active, holds the GIL)\n    \
             #0   inner (/tmp/a.py:3)\n    \
             #1   <module> (/tmp/a.py:10)\n"
        );
    }

    #[test]
    fn json_has_the_documented_fields() {
        let v = to_json(&sample());
        for key in [
            "pid",
            "python_version",
            "executable",
            "threads",
            "schema_version",
        ] {
            assert!(v.get(key).is_some(), "{key}");
        }
        let t = &v["threads"][0];
        for key in [
            "thread_id",
            "native_id",
            "name",
            "holds_gil",
            "idle",
            "frames",
        ] {
            assert!(t.get(key).is_some(), "{key}");
        }
        assert_eq!(t["frames"][0]["line"], 3);
    }
}
