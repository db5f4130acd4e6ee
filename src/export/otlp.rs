//! OTLP profiles: one window as an `ExportProfilesServiceRequest` (signal `v1development`).
//!
//! Owns: [`profiles_request`], the encoding of one window, and [`process_resource`], the
//! resource attributes of the process a recording is of.
//!
//! The messages are the `opentelemetry-proto` crate's (0.33.1), generated from
//! opentelemetry-proto **v1.10.0** ([`PROTO_REVISION`]). PyPI's `opentelemetry-proto` 1.45.2,
//! which the test receiver decodes with, is generated from the same tag.
//!
//! What a request holds:
//! - One `ResourceProfiles`: the process's resource attributes (`service.name`,
//!   `process.pid`, `process.executable.name`/`.path`, `process.runtime.name`/`.version`,
//!   `container.id` and `k8s.pod.uid` when in one, then the user's `--tag`s), one
//!   `ScopeProfiles` (scope `scalene-rs`, our version).
//! - v1.10.0 gives a profile one sample type, so a window is one `Profile` a sample type,
//!   all over one dictionary, in this order (a profile with no non-zero value is left out,
//!   but for `cpu` / `wall`, because a window in which nothing was sampled still says when it
//!   began and how long it lasted):
//!   - `samples` `count`; `cpu` (`wall` in wall mode) `nanoseconds`;
//!   - `python`, `native`, `system` `nanoseconds`: the split, which adds up to `cpu`;
//!   - `alloc_space` `bytes`: what each stack allocated (with memory);
//!   - `copy_space` `bytes`: what each line copied (with memory). The recording keeps copies
//!     per line, not per stack, so each such sample's stack is that one line.
//! - Each sample: a stack (locations leaf first, each with its line), one value, and the
//!   attributes `thread.id` and `thread.name` where the stack's thread is known.
//! - Each profile: the window's start (`time_unix_nano`) and length, the sampling period,
//!   and `scalene_rs.windows_dropped` when earlier windows were dropped.
//! - The dictionary: every table's index 0 is the zero value (the string "", the empty
//!   mapping, location, function, link, attribute and stack), and nothing else is listed
//!   twice.
//!
//! Must not: send anything, or read the process beyond [`process_resource`]'s /proc files.

use crate::profile::{Frame, Profile, TimeMode};
use crate::report::collapsed::NO_FRAMES;
use opentelemetry_proto::tonic::collector::profiles::v1development::ExportProfilesServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::profiles::v1development as pb;
use opentelemetry_proto::tonic::resource::v1::Resource;
use std::collections::HashMap;

/// The opentelemetry-proto tag whose messages we send.
pub const PROTO_REVISION: &str = "v1.10.0";

/// The Profiles development version of [`PROTO_REVISION`] (opentelemetry-proto's
/// specification, "Profiles development version"). v1.10.0 predates the mechanism, so its
/// format is the first, `1`. Sent as `OTLP-Profiles-Development-Version` (HTTP) and
/// `otlp-profiles-development-version` (gRPC metadata).
pub const DEVELOPMENT_VERSION: &str = "1";

/// A resource attribute's value.
#[derive(Debug, Clone, PartialEq)]
pub enum AttrValue {
    Str(String),
    Int(i64),
}

impl AttrValue {
    fn any(&self) -> AnyValue {
        AnyValue {
            value: Some(match self {
                AttrValue::Str(s) => any_value::Value::StringValue(s.clone()),
                AttrValue::Int(i) => any_value::Value::IntValue(*i),
            }),
        }
    }
}

/// The resource attributes of process `pid`, named `service`, tagged `tags`. They are what
/// /proc tells of it (its executable, its container). The runtime's version comes with each
/// window ([`profiles_request`]).
pub fn process_resource(
    pid: i32,
    service: &str,
    tags: &[(String, String)],
) -> Vec<(String, AttrValue)> {
    let s = |v: &str| AttrValue::Str(v.to_string());
    let mut out = vec![
        ("service.name".to_string(), s(service)),
        ("process.pid".to_string(), AttrValue::Int(pid.into())),
    ];
    if let Ok(path) = crate::proc::exe_path(pid) {
        let name = std::path::Path::new(&path)
            .file_name()
            .map_or_else(|| path.clone(), |n| n.to_string_lossy().into_owned());
        out.push(("process.executable.name".to_string(), s(&name)));
        out.push(("process.executable.path".to_string(), s(&path)));
    }
    if let Some(id) = crate::proc::container::container_id(pid) {
        out.push(("container.id".to_string(), AttrValue::Str(id)));
    }
    if let Some(uid) = crate::proc::container::pod_uid(pid) {
        out.push(("k8s.pod.uid".to_string(), AttrValue::Str(uid)));
    }
    // A tag replaces an attribute of its name (`--tag service.name=...` included).
    for (k, v) in tags {
        super::set_named(&mut out, k, s(v));
    }
    out
}

/// The dictionary, each entry made once; index 0 of each table is its zero value.
struct Dictionary {
    d: pb::ProfilesDictionary,
    strings: HashMap<String, i32>,
    functions: HashMap<(String, String), i32>,
    locations: HashMap<(i32, i64), i32>,
    stacks: HashMap<Vec<i32>, i32>,
    attributes: HashMap<(i32, String), i32>,
}

impl Dictionary {
    fn new() -> Dictionary {
        let d = pb::ProfilesDictionary {
            mapping_table: vec![pb::Mapping::default()],
            location_table: vec![pb::Location::default()],
            function_table: vec![pb::Function::default()],
            link_table: vec![pb::Link::default()],
            string_table: vec![String::new()],
            attribute_table: vec![pb::KeyValueAndUnit::default()],
            stack_table: vec![pb::Stack::default()],
        };
        let mut strings = HashMap::new();
        strings.insert(String::new(), 0);
        Dictionary {
            d,
            strings,
            functions: HashMap::new(),
            locations: HashMap::new(),
            stacks: HashMap::new(),
            attributes: HashMap::new(),
        }
    }

    fn string(&mut self, s: &str) -> i32 {
        if let Some(&i) = self.strings.get(s) {
            return i;
        }
        let i = self.d.string_table.len() as i32;
        self.d.string_table.push(s.to_string());
        self.strings.insert(s.to_string(), i);
        i
    }

    fn function(&mut self, filename: &str, name: &str, start_line: i64) -> i32 {
        let key = (filename.to_string(), name.to_string());
        if let Some(&i) = self.functions.get(&key) {
            return i;
        }
        let f = pb::Function {
            name_strindex: self.string(if name.is_empty() { "?" } else { name }),
            system_name_strindex: 0,
            filename_strindex: self.string(filename),
            start_line,
        };
        let i = self.d.function_table.len() as i32;
        self.d.function_table.push(f);
        self.functions.insert(key, i);
        i
    }

    fn location(&mut self, function_index: i32, line: i64) -> i32 {
        *self
            .locations
            .entry((function_index, line))
            .or_insert_with(|| {
                self.d.location_table.push(pb::Location {
                    mapping_index: 0,
                    address: 0,
                    lines: vec![pb::Line {
                        function_index,
                        line,
                        column: 0,
                    }],
                    attribute_indices: Vec::new(),
                });
                self.d.location_table.len() as i32 - 1
            })
    }

    fn stack(&mut self, locations: Vec<i32>) -> i32 {
        if let Some(&i) = self.stacks.get(&locations) {
            return i;
        }
        let i = self.d.stack_table.len() as i32;
        self.d.stack_table.push(pb::Stack {
            location_indices: locations.clone(),
        });
        self.stacks.insert(locations, i);
        i
    }

    fn attribute(&mut self, key: &str, value: &AttrValue) -> i32 {
        let key_strindex = self.string(key);
        let k = (key_strindex, format!("{value:?}"));
        if let Some(&i) = self.attributes.get(&k) {
            return i;
        }
        let i = self.d.attribute_table.len() as i32;
        self.d.attribute_table.push(pb::KeyValueAndUnit {
            key_strindex,
            value: Some(value.any()),
            unit_strindex: 0,
        });
        self.attributes.insert(k, i);
        i
    }

    fn value_type(&mut self, kind: &str, unit: &str) -> pb::ValueType {
        pb::ValueType {
            type_strindex: self.string(kind),
            unit_strindex: self.string(unit),
        }
    }
}

/// Seconds as whole nanoseconds (negative and non-finite as 0).
pub(crate) fn nanos(s: f64) -> i64 {
    if s.is_finite() && s > 0.0 {
        (s * 1e9).round() as i64
    } else {
        0
    }
}

/// Encodes frames (leaf first) as a stack of the dictionary; no frames: [`NO_FRAMES`].
fn stack_of(d: &mut Dictionary, frames: &[Frame], starts: &HashMap<(&str, &str), u32>) -> i32 {
    let locations = if frames.is_empty() {
        let f = d.function("", NO_FRAMES, 0);
        vec![d.location(f, 0)]
    } else {
        frames
            .iter()
            .map(|fr| {
                let start = starts
                    .get(&(&*fr.filename, &*fr.function))
                    .copied()
                    .unwrap_or(0);
                let f = d.function(&fr.filename, &fr.function, start.into());
                d.location(f, fr.line.unwrap_or(0).into())
            })
            .collect()
    };
    d.stack(locations)
}

/// One sample type's samples, before they become a profile.
struct Kind {
    name: &'static str,
    unit: &'static str,
    samples: Vec<pb::Sample>,
}

impl Kind {
    fn new(name: &'static str, unit: &'static str) -> Kind {
        Kind {
            name,
            unit,
            samples: Vec::new(),
        }
    }

    fn add(&mut self, stack_index: i32, attributes: &[i32], value: i64) {
        if value > 0 {
            self.samples.push(pb::Sample {
                stack_index,
                attribute_indices: attributes.to_vec(),
                link_index: 0,
                values: vec![value],
                timestamps_unix_nano: Vec::new(),
            });
        }
    }
}

/// The encoded `ExportProfilesServiceRequest` of one window, `window` (the window's own
/// profile, [`Profile::since`]), that began at `span.0` and ended at `span.1` (Unix ns),
/// of the process `resource` names ([`process_resource`]). `dropped` earlier windows were
/// dropped.
pub fn profiles_request(
    window: &Profile,
    span: (i64, i64),
    resource: &[(String, AttrValue)],
    dropped: u64,
) -> Vec<u8> {
    use prost::Message;
    request(window, span, resource, dropped).encode_to_vec()
}

fn request(
    p: &Profile,
    (start_ns, end_ns): (i64, i64),
    resource: &[(String, AttrValue)],
    dropped: u64,
) -> ExportProfilesServiceRequest {
    let mut d = Dictionary::new();
    let starts = crate::report::pprof::start_lines(p);
    let time_kind = match p.meta.mode {
        TimeMode::Cpu => "cpu",
        TimeMode::Wall => "wall",
    };
    let mut samples = Kind::new("samples", "count");
    let mut time = Kind::new(time_kind, "nanoseconds");
    let mut parts = [
        Kind::new("python", "nanoseconds"),
        Kind::new("native", "nanoseconds"),
        Kind::new("system", "nanoseconds"),
    ];
    let names: HashMap<i32, &str> = p
        .threads
        .iter()
        .filter_map(|th| Some((th.native_id, th.name.as_deref()?)))
        .collect();
    let only_thread = match &p.threads[..] {
        [th] => Some(th.native_id),
        _ => None,
    };
    for s in &p.stacks {
        let stack = stack_of(&mut d, &s.frames, &starts);
        let mut attrs = Vec::new();
        if let Some(tid) = s.native_id.or(only_thread) {
            attrs.push(d.attribute("thread.id", &AttrValue::Int(tid.into())));
            if let Some(name) = names.get(&tid) {
                attrs.push(d.attribute("thread.name", &AttrValue::Str(name.to_string())));
            }
        }
        samples.add(stack, &attrs, s.samples as i64);
        match s.split {
            Some(sp) => {
                let ns = [nanos(sp.python_s), nanos(sp.native_s), nanos(sp.system_s)];
                // The time value is the sum of the rounded parts, so that they add up.
                time.add(stack, &attrs, ns.iter().sum());
                for (k, v) in parts.iter_mut().zip(ns) {
                    k.add(stack, &attrs, v);
                }
            }
            None => time.add(stack, &attrs, nanos(s.seconds)),
        }
    }
    let mut alloc = Kind::new("alloc_space", "bytes");
    let mut copy = Kind::new("copy_space", "bytes");
    if let Some(m) = &p.memory {
        for ms in &m.stacks {
            let stack = stack_of(&mut d, &ms.frames, &starts);
            alloc.add(stack, &[], (ms.alloc_kib as i64).saturating_mul(1024));
        }
        copy_samples(p, &mut d, &starts, &mut copy);
    }

    let rate = if p.meta.rate_hz > 0.0 {
        p.meta.rate_hz
    } else {
        p.meta.requested_rate_hz
    };
    let period = if rate > 0.0 { nanos(1.0 / rate) } else { 0 };
    let mut profile_attrs = Vec::new();
    if dropped > 0 {
        profile_attrs.push(d.attribute(
            "scalene_rs.windows_dropped",
            &AttrValue::Int(dropped as i64),
        ));
    }
    let kinds = [samples, time]
        .into_iter()
        .chain(parts)
        .chain([alloc, copy]);
    let mut profiles = Vec::new();
    for k in kinds.filter(|k| !k.samples.is_empty() || k.name == time_kind) {
        profiles.push(pb::Profile {
            sample_type: Some(d.value_type(k.name, k.unit)),
            samples: k.samples,
            time_unix_nano: start_ns.max(0) as u64,
            duration_nano: end_ns.saturating_sub(start_ns).max(0) as u64,
            period_type: Some(d.value_type(time_kind, "nanoseconds")),
            period,
            attribute_indices: profile_attrs.clone(),
            ..Default::default()
        });
    }

    let mut attributes: Vec<KeyValue> = resource
        .iter()
        .map(|(k, v)| KeyValue {
            key: k.clone(),
            value: Some(v.any()),
            key_strindex: 0,
        })
        .collect();
    let mut runtime = |k: &str, v: &str| {
        attributes.push(KeyValue {
            key: k.to_string(),
            value: Some(AttrValue::Str(v.to_string()).any()),
            key_strindex: 0,
        })
    };
    runtime("process.runtime.name", "cpython");
    if !p.meta.python_version.is_empty() {
        runtime("process.runtime.version", &p.meta.python_version);
    }
    ExportProfilesServiceRequest {
        resource_profiles: vec![pb::ResourceProfiles {
            resource: Some(Resource {
                attributes,
                ..Default::default()
            }),
            scope_profiles: vec![pb::ScopeProfiles {
                scope: Some(InstrumentationScope {
                    name: "scalene-rs".into(),
                    version: env!("CARGO_PKG_VERSION").into(),
                    ..Default::default()
                }),
                profiles,
                schema_url: String::new(),
            }],
            schema_url: String::new(),
        }],
        dictionary: Some(d.d),
    }
}

/// The bytes each line copied in the window (its copy rate × the window's length), each as
/// a one-line stack. Its function is the one a stack of the window names at that line,
/// else the function of the file that starts last before it.
fn copy_samples(
    p: &Profile,
    d: &mut Dictionary,
    starts: &HashMap<(&str, &str), u32>,
    copy: &mut Kind,
) {
    let mut at: HashMap<(&str, u32), &str> = HashMap::new();
    let time = p.stacks.iter().map(|s| &s.frames);
    let memory = p
        .memory
        .iter()
        .flat_map(|m| m.stacks.iter().map(|s| &s.frames));
    for f in time.chain(memory).flatten() {
        if let Some(line) = f.line {
            at.entry((&f.filename, line)).or_insert(&f.function);
        }
    }
    for file in &p.files {
        for l in &file.lines {
            let Some(m) = &l.memory else { continue };
            let bytes = m.copy_mb_s * p.meta.duration_s * 1024.0 * 1024.0;
            if bytes.is_nan() || bytes < 1.0 {
                continue;
            }
            let function = at
                .get(&(file.filename.as_str(), l.line))
                .copied()
                .or_else(|| {
                    file.functions
                        .iter()
                        .filter(|f| f.first_line.is_some_and(|s| s <= l.line))
                        .max_by_key(|f| f.first_line)
                        .map(|f| f.function.as_str())
                })
                .unwrap_or("");
            let start = starts.get(&(file.filename.as_str(), function)).copied();
            let f = d.function(&file.filename, function, start.unwrap_or(0).into());
            let loc = d.location(f, l.line.into());
            let stack = d.stack(vec![loc]);
            copy.add(stack, &[], bytes.round() as i64);
        }
    }
}

#[cfg(test)]
#[path = "otlp_tests.rs"]
mod tests;
