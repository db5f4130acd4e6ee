//! The recording's side of `--push`: windows cut from the profile so far, handed to the
//! exporter as they close.
//!
//! Owns: [`Pusher`].
//! - Windows end at wall-clock multiples of `--window`, as Pyroscope expects. The first
//!   one is shorter, from the start to the first multiple.
//! - A window is the difference of two pictures ([`Profile::since`]), cut between ticks.
//! - The last window, open when the recording ends (the program's exit, Ctrl-C,
//!   SIGTERM), is cut from the finished profile and sent before we exit (bounded wait).
//! - What the exporter could not deliver is said on one line, once, and counted in the
//!   next window's comments.
//! - The exporter is the recording's own, or shared by many (the agent's processes, each
//!   a `Pusher` of its own: [`Pusher::sharing`]). The last `Pusher` to finish ends it.
//!
//! Must not: wait on the backend (the exporter's thread does) or print while a live view
//! has the terminal (`quiet`).

use super::live::Camera;
use crate::export::{self, AttrValue, Exporter, ExporterStats, PushConfig, PushFormat};
use crate::memory::fleet::Fleet;
use crate::profile::Profile;
use crate::sampler::tree::ProcessTree;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How long the end of a recording waits for its last windows to be sent.
pub(super) const FLUSH_WAIT: Duration = Duration::from_secs(5);

/// Cuts windows and gives them to the exporter.
pub(crate) struct Pusher {
    exporter: Arc<Exporter>,
    camera: Camera,
    window: Duration,
    labels: Vec<(String, String)>,
    format: PushFormat,
    /// OTLP's resource attributes, read again at each cut while the process lives (a
    /// process we started may still be a shell or pyenv's shim at the start, and exec
    /// Python after).
    resource: Vec<(String, AttrValue)>,
    pid: i32,
    service: String,
    tags: Vec<(String, String)>,
    url: String,
    /// When the open window began and when it ends (Unix time, ns).
    start_ns: i64,
    end_ns: i64,
    /// The picture the open window starts from (None: the recording's start).
    before: Option<Profile>,
    /// The last failure said, and the drops counted in a window already.
    said: Option<String>,
    quiet: bool,
}

fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i64)
}

/// The first wall-clock multiple of `window` after `t_ns`.
fn next_multiple(t_ns: i64, window: Duration) -> i64 {
    let w = (window.as_nanos() as i64).max(1);
    (t_ns / w + 1) * w
}

impl Pusher {
    /// `program` and `pid` name the recording (see [`Camera`]). `quiet`: a live view has
    /// the terminal.
    pub(crate) fn new(cfg: &PushConfig, program: String, pid: i32, quiet: bool) -> Pusher {
        let exporter = cfg.start_exporter();
        let labels = export::labels_of(&cfg.service, &cfg.tags);
        Pusher::sharing(Arc::new(exporter), cfg, labels, program, pid, quiet)
    }

    /// A pusher whose windows go to `exporter`, shared with others, each window with
    /// `labels` (`cfg.service` and `cfg.tags` are not looked at).
    pub(crate) fn sharing(
        exporter: Arc<Exporter>,
        cfg: &PushConfig,
        labels: Vec<(String, String)>,
        program: String,
        pid: i32,
        quiet: bool,
    ) -> Pusher {
        let start_ns = now_ns();
        Pusher {
            exporter,
            camera: Camera::new(program, pid),
            window: cfg.window,
            format: cfg.format,
            resource: Vec::new(),
            pid,
            // OTLP's service.name: the agent's own for each process (its labels), else ours.
            service: labels
                .iter()
                .find(|(k, _)| k == "service_name")
                .map_or_else(|| cfg.service.clone(), |(_, v)| v.clone()),
            tags: cfg.tags.clone(),
            labels,
            url: cfg.url.clone(),
            start_ns,
            end_ns: next_multiple(start_ns, cfg.window),
            before: None,
            said: None,
            quiet,
        }
    }

    /// After a tick, the open window is cut when its end has come.
    pub(crate) fn tick(&mut self, tree: &ProcessTree, fleet: Option<&Fleet>) {
        let now = now_ns();
        if now < self.end_ns {
            return;
        }
        let picture = self.camera.picture(tree, fleet);
        // Nothing recorded yet (a pusher made just before a window's end): no window of
        // no length, which would begin where the next one does.
        if self.before.is_some() || picture.meta.duration_s > 0.0 {
            self.cut(picture, Some(now));
        }
        self.end_ns = next_multiple(now, self.window);
        self.say_failures();
    }

    /// Sends the window from the last cut to `picture`, taken at `now` (Unix ns), or at the
    /// end of the recording (None).
    ///
    /// Each window ends where the next begins, at the cut's `now`, so that they tile the
    /// wall clock. Its length is not its profile's duration, which is the recording's own
    /// clock, read before the tick that cuts:
    /// - a tick that stalls (reading a process under load) delays `now`, not that clock;
    /// - windows measured by it left gaps of 100+ ms between one another under the test
    ///   suite's load, with no sample lost.
    ///
    /// The last window ends with its profile's duration (the recording is over; `now` then
    /// counts the time spent finishing it).
    fn cut(&mut self, picture: Profile, now: Option<i64>) {
        let window = match &self.before {
            Some(b) => picture.since(b),
            None => picture.clone(),
        };
        let now = now.unwrap_or_else(|| {
            (self.start_ns + export::nanos(window.meta.duration_s)).min(now_ns())
        });
        if self.before.is_none() {
            // The first window begins with the recording, up to ~150 ms after this pusher
            // was made (its length is the recording's). Sent from its creation, it covered
            // time it did not have and left a gap before the second.
            let began = now.saturating_sub(export::nanos(window.meta.duration_s));
            self.start_ns = self.start_ns.max(began);
        }
        let dropped = self.exporter.stats().dropped;
        let encoded = match self.format {
            PushFormat::Pyroscope => {
                let note =
                    (dropped > 0).then(|| format!("scalene-rs: {dropped} earlier windows dropped"));
                export::series_request(&window, self.start_ns, &self.labels, note.as_deref())
            }
            PushFormat::OtlpGrpc | PushFormat::OtlpHttp => {
                if self.resource.is_empty() || crate::proc::process_exists(self.pid) {
                    self.resource = export::process_resource(self.pid, &self.service, &self.tags);
                }
                Ok(export::profiles_request(
                    &window,
                    (self.start_ns, now),
                    &self.resource,
                    dropped,
                ))
            }
        };
        match encoded {
            Ok(bytes) => self.exporter.send(bytes),
            Err(e) => self.say(format!("encoding a window: {e}")),
        }
        self.before = Some(picture);
        self.start_ns = now;
    }

    fn say_failures(&mut self) {
        let st = self.exporter.stats();
        if let Some(why) = st.last_error.filter(|w| self.said.as_ref() != Some(w)) {
            self.said = Some(why.clone());
            self.say(format!(
                "push to {}: {why} (retrying with backoff)",
                self.url
            ));
        }
    }

    fn say(&self, line: String) {
        if !self.quiet {
            eprintln!("scalene-rs: {line}");
        }
    }

    /// The recording ended with `profile`, so its last window is queued. The last pusher of
    /// an exporter then sends what waits, for at most [`FLUSH_WAIT`]. Gives what became of
    /// the windows (so far, while others share the exporter).
    pub(crate) fn finish(mut self, profile: &Profile) -> ExporterStats {
        self.cut(profile.clone(), None);
        match Arc::try_unwrap(self.exporter) {
            Ok(own) => own.finish(FLUSH_WAIT),
            Err(shared) => shared.stats(),
        }
    }

    /// The recording ended and its last window was cut from the tree's pictures. See
    /// [`Pusher::finish`].
    pub(crate) fn finish_tree(mut self, tree: &ProcessTree) -> ExporterStats {
        let picture = self.camera.picture(tree, None);
        self.finish(&picture)
    }
}

/// What `--push` did, in one line for the report's notes.
pub(crate) fn summary(url: &str, st: &ExporterStats) -> String {
    let mut s = format!("pushed {} windows to {url}", st.sent);
    if st.dropped > 0 || st.refused > 0 {
        s.push_str(&format!(
            " ({} dropped, {} refused by the backend)",
            st.dropped, st.refused
        ));
    }
    if let (Some(why), true) = (&st.last_error, st.dropped + st.refused > 0) {
        s.push_str(&format!("; last failure: {why}"));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_end_at_wall_clock_multiples() {
        let w = Duration::from_secs(10);
        let s = 1_000_000_000;
        assert_eq!(next_multiple(3 * s, w), 10 * s);
        assert_eq!(next_multiple(10 * s, w), 20 * s);
        assert_eq!(next_multiple(19 * s + 999, w), 20 * s);
    }
}
