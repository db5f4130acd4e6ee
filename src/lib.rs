//! scalene-rs: an out-of-process, line-level Python profiler.
//!
//! Data flows one way: `ptrace`/`elf` (reading another process) → `python` (finding the
//! interpreter, walking stacks) → `sampler` → `profile` → `report` (rendering). `proc` (what
//! /proc says), `timeline` and `error` are below everything. The map for contributors:
//! docs/ARCHITECTURE.md.

// The docs are built for contributors, private items included (.ci/run: `cargo doc
// --document-private-items`). So a public item's doc may link to a private one, and the
// link resolves there.
#![allow(rustdoc::private_intra_doc_links)]

pub mod coredump;
pub(crate) mod courtesy;
mod elf;
pub mod error;
pub mod export;
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
mod timeline;

pub use error::Error;

/// The preload library's file name (the `preload/` crate). `run` preloads it and `attach`
/// injects it, so a process that has it mapped has it from us. It lives here, below both
/// modules that name it. `python` lists it among the system libraries, and `memory` loads
/// it.
pub(crate) const PRELOAD_LIBRARY: &str = "libscalene_preload.so";

/// The one fast hash map of the crate: maps and sets made and looked up at every sample.
///
/// - Keys: thread ids, addresses and the like; the aggregator's lines, functions and stacks.
/// - A fixed-key hasher (aHash). std's default hasher, SipHash with a random key, costs
///   several times more per lookup. A randomly seeded one costs that seed each time a map
///   is made.
/// - Keys come from the target. The worst a hostile one could do is slow our lookups.
/// - Iteration order is fixed for a build but arbitrary, so sort before anything is output.
pub(crate) type IdMap<K, V> =
    std::collections::HashMap<K, V, std::hash::BuildHasherDefault<ahash::AHasher>>;
/// See [`IdMap`].
pub(crate) type IdSet<K> =
    std::collections::HashSet<K, std::hash::BuildHasherDefault<ahash::AHasher>>;
