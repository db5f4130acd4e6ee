//! From an observation to the aggregate: one charge folded in, the sources read while the
//! target is there, and where each thread was for the GPU ledger.
//!
//! Owns: [`charge`], [`record_positions`], [`absolute`] and [`read_source`].
//! Must not: decide what a sample charges (`attribution` does).

use super::attribution::{Charge, Observation};
use crate::profile::{Aggregator, ThreadSample};
use crate::python::PythonProcess;
use crate::IdMap;

/// Folds one charge into `agg` (nothing when it carries no time), charged to the frame
/// the attribution rule picks. A target with its own files (a container's): a source is
/// read while the process is there to show it, not at the end (it may have exited, taking
/// its files' view along).
pub(super) fn charge(
    agg: &mut Aggregator,
    sources: &mut IdMap<String, Option<Vec<String>>>,
    proc: &PythonProcess,
    cwd: Option<&str>,
    profile_all: bool,
    c: Charge<'_>,
) {
    if c.user_s + c.system_s + c.idle_s <= 0.0 {
        return;
    }
    let sample = ThreadSample {
        frames: c.frames,
        activity: c.activity,
        user_s: c.user_s,
        system_s: c.system_s,
        idle_s: c.idle_s,
        native_id: Some(c.tid),
        thread_name: None,
        counts: c.counts,
    };
    let attribution = crate::profile::charged_frame(c.frames, profile_all);
    if !proc.namespaces.same_files {
        if let Some(f) = attribution {
            if !sources.contains_key(&*f.filename) {
                let text = read_source(proc.pid, &absolute(&f.filename, cwd));
                sources.insert(f.filename.to_string(), text);
            }
        }
    }
    agg.add(&sample, attribution);
}

/// Positions not taken by the GPU ledger past this many are dropped (it takes them every
/// tick; this only bounds a buffer nobody drains).
const POSITIONS_MAX: usize = 1 << 16;

/// Adds where each thread of one sample is, with the sample's wall-clock time.
pub(super) fn record_positions(
    buf: &mut Vec<crate::timeline::Position>,
    seen: &[Observation],
    pid: i32,
    profile_all: bool,
    wall_s: f64,
) {
    if buf.len() + seen.len() > POSITIONS_MAX {
        return;
    }
    let t_us = crate::timeline::now_us();
    for o in seen {
        buf.push(crate::timeline::Position {
            t_us,
            pid,
            tid: o.tid,
            frames: std::sync::Arc::from(o.frames.as_slice()),
            charged: crate::profile::charged_frame(&o.frames, profile_all).cloned(),
            cpu_s: o.user_s + o.system_s,
            interval_us: (wall_s * 1e6) as u64,
        });
    }
}

/// The address range where `pid` maps `file` (all its mappings together).
pub(super) fn mapping_of(pid: i32, file: &std::path::Path) -> Option<(u64, u64)> {
    let maps = crate::proc::read_maps(pid).ok()?;
    crate::proc::maps::range_of(&maps, &file.to_string_lossy())
}

/// `file` made absolute against `cwd` when it is relative (`python app.py` records "app.py").
pub(crate) fn absolute(file: &str, cwd: Option<&str>) -> String {
    match cwd {
        Some(dir) if !file.starts_with('/') && !file.starts_with('<') => {
            format!("{}/{file}", dir.trim_end_matches('/'))
        }
        _ => file.to_string(),
    }
}

/// A source file's lines, read as the target sees the file (inside its root, symbolic links
/// included) while the process is there. Our own file of that path only when the target
/// shares our mounts, or is gone (a finished `run`, a saved profile).
pub(crate) fn read_source(pid: i32, file: &str) -> Option<Vec<String>> {
    use std::io::Read;
    if !file.starts_with('/') {
        return None;
    }
    let ours = || std::fs::read(file).ok();
    let bytes = if crate::proc::ns::Namespaces::of(pid).same_files {
        ours()?
    } else {
        match crate::proc::ns::open_in_root(pid, file) {
            Ok(mut f) => {
                let mut bytes = Vec::new();
                f.read_to_end(&mut bytes).ok()?;
                bytes
            }
            Err(_) if !crate::proc::process_exists(pid) => ours()?,
            Err(_) => return None,
        }
    };
    Some(
        String::from_utf8_lossy(&bytes)
            .lines()
            .map(|l| l.to_string())
            .collect(),
    )
}
