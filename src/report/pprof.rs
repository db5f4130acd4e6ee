//! pprof output: the gzip-compressed protobuf `perftools.profiles.Profile` that Go's
//! `go tool pprof` (and the other pprof readers) open. docs/pprof.md says what is in it.
//!
//! One sample per distinct stack of the profile (innermost frame first, as pprof wants its
//! location ids), and with memory one more per distinct allocating stack. Every Python
//! frame is a location with one line (its function and line number; there is no inlining
//! and no address). Functions and locations are deduplicated, and every text is in the
//! string table once, index 0 being "".
//!
//! The time split is carried as values, not labels. A stack's time is partly Python,
//! partly native and partly system, and a label names one thing per sample. So splitting
//! by labels would mean up to three samples per stack whose sample counts could not be
//! split the same way. As values, every view of pprof (`-sample_index=native`) shows each
//! kind, and they add up to the time value.
//!
//! Must not: read process memory or files.

use super::collapsed::NO_FRAMES;
use crate::profile::{Frame, Profile, ProfileMeta, TimeMode};
use std::collections::HashMap;
use std::io::{self, Write};

/// The messages of pprof's profile.proto that we write, declared for prost's derive (the
/// field numbers are the format's; fields we never set are left out).
pub(crate) mod proto {
    /// The whole profile.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Profile {
        #[prost(message, repeated, tag = "1")]
        pub sample_type: Vec<ValueType>,
        #[prost(message, repeated, tag = "2")]
        pub sample: Vec<Sample>,
        #[prost(message, repeated, tag = "3")]
        pub mapping: Vec<Mapping>,
        #[prost(message, repeated, tag = "4")]
        pub location: Vec<Location>,
        #[prost(message, repeated, tag = "5")]
        pub function: Vec<Function>,
        #[prost(string, repeated, tag = "6")]
        pub string_table: Vec<String>,
        #[prost(int64, tag = "9")]
        pub time_nanos: i64,
        #[prost(int64, tag = "10")]
        pub duration_nanos: i64,
        #[prost(message, optional, tag = "11")]
        pub period_type: Option<ValueType>,
        #[prost(int64, tag = "12")]
        pub period: i64,
        #[prost(int64, repeated, tag = "13")]
        pub comment: Vec<i64>,
        #[prost(int64, tag = "14")]
        pub default_sample_type: i64,
    }

    /// A value's kind and unit (string-table indices).
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ValueType {
        #[prost(int64, tag = "1")]
        pub r#type: i64,
        #[prost(int64, tag = "2")]
        pub unit: i64,
    }

    /// One stack (location ids, innermost first) and its values, one per sample type.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Sample {
        #[prost(uint64, repeated, tag = "1")]
        pub location_id: Vec<u64>,
        #[prost(int64, repeated, tag = "2")]
        pub value: Vec<i64>,
        #[prost(message, repeated, tag = "3")]
        pub label: Vec<Label>,
    }

    /// A sample's label: a text (`str`) or a number (`num`, in `num_unit`).
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Label {
        #[prost(int64, tag = "1")]
        pub key: i64,
        #[prost(int64, tag = "2")]
        pub str: i64,
        #[prost(int64, tag = "3")]
        pub num: i64,
        #[prost(int64, tag = "4")]
        pub num_unit: i64,
    }

    /// A mapped binary; ours stands for the interpreter, whose frames come symbolized.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Mapping {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(int64, tag = "5")]
        pub filename: i64,
        #[prost(bool, tag = "7")]
        pub has_functions: bool,
        #[prost(bool, tag = "8")]
        pub has_filenames: bool,
        #[prost(bool, tag = "9")]
        pub has_line_numbers: bool,
    }

    /// A place in the code: here always one line.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Location {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(uint64, tag = "2")]
        pub mapping_id: u64,
        #[prost(message, repeated, tag = "4")]
        pub line: Vec<Line>,
    }

    /// A function and a line number of it.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Line {
        #[prost(uint64, tag = "1")]
        pub function_id: u64,
        #[prost(int64, tag = "2")]
        pub line: i64,
    }

    /// A function: name, file and first line (string-table indices but the line).
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Function {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(int64, tag = "2")]
        pub name: i64,
        #[prost(int64, tag = "3")]
        pub system_name: i64,
        #[prost(int64, tag = "4")]
        pub filename: i64,
        #[prost(int64, tag = "5")]
        pub start_line: i64,
    }
}

/// The id of the one mapping every location belongs to.
const MAPPING_ID: u64 = 1;

/// Builds the tables: strings, functions and locations, each entry made once.
#[derive(Default)]
struct Tables {
    strings: Vec<String>,
    string_ids: HashMap<String, i64>,
    functions: Vec<proto::Function>,
    /// Function id by (file, name).
    function_ids: HashMap<(String, String), u64>,
    locations: Vec<proto::Location>,
    /// Location id by (function id, line).
    location_ids: HashMap<(u64, i64), u64>,
}

impl Tables {
    fn new() -> Tables {
        let mut t = Tables::default();
        // The format's rule: index 0 is the empty string.
        t.string("");
        t
    }

    fn string(&mut self, s: &str) -> i64 {
        if let Some(&i) = self.string_ids.get(s) {
            return i;
        }
        let i = self.strings.len() as i64;
        self.strings.push(s.to_string());
        self.string_ids.insert(s.to_string(), i);
        i
    }

    fn function(&mut self, filename: &str, name: &str, start_line: i64) -> u64 {
        let key = (filename.to_string(), name.to_string());
        if let Some(&id) = self.function_ids.get(&key) {
            return id;
        }
        let id = self.functions.len() as u64 + 1;
        let name = self.string(if name.is_empty() { "?" } else { name });
        let filename = self.string(filename);
        // No system name, because pprof readers demangle a function whose system name is its
        // name, and Go's takes `<module>` for C++ template arguments and strips it.
        self.functions.push(proto::Function {
            id,
            name,
            system_name: 0,
            filename,
            start_line,
        });
        self.function_ids.insert(key, id);
        id
    }

    fn location(&mut self, function_id: u64, line: i64) -> u64 {
        if let Some(&id) = self.location_ids.get(&(function_id, line)) {
            return id;
        }
        let id = self.locations.len() as u64 + 1;
        self.locations.push(proto::Location {
            id,
            mapping_id: MAPPING_ID,
            line: vec![proto::Line { function_id, line }],
        });
        self.location_ids.insert((function_id, line), id);
        id
    }

    fn value_type(&mut self, kind: &str, unit: &str) -> proto::ValueType {
        proto::ValueType {
            r#type: self.string(kind),
            unit: self.string(unit),
        }
    }

    fn label_num(&mut self, key: &str, num: i64) -> proto::Label {
        proto::Label {
            key: self.string(key),
            num,
            ..Default::default()
        }
    }

    fn label_str(&mut self, key: &str, value: &str) -> proto::Label {
        proto::Label {
            key: self.string(key),
            str: self.string(value),
            ..Default::default()
        }
    }
}

/// Seconds as whole nanoseconds (negative and non-finite as 0).
fn nanos(s: f64) -> i64 {
    if s.is_finite() && s > 0.0 {
        (s * 1e9).round() as i64
    } else {
        0
    }
}

/// The lowest line seen of each function (file, name), in any stack, time or memory. The
/// profile keeps no function's first line, and pprof wants one (so does OTLP's encoder).
pub(crate) fn start_lines(p: &Profile) -> HashMap<(&str, &str), u32> {
    let mut out: HashMap<(&str, &str), u32> = HashMap::new();
    let time = p.stacks.iter().map(|s| &s.frames);
    let memory = p
        .memory
        .iter()
        .flat_map(|m| m.stacks.iter().map(|s| &s.frames));
    for f in time.chain(memory).flatten() {
        if let Some(line) = f.line {
            let e = out.entry((&f.filename, &f.function)).or_insert(line);
            *e = (*e).min(line);
        }
    }
    out
}

/// The location ids of a stack, innermost first; a stack with no Python frame gets the one
/// location [`NO_FRAMES`], so that its time is still shown.
fn stack_locations(
    t: &mut Tables,
    frames: &[Frame],
    starts: &HashMap<(&str, &str), u32>,
) -> Vec<u64> {
    if frames.is_empty() {
        let f = t.function("", NO_FRAMES, 0);
        return vec![t.location(f, 0)];
    }
    frames
        .iter()
        .map(|fr| {
            let start = starts
                .get(&(&*fr.filename, &*fr.function))
                .copied()
                .unwrap_or(0);
            let f = t.function(&fr.filename, &fr.function, start.into());
            t.location(f, fr.line.unwrap_or(0).into())
        })
        .collect()
}

/// One sample per stack of time, with its samples, its time (split into Python, native
/// and system when `split`), and zeros for the other values (`n_values` in all). Each is
/// labelled with `common`, its thread's id and name.
fn time_samples(
    p: &Profile,
    t: &mut Tables,
    starts: &HashMap<(&str, &str), u32>,
    split: bool,
    n_values: usize,
    common: &[proto::Label],
) -> Vec<proto::Sample> {
    // The name the program gave a thread, else the OS's.
    let names: HashMap<i32, &str> = p
        .threads
        .iter()
        .filter_map(|th| {
            Some((
                th.native_id,
                th.python_name.as_deref().or(th.name.as_deref())?,
            ))
        })
        .collect();
    // A stack's thread is its own; stacks saved before they kept one merge every thread,
    // and have one only when the program had one.
    let only_thread = match &p.threads[..] {
        [th] => Some(th.native_id),
        _ => None,
    };

    let mut samples = Vec::new();
    for s in &p.stacks {
        let location_id = stack_locations(t, &s.frames, starts);
        let mut label = common.to_vec();
        if let Some(tid) = s.native_id.or(only_thread) {
            label.push(t.label_num("thread_id", tid.into()));
            if let Some(name) = names.get(&tid) {
                label.push(t.label_str("thread_name", name));
            }
        }
        let mut value = vec![s.samples as i64];
        match s.split.filter(|_| split) {
            Some(sp) => {
                let parts = [nanos(sp.python_s), nanos(sp.native_s), nanos(sp.system_s)];
                // The time value is the sum of the rounded parts, so that they add up.
                value.push(parts.iter().sum());
                value.extend(parts);
            }
            None => value.push(nanos(s.seconds)),
        }
        value.resize(n_values, 0);
        samples.push(proto::Sample {
            location_id,
            value,
            label,
        });
    }
    samples
}

/// The profile's comments: the program, the Python version, the mode, a missing split.
fn comments(t: &mut Tables, m: &ProfileMeta) -> Vec<i64> {
    let mut comment = Vec::new();
    for c in [
        (!m.program.is_empty()).then(|| format!("program: {}", m.program)),
        (!m.python_version.is_empty()).then(|| format!("python: {}", m.python_version)),
        Some(format!("scalene-rs {} mode", m.mode)),
        m.split_unavailable
            .as_ref()
            .map(|why| format!("no Python/native split (python holds both): {why}")),
    ]
    .into_iter()
    .flatten()
    {
        comment.push(t.string(&c));
    }
    comment
}

/// The profile as pprof's message (not yet encoded).
pub(crate) fn to_proto(p: &Profile) -> proto::Profile {
    let mut t = Tables::new();
    let starts = start_lines(p);
    // The split is written when every stack has it. Profiles written before it was kept per
    // stack have none, so their pprof has the time value only.
    let split = p.stacks.iter().all(|s| s.split.is_some());
    let time_kind = match p.meta.mode {
        TimeMode::Cpu => "cpu",
        TimeMode::Wall => "wall",
    };
    let mut sample_type = vec![
        t.value_type("samples", "count"),
        t.value_type(time_kind, "nanoseconds"),
    ];
    if split {
        for kind in ["python", "native", "system"] {
            sample_type.push(t.value_type(kind, "nanoseconds"));
        }
    }
    let memory = p.memory.as_ref();
    if memory.is_some() {
        sample_type.push(t.value_type("alloc_space", "bytes"));
    }
    // GPU busy time (SM use × time) of the stacks the GPU time was charged to.
    let gpu = p.gpu.as_ref().filter(|g| g.has_data());
    if gpu.is_some() {
        sample_type.push(t.value_type("gpu", "nanoseconds"));
    }
    let n_values = sample_type.len();

    // The process, when the profile is of one (the root, or the one listed). Several
    // processes' stacks are merged, so no pid can be told then.
    let mut common = Vec::new();
    let pid = match p.processes.as_slice() {
        [] => p.meta.pid,
        [one] => one.pid,
        _ => 0,
    };
    if pid != 0 {
        common.push(t.label_num("pid", pid.into()));
    }
    let mut samples = time_samples(p, &mut t, &starts, split, n_values, &common);
    let alloc_index = n_values - 1 - usize::from(gpu.is_some());
    for m in memory.iter().flat_map(|m| &m.stacks) {
        let location_id = stack_locations(&mut t, &m.frames, &starts);
        let mut value = vec![0; n_values];
        value[alloc_index] = (m.alloc_kib as i64).saturating_mul(1024);
        samples.push(proto::Sample {
            location_id,
            value,
            label: common.clone(),
        });
    }
    for g in gpu.iter().flat_map(|g| &g.stacks) {
        let location_id = stack_locations(&mut t, &g.frames, &starts);
        let mut value = vec![0; n_values];
        value[n_values - 1] = nanos(g.gpu_ms / 1e3);
        let mut label = common.clone();
        if let Some(tid) = g.native_id {
            label.push(t.label_num("thread_id", tid.into()));
        }
        samples.push(proto::Sample {
            location_id,
            value,
            label,
        });
    }

    let period_type = Some(t.value_type(time_kind, "nanoseconds"));
    let rate = if p.meta.rate_hz > 0.0 {
        p.meta.rate_hz
    } else {
        p.meta.requested_rate_hz
    };
    let period = if rate > 0.0 { nanos(1.0 / rate) } else { 0 };
    let default_sample_type = t.string(time_kind);
    let m = &p.meta;
    let comment = comments(&mut t, m);
    let mapping = vec![proto::Mapping {
        id: MAPPING_ID,
        filename: t.string("[python]"),
        has_functions: true,
        has_filenames: true,
        has_line_numbers: true,
    }];
    proto::Profile {
        sample_type,
        sample: samples,
        mapping,
        location: t.locations,
        function: t.functions,
        string_table: t.strings,
        // The profile does not keep when it started.
        time_nanos: 0,
        duration_nanos: nanos(m.duration_s),
        period_type,
        period,
        comment,
        default_sample_type,
    }
}

/// The pprof file's bytes: the encoded message, gzip-compressed.
pub(crate) fn render(p: &Profile) -> io::Result<Vec<u8>> {
    gzip(&to_proto(p))
}

/// One window of a recording (`--push`), as [`render`] makes it. `p` is the window's own
/// profile, which began at `start_ns` (Unix time). `note` goes among the comments.
pub(crate) fn render_window(p: &Profile, start_ns: i64, note: Option<&str>) -> io::Result<Vec<u8>> {
    let mut proto = to_proto(p);
    proto.time_nanos = start_ns;
    if let Some(n) = note {
        proto.comment.push(proto.string_table.len() as i64);
        proto.string_table.push(n.to_string());
    }
    gzip(&proto)
}

fn gzip(proto: &proto::Profile) -> io::Result<Vec<u8>> {
    use prost::Message;
    let raw = proto.encode_to_vec();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&raw)?;
    gz.finish()
}

#[cfg(test)]
#[path = "pprof_tests.rs"]
pub(crate) mod tests;
