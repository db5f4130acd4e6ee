//! One POST of one window to the backend.
//!
//! Owns:
//! - the HTTP request (ureq: rustls for https, no system OpenSSL), its headers, its
//!   timeouts;
//! - what an answer means ([`Outcome`]);
//! - [`Credentials`], read from the environment only (never from argv, which every user
//!   of the host can read).
//!
//! Must not: retry or queue (`queue.rs` does).

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;
use ureq::tls::{Certificate, RootCerts, TlsConfig};

/// The longest a connection may take, and a whole request.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_secs(15);

/// Who we are to the backend, and whom we trust, from the environment:
/// - `SCALENE_RS_PUSH_TOKEN`: `Authorization: Bearer TOKEN`;
/// - else `SCALENE_RS_PUSH_USER` and `SCALENE_RS_PUSH_PASSWORD`: basic auth;
/// - `SCALENE_RS_PUSH_TENANT`: `X-Scope-OrgID` (a multi-tenant Pyroscope);
/// - `SCALENE_RS_PUSH_CA`: a PEM file of the CA certificates an https backend's chain must
///   end at, instead of Mozilla's roots (a fleet's private CA).
#[derive(Clone, Default)]
pub struct Credentials {
    authorization: Option<String>,
    tenant: Option<String>,
    /// The roots of `SCALENE_RS_PUSH_CA`, parsed and as PEM text. `None`: Mozilla's
    /// (webpki-roots, built in).
    roots: Option<Arc<Roots>>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the secret itself.
        f.debug_struct("Credentials")
            .field("authorization", &self.authorization.as_ref().map(|_| "…"))
            .field("tenant", &self.tenant)
            .field("roots", &self.roots.as_ref().map(|r| r.0.len()))
            .finish()
    }
}

impl Credentials {
    /// The `Authorization` header's value, when one is set.
    pub(crate) fn authorization(&self) -> Option<&str> {
        self.authorization.as_deref()
    }

    /// The tenant (`X-Scope-OrgID`), when one is set.
    pub(crate) fn tenant(&self) -> Option<&str> {
        self.tenant.as_deref()
    }

    /// The PEM text of `SCALENE_RS_PUSH_CA`, when one is set (gRPC's TLS takes it so).
    pub(crate) fn roots_pem(&self) -> Option<&[u8]> {
        self.roots.as_ref().map(|r| &r.1[..])
    }

    /// Reads the environment; a `SCALENE_RS_PUSH_CA` that cannot be read or holds no
    /// certificate is an error (said before the recording starts, not at the first window).
    pub fn from_env() -> Result<Credentials, String> {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let authorization = match (
            var("SCALENE_RS_PUSH_TOKEN"),
            var("SCALENE_RS_PUSH_USER"),
            var("SCALENE_RS_PUSH_PASSWORD"),
        ) {
            (Some(t), _, _) => Some(format!("Bearer {t}")),
            (None, Some(u), p) => Some(format!(
                "Basic {}",
                base64(format!("{u}:{}", p.unwrap_or_default()).as_bytes())
            )),
            _ => None,
        };
        let roots = match var("SCALENE_RS_PUSH_CA") {
            Some(path) => Some(Arc::new(roots_of(&path)?)),
            None => None,
        };
        Ok(Credentials {
            authorization,
            tenant: var("SCALENE_RS_PUSH_TENANT"),
            roots,
        })
    }
}

/// A private CA's certificates: parsed (ureq's TLS) and the PEM text (tonic's).
type Roots = (Arc<Vec<Certificate<'static>>>, Vec<u8>);

/// The certificates of PEM file `path`.
fn roots_of(path: &str) -> Result<Roots, String> {
    let pem = std::fs::read(path).map_err(|e| format!("SCALENE_RS_PUSH_CA={path}: {e}"))?;
    let mut certs = Vec::new();
    for item in ureq::tls::parse_pem(&pem) {
        match item {
            Ok(ureq::tls::PemItem::Certificate(c)) => certs.push(c),
            Ok(_) => {}
            Err(e) => return Err(format!("SCALENE_RS_PUSH_CA={path}: {e}")),
        }
    }
    if certs.is_empty() {
        return Err(format!(
            "SCALENE_RS_PUSH_CA={path}: no PEM certificate in it"
        ));
    }
    Ok((Arc::new(certs), pem))
}

/// What became of one POST.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// 2xx.
    Sent,
    /// Worth trying again later: no connection, a timeout, 429, 5xx.
    Retry(String),
    /// The backend refused this window for good (4xx other than 429).
    Refused(String),
}

/// One way of sending a window: a protocol over its connection.
pub(crate) trait Post {
    /// Sends one encoded window and says what became of it.
    fn post(&mut self, body: &[u8]) -> Outcome;
}

impl Post for Sender {
    fn post(&mut self, body: &[u8]) -> Outcome {
        Sender::post(self, body)
    }
}

/// An HTTP agent that keeps its connections between windows.
pub(crate) struct Sender {
    agent: ureq::Agent,
    url: String,
    credentials: Credentials,
}

impl Sender {
    pub(crate) fn new(url: String, credentials: Credentials) -> Sender {
        Sender {
            agent: agent(&credentials),
            url,
            credentials,
        }
    }

    /// POSTs `body` (a protobuf message), gzip-compressed, as the connect protocol's unary
    /// call: `Content-Type: application/proto`, `Content-Encoding: gzip`.
    pub(crate) fn post(&self, body: &[u8]) -> Outcome {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        let body = match gz.write_all(body).and_then(|()| gz.finish()) {
            Ok(b) => b,
            Err(e) => return Outcome::Refused(format!("compressing: {e}")),
        };
        let mut req = self
            .agent
            .post(&self.url)
            .header("Content-Type", "application/proto")
            .header("Content-Encoding", "gzip")
            .header("Connect-Protocol-Version", "1");
        if let Some(a) = &self.credentials.authorization {
            req = req.header("Authorization", a);
        }
        if let Some(t) = &self.credentials.tenant {
            req = req.header("X-Scope-OrgID", t);
        }
        match req.send(&body[..]) {
            Ok(resp) => {
                let status = resp.status().as_u16();
                match status {
                    200..=299 => Outcome::Sent,
                    429 | 500..=599 => Outcome::Retry(format!("HTTP {status}")),
                    _ => Outcome::Refused(format!("HTTP {status}")),
                }
            }
            Err(e) => Outcome::Retry(e.to_string()),
        }
    }
}

/// The HTTP agent of every protocol over HTTP/1.1: our timeouts, statuses as answers, and
/// the roots of `SCALENE_RS_PUSH_CA` when set.
pub(crate) fn agent(credentials: &Credentials) -> ureq::Agent {
    let config = ureq::Agent::config_builder()
        .timeout_connect(Some(CONNECT_TIMEOUT))
        .timeout_global(Some(REQUEST_TIMEOUT))
        // Statuses are ours to read, not errors.
        .http_status_as_error(false);
    match &credentials.roots {
        Some(roots) => config.tls_config(
            TlsConfig::builder()
                .root_certs(RootCerts::Specific(roots.0.clone()))
                .build(),
        ),
        None => config,
    }
    .build()
    .into()
}

/// Standard base64 with padding (basic auth's encoding).
fn base64(bytes: &[u8]) -> String {
    const ABC: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ABC[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_is_rfc_4648s() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(b"user:pass"), "dXNlcjpwYXNz");
    }
}
