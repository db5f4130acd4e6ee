//! The Scalene-style terminal report.
//!
//! It shows, in order:
//! - a header about the recording;
//! - for each file that matters, its lines, with their share of the time split into Python,
//!   native and system time;
//! - the top functions and (on request) the threads.
//!
//! Conventions (docs/profile-json.md sums them up too):
//! - Every percentage is a share of the program's total attributed time (`total_s`).
//! - Percentages are rounded to whole numbers. A cell is blank when its share is below
//!   0.005% (nothing). It reads `<1%` when it is something but under 1%.
//! - A line "matters" when its total share is at least [`MATTER_PCT`]. It is shown with
//!   `context` neighbouring lines. Runs of lines not shown are marked `...`. A file where
//!   no line reaches that share shows every sampled line.
//! - A file is shown when its share is at least [`MATTER_PCT`]. When no file reaches that,
//!   every file is shown.
//! - A line is hot when its share is at least [`HOT_PCT`], or when it is the profile's
//!   single busiest line. Hot lines are highlighted only when `color` is set. Without
//!   `color` the output holds no escape sequence at all.
//! - Context lines that were not sampled are dimmed when `color` is set.
//! - Source text is cut to the width with `…`. Tabs become four spaces.
//! - Widths count characters, so very wide (East Asian) characters may overflow a little.
//!   A `width` under [`MIN_WIDTH`] is raised to it.
//!
//! The report is built in parts, one file each:
//! - `header.rs` holds the title and the `Label: text` fields about the recording.
//! - `files.rs` holds each file's table of lines, with the memory and GPU columns.
//! - `notes.rs` holds the rows under a line recorded with `--native`.
//! - `summary.rs` holds the top functions and the threads.
//! - `table.rs` holds every table's columns and widths.
//! - `cells.rs` holds the text of one cell (percentages, sizes, sparklines, cut text).
//!
//! Must not: read process memory. Files are read only through the caller's source provider.

mod cells;
mod files;
mod header;
mod notes;
mod summary;
mod table;

use crate::profile::Profile;
use cells::pct_cell;
pub use header::{header_fields, HeaderField};

/// A line or file matters (is shown, anchors context) at this share of the total, in %.
pub(crate) const MATTER_PCT: f64 = 1.0;
/// A line at this share of the total, in %, is hot (highlighted).
pub(crate) const HOT_PCT: f64 = 10.0;
/// Narrowest width honoured; a smaller `width` is raised to it.
const MIN_WIDTH: usize = 72;

/// How to render.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TerminalOptions {
    /// Highlight with ANSI escapes (bold, colour). Off means plain text only.
    pub color: bool,
    /// Columns available; long source lines are cut to fit.
    pub width: usize,
    /// Lines of context shown around each line that matters.
    pub context: usize,
    /// Add the per-thread table.
    pub threads: bool,
}

impl Default for TerminalOptions {
    fn default() -> Self {
        TerminalOptions {
            color: false,
            width: 100,
            context: 2,
            threads: false,
        }
    }
}

/// Reads a file's lines for context (`None` when it cannot be read).
type SourceProvider<'a> = &'a mut dyn FnMut(&str) -> Option<Vec<String>>;

/// The report, reading context lines through `source` (called once per file shown, with the
/// file name as the profile has it). The profile's own `source` text of a sampled line wins
/// over the provider's.
pub fn render(p: &Profile, o: &TerminalOptions, source: SourceProvider) -> String {
    let r = Renderer {
        p,
        o,
        width: o.width.max(MIN_WIDTH),
        hottest: hottest_line(p),
        fields: None,
    };
    let mut out = String::new();
    r.header(&mut out);
    if (p.total_s > 0.0 || p.memory.is_some()) && p.files.iter().any(|f| !f.lines.is_empty()) {
        r.files(&mut out, source);
        r.leaks(&mut out);
    } else {
        out.push('\n');
        out.push_str("No time was attributed to any Python line.\n");
    }
    if p.total_s > 0.0 {
        r.functions(&mut out);
    }
    if o.threads {
        r.threads(&mut out);
    }
    out
}

/// The report from the profile alone. Only sampled lines carry source text, so context
/// lines that were not sampled are left out and the gap marked `...`.
pub fn render_without_source(p: &Profile, o: &TerminalOptions) -> String {
    render(p, o, &mut |_| None)
}

const BOLD: &str = "\x1b[1m";
const DIM: &str = "\x1b[2m";
const HOT: &str = "\x1b[1;31m";
const RESET: &str = "\x1b[0m";

/// The heading of the time column when it holds Python and native time together.
const TIME_UNSPLIT: &str = "Py + native";

struct Renderer<'a> {
    p: &'a Profile,
    o: &'a TerminalOptions,
    width: usize,
    /// (file, line) of the busiest line of the whole profile.
    hottest: Option<(&'a str, u32)>,
    /// When set, the header's fields are collected here instead of written out
    /// ([`header_fields`]).
    fields: Option<std::cell::RefCell<Vec<HeaderField>>>,
}

fn hottest_line(p: &Profile) -> Option<(&str, u32)> {
    let mut best: Option<(&str, u32, f64)> = None;
    for f in &p.files {
        for l in &f.lines {
            let t = l.total_pct();
            if t >= MATTER_PCT && best.is_none_or(|(_, _, b)| t > b) {
                best = Some((&f.filename, l.line, t));
            }
        }
    }
    best.map(|(f, l, _)| (f, l))
}

impl Renderer<'_> {
    fn paint(&self, code: &str, s: &str) -> String {
        if self.o.color && !s.is_empty() {
            format!("{code}{s}{RESET}")
        } else {
            s.to_string()
        }
    }

    /// The rule under a table's head: `cells` columns, then the free-text last column to the
    /// full width.
    fn rule(&self, cells: &[usize]) -> String {
        let mut s = String::new();
        for &w in cells {
            s.push_str(&"─".repeat(w));
            s.push('┼');
        }
        let used: usize = cells.iter().sum::<usize>() + cells.len();
        s.push_str(&"─".repeat(self.width.saturating_sub(used)));
        s
    }

    /// The heading of the Python time column: "Python or native" when the split is not
    /// available (no opcode table for the version).
    fn time_label(&self) -> &'static str {
        if self.p.meta.split_unavailable.is_some() {
            TIME_UNSPLIT
        } else {
            "Time Python"
        }
    }

    /// A native-time cell: "n/a" when the split is not available (never a 0).
    fn native_cell(&self, pct: f64) -> String {
        if self.p.meta.split_unavailable.is_some() {
            "n/a".to_string()
        } else {
            pct_cell(pct)
        }
    }
}
