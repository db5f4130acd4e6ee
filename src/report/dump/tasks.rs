//! `dump --async`'s text: every event loop's tasks as a tree of who awaits whom, root tasks
//! first, each task with its coroutines (outermost first, so that the tree reads from the
//! root task down to the innermost await).
//!
//! A task awaited by several (a diamond) is shown whole once and named at its other places;
//! a task that awaits one of its own awaiters is named as closing a cycle, never followed.

use crate::python::{AsyncSnapshot, Frame, LoopTasks, Snapshot, TaskInfo};
use std::collections::{HashMap, HashSet};
use std::fmt::Write;

pub(super) fn to_text(out: &mut String, a: &AsyncSnapshot, s: &Snapshot) {
    out.push('\n');
    if let Some(why) = &a.unavailable {
        let _ = writeln!(out, "Asyncio tasks: none read: {why}");
        return;
    }
    if a.threads.is_empty() {
        let _ = writeln!(
            out,
            "Asyncio tasks: none (no thread runs an event loop or owns a task)"
        );
        return;
    }
    let _ = writeln!(
        out,
        "Asyncio tasks (a task's coroutines outermost first; under a task, the tasks it awaits)"
    );
    for lt in &a.threads {
        out.push('\n');
        header(out, lt, s);
        Tree::new(lt).print(out);
    }
}

fn header(out: &mut String, lt: &LoopTasks, s: &Snapshot) {
    let n = lt.tasks.len();
    let tasks = format!("{n} task{}", if n == 1 { "" } else { "s" });
    if lt.thread_id == 0 {
        let _ = writeln!(out, "Tasks of threads that ended ({tasks})");
    } else {
        let thread = s.threads.iter().find(|t| t.thread_id == lt.thread_id);
        let id = lt
            .native_id
            .map(|n| n.to_string())
            .unwrap_or_else(|| format!("{:#x}", lt.thread_id));
        let named = super::names(
            thread.and_then(|t| t.python_name.as_deref()),
            thread.and_then(|t| t.name.as_deref()),
        );
        let _ = write!(out, "Thread {id}{named}: ");
        let running = lt
            .running_task
            .and_then(|r| lt.tasks.iter().find(|t| t.id == r))
            .map(|t| format!(", running \"{}\"", t.name))
            .unwrap_or_default();
        let lp = if lt.loop_running {
            "event loop running"
        } else {
            "no event loop running"
        };
        let _ = writeln!(out, "{lp}; {tasks}{running}");
    }
    if lt.truncated {
        let _ = writeln!(
            out,
            "  <more than {} tasks: the rest were not read>",
            lt.tasks.len()
        );
    }
    if let Some(e) = &lt.error {
        let _ = writeln!(out, "  <tasks not all read: {e}>");
    }
    for c in &lt.cycles {
        let names: Vec<String> = c
            .iter()
            .filter_map(|id| lt.tasks.iter().find(|t| t.id == *id))
            .map(|t| format!("\"{}\"", t.name))
            .collect();
        let _ = writeln!(
            out,
            "  <an await cycle: {} → back to the first>",
            names.join(" → ")
        );
    }
}

struct Tree<'a> {
    tasks: &'a [TaskInfo],
    index: HashMap<u64, usize>,
    shown: HashSet<usize>,
    path: Vec<usize>,
}

impl<'a> Tree<'a> {
    fn new(lt: &'a LoopTasks) -> Tree<'a> {
        Tree {
            tasks: &lt.tasks,
            index: lt.index(),
            shown: HashSet::new(),
            path: Vec::new(),
        }
    }

    fn print(mut self, out: &mut String) {
        let roots: Vec<usize> = (0..self.tasks.len())
            .filter(|&i| self.tasks[i].awaited_by.is_empty())
            .collect();
        for r in roots {
            self.task(out, r, "  ", None);
        }
        // What is left is awaited only from inside a cycle: start from each one not shown.
        for i in 0..self.tasks.len() {
            if !self.shown.contains(&i) {
                self.task(out, i, "  ", None);
            }
        }
    }

    /// Task `i` at `prefix`; `last`: None for a root, else whether it is its parent's last.
    fn task(&mut self, out: &mut String, i: usize, prefix: &str, last: Option<bool>) {
        let t = &self.tasks[i];
        let branch = match last {
            None => "",
            Some(true) => "└─ ",
            Some(false) => "├─ ",
        };
        let _ = write!(out, "{prefix}{branch}task \"{}\" ({:#x})", t.name, t.id);
        if self.path.contains(&i) {
            let _ = writeln!(out, ": awaited further up this chain: an await cycle");
            return;
        }
        if !self.shown.insert(i) {
            let _ = writeln!(out, ": shown above");
            return;
        }
        let state = if t.running {
            " running".to_string()
        } else if let (Some(what), false) = (
            &t.awaiting,
            t.awaiting_id.is_some_and(|id| t.awaits.contains(&id)),
        ) {
            format!(" awaiting {what}")
        } else {
            String::new()
        };
        let _ = writeln!(out, "{state}");
        let inner = format!(
            "{prefix}{}",
            match last {
                None => "",
                Some(true) => "   ",
                Some(false) => "│  ",
            }
        );
        let children: Vec<usize> = t
            .awaits
            .iter()
            .filter_map(|id| self.index.get(id).copied())
            .collect();
        let bar = if children.is_empty() { " " } else { "│" };
        if let Some(e) = &t.error {
            let _ = writeln!(out, "{inner}{bar}   <not all read: {e}>");
        }
        for f in t.stack.iter().rev() {
            frame_line(out, &inner, bar, f);
        }
        self.path.push(i);
        for (k, &c) in children.iter().enumerate() {
            self.task(out, c, &inner, Some(k + 1 == children.len()));
        }
        self.path.pop();
    }
}

fn frame_line(out: &mut String, prefix: &str, bar: &str, f: &Frame) {
    let line = f.line.map(|l| l.to_string()).unwrap_or_else(|| "?".into());
    let _ = writeln!(
        out,
        "{prefix}{bar}   {} ({}:{line})",
        f.function, f.filename
    );
}
