//! The aggregated profile: what a recording produces and every renderer consumes.
//!
//! Owns: [`Aggregator`] (folds samples into per-line / per-function / per-stack totals as
//! they arrive, so memory stays bounded however long the run) and [`Profile`] (the finished,
//! serializable result, whose JSON form is documented in docs/profile-json.md).
//! Must not: read process memory or format output.
//!
//! Files (every item is re-exported here, so callers name `crate::profile::X`):
//! - `data`: [`Profile`] itself, its stacks, threads and processes, the time [`Split`].
//! - `meta`: [`ProfileMeta`], the facts about the recording.
//! - `file`: [`FileProfile`], its lines and functions, and the source text kept.
//! - `memory`: the memory figures ([`LineMemory`], [`MemorySummary`]).
//! - `gpu`: the GPU figures ([`LineGpu`], [`GpuSummary`]).
//! - `frame`: [`Frame`], [`Name`] and which frame is charged for a sample.
//! - `aggregate`: [`Aggregator`], which folds samples and finishes the [`Profile`].

mod aggregate;
mod data;
mod file;
mod frame;
mod gpu;
mod memory;
mod meta;
#[cfg(test)]
mod tests;
mod window;

pub(crate) use aggregate::{Activity, Aggregator, ThreadSample};
pub(crate) use data::ThreadLabel;
pub use data::{
    ProcessProfile, Profile, Split, StackProfile, ThreadProfile, PROFILE_SCHEMA_VERSION,
};
pub(crate) use file::SOURCE_CONTEXT;
pub use file::{
    FileProfile, FunctionProfile, LineProfile, NativeFunction, SourceLine, FULL_SOURCE_MAX_BYTES,
    FULL_SOURCE_MAX_LINES, NATIVE_FUNCTIONS_PER_LINE,
};
pub(crate) use frame::charged_frame;
pub use frame::{Frame, Name};
pub use gpu::{GpuDevice, GpuStack, GpuSummary, LineGpu};
pub use memory::{
    Leak, LineMemory, MemoryNativeMeta, MemoryStack, MemorySummary, NativeAllocation,
};
pub use meta::{NativeMeta, ProfileMeta, TimeMode};
