//! Profiles sent to the continuous-profiling backends fleets already run (`--push URL`).
//!
//! Owns: where and how windows go.
//! - [`PushConfig`]: the URL, the protocol, the window, the labels.
//! - `pyroscope.rs`: Pyroscope's `PushRequest` (the connect protocol's unary call).
//! - `otlp.rs`: OTLP profiles' `ExportProfilesServiceRequest`.
//! - `otlp_send.rs`: OTLP/HTTP and OTLP/gRPC.
//! - `sender.rs`: one HTTP POST, with the credentials from the environment.
//! - `service.rs`: the service's name, from the target's command line or environment.
//! - `queue.rs`: [`Exporter`], a thread of its own with a bounded queue, retries with
//!   backoff, and windows dropped oldest first, counted.
//!
//! Must not: sample, cut windows (the session does) or block its caller. A backend that is
//! down, slow or refusing costs the recording nothing but the dropped windows it counts.

mod otlp;
mod otlp_send;
mod pyroscope;
mod queue;
mod sender;
mod service;

pub(crate) use otlp::nanos;
pub use otlp::{
    process_resource, profiles_request, AttrValue, DEVELOPMENT_VERSION, PROTO_REVISION,
};
pub use pyroscope::{labels_of, series_request};
pub use queue::{Exporter, ExporterStats, QueueBounds};
pub use sender::Credentials;
pub use service::{service_of, target_naming};

/// Sets label (or attribute) `key` to `value`, in place where one of that name is there
/// already, else at the end. There is one of a name, because Pyroscope refuses a series with
/// two, and an OTLP resource's keys are unique.
fn set_named<V>(out: &mut Vec<(String, V)>, key: &str, value: V) {
    match out.iter_mut().find(|(name, _)| name == key) {
        Some(l) => l.1 = value,
        None => out.push((key.to_string(), value)),
    }
}

use std::time::Duration;

/// The protocols `--push` speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PushFormat {
    /// Grafana Pyroscope: `POST {URL}/push.v1.PusherService/Push`.
    Pyroscope,
    /// OTLP profiles over gRPC: `ProfilesService/Export` at `{URL}`.
    OtlpGrpc,
    /// OTLP profiles over HTTP: `POST {URL}/v1development/profiles`.
    OtlpHttp,
}

impl PushFormat {
    /// The protocol named by `--push-format` (`otlp` is OTLP/gRPC, OTLP's default).
    pub fn parse(name: &str) -> Result<PushFormat, String> {
        match name {
            "pyroscope" => Ok(PushFormat::Pyroscope),
            "otlp" | "otlp-grpc" => Ok(PushFormat::OtlpGrpc),
            "otlp-http" => Ok(PushFormat::OtlpHttp),
            _ => Err(format!(
                "--push-format {name}: expected pyroscope, otlp-grpc or otlp-http"
            )),
        }
    }

    /// The protocol a URL tells, without `--push-format`:
    /// - a path ending in `/v1development/profiles`, or port 4318: OTLP/HTTP;
    /// - port 4317: OTLP/gRPC;
    /// - anything else: Pyroscope.
    pub fn of_url(url: &str) -> PushFormat {
        let rest = url.split_once("://").map_or(url, |(_, r)| r);
        let (authority, path) = rest.split_once('/').map_or((rest, ""), |(a, p)| (a, p));
        let port = authority.rsplit_once(':').map(|(_, p)| p);
        if path
            .trim_end_matches('/')
            .ends_with(&otlp_send::HTTP_PATH[1..])
            || port == Some("4318")
        {
            PushFormat::OtlpHttp
        } else if port == Some("4317") {
            PushFormat::OtlpGrpc
        } else {
            PushFormat::Pyroscope
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
        let base = self.url.trim_end_matches('/');
        match self.format {
            PushFormat::Pyroscope => format!("{base}/push.v1.PusherService/Push"),
            PushFormat::OtlpGrpc => base.to_string(),
            PushFormat::OtlpHttp if base.ends_with(otlp_send::HTTP_PATH) => base.to_string(),
            PushFormat::OtlpHttp => format!("{base}{}", otlp_send::HTTP_PATH),
        }
    }

    /// The exporter of this push: its thread, with the protocol's sender.
    pub fn start_exporter(&self) -> Exporter {
        let (url, creds) = (self.endpoint(), self.credentials.clone());
        match self.format {
            PushFormat::Pyroscope => Exporter::start(url, creds, self.bounds),
            PushFormat::OtlpHttp => Exporter::start_with(
                Box::new(move || Box::new(otlp_send::OtlpHttp::new(url, creds))),
                self.bounds,
            ),
            PushFormat::OtlpGrpc => Exporter::start_with(
                Box::new(move || Box::new(otlp_send::OtlpGrpc::new(url, creds))),
                self.bounds,
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_url_tells_the_protocol() {
        for (url, f) in [
            ("http://pyroscope:4040", PushFormat::Pyroscope),
            ("https://profiles.example.com", PushFormat::Pyroscope),
            ("http://collector:4317", PushFormat::OtlpGrpc),
            ("https://collector:4317/", PushFormat::OtlpGrpc),
            ("http://collector:4318", PushFormat::OtlpHttp),
            (
                "https://otlp.example.com/v1development/profiles",
                PushFormat::OtlpHttp,
            ),
            (
                "http://gw:8080/otlp/v1development/profiles/",
                PushFormat::OtlpHttp,
            ),
        ] {
            assert_eq!(PushFormat::of_url(url), f, "{url}");
        }
    }

    #[test]
    fn the_http_endpoint_has_the_signal_path_once() {
        let cfg = |url: &str| PushConfig {
            url: url.into(),
            format: PushFormat::OtlpHttp,
            window: Duration::from_secs(10),
            service: "s".into(),
            tags: Vec::new(),
            bounds: QueueBounds::default(),
            credentials: Credentials::default(),
        };
        assert_eq!(
            cfg("http://c:4318/").endpoint(),
            "http://c:4318/v1development/profiles"
        );
        assert_eq!(
            cfg("http://c:4318/v1development/profiles").endpoint(),
            "http://c:4318/v1development/profiles"
        );
    }
}
