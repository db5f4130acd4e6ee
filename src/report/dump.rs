//! Rendering a [`Snapshot`] for `scalene-rs dump`, as a debugger-style backtrace or as JSON
//! (a process tree's, for `dump --subprocesses`, is in `tree.rs`).
//!
//! Must not: read process memory.

use crate::native::NativeFrame;
use crate::python::{Frame, Snapshot, StackEntry};

mod core;
mod greenlets;
mod tasks;
mod tree;
pub use self::core::{core_to_json_string, core_to_text};
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
    details_marking(out, s, None)
}

/// [`details`], with the thread of kernel id `crashed` (a core's) marked `crashed`.
fn details_marking(out: &mut String, s: &Snapshot, crashed: Option<i32>) {
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
    for id in &s.stale_ids {
        let _ = writeln!(
            out,
            "A thread state records thread {}, which is not a thread of this process (forked \
             without PyOS_AfterFork_Child, as uWSGI's workers are by default): it is thread {}",
            id.recorded, id.actual
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
        let interpreter = format!("interpreter {}", t.interpreter);
        if t.interpreter != 0 {
            state.push(&interpreter);
        }
        if crashed.is_some() && t.native_id == crashed {
            state.push("crashed");
        }
        let _ = write!(
            out,
            "Thread {}",
            t.native_id
                .map(|n| n.to_string())
                .unwrap_or_else(|| format!("{:#x}", t.thread_id))
        );
        if let Some(inner) = t.ns_native_id {
            let _ = write!(out, " [{inner} in its PID namespace]");
        }
        let _ = writeln!(
            out,
            "{}: {}",
            names(t.python_name.as_deref(), t.name.as_deref()),
            state.join(", ")
        );
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
            match t.locals.get(i) {
                Some(Ok(locals)) => {
                    for l in locals {
                        let _ = writeln!(
                            out,
                            "         {:<5} {} = {}",
                            l.kind.as_str(),
                            l.name,
                            l.repr
                        );
                    }
                }
                Some(Err(why)) => {
                    let _ = writeln!(out, "         <locals not read: {why}>");
                }
                None => {}
            }
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
        let _ = writeln!(
            out,
            "Thread {}{}: no Python thread state",
            t.native_id,
            names(None, t.name.as_deref())
        );
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
    if let Some(why) = &s.python_names_unavailable {
        let _ = writeln!(out, "\n<Python names of threads not read: {why}>");
    }
    if let Some(a) = &s.asyncio {
        tasks::to_text(out, a, s);
    }
    if let Some(g) = &s.greenlets {
        greenlets::to_text(out, g);
    }
}

/// What a thread header says of its names, each after a space: the name the program gave
/// it in quotes, then the OS's in parentheses (` "worker-3" (python3)`). Empty when neither
/// is known.
fn names(python: Option<&str>, os: Option<&str>) -> String {
    let mut s = String::new();
    if let Some(p) = python {
        let _ = write!(s, " \"{p}\"");
    }
    if let Some(o) = os {
        let _ = write!(s, " ({o})");
    }
    s
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
                locals: Vec::new(),
                thread_id: 0x7f00,
                native_id: Some(42),
                ns_native_id: None,
                name: Some("python3.12".into()),
                python_name: Some("MainThread".into()),
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
                interp_addr: 0,
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
            greenlets: None,
            python_names_unavailable: None,
            left_out: 0,
            woken: Vec::new(),
            stale_ids: Vec::new(),
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
             Thread 42 \"MainThread\" (python3.12): active, holds the GIL\n    \
             #0   inner (/tmp/a.py:3)\n    \
             #1   <module> (/tmp/a.py:10)\n"
        );
    }

    /// The sample with `dump --locals`' reads: two locals of the first frame, and the
    /// second frame's error.
    fn with_locals() -> Snapshot {
        use crate::python::locals::{Local, LocalKind};
        let mut s = sample();
        s.threads[0].locals = vec![
            Ok(vec![
                Local {
                    name: "n".into(),
                    kind: LocalKind::Arg,
                    type_name: Some("int".into()),
                    repr: "42".into(),
                    address: 0x7f00_0010,
                },
                Local {
                    name: "seen".into(),
                    kind: LocalKind::Cell,
                    type_name: Some("list".into()),
                    repr: "[1, 2, … (3 items)]".into(),
                    address: 0x7f00_0020,
                },
            ]),
            Err("no layout of the objects of Python 3.16".into()),
        ];
        s
    }

    #[test]
    fn locals_follow_their_frame_in_text() {
        let text = to_text(&with_locals());
        assert!(
            text.ends_with(
                "    #0   inner (/tmp/a.py:3)\n\
                 \x20        arg   n = 42\n\
                 \x20        cell  seen = [1, 2, … (3 items)]\n\
                 \x20   #1   <module> (/tmp/a.py:10)\n\
                 \x20        <locals not read: no layout of the objects of Python 3.16>\n"
            ),
            "{text}"
        );
    }

    #[test]
    fn locals_are_each_frames_in_json() {
        let v = to_json(&with_locals());
        let frames = &v["threads"][0]["frames"];
        assert_eq!(frames[0]["function"], "inner");
        assert_eq!(
            frames[0]["locals"][1],
            serde_json::json!({
                "name": "seen",
                "kind": "cell",
                "type": "list",
                "repr": "[1, 2, … (3 items)]",
                "address": "0x7f000020",
            })
        );
        assert!(frames[0].get("locals_error").is_none());
        assert_eq!(
            frames[1]["locals_error"],
            "no layout of the objects of Python 3.16"
        );
        assert!(frames[1].get("locals").is_none());
        // Without --locals, frames have neither.
        let plain = to_json(&sample());
        assert!(plain["threads"][0]["frames"][0].get("locals").is_none());
        assert!(plain["threads"][0]["frames"][0]
            .get("locals_error")
            .is_none());
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
