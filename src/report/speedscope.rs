//! speedscope's JSON file format (<https://www.speedscope.app/file-format-schema.json>).
//!
//! One "sampled" profile: each distinct stack of the profile is one sample, its frames root
//! first as indices into `shared.frames`, weighed by the seconds it stands for (unit
//! `"seconds"`), so speedscope's totals are the same time the terminal report's percentages
//! are shares of. A frame is one (function, file, line): a function sampled at two lines is
//! two frames, as in the line-level report; `line` is left out when the instruction had no
//! line. Frames are numbered in order of first appearance, walking the stacks in the
//! profile's order, so the same profile always gives the same bytes.
//!
//! Must not: read process memory or files.

use crate::profile::Frame;
use crate::profile::Profile;
use serde::Serialize;
use std::collections::HashMap;

/// The `$schema` value speedscope recognises its own format by.
pub const SCHEMA_URL: &str = "https://www.speedscope.app/file-format-schema.json";

#[derive(Serialize)]
struct File<'a> {
    #[serde(rename = "$schema")]
    schema: &'static str,
    shared: Shared<'a>,
    profiles: Vec<SampledProfile>,
    name: String,
    #[serde(rename = "activeProfileIndex")]
    active_profile_index: usize,
    exporter: String,
}

#[derive(Serialize)]
struct Shared<'a> {
    frames: Vec<SpeedscopeFrame<'a>>,
}

#[derive(Serialize)]
struct SpeedscopeFrame<'a> {
    name: &'a str,
    file: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    line: Option<u32>,
}

#[derive(Serialize)]
struct SampledProfile {
    #[serde(rename = "type")]
    kind: &'static str,
    name: String,
    unit: &'static str,
    #[serde(rename = "startValue")]
    start_value: f64,
    #[serde(rename = "endValue")]
    end_value: f64,
    samples: Vec<Vec<usize>>,
    weights: Vec<f64>,
}

/// The name shown for the profile: the program, or a generic one.
fn profile_name(p: &Profile) -> String {
    match (p.meta.program.is_empty(), p.meta.pid) {
        (true, 0) => "scalene-rs profile".to_string(),
        (true, pid) => format!("pid {pid}"),
        (false, 0) => p.meta.program.clone(),
        (false, pid) => format!("{} (pid {pid})", p.meta.program),
    }
}

fn build(p: &Profile) -> File<'_> {
    let mut frames: Vec<SpeedscopeFrame> = Vec::new();
    let mut index: HashMap<&Frame, usize> = HashMap::new();
    let mut samples = Vec::with_capacity(p.stacks.len());
    let mut weights = Vec::with_capacity(p.stacks.len());
    for s in &p.stacks {
        let stack: Vec<usize> = s
            .frames
            .iter()
            .rev()
            .map(|f| {
                *index.entry(f).or_insert_with(|| {
                    frames.push(SpeedscopeFrame {
                        name: &f.function,
                        file: &f.filename,
                        line: f.line,
                    });
                    frames.len() - 1
                })
            })
            .collect();
        samples.push(stack);
        // speedscope cannot read NaN or infinities (JSON has no spelling for them).
        weights.push(if s.seconds.is_finite() {
            s.seconds
        } else {
            0.0
        });
    }
    let end_value = weights.iter().sum();
    let name = profile_name(p);
    File {
        schema: SCHEMA_URL,
        shared: Shared { frames },
        profiles: vec![SampledProfile {
            kind: "sampled",
            name: name.clone(),
            unit: "seconds",
            start_value: 0.0,
            end_value,
            samples,
            weights,
        }],
        name,
        active_profile_index: 0,
        exporter: format!("scalene-rs@{}", env!("CARGO_PKG_VERSION")),
    }
}

/// The speedscope JSON on one line (stacks can be many and deep), ending in a newline.
pub fn render(p: &Profile) -> String {
    let mut s = serde_json::to_string(&build(p)).expect("speedscope JSON always serializes");
    s.push('\n');
    s
}
