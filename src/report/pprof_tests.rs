//! Unit tests of the pprof encoding (`super`).

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
    // No GPU figures (why not is said in the profile) means no gpu value.
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
    // Thread 5: the OS's name alone; 6: no name; 7: the program's name beside the OS's.
    p.stacks[2].native_id = Some(7);
    p.threads = [
        (5, Some("main"), None),
        (6, None, None),
        (7, Some("python3"), Some("worker-3")),
    ]
    .into_iter()
    .map(
        |(native_id, name, python_name)| crate::profile::ThreadProfile {
            native_id,
            name: name.map(String::from),
            python_name: python_name.map(String::from),
            interpreters: Vec::new(),
            samples: 1,
            cpu_python_pct: 0.0,
            cpu_native_pct: 0.0,
            cpu_system_pct: 0.0,
        },
    )
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
    assert_eq!(
        labels(2),
        [
            ("pid", 42, ""),
            ("thread_id", 7, ""),
            ("thread_name", 0, "worker-3")
        ]
    );
    // With no thread of its own and several in the program, there is none.
    assert_eq!(labels(3), [("pid", 42, "")]);
}

/// A profile saved before stacks kept their thread: the program's only thread.
#[test]
fn one_thread_is_a_label() {
    let mut p = profile();
    p.threads = vec![crate::profile::ThreadProfile {
        native_id: 7,
        name: Some("worker".into()),
        python_name: None,
        interpreters: Vec::new(),
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
