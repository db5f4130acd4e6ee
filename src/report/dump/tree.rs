//! `dump --subprocesses`: a [`TreeSnapshot`] as text (each process as `dump` prints one,
//! with its command line and parent) or as JSON (docs/dump-json.md, "A process tree").
//!
//! Must not: read process memory.

use super::{details, DUMP_SCHEMA_VERSION};
use crate::python::{ProcessSnapshot, Snapshot, TreeSnapshot};
use std::fmt::Write;

/// `dump --subprocesses --json`: the schema version, the root, then each process.
#[derive(serde::Serialize)]
struct TreeJson<'a> {
    schema_version: u32,
    root: i32,
    /// The root's executable when it is not Python.
    #[serde(skip_serializing_if = "Option::is_none")]
    root_not_python: Option<&'a str>,
    processes: Vec<ProcessJson<'a>>,
}

/// One process: who it is, then its snapshot's fields (as `dump --json` has them), or
/// why it could not be read.
#[derive(serde::Serialize)]
struct ProcessJson<'a> {
    parent: Option<i32>,
    command: &'a str,
    #[serde(flatten)]
    read: Read<'a>,
}

#[derive(serde::Serialize)]
#[serde(untagged)]
enum Read<'a> {
    Done(&'a Snapshot),
    Failed {
        pid: i32,
        executable: &'a str,
        error: &'a str,
    },
}

fn process_json(p: &ProcessSnapshot) -> ProcessJson<'_> {
    ProcessJson {
        parent: p.parent,
        command: &p.command,
        read: match &p.read {
            Ok(s) => Read::Done(s),
            Err(e) => Read::Failed {
                pid: p.pid,
                executable: &p.executable,
                error: e,
            },
        },
    }
}

/// `dump --subprocesses --json` as pretty text.
pub fn tree_to_json_string(t: &TreeSnapshot) -> String {
    let view = TreeJson {
        schema_version: DUMP_SCHEMA_VERSION,
        root: t.root,
        root_not_python: t.root_not_python.as_deref(),
        processes: t.processes.iter().map(process_json).collect(),
    };
    let mut text = serde_json::to_string_pretty(&view).expect("a snapshot always serializes");
    text.push('\n');
    text
}

/// `dump --subprocesses`: a line on the tree, then each process under its heading.
pub fn tree_to_text(t: &TreeSnapshot) -> String {
    let mut out = String::new();
    let n = t.processes.len();
    let plural = if n == 1 { "" } else { "es" };
    match &t.root_not_python {
        Some(exe) => {
            let _ = writeln!(
                out,
                "Process {} ({exe}) is not Python: {n} Python process{plural} among its descendants",
                t.root
            );
        }
        None => {
            let _ = writeln!(
                out,
                "{n} Python process{plural}: process {} and its descendants",
                t.root
            );
        }
    }
    for p in &t.processes {
        out.push('\n');
        let _ = writeln!(out, "Process {}: {}", p.pid, p.executable);
        let _ = write!(out, "Command: {}", p.command);
        match p.parent {
            Some(parent) if p.pid != t.root => {
                let _ = writeln!(out, " (parent {parent})");
            }
            _ => out.push('\n'),
        }
        match &p.read {
            Ok(s) => details(&mut out, s),
            Err(e) => {
                let _ = writeln!(out, "    <not read: {e}>");
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree() -> TreeSnapshot {
        let mut child = super::super::tests::sample();
        child.pid = 43;
        TreeSnapshot {
            root: 41,
            root_not_python: Some("/usr/bin/bash".into()),
            processes: vec![
                ProcessSnapshot {
                    pid: 42,
                    parent: Some(41),
                    command: "python3.12 a.py".into(),
                    executable: "/usr/bin/python3.12".into(),
                    read: Ok(super::super::tests::sample()),
                },
                ProcessSnapshot {
                    pid: 43,
                    parent: Some(42),
                    command: "python3.12 b.py".into(),
                    executable: "/usr/bin/python3.12".into(),
                    read: Ok(child),
                },
                ProcessSnapshot {
                    pid: 44,
                    parent: Some(41),
                    command: "python3.16 c.py".into(),
                    executable: "/usr/bin/python3.16".into(),
                    read: Err("unsupported Python version 3.16 in process 44".into()),
                },
            ],
        }
    }

    #[test]
    fn text_puts_each_process_under_its_heading() {
        let text = tree_to_text(&tree());
        let thread = "Thread 42 \"MainThread\" (python3.12): active, holds the GIL\n    \
                      #0   inner (/tmp/a.py:3)\n    \
                      #1   <module> (/tmp/a.py:10)\n";
        let python = "Python 3.12.1 (version from the Py_Version symbol)\n";
        assert_eq!(
            text,
            format!(
                "Process 41 (/usr/bin/bash) is not Python: 3 Python processes among its \
                 descendants\n\
                 \n\
                 Process 42: /usr/bin/python3.12\n\
                 Command: python3.12 a.py (parent 41)\n\
                 {python}\n{thread}\
                 \n\
                 Process 43: /usr/bin/python3.12\n\
                 Command: python3.12 b.py (parent 42)\n\
                 {python}\n{thread}\
                 \n\
                 Process 44: /usr/bin/python3.16\n\
                 Command: python3.16 c.py (parent 41)\n    \
                 <not read: unsupported Python version 3.16 in process 44>\n"
            )
        );
    }

    #[test]
    fn json_is_a_list_of_processes_with_the_fields_of_one() {
        let v: serde_json::Value = serde_json::from_str(&tree_to_json_string(&tree())).unwrap();
        assert_eq!(v["schema_version"], 1);
        assert_eq!(v["root"], 41);
        assert_eq!(v["root_not_python"], "/usr/bin/bash");
        let procs = v["processes"].as_array().unwrap();
        assert_eq!(procs.len(), 3);
        let pids: Vec<_> = procs.iter().map(|p| p["pid"].as_i64().unwrap()).collect();
        assert_eq!(pids, [42, 43, 44]);
        assert_eq!(procs[1]["parent"], 42);
        assert_eq!(procs[1]["command"], "python3.12 b.py");
        assert_eq!(procs[1]["python_version"], "3.12.1");
        assert_eq!(procs[1]["threads"][0]["frames"][0]["line"], 3);
        assert!(procs[1].get("error").is_none());
        assert_eq!(procs[2]["executable"], "/usr/bin/python3.16");
        assert_eq!(
            procs[2]["error"],
            "unsupported Python version 3.16 in process 44"
        );
        assert!(procs[2].get("threads").is_none());
    }
}
