//! Profiles sent to the continuous-profiling backends fleets already run (`--push URL`).
//!
//! Owns: where and how windows go.
//! - [`PushConfig`]: the URL, the protocol, the window, the labels.
//! - `pyroscope.rs`: Pyroscope's `PushRequest` (the connect protocol's unary call).
//! - `sender.rs`: one HTTP POST, with the credentials from the environment.
//! - `service.rs`: the service's name, from the target's command line or environment.
//! - `queue.rs`: [`Exporter`], a thread of its own with a bounded queue, retries with
//!   backoff, and windows dropped oldest first, counted.
//!
//! Must not: sample, cut windows (the session does) or block its caller. A backend that is
//! down, slow or refusing costs the recording nothing but the dropped windows it counts.

mod pyroscope;
mod queue;
mod sender;
mod service;

pub use pyroscope::{labels_of, series_request};
pub use queue::{Exporter, ExporterStats, QueueBounds};
pub use sender::Credentials;
pub use service::{service_of, target_naming};

use std::time::Duration;

/// The protocols `--push` speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PushFormat {
    /// Grafana Pyroscope: `POST {URL}/push.v1.PusherService/Push`.
    Pyroscope,
}

impl PushFormat {
    /// The protocol named by `--push-format`, or told by the URL.
    pub fn parse(name: &str) -> Result<PushFormat, String> {
        match name {
            "pyroscope" => Ok(PushFormat::Pyroscope),
            "otlp" | "otlp-grpc" | "otlp-http" => Err(format!(
                "--push-format {name}: OTLP profiles are not sent yet; use pyroscope"
            )),
            _ => Err(format!("--push-format {name}: expected pyroscope")),
        }
    }
}

/// Where and how `--push` sends the recording.
#[derive(Debug, Clone)]
pub struct PushConfig {
    /// The backend's base URL (`http://host:4040`).
    pub url: String,
    pub format: PushFormat,
    /// Each window's length; windows end at wall-clock multiples of it.
    pub window: Duration,
    /// `service_name`.
    pub service: String,
    /// The user's `--tag k=v`, in order.
    pub tags: Vec<(String, String)>,
    pub bounds: QueueBounds,
    /// Who we are to the backend, whom we trust ([`Credentials::from_env`]).
    pub credentials: Credentials,
}

impl PushConfig {
    /// The URL windows are posted to.
    pub fn endpoint(&self) -> String {
        match self.format {
            PushFormat::Pyroscope => {
                format!(
                    "{}/push.v1.PusherService/Push",
                    self.url.trim_end_matches('/')
                )
            }
        }
    }
}
