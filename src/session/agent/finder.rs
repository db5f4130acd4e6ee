//! The agent's look at the host: which processes are Python processes to profile.
//!
//! Owns: [`Finder`], which lists /proc at each scan and says which processes are new
//! Python processes, located and initialized, that `--match` / `--exclude` let through.
//! - A process is looked at when it is first seen and again when its executable changes
//!   (an `exec`). That costs one `readlink` per known process per scan, nothing more.
//! - Only a process whose executable is named `python*`, or that maps a `libpython`
//!   (uwsgi, a frozen application), is located (its ELF files parsed). The other
//!   processes of a host cost one read of their maps, once. A process younger than
//!   [`YOUNG`] (a PyInstaller one-file app's child maps libpython only once it has
//!   unpacked it, without an exec) costs up to [`WAIT_TRIES`] reads, the wait doubling.
//! - A Python that is not ready yet (libpython not mapped, the interpreter not
//!   initialized) is looked at again at the next scans, [`WAIT_TRIES`] times at most,
//!   the wait doubling.
//! - A process that cannot be profiled (no permission, an unsupported version) is said
//!   once, and left alone.
//!
//! Must not: sample, or touch a process beyond reading /proc and locating its
//! interpreter (no signal, no ptrace stop).

use crate::error::Error;
use crate::python::{LocateOptions, PythonProcess};
use regex::Regex;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Scans a Python that is not ready yet is looked at, at most (about a minute at 1 s
/// scans: 1 + 2 + 4 + 8 + 16 + 32 s).
const WAIT_TRIES: u32 = 6;

/// What is known of one pid.
struct Seen {
    /// Its executable when last looked at ("" when it cannot be read, as for a kernel thread
    /// or a process of another user; never looked at again).
    exe: String,
    state: State,
}

enum State {
    /// Being profiled (the agent says when it stops, through [`Finder::released`]).
    Taken,
    /// A Python not ready yet, looked at again at `next`.
    Waiting { next: Instant, tries: u32 },
    /// Not to be profiled while it runs this executable.
    Left,
}

/// What `--match` and `--exclude` ask for.
#[derive(Debug, Clone, Default)]
pub struct Selection {
    /// Only processes whose command line matches.
    pub matching: Option<Regex>,
    /// No process whose command line matches.
    pub exclude: Option<Regex>,
}

impl Selection {
    fn admits(&self, command: &str) -> bool {
        self.matching.as_ref().is_none_or(|m| m.is_match(command))
            && !self.exclude.as_ref().is_some_and(|x| x.is_match(command))
    }
}

/// Finds the Python processes of the host as they start.
pub(super) struct Finder {
    known: HashMap<i32, Seen>,
    select: Selection,
    /// The wait before a not-ready Python is looked at again, doubled each try.
    retry: Duration,
    own: i32,
}

/// A new Python process to profile.
pub(super) struct Found {
    pub(super) proc: PythonProcess,
    pub(super) argv: Vec<String>,
}

/// The CPU time this thread has used, which is what a look at the host costs us (wall time
/// would count the while another program had the CPU).
pub(super) use crate::sampler::cputime::own_thread_cpu as thread_cpu;

/// The pids /proc lists now.
fn list_pids() -> Vec<i32> {
    std::fs::read_dir("/proc").map_or_else(
        |_| Vec::new(),
        |d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse().ok())
                .collect()
        },
    )
}

/// Whether the process may hold a CPython interpreter: its executable's name, or a
/// libpython in its maps.
fn may_be_python(pid: i32, exe: &str) -> bool {
    let name = exe.rsplit('/').next().unwrap_or(exe);
    if name.starts_with("python") {
        return true;
    }
    std::fs::read(format!("/proc/{pid}/maps"))
        .is_ok_and(|m| m.windows(9).any(|w| w == b"libpython"))
}

/// A process that started less than [`YOUNG`] ago may still load libpython.
const YOUNG: Duration = Duration::from_secs(60);

/// Whether process `pid` started less than [`YOUNG`] ago.
fn young(pid: i32) -> bool {
    let now = crate::timeline::now_us();
    crate::proc::start_time_us(pid)
        .is_some_and(|t| now.saturating_sub(t) < YOUNG.as_micros() as u64)
}

impl Finder {
    pub(super) fn new(select: Selection, retry: Duration) -> Finder {
        Finder {
            known: HashMap::new(),
            select,
            retry,
            own: std::process::id() as i32,
        }
    }

    /// Process `pid` is no longer profiled. It is looked at again only when it execs.
    pub(super) fn released(&mut self, pid: i32) {
        if let Some(s) = self.known.get_mut(&pid) {
            s.state = State::Left;
            s.exe = crate::proc::exe_path(pid).unwrap_or_default();
        }
    }

    /// One look at the host: the new Python processes to profile, what is to be said
    /// (once per process), and how much of the look's CPU time went to locating
    /// interpreters (once a process, so not the look's own cost).
    pub(super) fn scan(
        &mut self,
        now: Instant,
        say: &mut dyn FnMut(String),
    ) -> (Vec<Found>, Duration) {
        let mut locating = Duration::ZERO;
        let pids = list_pids();
        let alive: std::collections::HashSet<i32> = pids.iter().copied().collect();
        self.known.retain(|p, _| alive.contains(p));
        let mut found = Vec::new();
        for pid in pids {
            if pid == self.own {
                continue;
            }
            match self.known.get(&pid) {
                Some(Seen {
                    state: State::Taken,
                    ..
                }) => continue,
                Some(s) if s.exe.is_empty() => continue,
                _ => {}
            }
            let exe = match std::fs::read_link(format!("/proc/{pid}/exe")) {
                Ok(p) => p.to_string_lossy().into_owned(),
                Err(e) => {
                    if !self.known.contains_key(&pid)
                        && e.kind() == std::io::ErrorKind::PermissionDenied
                    {
                        // Said only of a Python the selection asks for, because a process
                        // `--match` leaves out is none of the agent's business.
                        let argv = crate::proc::arguments(pid);
                        if argv.first().is_some_and(|a| a.contains("python"))
                            && self.select.admits(&argv.join(" "))
                        {
                            say(format!(
                                "process {pid} ({}): not profiled: cannot read it \
                                 (run the agent as root, or with CAP_SYS_PTRACE)",
                                argv.join(" ")
                            ));
                        }
                    }
                    self.known.insert(
                        pid,
                        Seen {
                            exe: String::new(),
                            state: State::Left,
                        },
                    );
                    continue;
                }
            };
            if let Some(s) = self.known.get(&pid) {
                let due = match s.state {
                    State::Waiting { next, .. } => now >= next,
                    State::Left | State::Taken => false,
                };
                if s.exe == exe && !due {
                    continue;
                }
            }
            let tries = match self.known.get(&pid) {
                Some(Seen {
                    exe: e,
                    state: State::Waiting { tries, .. },
                }) if *e == exe => tries + 1,
                _ => 0,
            };
            let (state, hit) = self.look(pid, &exe, tries, now, say, &mut locating);
            if let Some(f) = hit {
                found.push(f);
            }
            self.known.insert(pid, Seen { exe, state });
        }
        (found, locating)
    }

    /// One look at process `pid`, running `exe`, for the `tries`-th time in a row.
    fn look(
        &self,
        pid: i32,
        exe: &str,
        tries: u32,
        now: Instant,
        say: &mut dyn FnMut(String),
        locating: &mut Duration,
    ) -> (State, Option<Found>) {
        let argv = crate::proc::arguments(pid);
        // No command line: a kernel thread, or a process on its way out.
        if argv.is_empty() || !self.select.admits(&argv.join(" ")) {
            return (State::Left, None);
        }
        let wait = || State::Waiting {
            next: now + self.retry * 2u32.saturating_pow(tries),
            tries,
        };
        if !may_be_python(pid, exe) {
            // A young process may load libpython later without an exec (a PyInstaller
            // one-file app's child unpacks it first), so it is looked at again while young.
            return if tries + 1 < WAIT_TRIES && young(pid) {
                (wait(), None)
            } else {
                (State::Left, None)
            };
        }
        let began = thread_cpu();
        let located = PythonProcess::locate(pid, &LocateOptions::default());
        *locating += thread_cpu().saturating_sub(began);
        let why = match located {
            Ok(p) => match p.interp_head() {
                Ok(h) if h != 0 => {
                    return (State::Taken, Some(Found { proc: p, argv }));
                }
                _ => "its interpreter never finished starting".to_string(),
            },
            Err(e) if e.is_process_gone() => return (State::Left, None),
            Err(
                e @ (Error::UnsupportedVersion { .. }
                | Error::PermissionDenied { .. }
                | Error::NoGil { .. }),
            ) => {
                say(format!(
                    "process {pid} ({}): not profiled: {e}",
                    argv.join(" ")
                ));
                return (State::Left, None);
            }
            Err(e) => e.to_string(),
        };
        if tries + 1 < WAIT_TRIES {
            return (wait(), None);
        }
        say(format!(
            "process {pid} ({}): not profiled: {why}",
            argv.join(" ")
        ));
        (State::Left, None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn match_and_exclude_read_the_command_line() {
        let s = Selection {
            matching: Some(Regex::new("gunicorn|celery").unwrap()),
            exclude: Some(Regex::new("--debug").unwrap()),
        };
        assert!(s.admits("python -m celery worker"));
        assert!(!s.admits("python -m celery worker --debug"));
        assert!(!s.admits("python app.py"));
        assert!(Selection::default().admits("python app.py"));
    }
}
