//! Flame graphs (interactive SVG), drawn by the `inferno` crate from the collapsed stacks.
//!
//! Box widths are sample counts, as in [`super::collapsed`]. The output is deterministic.
//! Colours come from a hash of each frame's name (inferno's `deterministic` mode) rather
//! than from its random palette, and nothing depends on the time or the machine.
//!
//! Must not: read process memory or files.

use super::collapsed;
use crate::profile::Profile;
use inferno::flamegraph::color::{MultiPalette, Palette};
use inferno::flamegraph::{self as inferno_fg, Options};
use std::io::{self, Write};

/// Title of the graph: the profiled program.
fn title(p: &Profile) -> String {
    if p.meta.program.is_empty() {
        "scalene-rs".to_string()
    } else {
        format!("scalene-rs: {}", p.meta.program)
    }
}

/// The line under the title: what was measured.
fn subtitle(p: &Profile) -> String {
    let m = &p.meta;
    let mut parts = Vec::new();
    if !m.python_version.is_empty() {
        parts.push(format!("Python {}", m.python_version));
    }
    if m.pid != 0 {
        parts.push(format!("pid {}", m.pid));
    }
    parts.push(format!("{} mode", m.mode));
    let samples: u64 = p.stacks.iter().map(|s| s.samples).sum();
    parts.push(format!("{samples} thread samples"));
    parts.push(format!("{:.2} s", m.duration_s));
    parts.join(", ")
}

/// The options used for every graph, fixed so the same profile gives the same bytes.
fn options(p: &Profile) -> Options<'static> {
    let mut o = Options::default();
    o.title = title(p);
    o.subtitle = Some(subtitle(p));
    o.colors = Palette::Multi(MultiPalette::Python);
    // Colour by a stable hash of the name, never by inferno's random generator.
    o.hash = false;
    o.deterministic = true;
    o.count_name = "samples".to_string();
    o.name_type = "Frame:".to_string();
    o
}

/// Writes the SVG. Fails (with `InvalidData`) when the profile has no samples to draw.
fn write<W: Write>(p: &Profile, w: W) -> io::Result<()> {
    let lines = collapsed::lines(p);
    if lines.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "the profile has no samples to draw a flame graph from",
        ));
    }
    let mut opts = options(p);
    inferno_fg::from_lines(&mut opts, lines.iter().map(String::as_str), w)
}

/// The allocation flame graph (`--memory`), whose widths are KiB allocated. Fails (with
/// `InvalidData`) when the profile has no memory data or no allocation to draw.
pub fn render_memory(p: &Profile) -> io::Result<Vec<u8>> {
    let lines = collapsed::memory_lines(p).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            "the profile has no memory data (recorded with `run`, without --cpu-only)",
        )
    })?;
    if lines.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "the profile has no sampled allocations to draw",
        ));
    }
    let mut opts = options(p);
    opts.title = format!("{} (memory allocated)", title(p));
    opts.count_name = "KiB allocated".to_string();
    let mut out = Vec::new();
    inferno_fg::from_lines(&mut opts, lines.iter().map(String::as_str), &mut out)?;
    Ok(out)
}

/// The SVG's bytes (UTF-8).
pub fn render(p: &Profile) -> io::Result<Vec<u8>> {
    let mut out = Vec::new();
    write(p, &mut out)?;
    Ok(out)
}
