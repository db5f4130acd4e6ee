//! Fuzz target: see `scalene_rs::fuzzing::line_table`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| scalene_rs::fuzzing::line_table(data));
