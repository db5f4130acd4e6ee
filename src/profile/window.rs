//! A window of a recording: what happened between two pictures of its profile.
//!
//! Owns: [`Profile::since`], the difference of two since-start profiles of one recording,
//! as a profile of its own (what `--push` sends, one window at a time).
//! - Stacks: each stack's samples, seconds and split, less what the earlier picture had
//!   (stacks that did not move are left out).
//! - Memory stacks: the bytes allocated since.
//! - The head: the window's duration, samples and losses.
//! - Lines and functions are kept as the later picture has them (a stack's frames name
//!   them; renderers of a window read its stacks), but for each line's copy rate, which
//!   becomes the window's own (copies are kept per line only).
//!
//! Must not: read processes or format output.

use super::{FileProfile, Frame, MemoryStack, Profile, Split, StackProfile};
use std::collections::HashMap;

/// Seconds under this are taken for nothing (float noise of a difference).
const NOTHING_S: f64 = 1e-9;

impl Profile {
    /// What happened after `before`, an earlier picture of the same recording.
    pub fn since(&self, before: &Profile) -> Profile {
        let mut window = self.clone();
        window.stacks = stacks_since(&self.stacks, &before.stacks);
        window.total_s = window
            .stacks
            .iter()
            .map(|s| s.seconds)
            .sum::<f64>()
            .max(0.0);
        let m = &mut window.meta;
        let b = &before.meta;
        m.duration_s = (m.duration_s - b.duration_s).max(0.0);
        m.samples = m.samples.saturating_sub(b.samples);
        m.missed_samples = m.missed_samples.saturating_sub(b.missed_samples);
        m.errors = m.errors.saturating_sub(b.errors);
        m.paused_reads = m.paused_reads.saturating_sub(b.paused_reads);
        m.thinned_samples = m.thinned_samples.saturating_sub(b.thinned_samples);
        m.rate_hz = if m.duration_s > 0.0 {
            m.samples as f64 / m.duration_s
        } else {
            0.0
        };
        copy_rates_since(
            &mut window.files,
            &before.files,
            self.meta.duration_s,
            b.duration_s,
        );
        if let (Some(now), Some(then)) = (window.memory.as_mut(), before.memory.as_ref()) {
            now.stacks = memory_since(&now.stacks, &then.stacks);
            now.alloc_mb = (now.alloc_mb - then.alloc_mb).max(0.0);
            now.copy_mb = (now.copy_mb - then.copy_mb).max(0.0);
            now.dropped_events = now.dropped_events.saturating_sub(then.dropped_events);
        }
        window
    }
}

/// Each line's copy rate over the window alone. It is what it copied by `now_s` (its rate ×
/// the recording's length then), less what it had copied by `before_s`, over the window.
fn copy_rates_since(now: &mut [FileProfile], before: &[FileProfile], now_s: f64, before_s: f64) {
    let copied: HashMap<(&str, u32), f64> = before
        .iter()
        .flat_map(|f| {
            f.lines.iter().filter_map(move |l| {
                let m = l.memory.as_ref()?;
                Some(((f.filename.as_str(), l.line), m.copy_mb_s * before_s))
            })
        })
        .collect();
    let window_s = now_s - before_s;
    for f in now.iter_mut() {
        for l in &mut f.lines {
            if let Some(m) = l.memory.as_mut() {
                let then = copied.get(&(f.filename.as_str(), l.line)).copied();
                let mb = m.copy_mb_s * now_s - then.unwrap_or(0.0);
                m.copy_mb_s = if window_s > 0.0 {
                    (mb / window_s).max(0.0)
                } else {
                    0.0
                };
            }
        }
    }
}

/// A stack's key: its frames and its thread.
type StackKey<'a> = (&'a [Frame], Option<i32>);

fn stacks_since(now: &[StackProfile], before: &[StackProfile]) -> Vec<StackProfile> {
    let earlier: HashMap<StackKey, &StackProfile> = before
        .iter()
        .map(|s| ((s.frames.as_slice(), s.native_id), s))
        .collect();
    now.iter()
        .filter_map(|s| {
            let Some(b) = earlier.get(&(s.frames.as_slice(), s.native_id)) else {
                return Some(s.clone());
            };
            let seconds = s.seconds - b.seconds;
            let samples = s.samples.saturating_sub(b.samples);
            if samples == 0 && seconds < NOTHING_S {
                return None;
            }
            let split = match (&s.split, &b.split) {
                (Some(n), Some(o)) => Some(Split {
                    python_s: (n.python_s - o.python_s).max(0.0),
                    native_s: (n.native_s - o.native_s).max(0.0),
                    system_s: (n.system_s - o.system_s).max(0.0),
                }),
                (n, _) => *n,
            };
            Some(StackProfile {
                frames: s.frames.clone(),
                samples,
                seconds: seconds.max(0.0),
                split,
                native_id: s.native_id,
            })
        })
        .collect()
}

fn memory_since(now: &[MemoryStack], before: &[MemoryStack]) -> Vec<MemoryStack> {
    let earlier: HashMap<&[Frame], u64> = before
        .iter()
        .map(|m| (m.frames.as_slice(), m.alloc_kib))
        .collect();
    now.iter()
        .filter_map(|m| {
            let kib = m
                .alloc_kib
                .saturating_sub(earlier.get(m.frames.as_slice()).copied().unwrap_or(0));
            (kib > 0).then(|| MemoryStack {
                frames: m.frames.clone(),
                alloc_kib: kib,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::{MemorySummary, ProfileMeta};

    fn frame(line: u32) -> Frame {
        Frame {
            line: Some(line),
            ..crate::python::test_frame("/app.py")
        }
    }

    fn stack(line: u32, samples: u64, py: f64, native: f64) -> StackProfile {
        StackProfile {
            frames: vec![frame(line)],
            samples,
            seconds: py + native,
            split: Some(Split {
                python_s: py,
                native_s: native,
                system_s: 0.0,
            }),
            native_id: Some(7),
        }
    }

    fn picture(duration_s: f64, samples: u64, stacks: Vec<StackProfile>) -> Profile {
        let meta = ProfileMeta {
            duration_s,
            samples,
            ..ProfileMeta::default()
        };
        Profile {
            schema_version: crate::profile::PROFILE_SCHEMA_VERSION,
            meta,
            total_s: stacks.iter().map(|s| s.seconds).sum(),
            files: Vec::new(),
            stacks,
            threads: Vec::new(),
            processes: Vec::new(),
            memory: None,
            gpu: None,
        }
    }

    #[test]
    fn a_window_is_the_difference_of_two_pictures() {
        let before = picture(
            10.0,
            1000,
            vec![stack(1, 600, 6.0, 0.0), stack(2, 400, 0.0, 4.0)],
        );
        // Line 1 ran 0.5 s more, line 2 did not move, line 3 is new.
        let now = picture(
            11.0,
            1100,
            vec![
                stack(1, 650, 6.5, 0.0),
                stack(2, 400, 0.0, 4.0),
                stack(3, 50, 0.1, 0.4),
            ],
        );
        let w = now.since(&before);
        assert_eq!(w.meta.samples, 100);
        assert!((w.meta.duration_s - 1.0).abs() < 1e-9);
        assert_eq!(w.stacks.len(), 2, "the stack that did not move is left out");
        let one = &w.stacks[0];
        assert_eq!((one.frames[0].line, one.samples), (Some(1), 50));
        assert!((one.seconds - 0.5).abs() < 1e-9);
        let three = &w.stacks[1];
        assert_eq!(three.frames[0].line, Some(3));
        assert!((three.split.unwrap().native_s - 0.4).abs() < 1e-9);
        assert!((w.total_s - 1.0).abs() < 1e-9);
    }

    #[test]
    fn memory_of_a_window_is_what_was_allocated_in_it() {
        let summary = |kib: u64, mb: f64| MemorySummary {
            alloc_mb: mb,
            stacks: vec![MemoryStack {
                frames: vec![frame(4)],
                alloc_kib: kib,
            }],
            ..MemorySummary::default()
        };
        let mut before = picture(1.0, 10, Vec::new());
        before.memory = Some(summary(1024, 1.0));
        let mut now = picture(2.0, 20, Vec::new());
        now.memory = Some(summary(3072, 3.0));
        let w = now.since(&before);
        let m = w.memory.expect("memory");
        assert_eq!(m.stacks[0].alloc_kib, 2048);
        assert!((m.alloc_mb - 2.0).abs() < 1e-9);
    }

    #[test]
    fn a_lines_copy_rate_in_a_window_is_its_own() {
        let file = |rate: f64| FileProfile {
            filename: "/app.py".into(),
            cpu_pct: 0.0,
            lines: vec![crate::profile::LineProfile {
                line: 4,
                source: String::new(),
                cpu_python_pct: 0.0,
                cpu_native_pct: 0.0,
                cpu_system_pct: 0.0,
                memory: Some(crate::profile::LineMemory {
                    copy_mb_s: rate,
                    ..Default::default()
                }),
                gpu: None,
                native_functions: Vec::new(),
            }],
            functions: Vec::new(),
            context: Vec::new(),
            full_source: Vec::new(),
        };
        // 10 MB copied in the first 10 s and 18 MB by 12 s make 8 MB in the 2 s window.
        let mut before = picture(10.0, 10, Vec::new());
        before.files = vec![file(1.0)];
        let mut now = picture(12.0, 12, Vec::new());
        now.files = vec![file(1.5)];
        let w = now.since(&before);
        let rate = w.files[0].lines[0].memory.as_ref().unwrap().copy_mb_s;
        assert!((rate - 4.0).abs() < 1e-9, "{rate}");
    }
}
