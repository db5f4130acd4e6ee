//! Memory accounting: the consumer side of the preload library's shared-memory ring.
//!
//! Owns: the embedded preload library and writing it out privately ([`preload`]), creating,
//! reading and removing rings ([`ring`]).
//! Must not: read the target's Python stacks itself (the session hands it a reader) or
//! format output.

pub mod preload;
pub mod ring;
