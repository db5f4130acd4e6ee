//! Sessions:
//! - `run`: start a program and profile it to its end.
//! - `attach`: profile a running process for a while (`attach.rs`).
//! - `top`: either, watched live (`top.rs`, `live.rs`).
//! - `agent`: every Python process of the host, continuously (`agent/`).
//! - `dump`: read a running process's stacks once, or a process tree's (`dump.rs`), or a
//!   dead process's from its core file (`postmortem.rs`).
//!
//! Owns:
//! - starting the command with its stdio untouched (under `top`, sent to a file);
//! - waiting for its Python interpreter to come up;
//! - forwarding termination signals to it;
//! - passing its exit status back;
//! - what `run` and `attach` record alike ([`Recording`]: the process tree, its memory, the
//!   GPU, a live view, `--push`, ticked together).
//!
//! Must not: render reports (the caller does) or change anything in the target.

mod agent;
mod attach;
mod dump;
mod gpu;
mod live;
mod postmortem;
mod push;
mod signals;
mod top;

pub use agent::{agent, AgentConfig, AgentOutcome, Selection};
pub use attach::{attach, AttachConfig};
pub use dump::{dump, dump_tree, DumpConfig};
pub use live::LiveLink;
pub use postmortem::{dump_core, CoreDump, CoreDumpConfig};
use signals::{catch, take_pending};
pub use top::{top, TopConfig, TopOutcome, TopTarget};

use crate::error::{Error, Result};
use crate::gpu::GpuConfig;
use crate::memory::aggregate::{MemoryAggregator, RingTotals};
use crate::memory::consumer::{MemoryConfig, MemorySetup};
use crate::memory::fleet::Fleet;
use crate::memory::ring;
use crate::profile::Profile;
use crate::python::{LocateOptions, PythonProcess};
use crate::sampler::tree::ProcessTree;
use crate::sampler::{SamplerConfig, Stats, Ticker};
use gpu::{merge_gpu, GpuRecording};
use nix::sys::signal::{self, Signal};
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

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
    /// GPU watching through NVML; None with `--no-gpu`.
    pub gpu: Option<GpuConfig>,
    /// A live view watches (`top`). Pictures go to it, it says when to stop, and it owns
    /// the signals (none are caught here).
    pub live: Option<LiveLink>,
    /// The command's stdout and stderr go to this file instead of ours, its stdin is
    /// /dev/null (`top` draws on the terminal and reads its keys).
    pub stdio_to: Option<std::path::PathBuf>,
    /// `--push`: windows sent to a backend as they close.
    pub push: Option<crate::export::PushConfig>,
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
/// ours, untouched. SIGTERM, SIGHUP, SIGUSR1 and SIGUSR2 sent to us are forwarded to it.
/// SIGINT and SIGQUIT (which a terminal sends to the whole foreground group, so the program
/// gets them anyway) do not stop us, and we report when the program has exited. A signal
/// ignored when we were started stays ignored, for us and for the program. The program gets
/// our signal mask, so its signal state is the one it would have without us.
pub fn run(cfg: &RunConfig, progress: &mut dyn FnMut(&Stats)) -> Result<RunOutcome> {
    let all = [
        Signal::SIGINT,
        Signal::SIGQUIT,
        Signal::SIGTERM,
        Signal::SIGHUP,
        Signal::SIGUSR1,
        Signal::SIGUSR2,
    ];
    if cfg.live.is_none() {
        catch(&all, &all);
    }
    let (mut child, memory) = start(cfg)?;
    if let Some(link) = &cfg.live {
        link.child
            .store(child.id() as i32, std::sync::atomic::Ordering::SeqCst);
    }
    let unprofiled = |status, note: &str| RunOutcome {
        profile: None,
        status,
        stats: Stats::default(),
        note: Some(note.to_string()),
    };
    let proc = match await_interpreter(cfg, &mut child, memory.as_ref())? {
        Awaited::Ready(proc) => proc,
        Awaited::Exited(status) => {
            return Ok(unprofiled(
                status,
                "no Python interpreter was found in the program's process",
            ))
        }
        Awaited::Unprofilable(e) => {
            // Cannot profile it, so let it run to its end unprofiled, and say why.
            if let Some(m) = &memory {
                m.ring.set_handshake(false);
            }
            let status = wait_forwarding(&mut child)?;
            return Ok(unprofiled(status, &format!("not profiled: {e}")));
        }
    };
    record(cfg, child, memory, proc.map(|p| *p), progress)
}

/// Starts the program, with the memory ring and the preload library named in its
/// environment unless `--cpu-only`.
fn start(cfg: &RunConfig) -> Result<(Child, Option<MemorySetup>)> {
    let (prog, args) = cfg.command.split_first().ok_or_else(|| {
        Error::io(
            "run",
            std::io::Error::new(std::io::ErrorKind::InvalidInput, "no command given"),
        )
    })?;
    // Memory: a private ring and the library, named to the program through its environment.
    let memory = cfg
        .memory
        .as_ref()
        .map(MemorySetup::new)
        .transpose()
        .map_err(|e| Error::io("creating the memory ring", e))?;
    let mut command = Command::new(prog);
    command.args(args);
    // The program gets the signal mask we were given, set in the child explicitly (the
    // standard library does not promise it). The closure also makes the standard library
    // fork and exec instead of calling glibc's posix_spawn, which left signal 33 (glibc's
    // SIGSETXID) ignored in the program. Signals ignored stay ignored by themselves (see
    // `catch`).
    // SAFETY: `sigset_t` is plain data; all zeroes is the empty set (kept if the call fails).
    let mut mask: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: with a null new set, pthread_sigmask only writes this thread's mask into
    // `mask`, which is valid for writes.
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, std::ptr::null(), &mut mask) };
    // SAFETY: the closure runs in the child between fork and exec and calls only
    // pthread_sigmask, which is async-signal-safe; it allocates nothing and takes no lock.
    unsafe {
        use std::os::unix::process::CommandExt;
        command.pre_exec(move || {
            libc::pthread_sigmask(libc::SIG_SETMASK, &mask, std::ptr::null_mut());
            Ok(())
        });
    }
    if let Some(path) = &cfg.stdio_to {
        let out = std::fs::File::create(path)
            .map_err(|e| Error::io(format!("creating {}", path.display()), e))?;
        let err = out
            .try_clone()
            .map_err(|e| Error::io(format!("opening {}", path.display()), e))?;
        command
            .stdin(std::process::Stdio::null())
            .stdout(out)
            .stderr(err);
    }
    if let Some(m) = &memory {
        // Following children, each Python process of the program other than the one that
        // claims this ring makes its own beside it.
        m.ring
            .set_child_rings(cfg.follow_children.then_some(ring::CHILD_CAPACITY));
        command.envs(m.env());
    }
    let child = command
        .spawn()
        .map_err(|e| Error::io(format!("starting {prog}"), e))?;
    Ok((child, memory))
}

/// Signals we caught, passed on to the program (not SIGINT and SIGQUIT; see [`run`]).
fn forward_signals(child_pid: i32) {
    for s in take_pending() {
        if matches!(s, Signal::SIGINT | Signal::SIGQUIT) {
            continue;
        }
        let _ = signal::kill(nix::unistd::Pid::from_raw(child_pid), s);
    }
}

/// How the wait for the command's own interpreter ended.
enum Awaited {
    /// Its interpreter is up (None: it is no Python, and the process tree looks for the
    /// Pythons it starts).
    Ready(Option<Box<PythonProcess>>),
    /// The program ended first.
    Exited(ExitStatus),
    /// It is a Python we cannot profile (an unsupported version, no permission).
    Unprofilable(Error),
}

/// Waits for the command's own interpreter. The command may be a launcher that execs Python.
/// Locating (parsing ELF files) happens once per executable. Until the interpreter is
/// initialized only one pointer is polled, so sampling starts as soon as Python runs.
/// Following children, a command that stays something else (a shell script) is not waited
/// for. The process tree finds the Pythons it starts.
fn await_interpreter(
    cfg: &RunConfig,
    child: &mut Child,
    memory: Option<&MemorySetup>,
) -> Result<Awaited> {
    let pid = child.id() as i32;
    let mut not_python_since: Option<(String, Instant)> = None;
    let mut found: Option<(PythonProcess, String)> = None;
    loop {
        forward_signals(pid);
        // The ring was claimed by a Python process that is not the one we follow (the
        // command forked it, e.g. `sh -c 'python app.py; true'`, and we do not follow
        // children). We will never read its stacks, so it must not wait for us.
        if let Some(m) = memory.filter(|_| !cfg.follow_children) {
            let producer = m.ring.producer_pid();
            if producer != 0 && producer != pid {
                m.ring.set_handshake(false);
            }
        }
        if let Some(s) =
            try_wait_exit(child).map_err(|e| Error::io("waiting for the program", e))?
        {
            return Ok(Awaited::Exited(s));
        }
        let exe = crate::proc::exe_path(pid).unwrap_or_default();
        // A new executable (the launcher exec'd Python, or Python exec'd something else).
        if found.as_ref().is_some_and(|(_, e)| *e != exe) {
            found = None;
        }
        if found.is_none() {
            match PythonProcess::locate(pid, &LocateOptions::default()) {
                Ok(p) => found = Some((p, exe)),
                Err(e @ (Error::UnsupportedVersion { .. } | Error::PermissionDenied { .. })) => {
                    return Ok(Awaited::Unprofilable(e));
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
                    let ours = crate::proc::exe_path(std::process::id() as i32).unwrap_or_default();
                    if exe != ours && since.elapsed() >= NOT_PYTHON_GRACE {
                        return Ok(Awaited::Ready(None));
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
            return Ok(Awaited::Ready(found.take().map(|(p, _)| Box::new(p))));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Records the program from its first interpreter (`proc`, when the command is one) to its
/// end:
/// - the process tree sampled on its schedule;
/// - each process's memory read from its ring;
/// - then the profile with its memory merged in.
fn record(
    cfg: &RunConfig,
    mut child: Child,
    memory: Option<MemorySetup>,
    proc: Option<PythonProcess>,
    progress: &mut dyn FnMut(&Stats),
) -> Result<RunOutcome> {
    let pid = child.id() as i32;
    let cwd = crate::proc::cwd(pid);
    // The library file stays until the program ends (programs it starts load it too).
    // Each process's allocations are tied to lines by a consumer of its own ring, started
    // when the process tree finds the process and its ring. Without the command's own
    // process (a script that starts Python) and without following children, nobody reads
    // stacks, so its allocations must not wait for us.
    let (fleet, _library) = match (memory, &cfg.memory) {
        (Some(m), Some(mc)) => {
            if proc.is_none() && !cfg.follow_children {
                m.ring.set_handshake(false);
            }
            let fleet = Fleet::for_run(m.ring, mc.clone(), m.library.path());
            (Some(fleet), Some(m.library))
        }
        _ => (None, None),
    };
    // Every Python process of the program (following children), found as it comes up and
    // again after an exec.
    let mut tree = ProcessTree::new(
        pid,
        cfg.follow_children,
        cfg.sampler.clone(),
        LocateOptions::default(),
    );
    if let Some(p) = proc {
        tree = tree.with_located(p);
    }
    // `--native`: allocations get their native frames too, with the samplers' images.
    let mut fleet = fleet.map(|f| f.with_native(tree.native_cache()));
    let mut exited = None;
    let rate = cfg.sampler.rate_hz;
    let mut gpu = cfg.gpu.as_ref().map(GpuRecording::start);
    let courteous = cfg.sampler.courteous(fleet.is_some());
    let mut publisher = cfg
        .live
        .clone()
        .map(|l| live::Publisher::new(l, cfg.command.join(" "), pid, rate));
    let quiet = cfg.live.is_some();
    let mut pusher = cfg
        .push
        .as_ref()
        .map(|p| push::Pusher::new(p, cfg.command.join(" "), pid, quiet));
    let result = crate::sampler::drive(
        &mut Recording {
            tree: &mut tree,
            fleet: fleet.as_mut(),
            gpu: gpu.as_mut(),
            clock: None,
            live: publisher.as_mut(),
            push: pusher.as_mut(),
        },
        rate,
        &mut || {
            if cfg.live.as_ref().is_some_and(LiveLink::stopping) {
                return true;
            }
            forward_signals(pid);
            match try_wait_exit(&child) {
                Ok(Some(s)) => {
                    exited = Some(s);
                    true
                }
                _ => false,
            }
        },
        progress,
        Some(pid),
        courteous,
        cfg.sampler.pauses_every_tick(),
    );
    let status = match exited {
        Some(s) => s,
        None => wait_forwarding(&mut child)?,
    };
    // Processes whose memory could not be recorded, said once each with the reason.
    let memory_notes: Vec<String> = fleet.as_ref().map_or_else(Vec::new, |f| {
        f.first_note_per_process()
            .into_iter()
            .map(|(pid, why)| format!("process {pid}: {why}"))
            .collect()
    });
    let gpu = gpu.map(|g| g.finish(&mut tree));
    let memory = finish_memory(&mut tree, fleet);
    result?;
    tree.stats.notes.extend(memory_notes);
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
        merge_memory(&mut profile, agg, totals, pid, cwd.as_deref());
    }
    if let Some(g) = gpu {
        merge_gpu(&mut profile, g, pid, cwd.as_deref());
    }
    let mut stats = stats;
    if let (Some(p), Some(pc)) = (pusher, &cfg.push) {
        stats
            .notes
            .push(push::summary(&pc.url, &p.finish(&profile)));
    }
    if let Some(p) = &mut publisher {
        p.finish(profile.clone(), &stats, Some(exit_code(&status)));
    }
    Ok(RunOutcome {
        profile: Some(profile),
        status,
        stats,
        note: None,
    })
}

/// The process tree, sampled on its schedule, and the memory consumers of its processes.
/// After each scan, a process the tree found gets its ring read once it has one, and the
/// ring of a process that ended (or exec'd) is read to its end.
struct Recording<'a> {
    tree: &'a mut ProcessTree,
    fleet: Option<&'a mut Fleet>,
    gpu: Option<&'a mut GpuRecording>,
    /// `attach`: when `--duration` counts from, told what each tick found.
    clock: Option<&'a attach::Clock>,
    /// A live view's pictures, taken between ticks.
    live: Option<&'a mut live::Publisher>,
    /// `--push`: windows cut between ticks.
    push: Option<&'a mut push::Pusher>,
}

impl Ticker for Recording<'_> {
    fn tick(&mut self) -> Result<bool> {
        let more = self.tree.tick()?;
        if let Some(g) = self.gpu.as_deref_mut() {
            g.tick(self.tree);
        }
        if let Some(fleet) = self.fleet.as_deref_mut() {
            sync_memory(self.tree, fleet);
            for line in fleet.take_announcements() {
                // A live view has the terminal, so the line goes to its header.
                match self.live.as_deref_mut() {
                    Some(p) => p.say(line),
                    None => eprintln!("scalene-rs: {line}"),
                }
            }
        }
        if let Some(c) = self.clock {
            c.observe(self.tree, self.fleet.as_deref());
        }
        if let Some(p) = self.live.as_deref_mut() {
            let gpu = self.gpu.as_deref().and_then(|g| g.now);
            p.tick(self.tree, self.fleet.as_deref(), gpu);
        }
        if let Some(p) = self.push.as_deref_mut() {
            p.tick(self.tree, self.fleet.as_deref());
        }
        Ok(more)
    }
    fn stats_mut(&mut self) -> &mut Stats {
        &mut self.tree.stats
    }
}

/// Tells `fleet` what `tree` found (new images to read the rings of; images that are over)
/// and `tree` what the fleet found (each process's ring, each finished image's figures).
fn sync_memory(tree: &mut ProcessTree, fleet: &mut Fleet) {
    let retired = tree.take_retired();
    if !tree.take_scanned() && retired.is_empty() {
        return;
    }
    for (_, serial) in retired {
        if let Some(f) = fleet.retire(serial) {
            tree.set_process_memory(serial, f.peak_mb, f.alloc_mb);
        }
    }
    let refused: Vec<i32> = tree
        .notes
        .keys()
        .copied()
        .filter(|&pid| !tree.sampling().any(|(p, _, _)| p == pid))
        .collect();
    for pid in refused {
        fleet.refuse(pid);
    }
    let pending: Vec<(i32, u64)> = tree
        .sampling()
        .filter(|&(_, serial, _)| !fleet.settled(serial))
        .map(|(pid, serial, _)| (pid, serial))
        .collect();
    for (pid, serial) in pending {
        let found = tree
            .sampling()
            .find(|&(_, s, _)| s == serial)
            .and_then(|(_, _, proc)| fleet.adopt(pid, serial, proc));
        if let Some(path) = found {
            tree.set_handshake_file(pid, path);
        }
    }
}

/// Puts the program's memory into `profile` (sources read as the root process `pid` sees
/// them). A process whose ring was never read (it allocated less than a window) allocated
/// nothing we saw.
fn merge_memory(
    profile: &mut Profile,
    agg: MemoryAggregator,
    totals: RingTotals,
    pid: i32,
    cwd: Option<&str>,
) {
    agg.merge_into(profile, totals, &mut |file| {
        crate::sampler::read_source(pid, &crate::sampler::absolute(file, cwd))
    });
    for p in &mut profile.processes {
        p.mem_peak_mb.get_or_insert(0.0);
        p.mem_alloc_mb.get_or_insert(0.0);
    }
}

/// Ends the recording's memory side: every image is over, every ring read to its end, the
/// processes' results merged.
fn finish_memory(
    tree: &mut ProcessTree,
    fleet: Option<Fleet>,
) -> Option<(MemoryAggregator, RingTotals)> {
    let mut fleet = fleet?;
    tree.retire_all();
    for (_, serial) in tree.take_retired() {
        if let Some(f) = fleet.retire(serial) {
            tree.set_process_memory(serial, f.peak_mb, f.alloc_mb);
        }
    }
    fleet.finish()
}

/// The program's exit status if it has ended, without blocking. Not `Child::try_wait`,
/// because we also trace the program's threads while sampling, and a tracer's wait reports
/// their ptrace stops too (a signal arriving during a pause, say). std would take such a
/// stop for the end of the program. Only an exit or a death by signal counts here.
fn try_wait_exit(child: &std::process::Child) -> std::io::Result<Option<ExitStatus>> {
    use std::os::unix::process::ExitStatusExt;
    let pid = child.id() as libc::pid_t;
    loop {
        let mut status: libc::c_int = 0;
        // In the profiler's turn: a stop report of the program's main thread, paused by
        // another of our threads (the memory reader's, under `--native`), is that pause's.
        // SAFETY: waitpid writes one int through a valid pointer.
        let r = crate::ptrace::pause::with_turn(|| unsafe {
            libc::waitpid(pid, &mut status, libc::WNOHANG)
        });
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
        // A stop or continue report is not the end, so look again for a pending exit.
    }
}

fn wait_forwarding(child: &mut Child) -> Result<ExitStatus> {
    let pid = child.id() as i32;
    loop {
        forward_signals(pid);
        match try_wait_exit(child) {
            Ok(Some(s)) => return Ok(s),
            Ok(None) => {
                crate::ptrace::pause::reap_traced_zombies(pid);
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => return Err(Error::io("waiting for the program", e)),
        }
    }
}
