//! Tests of otlp.rs: a window encoded, decoded with the same generated messages.

use super::*;
use crate::profile::{MemoryStack, MemorySummary, ThreadProfile};
use prost::Message;

fn decode(p: &Profile, dropped: u64) -> ExportProfilesServiceRequest {
    let resource = vec![
        ("service.name".to_string(), AttrValue::Str("svc".into())),
        ("process.pid".to_string(), AttrValue::Int(42)),
    ];
    // The window's span: its start and its profile's duration (what the pusher gives the
    // last window).
    let start = 1_700_000_000_000_000_000;
    let end = start + nanos(p.meta.duration_s);
    let bytes = profiles_request(p, (start, end), &resource, dropped);
    ExportProfilesServiceRequest::decode(bytes.as_slice()).expect("a request")
}

fn kinds(r: &ExportProfilesServiceRequest) -> Vec<String> {
    let d = r.dictionary.as_ref().unwrap();
    r.resource_profiles[0].scope_profiles[0]
        .profiles
        .iter()
        .map(|p| {
            let t = p.sample_type.unwrap();
            format!(
                "{}/{}",
                d.string_table[t.type_strindex as usize], d.string_table[t.unit_strindex as usize]
            )
        })
        .collect()
}

fn profile_of<'a>(r: &'a ExportProfilesServiceRequest, kind: &str) -> &'a pb::Profile {
    let i = kinds(r).iter().position(|k| k.starts_with(kind)).unwrap();
    &r.resource_profiles[0].scope_profiles[0].profiles[i]
}

#[test]
fn a_window_is_one_profile_a_sample_type_with_values_that_add_up() {
    let r = decode(&crate::report::pprof::tests::profile(), 0);
    assert_eq!(
        kinds(&r),
        [
            "samples/count",
            "cpu/nanoseconds",
            "python/nanoseconds",
            "native/nanoseconds",
            "system/nanoseconds"
        ]
    );
    let sum = |k: &str| -> i64 {
        profile_of(&r, k)
            .samples
            .iter()
            .map(|s| s.values.iter().sum::<i64>())
            .sum()
    };
    assert_eq!(sum("samples"), 61);
    assert_eq!(sum("cpu"), 600_000_000);
    assert_eq!(
        (sum("python"), sum("native"), sum("system")),
        (300_000_000, 100_000_000, 200_000_000)
    );
    let cpu = profile_of(&r, "cpu");
    assert_eq!(cpu.time_unix_nano, 1_700_000_000_000_000_000);
    assert_eq!(cpu.duration_nano, 1_500_000_000);
    assert_eq!(cpu.period, 10_000_000);
    assert!(cpu.attribute_indices.is_empty(), "nothing dropped");
}

#[test]
fn a_window_in_which_nothing_was_sampled_still_has_its_time_profile() {
    let mut p = crate::report::pprof::tests::profile();
    p.stacks.clear();
    p.memory = None;
    let r = decode(&p, 0);
    assert_eq!(kinds(&r), ["cpu/nanoseconds"]);
    let cpu = profile_of(&r, "cpu");
    assert!(cpu.samples.is_empty());
    assert_eq!(cpu.time_unix_nano, 1_700_000_000_000_000_000);
    assert_eq!(cpu.duration_nano, 1_500_000_000);
}

#[test]
fn every_table_starts_with_its_zero_value_and_every_index_is_in_bounds() {
    let r = decode(&crate::report::pprof::tests::profile(), 3);
    let d = r.dictionary.as_ref().unwrap();
    assert_eq!(d.string_table[0], "");
    assert_eq!(d.mapping_table[0], pb::Mapping::default());
    assert_eq!(d.location_table[0], pb::Location::default());
    assert_eq!(d.function_table[0], pb::Function::default());
    assert_eq!(d.link_table[0], pb::Link::default());
    assert_eq!(d.attribute_table[0], pb::KeyValueAndUnit::default());
    assert_eq!(d.stack_table[0], pb::Stack::default());
    let string = |i: i32| assert!((0..d.string_table.len() as i32).contains(&i), "{i}");
    for f in &d.function_table {
        string(f.name_strindex);
        string(f.filename_strindex);
    }
    for l in &d.location_table[1..] {
        assert_eq!(l.lines.len(), 1);
        let f = l.lines[0].function_index;
        assert!(f > 0 && (f as usize) < d.function_table.len());
    }
    for s in &d.stack_table[1..] {
        assert!(!s.location_indices.is_empty());
        for &l in &s.location_indices {
            assert!(l > 0 && (l as usize) < d.location_table.len());
        }
    }
    for p in &r.resource_profiles[0].scope_profiles[0].profiles {
        for s in &p.samples {
            assert!(s.stack_index > 0 && (s.stack_index as usize) < d.stack_table.len());
        }
        // The drops are said on every profile of the window.
        let a = &d.attribute_table[p.attribute_indices[0] as usize];
        assert_eq!(
            d.string_table[a.key_strindex as usize],
            "scalene_rs.windows_dropped"
        );
        assert_eq!(a.value, Some(AttrValue::Int(3).any()));
    }
    // f:3, f:4, g:9, <module>:20 and the no-frames stand-in, each once.
    assert_eq!(d.location_table.len(), 6);
    let mut strings = d.string_table.clone();
    strings.sort();
    strings.dedup();
    assert_eq!(strings.len(), d.string_table.len(), "a string twice");
}

#[test]
fn the_resource_has_the_service_the_pid_and_the_runtime() {
    let mut p = crate::report::pprof::tests::profile();
    p.meta.python_version = "3.12.4".into();
    let r = decode(&p, 0);
    let attrs = &r.resource_profiles[0].resource.as_ref().unwrap().attributes;
    let get = |k: &str| {
        attrs
            .iter()
            .find(|a| a.key == k)
            .and_then(|a| a.value.clone())
    };
    assert_eq!(
        get("service.name"),
        Some(AttrValue::Str("svc".into()).any())
    );
    assert_eq!(get("process.pid"), Some(AttrValue::Int(42).any()));
    assert_eq!(
        get("process.runtime.name"),
        Some(AttrValue::Str("cpython".into()).any())
    );
    assert_eq!(
        get("process.runtime.version"),
        Some(AttrValue::Str("3.12.4".into()).any())
    );
}

#[test]
fn threads_are_sample_attributes_and_memory_its_own_profiles() {
    let mut p = crate::report::pprof::tests::profile();
    p.stacks[0].native_id = Some(7);
    p.threads = vec![
        ThreadProfile {
            native_id: 7,
            name: Some("worker".into()),
            python_name: None,
            interpreters: Vec::new(),
            samples: 30,
            cpu_python_pct: 0.0,
            cpu_native_pct: 0.0,
            cpu_system_pct: 0.0,
        },
        ThreadProfile {
            native_id: 8,
            name: None,
            python_name: None,
            interpreters: Vec::new(),
            samples: 0,
            cpu_python_pct: 0.0,
            cpu_native_pct: 0.0,
            cpu_system_pct: 0.0,
        },
    ];
    p.memory = Some(MemorySummary {
        stacks: vec![MemoryStack {
            frames: p.stacks[2].frames.clone(),
            alloc_kib: 3,
        }],
        ..MemorySummary::default()
    });
    let r = decode(&p, 0);
    let d = r.dictionary.as_ref().unwrap();
    let cpu = profile_of(&r, "cpu");
    let of_thread: Vec<_> = cpu
        .samples
        .iter()
        .filter(|s| !s.attribute_indices.is_empty())
        .collect();
    assert_eq!(of_thread.len(), 1, "one stack has its thread");
    let attrs: Vec<(String, Option<AnyValue>)> = of_thread[0]
        .attribute_indices
        .iter()
        .map(|&i| {
            let a = &d.attribute_table[i as usize];
            (
                d.string_table[a.key_strindex as usize].clone(),
                a.value.clone(),
            )
        })
        .collect();
    assert_eq!(
        attrs,
        [
            ("thread.id".to_string(), Some(AttrValue::Int(7).any())),
            (
                "thread.name".to_string(),
                Some(AttrValue::Str("worker".into()).any())
            )
        ]
    );
    let alloc = profile_of(&r, "alloc_space");
    assert_eq!(alloc.samples.len(), 1);
    assert_eq!(alloc.samples[0].values, [3 * 1024]);
    // g:9's stack, the same one the time profile uses.
    assert!(cpu
        .samples
        .iter()
        .any(|s| s.stack_index == alloc.samples[0].stack_index));
}
