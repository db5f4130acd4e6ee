//! Grafana Pyroscope's push API: a `PushRequest` of raw pprof profiles with their labels.
//!
//! Owns: the messages of `push.v1` we send, declared from their field numbers for prost's
//! derive (as report/pprof.rs declares pprof's), and [`series_request`], which makes the
//! request of one window.
//! - `PushRequest { repeated RawProfileSeries series = 1; }`
//! - `RawProfileSeries { repeated LabelPair labels = 1; repeated RawSample samples = 2; }`
//! - `LabelPair { string name = 1; string value = 2; }` (`types.v1`)
//! - `RawSample { bytes raw_profile = 1; string ID = 2; }`
//!
//! Two series a window:
//! - `__name__=process_cpu` (time: samples, CPU, and its Python / native / system parts);
//! - with memory, `__name__=memory` (bytes allocated).
//!
//! Must not: send anything (`sender.rs` does).

use crate::profile::Profile;

/// The messages, as prost declares them.
pub(crate) mod proto {
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

/// The labels of every series of a recording: `service_name`, then the user's tags.
pub fn labels_of(service: &str, tags: &[(String, String)]) -> Vec<(String, String)> {
    let mut out = vec![("service_name".to_string(), service.to_string())];
    // A tag replaces the service's label, and the last tag of a name wins.
    for (k, v) in tags {
        super::set_named(&mut out, k, v.clone());
    }
    out
}

/// The encoded `PushRequest` of one window: `window` (a profile of the window alone, see
/// [`Profile::since`]) that began at `start_ns` (Unix time), with `labels` on each series
/// and `note` (e.g. windows dropped before this one) among the pprof's comments.
pub fn series_request(
    window: &Profile,
    start_ns: i64,
    labels: &[(String, String)],
    note: Option<&str>,
) -> std::io::Result<Vec<u8>> {
    use prost::Message;
    let mut time = window.clone();
    time.memory = None;
    time.gpu = None;
    let mut all = vec![series("process_cpu", &time, start_ns, labels, note)?];
    if let Some(m) = &window.memory {
        let mut mem = window.clone();
        mem.stacks.clear();
        mem.gpu = None;
        mem.memory = Some(m.clone());
        all.push(series("memory", &mem, start_ns, labels, note)?);
    }
    Ok(proto::PushRequest { series: all }.encode_to_vec())
}

fn series(
    name: &str,
    p: &Profile,
    start_ns: i64,
    labels: &[(String, String)],
    note: Option<&str>,
) -> std::io::Result<proto::RawProfileSeries> {
    let mut l = vec![proto::LabelPair {
        name: "__name__".into(),
        value: name.into(),
    }];
    l.extend(labels.iter().map(|(k, v)| proto::LabelPair {
        name: k.clone(),
        value: v.clone(),
    }));
    Ok(proto::RawProfileSeries {
        labels: l,
        samples: vec![proto::RawSample {
            raw_profile: crate::report::pprof::render_window(p, start_ns, note)?,
            id: String::new(),
        }],
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    #[test]
    fn a_tag_replaces_a_label_of_its_name() {
        let tags = |t: &[(&str, &str)]| -> Vec<(String, String)> {
            t.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        assert_eq!(
            labels_of(
                "app",
                &tags(&[("service_name", "checkout"), ("env", "a"), ("env", "b")])
            ),
            tags(&[("service_name", "checkout"), ("env", "b")])
        );
    }

    #[test]
    fn a_request_has_a_cpu_series_with_the_labels() {
        let p = crate::report::pprof::tests::profile();
        let labels = labels_of("svc", &[("env".into(), "prod".into())]);
        let bytes = series_request(&p, 1_700_000_000_000_000_000, &labels, None).unwrap();
        let r = proto::PushRequest::decode(bytes.as_slice()).unwrap();
        assert_eq!(r.series.len(), 1, "no memory, one series");
        let names: Vec<(&str, &str)> = r.series[0]
            .labels
            .iter()
            .map(|l| (l.name.as_str(), l.value.as_str()))
            .collect();
        assert_eq!(
            names,
            [
                ("__name__", "process_cpu"),
                ("service_name", "svc"),
                ("env", "prod")
            ]
        );
        // A gzip file (pprof's own form).
        assert_eq!(&r.series[0].samples[0].raw_profile[..2], &[0x1f, 0x8b]);
    }
}
