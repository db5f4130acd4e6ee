//! One frame's figures in seconds and megabytes, and the windows cut from two frames.
//!
//! Owns: [`Tally`] (what one [`LiveFrame`] says since start, as amounts rather than shares,
//! so that two of them subtract) and [`Tally::since`], the window between two tallies.
//! Must not: choose rows or lay anything out (`model` and `screen` do).
//!
//! Why amounts: a profile's shares are percentages of its own total, and the total grows.
//! So shares of an interval come from the difference of seconds, never of percentages.
//! A line's seconds are `pct / 100 × total_s`.

use super::LiveFrame;
use crate::profile::{charged_frame, Profile, Split};
use std::collections::BTreeMap;

/// A line of a file: (file name, line number).
pub(crate) type LineKey = (String, u32);
/// A function of a file: (file name, function name).
pub(crate) type FunctionKey = (String, String);

/// Amounts below this are rounding noise of a difference, and count as nothing.
const NOTHING: f64 = 1e-9;

/// One line's amounts.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct LineTally {
    pub(crate) split: Split,
    pub(crate) source: String,
    /// None: the profile records no memory for the line.
    pub(crate) memory: Option<LineMemory>,
    /// Native seconds by native function (`name (module)`).
    pub(crate) native: BTreeMap<String, f64>,
}

/// One line's memory: MB allocated and copied (amounts), and its footprint's peak.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct LineMemory {
    pub(crate) alloc_mb: f64,
    pub(crate) copy_mb: f64,
    /// Since start in every window, because a peak does not subtract.
    pub(crate) peak_mb: f64,
}

/// One function's time and the first line of it seen.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct FunctionTally {
    pub(crate) split: Split,
    pub(crate) first_line: Option<u32>,
}

/// One thread's time, by line and by function, from the profile's stacks.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct ThreadTally {
    pub(crate) name: Option<String>,
    pub(crate) split: Split,
    pub(crate) lines: BTreeMap<LineKey, Split>,
    pub(crate) functions: BTreeMap<FunctionKey, Split>,
    /// Native seconds of its lines by native function (`name (module)`). The function is the
    /// innermost frame of its stacks, when native (as the aggregator counts a line's native
    /// functions).
    pub(crate) line_native: BTreeMap<LineKey, BTreeMap<String, f64>>,
}

/// What one frame says, since start (or, made by [`Tally::since`], within a window).
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Tally {
    /// Seconds attributed, the 100% of every share.
    pub(crate) total_s: f64,
    /// Seconds of the recording (of the window).
    pub(crate) elapsed_s: f64,
    pub(crate) samples: u64,
    pub(crate) lost: u64,
    /// Samples where some thread held the GIL; None when not known.
    pub(crate) gil_held: Option<f64>,
    pub(crate) lines: BTreeMap<LineKey, LineTally>,
    pub(crate) functions: BTreeMap<FunctionKey, FunctionTally>,
    pub(crate) threads: BTreeMap<i32, ThreadTally>,
    /// Seconds of each line by asyncio task (`--async`), from the stacks.
    pub(crate) line_tasks: BTreeMap<LineKey, BTreeMap<String, f64>>,
    /// Seconds of each line by the function its stacks name there, since start in every
    /// window, because the name of a line is not windowed.
    pub(crate) line_functions: BTreeMap<LineKey, BTreeMap<String, f64>>,
    /// Seconds of each process, by pid.
    pub(crate) processes: BTreeMap<i32, f64>,
    /// Whether the profile records memory (lines then have `memory`).
    pub(crate) has_memory: bool,
}

fn plus(a: &mut Split, b: &Split) {
    a.python_s += b.python_s;
    a.native_s += b.native_s;
    a.system_s += b.system_s;
}

/// `a - b`, each part at least 0 (a part that shrank is noise, or a line the aggregate
/// dropped).
fn minus(a: &Split, b: Option<&Split>) -> Split {
    let b = b.copied().unwrap_or_default();
    Split {
        python_s: clamp(a.python_s - b.python_s),
        native_s: clamp(a.native_s - b.native_s),
        system_s: clamp(a.system_s - b.system_s),
    }
}

fn clamp(x: f64) -> f64 {
    if x > NOTHING {
        x
    } else {
        0.0
    }
}

/// Whether a split holds any time.
pub(crate) fn is_some_time(s: &Split) -> bool {
    s.total() > NOTHING
}

/// The differences of two maps of amounts: every key of `cur`, less its amount in `base`.
fn minus_map<K: Ord + Clone>(
    cur: &BTreeMap<K, f64>,
    base: Option<&BTreeMap<K, f64>>,
) -> BTreeMap<K, f64> {
    cur.iter()
        .map(|(k, v)| {
            let b = base.and_then(|m| m.get(k)).copied().unwrap_or(0.0);
            (k.clone(), clamp(v - b))
        })
        .filter(|(_, v)| *v > 0.0)
        .collect()
}

fn minus_splits<K: Ord + Clone>(
    cur: &BTreeMap<K, Split>,
    base: Option<&BTreeMap<K, Split>>,
) -> BTreeMap<K, Split> {
    cur.iter()
        .map(|(k, v)| (k.clone(), minus(v, base.and_then(|m| m.get(k)))))
        .filter(|(_, v)| is_some_time(v))
        .collect()
}

impl Tally {
    /// The amounts a frame's since-start profile and header say.
    pub(crate) fn of(frame: &LiveFrame) -> Tally {
        let p = &frame.profile;
        let h = &frame.header;
        let secs = |pct: f64| pct / 100.0 * p.total_s;
        let mut t = Tally {
            total_s: p.total_s,
            elapsed_s: h.elapsed.as_secs_f64(),
            samples: h.samples,
            lost: h.lost,
            gil_held: h.gil_pct.map(|g| g / 100.0 * h.samples as f64),
            has_memory: p.memory.is_some(),
            ..Tally::default()
        };
        for f in &p.files {
            for l in &f.lines {
                let memory = l.memory.as_ref().map(|m| LineMemory {
                    alloc_mb: m.mem_alloc_mb,
                    copy_mb: m.copy_mb_s * p.meta.duration_s,
                    peak_mb: m.mem_peak_mb,
                });
                let native = l
                    .native_functions
                    .iter()
                    .map(|n| (format!("{} ({})", n.function, n.module), secs(n.pct)))
                    .collect();
                t.lines.insert(
                    (f.filename.clone(), l.line),
                    LineTally {
                        split: Split {
                            python_s: secs(l.cpu_python_pct),
                            native_s: secs(l.cpu_native_pct),
                            system_s: secs(l.cpu_system_pct),
                        },
                        source: l.source.clone(),
                        memory,
                        native,
                    },
                );
            }
            for func in &f.functions {
                t.functions.insert(
                    (f.filename.clone(), func.function.clone()),
                    FunctionTally {
                        split: Split {
                            python_s: secs(func.cpu_python_pct),
                            native_s: secs(func.cpu_native_pct),
                            system_s: secs(func.cpu_system_pct),
                        },
                        first_line: func.first_line,
                    },
                );
            }
        }
        t.stacks(p);
        for th in &p.threads {
            t.threads.entry(th.native_id).or_default().name = th.display_name();
        }
        if h.processes.is_empty() {
            for pr in &p.processes {
                t.processes.insert(pr.pid, secs(pr.cpu_pct));
            }
        } else {
            for pr in &h.processes {
                t.processes.insert(pr.pid, secs(pr.cpu_pct));
            }
        }
        t
    }

    /// What the stacks say: each thread's lines and functions, the tasks and function
    /// names of lines. A stack's time goes where the aggregator put it, to its charged
    /// frame (`profile::charged_frame`).
    fn stacks(&mut self, p: &Profile) {
        for s in &p.stacks {
            let split = s.split.unwrap_or(Split {
                python_s: s.seconds,
                ..Split::default()
            });
            let Some(c) = charged_frame(&s.frames, p.meta.profile_all) else {
                continue;
            };
            let file = c.filename.to_string();
            let function = c.function.to_string();
            if let Some(tid) = s.native_id {
                let th = self.threads.entry(tid).or_default();
                plus(&mut th.split, &split);
                plus(
                    th.functions
                        .entry((file.clone(), function.clone()))
                        .or_default(),
                    &split,
                );
                if let Some(line) = c.line {
                    plus(th.lines.entry((file.clone(), line)).or_default(), &split);
                    match s.frames.first() {
                        Some(leaf) if leaf.native && split.native_s > 0.0 => {
                            let name = format!("{} ({})", leaf.function, leaf.filename);
                            *th.line_native
                                .entry((file.clone(), line))
                                .or_default()
                                .entry(name)
                                .or_default() += split.native_s;
                        }
                        _ => {}
                    }
                }
            }
            let Some(line) = c.line else { continue };
            let key = (file, line);
            *self
                .line_functions
                .entry(key.clone())
                .or_default()
                .entry(function)
                .or_default() += split.total();
            if let Some(task) = s.frames.iter().find(|f| f.is_task()) {
                let name = task.function.to_string();
                let name = name.strip_prefix("task ").unwrap_or(&name).to_string();
                *self
                    .line_tasks
                    .entry(key)
                    .or_default()
                    .entry(name)
                    .or_default() += split.total();
            }
        }
    }

    /// The window from `base` to `self` (`base` an earlier tally of the same recording).
    /// Every amount is this one's less `base`'s. Peaks and the names of lines stay this
    /// one's. No `base`: the window is since start, this tally itself.
    pub(crate) fn since(&self, base: Option<&Tally>) -> Tally {
        let Some(b) = base else {
            return self.clone();
        };
        let lines = self
            .lines
            .iter()
            .map(|(k, l)| {
                let old = b.lines.get(k);
                let memory = l.memory.map(|m| {
                    let o = old.and_then(|o| o.memory).unwrap_or_default();
                    LineMemory {
                        alloc_mb: clamp(m.alloc_mb - o.alloc_mb),
                        copy_mb: clamp(m.copy_mb - o.copy_mb),
                        peak_mb: m.peak_mb,
                    }
                });
                let line = LineTally {
                    split: minus(&l.split, old.map(|o| &o.split)),
                    source: l.source.clone(),
                    memory,
                    native: minus_map(&l.native, old.map(|o| &o.native)),
                };
                (k.clone(), line)
            })
            .collect();
        let functions = self
            .functions
            .iter()
            .map(|(k, f)| {
                let old = b.functions.get(k).map(|o| &o.split);
                let func = FunctionTally {
                    split: minus(&f.split, old),
                    first_line: f.first_line,
                };
                (k.clone(), func)
            })
            .collect();
        let threads = self
            .threads
            .iter()
            .map(|(tid, t)| {
                let old = b.threads.get(tid);
                let th = ThreadTally {
                    name: t.name.clone(),
                    split: minus(&t.split, old.map(|o| &o.split)),
                    lines: minus_splits(&t.lines, old.map(|o| &o.lines)),
                    functions: minus_splits(&t.functions, old.map(|o| &o.functions)),
                    line_native: t
                        .line_native
                        .iter()
                        .map(|(k, by)| {
                            let then = old.and_then(|o| o.line_native.get(k));
                            (k.clone(), minus_map(by, then))
                        })
                        .collect(),
                };
                (*tid, th)
            })
            .collect();
        let line_tasks = self
            .line_tasks
            .iter()
            .map(|(k, by)| (k.clone(), minus_map(by, b.line_tasks.get(k))))
            .collect();
        Tally {
            total_s: clamp(self.total_s - b.total_s),
            elapsed_s: clamp(self.elapsed_s - b.elapsed_s),
            samples: self.samples.saturating_sub(b.samples),
            lost: self.lost.saturating_sub(b.lost),
            gil_held: match (self.gil_held, b.gil_held) {
                (Some(now), Some(then)) => Some((now - then).max(0.0)),
                _ => None,
            },
            lines,
            functions,
            threads,
            line_tasks,
            line_functions: self.line_functions.clone(),
            processes: minus_map(&self.processes, Some(&b.processes)),
            has_memory: self.has_memory,
        }
    }

    /// The function a line belongs to: the one its stacks name most, else the function of
    /// its file whose first line is the nearest at or above it.
    pub(crate) fn function_of(&self, key: &LineKey) -> Option<String> {
        if let Some(by) = self.line_functions.get(key) {
            if let Some((name, _)) = by
                .iter()
                .max_by(|a, b| a.1.total_cmp(b.1).then_with(|| b.0.cmp(a.0)))
            {
                return Some(name.clone());
            }
        }
        self.functions
            .iter()
            .filter(|((file, _), f)| *file == key.0 && f.first_line.is_some_and(|l| l <= key.1))
            .max_by_key(|(_, f)| f.first_line)
            .map(|((_, name), _)| name.clone())
    }
}
