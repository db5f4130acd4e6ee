//! Fuzz target: see `scalene_rs::fuzzing::stack_walk`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| scalene_rs::fuzzing::stack_walk(data));
