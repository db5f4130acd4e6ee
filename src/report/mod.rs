//! Renderers: turn snapshots and profiles into text, JSON and the other formats.
//!
//! Must not: read process memory or sample; data flows in only.

pub mod dump;
