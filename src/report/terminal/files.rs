//! Each file's table: its lines with their shares of the time, memory and GPU.
//!
//! Owns:
//! - which files and lines are shown, with their context lines;
//! - whether the memory and GPU columns fit the width;
//! - the possible memory leaks, listed after the files.
//!
//! Must not: read a file itself; source text comes from the caller's provider.

use super::cells::{
    clean_source, mb_cell, pct_cell, seconds, sparkline, truncate_end, truncate_start,
};
use super::notes::{allocated_note, native_note, NOTE_INDENT};
use super::table::{Table, GPU, LINES, MEMORY, MEM_PREFIX, MIN_TEXT, PREFIX, TIMELINE_WIDTH};
use super::{Renderer, SourceProvider, BOLD, DIM, HOT, HOT_PCT, MATTER_PCT};
use crate::profile::{FileProfile, LineProfile};
use std::collections::BTreeMap;
use std::fmt::Write as _;

impl Renderer<'_> {
    /// Whether the file tables show the GPU columns (a GPU was used and the terminal is
    /// wide enough).
    pub(super) fn gpu_columns(&self) -> bool {
        let extra = if self.memory_columns() { MEM_PREFIX } else { 0 };
        self.p.gpu.as_ref().is_some_and(|g| g.has_data())
            && self.width >= PREFIX + extra + GPU.width() + MIN_TEXT
    }

    /// Whether a line matters for the GPU (a share of its busy time).
    fn gpu_matters(&self, l: &LineProfile) -> bool {
        l.gpu.as_ref().is_some_and(|g| g.gpu_pct >= MATTER_PCT)
    }

    /// Whether the file tables show the memory columns (memory was recorded and the
    /// terminal is wide enough for them and some source text).
    pub(super) fn memory_columns(&self) -> bool {
        self.p.memory.is_some() && self.width >= PREFIX + MEM_PREFIX + MIN_TEXT
    }

    /// Whether a line matters for memory (a share of the allocations or copies).
    fn memory_matters(&self, l: &LineProfile) -> bool {
        let (Some(m), Some(lm)) = (&self.p.memory, &l.memory) else {
            return false;
        };
        let alloc = m.alloc_mb > 0.0 && 100.0 * lm.mem_alloc_mb / m.alloc_mb >= MATTER_PCT;
        let copy_total = m.copy_mb / self.p.meta.duration_s.max(1e-9);
        let copy = copy_total > 0.0 && 100.0 * lm.copy_mb_s / copy_total >= MATTER_PCT;
        alloc || copy
    }

    pub(super) fn leaks(&self, out: &mut String) {
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

    pub(super) fn files(&self, out: &mut String, source: SourceProvider) {
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
            // Under the line number, across the whole width, because names are long.
            let note_width = self.width.saturating_sub(NOTE_INDENT).max(MIN_TEXT);
            if let Some(note) = line.and_then(|l| native_note(l, note_width)) {
                let _ = writeln!(out, "{}{}", " ".repeat(NOTE_INDENT), self.paint(DIM, &note));
            }
            if let Some(note) = line.and_then(|l| allocated_note(l, text_width)) {
                let _ = writeln!(out, "{}{}", " ".repeat(prefix), self.paint(DIM, &note));
            }
        }
    }

    /// The numbers of the lines a file's table shows, ascending. They are the lines that
    /// matter (or every line with data, when none does), each with its context lines that
    /// exist.
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
}
