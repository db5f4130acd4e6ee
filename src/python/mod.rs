//! The CPython interpreter of a live process: find it, and read every thread's stack.
//!
//! Owns nothing itself. It names its files and re-exports what the rest of the crate uses.
//!
//! The way in is [`PythonReader`] (`reader.rs`). [`PythonReader::snapshot`] gives a
//! [`Snapshot`] (`snapshot.rs`), read as [`SnapshotOptions`] says.
//!
//! The files:
//! - `process.rs` finds the interpreter, its version, layout and addresses; `postmortem.rs`
//!   finds it in a core file (no /proc).
//! - `read/` takes one read of every thread (paused, unpaused and verified, re-read
//!   paused). It holds the live-process parts around the pure walker: thread ids from
//!   /proc, idle detection, torn stacks detected and retried.
//! - `stack/` is the walker over the memory trait (thread list, frames, verification).
//! - `tids.rs` says which kernel thread each thread state is.
//! - `rest.rs` keeps what a caller knows of the threads at rest ([`RestTracker`]).
//! - `frame.rs` holds [`Frame`] and [`Name`], what a walk yields.
//! - `native.rs` and `native_view.rs` merge native frames with the Python ones.
//! - `asyncio.rs` and `asyncio_legacy.rs` read every event loop's tasks.
//! - `greenlets.rs` reads every greenlet's stack (gevent's), found on the collector's
//!   lists.
//! - `thread_names.rs` reads the names the program gave its threads, through the object
//!   reader of `objects.rs` (dicts, attributes, ints and strs of every version).
//! - `thread_reader.rs` reads one thread's stack at a time, for the memory recorder.
//!
//! Must not: format output.

mod asyncio;
mod asyncio_legacy;
mod frame;
mod greenlets;
pub mod linetable;
pub mod locals;
mod native;
mod native_view;
mod objects;
mod postmortem;
mod process;
mod read;
mod reader;
mod rest;
mod snapshot;
mod stack;
mod strings;
mod thread_names;
mod thread_reader;
pub(crate) mod tids;
pub(crate) mod version;

#[cfg(feature = "fuzzing")]
pub(crate) use asyncio::fuzz_tasks;
pub use asyncio::{
    unsupported as async_unsupported, AsyncReader, AsyncSnapshot, LoopTasks, TaskInfo,
};
#[cfg(test)]
pub(crate) use frame::test_frame;
pub use frame::{Frame, Name};
pub use greenlets::{GreenletInfo, GreenletSnapshot, GreenletState};
pub use native::{check_can_stop, native_process};
pub(crate) use native::{MergeCounts, MergeFailure};
pub(crate) use native_view::{NativeView, StackEntry};
pub use process::{LocateOptions, PythonProcess};
pub(crate) use read::still::SavedThread;
pub use reader::PythonReader;
pub(crate) use rest::{LastRead, Listing};
pub use rest::{RestTracker, ReuseDelta};
pub use snapshot::{
    ProcessSnapshot, ReadMode, Snapshot, SnapshotOptions, ThreadSnapshot, TreeSnapshot, Unread,
};
pub use stack::StackWalker;
#[cfg(feature = "fuzzing")]
pub(crate) use strings::TypeAddrs;
pub(crate) use thread_reader::{waiting_view, ThreadReader, WaitingThread};
