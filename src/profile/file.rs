//! One source file's part of a profile: its lines, its functions and its text.
//!
//! Owns: [`FileProfile`], [`LineProfile`], [`FunctionProfile`], a line's native functions
//! ([`NativeFunction`]) and how much source text a profile keeps ([`SourceLine`], the
//! bounds on it).
//! Must not: read files itself (the text is handed in) or fold samples.

use super::{LineGpu, LineMemory};
use serde::{Deserialize, Serialize};

/// One line's share of the program's time, in percent of the total.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LineProfile {
    pub line: u32,
    pub source: String,
    pub cpu_python_pct: f64,
    pub cpu_native_pct: f64,
    pub cpu_system_pct: f64,
    /// Memory and copy accounting of the line (schema 2; absent when memory was not
    /// recorded).
    #[serde(flatten, default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<LineMemory>,
    /// GPU figures of the line (absent when the program used no GPU we could see).
    #[serde(flatten, default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<LineGpu>,
    /// `--native`: the native functions the line's native time was spent in (the innermost
    /// native frame of each sample), most first, at most [`NATIVE_FUNCTIONS_PER_LINE`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub native_functions: Vec<NativeFunction>,
}

/// Most native functions kept per line.
pub const NATIVE_FUNCTIONS_PER_LINE: usize = 8;

/// A native function's share of a line's native time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NativeFunction {
    /// Its symbol (demangled), or `module+0xSTART` when it has none.
    pub function: String,
    /// The file name of its module (`libz.so.1`).
    pub module: String,
    /// Its time, in percent of the program's total like the line's `cpu_native_pct` (the
    /// functions of a line add up to at most that).
    pub pct: f64,
}

impl LineProfile {
    pub(crate) fn total_pct(&self) -> f64 {
        self.cpu_python_pct + self.cpu_native_pct + self.cpu_system_pct
    }
}

/// One function's share.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FunctionProfile {
    pub function: String,
    /// The lowest line of it that was sampled.
    pub first_line: Option<u32>,
    pub cpu_python_pct: f64,
    pub cpu_native_pct: f64,
    pub cpu_system_pct: f64,
}

impl FunctionProfile {
    pub(crate) fn total_pct(&self) -> f64 {
        self.cpu_python_pct + self.cpu_native_pct + self.cpu_system_pct
    }
}

/// One file's lines and functions.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FileProfile {
    pub filename: String,
    /// Sum of its lines' shares.
    pub cpu_pct: f64,
    pub lines: Vec<LineProfile>,
    pub functions: Vec<FunctionProfile>,
    /// The source text of the lines within [`SOURCE_CONTEXT`] of a line of `lines` that are
    /// not lines of `lines` themselves, ascending. A report shows them around its lines
    /// from the profile alone (the file may be gone, or another by now).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub context: Vec<SourceLine>,
    /// The file's whole text, line 1 first, when it has at most [`FULL_SOURCE_MAX_LINES`]
    /// lines and [`FULL_SOURCE_MAX_BYTES`] bytes (empty otherwise, and in profiles written
    /// before it existed). The HTML report's "all lines" view shows it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub full_source: Vec<String>,
}

/// A file's whole text is kept ([`FileProfile::full_source`]) up to this many lines...
pub const FULL_SOURCE_MAX_LINES: usize = 20_000;
/// ...and this many bytes.
pub const FULL_SOURCE_MAX_BYTES: usize = 1 << 20;

/// The highest line [`FileProfile::known_source`] places (a vector this long of empty
/// strings is 24 MB).
pub(crate) const KNOWN_SOURCE_MAX_LINE: u32 = 1_000_000;

/// One line of a source file that the profile carries for context.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceLine {
    pub line: u32,
    pub source: String,
}

/// How many lines above and below each of its lines a profile keeps the source of.
pub(crate) const SOURCE_CONTEXT: usize = 2;

impl FileProfile {
    pub fn new(filename: &str) -> FileProfile {
        FileProfile {
            filename: filename.to_string(),
            cpu_pct: 0.0,
            lines: Vec::new(),
            functions: Vec::new(),
            context: Vec::new(),
            full_source: Vec::new(),
        }
    }

    /// Takes what the profile shows of the file's text `src` (its lines, first line first).
    /// That is the source of each of its lines that has none yet, and of the lines around them
    /// ([`FileProfile::context`], made anew).
    pub fn take_source(&mut self, src: &[String]) {
        let text = |n: u32| (n as usize).checked_sub(1).and_then(|i| src.get(i));
        for l in &mut self.lines {
            // Line 0 exists (code without a source line, e.g. generated shims).
            if l.source.is_empty() {
                if let Some(t) = text(l.line) {
                    l.source = t.clone();
                }
            }
        }
        let own: std::collections::BTreeSet<u32> = self.lines.iter().map(|l| l.line).collect();
        let mut wanted = std::collections::BTreeSet::new();
        let ctx = SOURCE_CONTEXT as u32;
        for &n in &own {
            for m in n.saturating_sub(ctx).max(1)..=n.saturating_add(ctx) {
                if !own.contains(&m) && text(m).is_some() {
                    wanted.insert(m);
                }
            }
        }
        self.context = wanted
            .into_iter()
            .map(|line| SourceLine {
                line,
                source: text(line).cloned().unwrap_or_default(),
            })
            .collect();
        let bytes: usize = src.iter().map(|l| l.len() + 1).sum();
        self.full_source = if src.len() <= FULL_SOURCE_MAX_LINES && bytes <= FULL_SOURCE_MAX_BYTES {
            src.to_vec()
        } else {
            Vec::new()
        };
    }

    /// The file's text as far as the profile knows it, with line `n` at index `n - 1`, empty
    /// where it carries nothing. None when it carries no text at all. Lines past
    /// [`KNOWN_SOURCE_MAX_LINE`] are left out (a damaged profile's line 4294967295 must not
    /// ask for a vector of four billion strings; the line's own `source` still shows).
    pub(crate) fn known_source(&self) -> Option<Vec<String>> {
        let known = self
            .lines
            .iter()
            .filter(|l| !l.source.is_empty())
            .map(|l| (l.line, &l.source))
            .chain(self.context.iter().map(|c| (c.line, &c.source)));
        let mut out: Vec<String> = Vec::new();
        for (n, text) in known {
            let Some(i) = (n as usize).checked_sub(1) else {
                continue;
            };
            if n > KNOWN_SOURCE_MAX_LINE {
                continue;
            }
            if out.len() <= i {
                out.resize(i + 1, String::new());
            }
            out[i] = text.clone();
        }
        (!out.is_empty()).then_some(out)
    }
}
