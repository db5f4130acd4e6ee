//! OTLP profiles over the wire: OTLP/HTTP and OTLP/gRPC, one window a call.
//!
//! Owns: [`OtlpHttp`] and [`OtlpGrpc`], each a [`Post`] the exporter's thread calls, and
//! what their answers mean ([`Outcome`]), after the OTLP specification's failure model:
//! - HTTP: `POST {URL}/v1development/profiles`, `Content-Type: application/x-protobuf`,
//!   gzip. 2xx sent; 429, 502, 503, 504 and no answer retried; any other status refused.
//! - gRPC: `opentelemetry.proto.collector.profiles.v1development.ProfilesService/Export`
//!   (tonic, gzip). OK sent; `CANCELLED`, `DEADLINE_EXCEEDED`, `RESOURCE_EXHAUSTED`,
//!   `ABORTED`, `OUT_OF_RANGE`, `UNAVAILABLE` (also no connection) and `DATA_LOSS` retried;
//!   any other code refused (`INVALID_ARGUMENT` for a development version it does not take).
//! - A success whose answer rejects profiles (`partial_success.rejected_profiles` > 0) is
//!   refused, with the collector's message. The specification forbids sending it again,
//!   and a window that arrived only in part is not counted sent.
//! - Both send the Profiles development version ([`DEVELOPMENT_VERSION`]) and the
//!   credentials of the environment ([`Credentials`]: `Authorization`, `X-Scope-OrgID`).
//!   https URLs use rustls (webpki roots), no system OpenSSL.
//!
//! gRPC needs an async runtime. A current-thread tokio runtime lives in [`OtlpGrpc`], on
//! the exporter's thread, and runs only while that thread sends. The sampling never waits
//! on it.
//!
//! Must not: retry or queue (`queue.rs` does).

use super::otlp::DEVELOPMENT_VERSION;
use super::sender::{self, Credentials, Outcome, Post};
use opentelemetry_proto::tonic::collector::profiles::v1development::{
    profiles_service_client::ProfilesServiceClient, ExportProfilesPartialSuccess,
    ExportProfilesServiceRequest, ExportProfilesServiceResponse,
};
use std::io::Write;

/// The HTTP path of the profiles signal, after the base URL.
pub(crate) const HTTP_PATH: &str = "/v1development/profiles";

/// OTLP/HTTP, binary protobuf.
pub(crate) struct OtlpHttp {
    agent: ureq::Agent,
    url: String,
    credentials: Credentials,
}

impl OtlpHttp {
    /// Posts to `url`, the endpoint itself (`…/v1development/profiles`).
    pub(crate) fn new(url: String, credentials: Credentials) -> OtlpHttp {
        OtlpHttp {
            agent: sender::agent(&credentials),
            url,
            credentials,
        }
    }
}

/// What an OTLP/HTTP status means.
fn http_outcome(status: u16) -> Outcome {
    match status {
        200..=299 => Outcome::Sent,
        429 | 502 | 503 | 504 => Outcome::Retry(format!("HTTP {status}")),
        _ => Outcome::Refused(format!("HTTP {status}")),
    }
}

/// What a successful answer means: sent, unless it rejected some of the window's profiles.
fn success_outcome(partial: Option<&ExportProfilesPartialSuccess>) -> Outcome {
    match partial {
        Some(p) if p.rejected_profiles > 0 => Outcome::Refused(format!(
            "the collector rejected {} of the window's profiles: {}",
            p.rejected_profiles,
            if p.error_message.is_empty() {
                "(no message)"
            } else {
                &p.error_message
            }
        )),
        _ => Outcome::Sent,
    }
}

impl Post for OtlpHttp {
    fn post(&mut self, body: &[u8]) -> Outcome {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        let body = match gz.write_all(body).and_then(|()| gz.finish()) {
            Ok(b) => b,
            Err(e) => return Outcome::Refused(format!("compressing: {e}")),
        };
        let mut req = self
            .agent
            .post(&self.url)
            .header("Content-Type", "application/x-protobuf")
            .header("Content-Encoding", "gzip")
            .header("OTLP-Profiles-Development-Version", DEVELOPMENT_VERSION);
        if let Some(a) = self.credentials.authorization() {
            req = req.header("Authorization", a);
        }
        if let Some(t) = self.credentials.tenant() {
            req = req.header("X-Scope-OrgID", t);
        }
        match req.send(&body[..]) {
            Ok(mut resp) => match http_outcome(resp.status().as_u16()) {
                Outcome::Sent => {
                    use prost::Message;
                    // An empty or unreadable body is a plain success (the specification
                    // lets a server answer nothing more).
                    let answer = resp
                        .body_mut()
                        .with_config()
                        .limit(1 << 20)
                        .read_to_vec()
                        .ok()
                        .and_then(|b| ExportProfilesServiceResponse::decode(&b[..]).ok());
                    success_outcome(answer.as_ref().and_then(|a| a.partial_success.as_ref()))
                }
                other => other,
            },
            Err(e) => Outcome::Retry(e.to_string()),
        }
    }
}

/// OTLP/gRPC, over a connection kept between windows.
pub(crate) struct OtlpGrpc {
    /// The runtime, or why there is none.
    rt: Result<tokio::runtime::Runtime, String>,
    client: Option<ProfilesServiceClient<tonic::transport::Channel>>,
    url: String,
    credentials: Credentials,
}

impl OtlpGrpc {
    /// Exports to the collector at `url` (`http://host:4317`). It is made on the exporter's
    /// thread, where its runtime lives.
    pub(crate) fn new(url: String, credentials: Credentials) -> OtlpGrpc {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("no async runtime for gRPC: {e}"));
        OtlpGrpc {
            rt,
            client: None,
            url,
            credentials,
        }
    }

    /// The client, connected lazily (the first call connects; a lost connection is made
    /// again by the channel).
    fn client(&mut self) -> Result<ProfilesServiceClient<tonic::transport::Channel>, String> {
        if let Some(c) = &self.client {
            return Ok(c.clone());
        }
        let rt = self.rt.as_ref().map_err(Clone::clone)?;
        let _in_runtime = rt.enter();
        let mut endpoint = tonic::transport::Endpoint::from_shared(self.url.clone())
            .map_err(|e| format!("{}: {e}", self.url))?
            .connect_timeout(sender::CONNECT_TIMEOUT)
            .timeout(sender::REQUEST_TIMEOUT);
        if self.url.starts_with("https://") {
            // A private CA (SCALENE_RS_PUSH_CA) instead of Mozilla's roots, as over HTTP.
            let tls = match self.credentials.roots_pem() {
                Some(pem) => tonic::transport::ClientTlsConfig::new()
                    .ca_certificate(tonic::transport::Certificate::from_pem(pem)),
                None => tonic::transport::ClientTlsConfig::new().with_webpki_roots(),
            };
            endpoint = endpoint.tls_config(tls).map_err(|e| format!("TLS: {e}"))?;
        }
        let client = ProfilesServiceClient::new(endpoint.connect_lazy())
            .send_compressed(tonic::codec::CompressionEncoding::Gzip);
        self.client = Some(client.clone());
        Ok(client)
    }

    /// The request of `body`, with its metadata.
    fn request(&self, body: &[u8]) -> Result<tonic::Request<ExportProfilesServiceRequest>, String> {
        use prost::Message;
        // The queue holds encoded windows (bounded in bytes). tonic encodes a message.
        let msg = ExportProfilesServiceRequest::decode(body).map_err(|e| e.to_string())?;
        let mut req = tonic::Request::new(msg);
        let md = req.metadata_mut();
        md.insert(
            "otlp-profiles-development-version",
            tonic::metadata::MetadataValue::from_static(DEVELOPMENT_VERSION),
        );
        let mut text = |k: &'static str, v: Option<&str>| -> Result<(), String> {
            if let Some(v) = v {
                let v = v
                    .parse()
                    .map_err(|_| format!("{k}: not a metadata value"))?;
                md.insert(k, v);
            }
            Ok(())
        };
        text("authorization", self.credentials.authorization())?;
        text("x-scope-orgid", self.credentials.tenant())?;
        Ok(req)
    }
}

/// What a gRPC status means.
fn grpc_outcome(status: &tonic::Status) -> Outcome {
    use tonic::Code;
    let why = format!("gRPC {:?}: {}", status.code(), status.message());
    match status.code() {
        Code::Ok => Outcome::Sent,
        Code::Cancelled
        | Code::DeadlineExceeded
        | Code::ResourceExhausted
        | Code::Aborted
        | Code::OutOfRange
        | Code::Unavailable
        | Code::DataLoss => Outcome::Retry(why),
        _ => Outcome::Refused(why),
    }
}

impl Post for OtlpGrpc {
    fn post(&mut self, body: &[u8]) -> Outcome {
        let mut client = match self.client() {
            Ok(c) => c,
            Err(why) => return Outcome::Refused(why),
        };
        let req = match self.request(body) {
            Ok(r) => r,
            Err(why) => return Outcome::Refused(why),
        };
        let Ok(rt) = &self.rt else {
            return Outcome::Refused("no async runtime".into());
        };
        match rt.block_on(client.export(req)) {
            Ok(answer) => success_outcome(answer.get_ref().partial_success.as_ref()),
            Err(status) => grpc_outcome(&status),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_statuses_follow_the_otlp_failure_model() {
        assert_eq!(http_outcome(200), Outcome::Sent);
        for s in [429, 502, 503, 504] {
            assert!(matches!(http_outcome(s), Outcome::Retry(_)), "{s}");
        }
        for s in [400, 401, 404, 413, 500, 501] {
            assert!(matches!(http_outcome(s), Outcome::Refused(_)), "{s}");
        }
    }

    #[test]
    fn grpc_codes_follow_the_otlp_failure_model() {
        use tonic::{Code, Status};
        for c in [
            Code::Unavailable,
            Code::DeadlineExceeded,
            Code::ResourceExhausted,
        ] {
            assert!(matches!(
                grpc_outcome(&Status::new(c, "")),
                Outcome::Retry(_)
            ));
        }
        for c in [
            Code::InvalidArgument,
            Code::Unauthenticated,
            Code::Unimplemented,
        ] {
            assert!(matches!(
                grpc_outcome(&Status::new(c, "")),
                Outcome::Refused(_)
            ));
        }
    }

    #[test]
    fn a_partial_success_that_rejects_is_refused_with_its_message() {
        assert_eq!(success_outcome(None), Outcome::Sent);
        let nothing_rejected = ExportProfilesPartialSuccess {
            rejected_profiles: 0,
            error_message: "a warning".into(),
        };
        assert_eq!(success_outcome(Some(&nothing_rejected)), Outcome::Sent);
        let rejected = ExportProfilesPartialSuccess {
            rejected_profiles: 2,
            error_message: "too old".into(),
        };
        match success_outcome(Some(&rejected)) {
            Outcome::Refused(why) => assert!(
                why.contains("rejected 2") && why.contains("too old"),
                "{why}"
            ),
            other => panic!("{other:?}"),
        }
    }
}
