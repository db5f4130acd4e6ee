//! The tables after the files: the top functions and (on request) the threads.
//!
//! Must not: list more than [`TOP_FUNCTIONS`] functions.

use super::cells::{clean_source, format_function, pct_cell, truncate_end};
use super::table::{FUNCTIONS, MIN_TEXT, THREADS};
use super::{Renderer, BOLD, MATTER_PCT};
use std::fmt::Write as _;

/// Functions listed in the summary.
const TOP_FUNCTIONS: usize = 10;

impl Renderer<'_> {
    pub(super) fn functions(&self, out: &mut String) {
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

    pub(super) fn threads(&self, out: &mut String) {
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
        // The interpreters each thread ran in are said where some thread ran outside the
        // main one.
        let interp = self
            .p
            .threads
            .iter()
            .any(|t| t.interpreters.iter().any(|&i| i != 0));
        // TID, samples and the four shares come first, the name takes what is left (the
        // interpreters after it are kept whole when the name is cut).
        let name_w = self.width.saturating_sub(THREADS.width());
        for t in &self.p.threads {
            let mut name = thread_name(t);
            if name.is_empty() {
                name = "-".to_string();
            }
            let suffix = if interp && !t.interpreters.is_empty() {
                let ids: Vec<String> = t.interpreters.iter().map(i64::to_string).collect();
                format!(" · interp {}", ids.join(","))
            } else {
                String::new()
            };
            let room = name_w.saturating_sub(suffix.chars().count());
            let name = if room >= MIN_NAME {
                format!("{}{suffix}", truncate_end(&name, room))
            } else {
                truncate_end(&format!("{name}{suffix}"), name_w)
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

/// Narrowest a thread's name is cut to before its interpreters are cut too.
const MIN_NAME: usize = 8;

/// A thread's name cell (see [`crate::profile::ThreadProfile::display_name`]).
fn thread_name(t: &crate::profile::ThreadProfile) -> String {
    t.display_name()
        .as_deref()
        .map(clean_source)
        .unwrap_or_default()
}
