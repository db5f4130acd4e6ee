//! Folding thread samples into a profile while a recording runs.
//!
//! Owns: [`Aggregator`] (per-line, per-function, per-stack and per-thread totals, kept as
//! samples arrive so memory stays bounded however long the run), its input
//! ([`ThreadSample`], [`Activity`]) and [`Aggregator::finish`], which sorts the output.
//! Must not: read process memory or format output.

use super::{
    FileProfile, Frame, FunctionProfile, LineProfile, Name, NativeFunction, Profile, ProfileMeta,
    Split, StackProfile, ThreadLabel, ThreadProfile, NATIVE_FUNCTIONS_PER_LINE,
    PROFILE_SCHEMA_VERSION,
};
use crate::IdMap;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// How a thread was spending its time when sampled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Activity {
    /// The interpreter was executing bytecode of the top frame.
    Python,
    /// The top frame was inside a call (a C function, an extension, a blocking call).
    Native,
}

/// One observation of one thread, with the time it stands for.
#[derive(Debug, Clone)]
pub(crate) struct ThreadSample<'a> {
    /// Innermost first.
    pub(crate) frames: &'a [Frame],
    pub(crate) activity: Activity,
    /// Seconds of user CPU time since the thread's previous sample.
    pub(crate) user_s: f64,
    /// Seconds of kernel CPU time since the thread's previous sample.
    pub(crate) system_s: f64,
    /// Seconds of wall time not spent on a CPU (counted only in wall mode).
    pub(crate) idle_s: f64,
    /// Kernel TID, for the per-thread breakdown.
    pub(crate) native_id: Option<i32>,
    pub(crate) thread_name: Option<String>,
    /// It stands for its observation in the thread's sample count (each tick observes a
    /// thread once); false for the other charges of the same observation (its time off
    /// the CPU, CPU time charged where the thread ran before, a waiting task's stack).
    pub(crate) counts: bool,
}

/// A function: its file and its name.
type FunctionKey = (Name, Name);

/// One full stack's samples and time, split, by the thread that saw it. A stack is seen by
/// one thread or a few, so a list is enough.
type StackThreads = Vec<StackThread>;

/// A stack's samples and time as one thread saw them.
#[derive(Debug, Clone, Copy)]
struct StackThread {
    /// The thread's kernel id (None when not known).
    thread: Option<i32>,
    samples: u64,
    split: Split,
}

/// Adds `n` samples of `split` seen by `thread` to a stack's list.
fn add_to_stack(per: &mut StackThreads, thread: Option<i32>, n: u64, split: &Split) {
    match per.iter_mut().find(|e| e.thread == thread) {
        Some(e) => {
            e.samples += n;
            e.split.add(split);
        }
        None => per.push(StackThread {
            thread,
            samples: n,
            split: *split,
        }),
    }
}

/// A function's time and its first line seen.
#[derive(Debug, Clone, Copy, Default)]
struct FunctionAcc {
    split: Split,
    /// None when no line was seen yet.
    first_line: Option<u32>,
}

/// A thread's name, time and samples.
#[derive(Debug, Clone, Default)]
struct ThreadAcc {
    name: Option<String>,
    split: Split,
    samples: u64,
}

/// The smaller of two lines, a line being smaller than none.
fn first_of(a: Option<u32>, b: Option<u32>) -> Option<u32> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Seconds by native function (function, module).
type NativeSeconds = IdMap<(Name, Name), f64>;

/// Folds samples as they come.
#[derive(Debug, Default)]
pub(crate) struct Aggregator {
    lines: IdMap<(Name, u32), Split>,
    /// A function's time and its first line seen, by file and name.
    functions: IdMap<FunctionKey, FunctionAcc>,
    /// A full stack's samples and their time, split, by thread.
    stacks: IdMap<Vec<Frame>, StackThreads>,
    threads: IdMap<i32, ThreadAcc>,
    /// What each thread is known by (its names, its interpreters), by kernel id, as the
    /// recorder last said ([`Aggregator::label_thread`]).
    labels: IdMap<i32, ThreadLabel>,
    /// Native seconds of a line by the native function they were spent in (function,
    /// module), in `--native` recordings only.
    line_native: IdMap<(Name, u32), NativeSeconds>,
    /// Samples (thread observations) folded in.
    thread_samples: u64,
}

impl Aggregator {
    pub(crate) fn new() -> Aggregator {
        Aggregator::default()
    }

    /// Adds one thread observation. `attribution` is the frame the time is charged to (the
    /// innermost frame, or the innermost frame of the user's code when library frames are
    /// folded); `frames` is the full stack for flame graphs.
    pub(crate) fn add(&mut self, s: &ThreadSample, attribution: Option<&Frame>) {
        let split = Split {
            python_s: if s.activity == Activity::Python {
                s.user_s
            } else {
                0.0
            },
            native_s: if s.activity == Activity::Native {
                s.user_s
            } else {
                0.0
            },
            system_s: s.system_s + s.idle_s,
        };
        if split.total() <= 0.0 {
            return;
        }
        let n = u64::from(s.counts);
        self.thread_samples += n;
        if let Some(f) = attribution {
            if let Some(line) = f.line {
                self.lines
                    .entry((f.filename, line))
                    .or_default()
                    .add(&split);
                match s.frames.first() {
                    Some(leaf) if leaf.native && split.native_s > 0.0 => {
                        *self
                            .line_native
                            .entry((f.filename, line))
                            .or_default()
                            .entry((leaf.function, leaf.filename))
                            .or_default() += split.native_s;
                    }
                    _ => {}
                }
            }
            let e = self.functions.entry((f.filename, f.function)).or_default();
            e.split.add(&split);
            e.first_line = first_of(e.first_line, f.line);
        }
        // Look up by slice first, so the stack is copied only the first time it is seen.
        let per = match self.stacks.get_mut(s.frames) {
            Some(per) => per,
            None => self.stacks.entry(s.frames.to_vec()).or_default(),
        };
        // A stack counts every charge of time it gets (its CPU time, its time off the CPU,
        // as flame graphs weigh both). A thread and the profile count observations.
        add_to_stack(per, s.native_id, 1, &split);
        if let Some(tid) = s.native_id {
            let t = self.threads.entry(tid).or_insert_with(|| ThreadAcc {
                name: s.thread_name.clone(),
                ..ThreadAcc::default()
            });
            t.split.add(&split);
            t.samples += n;
        }
    }

    /// Says what thread `tid` is known by (its names, the interpreters it ran in), for its
    /// entry of the per-thread totals. The last said stands.
    pub(crate) fn label_thread(&mut self, tid: i32, label: &ThreadLabel) {
        if self.labels.get(&tid) != Some(label) {
            self.labels.insert(tid, label.clone());
        }
    }

    /// Adds everything `other` folded (another process of the same program). Times are
    /// seconds, so the sums are the program's totals.
    pub(crate) fn absorb(&mut self, other: &Aggregator) {
        for (k, v) in &other.lines {
            self.lines.entry(*k).or_default().add(v);
        }
        for (k, theirs) in &other.functions {
            let e = self.functions.entry(*k).or_default();
            e.split.add(&theirs.split);
            e.first_line = first_of(e.first_line, theirs.first_line);
        }
        for (k, theirs) in &other.stacks {
            let per = self.stacks.entry(k.clone()).or_default();
            for t in theirs {
                add_to_stack(per, t.thread, t.samples, &t.split);
            }
        }
        for (line, theirs) in &other.line_native {
            let ours = self.line_native.entry(*line).or_default();
            for (function, seconds) in theirs {
                *ours.entry(*function).or_default() += seconds;
            }
        }
        for (tid, theirs) in &other.threads {
            let e = self.threads.entry(*tid).or_insert_with(|| ThreadAcc {
                name: theirs.name.clone(),
                ..ThreadAcc::default()
            });
            e.split.add(&theirs.split);
            e.samples += theirs.samples;
        }
        for (tid, label) in &other.labels {
            self.label_thread(*tid, label);
        }
        self.thread_samples += other.thread_samples;
    }

    /// Total seconds attributed.
    pub(crate) fn total_s(&self) -> f64 {
        // Folded from +0.0, because an empty f64 sum is -0.0, which prints as "-0".
        self.stacks
            .values()
            .flatten()
            .fold(0.0, |acc, v| acc + v.split.total())
    }

    /// Finishes the profile. `source` returns a file's lines (or None when unreadable).
    pub(crate) fn finish(
        &self,
        meta: ProfileMeta,
        source: &mut dyn FnMut(&str) -> Option<Vec<String>>,
    ) -> Profile {
        let total = self.total_s();
        let pct = |s: f64| if total > 0.0 { 100.0 * s / total } else { 0.0 };
        let mut by_file: HashMap<&str, FileProfile> = HashMap::new();
        for ((file, line), split) in &self.lines {
            let fp = by_file
                .entry(file)
                .or_insert_with(|| FileProfile::new(file));
            fp.lines.push(LineProfile {
                line: *line,
                source: String::new(),
                cpu_python_pct: pct(split.python_s),
                cpu_native_pct: pct(split.native_s),
                cpu_system_pct: pct(split.system_s),
                memory: None,
                gpu: None,
                native_functions: self
                    .line_native
                    .get(&(*file, *line))
                    .map(|by| top_native(by, &pct))
                    .unwrap_or_default(),
            });
        }
        for ((file, name), acc) in &self.functions {
            let fp = by_file
                .entry(file)
                .or_insert_with(|| FileProfile::new(file));
            fp.functions.push(FunctionProfile {
                function: name.to_string(),
                first_line: acc.first_line,
                cpu_python_pct: pct(acc.split.python_s),
                cpu_native_pct: pct(acc.split.native_s),
                cpu_system_pct: pct(acc.split.system_s),
            });
        }
        let mut files: Vec<FileProfile> = by_file.into_values().collect();
        for f in &mut files {
            f.lines.sort_by_key(|l| l.line);
            f.functions.sort_by(|a, b| {
                b.total_pct()
                    .total_cmp(&a.total_pct())
                    .then_with(|| a.function.cmp(&b.function))
            });
            if let Some(src) = source(&f.filename) {
                f.take_source(&src);
            }
            f.cpu_pct = f.lines.iter().map(LineProfile::total_pct).sum();
        }
        files.sort_by(|a, b| {
            b.cpu_pct
                .total_cmp(&a.cpu_pct)
                .then_with(|| a.filename.cmp(&b.filename))
        });
        let mut stacks: Vec<StackProfile> = self
            .stacks
            .iter()
            .flat_map(|(frames, per)| {
                per.iter().map(|t| StackProfile {
                    frames: frames.clone(),
                    samples: t.samples,
                    seconds: t.split.total(),
                    split: Some(t.split),
                    native_id: t.thread,
                })
            })
            .collect();
        stacks.sort_by(|a, b| {
            b.samples
                .cmp(&a.samples)
                .then_with(|| a.frames.cmp(&b.frames))
                .then_with(|| a.native_id.cmp(&b.native_id))
        });
        let mut threads: Vec<ThreadProfile> = self
            .threads
            .iter()
            .map(|(tid, t)| {
                let label = self.labels.get(tid);
                ThreadProfile {
                    native_id: *tid,
                    name: label
                        .and_then(|l| l.os_name.clone())
                        .or_else(|| t.name.clone()),
                    python_name: label.and_then(|l| l.python_name.clone()),
                    interpreters: label.map(|l| l.interpreters.clone()).unwrap_or_default(),
                    samples: t.samples,
                    cpu_python_pct: pct(t.split.python_s),
                    cpu_native_pct: pct(t.split.native_s),
                    cpu_system_pct: pct(t.split.system_s),
                }
            })
            .collect();
        threads.sort_by_key(|t| t.native_id);
        Profile {
            schema_version: PROFILE_SCHEMA_VERSION,
            meta,
            total_s: total,
            files,
            stacks,
            threads,
            processes: Vec::new(),
            memory: None,
            gpu: None,
        }
    }
}

/// A line's native functions, most time first (then by name), at most
/// [`NATIVE_FUNCTIONS_PER_LINE`]; `pct` turns seconds into percent of the total.
fn top_native(by: &NativeSeconds, pct: &dyn Fn(f64) -> f64) -> Vec<NativeFunction> {
    let mut all: Vec<_> = by.iter().collect();
    all.sort_by(|a, b| b.1.total_cmp(a.1).then_with(|| a.0.cmp(b.0)));
    all.into_iter()
        .take(NATIVE_FUNCTIONS_PER_LINE)
        .map(|((function, module), &s)| NativeFunction {
            function: function.to_string(),
            module: module.to_string(),
            pct: pct(s),
        })
        .collect()
}
