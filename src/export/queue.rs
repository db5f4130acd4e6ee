//! The windows waiting to be sent, and the thread that sends them.
//!
//! Owns: [`Exporter`].
//! - [`Exporter::send`] never blocks. A window goes into a queue bounded in count and in
//!   bytes ([`QueueBounds`]). When it is full, the oldest waiting windows go first,
//!   counted. The window being sent is not among them, because its fate is its answer's,
//!   so that each window is counted once (sent, refused or dropped), never twice.
//! - The sending thread posts the oldest window:
//!   - a failure worth retrying (for Pyroscope: no connection, 429, 5xx; each protocol's
//!     sender says, as an [`Outcome`]) keeps it and waits, 1 s at first, twice as long
//!     each time, at most [`MAX_BACKOFF`], however many windows arrive meanwhile (only
//!     closing cuts a wait short);
//!   - a refusal (for Pyroscope: other 4xx) drops it, counted.
//! - [`Exporter::finish`] sends what waits within a deadline, then counts the rest dropped.
//!
//! Must not: touch the recording; the session cuts windows, this only carries them.

use super::sender::{Credentials, Outcome, Post, Sender};
use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// The longest wait between two tries of a window.
const MAX_BACKOFF: Duration = Duration::from_secs(60);
const FIRST_BACKOFF: Duration = Duration::from_secs(1);

/// How much may wait to be sent, besides the window being sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueBounds {
    pub windows: usize,
    pub bytes: usize,
}

impl Default for QueueBounds {
    /// Ten minutes of 10 s windows, and 16 MiB, so a backend down for that long costs at
    /// most that much memory.
    fn default() -> Self {
        QueueBounds {
            windows: 60,
            bytes: 16 << 20,
        }
    }
}

/// What became of the windows so far.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExporterStats {
    pub sent: u64,
    /// Dropped because the queue was full (oldest first), or left at the end.
    pub dropped: u64,
    /// Refused by the backend (4xx other than 429).
    pub refused: u64,
    /// Tries that failed and were retried.
    pub retries: u64,
    /// The last failure, said once in the log.
    pub last_error: Option<String>,
}

struct State {
    /// Windows by a number of their own (the one under way is told apart from one queued
    /// since).
    queue: VecDeque<(u64, Vec<u8>)>,
    /// The window being sent (then the queue's first), which a full queue keeps.
    in_flight: Option<u64>,
    next_id: u64,
    bytes: usize,
    stats: ExporterStats,
    /// No more windows will come, so send what waits until `deadline`.
    closing: Option<Instant>,
}

struct Shared {
    state: Mutex<State>,
    wake: Condvar,
}

/// Windows sent on a thread of their own.
pub struct Exporter {
    shared: Arc<Shared>,
    bounds: QueueBounds,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Exporter {
    /// Starts the sending thread for Pyroscope's push `url`.
    pub fn start(url: String, credentials: Credentials, bounds: QueueBounds) -> Exporter {
        Exporter::start_with(
            Box::new(move || Box::new(Sender::new(url, credentials)) as Box<dyn Post>),
            bounds,
        )
    }

    /// Starts the sending thread with the sender `make` builds there (a sender may hold
    /// what must live on that thread, as an async runtime).
    pub(crate) fn start_with(
        make: Box<dyn FnOnce() -> Box<dyn Post> + Send>,
        bounds: QueueBounds,
    ) -> Exporter {
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                queue: VecDeque::new(),
                in_flight: None,
                next_id: 0,
                bytes: 0,
                stats: ExporterStats::default(),
                closing: None,
            }),
            wake: Condvar::new(),
        });
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("push".into())
            .spawn(move || send_loop(&s, make().as_mut()))
            .ok();
        Exporter {
            shared,
            bounds,
            thread,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.shared.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues one encoded window; the oldest ones go when the queue is full.
    pub fn send(&self, window: Vec<u8>) {
        let mut st = self.lock();
        st.bytes += window.len();
        let id = st.next_id;
        st.next_id += 1;
        st.queue.push_back((id, window));
        // The oldest waiting window is the first, or the second while the first is sent.
        let sending = st
            .queue
            .front()
            .is_some_and(|(first, _)| Some(*first) == st.in_flight);
        let oldest = usize::from(sending);
        loop {
            let waiting = st.queue.len() - oldest;
            let over = waiting > self.bounds.windows.max(1)
                || (st.bytes > self.bounds.bytes && waiting > 1);
            if !over {
                break;
            }
            if let Some((_, old)) = st.queue.remove(oldest) {
                st.bytes -= old.len();
                st.stats.dropped += 1;
            }
        }
        drop(st);
        self.shared.wake.notify_all();
    }

    /// The figures so far.
    pub fn stats(&self) -> ExporterStats {
        self.lock().stats.clone()
    }

    /// Sends what waits, for at most `wait`; what is left is counted dropped.
    pub fn finish(mut self, wait: Duration) -> ExporterStats {
        self.lock().closing = Some(Instant::now() + wait);
        self.shared.wake.notify_all();
        if let Some(t) = self.thread.take() {
            let until = Instant::now() + wait + Duration::from_millis(200);
            // A request under way may take its own timeout, and is not waited for past
            // `wait`.
            while !t.is_finished() && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        let mut st = self.lock();
        let left = st.queue.len() as u64;
        st.queue.clear();
        st.stats.dropped += left;
        st.stats.clone()
    }
}

fn send_loop(shared: &Shared, sender: &mut dyn Post) {
    let lock = || shared.state.lock().unwrap_or_else(|e| e.into_inner());
    let mut backoff = FIRST_BACKOFF;
    loop {
        let (id, window) = {
            let mut st = lock();
            loop {
                if let Some(w) = st.queue.front().cloned() {
                    st.in_flight = Some(w.0);
                    break w;
                }
                if st.closing.is_some() {
                    return;
                }
                st = shared.wake.wait(st).unwrap_or_else(|e| e.into_inner());
            }
        };
        let outcome = sender.post(&window);
        let mut st = lock();
        st.in_flight = None;
        let past_deadline = st.closing.is_some_and(|d| Instant::now() >= d);
        match outcome {
            Outcome::Sent => {
                pop(&mut st, id);
                st.stats.sent += 1;
                backoff = FIRST_BACKOFF;
            }
            Outcome::Refused(why) => {
                pop(&mut st, id);
                st.stats.refused += 1;
                st.stats.last_error = Some(why);
            }
            Outcome::Retry(why) => {
                st.stats.retries += 1;
                st.stats.last_error = Some(why);
                if past_deadline {
                    return;
                }
                // Wait out the backoff. A new window wakes this thread but does not end
                // the wait (a backend answering 503 to 1 s windows was tried every
                // second before). Closing does, by the deadline it sets.
                let resume = Instant::now() + backoff;
                loop {
                    let until = st.closing.map_or(resume, |d| resume.min(d));
                    let now = Instant::now();
                    if now >= until {
                        break;
                    }
                    st = shared
                        .wake
                        .wait_timeout(st, until - now)
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                }
                drop(st);
                backoff = (backoff * 2).min(MAX_BACKOFF);
                continue;
            }
        }
        if past_deadline {
            return;
        }
    }
}

/// Takes window `id`, just tried, off the queue (a full queue keeps the window being sent,
/// so it is still first; checked all the same).
fn pop(st: &mut State, id: u64) {
    if st.queue.front().is_some_and(|(first, _)| *first == id) {
        if let Some((_, w)) = st.queue.pop_front() {
            st.bytes -= w.len();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    /// A backend played by the test: each post waits for the test's answer, and says which
    /// window it carried.
    struct Played {
        bodies: mpsc::Sender<Vec<u8>>,
        answers: mpsc::Receiver<Outcome>,
    }

    impl Post for Played {
        fn post(&mut self, body: &[u8]) -> Outcome {
            let _ = self.bodies.send(body.to_vec());
            self.answers
                .recv()
                .unwrap_or(Outcome::Retry("the test ended".into()))
        }
    }

    fn exporter(windows: usize) -> (Exporter, mpsc::Receiver<Vec<u8>>, mpsc::Sender<Outcome>) {
        let (bodies_tx, bodies) = mpsc::channel();
        let (answers, answers_rx) = mpsc::channel();
        let played = Played {
            bodies: bodies_tx,
            answers: answers_rx,
        };
        let bounds = QueueBounds {
            windows,
            bytes: 1 << 20,
        };
        let e = Exporter::start_with(Box::new(move || Box::new(played) as Box<dyn Post>), bounds);
        (e, bodies, answers)
    }

    const WAIT: Duration = Duration::from_secs(5);

    #[test]
    fn a_full_queue_drops_the_oldest_waiting_and_keeps_the_one_being_sent() {
        let (e, bodies, answers) = exporter(2);
        e.send(vec![0]);
        assert_eq!(
            bodies.recv_timeout(WAIT).unwrap(),
            [0],
            "window 0 is being sent"
        );
        for w in 1..=5 {
            e.send(vec![w]);
        }
        // 1..=5 wait in a queue of 2, so 1, 2, 3 are dropped; 0 is still under way.
        assert_eq!(e.stats().dropped, 3);
        answers.send(Outcome::Sent).unwrap();
        assert_eq!(bodies.recv_timeout(WAIT).unwrap(), [4]);
        answers.send(Outcome::Sent).unwrap();
        assert_eq!(bodies.recv_timeout(WAIT).unwrap(), [5]);
        answers.send(Outcome::Sent).unwrap();
        let st = e.finish(WAIT);
        assert_eq!((st.sent, st.dropped, st.refused), (3, 3, 0));
    }

    #[test]
    fn each_window_is_counted_once_whatever_its_answer() {
        let (e, bodies, answers) = exporter(1);
        e.send(vec![0]);
        bodies.recv_timeout(WAIT).unwrap();
        e.send(vec![1]);
        e.send(vec![2]); // drops 1
        answers.send(Outcome::Refused("400".into())).unwrap();
        assert_eq!(bodies.recv_timeout(WAIT).unwrap(), [2]);
        answers.send(Outcome::Sent).unwrap();
        let st = e.finish(WAIT);
        assert_eq!((st.sent, st.dropped, st.refused), (1, 1, 1));
    }

    #[test]
    fn new_windows_do_not_cut_a_backoff_short() {
        let (e, bodies, answers) = exporter(8);
        e.send(vec![0]);
        bodies.recv_timeout(WAIT).unwrap();
        let failed = Instant::now();
        answers.send(Outcome::Retry("503".into())).unwrap();
        // Windows arriving during the first backoff (1 s) wake the thread; it goes on
        // waiting.
        for w in 1..=4 {
            std::thread::sleep(Duration::from_millis(100));
            e.send(vec![w]);
        }
        assert_eq!(bodies.recv_timeout(WAIT).unwrap(), [0], "tried again");
        let waited = failed.elapsed();
        assert!(waited >= FIRST_BACKOFF, "tried again after {waited:?}");
        for _ in 0..5 {
            answers.send(Outcome::Sent).unwrap();
        }
        let st = e.finish(WAIT);
        assert_eq!((st.sent, st.dropped, st.retries), (5, 0, 1));
    }
}
