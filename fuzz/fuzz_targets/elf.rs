//! Fuzz target: see `scalene_rs::fuzzing::elf`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| scalene_rs::fuzzing::elf(data));
