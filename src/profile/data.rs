//! The finished profile's top level: what one recording of a program holds.
//!
//! Owns: [`Profile`] and its schema version, the stacks, threads and processes it lists,
//! and the time [`Split`] that lines, functions, threads and stacks share.
//! Must not: fold samples (`aggregate` does) or format output.

use super::{FileProfile, Frame, GpuSummary, LineProfile, MemorySummary, ProfileMeta};
use serde::{Deserialize, Serialize};

/// Version of the profile JSON schema (docs/profile-json.md).
pub const PROFILE_SCHEMA_VERSION: u32 = 2;

/// Time split of a line, a function or a thread.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Split {
    pub python_s: f64,
    pub native_s: f64,
    pub system_s: f64,
}

impl Split {
    pub(crate) fn total(&self) -> f64 {
        self.python_s + self.native_s + self.system_s
    }
    pub(super) fn add(&mut self, o: &Split) {
        self.python_s += o.python_s;
        self.native_s += o.native_s;
        self.system_s += o.system_s;
    }
}

/// A full stack (innermost first) and how often it was seen.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StackProfile {
    pub frames: Vec<Frame>,
    pub samples: u64,
    /// Seconds of time this stack stands for.
    pub seconds: f64,
    /// Those seconds split into Python, native and system time (they add up to `seconds`);
    /// None in profiles written before the split was kept per stack.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub split: Option<Split>,
    /// The kernel thread id (TID) of the thread that saw it, so the same frames seen by two
    /// threads are two stacks. None when not known, and in profiles written before it was
    /// kept (their stacks merge every thread).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub native_id: Option<i32>,
}

/// One thread's share (`--threads`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ThreadProfile {
    pub native_id: i32,
    /// The OS's name of the thread (`/proc/PID/task/TID/comm`).
    pub name: Option<String>,
    /// The name the program gave it (`threading.Thread(name=...)`), as last read; None
    /// when not known (and in profiles written before it was kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub python_name: Option<String>,
    /// The ids of the interpreters it was sampled in (0: the main one), ascending. Empty
    /// when not known (profiles written before they were kept).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub interpreters: Vec<i64>,
    pub samples: u64,
    pub cpu_python_pct: f64,
    pub cpu_native_pct: f64,
    pub cpu_system_pct: f64,
}

impl ThreadProfile {
    /// The thread as a report names it: the name the program gave it, then the OS's in
    /// parentheses (`worker-3 (python3)`), either alone when the other is not known.
    pub fn display_name(&self) -> Option<String> {
        match (&self.python_name, &self.name) {
            (Some(p), Some(o)) => Some(format!("{p} ({o})")),
            (p, o) => p.clone().or_else(|| o.clone()),
        }
    }
}

/// What a thread is known by, kept while a recording runs (`Aggregator::label_thread`)
/// and given to its [`ThreadProfile`] at the end.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct ThreadLabel {
    pub(crate) os_name: Option<String>,
    pub(crate) python_name: Option<String>,
    /// Ascending, without repeats.
    pub(crate) interpreters: Vec<i64>,
}

/// A finished profile.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Profile {
    pub schema_version: u32,
    #[serde(flatten)]
    pub meta: ProfileMeta,
    /// Seconds attributed in all (the 100% of every percentage).
    pub total_s: f64,
    pub files: Vec<FileProfile>,
    pub stacks: Vec<StackProfile>,
    pub threads: Vec<ThreadProfile>,
    /// Every process profiled, when the program was more than one (`run` follows child
    /// processes); empty for a single process.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub processes: Vec<ProcessProfile>,
    /// Memory accounting (schema 2); absent when it was not recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemorySummary>,
    /// GPU figures, or why there are none (absent with `--no-gpu`, and in profiles recorded
    /// before GPUs were watched).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<GpuSummary>,
}

impl Profile {
    /// Line `line` of `file`, added with no time (and its file with it) when the profile has
    /// none. The second value is the file's index when the line was added (its source is then
    /// to be read again: [`Profile::take_sources`]).
    pub(crate) fn line_mut(&mut self, file: &str, line: u32) -> (&mut LineProfile, Option<usize>) {
        let fi = match self.files.iter().position(|f| f.filename == file) {
            Some(i) => i,
            None => {
                self.files.push(FileProfile::new(file));
                self.files.len() - 1
            }
        };
        let f = &mut self.files[fi];
        let added = match f.lines.iter().position(|l| l.line == line) {
            Some(_) => None,
            None => {
                f.lines.push(LineProfile {
                    line,
                    source: String::new(),
                    cpu_python_pct: 0.0,
                    cpu_native_pct: 0.0,
                    cpu_system_pct: 0.0,
                    memory: None,
                    gpu: None,
                    native_functions: Vec::new(),
                });
                f.lines.sort_by_key(|l| l.line);
                Some(fi)
            }
        };
        let l = f
            .lines
            .iter_mut()
            .find(|l| l.line == line)
            .expect("the line was just found or added");
        (l, added)
    }

    /// The source text and context of the files at `indices` (files that gained lines).
    pub(crate) fn take_sources(
        &mut self,
        indices: impl IntoIterator<Item = usize>,
        source: &mut dyn FnMut(&str) -> Option<Vec<String>>,
    ) {
        for fi in indices {
            let f = &mut self.files[fi];
            if let Some(src) = source(&f.filename) {
                f.take_source(&src);
            }
        }
    }
}

/// One process of a profiled program.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProcessProfile {
    pub pid: i32,
    /// Its command line.
    pub command: String,
    pub python_version: String,
    /// Samples taken of it.
    pub samples: u64,
    /// Its share of the program's time, in percent.
    pub cpu_pct: f64,
    /// Peak of its own sampled live footprint, MB (with memory accounting).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mem_peak_mb: Option<f64>,
    /// MB it allocated (its sampled windows; with memory accounting).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mem_alloc_mb: Option<f64>,
    /// Its share of the program's GPU busy time, percent (when a GPU was used).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_pct: Option<f64>,
    /// The most GPU memory it held at one poll, MB (when a GPU was used).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_mem_peak_mb: Option<f64>,
}
