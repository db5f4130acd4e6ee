//! `scalene-rs dump`: its options, made the library's [`session::DumpConfig`].
//!
//! Owns: [`DumpArgs`] and [`dump`] (the command: check the options, call the library,
//! print the snapshot as text or JSON). Must not: read a process (the library does).

use super::{Usage, NATIVE_NONBLOCKING};
use scalene_rs::error::exit;
use scalene_rs::python::{LocateOptions, SnapshotOptions};
use scalene_rs::report;
use scalene_rs::sampler::ReadMode;
use scalene_rs::session;
use std::io::Write;

#[derive(clap::Args)]
pub(super) struct DumpArgs {
    /// The process to read.
    pid: i32,
    /// Print JSON (schema in docs/dump-json.md) instead of a backtrace.
    #[arg(long)]
    json: bool,
    /// Every Python process among PID and its descendants too (a gunicorn master and its
    /// workers, a multiprocessing pool), each under its own heading, read one after the
    /// other. PID itself need not be Python (a shell script, a launcher).
    #[arg(long)]
    subprocesses: bool,
    /// Do not pause the target while reading: stacks that change under us are read again,
    /// and reported as unreadable if they keep changing.
    #[arg(long)]
    nonblocking: bool,
    /// Native (C, C++, Rust) frames too, merged with the Python frames they run: each
    /// thread is stopped for a moment to read its registers and stack (needs ptrace, like
    /// the default dump; not with --nonblocking). Threads with no Python thread state are
    /// listed with their native stacks.
    #[arg(long)]
    native: bool,
    /// Asyncio tasks too: per thread running an event loop, every task with its name, id
    /// and coroutine stack, as a tree of who awaits whom (Python 3.11+, read in the same
    /// pause as the stacks).
    #[arg(long = "async")]
    tasks: bool,
    /// Cut stacks deeper than this (the output says when it did).
    #[arg(long, default_value_t = 4096, value_parser = clap::value_parser!(u32).range(1..))]
    max_depth: u32,
    /// With --native: cut native stacks deeper than this many frames (the output says
    /// when it did; what was unwound is merged with the Python frames as far as it goes).
    #[arg(
        long,
        default_value_t = scalene_rs::native::MAX_NATIVE_FRAMES as u32,
        value_parser = clap::value_parser!(u32).range(1..),
        requires = "native"
    )]
    max_native_depth: u32,
    /// Treat the target as this Python version (X.Y) instead of detecting it.
    #[arg(long, value_name = "X.Y", value_parser = parse_major_minor, hide = true)]
    python_version: Option<(u32, u32)>,
}

fn parse_major_minor(s: &str) -> Result<(u32, u32), String> {
    let (a, b) = s
        .split_once('.')
        .ok_or_else(|| format!("expected X.Y, got {s:?}"))?;
    Ok((
        a.parse()
            .map_err(|_| format!("bad major version in {s:?}"))?,
        b.parse()
            .map_err(|_| format!("bad minor version in {s:?}"))?,
    ))
}

/// `dump`: its arguments checked and made the library's plain configuration, the snapshot
/// read by the library, printed as text or JSON.
pub(super) fn dump(a: DumpArgs) -> anyhow::Result<i32> {
    if a.native && a.nonblocking {
        return Err(Usage(NATIVE_NONBLOCKING).into());
    }
    if a.native && a.tasks {
        return Err(
            Usage("--async and --native cannot be combined yet: ask for one of them").into(),
        );
    }
    let cfg = session::DumpConfig {
        pid: a.pid,
        native: a.native,
        tasks: a.tasks,
        locate: LocateOptions {
            version_override: a.python_version,
        },
        snapshot: SnapshotOptions {
            mode: if a.nonblocking {
                ReadMode::Nonblocking
            } else {
                ReadMode::Paused
            },
            ..Default::default()
        },
        max_depth: a.max_depth as usize,
        max_native_depth: a.max_native_depth as usize,
    };
    let text = if a.subprocesses {
        let tree = session::dump_tree(&cfg)?;
        if a.json {
            report::dump::tree_to_json_string(&tree)
        } else {
            report::dump::tree_to_text(&tree)
        }
    } else {
        let snap = session::dump(&cfg)?;
        if a.json {
            report::dump::to_json_string(&snap)
        } else {
            report::dump::to_text(&snap)
        }
    };
    // A closed pipe (`| head`) is not an error worth a message.
    let _ = std::io::stdout().lock().write_all(text.as_bytes());
    Ok(exit::OK)
}
