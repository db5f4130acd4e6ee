//! Memory accounting: the consumer side of the preload library's shared-memory ring.
//!
//! Owns: the user's choices ([`config`]), the embedded preload library and writing it out privately ([`preload`]), creating,
//! reading and removing rings ([`ring`]), the consumer thread that ties events to lines
//! ([`consumer`]), an allocation's native frames under `--native` ([`native`]), one ring
//! and consumer per process of the program ([`fleet`]) and folding events into per-line
//! results ([`aggregate`]).
//! Must not: pause the target (`--native` stops only the thread that waits in the
//! handshake, for the copy of its stack) or format output.

pub(crate) mod aggregate;
mod config;
pub mod consumer;
pub(crate) mod fleet;
pub(crate) mod inject;
pub(crate) mod native;
pub mod preload;
pub mod ring;
