//! A loopback HTTP/1.1 receiver for the push tests: it keeps every request and answers
//! as it is told, so that a test can play a backend that works, refuses, stalls or dies.
//!
//! - Answers: the next status of the list given, 200 once it runs out.
//! - A stall: the requests that arrive in the first `stall` get no answer at all; the
//!   connection stays open until the client gives up on it.
//! - [`Receiver::stop`] closes the listener and every open connection (a backend killed
//!   mid-run); [`Receiver::start_on`] starts a new one on the same port.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One request as received.
#[derive(Debug, Clone)]
pub struct Request {
    pub path: String,
    pub headers: Vec<(String, String)>,
    /// The body, gunzipped when it said so.
    pub body: Vec<u8>,
    /// The status it was answered with; `None`: it got no answer (a stall, or a stop).
    pub status: Option<u16>,
}

impl Request {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// What the connections share.
struct Shared {
    got: Mutex<Vec<Request>>,
    answers: Mutex<VecDeque<u16>>,
    /// Requests before this instant get no answer.
    stall_until: Instant,
    stopped: AtomicBool,
    open: Mutex<Vec<TcpStream>>,
}

pub struct Receiver {
    pub port: u16,
    shared: Arc<Shared>,
}

impl Receiver {
    /// A receiver on a free port answering with `answers`, then 200s.
    pub fn start(answers: Vec<u16>) -> Receiver {
        Receiver::listen(0, answers, Duration::ZERO)
    }

    /// A receiver on `port` (one stopped before, or reserved by the test).
    pub fn start_on(port: u16, answers: Vec<u16>) -> Receiver {
        Receiver::listen(port, answers, Duration::ZERO)
    }

    /// A receiver that leaves every request of its first `stall` unanswered, then 200s.
    pub fn stalling(stall: Duration) -> Receiver {
        Receiver::listen(0, Vec::new(), stall)
    }

    fn listen(port: u16, answers: Vec<u16>, stall: Duration) -> Receiver {
        // std sets SO_REUSEADDR: a port whose receiver was stopped can be bound again.
        let listener = TcpListener::bind(("127.0.0.1", port)).expect("a loopback port");
        let port = listener.local_addr().unwrap().port();
        listener.set_nonblocking(true).unwrap();
        let shared = Arc::new(Shared {
            got: Mutex::new(Vec::new()),
            answers: Mutex::new(VecDeque::from(answers)),
            stall_until: Instant::now() + stall,
            stopped: AtomicBool::new(false),
            open: Mutex::new(Vec::new()),
        });
        let s = shared.clone();
        std::thread::spawn(move || {
            while !s.stopped.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((conn, _)) => {
                        conn.set_nonblocking(false).unwrap();
                        s.open.lock().unwrap().push(conn.try_clone().unwrap());
                        let s = s.clone();
                        std::thread::spawn(move || serve(conn, &s));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
            // The listener closes here: connecting is refused from now on.
        });
        Receiver { port, shared }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Every request so far, answered or not.
    pub fn requests(&self) -> Vec<Request> {
        self.shared.got.lock().unwrap().clone()
    }

    /// The requests answered 2xx, in order.
    pub fn accepted(&self) -> Vec<Request> {
        self.requests()
            .into_iter()
            .filter(|r| r.status.is_some_and(|s| (200..300).contains(&s)))
            .collect()
    }

    /// Stops listening and drops every open connection, as a backend killed would.
    pub fn stop(&self) {
        self.shared.stopped.store(true, Ordering::SeqCst);
        for c in self.shared.open.lock().unwrap().drain(..) {
            let _ = c.shutdown(Shutdown::Both);
        }
        // The accept loop notices within its 10 ms poll.
        std::thread::sleep(Duration::from_millis(50));
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Serves one connection's requests (ureq keeps its connections).
fn serve(conn: TcpStream, s: &Shared) {
    let mut out = conn.try_clone().unwrap();
    let mut r = BufReader::new(conn);
    loop {
        let mut first = String::new();
        if r.read_line(&mut first).unwrap_or(0) == 0 {
            return;
        }
        let path = first.split_whitespace().nth(1).unwrap_or("").to_string();
        let mut headers = Vec::new();
        loop {
            let mut l = String::new();
            if r.read_line(&mut l).unwrap_or(0) == 0 {
                return;
            }
            let l = l.trim_end();
            if l.is_empty() {
                break;
            }
            if let Some((k, v)) = l.split_once(':') {
                headers.push((k.trim().to_string(), v.trim().to_string()));
            }
        }
        let len: usize = headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
            .and_then(|(_, v)| v.parse().ok())
            .unwrap_or(0);
        let mut body = vec![0; len];
        if r.read_exact(&mut body).is_err() {
            return;
        }
        let gz = headers
            .iter()
            .any(|(k, v)| k.eq_ignore_ascii_case("content-encoding") && v == "gzip");
        if gz {
            let mut plain = Vec::new();
            flate2::read::GzDecoder::new(&body[..])
                .read_to_end(&mut plain)
                .unwrap();
            body = plain;
        }
        let stalled = Instant::now() < s.stall_until || s.stopped.load(Ordering::SeqCst);
        let status = (!stalled).then(|| s.answers.lock().unwrap().pop_front().unwrap_or(200));
        s.got.lock().unwrap().push(Request {
            path,
            headers,
            body,
            status,
        });
        let Some(status) = status else {
            // No answer: wait for the client to give up (it closes; the read ends).
            let mut rest = Vec::new();
            let _ = r.read_to_end(&mut rest);
            return;
        };
        let reason = if status == 200 { "OK" } else { "Error" };
        let _ = write!(
            out,
            "HTTP/1.1 {status} {reason}\r\nContent-Type: application/proto\r\nContent-Length: 0\r\n\r\n"
        );
    }
}
