//! Ring events → per-line memory, copy volume and leaks.
//!
//! Owns:
//! - [`MemoryAggregator`] — each sampled allocation window charged to the line that made it,
//!   the line's live footprint (a sampled allocation stands for its window's bytes until its
//!   pointer is freed), copy volume, the program's footprint over time, and the leak score;
//! - merging the aggregators of a program's processes into one
//!   ([`MemoryAggregator::merge_processes`]);
//! - merging all that into a finished [`Profile`].
//!
//! Must not: read process memory or format output.

use super::ring::{Event, What};
use crate::profile::{
    Leak, LineMemory, MemoryNativeMeta, MemoryStack, MemorySummary, NativeAllocation, Profile,
    NATIVE_FUNCTIONS_PER_LINE,
};
use crate::python::Frame;
use crate::python::MergeCounts;
use std::collections::HashMap;

const MB: f64 = 1024.0 * 1024.0;
/// Points of a line's footprint timeline in the profile.
const LINE_TIMELINE_SLICES: usize = 20;
/// Most points kept of any timeline while recording (halved when full).
const MAX_POINTS: usize = 4096;
/// A line is reported as a leak from this likelihood on.
const LEAK_THRESHOLD: f64 = 0.95;

/// (file, line).
pub(crate) type LineKey = (String, u32);

#[derive(Debug, Default, Clone)]
struct LineAcc {
    /// Bytes of the allocation windows charged here.
    alloc: f64,
    /// Bytes allocated in those windows, and of those by the interpreter.
    window_alloc: f64,
    window_python: f64,
    /// Live footprint now, its peak, and the sum and count of its observations.
    current: f64,
    peak: f64,
    sum: f64,
    n: u64,
    timeline: Timeline,
    copied: f64,
    /// When its sampled allocations were made and when they were freed (leak analysis
    /// counts those up to the footprint's peak, so frees at exit do not clear a leak).
    sampled_at: Vec<u64>,
    freed_at: Vec<u64>,
    /// `--native`: bytes of its sampled allocations by the native function that made them
    /// (function, module). That function is the innermost frame of a handshake's stack,
    /// machinery dropped.
    native: HashMap<(crate::profile::Name, crate::profile::Name), f64>,
}

/// (ns, bytes) points, decimated to stay bounded.
#[derive(Debug, Default, Clone)]
struct Timeline(Vec<(u64, f64)>);

impl Timeline {
    fn push(&mut self, t: u64, v: f64) {
        if self.0.len() >= MAX_POINTS {
            // Keep every other point (the max of each pair, so peaks survive).
            let merged: Vec<(u64, f64)> = self
                .0
                .chunks(2)
                .map(|c| {
                    c.iter()
                        .copied()
                        .fold((c[0].0, f64::MIN), |a, b| (b.0, a.1.max(b.1)))
                })
                .collect();
            self.0 = merged;
        }
        self.0.push((t, v));
    }
}

/// Folds ring events. A clone is what a live view reads while the recording goes on.
#[derive(Debug, Default, Clone)]
pub(crate) struct MemoryAggregator {
    lines: HashMap<LineKey, LineAcc>,
    /// Sampled pointers still live.
    watched: HashMap<u64, Watch>,
    footprint: Timeline,
    start_ns: Option<u64>,
    last_ns: u64,
    total_alloc: f64,
    total_python: f64,
    total_window_alloc: f64,
    total_copy: f64,
    /// Allocation bytes whose line could not be read.
    unattributed_mb: f64,
    /// Bytes of the events of blocks of at least a window, and of those the bytes (and
    /// events) charged without a stack of their own.
    large_alloc: f64,
    large_without_stack: f64,
    large_without_stack_events: u64,
    /// Bytes allocated by each full stack.
    stacks: HashMap<Vec<Frame>, f64>,
    /// `--native`: handshakes whose stack got its native frames, and those that did not.
    native: Option<MergeCounts>,
}

/// A sampled pointer still live: the line charged and the bytes it stands for.
#[derive(Debug, Clone)]
struct Watch {
    line: LineKey,
    bytes: f64,
}

impl LineAcc {
    /// The line's memory columns, its timeline in slices of the recording (`start`,
    /// `span` ns), its copy rate over `duration_s`.
    fn columns(&self, start: u64, span: u64, duration_s: f64) -> LineMemory {
        LineMemory {
            mem_alloc_mb: self.alloc / MB,
            mem_python_pct: if self.window_alloc > 0.0 {
                100.0 * self.window_python / self.window_alloc
            } else {
                0.0
            },
            mem_peak_mb: self.peak / MB,
            mem_avg_mb: if self.n > 0 {
                self.sum / self.n as f64 / MB
            } else {
                0.0
            },
            mem_timeline: slices(&self.timeline.0, start, span),
            copy_mb_s: self.copied / MB / duration_s,
            mem_native_functions: top_native(&self.native),
        }
    }
}

/// A line's native functions by bytes, most first (then by name), at most
/// [`NATIVE_FUNCTIONS_PER_LINE`].
fn top_native(
    by: &HashMap<(crate::profile::Name, crate::profile::Name), f64>,
) -> Vec<NativeAllocation> {
    let mut all: Vec<_> = by.iter().collect();
    all.sort_by(|a, b| b.1.total_cmp(a.1).then_with(|| a.0.cmp(b.0)));
    all.into_iter()
        .take(NATIVE_FUNCTIONS_PER_LINE)
        .map(|((function, module), &bytes)| NativeAllocation {
            function: function.to_string(),
            module: module.to_string(),
            mb: bytes / MB,
        })
        .collect()
}

impl MemoryAggregator {
    pub(crate) fn new() -> MemoryAggregator {
        MemoryAggregator::default()
    }

    fn clock(&mut self, t: u64) {
        self.start_ns.get_or_insert(t);
        self.last_ns = self.last_ns.max(t);
    }

    /// Adds one event; `line` is where its thread was (for allocations and copies).
    pub(crate) fn add(&mut self, e: &Event, line: Option<LineKey>) {
        self.clock(e.time_ns);
        match e.what {
            What::Alloc {
                bytes,
                window,
                python,
                watched,
                ..
            } => {
                let bytes = bytes as f64;
                let (window, python) = (window as f64, python as f64);
                self.total_alloc += bytes;
                self.total_window_alloc += window;
                self.total_python += python;
                let Some(key) = line else {
                    self.unattributed_mb += bytes / MB;
                    return;
                };
                let l = self.lines.entry(key.clone()).or_default();
                l.alloc += bytes;
                l.window_alloc += window;
                l.window_python += python;
                l.current += bytes;
                l.peak = l.peak.max(l.current);
                l.sum += l.current;
                l.n += 1;
                l.timeline.push(e.time_ns, l.current);
                if let Some(ptr) = watched {
                    l.sampled_at.push(e.time_ns);
                    self.watched.insert(ptr, Watch { line: key, bytes });
                }
            }
            What::SampledMove { from, to } => {
                // The block lives on at `to`. Its watch (line and bytes) goes with it.
                if let Some(w) = self.watched.remove(&from) {
                    self.watched.insert(to, w);
                }
            }
            What::SampledFree { ptr } => {
                if let Some(w) = self.watched.remove(&ptr) {
                    if let Some(l) = self.lines.get_mut(&w.line) {
                        l.freed_at.push(e.time_ns);
                        l.current = (l.current - w.bytes).max(0.0);
                        l.sum += l.current;
                        l.n += 1;
                        l.timeline.push(e.time_ns, l.current);
                    }
                }
            }
            What::Copy { bytes } => {
                self.total_copy += bytes as f64;
                if let Some(key) = line {
                    self.lines.entry(key).or_default().copied += bytes as f64;
                }
            }
            What::Free { .. } | What::Unknown { .. } => {}
        }
    }

    /// Notes how an event of a block of at least a window was tied to its line: by a stack
    /// of its own (read while its thread waited), or not (`own_stack` false: the stack of
    /// its thread's latest handshake, or none). Other events are not counted.
    pub(crate) fn note_stack_of_large(&mut self, e: &Event, own_stack: bool) {
        let What::Alloc {
            bytes, large: true, ..
        } = e.what
        else {
            return;
        };
        self.large_alloc += bytes as f64;
        if !own_stack {
            self.large_without_stack += bytes as f64;
            self.large_without_stack_events += 1;
        }
    }

    /// `--native`: charges an allocation's bytes to the native function that made it, the
    /// innermost frame of `frames` when it is native (a handshake's stack; an event sent
    /// without waiting carries Python frames alone), under its `line`.
    pub(crate) fn add_native_leaf(&mut self, e: &Event, line: &LineKey, frames: &[Frame]) {
        let (What::Alloc { bytes, .. }, Some(leaf)) = (e.what, frames.first()) else {
            return;
        };
        if !leaf.native {
            return;
        }
        let l = self.lines.entry(line.clone()).or_default();
        *l.native.entry((leaf.function, leaf.filename)).or_default() += bytes as f64;
    }

    /// `--native`: how the handshakes' native stacks went.
    pub(crate) fn set_native_counts(&mut self, counts: MergeCounts) {
        self.native = Some(counts);
    }

    /// Bytes allocated in all (its sampled windows).
    pub(crate) fn alloc_bytes(&self) -> f64 {
        self.total_alloc
    }

    /// One aggregator for a program of several processes, from each process's aggregator,
    /// its ring's totals, and when its recording ended (its process ended or exec'd; its
    /// memory is gone from then on). Events of all processes share one clock
    /// (CLOCK_MONOTONIC).
    /// - Sums: bytes allocated and copied, per line and in all, stacks, dropped events and
    ///   late handshakes.
    /// - Footprints (a line's, and the program's) add up over time. At each moment they are
    ///   the sum of each process's footprint then, 0 after its end. Their peaks are the
    ///   peaks of those sums.
    /// - The program's peak is the larger of that and the largest peak of one process (its
    ///   ring's own, exact).
    /// - One process comes back unchanged. None gives an empty aggregator with `defaults`.
    pub(crate) fn merge_processes(
        mut parts: Vec<(MemoryAggregator, RingTotals, u64)>,
        defaults: RingTotals,
    ) -> (MemoryAggregator, RingTotals) {
        if parts.len() <= 1 {
            return parts
                .pop()
                .map(|(a, t, _)| (a, t))
                .unwrap_or((MemoryAggregator::new(), defaults));
        }
        let mut out = MemoryAggregator::new();
        let mut totals = RingTotals {
            window: parts[0].1.window,
            copy_window: parts[0].1.copy_window,
            ..RingTotals::default()
        };
        let mut footprints = Vec::new();
        let mut lines: HashMap<LineKey, Vec<(LineAcc, u64)>> = HashMap::new();
        for (agg, t, end) in parts {
            totals.peak_bytes = totals.peak_bytes.max(t.peak_bytes);
            // The rings' counts are the programs' to write, so they may hold any value at all.
            totals.dropped = totals.dropped.saturating_add(t.dropped);
            totals.handshake_timeouts = totals
                .handshake_timeouts
                .saturating_add(t.handshake_timeouts);
            totals.handshakes += t.handshakes;
            totals.handshake_wait_ns = totals.handshake_wait_ns.saturating_add(t.handshake_wait_ns);
            out.start_ns = match (out.start_ns, agg.start_ns) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            out.last_ns = out.last_ns.max(agg.last_ns);
            out.total_alloc += agg.total_alloc;
            out.total_python += agg.total_python;
            out.total_window_alloc += agg.total_window_alloc;
            out.total_copy += agg.total_copy;
            out.unattributed_mb += agg.unattributed_mb;
            out.large_alloc += agg.large_alloc;
            out.large_without_stack += agg.large_without_stack;
            out.large_without_stack_events += agg.large_without_stack_events;
            for (frames, bytes) in agg.stacks {
                *out.stacks.entry(frames).or_insert(0.0) += bytes;
            }
            if let Some(n) = &agg.native {
                out.native.get_or_insert_with(MergeCounts::default).add(n);
            }
            footprints.push((agg.footprint.0, end));
            for (key, acc) in agg.lines {
                lines.entry(key).or_default().push((acc, end));
            }
        }
        out.footprint = sum_over_time(footprints);
        let top = out.footprint.0.iter().map(|p| p.1).fold(0.0, f64::max);
        totals.peak_bytes = totals.peak_bytes.max(top as i64);
        for (key, accs) in lines {
            let mut m = LineAcc::default();
            let mut timelines = Vec::new();
            for (acc, end) in accs {
                m.alloc += acc.alloc;
                m.window_alloc += acc.window_alloc;
                m.window_python += acc.window_python;
                m.copied += acc.copied;
                m.peak = m.peak.max(acc.peak);
                m.sampled_at.extend(acc.sampled_at);
                m.freed_at.extend(acc.freed_at);
                for (f, bytes) in acc.native {
                    *m.native.entry(f).or_default() += bytes;
                }
                if !acc.timeline.0.is_empty() {
                    timelines.push((acc.timeline.0, end));
                }
            }
            m.sampled_at.sort_unstable();
            m.freed_at.sort_unstable();
            m.timeline = sum_over_time(timelines);
            for &(_, v) in &m.timeline.0 {
                m.peak = m.peak.max(v);
                m.sum += v;
                m.n += 1;
            }
            m.current = m.timeline.0.last().map_or(0.0, |p| p.1);
            out.lines.insert(key, m);
        }
        (out, totals)
    }

    /// Charges an allocation event's bytes to the full stack that made it.
    pub(crate) fn add_stack(&mut self, e: &Event, frames: &[Frame]) {
        if let What::Alloc { bytes, .. } = e.what {
            // Copy the stack only the first time it is seen.
            match self.stacks.get_mut(frames) {
                Some(b) => *b += bytes as f64,
                None => {
                    self.stacks.insert(frames.to_vec(), bytes as f64);
                }
            }
        }
    }

    /// Records the program's footprint at `t_ns`.
    pub(crate) fn footprint_at(&mut self, t_ns: u64, bytes: i64) {
        self.clock(t_ns);
        let v = bytes.max(0) as f64;
        if self.footprint.0.last().is_some_and(|&(_, last)| last == v) {
            return;
        }
        self.footprint.push(t_ns, v);
    }

    /// How fast the footprint grew, MB/s, from its first point to its peak (what the
    /// program frees on its way out is not the steady state), and when the peak was.
    fn growth(&self) -> (f64, u64) {
        let peak_point =
            self.footprint
                .0
                .iter()
                .copied()
                .fold(None::<(u64, f64)>, |m, p| match m {
                    Some(q) if q.1 >= p.1 => Some(q),
                    _ => Some(p),
                });
        let growth_mb_s = match (self.footprint.0.first(), peak_point) {
            (Some(a), Some(b)) if b.0 > a.0 => (b.1 - a.1) / MB / ((b.0 - a.0) as f64 / 1e9),
            _ => 0.0,
        };
        (growth_mb_s, peak_point.map_or(u64::MAX, |p| p.0))
    }

    /// Puts the memory into `profile`: each line's columns (adding lines that only
    /// allocated or copied), and the program's summary. `source` gives a file's lines.
    pub(crate) fn merge_into(
        &self,
        profile: &mut Profile,
        ring: RingTotals,
        source: &mut dyn FnMut(&str) -> Option<Vec<String>>,
    ) {
        let start = self.start_ns.unwrap_or(0);
        let span = self.last_ns.saturating_sub(start).max(1);
        let duration_s = if profile.meta.duration_s > 0.0 {
            profile.meta.duration_s
        } else {
            span as f64 / 1e9
        };
        let (growth_mb_s, peak_t) = self.growth();
        let mut leaks = Vec::new();
        let mut grown = std::collections::BTreeSet::new();
        for l in profile.files.iter_mut().flat_map(|f| f.lines.iter_mut()) {
            l.memory.get_or_insert_with(LineMemory::default);
        }
        for ((file, line), acc) in &self.lines {
            let mem = acc.columns(start, span, duration_s);
            let sampled = acc.sampled_at.iter().filter(|&&t| t <= peak_t).count() as u64;
            let freed = acc.freed_at.iter().filter(|&&t| t <= peak_t).count() as u64;
            let likelihood = leak_likelihood(sampled, freed);
            if likelihood >= LEAK_THRESHOLD && growth_mb_s > 0.0 {
                leaks.push(Leak {
                    filename: file.clone(),
                    line: *line,
                    likelihood,
                    growth_mb_s,
                    sampled_allocs: sampled,
                    sampled_frees: freed,
                });
            }
            let (l, added) = profile.line_mut(file, *line);
            l.memory = Some(mem);
            grown.extend(added);
        }
        // Files that gained lines: their source text and context, once per file.
        profile.take_sources(grown, source);
        leaks.sort_by(|a, b| {
            b.likelihood
                .total_cmp(&a.likelihood)
                .then_with(|| (&a.filename, a.line).cmp(&(&b.filename, b.line)))
        });
        let timeline = self
            .footprint
            .0
            .iter()
            .map(|&(t, v)| [t.saturating_sub(start) as f64 / 1e9, v / MB])
            .collect();
        profile.memory = Some(MemorySummary {
            peak_mb: ring.peak_bytes.max(0) as f64 / MB,
            timeline,
            alloc_mb: self.total_alloc / MB,
            python_pct: if self.total_window_alloc > 0.0 {
                100.0 * self.total_python / self.total_window_alloc
            } else {
                0.0
            },
            copy_mb: self.total_copy / MB,
            leaks,
            window_bytes: ring.window,
            copy_window_bytes: ring.copy_window,
            dropped_events: ring.dropped,
            handshake_timeouts: ring.handshake_timeouts,
            handshakes: ring.handshakes,
            handshake_wait_ms: ring.handshake_wait_ns as f64 / 1e6,
            large_alloc_mb: self.large_alloc / MB,
            large_alloc_without_own_stack_mb: self.large_without_stack / MB,
            large_allocs_without_own_stack: self.large_without_stack_events,
            stacks: self.memory_stacks(),
            since_attach: false,
            native: self.native.as_ref().map(|n| MemoryNativeMeta {
                native_stacks: n.merged,
                python_only_stacks: n.unmerged,
                python_only_reasons: n.reasons.clone(),
            }),
        });
    }

    fn memory_stacks(&self) -> Vec<MemoryStack> {
        let mut v: Vec<MemoryStack> = self
            .stacks
            .iter()
            .map(|(frames, bytes)| MemoryStack {
                frames: frames.clone(),
                alloc_kib: (bytes / 1024.0).round() as u64,
            })
            .filter(|s| s.alloc_kib > 0)
            .collect();
        v.sort_by(|a, b| {
            b.alloc_kib
                .cmp(&a.alloc_kib)
                .then_with(|| a.frames.cmp(&b.frames))
        });
        v
    }
}

/// The sum over time of step functions (each `(ns, value)` point holds until the next;
/// each function is 0 before its first point and from its `end` on).
fn sum_over_time(parts: Vec<(Vec<(u64, f64)>, u64)>) -> Timeline {
    let mut changes: Vec<(u64, usize, f64)> = Vec::new();
    for (i, (points, end)) in parts.iter().enumerate() {
        let mut last = 0;
        for &(t, v) in points {
            changes.push((t, i, v));
            last = last.max(t);
        }
        if !points.is_empty() {
            changes.push(((*end).max(last), i, 0.0));
        }
    }
    // Stable, so a function's own points keep their order at equal times.
    changes.sort_by_key(|c| c.0);
    let mut now = vec![0.0f64; parts.len()];
    let mut out = Timeline::default();
    let mut k = 0;
    while k < changes.len() {
        let t = changes[k].0;
        while k < changes.len() && changes[k].0 == t {
            now[changes[k].1] = changes[k].2;
            k += 1;
        }
        out.push(t, now.iter().sum());
    }
    out
}

/// What the ring's header says at the end.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct RingTotals {
    pub(crate) peak_bytes: i64,
    pub(crate) window: u64,
    pub(crate) copy_window: u64,
    pub(crate) dropped: u64,
    pub(crate) handshake_timeouts: u64,
    /// Handshakes answered, and the time their threads waited for the answers in all.
    pub(crate) handshakes: u64,
    pub(crate) handshake_wait_ns: u64,
}

/// Laplace's rule of succession for "the next sampled allocation of this line is not
/// freed": 1 − (frees + 1) / (allocations + 2).
fn leak_likelihood(allocs: u64, frees: u64) -> f64 {
    1.0 - (frees.min(allocs) as f64 + 1.0) / (allocs as f64 + 2.0)
}

/// The value (MB) of a step function given by `points` at the end of each of
/// [`LINE_TIMELINE_SLICES`] equal slices of `[start, start + span]` (max within a slice).
fn slices(points: &[(u64, f64)], start: u64, span: u64) -> Vec<f64> {
    if points.is_empty() {
        return Vec::new();
    }
    let n = LINE_TIMELINE_SLICES;
    let mut out = vec![0.0f64; n];
    let mut current = 0.0;
    let mut idx = 0;
    for (i, slot) in out.iter_mut().enumerate() {
        // `span` comes from the events' times (the program's to write), so it may be up to
        // `u64::MAX`.
        let end = start + (u128::from(span) * (i as u128 + 1) / n as u128) as u64;
        let mut high = current;
        while idx < points.len() && points[idx].0 <= end {
            current = points[idx].1;
            high = high.max(current);
            idx += 1;
        }
        *slot = high / MB;
    }
    out
}

#[cfg(test)]
mod tests;
