//! The report's head: the title, then `Label: text` fields about the recording.
//!
//! Owns:
//! - what ran, how it was recorded, and what was lost;
//! - the memory and GPU summaries;
//! - [`header_fields`], the same fields unwrapped for other renderers (HTML).
//!
//! Must not: lay out a table; the head is fields only.

use super::cells::{bytes_text, seconds, sparkline, truncate_end};
use super::table::{GPU, MEM_PREFIX, MIN_TEXT, PREFIX};
use super::{Renderer, TerminalOptions, BOLD, HOT, TIME_UNSPLIT};
use crate::profile::{Profile, TimeMode};
use std::fmt::Write as _;

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
/// report words them, unwrapped, for other renderers (HTML) that lay them out themselves.
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

impl Renderer<'_> {
    /// One `Label:    text` field of the header, wrapped at the width under a hanging indent.
    pub(super) fn field(&self, out: &mut String, label: &str, text: &str, code: Option<&str>) {
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
    pub(super) fn header(&self, out: &mut String) {
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
        let who = match procs.as_slice() {
            [_, _, ..] => format!(
                "{python}{build}, {} processes (root pid {})",
                procs.len(),
                m.pid
            ),
            // The one Python process is not the root (a script's, a launcher's).
            [one] if one.pid != m.pid => {
                format!(
                    "{python}{build}, pid {} (under root pid {})",
                    one.pid, m.pid
                )
            }
            _ => format!("{python}{build}, pid {}", m.pid),
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
            if m.large_allocs_without_own_stack > 0 {
                self.field(
                    out,
                    "",
                    &format!(
                        "{:.1} MB of {:.1} MB allocated in blocks of at least a window ({}                          events) charged without a stack of their own (to their thread's                          latest handshake's line)",
                        m.large_alloc_without_own_stack_mb,
                        m.large_alloc_mb,
                        m.large_allocs_without_own_stack
                    ),
                    Some(BOLD),
                );
            }
        }
    }

    /// The program's GPU figures, or why there are none.
    fn gpu_summary(&self, out: &mut String) {
        let Some(g) = &self.p.gpu else { return };
        if g.quiet {
            return;
        }
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
}
