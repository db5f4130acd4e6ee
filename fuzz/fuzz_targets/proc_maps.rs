//! Fuzz target: see `scalene_rs::fuzzing::proc_maps`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| scalene_rs::fuzzing::proc_maps(data));
