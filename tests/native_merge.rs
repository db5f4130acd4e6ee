//! The merge rate of `dump --native` on realistic workloads, on every interpreter.
//!
//! fixtures/native/workloads.py runs two CPU-bound workloads of our own at once, forever: a
//! small ray tracer (operator methods called back from C, recursion, math, min() with a
//! key) in the main thread and a Julia set (complex arithmetic) in another; the GIL passes
//! between them, so a snapshot finds threads in the interpreter, in C called from it, in
//! allocation, and waiting for the GIL. The test takes [`SNAPSHOTS`] snapshots of it, every
//! [`INTERVAL`] (about 2 s in all): the snapshots `dump --native --json` takes (the same
//! library calls and the same JSON, with the target's modules read once, as a profile does,
//! rather than once per process started), and counts the Python threads whose native frames
//! merged with their Python frames. At least [`MIN_RATE`] of them must: with 200 threads
//! sampled, that is every one. Each merged stack must also be right by construction: its
//! Python frames are the thread's Python stack, in order, and no frame of the evaluation
//! loop is left among its native frames (each call of the loop is replaced by the Python
//! frames it runs; on a tail-call build, with the handler above it) but the innermost one,
//! when it is starting or ending its call.

mod common;

use scalene_rs::native::NativeCache;
use scalene_rs::python::{self, LocateOptions, PythonProcess, PythonReader, SnapshotOptions};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// Snapshots per interpreter.
const SNAPSHOTS: usize = 100;
/// Between two snapshots (the target runs meanwhile).
const INTERVAL: Duration = Duration::from_millis(15);
/// Merged threads over all threads sampled.
const MIN_RATE: f64 = 0.999;
const READY_TIMEOUT: Duration = Duration::from_secs(30);

// The fields of `dump --native --json` read here (docs/dump-json.md).

#[derive(Deserialize)]
struct Dump {
    threads: Vec<Thread>,
    native: Summary,
}

#[derive(Deserialize)]
struct Summary {
    merged: usize,
    unmerged: usize,
}

#[derive(Deserialize)]
struct Thread {
    frames: Vec<PyFrame>,
    native: View,
}

#[derive(Deserialize)]
struct View {
    merged: bool,
    truncated: bool,
    stack: Vec<Entry>,
    #[serde(default)]
    unmerged: Option<String>,
    #[serde(default)]
    native_frames: Vec<NFrame>,
}

#[derive(Deserialize)]
struct NFrame {
    symbol: Option<String>,
}

#[derive(Deserialize, PartialEq, Debug)]
struct PyFrame {
    function: String,
    filename: String,
    line: Option<i64>,
}

#[derive(Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
enum Entry {
    Python(PyFrame),
    Native { symbol: Option<String> },
}

/// Why a merged stack is wrong, if it is.
fn wrong_merge(t: &Thread) -> Option<String> {
    let mut py = Vec::new();
    let mut loop_frames = 0;
    for e in &t.native.stack {
        match e {
            Entry::Python(p) => py.push(p),
            Entry::Native { symbol: Some(s) } => {
                let base = s.split('.').next().unwrap_or(s);
                // Only the innermost call of the loop may be left, starting or ending
                // (its Python frame not linked yet or any more).
                if base == "_PyEval_EvalFrameDefault" || base == "PyEval_EvalFrameEx" {
                    loop_frames += 1;
                    if loop_frames > 1 || !py.is_empty() {
                        return Some(format!("{s} left among the merged frames"));
                    }
                }
                // A tail-call build's handler goes with the call of the loop below it; one
                // is left only above that innermost call, starting or ending.
                if base.starts_with("_TAIL_CALL_") && (loop_frames > 0 || !py.is_empty()) {
                    return Some(format!("{s} left among the merged frames"));
                }
            }
            Entry::Native { symbol: None } => {}
        }
    }
    let whole: Vec<&PyFrame> = t.frames.iter().collect();
    if py != whole && !t.native.truncated {
        return Some(format!(
            "Python frames {py:?} in the merged stack, {whole:?} in the Python stack"
        ));
    }
    None
}

/// A stack, one entry a line, innermost first.
fn show(stack: &[Entry]) -> String {
    let line = |e: &Entry| match e {
        Entry::Python(p) => format!("{} ({}:{:?})", p.function, p.filename, p.line),
        Entry::Native { symbol } => symbol.as_deref().unwrap_or("?").to_string(),
    };
    stack
        .iter()
        .enumerate()
        .map(|(i, e)| format!("    #{i} {}", line(e)))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Kills and reaps the fixture when dropped.
struct Kill(std::process::Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn merge_rate(interp: &common::Interpreter) -> Result<String, String> {
    let script = common::fixture("native/workloads.py");
    let f = common::start_fixture(interp, &script, &[] as &[&str], false)?;
    let pid = f.pid;
    let _target = Kill(f.child);
    match f.lines.recv_timeout(READY_TIMEOUT) {
        Ok(l) if l == "ready" => {}
        other => return Err(format!("workloads.py did not print `ready`: {other:?}")),
    }
    let proc = PythonProcess::locate(pid, &LocateOptions::default()).map_err(|e| e.to_string())?;
    let mut cache = NativeCache::new();
    let native = python::native_process(&proc, &mut cache).map_err(|e| e.to_string())?;
    let mut reader = PythonReader::new(proc);
    reader.set_native(Some(native));
    let opts = SnapshotOptions::default();
    let (mut merged, mut total) = (0usize, 0usize);
    let mut why: BTreeMap<String, usize> = BTreeMap::new();
    let started = Instant::now();
    for _ in 0..SNAPSHOTS {
        let snap = reader
            .snapshot(&opts)
            .map_err(|e| format!("snapshot: {e}"))?;
        let json = scalene_rs::report::dump::to_json_string(&snap);
        let d: Dump = serde_json::from_str(&json).map_err(|e| format!("{e}: {json}"))?;
        if d.native.merged + d.native.unmerged != d.threads.len() {
            return Err(format!(
                "the header counts {} merged and {} unmerged of {} threads",
                d.native.merged,
                d.native.unmerged,
                d.threads.len()
            ));
        }
        for t in &d.threads {
            total += 1;
            if !t.native.merged {
                let mut reason = t.native.unmerged.clone().unwrap_or_default();
                if let Some(top) = t.native.native_frames.get(..3) {
                    let names: Vec<&str> = top
                        .iter()
                        .map(|f| f.symbol.as_deref().unwrap_or("?"))
                        .collect();
                    reason.push_str(&format!(" (innermost: {})", names.join(" < ")));
                }
                *why.entry(reason).or_default() += 1;
                continue;
            }
            if let Some(wrong) = wrong_merge(t) {
                return Err(format!(
                    "a merged stack is wrong: {wrong}\n{}",
                    show(&t.native.stack)
                ));
            }
            merged += 1;
        }
        std::thread::sleep(INTERVAL);
    }
    let rate = merged as f64 / total.max(1) as f64;
    let summary = format!(
        "{merged}/{total} threads merged ({:.2}%) in {SNAPSHOTS} snapshots, {:.1} s",
        100.0 * rate,
        started.elapsed().as_secs_f64()
    );
    if total < 2 * SNAPSHOTS || rate < MIN_RATE {
        return Err(format!("{summary}; unmerged: {why:?}"));
    }
    Ok(summary)
}

#[test]
fn native_frames_merge_on_at_least_99_9_percent_of_realistic_samples() {
    common::for_each_interpreter(merge_rate);
}
