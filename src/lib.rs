//! scalene-rs: an out-of-process, line-level Python profiler.
//!
//! Data flows one way: `ptrace`/`elf` (reading another process) → `python` (finding the
//! interpreter, walking stacks) → `sampler` → `profile` → `report` (rendering); `proc` (what
//! /proc says) and `error` are below everything. See docs/how-it-works.md.

pub(crate) mod courtesy;
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

/// The preload library's file name (the `preload/` crate). `run` preloads it and `attach`
/// injects it: a process that has it mapped has it from us. It lives here, below both
/// modules that name it: `python` lists it among the system libraries, `memory` loads it.
pub(crate) const PRELOAD_LIBRARY: &str = "libscalene_preload.so";

/// Maps and sets keyed by thread ids, addresses and the like, made and looked up at every
/// sample: a fixed-key hasher (std's default hasher, SipHash with a random key, costs
/// several times more per lookup, and a randomly seeded one costs that seed each time a map
/// is made). Keys come from the target; the worst a hostile one could do is slow our lookups.
pub(crate) type IdMap<K, V> =
    std::collections::HashMap<K, V, std::hash::BuildHasherDefault<ahash::AHasher>>;
/// See [`IdMap`].
pub(crate) type IdSet<K> =
    std::collections::HashSet<K, std::hash::BuildHasherDefault<ahash::AHasher>>;
