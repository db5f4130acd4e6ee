//! The `scalene-rs` command line: parse arguments, call the library, map errors to exit codes.
//! Nothing else lives here.

use clap::{Parser, Subcommand};
use scalene_rs::error::exit;
use scalene_rs::python::{self, LocateOptions, PythonProcess, SnapshotOptions, StackWalker};
use scalene_rs::report;
use std::io::Write;

#[derive(Parser)]
#[command(
    name = "scalene-rs",
    version,
    about = "An out-of-process, line-level profiler for Python (CPython 2.7, 3.6–3.13; 3.14+ untested)",
    after_help = "Exit codes: 0 ok, 1 other error, 2 usage, 3 no such process, 4 not a Python process, \
5 permission denied, 6 unsupported Python version, 7 the process exited while being read."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print every thread's Python stack in a running process, innermost frame first.
    Dump(DumpArgs),
}

#[derive(clap::Args)]
struct DumpArgs {
    /// The process to read.
    pid: i32,
    /// Print JSON (schema in docs/dump-json.md) instead of a backtrace.
    #[arg(long)]
    json: bool,
    /// Do not pause the target while reading: stacks that change under us are read again,
    /// and reported as unreadable if they keep changing.
    #[arg(long)]
    nonblocking: bool,
    /// Cut stacks deeper than this (the output says when it did).
    #[arg(long, default_value_t = 4096, value_parser = clap::value_parser!(u32).range(1..))]
    max_depth: u32,
    /// Treat the target as this Python version (X.Y) instead of detecting it.
    #[arg(long, value_name = "X.Y", value_parser = parse_major_minor, hide = true)]
    python_version: Option<(u32, u32)>,
}

fn parse_major_minor(s: &str) -> Result<(u32, u32), String> {
    let (a, b) = s
        .split_once('.')
        .ok_or_else(|| format!("expected X.Y, got {s:?}"))?;
    Ok((
        a.parse().map_err(|_| format!("bad major version in {s:?}"))?,
        b.parse().map_err(|_| format!("bad minor version in {s:?}"))?,
    ))
}

/// Plain configuration for `dump`, built from the arguments.
struct DumpConfig {
    pid: i32,
    json: bool,
    locate: LocateOptions,
    snapshot: SnapshotOptions,
    max_depth: usize,
}

impl From<DumpArgs> for DumpConfig {
    fn from(a: DumpArgs) -> Self {
        DumpConfig {
            pid: a.pid,
            json: a.json,
            locate: LocateOptions {
                version_override: a.python_version,
            },
            snapshot: SnapshotOptions {
                nonblocking: a.nonblocking,
                ..Default::default()
            },
            max_depth: a.max_depth as usize,
        }
    }
}

fn dump(cfg: DumpConfig) -> Result<(), scalene_rs::Error> {
    if cfg.pid <= 0 {
        return Err(scalene_rs::Error::NoSuchProcess(cfg.pid));
    }
    let proc = PythonProcess::locate(cfg.pid, &cfg.locate)?;
    let mut walker = StackWalker::new(proc.layout, proc.addrs.types);
    walker.max_depth = cfg.max_depth;
    let snap = python::take_snapshot(&proc, &mut walker, &cfg.snapshot)?;
    let text = if cfg.json {
        let mut s = serde_json::to_string_pretty(&report::dump::to_json(&snap))
            .expect("JSON of a snapshot");
        s.push('\n');
        s
    } else {
        report::dump::to_text(&snap)
    };
    // A closed pipe (`| head`) is not an error worth a message.
    let _ = std::io::stdout().lock().write_all(text.as_bytes());
    Ok(())
}

fn main() {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() { exit::USAGE } else { exit::OK };
            let _ = e.print();
            std::process::exit(code);
        }
    };
    let result = match cli.command {
        Command::Dump(args) => dump(args.into()),
    };
    if let Err(e) = result {
        // One line: newlines inside a message would break scripts that read stderr.
        let msg = e.to_string().replace('\n', " ");
        eprintln!("error: {msg}");
        std::process::exit(e.exit_code());
    }
}
