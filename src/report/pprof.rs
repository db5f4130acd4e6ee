//! pprof output: the gzip-compressed protobuf `perftools.profiles.Profile` that Go's
//! `go tool pprof` (and the other pprof readers) open. docs/pprof.md says what is in it.
//!
//! One sample per distinct stack of the profile (innermost frame first, as pprof wants its
//! location ids), and with memory one more per distinct allocating stack. Every Python
//! frame is a location with one line (its function and line number; there is no inlining
//! and no address); functions and locations are deduplicated, and every text is in the
//! string table once, index 0 being "".
//!
//! The time split is carried as values, not labels: a stack's time is partly Python,
//! partly native and partly system, and a label names one thing per sample, so splitting
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
        // No system name: pprof readers demangle a function whose system name is its name,
        // and Go's takes `<module>` for C++ template arguments and strips it.
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

/// The lowest line seen of each function (file, name), in any stack, time or memory: the
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

/// One sample per stack of time: its samples, its time (split into Python, native and
/// system when `split`), zeros for the other values (`n_values` in all); labelled with
/// `common`, its thread's id and name.
fn time_samples(
    p: &Profile,
    t: &mut Tables,
    starts: &HashMap<(&str, &str), u32>,
    split: bool,
    n_values: usize,
    common: &[proto::Label],
) -> Vec<proto::Sample> {
    let names: HashMap<i32, &str> = p
        .threads
        .iter()
        .filter_map(|th| Some((th.native_id, th.name.as_deref()?)))
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
    // The split is written when every stack has it (profiles written before it was kept per
    // stack have none: their pprof has the time value only).
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

    // The process, when the profile is of one (the root, or the one listed): several
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

/// One window of a recording (`--push`), as [`render`] makes it: `p` is the window's own
/// profile, which began at `start_ns` (Unix time); `note` goes among the comments.
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
pub(crate) mod tests {
    use super::*;
    use crate::profile::{MemoryStack, MemorySummary, ProfileMeta, Split, StackProfile};
    use prost::Message;
    use std::io::Read;

    fn frame(function: &str, line: u32) -> Frame {
        Frame {
            function: function.into(),
            filename: "/app/main.py".into(),
            line: Some(line),
            native: false,
        }
    }

    fn stack(frames: Vec<Frame>, samples: u64, py: f64, native: f64, sys: f64) -> StackProfile {
        let split = Split {
            python_s: py,
            native_s: native,
            system_s: sys,
        };
        StackProfile {
            frames,
            samples,
            seconds: split.total(),
            split: Some(split),
            native_id: None,
        }
    }

    pub(crate) fn profile() -> Profile {
        let main = frame("<module>", 20);
        Profile {
            schema_version: crate::profile::PROFILE_SCHEMA_VERSION,
            meta: ProfileMeta {
                program: "python main.py".into(),
                pid: 42,
                duration_s: 1.5,
                rate_hz: 100.0,
                ..Default::default()
            },
            total_s: 0.6,
            files: Vec::new(),
            stacks: vec![
                stack(vec![frame("f", 3), main.clone()], 30, 0.2, 0.1, 0.0),
                stack(vec![frame("f", 4), main.clone()], 20, 0.0, 0.0, 0.2),
                stack(vec![frame("g", 9), main.clone()], 10, 0.1, 0.0, 0.0),
                stack(Vec::new(), 1, 0.0, 0.0, 0.0),
            ],
            threads: Vec::new(),
            processes: Vec::new(),
            memory: None,
            gpu: None,
        }
    }

    fn decode(bytes: &[u8]) -> proto::Profile {
        let mut raw = Vec::new();
        flate2::read::GzDecoder::new(bytes)
            .read_to_end(&mut raw)
            .expect("the output is gzip");
        proto::Profile::decode(&raw[..]).expect("the output is a Profile message")
    }

    fn types(p: &proto::Profile) -> Vec<String> {
        let s = |i: i64| p.string_table[i as usize].clone();
        p.sample_type
            .iter()
            .map(|v| format!("{}/{}", s(v.r#type), s(v.unit)))
            .collect()
    }

    #[test]
    fn round_trips_with_values_that_add_up() {
        let p = profile();
        let d = decode(&render(&p).unwrap());
        assert_eq!(d, to_proto(&p));
        assert_eq!(d.string_table[0], "");
        assert_eq!(
            types(&d),
            [
                "samples/count",
                "cpu/nanoseconds",
                "python/nanoseconds",
                "native/nanoseconds",
                "system/nanoseconds"
            ]
        );
        assert_eq!(d.string_table[d.default_sample_type as usize], "cpu");
        assert_eq!(d.sample.len(), 4);
        let sum = |i: usize| d.sample.iter().map(|s| s.value[i]).sum::<i64>();
        assert_eq!(sum(0), 61);
        assert_eq!(sum(1), 600_000_000);
        assert_eq!(
            (sum(2), sum(3), sum(4)),
            (300_000_000, 100_000_000, 200_000_000)
        );
        for s in &d.sample {
            assert_eq!(s.value[1], s.value[2] + s.value[3] + s.value[4]);
        }
        assert_eq!(d.duration_nanos, 1_500_000_000);
        assert_eq!(d.period, 10_000_000);
        assert_eq!(d.time_nanos, 0);
        // The pid label, and no thread label (the profile has no thread).
        let pid = d.string_table.iter().position(|s| s == "pid").unwrap() as i64;
        assert!(d
            .sample
            .iter()
            .all(|s| s.label.len() == 1 && s.label[0].key == pid && s.label[0].num == 42));
    }

    #[test]
    fn functions_locations_and_strings_are_made_once() {
        let d = to_proto(&profile());
        // f, g, <module> and the no-frames stand-in; f:3, f:4, g:9, <module>:20, no frames.
        assert_eq!(d.function.len(), 4);
        assert_eq!(d.location.len(), 5);
        let mut strings = d.string_table.clone();
        strings.sort();
        strings.dedup();
        assert_eq!(strings.len(), d.string_table.len(), "a string twice");
        let name = |id: u64| {
            let f = &d.function[id as usize - 1];
            assert_eq!(f.id, id);
            d.string_table[f.name as usize].as_str()
        };
        // Ids are 1-based indices, every location one line; f starts at its lowest line.
        for (i, l) in d.location.iter().enumerate() {
            assert_eq!(l.id, i as u64 + 1);
            assert_eq!(l.line.len(), 1);
        }
        let f = d
            .function
            .iter()
            .find(|f| d.string_table[f.name as usize] == "f")
            .unwrap();
        assert_eq!(f.start_line, 3);
        assert_eq!(d.string_table[f.filename as usize], "/app/main.py");
        // Both stacks through <module>:20 share its location, outermost last.
        let outer: Vec<u64> = d.sample[..3]
            .iter()
            .map(|s| *s.location_id.last().unwrap())
            .collect();
        assert!(outer.iter().all(|&l| l == outer[0]));
        let first = &d.location[d.sample[0].location_id[0] as usize - 1].line[0];
        assert_eq!((name(first.function_id), first.line), ("f", 3));
        let none = &d.location[d.sample[3].location_id[0] as usize - 1].line[0];
        assert_eq!(name(none.function_id), NO_FRAMES);
    }

    /// `p` with one allocating stack: 3 KiB at f:2 under <module>:20.
    fn with_memory(mut p: Profile) -> Profile {
        p.memory = Some(MemorySummary {
            stacks: vec![MemoryStack {
                frames: vec![frame("alloc", 2), frame("<module>", 20)],
                alloc_kib: 3,
            }],
            ..Default::default()
        });
        p
    }

    #[test]
    fn memory_is_a_value_of_its_own_samples() {
        let p = with_memory(profile());
        let d = to_proto(&p);
        assert_eq!(types(&d).last().unwrap(), "alloc_space/bytes");
        let last = d.sample.last().unwrap();
        assert_eq!(last.value, [0, 0, 0, 0, 0, 3072]);
        assert!(d.sample[..4].iter().all(|s| s.value[5] == 0));
        // <module>:20 is the same location in time and memory stacks.
        assert_eq!(last.location_id[1], d.sample[0].location_id[1]);
    }

    #[test]
    fn gpu_time_is_a_value_of_its_own_samples() {
        use crate::profile::{GpuStack, GpuSummary};
        let mut p = with_memory(profile());
        p.gpu = Some(GpuSummary {
            gpu_s: 0.5,
            stacks: vec![GpuStack {
                frames: vec![frame("f", 3), frame("<module>", 20)],
                native_id: Some(7),
                gpu_ms: 500.0,
            }],
            ..Default::default()
        });
        let d = to_proto(&p);
        let ty = types(&d);
        assert_eq!(
            &ty[ty.len() - 2..],
            ["alloc_space/bytes", "gpu/nanoseconds"]
        );
        let last = d.sample.last().unwrap();
        assert_eq!(last.value, [0, 0, 0, 0, 0, 0, 500_000_000]);
        let mem = &d.sample[d.sample.len() - 2];
        assert_eq!(mem.value, [0, 0, 0, 0, 0, 3072, 0]);
        // f:3 under <module>:20 is the same location as the time stack's.
        assert_eq!(last.location_id, d.sample[0].location_id);
        // No GPU figures (why not is said in the profile): no gpu value.
        p.gpu = Some(GpuSummary {
            unavailable: Some("NVML found no GPU".into()),
            ..Default::default()
        });
        assert_eq!(types(&to_proto(&p)).last().unwrap(), "alloc_space/bytes");
    }

    #[test]
    fn profiles_without_a_split_per_stack_have_time_only() {
        let mut p = profile();
        for s in &mut p.stacks {
            s.split = None;
        }
        p.meta.mode = TimeMode::Wall;
        let d = to_proto(&p);
        assert_eq!(types(&d), ["samples/count", "wall/nanoseconds"]);
        assert_eq!(d.sample[0].value, [30, 300_000_000]);
    }

    #[test]
    fn an_empty_profile_is_a_valid_empty_pprof() {
        let mut p = profile();
        p.stacks.clear();
        p.meta.rate_hz = 0.0;
        let d = decode(&render(&p).unwrap());
        assert!(d.sample.is_empty() && d.function.is_empty() && d.location.is_empty());
        assert_eq!(d.string_table[0], "");
        assert_eq!(d.period, 0);
        assert_eq!(types(&d).len(), 5);
    }

    #[test]
    fn a_stacks_thread_is_a_label() {
        let mut p = profile();
        p.stacks[0].native_id = Some(5);
        p.stacks[1].native_id = Some(6);
        p.threads = [(5, Some("main")), (6, None)]
            .into_iter()
            .map(|(native_id, name)| crate::profile::ThreadProfile {
                native_id,
                name: name.map(String::from),
                samples: 1,
                cpu_python_pct: 0.0,
                cpu_native_pct: 0.0,
                cpu_system_pct: 0.0,
            })
            .collect();
        let d = to_proto(&p);
        let s = |i: i64| d.string_table[i as usize].as_str();
        let labels = |i: usize| -> Vec<(&str, i64, &str)> {
            d.sample[i]
                .label
                .iter()
                .map(|l| (s(l.key), l.num, s(l.str)))
                .collect()
        };
        assert_eq!(
            labels(0),
            [
                ("pid", 42, ""),
                ("thread_id", 5, ""),
                ("thread_name", 0, "main")
            ]
        );
        assert_eq!(labels(1), [("pid", 42, ""), ("thread_id", 6, "")]);
        // No thread of its own and several in the program: none.
        assert_eq!(labels(2), [("pid", 42, "")]);
    }

    /// A profile saved before stacks kept their thread: the program's only thread.
    #[test]
    fn one_thread_is_a_label() {
        let mut p = profile();
        p.threads = vec![crate::profile::ThreadProfile {
            native_id: 7,
            name: Some("worker".into()),
            samples: 61,
            cpu_python_pct: 0.0,
            cpu_native_pct: 0.0,
            cpu_system_pct: 0.0,
        }];
        let d = to_proto(&p);
        let s = |i: i64| d.string_table[i as usize].as_str();
        let labels: Vec<(&str, i64, &str)> = d.sample[0]
            .label
            .iter()
            .map(|l| (s(l.key), l.num, s(l.str)))
            .collect();
        assert_eq!(
            labels,
            [
                ("pid", 42, ""),
                ("thread_id", 7, ""),
                ("thread_name", 0, "worker")
            ]
        );
    }
}
