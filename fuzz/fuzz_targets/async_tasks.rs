//! Fuzz target: see `scalene_rs::fuzzing::async_tasks`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| scalene_rs::fuzzing::async_tasks(data));
