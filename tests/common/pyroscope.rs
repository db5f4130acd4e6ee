//! A loopback Pyroscope push endpoint, decoded for real (tests/push.rs, tests/agent.rs).
//!
//! [`Receiver`] answers `POST /push.v1.PusherService/Push` as Pyroscope does (the connect
//! protocol's unary call), keeps each request, gunzipped, and decodes each `PushRequest`
//! with messages declared from Pyroscope's published field numbers (independently of
//! src/export). [`pprof_top`] reads a raw profile with `go tool pprof` (Debian's Go).
//! Included by `#[path]` where needed, not through tests/common (no other test needs it).
#![allow(dead_code)]

use std::io::Read;
use std::path::Path;
use std::process::Command;

/// Pyroscope's push.v1 messages, from their field numbers.
pub mod proto {
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct PushRequest {
        #[prost(message, repeated, tag = "1")]
        pub series: Vec<RawProfileSeries>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct RawProfileSeries {
        #[prost(message, repeated, tag = "1")]
        pub labels: Vec<LabelPair>,
        #[prost(message, repeated, tag = "2")]
        pub samples: Vec<RawSample>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct LabelPair {
        #[prost(string, tag = "1")]
        pub name: String,
        #[prost(string, tag = "2")]
        pub value: String,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct RawSample {
        #[prost(bytes = "vec", tag = "1")]
        pub raw_profile: Vec<u8>,
        #[prost(string, tag = "2")]
        pub id: String,
    }
}

// The receiver itself: tests/common/receiver.rs (answers as told, stalls, stops).
#[path = "receiver.rs"]
mod http;
pub use http::{Receiver, Request};

/// A raw profile's start and length (pprof's `time_nanos` = 9, `duration_nanos` = 10).
#[derive(Clone, PartialEq, prost::Message)]
pub struct PprofTimes {
    #[prost(int64, tag = "9")]
    pub time_nanos: i64,
    #[prost(int64, tag = "10")]
    pub duration_nanos: i64,
}

/// A raw profile's comments (pprof's `string_table` = 6, `comment` = 13: indices into it).
#[derive(Clone, PartialEq, prost::Message)]
pub struct PprofComments {
    #[prost(string, repeated, tag = "6")]
    pub string_table: Vec<String>,
    #[prost(int64, repeated, tag = "13")]
    pub comment: Vec<i64>,
}

/// The comments of a raw (gzipped) pprof profile.
pub fn pprof_comments(raw: &[u8]) -> Vec<String> {
    let mut plain = Vec::new();
    flate2::read::GzDecoder::new(raw)
        .read_to_end(&mut plain)
        .expect("a gzipped pprof");
    let p = <PprofComments as prost::Message>::decode(plain.as_slice()).expect("a pprof Profile");
    p.comment
        .iter()
        .filter_map(|&i| p.string_table.get(usize::try_from(i).ok()?).cloned())
        .collect()
}

impl Request {
    /// The body as a `PushRequest`.
    pub fn push(&self) -> proto::PushRequest {
        <proto::PushRequest as prost::Message>::decode(self.body.as_slice()).expect("a PushRequest")
    }
}

impl proto::RawProfileSeries {
    /// The value of label `name`.
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|l| l.name == name)
            .map(|l| l.value.as_str())
    }
}

/// The start and length of a raw (gzipped) pprof profile.
pub fn pprof_times(raw: &[u8]) -> PprofTimes {
    let mut plain = Vec::new();
    flate2::read::GzDecoder::new(raw)
        .read_to_end(&mut plain)
        .expect("a gzipped pprof");
    <PprofTimes as prost::Message>::decode(plain.as_slice()).expect("a pprof Profile")
}

/// `go tool pprof -top -lines [-sample_index=INDEX]` of one raw profile: `file:line` →
/// flat percent.
pub fn pprof_top(raw: &[u8], index: &str, dir: &Path, n: usize) -> Vec<(String, f64)> {
    let file = dir.join(format!("window-{n}-{index}.pb.gz"));
    std::fs::write(&file, raw).unwrap();
    let out = Command::new("go")
        .args(["tool", "pprof", "-top", "-lines"])
        .arg(format!("-sample_index={index}"))
        .arg(&file)
        .output()
        .expect("go");
    top_rows(&String::from_utf8_lossy(&out.stdout))
}

/// The rows of `-top -lines` output: `file:line` → flat percent.
fn top_rows(text: &str) -> Vec<(String, f64)> {
    text.lines()
        .skip_while(|l| !l.trim_start().starts_with("flat"))
        .skip(1)
        .filter_map(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            (cols.len() >= 7).then(|| {
                let pct = cols[1].trim_end_matches('%').parse().unwrap_or(0.0);
                (cols[cols.len() - 1].to_string(), pct)
            })
        })
        .collect()
}

pub fn flat(rows: &[(String, f64)], file_line: &str) -> f64 {
    rows.iter()
        .filter(|(p, _)| p.ends_with(file_line))
        .map(|(_, pct)| pct)
        .sum()
}

/// `go tool pprof -top -lines -sample_index=INDEX` of raw profiles merged (pprof adds
/// profiles given together): `file:line` → flat percent of them all.
pub fn pprof_top_merged(raws: &[&[u8]], index: &str, dir: &Path, name: &str) -> Vec<(String, f64)> {
    let mut files = Vec::new();
    for (n, raw) in raws.iter().enumerate() {
        let file = dir.join(format!("{name}-{n}.pb.gz"));
        std::fs::write(&file, raw).unwrap();
        files.push(file);
    }
    let out = Command::new("go")
        .args(["tool", "pprof", "-top", "-lines"])
        .arg(format!("-sample_index={index}"))
        .args(&files)
        .output()
        .expect("go");
    top_rows(&String::from_utf8_lossy(&out.stdout))
}
