//! The `scalene-rs` command line: parse arguments, call the library, map errors to exit codes.
//! Nothing else lives here.

use clap::{Parser, Subcommand};
use scalene_rs::error::exit;
use scalene_rs::memory::consumer::{MemoryConfig, PythonAllocator};
use scalene_rs::profile::Profile;
use scalene_rs::python::LocateOptions;
use scalene_rs::report::{self, Format, RenderOptions};
use scalene_rs::sampler::{ReadMode, SamplerConfig, Stats};
use scalene_rs::session;
use std::io::{IsTerminal, Write};

#[path = "cli/agent.rs"]
mod agent_cli;
#[path = "cli/dump.rs"]
mod dump_cli;
#[path = "cli/sizes.rs"]
mod sizes;
use sizes::window_bytes;

#[derive(Parser)]
#[command(
    name = "scalene-rs",
    version,
    about = "An out-of-process, line-level profiler for Python (CPython 2.7, 3.6–3.15, free-threaded 3.13t; 3.16+ untested)",
    after_help = "Exit codes: 0 ok, 1 other error, 2 usage, 3 no such process, 4 not a Python process, \
5 permission denied, 6 unsupported Python version, 7 the process exited while being read."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start COMMAND (e.g. `python app.py`) and profile it until it exits.
    Run(RunArgs),
    /// Profile a running Python process until Ctrl-C, --duration, or its exit.
    Attach(AttachArgs),
    /// Print every thread's Python stack in a running process (or, --subprocesses, in each
    /// Python process of its tree), innermost frame first.
    Dump(dump_cli::DumpArgs),
    /// Watch a running process (PID) or a command (after `--`) live, line by line, full screen.
    Top(TopArgs),
    /// Render a saved profile (.json) again, in any format.
    View(ViewArgs),
    /// Profile every Python process of this host, continuously, pushing to a backend.
    Agent(agent_cli::AgentArgs),
}

/// Options shared by `run` and `attach`.
#[derive(clap::Args, Clone)]
struct RecordArgs {
    /// Samples per second.
    #[arg(long, default_value_t = 100.0, value_parser = parse_rate)]
    rate: f64,
    /// Count time threads spend off the CPU (sleeping, waiting) too. Default: CPU time only.
    #[arg(long)]
    wall: bool,
    /// Per-thread breakdown in the report.
    #[arg(long)]
    threads: bool,
    /// Count only samples of the thread holding the GIL.
    #[arg(long)]
    gil: bool,
    /// Never pause the target. A stack that keeps changing while it is read is counted as
    /// lost. (Default: read without pausing, validate, and pause only to re-read such a stack.)
    #[arg(long, conflicts_with = "blocking")]
    nonblocking: bool,
    /// Pause the target's threads for every sample (exact stacks; costs the target tens of
    /// microseconds per sample; each sample is followed by at least as long with the target
    /// running, so past a few kHz ticks are missed).
    #[arg(long)]
    blocking: bool,
    /// Native (C, C++, Rust) frames too. Every sample stops each thread for a moment to
    /// read its registers and stack (as --blocking does; needs ptrace; not with
    /// --nonblocking). Flame graphs and stacks show them merged with the Python frames, and
    /// each line with native time lists the native functions it was spent in.
    #[arg(long)]
    native: bool,
    /// Asyncio-aware stacks (Python 3.11+). A thread running a task is charged to that
    /// task's coroutines joined to those of the tasks awaiting it, root task first. The
    /// tasks' names are frames (`task NAME`), and the event loop's own frames are left out.
    #[arg(long = "async", conflicts_with = "native")]
    tasks: bool,
    /// Report stdlib and site-packages lines too (by default their time goes to the line of
    /// your code that called them).
    #[arg(long)]
    profile_all: bool,
    /// Do not watch NVIDIA GPUs. By default NVML (libnvidia-ml.so.1, or the library
    /// SCALENE_RS_NVML_LIB names) is asked, from our own process, how busy each GPU keeps
    /// the program's processes and how much GPU memory they hold.
    #[arg(long)]
    no_gpu: bool,
    /// Say why when there are no GPU figures. Without it a machine with no NVIDIA driver
    /// (most machines) goes unmentioned; with it, or with SCALENE_RS_NVML_LIB set, the
    /// report says the driver is missing.
    #[arg(long = "gpu", conflicts_with = "no_gpu")]
    want_gpu: bool,
    #[command(flatten)]
    output: OutputArgs,
    #[command(flatten)]
    push: PushArgs,
}

/// `--push`: windows sent to a continuous-profiling backend while recording.
#[derive(clap::Args, Clone)]
struct PushArgs {
    /// Send the recording, window by window, to the continuous-profiling backend at URL
    /// (Grafana Pyroscope: http://HOST:4040; an OpenTelemetry Collector: http://HOST:4317
    /// for OTLP/gRPC, http://HOST:4318 for OTLP/HTTP), while profiling goes on. Credentials
    /// come from the environment only: SCALENE_RS_PUSH_TOKEN (bearer), or SCALENE_RS_PUSH_USER
    /// and SCALENE_RS_PUSH_PASSWORD (basic). SCALENE_RS_PUSH_TENANT sets X-Scope-OrgID.
    #[arg(long, value_name = "URL")]
    push: Option<String>,
    /// The backend's protocol: pyroscope, otlp-grpc or otlp-http (default: from the URL;
    /// port 4317 is otlp-grpc, port 4318 or a path ending in /v1development/profiles
    /// otlp-http, anything else pyroscope).
    #[arg(long, value_name = "PROTOCOL", requires = "push",
          value_parser = scalene_rs::export::PushFormat::parse)]
    push_format: Option<scalene_rs::export::PushFormat>,
    /// Seconds per window; windows end at wall-clock multiples of it.
    #[arg(long, value_name = "SECONDS", default_value = "10", value_parser = parse_window,
          requires = "push")]
    window: std::time::Duration,
    /// Windows that may wait to be sent while the backend is down or slow (and 16 MiB in
    /// all); past that the oldest is dropped, counted in the log and in the next window sent.
    #[arg(long, value_name = "N", default_value_t = scalene_rs::export::QueueBounds::default().windows as u32,
          value_parser = clap::value_parser!(u32).range(1..),
          requires = "push")]
    push_queue: u32,
    /// A label on every window (repeatable).
    #[arg(long = "tag", value_name = "KEY=VALUE", value_parser = parse_tag, requires = "push")]
    tags: Vec<(String, String)>,
    /// The service's name (default: the target's OTEL_SERVICE_NAME, else its script or
    /// module name).
    #[arg(long, value_name = "NAME", requires = "push")]
    service: Option<String>,
}

impl PushArgs {
    /// The push of a COMMAND we start. It inherits our OTEL_SERVICE_NAME.
    fn for_command(
        &self,
        argv: &[String],
    ) -> anyhow::Result<Option<scalene_rs::export::PushConfig>> {
        let env = std::env::var("OTEL_SERVICE_NAME")
            .ok()
            .filter(|s| !s.is_empty());
        self.config(argv, env)
    }

    /// The push of running process `pid`, named by its own command line and environment.
    fn for_pid(&self, pid: i32) -> anyhow::Result<Option<scalene_rs::export::PushConfig>> {
        let (argv, service) = scalene_rs::export::target_naming(pid);
        self.config(&argv, service)
    }

    /// The push asked for; `argv` and `env_service` (the target's command line and its
    /// OTEL_SERVICE_NAME) name the service unless --service does.
    fn config(
        &self,
        argv: &[String],
        env_service: Option<String>,
    ) -> anyhow::Result<Option<scalene_rs::export::PushConfig>> {
        let Some(url) = &self.push else {
            return Ok(None);
        };
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            anyhow::bail!("--push {url}: expected an http:// or https:// URL");
        }
        let service = self
            .service
            .clone()
            .or(env_service)
            .unwrap_or_else(|| scalene_rs::export::service_of(argv));
        Ok(Some(scalene_rs::export::PushConfig {
            url: url.clone(),
            format: self
                .push_format
                .unwrap_or_else(|| scalene_rs::export::PushFormat::of_url(url)),
            window: self.window,
            service,
            tags: self.tags.clone(),
            bounds: scalene_rs::export::QueueBounds {
                windows: self.push_queue as usize,
                ..scalene_rs::export::QueueBounds::default()
            },
            credentials: scalene_rs::export::Credentials::from_env().map_err(anyhow::Error::msg)?,
        }))
    }
}

fn parse_window(s: &str) -> Result<std::time::Duration, String> {
    let d = parse_duration(s)?;
    if d < std::time::Duration::from_secs(1) {
        return Err("a window is at least 1 second".into());
    }
    Ok(d)
}

fn parse_tag(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() && !k.starts_with("__") => Ok((k.to_string(), v.to_string())),
        Some((k, _)) if k.starts_with("__") => Err(format!(
            "--tag {s}: names starting with __ are the backend's"
        )),
        _ => Err(format!("--tag {s}: expected KEY=VALUE")),
    }
}

/// Where and how to write the report.
#[derive(clap::Args, Clone)]
struct OutputArgs {
    /// Write the report to FILE. The format follows the extension (.json, .svg,
    /// .speedscope.json, .collapsed/.txt, .pb.gz/.pprof, .html/.htm, anything else:
    /// terminal text).
    #[arg(short = 'o', long, value_name = "FILE")]
    output: Option<std::path::PathBuf>,
    /// Output format (overrides the extension).
    #[arg(long, value_enum)]
    format: Option<report::Format>,
    /// Flame graph / collapsed stacks of memory allocated instead of time (needs a profile
    /// recorded with memory: `run` without --cpu-only).
    #[arg(long)]
    memory: bool,
}

#[derive(clap::Args)]
struct RunArgs {
    #[command(flatten)]
    record: RecordArgs,
    /// Profile only the process the command starts (by default every Python process it
    /// starts is profiled too: multiprocessing workers, subprocesses, scripts).
    #[arg(long)]
    no_subprocesses: bool,
    /// CPU time only, with no memory or copy accounting (the preload library is not injected).
    #[arg(long)]
    cpu_only: bool,
    /// How Python's own objects (those pymalloc serves, up to 512 bytes) are counted.
    #[arg(
        long,
        value_enum,
        value_name = "HOW",
        default_value = "wrapped",
        conflicts_with = "cpu_only"
    )]
    python_allocator: PythonAllocator,
    /// Same as `--python-allocator pymalloc`.
    #[arg(long, conflicts_with_all = ["cpu_only", "python_allocator"])]
    keep_pymalloc: bool,
    /// Bytes a thread allocates (and, apart, frees) between two sampled memory events. Each
    /// sample records the line that allocated and waits for us to read its stack. Smaller
    /// windows see smaller allocations and cost more handshakes.
    #[arg(long, value_name = "BYTES", default_value_t = MemoryConfig::default().window,
          value_parser = window_bytes, conflicts_with = "cpu_only")]
    memory_window: u64,
    /// Bytes a thread copies (memcpy/memmove) between two sampled copy events.
    #[arg(long, value_name = "BYTES", default_value_t = MemoryConfig::default().copy_window,
          value_parser = window_bytes, conflicts_with = "cpu_only")]
    copy_window: u64,
    /// The command to run, after `--`.
    #[arg(required = true, last = true, value_name = "COMMAND")]
    command: Vec<String>,
}

#[derive(clap::Args)]
struct AttachArgs {
    /// The process to profile.
    pid: i32,
    /// Stop after this many seconds of recording. With memory, they run from when the
    /// process's memory is counted (or refused, with the reason), because loading our library
    /// takes a moment (at most 2 s), and a short attach still counts memory. Under a process
    /// that is not Python (--subprocesses), they run from its first Python descendant's start.
    /// When none came within them, the attach ends with exit 4.
    #[arg(long, value_name = "SECONDS", value_parser = parse_duration)]
    duration: Option<std::time::Duration>,
    /// Profile the process's descendants that run Python too (found as they start). The
    /// process need not be Python itself (a shell script, a PyInstaller app's bootloader).
    /// Then its Python descendants are profiled until it exits, and none at all is exit 4.
    #[arg(long)]
    subprocesses: bool,
    /// CPU time only. By default memory is recorded too. A process started without
    /// scalene-rs gets our library loaded into it (x86-64, glibc, CPython 3.6+ with a GIL)
    /// and counts from the attach on. One started under `scalene-rs run` is read from its
    /// own ring.
    #[arg(long)]
    cpu_only: bool,
    #[command(flatten)]
    record: RecordArgs,
}

#[derive(clap::Args)]
struct TopArgs {
    /// The process to watch (or give a COMMAND after `--` instead).
    #[arg(required_unless_present = "command", conflicts_with = "command")]
    pid: Option<i32>,
    /// Seconds between refreshes of the screen (`+` and `-` change it while it runs).
    #[arg(long, value_name = "SECONDS", default_value = "1", value_parser = parse_refresh)]
    refresh: std::time::Duration,
    /// When the COMMAND exits, end at once instead of leaving its last screen up until a
    /// key is pressed.
    #[arg(long)]
    exit_on_end: bool,
    /// With a PID: watch its descendants that run Python too (a COMMAND's always are,
    /// unless --no-subprocesses). The PID need not be Python itself then.
    #[arg(long)]
    subprocesses: bool,
    /// With a COMMAND: watch only the process it starts.
    #[arg(long, conflicts_with = "subprocesses")]
    no_subprocesses: bool,
    /// CPU time only, with no memory or copy columns (no library loaded into the target).
    #[arg(long)]
    cpu_only: bool,
    /// With a COMMAND: where its stdout and stderr go while the screen is ours (default: a
    /// file in the temporary directory, named when `top` ends).
    #[arg(long, value_name = "FILE")]
    command_output: Option<std::path::PathBuf>,
    #[command(flatten)]
    record: RecordArgs,
    /// The command to run and watch, after `--`.
    #[arg(last = true, value_name = "COMMAND")]
    command: Vec<String>,
}

fn parse_refresh(s: &str) -> Result<std::time::Duration, String> {
    let d = parse_duration(s)?;
    if !(0.1..=60.0).contains(&d.as_secs_f64()) {
        return Err("the refresh must be between 0.1 and 60 seconds".into());
    }
    Ok(d)
}

#[derive(clap::Args)]
struct ViewArgs {
    /// A profile saved with `-o FILE.json`.
    profile: std::path::PathBuf,
    /// Per-thread breakdown in the report.
    #[arg(long)]
    threads: bool,
    #[command(flatten)]
    output: OutputArgs,
}

fn parse_rate(s: &str) -> Result<f64, String> {
    let r: f64 = s.parse().map_err(|_| format!("not a number: {s:?}"))?;
    if !(0.1..=100_000.0).contains(&r) {
        return Err("the rate must be between 0.1 and 100000 Hz".into());
    }
    Ok(r)
}

fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    let secs: f64 = s
        .parse()
        .map_err(|_| format!("not a number of seconds: {s:?}"))?;
    if !(secs > 0.0 && secs.is_finite()) {
        return Err("the duration must be a positive number of seconds".into());
    }
    Ok(std::time::Duration::from_secs_f64(secs))
}

/// A combination of arguments that clap does not refuse by itself. It is said on one
/// line, with the usage exit code.
#[derive(Debug)]
struct Usage(&'static str);

impl std::fmt::Display for Usage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

impl std::error::Error for Usage {}

const NATIVE_NONBLOCKING: &str = "--native stops each thread to read its registers and \
     stack; it cannot be combined with --nonblocking, which never stops the target";

impl RecordArgs {
    /// GPU watching, unless `--no-gpu`.
    fn gpu(&self) -> Option<scalene_rs::gpu::GpuConfig> {
        (!self.no_gpu).then(|| scalene_rs::gpu::GpuConfig::from_env(self.want_gpu))
    }

    /// Refuses what cannot be combined, before anything starts.
    fn check(&self) -> Result<(), Usage> {
        if self.native && self.nonblocking {
            return Err(Usage(NATIVE_NONBLOCKING));
        }
        Ok(())
    }

    fn sampler(&self) -> SamplerConfig {
        SamplerConfig {
            rate_hz: self.rate,
            wall: self.wall,
            gil_only: self.gil,
            mode: if self.blocking || self.native {
                ReadMode::Paused
            } else if self.nonblocking {
                ReadMode::Nonblocking
            } else {
                ReadMode::Auto
            },
            profile_all: self.profile_all,
            handshake_file: None,
            native: self.native,
            tasks: self.tasks,
        }
    }
}

/// The live one-line status on stderr while recording (only on a terminal).
fn status_line(enabled: bool) -> impl FnMut(&Stats) {
    move |s: &Stats| {
        if enabled {
            let mut err = std::io::stderr().lock();
            let _ = write!(
                err,
                "\r\x1b[K[scalene-rs] {:.1}s  {} samples  {} missed  {} errors",
                s.elapsed.as_secs_f64(),
                s.samples,
                s.missed,
                s.errors
            );
            let _ = err.flush();
        }
    }
}

fn clear_status(enabled: bool) {
    if enabled {
        eprint!("\r\x1b[K");
    }
}

/// Writes the report to `-o FILE` in the format its extension (or --format) names, else
/// as terminal text to stderr (stdout belongs to the profiled program).
impl OutputArgs {
    /// The format asked for: `--format`, else the output file's extension, else terminal.
    fn format(&self) -> Format {
        self.format
            .or_else(|| self.output.as_deref().map(Format::from_path))
            .unwrap_or(Format::Terminal)
    }

    /// Refuses what cannot be written, before anything is recorded. That is a binary format
    /// with no file to write it to (it would go to stderr).
    fn check(&self) -> anyhow::Result<()> {
        let format = self.format();
        if format.is_binary() && self.output.is_none() {
            anyhow::bail!("the {format} is binary: give a file to write it to with -o FILE");
        }
        Ok(())
    }
}

fn emit(profile: &Profile, out: &OutputArgs, threads: bool) -> anyhow::Result<()> {
    let format = out.format();
    let to_tty = out.output.is_none() && std::io::stderr().is_terminal();
    let opts = RenderOptions {
        color: to_tty && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty()),
        width: terminal_width(),
        threads,
        memory: out.memory,
    };
    let bytes = report::render(profile, format, &opts)?;
    match &out.output {
        Some(path) => {
            std::fs::write(path, &bytes)
                .map_err(|e| anyhow::anyhow!("writing {}: {e}", path.display()))?;
            eprintln!("scalene-rs: wrote {} ({format})", path.display());
        }
        None => {
            let mut err = std::io::stderr().lock();
            let _ = err.write_all(&bytes);
            if !bytes.ends_with(b"\n") {
                let _ = err.write_all(b"\n");
            }
        }
    }
    Ok(())
}

fn terminal_width() -> usize {
    std::env::var("COLUMNS")
        .ok()
        .and_then(|c| c.parse().ok())
        .filter(|&w: &usize| w >= 40)
        .unwrap_or(100)
}

fn loss_summary(s: &Stats) {
    for n in &s.notes {
        eprintln!("scalene-rs: {n}");
    }
    if s.missed > 0 {
        eprintln!(
            "scalene-rs: {} samples missed (the profiler fell behind the requested rate)",
            s.missed
        );
    }
    if s.paused_reads > 0 {
        eprintln!(
            "scalene-rs: {} thread stacks were read with their thread briefly paused (they changed too fast to be read without stopping it)",
            s.paused_reads
        );
    }
    if s.thinned > 0 {
        eprintln!(
            "scalene-rs: {} sampling ticks were skipped to pause the target at most {} times a second",
            s.thinned,
            scalene_rs::sampler::PAUSED_MAX_HZ
        );
    }
    if s.errors > 0 {
        eprintln!("scalene-rs: {} thread samples lost:", s.errors);
        for (why, n) in &s.error_kinds {
            eprintln!("  {n:>6} × {why}");
        }
    }
}

fn run(args: RunArgs) -> anyhow::Result<i32> {
    args.record.check()?;
    args.record.output.check()?;
    let cfg = session::RunConfig {
        command: args.command.clone(),
        sampler: args.record.sampler(),
        follow_children: !args.no_subprocesses,
        memory: (!args.cpu_only).then_some(MemoryConfig {
            profile_all: args.record.profile_all,
            python_allocator: if args.keep_pymalloc {
                PythonAllocator::Pymalloc
            } else {
                args.python_allocator
            },
            window: args.memory_window,
            copy_window: args.copy_window,
        }),
        gpu: args.record.gpu(),
        live: None,
        stdio_to: None,
        push: args.record.push.for_command(&args.command)?,
    };
    let live = std::io::stderr().is_terminal();
    let outcome = session::run(&cfg, &mut status_line(live))?;
    clear_status(live);
    match &outcome.profile {
        Some(p) => {
            loss_summary(&outcome.stats);
            emit(p, &args.record.output, args.record.threads)?;
        }
        None => eprintln!(
            "scalene-rs: {}",
            outcome.note.as_deref().unwrap_or("no profile was recorded")
        ),
    }
    Ok(session::exit_code(&outcome.status))
}

fn attach(args: AttachArgs) -> anyhow::Result<i32> {
    args.record.check()?;
    args.record.output.check()?;
    let cfg = session::AttachConfig {
        pid: args.pid,
        duration: args.duration,
        sampler: args.record.sampler(),
        locate: LocateOptions::default(),
        follow_children: args.subprocesses,
        memory: (!args.cpu_only).then(|| MemoryConfig {
            profile_all: args.record.profile_all,
            ..MemoryConfig::default()
        }),
        gpu: args.record.gpu(),
        live: None,
        push: args.record.push.for_pid(args.pid)?,
    };
    let live = std::io::stderr().is_terminal();
    if live {
        eprintln!("scalene-rs: profiling process {}; Ctrl-C to stop", args.pid);
    }
    let (profile, stats) = session::attach(&cfg, &mut status_line(live))?;
    clear_status(live);
    loss_summary(&stats);
    emit(&profile, &args.record.output, args.record.threads)?;
    Ok(exit::OK)
}

fn top(args: TopArgs) -> anyhow::Result<i32> {
    if !std::io::stdout().is_terminal() {
        return Err(Usage(
            "top draws on a terminal and stdout is not one: record with `scalene-rs attach PID` \
             or `scalene-rs run -- COMMAND` instead",
        )
        .into());
    }
    args.record.check()?;
    args.record.output.check()?;
    let memory = (!args.cpu_only).then(|| MemoryConfig {
        profile_all: args.record.profile_all,
        ..MemoryConfig::default()
    });
    let mut command_output = None;
    let target = match args.pid {
        Some(pid) => session::TopTarget::Pid(session::AttachConfig {
            pid,
            duration: None,
            sampler: args.record.sampler(),
            locate: LocateOptions::default(),
            follow_children: args.subprocesses,
            memory,
            gpu: args.record.gpu(),
            live: None,
            push: args.record.push.for_pid(pid)?,
        }),
        None => {
            let out = args.command_output.clone().unwrap_or_else(|| {
                std::env::temp_dir().join(format!("scalene-rs-top-{}.out", std::process::id()))
            });
            command_output = Some(out.clone());
            session::TopTarget::Command(session::RunConfig {
                command: args.command.clone(),
                sampler: args.record.sampler(),
                follow_children: !args.no_subprocesses,
                memory,
                gpu: args.record.gpu(),
                live: None,
                stdio_to: Some(out),
                push: args.record.push.for_command(&args.command)?,
            })
        }
    };
    let outcome = session::top(session::TopConfig {
        target,
        refresh: args.refresh,
        exit_on_end: args.exit_on_end,
    })?;
    for n in &outcome.notes {
        eprintln!("scalene-rs: {n}");
    }
    if let Some(out) = &command_output {
        eprintln!("scalene-rs: the command's output is in {}", out.display());
    }
    if let (Some(p), Some(_)) = (&outcome.profile, &args.record.output.output) {
        loss_summary(&outcome.stats);
        emit(p, &args.record.output, args.record.threads)?;
    }
    Ok(outcome.exit_code)
}

fn view(args: ViewArgs) -> anyhow::Result<i32> {
    args.output.check()?;
    let text = std::fs::read_to_string(&args.profile)
        .map_err(|e| anyhow::anyhow!("reading {}: {e}", args.profile.display()))?;
    let profile = report::profile_json::from_json(&text)
        .map_err(|e| anyhow::anyhow!("{}: {e}", args.profile.display()))?;
    emit(&profile, &args.output, args.threads)?;
    Ok(exit::OK)
}

/// Prints a command's error on one line (newlines inside a message would break scripts
/// that read stderr) and gives the exit code: the library error's own, else OTHER.
fn failure(e: anyhow::Error) -> i32 {
    eprintln!("error: {}", e.to_string().replace('\n', " "));
    if e.downcast_ref::<Usage>().is_some() {
        return exit::USAGE;
    }
    e.downcast_ref::<scalene_rs::Error>()
        .map_or(exit::OTHER, |e| e.exit_code())
}

fn main() {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() {
                exit::USAGE
            } else {
                exit::OK
            };
            let _ = e.print();
            std::process::exit(code);
        }
    };
    // Every command gives its exit code or an error; only here does the process exit.
    let result = match cli.command {
        Command::Dump(args) => dump_cli::dump(args),
        Command::Top(args) => top(args),
        Command::Attach(args) => attach(args),
        Command::Run(args) => run(args),
        Command::View(args) => view(args),
        Command::Agent(args) => agent_cli::agent(args),
    };
    std::process::exit(result.unwrap_or_else(failure))
}
