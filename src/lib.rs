//! scalene-rs: an out-of-process, line-level Python profiler.
//!
//! Data flows one way: `ptrace`/`elf` (reading another process) → `python` (finding the
//! interpreter, walking stacks) → `sampler` → `profile` → `report` (rendering); `proc` (what
//! /proc says) and `error` are below everything. See docs/how-it-works.md.

mod elf;
pub mod error;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
pub mod gpu;
pub mod memory;
pub mod native;
pub mod proc;
pub mod profile;
pub mod ptrace;
pub mod python;
pub mod python_bindings;
pub mod report;
pub mod sampler;
pub mod session;

pub use error::Error;
