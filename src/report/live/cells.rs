//! The text of one cell or header part: shares, rates, durations, sparklines, cut text.
//!
//! Must not: style or place text (`screen` and `header` do).

/// A share for a cell: blank for nothing, `<0.1` for a sliver, else one decimal.
pub(crate) fn pct(v: f64) -> String {
    if v.is_nan() || v <= 0.0 {
        String::new()
    } else if v < 0.1 {
        "<0.1".to_string()
    } else {
        format!("{v:.1}")
    }
}

/// A rate or size in MB for a cell: blank for none or under 0.05, else one decimal (none
/// from 1000 on).
pub(crate) fn mb(v: Option<f64>) -> String {
    match v {
        Some(v) if v >= 1000.0 => format!("{v:.0}"),
        Some(v) if v >= 0.05 => format!("{v:.1}"),
        _ => String::new(),
    }
}

/// A duration: `4.2 s`, `3m 05s`, `2h 03m`.
pub(crate) fn duration(s: f64) -> String {
    let s = s.max(0.0);
    if s < 60.0 {
        format!("{s:.1} s")
    } else if s < 3600.0 {
        let whole = s as u64;
        format!("{}m {:02}s", whole / 60, whole % 60)
    } else {
        let whole = s as u64;
        format!("{}h {:02}m", whole / 3600, whole % 3600 / 60)
    }
}

/// A sparkline of the last `width` of `values`, scaled from 0 to their maximum.
pub(crate) fn sparkline(values: &[f64], width: usize) -> String {
    const BARS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    let recent = &values[values.len().saturating_sub(width)..];
    let max = recent.iter().copied().fold(0.0f64, f64::max);
    if max <= 0.0 {
        return String::new();
    }
    recent
        .iter()
        .map(|v| BARS[((v.max(0.0) / max * 7.0).round() as usize).min(7)])
        .collect()
}

/// `s` cut to `max` characters, ending with `…` when cut.
pub(crate) fn cut_end(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_string();
    }
    if max == 0 {
        return String::new();
    }
    let mut out: String = s.chars().take(max - 1).collect();
    out.push('…');
    out
}

/// `s` cut to `max` characters keeping its end (a path), starting with `…` when cut.
pub(crate) fn cut_start(s: &str, max: usize) -> String {
    let n = s.chars().count();
    if n <= max {
        return s.to_string();
    }
    if max == 0 {
        return String::new();
    }
    let mut out = String::from("…");
    out.extend(s.chars().skip(n - (max - 1)));
    out
}

/// `s` in exactly `width` characters: cut (by `cut`) or padded, right-aligned when
/// `right`.
pub(crate) fn fit(s: &str, width: usize, right: bool, cut: fn(&str, usize) -> String) -> String {
    let s = cut(s, width);
    let pad = width - s.chars().count();
    if right {
        format!("{}{s}", " ".repeat(pad))
    } else {
        format!("{s}{}", " ".repeat(pad))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cells() {
        assert_eq!(pct(0.0), "");
        assert_eq!(pct(0.04), "<0.1");
        assert_eq!(pct(12.345), "12.3");
        assert_eq!(mb(None), "");
        assert_eq!(mb(Some(0.01)), "");
        assert_eq!(mb(Some(2.25)), "2.2");
        assert_eq!(mb(Some(1536.4)), "1536");
        assert_eq!(duration(4.25), "4.2 s");
        assert_eq!(duration(185.0), "3m 05s");
        assert_eq!(duration(7380.0), "2h 03m");
    }

    #[test]
    fn cuts_keep_the_width() {
        assert_eq!(cut_end("abcdef", 4), "abc…");
        assert_eq!(cut_start("/srv/app/x.py", 8), "…pp/x.py");
        assert_eq!(fit("ab", 4, true, cut_end), "  ab");
        assert_eq!(fit("abcdef", 4, false, cut_start), "…def");
    }

    #[test]
    fn sparkline_scales_to_the_maximum() {
        assert_eq!(sparkline(&[0.0, 50.0, 100.0], 10), "▁▅█");
        // Only the most recent values that fit.
        assert_eq!(sparkline(&[100.0, 0.0, 100.0], 2), "▁█");
        assert_eq!(sparkline(&[], 5), "");
    }
}
