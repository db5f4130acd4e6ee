//! The table's rows, from a window: the view, the thread, the filter and the sort.
//!
//! Owns: [`View`], [`SortKey`], [`Query`], [`Row`] and [`rows`], which turns a window's
//! amounts ([`Tally`]) into the sorted rows the screen shows.
//! Must not: lay out or draw (`columns`, `screen`), or hold state between frames (`app`).
//!
//! Every share is of one denominator, the window's `total_s` (all threads, all
//! processes), whatever the view or the thread shown, so shares of rows add up to at most
//! 100%.

use super::tally::{is_some_time, Tally, ThreadTally};
use crate::profile::Split;
use std::collections::BTreeMap;

/// What a row is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum View {
    #[default]
    Lines,
    Functions,
    Files,
}

impl View {
    /// The view after this one (`v`).
    pub(crate) fn next(self) -> View {
        match self {
            View::Lines => View::Functions,
            View::Functions => View::Files,
            View::Files => View::Lines,
        }
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            View::Lines => "lines",
            View::Functions => "functions",
            View::Files => "files",
        }
    }
}

/// What rows are ordered by. Figures sort most first; names sort A to Z.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SortKey {
    #[default]
    Total,
    Python,
    Native,
    System,
    Alloc,
    Peak,
    Copy,
    Location,
    Function,
}

/// The order `s` cycles through (those the view has).
pub(crate) const SORT_CYCLE: [SortKey; 9] = [
    SortKey::Total,
    SortKey::Python,
    SortKey::Native,
    SortKey::System,
    SortKey::Alloc,
    SortKey::Peak,
    SortKey::Copy,
    SortKey::Location,
    SortKey::Function,
];

impl SortKey {
    /// Whether it sorts A to Z (names) rather than most first (figures).
    pub(crate) fn ascending(self) -> bool {
        matches!(self, SortKey::Location | SortKey::Function)
    }
}

/// What to show of a window.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Query {
    pub view: View,
    /// One thread (kernel id), or all when None.
    pub thread: Option<i32>,
    /// Rows whose file or function contains it (case-insensitive); all when empty.
    pub filter: String,
    pub sort: SortKey,
}

/// One row of the table, with the window's figures.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub file: String,
    /// The line (line view), the function's first line (function view), or None.
    pub line: Option<u32>,
    /// The function (line and function views).
    pub function: Option<String>,
    /// The line's text, trimmed (line view).
    pub source: String,
    /// Seconds in the window.
    pub split: Split,
    /// Shares of the window's total, percent: total, Python, native, system.
    pub total_pct: f64,
    pub python_pct: f64,
    pub native_pct: f64,
    pub system_pct: f64,
    /// MB allocated per second of the window (memory).
    pub alloc_mb_s: Option<f64>,
    /// The line's footprint peak since start, MB (memory, line view).
    pub peak_mb: Option<f64>,
    /// MB copied per second of the window (memory).
    pub copy_mb_s: Option<f64>,
    /// The native function most of the line's native time in the window went to.
    pub native_top: Option<String>,
    /// The asyncio task most of the line's time in the window went to.
    pub task: Option<String>,
}

impl Row {
    /// `file:line`, or the file alone.
    pub fn location(&self) -> String {
        match self.line {
            Some(l) => format!("{}:{l}", self.file),
            None => self.file.clone(),
        }
    }

    fn new(file: &str, line: Option<u32>, split: Split, total_s: f64) -> Row {
        let pct = |s: f64| {
            if total_s > 0.0 {
                100.0 * s / total_s
            } else {
                0.0
            }
        };
        Row {
            file: file.to_string(),
            line,
            function: None,
            source: String::new(),
            split,
            total_pct: pct(split.total()),
            python_pct: pct(split.python_s),
            native_pct: pct(split.native_s),
            system_pct: pct(split.system_s),
            alloc_mb_s: None,
            peak_mb: None,
            copy_mb_s: None,
            native_top: None,
            task: None,
        }
    }

    /// The figure a sort by `k` orders on (figures only).
    fn figure(&self, k: SortKey) -> f64 {
        match k {
            SortKey::Total => self.total_pct,
            SortKey::Python => self.python_pct,
            SortKey::Native => self.native_pct,
            SortKey::System => self.system_pct,
            SortKey::Alloc => self.alloc_mb_s.unwrap_or(0.0),
            SortKey::Peak => self.peak_mb.unwrap_or(0.0),
            SortKey::Copy => self.copy_mb_s.unwrap_or(0.0),
            SortKey::Location | SortKey::Function => 0.0,
        }
    }

    fn matches(&self, filter: &str) -> bool {
        if filter.is_empty() {
            return true;
        }
        let needle = filter.to_lowercase();
        self.file.to_lowercase().contains(&needle)
            || self
                .function
                .as_ref()
                .is_some_and(|f| f.to_lowercase().contains(&needle))
    }
}

fn add(a: &mut Split, b: &Split) {
    a.python_s += b.python_s;
    a.native_s += b.native_s;
    a.system_s += b.system_s;
}

/// The key with the most amount of a map (on ties, the first name).
fn top(by: Option<&BTreeMap<String, f64>>) -> Option<String> {
    by?.iter()
        .filter(|(_, v)| **v > 0.0)
        .max_by(|a, b| a.1.total_cmp(b.1).then_with(|| b.0.cmp(a.0)))
        .map(|(k, _)| k.clone())
}

/// A rate per second of the window; None when the window has no length.
fn per_second(mb: f64, elapsed_s: f64) -> Option<f64> {
    (elapsed_s > 0.0).then(|| mb / elapsed_s)
}

/// The rows of window `w` that `q` asks for, sorted. `w` is a window made by
/// [`Tally::since`]. A row is shown when it has time in the window, or (all threads)
/// allocated or copied in it.
pub fn rows(w: &Tally, q: &Query) -> Vec<Row> {
    let mut rows = match q.view {
        View::Lines => line_rows(w, q.thread),
        View::Functions => function_rows(w, q.thread),
        View::Files => file_rows(w, q.thread),
    };
    rows.retain(|r| r.matches(&q.filter));
    sort(&mut rows, q.sort);
    rows
}

/// Orders rows by `k`; ties by total share, then by place (file, line).
pub(crate) fn sort(rows: &mut [Row], k: SortKey) {
    let place = |a: &Row, b: &Row| a.file.cmp(&b.file).then(a.line.cmp(&b.line));
    rows.sort_by(|a, b| {
        let first = match k {
            SortKey::Location => place(a, b),
            SortKey::Function => a.function.cmp(&b.function),
            _ => b.figure(k).total_cmp(&a.figure(k)),
        };
        first
            .then_with(|| b.total_pct.total_cmp(&a.total_pct))
            .then_with(|| place(a, b))
            .then_with(|| a.function.cmp(&b.function))
    });
}

fn line_rows(w: &Tally, thread: Option<i32>) -> Vec<Row> {
    let mut out = Vec::new();
    // One thread shows its own lines' time and native functions (from the stacks), and no
    // memory (it is not per thread).
    let own: Option<Option<&ThreadTally>> = thread.map(|t| w.threads.get(&t));
    for (key, l) in &w.lines {
        let split = match own {
            Some(th) => match th.and_then(|th| th.lines.get(key)) {
                Some(s) => *s,
                None => continue,
            },
            None => l.split,
        };
        let mem = l.memory.filter(|_| own.is_none());
        let busy = mem.is_some_and(|m| m.alloc_mb > 0.0 || m.copy_mb > 0.0);
        if !is_some_time(&split) && !busy {
            continue;
        }
        let mut r = Row::new(&key.0, Some(key.1), split, w.total_s);
        r.function = w.function_of(key);
        r.source = clean_source(&l.source);
        if let Some(m) = mem {
            r.alloc_mb_s = per_second(m.alloc_mb, w.elapsed_s);
            r.copy_mb_s = per_second(m.copy_mb, w.elapsed_s);
            r.peak_mb = Some(m.peak_mb);
        }
        r.native_top = match own {
            None => top(Some(&l.native)),
            Some(th) => top(th.and_then(|th| th.line_native.get(key))),
        };
        r.task = top(w.line_tasks.get(key));
        out.push(r);
    }
    // Lines a thread's stacks charge that the profile's lines lack (none, when the
    // profile is whole) still show.
    if let Some(Some(th)) = own {
        for (key, split) in &th.lines {
            if !w.lines.contains_key(key) && is_some_time(split) {
                let mut r = Row::new(&key.0, Some(key.1), *split, w.total_s);
                r.function = w.function_of(key);
                r.native_top = top(th.line_native.get(key));
                out.push(r);
            }
        }
    }
    out
}

fn function_rows(w: &Tally, thread: Option<i32>) -> Vec<Row> {
    let mut out = Vec::new();
    match thread {
        None => {
            for ((file, name), f) in &w.functions {
                if is_some_time(&f.split) {
                    let mut r = Row::new(file, f.first_line, f.split, w.total_s);
                    r.function = Some(name.clone());
                    out.push(r);
                }
            }
        }
        Some(t) => {
            let Some(th) = w.threads.get(&t) else {
                return out;
            };
            for (key, split) in &th.functions {
                if is_some_time(split) {
                    let first = w.functions.get(key).and_then(|f| f.first_line);
                    let mut r = Row::new(&key.0, first, *split, w.total_s);
                    r.function = Some(key.1.clone());
                    out.push(r);
                }
            }
        }
    }
    out
}

fn file_rows(w: &Tally, thread: Option<i32>) -> Vec<Row> {
    // (time, alloc MB, copy MB, whether memory is recorded) by file.
    let mut by: BTreeMap<&str, (Split, f64, f64, bool)> = BTreeMap::new();
    match thread.map(|t| w.threads.get(&t)) {
        None => {
            for ((file, _), l) in &w.lines {
                let e = by.entry(file).or_default();
                add(&mut e.0, &l.split);
                if let Some(m) = l.memory {
                    e.1 += m.alloc_mb;
                    e.2 += m.copy_mb;
                    e.3 = true;
                }
            }
        }
        Some(None) => {}
        Some(Some(th)) => {
            for ((file, _), split) in &th.lines {
                add(&mut by.entry(file).or_default().0, split);
            }
        }
    }
    let mut out = Vec::new();
    for (file, (split, alloc, copy, mem)) in by {
        if !is_some_time(&split) && alloc <= 0.0 && copy <= 0.0 {
            continue;
        }
        let mut r = Row::new(file, None, split, w.total_s);
        if mem {
            r.alloc_mb_s = per_second(alloc, w.elapsed_s);
            r.copy_mb_s = per_second(copy, w.elapsed_s);
        }
        out.push(r);
    }
    out
}

/// Source text for one row: tabs as spaces, control characters blanked, trimmed.
fn clean_source(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect::<String>()
        .trim()
        .to_string()
}

#[cfg(test)]
#[path = "model_tests.rs"]
mod tests;
