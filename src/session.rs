//! Recording sessions: `run` (start a program and profile it to its end) and `attach`
//! (profile a running process for a while).
//!
//! Owns: starting the command with its stdio untouched, waiting for its Python interpreter to
//! come up, forwarding termination signals to it, passing its exit status back, and stopping
//! an attach on Ctrl-C, a duration, or the target's exit.
//! Must not: render reports (the caller does) or change anything in the target.

use crate::error::{Error, Result};
use crate::memory::consumer::{MemoryConfig, MemoryRecorder, MemorySetup};
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

/// How long the command's own process may look like something other than Python (a
/// Python just exec'd has not mapped libpython yet) before, following children, we stop
/// waiting for it and let the process tree find the Pythons it starts.
const NOT_PYTHON_GRACE: Duration = Duration::from_millis(100);

/// What `run` records.
#[derive(Debug, Clone)]
pub struct RunConfig {
    /// The command and its arguments.
    pub command: Vec<String>,
    pub sampler: SamplerConfig,
    /// Profile the program's child processes too (every descendant that runs Python).
    pub follow_children: bool,
    /// Memory and copy accounting (the preload library); None with `--cpu-only`.
    pub memory: Option<MemoryConfig>,
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
    // Memory: a private ring and the library, named to the program through its environment.
    let memory = cfg
        .memory
        .as_ref()
        .map(MemorySetup::new)
        .transpose()
        .map_err(|e| Error::Io {
            context: "creating the memory ring".into(),
            source: e,
        })?;
    let mut command = Command::new(prog);
    command.args(args);
    if let Some(m) = &memory {
        command.envs(m.env());
    }
    let mut child = command.spawn().map_err(|e| Error::Io {
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

    // Wait for the command's own interpreter: it may be a launcher that execs Python.
    // Locating (parsing ELF files) happens once per executable; until the interpreter is
    // initialized we only poll one pointer, so sampling starts as soon as Python runs.
    // Following children, a command that stays something else (a shell script) is not
    // waited for: the process tree finds the Pythons it starts.
    let mut status = None;
    let mut not_python_since: Option<(String, Instant)> = None;
    let mut found: Option<(PythonProcess, String)> = None;
    let mut proc = None;
    while status.is_none() && proc.is_none() {
        forward(pid);
        // The ring was claimed by a Python process that is not the one we follow (the
        // command forked it, e.g. `sh -c 'python app.py; true'`): we will never read its
        // stacks, so it must not wait for us.
        if let Some(m) = &memory {
            let producer = m.ring.producer_pid();
            if producer != 0 && producer != pid {
                m.ring.set_handshake(false);
            }
        }
        if let Some(s) = try_wait_exit(&child).map_err(|e| Error::Io {
            context: "waiting for the program".into(),
            source: e,
        })? {
            status = Some(s);
            break;
        }
        let exe = std::fs::read_link(format!("/proc/{pid}/exe"))
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_default();
        // A new executable (the launcher exec'd Python, or Python exec'd something else).
        if found.as_ref().is_some_and(|(_, e)| *e != exe) {
            found = None;
        }
        if found.is_none() {
            match PythonProcess::locate(pid, &LocateOptions::default()) {
                Ok(p) => found = Some((p, exe)),
                Err(e @ (Error::UnsupportedVersion { .. } | Error::PermissionDenied { .. })) => {
                    // Cannot profile it: let it run to its end unprofiled, and say why.
                    if let Some(m) = &memory {
                        m.ring.set_handshake(false);
                    }
                    let status = wait_forwarding(&mut child, &forward)?;
                    return Ok(RunOutcome {
                        profile: None,
                        status,
                        stats: Stats::default(),
                        note: Some(format!("not profiled: {e}")),
                    });
                }
                Err(Error::NotPython { .. }) if cfg.follow_children => {
                    // Give a just-exec'd Python time to map libpython; then leave it to
                    // the tree.
                    let since = match &not_python_since {
                        Some((e, t)) if *e == exe => *t,
                        _ => {
                            not_python_since = Some((exe.clone(), Instant::now()));
                            Instant::now()
                        }
                    };
                    let ours = std::fs::read_link("/proc/self/exe")
                        .map(|p| p.to_string_lossy().into_owned())
                        .unwrap_or_default();
                    if exe != ours && since.elapsed() >= NOT_PYTHON_GRACE {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(5));
                    continue;
                }
                Err(_) => {
                    std::thread::sleep(Duration::from_millis(5));
                    continue;
                }
            }
        }
        let ready = found
            .as_ref()
            .is_some_and(|(p, _)| matches!(p.interp_head(), Ok(h) if h != 0));
        if ready {
            proc = found.take().map(|(p, _)| p);
        } else {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    if let Some(s) = status {
        // The program ended before its interpreter came up.
        return Ok(RunOutcome {
            profile: None,
            status: s,
            stats: Stats::default(),
            note: Some("no Python interpreter was found in the program's process".into()),
        });
    }

    let cwd = std::fs::read_link(format!("/proc/{pid}/cwd"))
        .ok()
        .map(|p| p.to_string_lossy().into_owned());
    // The library file stays until the program ends (programs it starts load it too).
    // Lines are tied to allocations of the command's own process; without it (a script
    // that starts Python), nobody reads stacks, so its allocations must not wait for us.
    let ring_path = memory.as_ref().map(|m| m.ring.path().to_path_buf());
    let (recorder, _library) = match (memory, &cfg.memory) {
        (Some(m), Some(mc)) => {
            let reader = proc.as_ref().and_then(|p| p.reopen().ok());
            if reader.is_none() {
                m.ring.set_handshake(false);
            }
            (
                Some(MemoryRecorder::start(m.ring, reader, mc.clone())),
                Some(m.library),
            )
        }
        _ => (None, None),
    };
    // Every Python process of the program (following children), found as it comes up and
    // again after an exec.
    let mut sampler_cfg = cfg.sampler.clone();
    sampler_cfg.handshake_file = ring_path;
    let mut tree = ProcessTree::new(
        pid,
        cfg.follow_children,
        sampler_cfg,
        LocateOptions::default(),
    );
    if let Some(p) = proc {
        tree = tree.with_located(p);
    }
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
    let memory = recorder.map(MemoryRecorder::finish);
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
    let mut profile = tree.finish(cfg.command.join(" "));
    if let Some((agg, totals)) = memory {
        agg.merge_into(&mut profile, totals, &mut |file| {
            crate::sampler::read_source(pid, &crate::sampler::absolute(file, cwd.as_deref()))
        });
    }
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
    /// Read the memory ring when the process has one (started under `run`, whose
    /// profiler is gone); None: do not.
    pub memory: Option<MemoryConfig>,
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
    let mut notes = Vec::new();
    let mut ring_path = None;
    let recorder = match &cfg.memory {
        Some(mc) => match crate::memory::consumer::find_ring(cfg.pid) {
            Ok(ring) => {
                ring_path = Some(ring.path().to_path_buf());
                Some(MemoryRecorder::start(ring, proc.reopen().ok(), mc.clone()))
            }
            Err(why) => {
                notes.push(format!("no memory data: {why}"));
                None
            }
        },
        None => None,
    };
    let cwd = std::fs::read_link(format!("/proc/{}/cwd", cfg.pid))
        .ok()
        .map(|p| p.to_string_lossy().into_owned());
    let start = Instant::now();
    let mut sampler_cfg = cfg.sampler.clone();
    sampler_cfg.handshake_file = ring_path;
    let mut tree = ProcessTree::new(
        cfg.pid,
        cfg.follow_children,
        sampler_cfg,
        cfg.locate.clone(),
    )
    .with_located(proc);
    let duration = cfg.duration;
    let result = tree.run(
        &mut || !take_pending().is_empty() || duration.is_some_and(|d| start.elapsed() >= d),
        progress,
    );
    let memory = recorder.map(MemoryRecorder::finish);
    result?;
    let mut stats = tree.stats.clone();
    let mut profile = tree.finish(program);
    if let Some((agg, totals)) = memory {
        let pid = cfg.pid;
        agg.merge_into(&mut profile, totals, &mut |file| {
            crate::sampler::read_source(pid, &crate::sampler::absolute(file, cwd.as_deref()))
        });
    }
    stats.notes = notes;
    Ok((profile, stats))
}
