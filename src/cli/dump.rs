//! `scalene-rs dump`: its options, made the library's [`session::DumpConfig`].
//!
//! Owns: [`DumpArgs`] and [`dump`] (the command: check the options, call the library,
//! print the snapshot as text or JSON).
//! Must not: read a process (the library does).

use super::{Usage, NATIVE_NONBLOCKING};
use scalene_rs::error::exit;
use scalene_rs::python::locals::{Budget, LocalsOptions, ReprBounds};
use scalene_rs::python::{LocateOptions, SnapshotOptions};
use scalene_rs::report;
use scalene_rs::sampler::ReadMode;
use scalene_rs::session;
use std::io::Write;

#[derive(clap::Args)]
pub(super) struct DumpArgs {
    /// The process to read.
    #[arg(required_unless_present = "core")]
    pid: Option<i32>,
    /// Read a core file instead of a running process (post-mortem): the kernel's, gdb's
    /// `gcore`, `coredumpctl dump`'s, compressed (gzip, zstd, lz4, xz) or not. Every
    /// thread's stack as for a live process, the crashing thread marked, and the crash
    /// (signal, faulting address, the function it was in) and command line.
    #[arg(
        long,
        value_name = "CORE",
        conflicts_with_all = ["pid", "subprocesses", "nonblocking", "tasks", "greenlets"]
    )]
    core: Option<std::path::PathBuf>,
    /// With --core: the executable, when it is not where the core says (nor under
    /// --lib-root).
    #[arg(long, value_name = "PATH", requires = "core")]
    executable: Option<std::path::PathBuf>,
    /// With --core: the root holding the executable and libraries as the process saw
    /// them (a container's root, a copy from another machine). Each file is checked
    /// against the core by its build id, and one that differs is named and not read.
    #[arg(long, value_name = "DIR", requires = "core")]
    lib_root: Option<std::path::PathBuf>,
    /// Print JSON (schema in docs/dump-json.md) instead of a backtrace.
    #[arg(long)]
    json: bool,
    /// Every Python process among PID and its descendants too (a gunicorn master and its
    /// workers, a multiprocessing pool), each under its own heading, read one after the
    /// other. PID itself need not be Python (a shell script, a launcher).
    #[arg(long)]
    subprocesses: bool,
    /// Do not pause the target while reading. Stacks that change under us are read again,
    /// and reported as unreadable if they keep changing.
    #[arg(long)]
    nonblocking: bool,
    /// Native (C, C++, Rust) frames too, merged with the Python frames they run. Each
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
    /// Require every greenlet's stack (gevent's, eventlet's, greenlet's). It is an error where
    /// greenlet is not imported or its greenlets cannot be read. Without it they are shown
    /// wherever greenlet is imported, and nothing is said where it is not. Each greenlet
    /// with its type, state (running, suspended, not started) and, when suspended, the
    /// stack it waits in (builds with a GIL, greenlet 2 or 3; found on the cycle collector's
    /// lists, in the same pause as the stacks).
    #[arg(long, conflicts_with = "no_greenlets")]
    greenlets: bool,
    /// Do not look for greenlets (a process with millions of objects is read faster).
    #[arg(long)]
    no_greenlets: bool,
    /// Each frame's arguments and other locals too (cells and free variables among them),
    /// each with a short repr of its value read from outside, so nothing in the target is
    /// called. Built-in types (None, bool, int, float, str, bytes, tuple, list, dict, set,
    /// frozenset) show their value; anything else `<TypeName object at 0x…>`. Read while
    /// the target is paused (not with --nonblocking, --native or --async).
    #[arg(long)]
    locals: bool,
    /// With --locals: how many levels of containers to show the items of (the value itself
    /// is the first); deeper ones show their size alone.
    #[arg(
        long,
        default_value_t = 2,
        value_parser = clap::value_parser!(u32).range(0..=64),
        requires = "locals"
    )]
    locals_depth: u32,
    /// With --locals: characters of a str or bytes, and items of a container, shown at
    /// most (the rest is cut, with "…").
    #[arg(
        long,
        default_value_t = 32,
        value_parser = clap::value_parser!(u32).range(1..=100_000),
        requires = "locals"
    )]
    locals_len: u32,
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
    if a.locals && (a.native || a.tasks || a.nonblocking) {
        return Err(Usage(
            "--locals cannot be combined with --native, --async or --nonblocking yet: \
             its values are read while the target is paused, with its Python frames alone",
        )
        .into());
    }
    if let Some(core) = a.core.clone() {
        return dump_core(a, core);
    }
    let pid = a.pid.expect("clap requires PID without --core");
    if a.native && a.nonblocking {
        return Err(Usage(NATIVE_NONBLOCKING).into());
    }
    if a.native && a.tasks {
        return Err(
            Usage("--async and --native cannot be combined yet: ask for one of them").into(),
        );
    }
    let cfg = session::DumpConfig {
        pid,
        native: a.native,
        tasks: a.tasks,
        greenlets_required: a.greenlets,
        locate: LocateOptions {
            version_override: a.python_version,
        },
        snapshot: SnapshotOptions {
            mode: if a.nonblocking {
                ReadMode::Nonblocking
            } else {
                ReadMode::Paused
            },
            locals: locals_options(&a),
            greenlets: !a.no_greenlets,
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

/// `--locals` and its bounds, as the library takes them.
fn locals_options(a: &DumpArgs) -> Option<LocalsOptions> {
    a.locals.then(|| LocalsOptions {
        bounds: ReprBounds {
            depth: a.locals_depth as usize,
            len: a.locals_len as usize,
        },
        budget: Budget::default(),
    })
}

/// `dump --core`: the core read by the library, its warnings on stderr, the snapshot on
/// stdout as text or JSON.
fn dump_core(a: DumpArgs, core: std::path::PathBuf) -> anyhow::Result<i32> {
    let locals = locals_options(&a);
    let cfg = session::CoreDumpConfig {
        core,
        files: scalene_rs::coredump::CoreOptions {
            executable: a.executable,
            lib_root: a.lib_root,
        },
        locate: LocateOptions {
            version_override: a.python_version,
        },
        max_depth: a.max_depth as usize,
        native: a.native,
        max_native_depth: a.max_native_depth as usize,
        locals,
    };
    let d = session::dump_core(&cfg)?;
    for w in &d.warnings {
        eprintln!("scalene-rs: warning: {w}");
    }
    let text = if a.json {
        report::dump::core_to_json_string(&d.snapshot, &d.core)
    } else {
        report::dump::core_to_text(&d.snapshot, &d.core)
    };
    let _ = std::io::stdout().lock().write_all(text.as_bytes());
    Ok(exit::OK)
}
