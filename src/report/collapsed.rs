//! Collapsed ("folded") stacks, the text format of Brendan Gregg's flame-graph tools.
//!
//! One line per distinct stack: its frames from the root to the innermost, joined by `;`,
//! then one space and the number of samples that saw that stack. A frame reads
//! `function (file:line)`, or `function (file)` when the instruction had no line. Lines are
//! sorted byte-wise, so the same profile always gives the same text.
//!
//! Names are made safe for the format: `;` (the frame separator) becomes `,`, and control
//! characters (a newline would end the line) become spaces. A stack with no Python frame is
//! drawn as the single frame [`NO_FRAMES`], so that the counts still add up to the samples.
//!
//! Must not: read process memory or files.

use crate::profile::Frame;
use crate::profile::Profile;
use std::collections::BTreeMap;

/// The frame that stands for a sample whose stack had no Python frame.
pub const NO_FRAMES: &str = "[no Python frames]";

/// Replaces what would break a collapsed line: `;` and control characters.
fn sanitize_into(out: &mut String, s: &str) {
    for c in s.chars() {
        match c {
            ';' => out.push(','),
            c if c.is_control() => out.push(' '),
            c => out.push(c),
        }
    }
}

/// One frame as it appears in collapsed stacks and flame graphs: `function (file:line)`.
fn frame_label(f: &Frame) -> String {
    let mut s = String::with_capacity(f.function.len() + f.filename.len() + 12);
    if f.function.is_empty() {
        s.push('?');
    } else {
        sanitize_into(&mut s, &f.function);
    }
    s.push_str(" (");
    sanitize_into(&mut s, &f.filename);
    if let Some(line) = f.line {
        s.push(':');
        s.push_str(&line.to_string());
    }
    s.push(')');
    s
}

/// The stack part of a collapsed line (no count): root first, `;`-separated.
fn stack_label(frames_innermost_first: &[Frame]) -> String {
    if frames_innermost_first.is_empty() {
        return NO_FRAMES.to_string();
    }
    let labels: Vec<String> = frames_innermost_first
        .iter()
        .rev()
        .map(frame_label)
        .collect();
    labels.join(";")
}

/// Every distinct stack with its sample count, sorted by the stack text. Stacks that render
/// the same (after sanitizing) are merged; stacks with no samples are left out.
fn stacks(p: &Profile) -> Vec<(String, u64)> {
    let mut merged: BTreeMap<String, u64> = BTreeMap::new();
    for s in &p.stacks {
        if s.samples == 0 {
            continue;
        }
        *merged.entry(stack_label(&s.frames)).or_insert(0) += s.samples;
    }
    merged.into_iter().collect()
}

/// The allocation stacks (`--memory`): every distinct stack that allocated, with the KiB
/// its sampled allocations stand for, sorted by the stack text. None without memory data.
fn memory_stacks(p: &Profile) -> Option<Vec<(String, u64)>> {
    let m = p.memory.as_ref()?;
    let mut merged: BTreeMap<String, u64> = BTreeMap::new();
    for s in &m.stacks {
        *merged.entry(stack_label(&s.frames)).or_insert(0) += s.alloc_kib;
    }
    Some(merged.into_iter().collect())
}

/// The allocation stacks' collapsed lines (`--memory`); None without memory data.
pub fn memory_lines(p: &Profile) -> Option<Vec<String>> {
    Some(
        memory_stacks(p)?
            .into_iter()
            .map(|(stack, n)| format!("{stack} {n}"))
            .collect(),
    )
}

/// The collapsed lines, without line terminators.
pub(crate) fn lines(p: &Profile) -> Vec<String> {
    stacks(p)
        .into_iter()
        .map(|(stack, n)| format!("{stack} {n}"))
        .collect()
}

/// The whole collapsed text, one line per stack, each ending in `\n`.
pub fn render(p: &Profile) -> String {
    let mut out = String::new();
    for line in lines(p) {
        out.push_str(&line);
        out.push('\n');
    }
    out
}
