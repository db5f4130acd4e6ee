//! Recording sessions: `run` (start a program and profile it to its end) and `attach`
//! (profile a running process for a while).
//!
//! Owns: starting the command with its stdio untouched, waiting for its Python interpreter to
//! come up, forwarding termination signals to it, passing its exit status back, and stopping
//! an attach on Ctrl-C, a duration, or the target's exit.
//! Must not: render reports (the caller does) or change anything in the target.

use crate::error::{Error, Result};
use crate::profile::Profile;
use crate::python::{LocateOptions, PythonProcess};
use crate::sampler::tree::{command_line, ProcessTree};
use crate::sampler::{SamplerConfig, Stats};
use nix::sys::signal::{self, SaFlags, SigAction, SigHandler, SigSet, Signal};
use std::process::{Command, ExitStatus};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Signals received and not yet handled, one bit per signal number.
static PENDING: AtomicU64 = AtomicU64::new(0);

extern "C" fn note_signal(sig: libc::c_int) {
    if (0..64).contains(&sig) {
        PENDING.fetch_or(1 << sig, Ordering::SeqCst);
    }
}

fn take_pending() -> Vec<Signal> {
    let bits = PENDING.swap(0, Ordering::SeqCst);
    (1..64)
        .filter(|s| bits & (1u64 << s) != 0)
        .filter_map(|s| Signal::try_from(s).ok())
        .collect()
}

fn catch(signals: &[Signal]) {
    let action = SigAction::new(
        SigHandler::Handler(note_signal),
        SaFlags::SA_RESTART,
        SigSet::empty(),
    );
    for &s in signals {
        // SAFETY: `note_signal` only does an atomic fetch_or, which is async-signal-safe.
        unsafe {
            let _ = signal::sigaction(s, &action);
        }
    }
}

/// What `run` records.
#[derive(Debug, Clone)]
pub struct RunConfig {
    /// The command and its arguments.
    pub command: Vec<String>,
    pub sampler: SamplerConfig,
    /// Profile the program's child processes too (every descendant that runs Python).
    pub follow_children: bool,
}

/// The outcome of `run`.
pub struct RunOutcome {
    /// None when no Python interpreter was ever found in the process.
    pub profile: Option<Profile>,
    pub status: ExitStatus,
    pub stats: Stats,
    /// Why there is no profile, when there is none.
    pub note: Option<String>,
}

/// The shell-style exit code of a finished child: its code, or 128 + the signal.
pub fn exit_code(status: &ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(1)
}

/// Starts `cfg.command` and profiles it until it exits. Its stdin, stdout and stderr are
/// ours, untouched. SIGTERM, SIGHUP, SIGUSR1 and SIGUSR2 sent to us are forwarded to it;
/// SIGINT and SIGQUIT (which a terminal sends to the whole foreground group, so the program
/// gets them anyway) do not stop us: we report when the program has exited.
pub fn run(cfg: &RunConfig, progress: &mut dyn FnMut(&Stats)) -> Result<RunOutcome> {
    let (prog, args) = cfg.command.split_first().ok_or_else(|| Error::Io {
        context: "run".into(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidInput, "no command given"),
    })?;
    catch(&[
        Signal::SIGINT,
        Signal::SIGQUIT,
        Signal::SIGTERM,
        Signal::SIGHUP,
        Signal::SIGUSR1,
        Signal::SIGUSR2,
    ]);
    let mut child = Command::new(prog)
        .args(args)
        .spawn()
        .map_err(|e| Error::Io {
            context: format!("starting {prog}"),
            source: e,
        })?;
    let pid = child.id() as i32;
    let forward = |child_pid: i32| {
        for s in take_pending() {
            if matches!(s, Signal::SIGINT | Signal::SIGQUIT) {
                continue;
            }
            let _ = signal::kill(nix::unistd::Pid::from_raw(child_pid), s);
        }
    };

    // The command may be a shell or a launcher that execs Python, or (following children)
    // a script that starts Python processes: the tree finds every interpreter as it comes
    // up, and again after an exec.
    let mut tree = ProcessTree::new(
        pid,
        cfg.follow_children,
        cfg.sampler.clone(),
        LocateOptions::default(),
    );
    let mut exited = None;
    let result = tree.run(
        &mut || {
            forward(pid);
            match try_wait_exit(&child) {
                Ok(Some(s)) => {
                    exited = Some(s);
                    true
                }
                _ => false,
            }
        },
        progress,
    );
    let status = match exited {
        Some(s) => s,
        None => wait_forwarding(&mut child, &forward)?,
    };
    result?;
    if tree.profiled() == 0 {
        let note = match tree.notes.values().next() {
            Some(why) => format!("not profiled: {why}"),
            None if cfg.follow_children => {
                "no Python interpreter was found in the program's processes".into()
            }
            None => "no Python interpreter was found in the program's process".into(),
        };
        return Ok(RunOutcome {
            profile: None,
            status,
            stats: tree.stats.clone(),
            note: Some(note),
        });
    }
    let stats = tree.stats.clone();
    let profile = tree.finish(cfg.command.join(" "));
    Ok(RunOutcome {
        profile: Some(profile),
        status,
        stats,
        note: None,
    })
}

/// The program's exit status if it has ended, without blocking. Not `Child::try_wait`: we
/// also trace the program's threads while sampling, and a tracer's wait reports their
/// ptrace stops too (a signal arriving during a pause, say); std would take such a stop for
/// the end of the program. Only an exit or a death by signal counts here.
fn try_wait_exit(child: &std::process::Child) -> std::io::Result<Option<ExitStatus>> {
    use std::os::unix::process::ExitStatusExt;
    let pid = child.id() as libc::pid_t;
    loop {
        let mut status: libc::c_int = 0;
        // SAFETY: waitpid writes one int through a valid pointer.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == 0 {
            return Ok(None);
        }
        if r < 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return Err(e);
        }
        if libc::WIFEXITED(status) || libc::WIFSIGNALED(status) {
            return Ok(Some(ExitStatus::from_raw(status)));
        }
        // A stop or continue report: not the end; look again for a pending exit.
    }
}

fn wait_forwarding(child: &mut std::process::Child, forward: &dyn Fn(i32)) -> Result<ExitStatus> {
    let pid = child.id() as i32;
    loop {
        forward(pid);
        match try_wait_exit(child) {
            Ok(Some(s)) => return Ok(s),
            Ok(None) => {
                crate::ptrace::pause::reap_traced_zombies(pid);
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => {
                return Err(Error::Io {
                    context: "waiting for the program".into(),
                    source: e,
                })
            }
        }
    }
}

/// What `attach` records.
#[derive(Debug, Clone)]
pub struct AttachConfig {
    pub pid: i32,
    pub duration: Option<Duration>,
    pub sampler: SamplerConfig,
    pub locate: LocateOptions,
    /// Profile the process's descendants too (`--subprocesses`).
    pub follow_children: bool,
}

/// Profiles a running process until Ctrl-C (SIGINT), SIGTERM, the duration, or its exit.
/// The target is never stopped longer than one sample's read and is left as it was.
pub fn attach(cfg: &AttachConfig, progress: &mut dyn FnMut(&Stats)) -> Result<(Profile, Stats)> {
    if cfg.pid <= 0 {
        return Err(Error::NoSuchProcess(cfg.pid));
    }
    let proc = PythonProcess::locate(cfg.pid, &cfg.locate)?;
    if proc.interp_head()? == 0 {
        return Err(Error::BadState {
            pid: cfg.pid,
            why: "the interpreter is not initialized (starting up or shutting down)".into(),
        });
    }
    let program = command_line(cfg.pid);
    catch(&[Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP]);
    let start = Instant::now();
    let mut tree = ProcessTree::new(
        cfg.pid,
        cfg.follow_children,
        cfg.sampler.clone(),
        cfg.locate.clone(),
    )
    .with_located(proc);
    let duration = cfg.duration;
    tree.run(
        &mut || !take_pending().is_empty() || duration.is_some_and(|d| start.elapsed() >= d),
        progress,
    )?;
    let stats = tree.stats.clone();
    Ok((tree.finish(program), stats))
}
