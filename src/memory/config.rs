//! What to record of memory, chosen by the user. It is read by the consumer (windows,
//! library frames) and by the preload library's environment (how Python's allocator is
//! reached).
//!
//! Owns: [`MemoryConfig`], [`PythonAllocator`].
//! Must not: depend on the rest of `memory` (both sides of it use these).

/// How memory is recorded.
#[derive(Debug, Clone)]
pub struct MemoryConfig {
    /// Net allocation per sampled event, bytes.
    pub window: u64,
    /// Copied bytes per sampled event.
    pub copy_window: u64,
    /// Keep stdlib / site-packages lines (else their bytes go to the calling user line).
    pub profile_all: bool,
    /// How the program's Python objects are counted.
    pub python_allocator: PythonAllocator,
}

/// How the interpreter's own allocations reach the preload library.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PythonAllocator {
    /// pymalloc stays on, its allocator wrapped by the library so that every object is
    /// counted (CPython 3.8+); `PYTHONMALLOC=malloc` for older interpreters.
    Wrapped,
    /// `PYTHONMALLOC=malloc` for every interpreter: every object goes through the C
    /// allocator (its frees are counted too, so small objects count in the footprint
    /// exactly). It is slower, because glibc's malloc is slower than pymalloc on small
    /// objects.
    Malloc,
    /// pymalloc untouched. Small objects are counted by the arenas the interpreter maps for
    /// them (a line's growth is seen, its churn of small objects is not). Cheapest.
    Pymalloc,
}

impl Default for MemoryConfig {
    fn default() -> Self {
        MemoryConfig {
            window: 1 << 20,
            copy_window: 1 << 20,
            profile_all: false,
            python_allocator: PythonAllocator::Wrapped,
        }
    }
}
