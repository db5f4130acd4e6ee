//! The head of the live screen: the title and the facts about the recording and the
//! window, packed into lines of the terminal's width.
//!
//! Owns: the wording of the header and [`pack`], which puts parts on lines, wrapping only
//! between parts and cutting a part longer than a line (a long command line cuts, never
//! breaks the layout).
//! Must not: compute figures beyond the window's ratios (`tally` does).

use super::app::{App, WindowKind};
use super::cells::{cut_end, duration, sparkline};
use super::columns::columns_of;
use super::tally::Tally;
use crate::profile::TimeMode;
use ratatui::style::{Modifier, Style};
use ratatui::text::{Line, Span};

/// Between two parts of one line.
const SEP: &str = " · ";
/// The footprint's sparkline, characters.
const SPARK: usize = 20;

/// A status the title shows at its right, loud.
pub(crate) fn badge(app: &App) -> Option<String> {
    if let Some(code) = app.exited() {
        return Some(format!(" exited (code {code}) "));
    }
    app.paused.then(|| " PAUSED ".to_string())
}

/// The title line: what runs, and at the right the badge or the refresh period.
pub(crate) fn title(app: &App, width: usize) -> Line<'static> {
    let program = app
        .current()
        .map(|c| c.info.program.clone())
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| "(waiting for the first frame)".to_string());
    let (right, loud) = match badge(app) {
        Some(b) => (b, true),
        None => (
            format!("refresh {}", duration(app.refresh.as_secs_f64())),
            false,
        ),
    };
    let right_w = right.chars().count();
    let left = cut_end(
        &format!("scalene-rs top · {program}"),
        width.saturating_sub(right_w + 1),
    );
    let pad = width.saturating_sub(left.chars().count() + right_w);
    let style = if loud {
        Style::default().add_modifier(Modifier::REVERSED | Modifier::BOLD)
    } else {
        Style::default()
    };
    Line::from(vec![
        Span::styled(left, Style::default().add_modifier(Modifier::BOLD)),
        Span::raw(" ".repeat(pad)),
        Span::styled(right, style),
    ])
}

/// Puts `parts` on lines of `width`, in order, joined by ` · `: a part that does not fit
/// on the line begins the next; a part longer than a line is cut.
pub(crate) fn pack(parts: &[String], width: usize) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    let mut cur = String::new();
    for p in parts {
        let p = cut_end(p, width);
        let len = cur.chars().count();
        if len > 0 && len + SEP.chars().count() + p.chars().count() > width {
            lines.push(std::mem::take(&mut cur));
        }
        if !cur.is_empty() {
            cur.push_str(SEP);
        }
        cur.push_str(&p);
    }
    if !cur.is_empty() {
        lines.push(cur);
    }
    lines
}

/// The header's lines under the title, for `width` columns.
pub(crate) fn lines(app: &App, width: usize) -> Vec<Line<'static>> {
    let (Some(cur), Some(w)) = (app.current(), app.window.as_ref()) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let mut push = |parts: Vec<String>, style: Style| {
        for l in pack(&parts, width) {
            out.push(Line::styled(l, style));
        }
    };
    let (head, rows) = processes(app, w);
    push(head, Style::default());
    push_rows(&mut push, rows);
    push(sampling(app, w), Style::default());
    let h = &cur.header;
    let mut resources = Vec::new();
    if let Some(now) = h.footprint_mb.last() {
        resources.push(format!(
            "footprint {now:.1} MB {}",
            sparkline(&h.footprint_mb, SPARK)
        ));
    }
    if let Some(g) = &h.gpu {
        resources.push(format!("GPU {:.0}% {:.0} MB", g.util_pct, g.mem_mb));
    }
    push(resources, Style::default());
    push(
        window(app, w),
        Style::default().add_modifier(Modifier::BOLD),
    );
    if let Some(note) = &h.note {
        push(vec![note.clone()], Style::default());
    }
    out
}

/// Each of `rows` on a line of its own (cut, never wrapped).
fn push_rows(push: &mut impl FnMut(Vec<String>, Style), rows: Vec<String>) {
    for r in rows {
        push(vec![r], Style::default());
    }
}

/// Process rows shown at most; the others are counted on one more row.
const PROCESS_ROWS: usize = 4;

/// The Python version (and, of several processes, how many), then a row per process with
/// its share of the window, the busiest first (at most [`PROCESS_ROWS`]).
fn processes(app: &App, w: &Tally) -> (Vec<String>, Vec<String>) {
    let Some(cur) = app.current() else {
        return (Vec::new(), Vec::new());
    };
    let h = &cur.header;
    let version = h
        .processes
        .first()
        .map(|p| p.python_version.clone())
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| cur.info.python_version.clone());
    let mut parts = vec![if cur.info.free_threaded {
        format!("Python {version} (free-threaded)")
    } else {
        format!("Python {version}")
    }];
    if h.processes.len() <= 1 {
        let pid = h.processes.first().map_or(cur.info.pid, |p| p.pid);
        parts.push(format!("pid {pid}"));
        return (parts, Vec::new());
    }
    parts.push(format!("{} processes", h.processes.len()));
    let mut shares: Vec<(f64, &super::frame::LiveProcess)> = h
        .processes
        .iter()
        .map(|p| {
            let secs = w.processes.get(&p.pid).copied().unwrap_or(0.0);
            let share = if w.total_s > 0.0 {
                100.0 * secs / w.total_s
            } else {
                0.0
            };
            (share, p)
        })
        .collect();
    shares.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.pid.cmp(&b.1.pid)));
    let shown = if shares.len() > PROCESS_ROWS {
        PROCESS_ROWS - 1
    } else {
        shares.len()
    };
    let mut rows: Vec<String> = shares[..shown]
        .iter()
        .map(|(share, p)| format!("  pid {:<7} {share:5.1}%  {}", p.pid, p.command))
        .collect();
    if shares.len() > shown {
        let rest: f64 = shares[shown..].iter().map(|(s, _)| s).sum();
        rows.push(format!(
            "  {} more processes {rest:5.1}%",
            shares.len() - shown
        ));
    }
    (parts, rows)
}

/// Rates, losses, the GIL, threads and the time since start.
fn sampling(app: &App, w: &Tally) -> Vec<String> {
    let Some(cur) = app.current() else {
        return Vec::new();
    };
    let h = &cur.header;
    let mut parts = Vec::new();
    if w.elapsed_s > 0.0 {
        parts.push(format!(
            "{:.1} samples/s of {:.0} Hz",
            w.samples as f64 / w.elapsed_s,
            h.rate_requested_hz
        ));
    }
    let due = w.samples + w.lost;
    parts.push(if due > 0 {
        format!(
            "lost {} ({:.1}%)",
            w.lost,
            100.0 * w.lost as f64 / due as f64
        )
    } else {
        "lost 0".to_string()
    });
    if cur.info.free_threaded {
        parts.push("no GIL".to_string());
    } else if let (Some(held), true) = (w.gil_held, w.samples > 0) {
        parts.push(format!("GIL {:.0}%", 100.0 * held / w.samples as f64));
    }
    parts.push(format!(
        "threads {} active / {} idle",
        h.threads_active, h.threads_idle
    ));
    parts.push(format!("elapsed {}", duration(h.elapsed.as_secs_f64())));
    parts
}

/// The window and its one denominator, then what the table shows.
fn window(app: &App, w: &Tally) -> Vec<String> {
    let Some(cur) = app.current() else {
        return Vec::new();
    };
    let unit = match cur.info.mode {
        TimeMode::Cpu => "CPU-s",
        TimeMode::Wall => "thread-s (wall)",
    };
    let name = match (app.window_kind, app.baseline.is_some()) {
        (WindowKind::Interval, _) => "last interval",
        (WindowKind::SinceStart, false) => "since start",
        (WindowKind::SinceStart, true) => "since reset",
    };
    let mut parts = vec![format!(
        "{name} ({}): % of {:.2} {unit} sampled",
        duration(w.elapsed_s),
        w.total_s
    )];
    let q = &app.query;
    parts.push(format!("view {}", q.view.name()));
    parts.push(match q.thread {
        None => "all threads".to_string(),
        Some(t) => {
            let th = w.threads.get(&t);
            let name = th.and_then(|th| th.name.clone()).unwrap_or_default();
            let secs = th.map_or(0.0, |th| th.split.total());
            let share = if w.total_s > 0.0 {
                100.0 * secs / w.total_s
            } else {
                0.0
            };
            format!("thread {t} {name} ({share:.1}%)")
        }
    });
    let x = app.extras();
    let heading = columns_of(q.view, x)
        .into_iter()
        .find(|c| c.sort_key() == Some(q.sort))
        .map_or("Total%", |c| c.heading(q.view, x));
    parts.push(format!("sort {heading}"));
    if !q.filter.is_empty() {
        parts.push(format!("filter \"{}\"", q.filter));
    }
    if x.memory && q.view == super::model::View::Lines {
        parts.push("peak: since start".to_string());
    }
    if q.thread.is_some() && cur.tally.has_memory {
        parts.push("memory: all threads only".to_string());
    }
    parts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pack_wraps_between_parts_and_cuts_long_ones() {
        let parts = ["aaaa", "bbbb", "cccc"].map(String::from);
        assert_eq!(pack(&parts, 11), vec!["aaaa · bbbb", "cccc"]);
        let long = ["x".repeat(30), "y".to_string()];
        let lines = pack(&long, 10);
        assert_eq!(lines[0].chars().count(), 10);
        assert!(lines[0].ends_with('…'));
        assert_eq!(lines[1], "y");
    }
}
