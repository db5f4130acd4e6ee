//! The aggregated profile: what a recording produces and every renderer consumes.
//!
//! Owns: [`Aggregator`] (folds samples into per-line / per-function / per-stack totals as
//! they arrive, so memory stays bounded however long the run) and [`Profile`] (the finished,
//! serializable result, whose JSON form is documented in docs/profile-json.md).
//! Must not: read process memory or format output.

mod frame;
mod gpu;

use crate::IdMap;
pub(crate) use frame::charged_frame;
pub use frame::{Frame, Name};
pub use gpu::{GpuDevice, GpuStack, GpuSummary, LineGpu};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// Version of the profile JSON schema (docs/profile-json.md).
pub const PROFILE_SCHEMA_VERSION: u32 = 2;

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
}

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
    fn add(&mut self, o: &Split) {
        self.python_s += o.python_s;
        self.native_s += o.native_s;
        self.system_s += o.system_s;
    }
}

/// A function: its file and its name.
type FunctionKey = (Name, Name);

/// One full stack's samples and time, split, by the thread that saw it. A stack is seen by
/// one thread or a few: a list is enough.
type StackThreads = Vec<StackThread>;

/// A stack's samples and time as one thread saw them.
#[derive(Debug, Clone, Copy)]
struct StackThread {
    /// The thread's kernel id (None: not known).
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
    /// None: no line seen yet.
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
    /// Native seconds of a line by the native function they were spent in (function,
    /// module): `--native` recordings only.
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
        self.thread_samples += 1;
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
        // Look up by slice first: the stack is copied only the first time it is seen.
        let per = match self.stacks.get_mut(s.frames) {
            Some(per) => per,
            None => self.stacks.entry(s.frames.to_vec()).or_default(),
        };
        add_to_stack(per, s.native_id, 1, &split);
        if let Some(tid) = s.native_id {
            let t = self.threads.entry(tid).or_insert_with(|| ThreadAcc {
                name: s.thread_name.clone(),
                ..ThreadAcc::default()
            });
            t.split.add(&split);
            t.samples += 1;
        }
    }

    /// Adds everything `other` folded (another process of the same program): times are
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
        self.thread_samples += other.thread_samples;
    }

    /// Total seconds attributed.
    pub(crate) fn total_s(&self) -> f64 {
        // Folded from +0.0: an empty f64 sum is -0.0, which prints as "-0".
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
            .map(|(tid, t)| ThreadProfile {
                native_id: *tid,
                name: t.name.clone(),
                samples: t.samples,
                cpu_python_pct: pct(t.split.python_s),
                cpu_native_pct: pct(t.split.native_s),
                cpu_system_pct: pct(t.split.system_s),
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

/// Facts about the recording, filled by the sampler.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ProfileMeta {
    /// The command line that was profiled (or the process's, for attach).
    pub program: String,
    pub pid: i32,
    pub python_version: String,
    pub duration_s: f64,
    /// Sampling ticks taken.
    pub samples: u64,
    /// Ticks that were due but not taken (the profiler fell behind).
    pub missed_samples: u64,
    /// Thread stacks that could not be read consistently, by reason.
    pub errors: u64,
    /// Thread stacks read with the thread paused, after reads without pausing could not be
    /// validated (they changed too fast); 0 in `--blocking` mode, where every read pauses.
    #[serde(default)]
    pub paused_reads: u64,
    /// Sampling ticks left without a sample to keep such pauses at most 200 a second
    /// (stacks that change too fast to read without pausing, at rates above 200 Hz).
    #[serde(default)]
    pub thinned_samples: u64,
    /// The most sampling ticks a second that pause the target (above it, ticks are
    /// thinned: `thinned_samples`); absent in profiles recorded before it was kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused_max_hz: Option<f64>,
    pub rate_hz: f64,
    pub requested_rate_hz: f64,
    /// What time counts.
    pub mode: TimeMode,
    /// Whether stdlib and site-packages frames were kept (`--profile-all`).
    pub profile_all: bool,
    /// A free-threaded build (no GIL) ran the program (or one of its processes).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub free_threaded: bool,
    /// Set when time could not be split into Python and native (no table of CALL opcodes
    /// for the interpreter's version): why. Lines' time is then all in `cpu_python_pct`,
    /// which means "Python or native" and is shown so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub split_unavailable: Option<String>,
    /// Thread samples of threads that had not run since their last read, and so were not
    /// read again (their stack is that read's).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub unchanged_reads: u64,
    /// Samples whose reading of CPU times read only the threads that ran lately: the
    /// process's CPU clock showed that no other thread had run (see how-it-works). The
    /// others read every thread's.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub short_cpu_reads: u64,
    /// Thread samples left for a later sample: more threads ran than a sample walks (a
    /// pool starting or ending at once; see how-it-works).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub deferred_reads: u64,
    /// The sampler gave way to the program (it ran under `SCHED_IDLE` while it read without
    /// stopping it; see how-it-works): how often it took the normal policy back because
    /// it could not run for a while (every CPU busy). Absent: it did not give way.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gave_way_boosts: Option<u64>,
    /// Recorded with native frames (`--native`): how their merge with the Python frames
    /// went.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub native: Option<NativeMeta>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// How a `--native` recording's thread samples merged their native frames with their
/// Python frames. An unmerged sample keeps its Python frames (and its time): nothing is
/// guessed.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NativeMeta {
    pub merged_samples: u64,
    pub unmerged_samples: u64,
    /// merged / (merged + unmerged), percent (100 when there was no sample).
    pub merge_rate_pct: f64,
    /// Why samples did not merge, with how many each (addresses in the reasons elided).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub unmerged_reasons: std::collections::BTreeMap<String, u64>,
}

/// What time a profile counts (`--wall` or not).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TimeMode {
    /// Time on a CPU only; system is time in the kernel.
    #[default]
    Cpu,
    /// All elapsed time; system also holds time off the CPU.
    Wall,
}

impl std::fmt::Display for TimeMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            TimeMode::Cpu => "cpu",
            TimeMode::Wall => "wall",
        })
    }
}

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

/// A line's memory: what it allocated (sampled), how much of it the interpreter itself
/// allocated, its live footprint's peak and mean, its footprint over time, and the bytes it
/// copied per second of the program.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LineMemory {
    pub mem_alloc_mb: f64,
    pub mem_python_pct: f64,
    pub mem_peak_mb: f64,
    pub mem_avg_mb: f64,
    /// The line's live footprint (MB) in equal slices of the run, oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mem_timeline: Vec<f64>,
    pub copy_mb_s: f64,
    /// `--native`: the native functions its sampled allocations came from (the innermost
    /// frame of each handshake's stack, the allocation machinery's frames dropped), most
    /// bytes first, at most [`NATIVE_FUNCTIONS_PER_LINE`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mem_native_functions: Vec<NativeAllocation>,
}

/// A native function's share of a line's allocations.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NativeAllocation {
    /// Its symbol (demangled), or `module+0xSTART` when it has none.
    pub function: String,
    /// The file name of its module.
    pub module: String,
    /// MB of the sampled allocations it made (each sampled window's bytes, as the line's
    /// `mem_alloc_mb`).
    pub mb: f64,
}

impl LineMemory {
    pub(crate) fn is_empty(&self) -> bool {
        self.mem_alloc_mb == 0.0 && self.copy_mb_s == 0.0 && self.mem_peak_mb == 0.0
    }
}

/// The program's memory, when it was recorded (`run` without `--cpu-only`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MemorySummary {
    /// Peak of the sampled live footprint, MB.
    pub peak_mb: f64,
    /// (seconds since start, footprint MB), oldest first.
    pub timeline: Vec<[f64; 2]>,
    /// Allocation bytes sampled, MB, and the share of them the interpreter allocated.
    pub alloc_mb: f64,
    pub python_pct: f64,
    pub copy_mb: f64,
    /// Lines whose sampled allocations were rarely freed while the footprint grew.
    pub leaks: Vec<Leak>,
    /// The sampling windows, bytes.
    pub window_bytes: u64,
    pub copy_window_bytes: u64,
    /// Events lost because the ring was full, and handshakes the program gave up on.
    pub dropped_events: u64,
    pub handshake_timeouts: u64,
    /// Handshakes answered (allocations tied to their line while their thread waited), and
    /// the program's time spent waiting for those answers, ms (all threads together).
    #[serde(default)]
    pub handshakes: u64,
    #[serde(default)]
    pub handshake_wait_ms: f64,
    /// Every distinct full stack that allocated, with its bytes (the allocation flame
    /// graph), most first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stacks: Vec<MemoryStack>,
    /// `attach` loaded our library into the process: memory is counted from the attach on
    /// (what it held before is not attributed to lines; the footprint starts at its C heap
    /// in use then).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub since_attach: bool,
    /// `--native`: how many handshakes' stacks got their native frames, and how many kept
    /// their Python frames alone (with why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub native: Option<MemoryNativeMeta>,
}

/// The native stacks of a `--native` recording's allocations, read at the handshakes.
/// Events sent without waiting keep Python frames and are not counted here.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MemoryNativeMeta {
    pub native_stacks: u64,
    pub python_only_stacks: u64,
    /// Why stacks kept their Python frames alone, with how many each.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub python_only_reasons: std::collections::BTreeMap<String, u64>,
}

/// A full stack (innermost first) and the bytes its sampled allocation windows stand for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemoryStack {
    pub frames: Vec<Frame>,
    /// KiB allocated (rounded).
    pub alloc_kib: u64,
}

/// A likely leak.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Leak {
    pub filename: String,
    pub line: u32,
    /// Laplace's rule of succession: 1 − (frees + 1) / (allocations + 2).
    pub likelihood: f64,
    /// Growth of the program's footprint over the run, MB/s.
    pub growth_mb_s: f64,
    pub sampled_allocs: u64,
    pub sampled_frees: u64,
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
    /// not lines of `lines` themselves, ascending: a report shows them around its lines
    /// from the profile alone (the file may be gone, or another by now).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub context: Vec<SourceLine>,
    /// The file's whole text, line 1 first, when it has at most [`FULL_SOURCE_MAX_LINES`]
    /// lines and [`FULL_SOURCE_MAX_BYTES`] bytes (empty otherwise, and in profiles written
    /// before it existed): the HTML report's "all lines" view shows it.
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

    /// Takes what the profile shows of the file's text `src` (its lines, first line first):
    /// the source of each of its lines that has none yet, and of the lines around them
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

    /// The file's text as far as the profile knows it: line `n` at index `n - 1`, empty
    /// where it carries nothing; None when it carries no text at all. Lines past
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
    /// The kernel thread id (TID) of the thread that saw it: the same frames seen by two
    /// threads are two stacks. None when not known, and in profiles written before it was
    /// kept (their stacks merge every thread).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub native_id: Option<i32>,
}

/// One thread's share (`--threads`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ThreadProfile {
    pub native_id: i32,
    pub name: Option<String>,
    pub samples: u64,
    pub cpu_python_pct: f64,
    pub cpu_native_pct: f64,
    pub cpu_system_pct: f64,
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
    /// none; the second value is the file's index when the line was added (its source is then
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

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(f: &str, line: u32) -> Frame {
        Frame {
            function: f.into(),
            filename: "/app/main.py".into(),
            line: Some(line),
            native: false,
        }
    }

    #[test]
    fn percentages_are_of_the_total() {
        let mut agg = Aggregator::new();
        let a = [frame("a", 3), frame("<module>", 10)];
        let b = [frame("b", 7), frame("<module>", 11)];
        for (frames, act, user, sys) in [
            (&a[..], Activity::Python, 0.03, 0.0),
            (&b[..], Activity::Native, 0.01, 0.0),
        ] {
            let s = ThreadSample {
                frames,
                activity: act,
                user_s: user,
                system_s: sys,
                idle_s: 0.0,
                native_id: Some(1),
                thread_name: None,
            };
            agg.add(&s, frames.first());
        }
        // A sample that stands for no time is not counted.
        agg.add(
            &ThreadSample {
                frames: &a,
                activity: Activity::Python,
                user_s: 0.0,
                system_s: 0.0,
                idle_s: 0.0,
                native_id: Some(1),
                thread_name: None,
            },
            a.first(),
        );
        let p = agg.finish(ProfileMeta::default(), &mut |_| None);
        let f = &p.files[0];
        let l3 = f.lines.iter().find(|l| l.line == 3).unwrap();
        let l7 = f.lines.iter().find(|l| l.line == 7).unwrap();
        assert!((l3.cpu_python_pct - 75.0).abs() < 1e-9);
        assert!((l7.cpu_native_pct - 25.0).abs() < 1e-9);
        assert_eq!(p.stacks.len(), 2);
        assert_eq!(p.stacks.iter().map(|s| s.samples).sum::<u64>(), 2);
        // Each stack keeps its own split, adding up to its seconds.
        let sa = p.stacks.iter().find(|s| s.frames == a).unwrap();
        let sb = p.stacks.iter().find(|s| s.frames == b).unwrap();
        let (ja, jb) = (sa.split.unwrap(), sb.split.unwrap());
        assert!((ja.python_s - 0.03).abs() < 1e-12 && ja.native_s == 0.0);
        assert!((jb.native_s - 0.01).abs() < 1e-12 && jb.python_s == 0.0);
        assert!((ja.total() - sa.seconds).abs() < 1e-12);
        assert!((f.cpu_pct - 100.0).abs() < 1e-9);
    }

    #[test]
    fn a_lines_native_time_is_listed_by_its_innermost_native_function() {
        let line = frame("work", 7);
        let alpha = Frame::of_native("burn_alpha".into(), Some("burnext.so"));
        let beta = Frame::of_native("burn_beta".into(), Some("burnext.so"));
        let burn = Frame::of_native("burn".into(), Some("burnext.so"));
        let in_alpha = [alpha, burn.clone(), line.clone()];
        let in_beta = [beta, burn, line.clone()];
        let python = [line];
        let sample = |frames, activity, user_s| ThreadSample {
            frames,
            activity,
            user_s,
            system_s: 0.001,
            idle_s: 0.0,
            native_id: Some(1),
            thread_name: None,
        };
        let mut aggs = [Aggregator::new(), Aggregator::new()];
        for (i, frames, activity, user_s) in [
            (0, &in_alpha[..], Activity::Native, 0.03),
            (1, &in_alpha[..], Activity::Native, 0.03),
            (0, &in_beta[..], Activity::Native, 0.02),
            // Python time of the line, and a native frame sampled as Python (the CALL
            // heuristic decides): neither is a native function's time.
            (0, &python[..], Activity::Python, 0.01),
            (1, &in_beta[..], Activity::Python, 0.01),
        ] {
            let s = sample(frames, activity, user_s);
            aggs[i].add(&s, crate::profile::charged_frame(frames, false));
        }
        let [mut one, other] = aggs;
        one.absorb(&other);
        let p = one.finish(ProfileMeta::default(), &mut |_| None);
        let l = &p.files[0].lines[0];
        assert_eq!(l.line, 7);
        let total = 0.03 + 0.03 + 0.02 + 0.01 + 0.01 + 5.0 * 0.001;
        let listed: Vec<(&str, &str, f64)> = l
            .native_functions
            .iter()
            .map(|n| (n.function.as_str(), n.module.as_str(), n.pct))
            .collect();
        assert_eq!(listed.len(), 2, "{listed:?}");
        assert_eq!((listed[0].0, listed[0].1), ("burn_alpha", "burnext.so"));
        assert!((listed[0].2 - 100.0 * 0.06 / total).abs() < 1e-9);
        assert_eq!(listed[1].0, "burn_beta");
        assert!((listed[1].2 - 100.0 * 0.02 / total).abs() < 1e-9);
        // They add up to the line's native share.
        assert!((listed[0].2 + listed[1].2 - l.cpu_native_pct).abs() < 1e-9);
    }

    #[test]
    fn stacks_are_kept_by_thread() {
        let mut agg = Aggregator::new();
        let a = [frame("a", 3)];
        for (tid, user) in [
            (Some(1), 0.01),
            (Some(2), 0.02),
            (Some(1), 0.03),
            (None, 0.04),
        ] {
            agg.add(
                &ThreadSample {
                    frames: &a,
                    activity: Activity::Python,
                    user_s: user,
                    system_s: 0.0,
                    idle_s: 0.0,
                    native_id: tid,
                    thread_name: None,
                },
                a.first(),
            );
        }
        let mut other = Aggregator::new();
        other.add(
            &ThreadSample {
                frames: &a,
                activity: Activity::Native,
                user_s: 0.05,
                system_s: 0.0,
                idle_s: 0.0,
                native_id: Some(2),
                thread_name: None,
            },
            a.first(),
        );
        agg.absorb(&other);
        let p = agg.finish(ProfileMeta::default(), &mut |_| None);
        let got: Vec<(Option<i32>, u64, f64, f64)> = p
            .stacks
            .iter()
            .map(|s| {
                let sp = s.split.unwrap();
                (s.native_id, s.samples, sp.python_s, sp.native_s)
            })
            .collect();
        assert_eq!(
            got,
            [
                (Some(1), 2, 0.04, 0.0),
                (Some(2), 2, 0.02, 0.05),
                (None, 1, 0.04, 0.0)
            ]
        );
        assert!((p.total_s - 0.15).abs() < 1e-12);
        // Stacks saved without a thread read back as None.
        let json = r#"{"frames": [], "samples": 3, "seconds": 0.5}"#;
        let old: StackProfile = serde_json::from_str(json).unwrap();
        assert_eq!((old.native_id, old.split), (None, None));
    }

    #[test]
    fn a_line_numbered_zero_gets_no_source_and_no_panic() {
        let mut agg = Aggregator::new();
        let frames = [frame("f", 0)];
        agg.add(
            &ThreadSample {
                frames: &frames,
                activity: Activity::Python,
                user_s: 0.01,
                system_s: 0.0,
                idle_s: 0.0,
                native_id: Some(1),
                thread_name: None,
            },
            frames.first(),
        );
        let p = agg.finish(ProfileMeta::default(), &mut |_| Some(vec!["x = 1".into()]));
        assert_eq!(p.files[0].lines[0].line, 0);
        assert_eq!(p.files[0].lines[0].source, "");
        assert_eq!(p.files[0].full_source, vec!["x = 1".to_string()]);
    }

    #[test]
    fn full_source_is_kept_only_for_files_within_bounds() {
        let mut f = FileProfile::new("/a.py");
        f.take_source(&["a".to_string(), "b".to_string()]);
        assert_eq!(f.full_source, vec!["a", "b"]);
        let big = vec!["x".to_string(); FULL_SOURCE_MAX_LINES + 1];
        f.take_source(&big);
        assert!(f.full_source.is_empty());
        let wide = vec!["y".repeat(FULL_SOURCE_MAX_BYTES)];
        f.take_source(&wide);
        assert!(f.full_source.is_empty());
    }
}
