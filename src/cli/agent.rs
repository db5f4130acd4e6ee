//! `scalene-rs agent`: its options, made the library's [`session::AgentConfig`].
//!
//! Owns: [`AgentArgs`] and [`agent`] (the command: parse, configure, call the library,
//! log).
//!
//! Must not: profile (the library does).

use scalene_rs::export::{PushConfig, PushFormat, QueueBounds};
use scalene_rs::sampler::SamplerConfig;
use scalene_rs::session;
use std::time::Duration;

/// Profile every Python process of this host, continuously, and push each one's windows
/// to a continuous-profiling backend (run one per host, as root or with CAP_SYS_PTRACE;
/// see docs/agent.md).
#[derive(clap::Args)]
pub(super) struct AgentArgs {
    /// The backend (Grafana Pyroscope: http://HOST:4040). Credentials from the environment
    /// only, as for `--push` of `run`: SCALENE_RS_PUSH_TOKEN, or SCALENE_RS_PUSH_USER and
    /// SCALENE_RS_PUSH_PASSWORD. SCALENE_RS_PUSH_TENANT sets X-Scope-OrgID.
    #[arg(long, value_name = "URL")]
    push: String,
    /// The backend's protocol: pyroscope, otlp-grpc or otlp-http (default: from the URL, as
    /// `run --push` reads it; port 4317 is otlp-grpc, port 4318 or a path ending in
    /// /v1development/profiles otlp-http, anything else pyroscope).
    #[arg(long, value_name = "PROTOCOL", value_parser = PushFormat::parse)]
    push_format: Option<PushFormat>,
    /// Windows that may wait to be sent, all processes together, while the backend is down
    /// or slow (and 16 MiB in all). Past that the oldest is dropped, counted.
    #[arg(long, value_name = "N", default_value_t = 1024,
          value_parser = clap::value_parser!(u32).range(1..))]
    push_queue: u32,
    /// Profile only processes whose command line (arguments joined by spaces) matches.
    #[arg(long = "match", value_name = "REGEX")]
    matching: Option<regex::Regex>,
    /// Leave alone processes whose command line matches.
    #[arg(long, value_name = "REGEX")]
    exclude: Option<regex::Regex>,
    /// Samples per second of each process. 19 by default. It is a prime, so the ticks do not
    /// fall in step with programs' own periodic timers (10, 50, 100 Hz, whole seconds) and
    /// see each line in its share. It is low, so that a host of many processes costs the
    /// agent little (each process read 19 times a second).
    #[arg(long, default_value_t = 19.0, value_parser = super::parse_rate)]
    rate: f64,
    /// Seconds per window; windows end at wall-clock multiples of it.
    #[arg(long, value_name = "SECONDS", default_value = "10", value_parser = super::parse_window)]
    window: Duration,
    /// A label on every window of every process (repeatable).
    #[arg(long = "tag", value_name = "KEY=VALUE", value_parser = super::parse_tag)]
    tags: Vec<(String, String)>,
    /// One service name for every process (default: each process's OTEL_SERVICE_NAME, else
    /// its script or module name).
    #[arg(long, value_name = "NAME")]
    service: Option<String>,
    /// Seconds between two looks at the host for new processes (a process is profiled
    /// within this while of its start; a look costs about one read per process of the
    /// host).
    #[arg(long, value_name = "SECONDS", default_value = "1", value_parser = super::parse_duration)]
    scan: Duration,
    /// Processes profiled at once, at most (each holds its own profile of the open window).
    #[arg(long, value_name = "N", default_value_t = 256)]
    max_processes: usize,
}

/// The agent, until SIGTERM or Ctrl-C. It exits 0 when every open window was sent (or
/// counted dropped) within 5 s.
pub(super) fn agent(a: AgentArgs) -> anyhow::Result<i32> {
    if !(a.push.starts_with("http://") || a.push.starts_with("https://")) {
        anyhow::bail!("--push {}: expected an http:// or https:// URL", a.push);
    }
    let cfg = session::AgentConfig {
        push: PushConfig {
            url: a.push.clone(),
            format: a.push_format.unwrap_or_else(|| PushFormat::of_url(&a.push)),
            window: a.window,
            service: String::new(),
            tags: a.tags,
            // Every process's windows share one queue. Its bytes bound the memory, and the
            // count (1024 by default) lets a few windows of each of many processes wait.
            bounds: QueueBounds {
                windows: a.push_queue as usize,
                bytes: 16 << 20,
            },
            credentials: scalene_rs::export::Credentials::from_env().map_err(anyhow::Error::msg)?,
        },
        service: a.service,
        select: session::Selection {
            matching: a.matching,
            exclude: a.exclude,
        },
        sampler: SamplerConfig {
            rate_hz: a.rate,
            ..SamplerConfig::default()
        },
        scan_every: a.scan,
        max_processes: a.max_processes.max(1),
    };
    eprintln!(
        "scalene-rs agent: profiling the host's Python processes at {} Hz, pushing {} s \
         windows to {}",
        a.rate,
        a.window.as_secs_f64(),
        a.push
    );
    let outcome = session::agent(&cfg, &mut |line| eprintln!("scalene-rs agent: {line}"))?;
    eprintln!(
        "scalene-rs agent: {} processes profiled; {}",
        outcome.profiled, outcome.summary
    );
    Ok(scalene_rs::error::exit::OK)
}
