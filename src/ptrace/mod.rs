//! Another process's memory and threads: reads, pauses, the remote call.
//!
//! Owns:
//! - [`ProcessMemory`], the one way the crate reads a target (`memory.rs`);
//! - [`RemoteMemory`], a live process's memory (`live.rs`), and [`TargetMemory`], that
//!   or memory saved from a process (a core file's), the one a target is read through
//!   (`target.rs`);
//! - `PageCache`, one snapshot's page cache (`cache.rs`), with its second look
//!   (`second_look.rs`) and the spare buffers reads reuse (`pool.rs`);
//! - `pause::PausedThreads`, every thread stopped for a consistent read;
//! - the call of a function inside the target (`remote.rs`, `trampoline.rs`).
//!
//! Must not:
//! - know anything about Python;
//! - read /proc beyond a target's `mem` file: its threads, namespaces and states come from
//!   [`crate::proc`].

mod cache;
mod live;
mod memory;
pub(crate) mod pause;
mod pool;
#[cfg(target_arch = "x86_64")]
pub(crate) mod remote;
mod second_look;
mod target;
pub(crate) mod trampoline;

pub(crate) use cache::{PageCache, CACHE_PAGE};
pub use live::RemoteMemory;
#[cfg(any(test, feature = "fuzzing"))]
pub(crate) use memory::BufferMemory;
pub use memory::ProcessMemory;
pub(crate) use memory::{field_u32, field_u64, field_u8};
pub(crate) use pool::{give_back_buf, take_buf};
pub use target::TargetMemory;
