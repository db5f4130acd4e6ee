//! The text of one cell: percentages, sizes, sparklines, text cut to a width.
//!
//! Must not: pad or paint; `table.rs` pads and the renderers paint.

/// A size in MB for a cell: blank for nothing, else 3 significant digits and `M`.
pub(super) fn mb_cell(v: f64) -> String {
    if v.is_nan() || v < 0.05 {
        String::new()
    } else if v < 10.0 {
        format!("{v:.1}M")
    } else {
        format!("{v:.0}M")
    }
}

/// `1 MiB`, `512 KiB`, `100 B`.
pub(super) fn bytes_text(b: u64) -> String {
    if b >= 1 << 20 && b.is_multiple_of(1 << 20) {
        format!("{} MiB", b >> 20)
    } else if b >= 1 << 10 && b.is_multiple_of(1 << 10) {
        format!("{} KiB", b >> 10)
    } else {
        format!("{b} B")
    }
}

/// A sparkline of `values` (scaled to their maximum), `width` characters at most.
pub(super) fn sparkline(values: &[f64], width: usize) -> String {
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

/// A percentage as the line cells write it, without padding.
pub(super) fn pct_text(v: f64) -> String {
    pct_cell(v).trim().to_string()
}

/// A percentage cell: blank for nothing, `<1%` for a sliver, else rounded.
pub(super) fn pct_cell(v: f64) -> String {
    if v.is_nan() || v < 0.005 {
        String::new()
    } else if v < 1.0 {
        "<1%".to_string()
    } else {
        format!("{v:.0}%")
    }
}

/// Cuts `s` to `max` characters, ending it with `…` when cut.
pub(super) fn truncate_end(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_string();
    }
    let mut out: String = s.chars().take(max.saturating_sub(1)).collect();
    out.push('…');
    out
}

/// Cuts `s` to `max` characters, keeping its end (for paths), starting it with `…` when cut.
pub(super) fn truncate_start(s: &str, max: usize) -> String {
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
pub(super) fn clean_source(s: &str) -> String {
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

pub(super) fn seconds(s: f64) -> String {
    format!("{s:.2} s")
}

/// `name (location)` in at most `max` characters. The location loses its start first (it is
/// a path). When too little of it would be left, only the name is shown, cut if need be.
pub(super) fn format_function(name: &str, loc: &str, max: usize) -> String {
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
