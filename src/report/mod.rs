//! Renderers: turn snapshots and profiles into text, JSON and the other formats.
//!
//! Must not: read process memory or sample. Data flows in only.

pub mod collapsed;
pub mod dump;
pub mod flamegraph;
pub mod html;
pub mod live;
pub(crate) mod pprof;
pub mod profile_json;
pub mod speedscope;
pub mod terminal;

use crate::profile::Profile;
use std::fmt;
use std::path::Path;

/// An output format of a profile.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Scalene-style line table for a terminal.
    Terminal,
    /// The profile itself (docs/profile-json.md); `scalene-rs view` reads it back.
    Json,
    /// Flame-graph SVG.
    Flamegraph,
    /// speedscope's JSON file format.
    Speedscope,
    /// Brendan Gregg's collapsed stacks.
    Collapsed,
    /// pprof's gzip-compressed protobuf (`go tool pprof`; docs/pprof.md).
    Pprof,
    /// A self-contained interactive HTML page (docs/html.md).
    Html,
}

impl Format {
    /// Whether the format is binary (not for a terminal: it needs `-o FILE`).
    pub fn is_binary(self) -> bool {
        self == Format::Pprof
    }

    /// The format a file name asks for.
    pub fn from_path(p: &Path) -> Format {
        let name = p
            .file_name()
            .map(|n| n.to_string_lossy().to_lowercase())
            .unwrap_or_default();
        if name.ends_with(".speedscope.json") {
            Format::Speedscope
        } else if name.ends_with(".json") {
            Format::Json
        } else if name.ends_with(".pb.gz") || name.ends_with(".pprof") {
            Format::Pprof
        } else if name.ends_with(".html") || name.ends_with(".htm") {
            Format::Html
        } else if name.ends_with(".svg") {
            Format::Flamegraph
        } else if name.ends_with(".collapsed") || name.ends_with(".txt") {
            Format::Collapsed
        } else {
            Format::Terminal
        }
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Format::Terminal => "terminal report",
            Format::Json => "profile JSON",
            Format::Flamegraph => "flame graph SVG",
            Format::Speedscope => "speedscope JSON",
            Format::Collapsed => "collapsed stacks",
            Format::Pprof => "pprof profile",
            Format::Html => "HTML report",
        })
    }
}

/// How to render.
#[derive(Debug, Clone)]
pub struct RenderOptions {
    /// ANSI colours (terminal format only).
    pub color: bool,
    /// Terminal width in columns.
    pub width: usize,
    /// Per-thread breakdown (terminal format).
    pub threads: bool,
    /// Flame graph and collapsed stacks of memory allocated rather than of time.
    pub memory: bool,
}

/// Renders `profile` in `format`.
/// Errors: a memory rendering of a profile without memory data, a flame graph of an empty
/// profile (`InvalidData`, with what is missing).
pub fn render(profile: &Profile, format: Format, opts: &RenderOptions) -> std::io::Result<Vec<u8>> {
    Ok(match format {
        Format::Terminal => {
            let t = terminal::TerminalOptions {
                color: opts.color,
                width: opts.width,
                context: crate::profile::SOURCE_CONTEXT,
                threads: opts.threads,
            };
            // The profile's own text only, because the files may be gone, or other files by
            // now.
            terminal::render(profile, &t, &mut |file| {
                profile
                    .files
                    .iter()
                    .find(|f| f.filename == file)
                    .and_then(|f| f.known_source())
            })
            .into_bytes()
        }
        Format::Json => profile_json::to_json(profile).into_bytes(),
        Format::Flamegraph if opts.memory => flamegraph::render_memory(profile)?,
        Format::Flamegraph => flamegraph::render(profile)?,
        Format::Collapsed if opts.memory => {
            let lines = collapsed::memory_lines(profile).ok_or_else(|| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    "the profile has no memory data (recorded with `run`, without --cpu-only)",
                )
            })?;
            let mut s = lines.join("\n");
            if !s.is_empty() {
                s.push('\n');
            }
            s.into_bytes()
        }
        Format::Speedscope => speedscope::render(profile).into_bytes(),
        Format::Collapsed => collapsed::render(profile).into_bytes(),
        // Time and, when recorded, memory are both in it (sample types), so --memory changes
        // nothing.
        Format::Pprof => pprof::render(profile)?,
        Format::Html => html::render(profile),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_from_extensions() {
        for (name, f) in [
            ("p.json", Format::Json),
            ("p.speedscope.json", Format::Speedscope),
            ("P.SVG", Format::Flamegraph),
            ("p.collapsed", Format::Collapsed),
            ("p.txt", Format::Collapsed),
            ("profile.pb.gz", Format::Pprof),
            ("cpu.PPROF", Format::Pprof),
            ("p.gz", Format::Terminal),
            ("report.html", Format::Html),
            ("Report.HTM", Format::Html),
            ("report", Format::Terminal),
        ] {
            assert_eq!(Format::from_path(Path::new(name)), f, "{name}");
        }
    }
}
