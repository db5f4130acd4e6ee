//! The live screen: title and header, the table of rows, the footer, the help.
//!
//! Owns: where each part goes on the terminal, the table's heading and cells (with the
//! columns that fit, `columns::fit`), the footer's keys or prompt, and the help text.
//!
//! Must not: change the app's state or compute figures.
//!
//! Layout, top to bottom: the title (one line), the header (`header`), the table's
//! heading, its rows (as many as fit; the footer says how many there are), the footer
//! (one line).

use super::app::App;
use super::cells::{cut_end, cut_start, fit as fit_text, mb, pct};
use super::columns::{columns_of, fit, Column, Extras, GAP};
use super::header;
use super::model::Row;
use ratatui::layout::Rect;
use ratatui::style::{Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Paragraph, Wrap};

/// A row whose share is at least this (percent) is shown bold.
const HOT_PCT: f64 = 10.0;
/// The header takes at most this share of the screen's lines; the table the rest.
const HEADER_MAX_SHARE: f64 = 0.5;

impl App {
    /// Draws the screen on ratatui's frame (any backend: the terminal, or a test's).
    pub fn draw(&self, f: &mut ratatui::Frame) {
        draw(self, f);
    }
}

/// Draws the whole screen.
fn draw(app: &App, f: &mut ratatui::Frame) {
    let area = f.area();
    if area.width == 0 || area.height == 0 {
        return;
    }
    let width = area.width as usize;
    let mut top: Vec<Line> = vec![header::title(app, width)];
    let max_head = ((area.height as f64 * HEADER_MAX_SHARE) as usize).max(1);
    // The help takes every line under the title.
    if !app.help {
        top.extend(header::lines(app, width).into_iter().take(max_head - 1));
    }
    let head_h = (top.len() as u16).min(area.height);
    let foot_h = u16::from(area.height > head_h);
    let body = Rect {
        x: area.x,
        y: area.y + head_h,
        width: area.width,
        height: area.height - head_h - foot_h,
    };
    f.render_widget(
        Paragraph::new(top),
        Rect {
            height: head_h,
            ..area
        },
    );
    let rows = app.rows();
    if app.help {
        // Wrapped, so a narrow terminal still reads every key.
        f.render_widget(Paragraph::new(help(app)).wrap(Wrap { trim: false }), body);
    } else {
        f.render_widget(Paragraph::new(table(app, &rows, body)), body);
    }
    if foot_h > 0 {
        let shown = rows.len().min(body.height.saturating_sub(1) as usize);
        let foot = Rect {
            y: area.y + area.height - 1,
            height: 1,
            ..area
        };
        f.render_widget(Paragraph::new(footer(app, shown, rows.len(), width)), foot);
    }
}

/// The table: its heading and the rows that fit `area`.
fn table(app: &App, rows: &[Row], area: Rect) -> Vec<Line<'static>> {
    let width = area.width as usize;
    let view = app.query.view;
    let x = app.extras();
    let wanted = columns_of(view, x);
    let visible = &rows[..rows.len().min(area.height.saturating_sub(1) as usize)];
    let natural = |c: Column| -> usize {
        let head = c.heading(view, x).chars().count();
        visible
            .iter()
            .map(|r| text_of(r, c, x).chars().count())
            .max()
            .unwrap_or(0)
            .max(head)
    };
    let cols = fit(&wanted, view, x, width, &natural);
    let mut out = Vec::with_capacity(visible.len() + 1);
    let mut head = String::new();
    for (i, (c, w)) in cols.iter().enumerate() {
        if i > 0 {
            head.push_str(&" ".repeat(GAP));
        }
        let mut text = c.heading(view, x).to_string();
        if c.sort_key() == Some(app.query.sort) {
            text.push(if app.query.sort.ascending() {
                '▲'
            } else {
                '▼'
            });
        }
        head.push_str(&fit_text(&text, *w, c.is_figure(), cut_end));
    }
    let used = head.chars().count();
    head.push_str(&" ".repeat(width.saturating_sub(used)));
    out.push(Line::styled(
        head,
        Style::default().add_modifier(Modifier::REVERSED),
    ));
    if visible.is_empty() {
        out.push(Line::raw(empty_text(app)));
        return out;
    }
    for r in visible {
        let mut spans = Vec::with_capacity(cols.len() * 2);
        for (i, (c, w)) in cols.iter().enumerate() {
            if i > 0 {
                spans.push(Span::raw(" ".repeat(GAP)));
            }
            let cut = if *c == Column::Location {
                cut_start
            } else {
                cut_end
            };
            spans.push(Span::raw(fit_text(
                &text_of(r, *c, x),
                *w,
                c.is_figure(),
                cut,
            )));
        }
        let style = if r.total_pct >= HOT_PCT {
            Style::default().add_modifier(Modifier::BOLD)
        } else {
            Style::default()
        };
        out.push(Line::from(spans).style(style));
    }
    out
}

/// What the table says when it has no row.
fn empty_text(app: &App) -> String {
    if app.current().is_none() {
        "Waiting for the first samples…".to_string()
    } else if !app.query.filter.is_empty() {
        format!("No row matches \"{}\" in this window.", app.query.filter)
    } else {
        "Nothing was sampled in this window.".to_string()
    }
}

/// The text of row `r`'s cell in column `c`.
fn text_of(r: &Row, c: Column, x: Extras) -> String {
    match c {
        Column::Location => r.location(),
        Column::Function => r.function.clone().unwrap_or_default(),
        Column::Total => pct(r.total_pct),
        Column::Python if x.unsplit => pct(r.python_pct + r.native_pct),
        Column::Python => pct(r.python_pct),
        Column::Native => pct(r.native_pct),
        Column::System => pct(r.system_pct),
        Column::Alloc => mb(r.alloc_mb_s),
        Column::Peak => mb(r.peak_mb),
        Column::Copy => mb(r.copy_mb_s),
        Column::NativeTop => r.native_top.clone().unwrap_or_default(),
        Column::Task => r.task.clone().unwrap_or_default(),
        Column::Source => r.source.clone(),
    }
}

/// The footer: the prompt while a filter is typed, the exit's message, or the rows shown
/// and the keys.
fn footer(app: &App, shown: usize, all: usize, width: usize) -> Line<'static> {
    if let Some(text) = &app.typing {
        return Line::from(vec![
            Span::styled("filter: ", Style::default().add_modifier(Modifier::BOLD)),
            Span::raw(format!("{text}▏")),
            Span::raw("  Enter applies, Esc clears"),
        ]);
    }
    if let Some(code) = app.exited() {
        let text = if app.exit_on_end() {
            format!("The program exited (code {code}).")
        } else {
            format!("The program exited (code {code}): press any key to leave.")
        };
        return Line::styled(
            cut_end(&text, width),
            Style::default().add_modifier(Modifier::BOLD),
        );
    }
    let mut text = if shown < all {
        format!("{shown} of {all} {} · ", app.query.view.name())
    } else {
        String::new()
    };
    // As many keys as fit, most needed first; `?` lists them all.
    let keys = [
        "q quit",
        "? help",
        "s sort",
        "v view",
        "w window",
        "t thread",
        "/ filter",
        "p pause",
        "r reset",
        "+/- refresh",
    ];
    for (i, k) in keys.iter().enumerate() {
        let gap = if i == 0 { "" } else { "  " };
        if text.chars().count() + gap.len() + k.chars().count() > width {
            break;
        }
        text.push_str(gap);
        text.push_str(k);
    }
    Line::raw(cut_end(&text, width))
}

/// The help screen's lines.
fn help(app: &App) -> Vec<Line<'static>> {
    let bold = Style::default().add_modifier(Modifier::BOLD);
    let refresh = super::cells::duration(app.refresh.as_secs_f64());
    let keys: [(&str, String); 11] = [
        ("q, Ctrl-C", "quit".to_string()),
        ("?", "this help (any key closes it)".to_string()),
        (
            "w",
            "window: the last interval, or since start (since the last reset)".to_string(),
        ),
        (
            "s, S",
            "sort by the next / previous column (its heading is marked ▼ or ▲)".to_string(),
        ),
        ("v", "view: lines, functions, files".to_string()),
        ("t, T", "threads: all, then each thread in turn".to_string()),
        (
            "/",
            "filter by file or function (Enter applies, Esc clears)".to_string(),
        ),
        (
            "p, space",
            "pause the display (the sampling goes on)".to_string(),
        ),
        ("r", "reset the counts: windows start now".to_string()),
        (
            "+, -",
            format!("refresh period longer / shorter (now {refresh})"),
        ),
        ("Esc", "clear the filter".to_string()),
    ];
    let figures = [
        (
            "Total% Py% Nat% Sys%",
            "shares of the time sampled in the window, all threads of all processes \
             together: rows add up to 100% at most",
        ),
        (
            "Alloc MB/s, Copy MB/s",
            "MB allocated and copied per second of the window",
        ),
        ("Peak MB", "the line's largest footprint, since start"),
        (
            "Top native",
            "the native function most of the line's native time went to",
        ),
        ("Task", "the asyncio task most of the line's time went to"),
    ];
    let mut out = vec![Line::styled("Keys", bold)];
    for (k, what) in keys {
        out.push(Line::raw(format!("  {k:<10} {what}")));
    }
    out.push(Line::raw(""));
    out.push(Line::styled("Figures", bold));
    for (k, what) in figures {
        out.push(Line::raw(format!("  {k:<22} {what}")));
    }
    out
}
