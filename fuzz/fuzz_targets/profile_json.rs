//! Fuzz target: see `scalene_rs::fuzzing::profile_json`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| scalene_rs::fuzzing::profile_json(data));
