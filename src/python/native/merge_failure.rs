//! Why a thread's native frames did not merge with its Python frames, and the counts.
//!
//! Owns:
//! - [`MergeFailure`] (one variant per reason; its `Display` is the text shown in
//!   `dump --native` and counted in a profile);
//! - [`MergeCounts`] (merged and unmerged samples, by reason: the sampler's and the memory
//!   reader's).
//!
//! Must not: merge frames (`merge` in the parent does) or decide what a reason means to
//! the caller beyond its variant.
//!
//! A reason is counted by its text with addresses elided (`{:#}`):
//! - the variant's own address is written `…`;
//! - texts from other layers (an unwinder's stop, a read error, a symbol) have each
//!   hexadecimal address replaced by `…`.
//!
//! Reasons that differ only by an address count as one.

use std::collections::BTreeMap;
use std::fmt;

/// Most distinct reasons kept for unmerged samples (the rest are counted under "other").
const MAX_REASONS: usize = 32;

/// Why a thread's native and Python frames did not merge (it keeps its Python frames).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum MergeFailure {
    /// The walker's groups of frames per call do not add up to its frames.
    Ungrouped,
    /// More than the innermost frame of the evaluation loop hold no Python frames of their
    /// own (found by mark): how many.
    UnpairedLoopFrames(usize),
    /// The calls of the evaluation loop among the native frames and in the Python stack do
    /// not pair up.
    CallsDiffer {
        /// Calls found among the native frames.
        native: usize,
        /// Calls in the Python stack.
        python: usize,
        /// Python frames outside any call (told only for a stack not cut).
        outside: Option<u32>,
        /// The native unwinder stopped early: why.
        stopped: Option<String>,
        /// The native stack was cut at its depth limit.
        native_cut: bool,
    },
    /// The marks of the calls in the Python stack and its calls differ in number.
    MarksDiffer { marks: usize, calls: usize },
    /// A call's mark lies in no native frame unwound.
    MarkInNoFrame {
        /// The mark's address.
        mark: u64,
        /// The native unwinder stopped early: why.
        stopped: Option<String>,
    },
    /// Two calls' marks lie in one native frame.
    TwoCallsInOneFrame,
    /// A call's mark lies in the frame of a named function other than the loop.
    MarkInOtherFunction { function: std::sync::Arc<str> },
    /// The thread's registers and stack could not be taken: why.
    NoNativeStack(String),
    /// The thread's kernel id is not known (so its native stack was not taken).
    UnknownKernelId,
    /// The thread's Python stack could not be read: why.
    PythonNotRead(String),
    /// The process's modules could not be read.
    ModulesNotRead,
    /// A memory handshake's stack holds no frame of the preload library at its top.
    NoPreloadFrame,
    /// A memory handshake's thread could not be stopped and read: why, as the reader said.
    NotTaken(String),
    /// Not merged, with no reason given.
    NotMerged,
}

impl MergeFailure {
    /// The thread's native stack could not be taken (a thread started since the map was
    /// read, so its stack is not in it).
    pub(crate) fn is_no_stack(&self) -> bool {
        matches!(
            self,
            MergeFailure::NoNativeStack(_) | MergeFailure::UnknownKernelId
        )
    }
}

/// `why` with each hexadecimal address replaced by `…`, so reasons that differ only by an
/// address count as one.
fn without_addresses(why: &str) -> String {
    let mut out = String::with_capacity(why.len());
    let mut rest = why;
    while let Some(i) = rest.find("0x") {
        out.push_str(&rest[..i]);
        let digits = rest[i + 2..]
            .find(|c: char| !c.is_ascii_hexdigit())
            .unwrap_or(rest.len() - i - 2);
        out.push(if digits > 0 { '…' } else { '0' });
        rest = &rest[i + 2 + digits..];
        if digits == 0 {
            out.push('x');
        }
    }
    out.push_str(rest);
    out
}

/// Today's text of each reason. The alternate form (`{:#}`) elides addresses, for counting.
impl fmt::Display for MergeFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let elide = f.alternate();
        // Another layer's text, with its addresses elided when counting.
        let text = |s: &str| {
            if elide {
                without_addresses(s)
            } else {
                s.to_string()
            }
        };
        let stopped_early = |stopped: &Option<String>| {
            stopped
                .as_deref()
                .map(|s| format!(" (native unwinding stopped early: {})", text(s)))
                .unwrap_or_default()
        };
        match self {
            MergeFailure::Ungrouped => {
                f.write_str("the Python frames could not be told apart by call")
            }
            MergeFailure::UnpairedLoopFrames(n) => write!(
                f,
                "{n} frames of the evaluation loop with no Python frames of their own \
                 (the Python stack was read while a call of the loop began or ended)"
            ),
            MergeFailure::CallsDiffer {
                native,
                python,
                outside,
                stopped,
                native_cut,
            } => {
                write!(
                    f,
                    "{native} evaluation-loop calls among the native frames, \
                     {python} in the Python stack"
                )?;
                if let Some(n) = outside {
                    write!(f, ", and {n} Python frames outside any")?;
                }
                if stopped.is_some() {
                    f.write_str(&stopped_early(stopped))
                } else if *native_cut {
                    f.write_str(" (the native stack was cut at its depth limit)")
                } else {
                    Ok(())
                }
            }
            MergeFailure::MarksDiffer { marks, calls } => write!(
                f,
                "{marks} C frames of the evaluation loop marked in the Python stack, \
                 {calls} calls of it"
            ),
            MergeFailure::MarkInNoFrame { mark, stopped } => {
                let mark = if elide {
                    "…".to_string()
                } else {
                    format!("{mark:#x}")
                };
                write!(
                    f,
                    "a call of the evaluation loop ({mark}) lies in no native frame unwound{}",
                    stopped_early(stopped)
                )
            }
            MergeFailure::TwoCallsInOneFrame => {
                f.write_str("two calls of the evaluation loop in one native frame")
            }
            MergeFailure::MarkInOtherFunction { function } => write!(
                f,
                "a call of the evaluation loop lies in the frame of {}, not the loop's",
                text(function)
            ),
            MergeFailure::NoNativeStack(why) => write!(f, "no native stack: {}", text(why)),
            MergeFailure::UnknownKernelId => {
                f.write_str("no native stack: the thread's kernel id is not known")
            }
            MergeFailure::PythonNotRead(why) => {
                write!(f, "the Python stack was not read: {}", text(why))
            }
            MergeFailure::ModulesNotRead => f.write_str("the process's modules could not be read"),
            MergeFailure::NoPreloadFrame => {
                f.write_str("no frame of the preload library at the top of the stack")
            }
            MergeFailure::NotTaken(why) => f.write_str(&text(why)),
            MergeFailure::NotMerged => f.write_str("not merged"),
        }
    }
}

/// Written as its text (`dump --native`'s `unmerged`).
impl serde::Serialize for MergeFailure {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// How many thread samples merged, and why the others did not.
#[derive(Debug, Clone, Default)]
pub struct MergeCounts {
    pub merged: u64,
    pub unmerged: u64,
    /// The reasons (their text, addresses elided), each with how often it was given.
    pub reasons: BTreeMap<String, u64>,
}

impl MergeCounts {
    pub(crate) fn add(&mut self, other: &MergeCounts) {
        self.merged += other.merged;
        self.unmerged += other.unmerged;
        for (why, n) in &other.reasons {
            *self.reasons.entry(why.clone()).or_insert(0) += n;
        }
    }

    pub(crate) fn unmerged(&mut self, why: &MergeFailure) {
        self.unmerged += 1;
        let why = format!("{why:#}");
        let why = why.as_str();
        let key = if self.reasons.len() < MAX_REASONS || self.reasons.contains_key(why) {
            why.to_string()
        } else {
            "other reasons".to_string()
        };
        *self.reasons.entry(key).or_insert(0) += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_that_differ_by_an_address_count_as_one() {
        let mut c = MergeCounts::default();
        c.unmerged(&MergeFailure::MarkInNoFrame {
            mark: 0x7ffd1234,
            stopped: None,
        });
        c.unmerged(&MergeFailure::MarkInNoFrame {
            mark: 0x7ffd9999,
            stopped: None,
        });
        c.unmerged(&MergeFailure::NotTaken("0x".into()));
        assert_eq!(c.unmerged, 3);
        assert_eq!(
            c.reasons
                .get("a call of the evaluation loop (…) lies in no native frame unwound"),
            Some(&2)
        );
        assert_eq!(c.reasons.get("0x"), Some(&1));
    }

    #[test]
    fn reasons_beyond_the_limit_are_counted_together() {
        let mut c = MergeCounts::default();
        for i in 0..MAX_REASONS + 5 {
            c.unmerged(&MergeFailure::NotTaken(format!("reason {i}")));
        }
        assert_eq!(c.reasons.len(), MAX_REASONS + 1);
        assert_eq!(c.reasons.get("other reasons"), Some(&5));
        let mut sum = MergeCounts::default();
        sum.add(&c);
        sum.add(&c);
        assert_eq!(sum.unmerged, 2 * c.unmerged);
    }
}
