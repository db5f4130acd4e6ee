//! The Scalene-style terminal report: a header about the recording, then, for each file that
//! matters, its lines with their share of the time split into Python, native and system
//! time, then the top functions and (on request) the threads.
//!
//! Conventions (docs/profile-json.md sums them up too):
//! - Every percentage is a share of the program's total attributed time (`total_s`).
//! - Percentages are rounded to whole numbers; a cell is blank when its share is below
//!   0.005% (nothing), and reads `<1%` when it is something but under 1%.
//! - A line "matters" when its total share is at least [`MATTER_PCT`]; it is shown with
//!   `context` neighbouring lines, and runs of lines not shown are marked `...`. A file where
//!   no line reaches that share shows every sampled line.
//! - A file is shown when its share is at least [`MATTER_PCT`], or, when no file reaches
//!   that, every file is shown.
//! - A line is hot when its share is at least [`HOT_PCT`], or it is the profile's single
//!   busiest line; hot lines are highlighted only when `color` is set. Without `color` the
//!   output holds no escape sequence at all.
//! - Context lines that were not sampled are dimmed when `color` is set.
//! - Source text is cut to the width with `…`; tabs become four spaces. Widths count
//!   characters, so very wide (East Asian) characters may overflow a little. A `width`
//!   under [`MIN_WIDTH`] is raised to it.
//!
//! Must not: read process memory; files are read only through the caller's source provider.

use crate::profile::{FileProfile, LineProfile, Profile, TimeMode};
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// A line or file matters (is shown, anchors context) at this share of the total, in %.
pub(crate) const MATTER_PCT: f64 = 1.0;
/// A line at this share of the total, in %, is hot (highlighted).
pub(crate) const HOT_PCT: f64 = 10.0;
/// Functions listed in the summary.
const TOP_FUNCTIONS: usize = 10;
/// Narrowest width honoured; a smaller `width` is raised to it.
const MIN_WIDTH: usize = 72;

/// How to render.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TerminalOptions {
    /// Highlight with ANSI escapes (bold, colour). Off: plain text only.
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

/// The report from the profile alone: only sampled lines carry source text, so context
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

/// A table's columns before its free text (source, name): each a width and an alignment,
/// written `cell │ ` one after the other. Every table's widths are defined here, once.
struct Table(&'static [(usize, Align)]);

#[derive(Clone, Copy, PartialEq)]
enum Align {
    Right,
    Left,
}

/// `Line │ Time Python │ native │ system │`.
const LINES: Table = Table(&[
    (6, Align::Right),
    (11, Align::Right),
    (6, Align::Right),
    (6, Align::Right),
]);
/// `Memory Python │ peak │ timeline │ Copy MB/s │`, after [`LINES`].
const MEMORY: Table = Table(&[
    (13, Align::Right),
    (6, Align::Right),
    (TIMELINE_WIDTH, Align::Left),
    (9, Align::Right),
]);
/// `GPU │ GPU mem │`, after [`LINES`] (and [`MEMORY`]) when a GPU was used.
const GPU: Table = Table(&[(5, Align::Right), (7, Align::Right)]);
/// `Time Python │ native │ system │ total │`.
const FUNCTIONS: Table = Table(&[
    (11, Align::Right),
    (6, Align::Right),
    (6, Align::Right),
    (6, Align::Right),
]);
/// `TID │ samples │ Time Python │ native │ system │ total │`.
const THREADS: Table = Table(&[
    (8, Align::Right),
    (8, Align::Right),
    (11, Align::Right),
    (6, Align::Right),
    (6, Align::Right),
    (6, Align::Right),
]);

impl Table {
    /// Columns the cells take, separators and the space before the text included.
    const fn width(&self) -> usize {
        let mut sum = 0;
        let mut i = 0;
        while i < self.0.len() {
            sum += self.0[i].0 + 3;
            i += 1;
        }
        sum
    }

    /// `s` padded to column `i`'s width (by characters: a cell holds no escape codes).
    fn pad(&self, i: usize, s: &str) -> String {
        let (w, align) = self.0[i];
        let fill = " ".repeat(w.saturating_sub(s.chars().count()));
        match align {
            Align::Right => format!("{fill}{s}"),
            Align::Left => format!("{s}{fill}"),
        }
    }

    /// The cells, padded, as `a │ b │ … │`.
    fn row<S: AsRef<str>>(&self, cells: &[S]) -> String {
        let padded: Vec<String> = cells
            .iter()
            .enumerate()
            .map(|(i, c)| self.pad(i, c.as_ref()))
            .collect();
        Table::join(&padded)
    }

    /// Cells already padded (and painted), as `a │ b │ … │`.
    fn join(cells: &[String]) -> String {
        let mut out = String::new();
        for (i, c) in cells.iter().enumerate() {
            if i > 0 {
                out.push(' ');
            }
            out.push_str(c);
            out.push_str(" │");
        }
        out
    }

    /// The widths of the rule's segments under the columns (each up to its `┼`).
    fn rule_cells(&self, first: bool) -> Vec<usize> {
        self.0
            .iter()
            .enumerate()
            .map(|(i, &(w, _))| if i == 0 && first { w + 1 } else { w + 2 })
            .collect()
    }
}

/// Width of the `Line │ Time Python │ native │ system │ ` prefix, in columns.
const PREFIX: usize = LINES.width();
/// Narrowest space left for source text or a function's name.
const MIN_TEXT: usize = 16;

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

/// One `Label: text` field of the header, as [`header_fields`] gives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderField {
    /// Empty for a field continuing the one before (more processes, more losses).
    pub label: String,
    pub text: String,
    /// Shown in bold in the terminal (losses that matter).
    pub emphasis: bool,
}

/// The report's heading (`scalene-rs: program`) and header fields, worded as the terminal
/// report words them, unwrapped: for other renderers (HTML) that lay them out themselves.
pub fn header_fields(p: &Profile) -> (String, Vec<HeaderField>) {
    let o = TerminalOptions {
        width: usize::MAX / 4,
        ..TerminalOptions::default()
    };
    let r = Renderer {
        p,
        o: &o,
        width: o.width,
        hottest: None,
        fields: Some(Default::default()),
    };
    let mut title = String::new();
    r.header(&mut title);
    let fields = r.fields.map(|f| f.into_inner()).unwrap_or_default();
    (title.trim_end().to_string(), fields)
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

/// A size in MB for a cell: blank for nothing, else 3 significant digits and `M`.
fn mb_cell(v: f64) -> String {
    if v.is_nan() || v < 0.05 {
        String::new()
    } else if v < 10.0 {
        format!("{v:.1}M")
    } else {
        format!("{v:.0}M")
    }
}

/// `1 MiB`, `512 KiB`, `100 B`.
fn bytes_text(b: u64) -> String {
    if b >= 1 << 20 && b.is_multiple_of(1 << 20) {
        format!("{} MiB", b >> 20)
    } else if b >= 1 << 10 && b.is_multiple_of(1 << 10) {
        format!("{} KiB", b >> 10)
    } else {
        format!("{b} B")
    }
}

/// A sparkline of `values` (scaled to their maximum), `width` characters at most.
fn sparkline(values: &[f64], width: usize) -> String {
    const BARS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    let max = values.iter().copied().fold(0.0f64, f64::max);
    if values.is_empty() || max <= 0.0 || width == 0 {
        return String::new();
    }
    // Merge neighbours (keeping the maximum) down to `width` points.
    let per = values.len().div_ceil(width);
    values
        .chunks(per)
        .map(|c| {
            let v = c.iter().copied().fold(0.0f64, f64::max);
            if v <= 0.0 {
                ' '
            } else {
                BARS[((v / max * 7.0).round() as usize).min(7)]
            }
        })
        .collect()
}

/// Width of the memory columns `Memory Python │ peak │ timeline │ Copy MB/s │ `.
const MEM_PREFIX: usize = MEMORY.width();
const TIMELINE_WIDTH: usize = 10;

/// Native functions shown under a line (`--native`), at most.
const NATIVE_SHOWN: usize = 3;
/// Where the row under a line starts: right of the line number.
const NOTE_INDENT: usize = 7;

/// The row under a line with native time recorded with `--native`: the native functions
/// it was spent in, `↳ native: deflate 28%, libz.so.1+0x5d80 11%, …`, cut to `width`; None
/// when the line has none worth a tenth of a percent.
fn native_note(l: &LineProfile, width: usize) -> Option<String> {
    let shown: Vec<String> = l
        .native_functions
        .iter()
        .filter(|f| f.pct >= 0.1)
        .take(NATIVE_SHOWN)
        .map(|f| format!("{} {}", short_function(&f.function), pct_text(f.pct)))
        .collect();
    if shown.is_empty() {
        return None;
    }
    let more = if l.native_functions.len() > shown.len() {
        ", …"
    } else {
        ""
    };
    let note = format!("↳ native: {}{more}", shown.join(", "));
    Some(truncate_end(&note, width))
}

/// The row under a line whose allocations were recorded with `--native`: the native
/// functions they came from, `↳ allocated in: alloc_big 40M, PyList_New 2.1M, …`, cut to
/// `width`; None when the line has none worth a cell (0.05 MB).
fn allocated_note(l: &LineProfile, width: usize) -> Option<String> {
    let all = l
        .memory
        .as_ref()
        .map_or(&[][..], |m| &m.mem_native_functions[..]);
    let shown: Vec<String> = all
        .iter()
        .map(|f| (f, mb_cell(f.mb)))
        .filter(|(_, mb)| !mb.is_empty())
        .take(NATIVE_SHOWN)
        .map(|(f, mb)| format!("{} {mb}", short_function(&f.function)))
        .collect();
    if shown.is_empty() {
        return None;
    }
    let more = if all.len() > shown.len() { ", …" } else { "" };
    let note = format!("↳ allocated in: {}{more}", shown.join(", "));
    Some(truncate_end(&note, width))
}

/// Template arguments longer than this are shown as `<…>` in a row under a line.
const TEMPLATE_SHOWN: usize = 16;

/// A native function's name as short as a row under a line wants it: a demangled C++
/// name without its return type, parameter list, `[clone …]` suffix and long template
/// arguments: `unsigned long partition<zmm_vector<double>, Cmp<…>, 8, double>(double*,
/// …) [clone .constprop.0]` is `partition<…>`. C names and `module+0xSTART` stay as they
/// are; the JSON keeps every name whole.
fn short_function(name: &str) -> std::borrow::Cow<'_, str> {
    if !name.contains(['(', '<', ' ']) {
        return name.into();
    }
    let mut name = name;
    while let Some(i) = name.rfind(" [clone ") {
        name = &name[..i];
    }
    // The parameter list: the first '(' outside template arguments; the return type:
    // up to the last space outside them before it.
    let (mut depth, mut start, mut end) = (0usize, 0usize, name.len());
    for (i, c) in name.char_indices() {
        match c {
            '<' => depth += 1,
            '>' => depth = depth.saturating_sub(1),
            ' ' if depth == 0 => start = i + 1,
            '(' if depth == 0 && i > start => {
                end = i;
                break;
            }
            _ => {}
        }
    }
    let core = &name[start.min(end)..end];
    if core.is_empty() || core.ends_with("operator") {
        return name.into();
    }
    // Long template arguments (the outermost ones) become `<…>`.
    let mut out = String::with_capacity(core.len());
    let (mut depth, mut open) = (0usize, 0usize);
    for (i, c) in core.char_indices() {
        match c {
            '<' => {
                if depth == 0 {
                    open = i;
                    out.push('<');
                }
                depth += 1;
            }
            '>' if depth > 0 => {
                depth -= 1;
                if depth == 0 {
                    let args = &core[open + 1..i];
                    if args.chars().count() > TEMPLATE_SHOWN {
                        out.push('…');
                    } else {
                        out.push_str(args);
                    }
                    out.push('>');
                }
            }
            c if depth == 0 => out.push(c),
            _ => {}
        }
    }
    if depth > 0 {
        // Unbalanced: not a name we understand.
        return name.into();
    }
    out.into()
}

/// A percentage as the line cells write it, without padding.
fn pct_text(v: f64) -> String {
    pct_cell(v).trim().to_string()
}

/// A percentage cell: blank for nothing, `<1%` for a sliver, else rounded.
fn pct_cell(v: f64) -> String {
    if v.is_nan() || v < 0.005 {
        String::new()
    } else if v < 1.0 {
        "<1%".to_string()
    } else {
        format!("{v:.0}%")
    }
}

/// Cuts `s` to `max` characters, ending it with `…` when cut.
fn truncate_end(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_string();
    }
    let mut out: String = s.chars().take(max.saturating_sub(1)).collect();
    out.push('…');
    out
}

/// Cuts `s` to `max` characters, keeping its end (for paths), starting it with `…` when cut.
fn truncate_start(s: &str, max: usize) -> String {
    let n = s.chars().count();
    if n <= max {
        return s.to_string();
    }
    let keep = max.saturating_sub(1);
    let mut out = String::from("…");
    out.extend(s.chars().skip(n - keep));
    out
}

/// Source text made safe for one terminal row: tabs expanded, control characters blanked,
/// trailing whitespace dropped.
fn clean_source(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\t' => out.push_str("    "),
            c if c.is_control() => out.push(' '),
            c => out.push(c),
        }
    }
    out.truncate(out.trim_end().len());
    out
}

fn seconds(s: f64) -> String {
    format!("{s:.2} s")
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

    /// One `Label:    text` field of the header, wrapped at the width under a hanging indent.
    fn field(&self, out: &mut String, label: &str, text: &str, code: Option<&str>) {
        if let Some(fields) = &self.fields {
            fields.borrow_mut().push(HeaderField {
                label: label.trim_end_matches(':').to_string(),
                text: text.to_string(),
                emphasis: code.is_some(),
            });
            return;
        }
        const INDENT: usize = 11;
        let room = self.width - INDENT;
        let mut lines: Vec<String> = Vec::new();
        let mut cur = String::new();
        for word in text.split(' ').filter(|w| !w.is_empty()) {
            let word = truncate_end(word, room);
            let len = cur.chars().count();
            if len > 0 && len + 1 + word.chars().count() > room {
                lines.push(std::mem::take(&mut cur));
            }
            if !cur.is_empty() {
                cur.push(' ');
            }
            cur.push_str(&word);
        }
        lines.push(cur);
        for (i, l) in lines.iter().enumerate() {
            let head = if i == 0 { label } else { "" };
            let body = match code {
                Some(c) => self.paint(c, l),
                None => l.clone(),
            };
            let _ = writeln!(out, "{head:<INDENT$}{body}");
        }
    }

    /// The report's head: what ran, how it was recorded, what was lost, the memory summary.
    fn header(&self, out: &mut String) {
        let m = &self.p.meta;
        let program = if m.program.is_empty() {
            "(unknown program)"
        } else {
            &m.program
        };
        let _ = writeln!(
            out,
            "{}",
            self.paint(
                BOLD,
                &truncate_end(&format!("scalene-rs: {program}"), self.width)
            )
        );
        let python = if m.python_version.is_empty() {
            "unknown"
        } else {
            &m.python_version
        };
        let procs = &self.p.processes;
        let build = if m.free_threaded {
            " (free-threaded: no GIL)"
        } else {
            ""
        };
        let who = if procs.len() > 1 {
            format!(
                "{python}{build}, {} processes (root pid {})",
                procs.len(),
                m.pid
            )
        } else {
            format!("{python}{build}, pid {}", m.pid)
        };
        self.field(out, "Python:", &who, None);
        if let Some(why) = &m.split_unavailable {
            let text = format!("{why}; the \"{TIME_UNSPLIT}\" column is both");
            self.field(out, "Split:", &text, None);
        }
        self.processes(out);
        self.recording(out);
        self.native(out);
        self.losses(out);
        self.field(
            out,
            "Time:",
            &format!(
                "{} attributed; every percentage below is a share of it",
                seconds(self.p.total_s)
            ),
            None,
        );
        self.memory_summary(out);
        self.gpu_summary(out);
    }

    /// `--native`: how many thread samples had their native frames merged with their
    /// Python ones, and the commonest reason the others did not.
    fn native(&self, out: &mut String) {
        let Some(n) = &self.p.meta.native else {
            return;
        };
        let all = n.merged_samples + n.unmerged_samples;
        let mut text = format!(
            "native frames merged with Python's in {:.2}% of thread samples ({} of {all})",
            n.merge_rate_pct, n.merged_samples
        );
        if let Some((why, count)) = n.unmerged_reasons.iter().max_by_key(|(_, c)| **c) {
            text.push_str(&format!(
                "; the others keep their Python frames alone (most often, {count}×: {why})"
            ));
        }
        let loud = n.merge_rate_pct < 99.0;
        self.field(out, "Native:", &text, loud.then_some(HOT));
    }

    /// The processes, busiest first (at most ten lines), when there were several.
    fn processes(&self, out: &mut String) {
        let procs = &self.p.processes;
        let mut busiest: Vec<_> = procs.iter().filter(|_| procs.len() > 1).collect();
        busiest.sort_by(|a, b| b.cpu_pct.total_cmp(&a.cpu_pct).then(a.pid.cmp(&b.pid)));
        for (i, p) in busiest.iter().enumerate() {
            if i == 10 {
                let rest = busiest.len() - 10;
                self.field(
                    out,
                    "",
                    &format!("... and {rest} more (all in the JSON)"),
                    None,
                );
                break;
            }
            let mem = p
                .mem_peak_mb
                .map_or_else(String::new, |peak| format!("peak {peak:>6.1} MB  "));
            let gpu = match (p.gpu_pct, p.gpu_mem_peak_mb) {
                (Some(g), Some(m)) => format!("GPU {g:>5.1}% {m:>6.0} MB  "),
                _ => String::new(),
            };
            let text = format!(
                "pid {:<8} {:>5.1}%  {mem}{gpu}{}",
                p.pid, p.cpu_pct, p.command
            );
            let label = if i == 0 { "Processes:" } else { "" };
            self.field(
                out,
                label,
                &truncate_end(&text, self.width.saturating_sub(14)),
                None,
            );
        }
    }

    /// The rate achieved, the mode and which frames are charged.
    fn recording(&self, out: &mut String) {
        let m = &self.p.meta;
        let mut rate = format!(
            "{}, {} samples, {:.1} Hz achieved ({:.1} Hz requested)",
            seconds(m.duration_s),
            m.samples,
            m.rate_hz,
            m.requested_rate_hz
        );
        if m.rate_hz < 0.9 * m.requested_rate_hz {
            rate.push_str(" - below the requested rate");
        }
        self.field(out, "Recorded:", &rate, None);
        let mode = match m.mode {
            TimeMode::Cpu => "cpu: only time on a CPU counts; system = time in the kernel",
            TimeMode::Wall => "wall: all elapsed time counts; system = kernel time + time off the CPU (waiting, sleeping, I/O)",
        };
        self.field(out, "Mode:", mode, None);
        let frames = if m.profile_all {
            "all (--profile-all): library lines are charged their own time"
        } else {
            "your code: time in the standard library and site-packages is charged to the line that called it"
        };
        self.field(out, "Frames:", frames, None);
    }

    /// Samples missed, stacks unreadable, read paused, ticks thinned.
    fn losses(&self, out: &mut String) {
        let m = &self.p.meta;
        let mut lost = Vec::new();
        if m.missed_samples > 0 {
            let due = m.samples + m.missed_samples;
            lost.push(format!(
                "{} of {due} samples missed ({:.1}%): the profiler fell behind its schedule \
                 (a busy machine, or too high a rate for the program's stacks).",
                m.missed_samples,
                100.0 * m.missed_samples as f64 / due as f64
            ));
        }
        if m.errors > 0 {
            lost.push(format!(
                "{} thread stacks unreadable: they changed while being read or failed \
                 validation, and were dropped rather than guessed.",
                m.errors
            ));
        }
        if m.paused_reads > 0 {
            let text = format!(
                "{} thread stacks read with their thread briefly paused: they changed too \
                 fast to be read without stopping it (--nonblocking never pauses, and drops them).",
                m.paused_reads
            );
            self.field(out, "Paused:", &text, None);
        }
        if m.thinned_samples > 0 {
            let text = match m.paused_max_hz {
                Some(hz) => format!(
                    "{} sampling ticks skipped to pause the target at most {hz} times a \
                     second (their CPU time went to the next sample).",
                    m.thinned_samples
                ),
                None => format!(
                    "{} sampling ticks skipped to limit how often the target was paused \
                     (their CPU time went to the next sample).",
                    m.thinned_samples
                ),
            };
            self.field(out, "Thinned:", &text, None);
        }
        if lost.is_empty() {
            self.field(
                out,
                "Lost:",
                "nothing (no missed samples, no unreadable stacks)",
                None,
            );
        }
        for (i, l) in lost.iter().enumerate() {
            self.field(out, if i == 0 { "Lost:" } else { "" }, l, Some(BOLD));
        }
    }

    /// The program's memory: peak, allocated, copied, the footprint's shape.
    fn memory_summary(&self, out: &mut String) {
        if let Some(m) = &self.p.memory {
            let mut text = format!(
                "peak {:.1} MB, {:.1} MB allocated ({:.0}% by Python), {:.1} MB copied; \
                 sampled every {} allocated or freed",
                m.peak_mb,
                m.alloc_mb,
                m.python_pct,
                m.copy_mb,
                bytes_text(m.window_bytes)
            );
            if m.since_attach {
                text.push_str(
                    "; counted from the attach on (what the process held before is not \
                     attributed to lines; the footprint starts at its C heap in use then)",
                );
            }
            if m.handshakes > 0 {
                text.push_str(&format!(
                    "; the program waited {} for {} of them to be tied to their lines",
                    seconds(m.handshake_wait_ms / 1e3),
                    m.handshakes
                ));
            }
            let spark = sparkline(&m.timeline.iter().map(|p| p[1]).collect::<Vec<_>>(), 40);
            if !spark.is_empty() {
                text.push_str(&format!("; footprint over time {spark}"));
            }
            if !self.memory_columns() {
                text.push_str(&format!(
                    "; per-line memory columns need a terminal {} columns wide",
                    PREFIX + MEM_PREFIX + MIN_TEXT
                ));
            }
            self.field(out, "Memory:", &text, None);
            if m.dropped_events > 0 || m.handshake_timeouts > 0 {
                self.field(
                    out,
                    "",
                    &format!(
                        "{} memory events dropped (ring full), {} allocations not tied to \
                         their line in time",
                        m.dropped_events, m.handshake_timeouts
                    ),
                    Some(BOLD),
                );
            }
        }
    }

    /// The program's GPU figures, or why there are none.
    fn gpu_summary(&self, out: &mut String) {
        let Some(g) = &self.p.gpu else { return };
        if let Some(why) = &g.unavailable {
            self.field(out, "GPU:", &format!("no GPU columns: {why}"), None);
        } else {
            let names: Vec<&str> = g.devices.iter().map(|d| d.name.as_str()).collect();
            let dur = self.p.meta.duration_s.max(1e-9);
            let mut text = format!(
                "{}: busy {:.2} GPU-s (SM use × time; {:.0}% of one GPU over the run), peak \
                 {:.0} MB held",
                names.join(", "),
                g.gpu_s,
                100.0 * g.gpu_s / dur,
                g.mem_peak_mb
            );
            if g.unattributed_s > 0.0 {
                text.push_str(&format!(
                    "; {:.2} GPU-s with no line seen",
                    g.unattributed_s
                ));
            }
            let busy: Vec<f64> = g.timeline.iter().map(|p| p[1]).collect();
            let held: Vec<f64> = g.timeline.iter().map(|p| p[2]).collect();
            let (b, h) = (sparkline(&busy, 40), sparkline(&held, 40));
            if !b.trim().is_empty() {
                text.push_str(&format!("; busy over time {b}"));
            }
            if !h.trim().is_empty() {
                text.push_str(&format!("; memory over time {h}"));
            }
            if g.other_process_samples > 0 {
                text.push_str("; other processes on these GPUs are never charged");
            }
            if !self.gpu_columns() {
                text.push_str(&format!(
                    "; per-line GPU columns need a terminal {} columns wide",
                    PREFIX + GPU.width() + MIN_TEXT
                ));
            }
            self.field(out, "GPU:", &text, None);
        }
        for n in &g.notes {
            self.field(out, "", n, Some(BOLD));
        }
    }

    /// Whether the file tables show the GPU columns: a GPU was used and the terminal is
    /// wide enough.
    fn gpu_columns(&self) -> bool {
        let extra = if self.memory_columns() { MEM_PREFIX } else { 0 };
        self.p.gpu.as_ref().is_some_and(|g| g.has_data())
            && self.width >= PREFIX + extra + GPU.width() + MIN_TEXT
    }

    /// Whether a line matters for the GPU: a share of its busy time.
    fn gpu_matters(&self, l: &LineProfile) -> bool {
        l.gpu.as_ref().is_some_and(|g| g.gpu_pct >= MATTER_PCT)
    }

    /// Whether the file tables show the memory columns: memory was recorded and the
    /// terminal is wide enough for them and some source text.
    fn memory_columns(&self) -> bool {
        self.p.memory.is_some() && self.width >= PREFIX + MEM_PREFIX + MIN_TEXT
    }

    /// Whether a line matters for memory: a share of the allocations or copies.
    fn memory_matters(&self, l: &LineProfile) -> bool {
        let (Some(m), Some(lm)) = (&self.p.memory, &l.memory) else {
            return false;
        };
        let alloc = m.alloc_mb > 0.0 && 100.0 * lm.mem_alloc_mb / m.alloc_mb >= MATTER_PCT;
        let copy_total = m.copy_mb / self.p.meta.duration_s.max(1e-9);
        let copy = copy_total > 0.0 && 100.0 * lm.copy_mb_s / copy_total >= MATTER_PCT;
        alloc || copy
    }

    fn leaks(&self, out: &mut String) {
        let Some(m) = &self.p.memory else { return };
        if m.leaks.is_empty() {
            return;
        }
        let _ = writeln!(out, "\n{}", self.paint(BOLD, "Possible memory leaks"));
        for l in &m.leaks {
            let text = format!(
                "{}:{}: likelihood {:.0}%, footprint growing {:.1} MB/s ({} sampled \
                 allocations, {} freed)",
                l.filename,
                l.line,
                100.0 * l.likelihood,
                l.growth_mb_s,
                l.sampled_allocs,
                l.sampled_frees
            );
            self.field(out, "", &text, None);
        }
    }

    fn files(&self, out: &mut String, source: SourceProvider) {
        let mut files: Vec<&FileProfile> = self
            .p
            .files
            .iter()
            .filter(|f| !f.lines.is_empty())
            .collect();
        files.sort_by(|a, b| {
            b.cpu_pct
                .total_cmp(&a.cpu_pct)
                .then_with(|| a.filename.cmp(&b.filename))
        });
        // Files that matter for memory come along with those that matter for time.
        let matters = |f: &FileProfile| {
            f.cpu_pct >= MATTER_PCT
                || f.lines
                    .iter()
                    .any(|l| self.memory_matters(l) || self.gpu_matters(l))
        };
        files.sort_by_key(|f| !matters(f));
        let shown = files.iter().filter(|f| matters(f)).count();
        let (shown, hidden) = if shown == 0 {
            (&files[..], &files[..0])
        } else {
            files.split_at(shown)
        };
        for f in shown {
            let text = source(&f.filename);
            self.file(out, f, text.as_deref());
        }
        if !hidden.is_empty() {
            let share: f64 = hidden.iter().map(|f| f.cpu_pct).sum();
            let _ = writeln!(
                out,
                "\n{} more file{} under {MATTER_PCT}% each ({:.1}% in all) not shown.",
                hidden.len(),
                if hidden.len() == 1 { "" } else { "s" },
                share
            );
        }
    }

    fn file(&self, out: &mut String, f: &FileProfile, text: Option<&[String]>) {
        let secs = f.cpu_pct / 100.0 * self.p.total_s;
        let title = format!("{:.1}% of the time ({})", f.cpu_pct, seconds(secs));
        let name = truncate_start(
            &f.filename,
            self.width
                .saturating_sub(title.chars().count() + 2)
                .max(MIN_TEXT),
        );
        let _ = writeln!(out, "\n{}: {title}", self.paint(BOLD, &name));
        let mem = self.memory_columns();
        let gpu = self.gpu_columns();
        let mut head = LINES.row(&["Line", self.time_label(), "native", "system"]);
        let mut rule = LINES.rule_cells(true);
        if mem {
            head.push(' ');
            head.push_str(&MEMORY.row(&["Memory Python", "peak", "timeline", "Copy MB/s"]));
            rule.extend(MEMORY.rule_cells(false));
        }
        if gpu {
            head.push(' ');
            head.push_str(&GPU.row(&["GPU", "GPU mem"]));
            rule.extend(GPU.rule_cells(false));
        }
        let _ = writeln!(out, "{head} source");
        let _ = writeln!(out, "{}", self.rule(&rule));

        let by_line: BTreeMap<u32, &LineProfile> = f.lines.iter().map(|l| (l.line, l)).collect();
        let prefix = PREFIX + if mem { MEM_PREFIX } else { 0 } + if gpu { GPU.width() } else { 0 };
        let text_width = self.width.saturating_sub(prefix).max(MIN_TEXT);
        let mut prev: Option<u32> = None;
        for n in self.shown_lines(f, text) {
            if prev.is_some_and(|p| n > p + 1) {
                let gap = LINES.row(&["...", "", "", ""]);
                let gap = if mem {
                    format!("{gap} {}", MEMORY.row(&["", "", "", ""]))
                } else {
                    gap
                };
                let gap = if gpu {
                    format!("{gap} {}", GPU.row(&["", ""]))
                } else {
                    gap
                };
                let _ = writeln!(out, "{gap}");
            }
            prev = Some(n);
            let line = by_line.get(&n).copied();
            let row = self.line_row(f, n, line, text, (mem, gpu), text_width);
            let _ = writeln!(out, "{}", row.trim_end());
            // Under the line number, across the whole width: names are long.
            let note_width = self.width.saturating_sub(NOTE_INDENT).max(MIN_TEXT);
            if let Some(note) = line.and_then(|l| native_note(l, note_width)) {
                let _ = writeln!(out, "{}{}", " ".repeat(NOTE_INDENT), self.paint(DIM, &note));
            }
            if let Some(note) = line.and_then(|l| allocated_note(l, text_width)) {
                let _ = writeln!(out, "{}{}", " ".repeat(prefix), self.paint(DIM, &note));
            }
        }
    }

    /// The numbers of the lines a file's table shows, ascending: the lines that matter (or
    /// every line with data, when none does), each with its context lines that exist.
    fn shown_lines(&self, f: &FileProfile, text: Option<&[String]>) -> Vec<u32> {
        // Lines that anchor context: those that matter, or every sampled one if none does.
        let mut anchors: Vec<u32> = f
            .lines
            .iter()
            .filter(|l| {
                l.total_pct() >= MATTER_PCT || self.memory_matters(l) || self.gpu_matters(l)
            })
            .map(|l| l.line)
            .collect();
        if anchors.is_empty() {
            anchors = f.lines.iter().map(|l| l.line).collect();
        }
        let by_line: BTreeMap<u32, &LineProfile> = f.lines.iter().map(|l| (l.line, l)).collect();
        let find = |n: u32| by_line.get(&n).copied();

        // Every line number to show, ascending, deduplicated.
        let ctx = self.o.context as u64;
        // No line past the last one known (sampled, or in the source) can be shown.
        let last_known = by_line
            .keys()
            .next_back()
            .map_or(0, |&l| u64::from(l))
            .max(text.map_or(0, |t| t.len() as u64));
        let mut wanted: Vec<u32> = Vec::new();
        for &a in &anchors {
            let lo = (u64::from(a).saturating_sub(ctx)).max(1);
            let hi = u64::from(a).saturating_add(ctx).min(last_known);
            for n in lo..=hi {
                let Ok(n) = u32::try_from(n) else { break };
                let known =
                    n == a || find(n).is_some() || text.is_some_and(|t| (n as usize) <= t.len());
                if known {
                    wanted.push(n);
                }
            }
        }
        wanted.sort_unstable();
        wanted.dedup();
        wanted
    }

    /// One row of a file's table: line `n` (with its data, `line`, if any), its cells and
    /// its source text cut to `text_width`.
    fn line_row(
        &self,
        f: &FileProfile,
        n: u32,
        line: Option<&LineProfile>,
        text: Option<&[String]>,
        (mem, gpu): (bool, bool),
        text_width: usize,
    ) -> String {
        let src = match line {
            Some(l) if !l.source.is_empty() => l.source.as_str(),
            _ => text
                .and_then(|t| t.get((n as usize).checked_sub(1)?))
                .map(String::as_str)
                .unwrap_or(""),
        };
        let src = truncate_end(&clean_source(src), text_width);
        let (py, nat, sys, total) = match line {
            Some(l) => (
                pct_cell(l.cpu_python_pct),
                self.native_cell(l.cpu_native_pct),
                pct_cell(l.cpu_system_pct),
                l.total_pct(),
            ),
            None => (String::new(), String::new(), String::new(), 0.0),
        };
        let hot =
            line.is_some() && (total >= HOT_PCT || self.hottest == Some((f.filename.as_str(), n)));
        let lm = line.and_then(|l| l.memory.as_ref());
        let lg = line.and_then(|l| l.gpu.as_ref());
        let context_only = total < 0.005
            && lm.is_none_or(|m| m.is_empty())
            && lg.is_none_or(|g| g.gpu_pct < 0.005 && g.gpu_mem_peak_mb < 0.05);
        // A cell of `table`'s column `i`, padded, then painted when the line is hot.
        let cell = |table: &Table, i: usize, s: &str| {
            let padded = table.pad(i, s);
            if hot {
                let pad = &padded[..padded.len() - s.len()];
                format!("{pad}{}", self.paint(HOT, s))
            } else {
                padded
            }
        };
        let num = LINES.pad(0, &n.to_string());
        let (num, src) = if hot {
            (self.paint(BOLD, &num), self.paint(BOLD, &src))
        } else if context_only {
            (self.paint(DIM, &num), self.paint(DIM, &src))
        } else {
            (num, src)
        };
        let mem_cells = if mem {
            let (mpy, peak, spark, copy) = match lm {
                Some(m) if m.mem_alloc_mb > 0.0 || m.copy_mb_s > 0.0 => (
                    if m.mem_alloc_mb > 0.0 {
                        format!("{:.0}%", m.mem_python_pct)
                    } else {
                        String::new()
                    },
                    mb_cell(m.mem_peak_mb),
                    sparkline(&m.mem_timeline, TIMELINE_WIDTH),
                    if m.copy_mb_s >= 0.05 {
                        format!("{:.1}", m.copy_mb_s)
                    } else {
                        String::new()
                    },
                ),
                _ => Default::default(),
            };
            let cells = [
                cell(&MEMORY, 0, &mpy),
                cell(&MEMORY, 1, &peak),
                MEMORY.pad(2, &spark),
                cell(&MEMORY, 3, &copy),
            ];
            format!(" {}", Table::join(&cells))
        } else {
            String::new()
        };
        let gpu_cells = if gpu {
            let (busy, held) = match lg {
                Some(g) => (pct_cell(g.gpu_pct), mb_cell(g.gpu_mem_peak_mb)),
                None => Default::default(),
            };
            format!(
                " {}",
                Table::join(&[cell(&GPU, 0, &busy), cell(&GPU, 1, &held)])
            )
        } else {
            String::new()
        };
        let cells = [
            num,
            cell(&LINES, 1, &py),
            cell(&LINES, 2, &nat),
            cell(&LINES, 3, &sys),
        ];
        format!("{}{mem_cells}{gpu_cells} {src}", Table::join(&cells))
    }

    fn functions(&self, out: &mut String) {
        let mut all: Vec<(&str, &crate::profile::FunctionProfile)> = self
            .p
            .files
            .iter()
            .flat_map(|f| f.functions.iter().map(move |g| (f.filename.as_str(), g)))
            .filter(|(_, g)| g.total_pct() >= 0.005)
            .collect();
        if all.is_empty() {
            return;
        }
        all.sort_by(|a, b| {
            b.1.total_pct()
                .total_cmp(&a.1.total_pct())
                .then_with(|| a.0.cmp(b.0))
                .then_with(|| a.1.function.cmp(&b.1.function))
        });
        let mattering = all
            .iter()
            .filter(|(_, g)| g.total_pct() >= MATTER_PCT)
            .count();
        let n = if mattering == 0 { all.len() } else { mattering }.min(TOP_FUNCTIONS);
        let _ = writeln!(out, "\n{}", self.paint(BOLD, "Top functions"));
        let text_width = self.width.saturating_sub(FUNCTIONS.width()).max(MIN_TEXT);
        let head = "function (file:line)";
        let head = if head.len() <= text_width {
            head
        } else {
            "function"
        };
        let _ = writeln!(
            out,
            "{} {head}",
            FUNCTIONS.row(&[self.time_label(), "native", "system", "total"])
        );
        let _ = writeln!(out, "{}", self.rule(&FUNCTIONS.rule_cells(true)));
        for (file, g) in &all[..n] {
            let name = clean_source(&g.function);
            let loc = match g.first_line {
                Some(l) => format!("{}:{l}", clean_source(file)),
                None => clean_source(file),
            };
            let label = format_function(&name, &loc, text_width);
            let cells = [
                pct_cell(g.cpu_python_pct),
                self.native_cell(g.cpu_native_pct),
                pct_cell(g.cpu_system_pct),
                pct_cell(g.total_pct()),
            ];
            let _ = writeln!(out, "{} {label}", FUNCTIONS.row(&cells));
        }
        if all.len() > n {
            let more = all.len() - n;
            let s = if more == 1 { "" } else { "s" };
            let _ = writeln!(out, "({more} more function{s} not shown)");
        }
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

    fn threads(&self, out: &mut String) {
        let _ = writeln!(out, "\n{}", self.paint(BOLD, "Threads"));
        if self.p.threads.is_empty() {
            let _ = writeln!(out, "No per-thread data was recorded.");
            return;
        }
        let head = [
            "TID",
            "samples",
            self.time_label(),
            "native",
            "system",
            "total",
        ];
        let _ = writeln!(out, "{} name", THREADS.row(&head));
        let _ = writeln!(out, "{}", self.rule(&THREADS.rule_cells(true)));
        // TID, samples and the four shares come first, the name takes what is left.
        let name_w = self.width.saturating_sub(THREADS.width());
        for t in &self.p.threads {
            let name = t.name.as_deref().map(clean_source).unwrap_or_default();
            let name = if name.is_empty() {
                "-".to_string()
            } else {
                truncate_end(&name, name_w)
            };
            let cells = [
                t.native_id.to_string(),
                t.samples.to_string(),
                pct_cell(t.cpu_python_pct),
                self.native_cell(t.cpu_native_pct),
                pct_cell(t.cpu_system_pct),
                pct_cell(t.cpu_python_pct + t.cpu_native_pct + t.cpu_system_pct),
            ];
            let row = format!("{} {name}", THREADS.row(&cells));
            let _ = writeln!(out, "{}", row.trim_end());
        }
    }
}

/// `name (location)` in at most `max` characters: the location loses its start first (it is
/// a path); when too little of it would be left, only the name is shown, cut if need be.
fn format_function(name: &str, loc: &str, max: usize) -> String {
    let full = format!("{name} ({loc})");
    if full.chars().count() <= max {
        return full;
    }
    // Room left for the location inside " (…)".
    let room = max.saturating_sub(name.chars().count() + 3);
    if room >= 8 {
        return format!("{name} ({})", truncate_start(loc, room));
    }
    truncate_end(name, max)
}

#[cfg(test)]
mod short_name_tests {
    use super::short_function as short;

    #[test]
    fn native_names_are_shortened_for_the_row_under_a_line() {
        assert_eq!(short("deflate_slow"), "deflate_slow");
        assert_eq!(short("libz.so.1.2.13+0x5d80"), "libz.so.1.2.13+0x5d80");
        assert_eq!(
            short(
                "unsigned long partition_unrolled<zmm_vector<double>, Comparator<zmm_vector<\
                 double>, false>, 8, double>(double*, unsigned long, unsigned long, double, \
                 double*, double*) [clone .constprop.0]"
            ),
            "partition_unrolled<…>"
        );
        assert_eq!(
            short("void np::qsort_simd::QSort_X86_V4<double>(double*, long)"),
            "np::qsort_simd::QSort_X86_V4<double>"
        );
        assert_eq!(
            short("DOUBLE_matmul_matrixmatrix.isra.0"),
            "DOUBLE_matmul_matrixmatrix.isra.0"
        );
        assert_eq!(
            short("std::vector<int, std::allocator<int> >::push_back(int const&)"),
            "std::vector<…>::push_back"
        );
        assert_eq!(
            short("foo::operator()(int) const"),
            "foo::operator()(int) const"
        );
        assert_eq!(short("broken<(int)"), "broken<(int)");
    }
}
