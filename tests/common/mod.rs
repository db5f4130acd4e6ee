//! Shared test support: finding every CPython interpreter on the machine.
//!
//! The matrix is discovered at run time: every `$(pyenv root)/versions/*/bin/pythonX.Y`, every
//! `/usr/bin/pythonX.Y`, and every interpreter `tools/pythons.sh` made (its manifest,
//! `$SCALENE_RS_CACHE/interpreters.txt`: Debian's own 3.13–3.15 run chrooted in a Debian
//! unstable root, shared-libpython 3.14/3.15, free-threaded builds). It must never silently
//! shrink: an empty matrix fails, and `SCALENE_RS_MIN_PYTHONS=N` (written by
//! `tools/setup.sh`) fails the run when fewer than N are found.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

pub mod cores;
pub mod spinext;
pub mod users;

/// One interpreter of the test matrix.
#[derive(Debug, Clone)]
pub struct Interpreter {
    /// Short label for messages, e.g. "pyenv-3.12.1" or "system-3.11".
    pub label: String,
    pub path: PathBuf,
    pub major: u32,
    pub minor: u32,
    /// Built with `--disable-gil` (`python3.13t`).
    pub free_threaded: bool,
    /// The directory it runs chrooted in (`path` is then a wrapper that enters it): the
    /// interpreter's own files are visible only through /proc/PID/root, like a container's.
    pub root: Option<PathBuf>,
}

impl Interpreter {
    pub fn version(&self) -> (u32, u32) {
        (self.major, self.minor)
    }
    pub fn is_py2(&self) -> bool {
        self.major == 2
    }

    /// Built with the tail-call interpreter (3.14+, clang, `--with-tail-call-interp`): a
    /// handler's native frame (`_TAIL_CALL_*`) sits above each call of the evaluation loop.
    /// Asks the interpreter (`Py_TAIL_CALL_INTERP` in its build configuration).
    pub fn tail_call(&self) -> Result<bool, String> {
        let out = std::process::Command::new(&self.path)
            .args([
                "-c",
                "import sysconfig; print(sysconfig.get_config_var('Py_TAIL_CALL_INTERP') or 0)",
            ])
            .output()
            .map_err(|e| format!("cannot run {}: {e}", self.path.display()))?;
        match String::from_utf8_lossy(&out.stdout).trim() {
            "0" if out.status.success() => Ok(false),
            "1" if out.status.success() => Ok(true),
            other => Err(format!(
                "{}: Py_TAIL_CALL_INTERP is {other:?}: {}",
                self.label,
                String::from_utf8_lossy(&out.stderr)
            )),
        }
    }
}

/// Where `tools/pythons.sh` keeps what it makes.
pub fn cache_dir() -> PathBuf {
    match std::env::var_os("SCALENE_RS_CACHE") {
        Some(d) => PathBuf::from(d),
        None => Path::new(&std::env::var("HOME").unwrap_or_else(|_| "/root".into()))
            .join(".cache/scalene-rs"),
    }
}

/// "…python3.14-shared" → (3, 14, false), "python3.13t" → (3, 13, true).
fn version_in_name(name: &str) -> Option<(u32, u32, bool)> {
    let rest = &name[name.rfind("python")? + "python".len()..];
    let (maj, rest) = rest.split_once('.')?;
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    let free_threaded = rest[digits.len()..].starts_with('t');
    Some((maj.parse().ok()?, digits.parse().ok()?, free_threaded))
}

/// The interpreters listed in `tools/pythons.sh`'s manifest ("label<TAB>path<TAB>root").
fn made_interpreters() -> Vec<Interpreter> {
    let Ok(text) = std::fs::read_to_string(cache_dir().join("interpreters.txt")) else {
        return Vec::new();
    };
    text.lines()
        .filter_map(|line| {
            let mut cols = line.split('\t');
            let (label, path) = (cols.next()?, PathBuf::from(cols.next()?));
            let root = cols.next().filter(|r| *r != "/").map(PathBuf::from);
            let name = path.file_name()?.to_string_lossy().into_owned();
            let (major, minor, free_threaded) = version_in_name(&name)?;
            path.is_file().then(|| Interpreter {
                label: label.to_string(),
                path,
                major,
                minor,
                free_threaded,
                root,
            })
        })
        .collect()
}

fn pyenv_root() -> Option<PathBuf> {
    if let Ok(root) = std::env::var("PYENV_ROOT") {
        return Some(PathBuf::from(root));
    }
    if let Ok(out) = Command::new("pyenv").arg("root").output() {
        if out.status.success() {
            let s = String::from_utf8_lossy(&out.stdout).trim().to_string();
            if !s.is_empty() {
                return Some(PathBuf::from(s));
            }
        }
    }
    let home = std::env::var("HOME").ok()?;
    let p = Path::new(&home).join(".pyenv");
    p.is_dir().then_some(p)
}

/// Parses "pythonX.Y" (optionally with an ABI suffix like "m") into (X, Y).
fn parse_python_name(name: &str) -> Option<(u32, u32)> {
    let rest = name.strip_prefix("python")?;
    let rest = rest.trim_end_matches(['m', 'd', 'u']);
    let (maj, min) = rest.split_once('.')?;
    Some((maj.parse().ok()?, min.parse().ok()?))
}

/// Every interpreter on this machine, sorted by version then label.
pub fn interpreters() -> Vec<Interpreter> {
    let mut found = Vec::new();
    if let Some(root) = pyenv_root() {
        if let Ok(entries) = std::fs::read_dir(root.join("versions")) {
            for e in entries.flatten() {
                let dir = e.path();
                let vname = e.file_name().to_string_lossy().to_string();
                let mut parts = vname.split('.');
                let (Some(Ok(maj)), Some(Ok(min))) = (
                    parts.next().map(str::parse::<u32>),
                    parts.next().map(str::parse::<u32>),
                ) else {
                    continue;
                };
                let exe = dir.join("bin").join(format!("python{maj}.{min}"));
                if exe.is_file() {
                    found.push(Interpreter {
                        label: format!("pyenv-{vname}"),
                        path: exe,
                        major: maj,
                        minor: min,
                        free_threaded: false,
                        root: None,
                    });
                }
            }
        }
    }
    if let Ok(entries) = std::fs::read_dir("/usr/bin") {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().to_string();
            let Some((maj, min)) = parse_python_name(&name) else {
                continue;
            };
            // Skip "python3.11-config" and friends: only the interpreter itself.
            if name != format!("python{maj}.{min}") {
                continue;
            }
            let path = e.path();
            if std::fs::symlink_metadata(&path)
                .map(|m| m.file_type().is_symlink())
                .unwrap_or(false)
            {
                continue;
            }
            found.push(Interpreter {
                label: format!("system-{maj}.{min}"),
                path,
                major: maj,
                minor: min,
                free_threaded: false,
                root: None,
            });
        }
    }
    found.extend(made_interpreters());
    found.sort_by(|a, b| (a.major, a.minor, &a.label).cmp(&(b.major, b.minor, &b.label)));
    let min: usize = setup_setting("SCALENE_RS_MIN_PYTHONS")
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    assert!(
        found.len() >= min,
        "found {} Python interpreters ({:?}), expected at least {min}: the test matrix must not shrink",
        found.len(),
        found.iter().map(|i| &i.label).collect::<Vec<_>>()
    );
    // For working on one interpreter: SCALENE_RS_ONLY_PYTHONS=debian-3.15,3.13.15t keeps the
    // interpreters whose label contains one of the words (after the count check above).
    if let Ok(only) = std::env::var("SCALENE_RS_ONLY_PYTHONS") {
        let words: Vec<&str> = only.split(',').filter(|w| !w.is_empty()).collect();
        found.retain(|i| words.iter().any(|w| i.label.contains(w)));
        assert!(
            !found.is_empty(),
            "SCALENE_RS_ONLY_PYTHONS={only} matches no interpreter"
        );
    }
    found
}

/// Whether an interpreter is of a kind of [`REPRESENTATIVE_KINDS`].
pub type IsKind = fn(&Interpreter) -> bool;

/// The kinds of interpreter the end-to-end tests run on, one interpreter each
/// ([`representatives`]), and what each stands for.
///
/// Each kind is a way of reading the interpreter that no other kind covers:
/// - 2.7: Python 2's objects, `interp_head`, `co_lnotab` with unsigned deltas.
/// - 3.6: no `_PyRuntime` yet; `co_lnotab` with signed line deltas.
/// - 3.8: `_PyRuntime` and `PyFrameObject` (3.7-3.9 share the reading).
/// - 3.10: the last `PyFrameObject` chain; the 3.10 line table.
/// - 3.11, Debian's static build: interpreter frames through `cframe`, the runtime in the
///   executable (not in libpython).
/// - 3.12: interpreter frames without `cframe`, shared libpython.
/// - 3.13t: free-threaded; layouts from `_Py_DebugOffsets`; no GIL to find.
/// - 3.14, shared libpython: 3.14's frames and tasks read from its debug offsets.
/// - 3.15, chrooted: the newest version, seen from the host as in a container.
///
/// The others (3.7, 3.9, pyenv's 3.11 and 3.13, Debian's 3.13, the static 3.14, the shared
/// 3.15) each repeat a kind above. They keep the reading core's tests (stacks and lines of
/// `dump`, line tables, layouts, the native merge), which run on every interpreter.
pub const REPRESENTATIVE_KINDS: &[(&str, IsKind)] = &[
    ("2.7", |i| i.version() == (2, 7)),
    ("3.6", |i| i.version() == (3, 6)),
    ("3.8", |i| i.version() == (3, 8) && !i.free_threaded),
    ("3.10", |i| i.version() == (3, 10) && !i.free_threaded),
    ("static 3.11", |i| {
        i.version() == (3, 11) && i.label.starts_with("system-")
    }),
    ("3.12", |i| i.version() == (3, 12) && !i.free_threaded),
    ("free-threaded 3.13", |i| {
        i.version() == (3, 13) && i.free_threaded
    }),
    ("shared 3.14", |i| {
        i.version() == (3, 14) && i.label.ends_with("-shared")
    }),
    ("chrooted 3.15", |i| {
        i.version() == (3, 15) && i.root.is_some() && !i.label.ends_with("-shared")
    }),
];

/// The interpreters the end-to-end tests run on: one of each [`REPRESENTATIVE_KINDS`], the
/// first of the matrix of that kind, and every tail-call build (a kind of its own where
/// present). `SCALENE_RS_ONLY_PYTHONS` chooses them by hand instead: all it names are taken.
///
/// A kind with no interpreter fails the run in CI ([`ci_mode`]), as a missing interpreter
/// does: the matrix must not shrink silently. Outside CI it is said and left out.
pub fn representatives() -> Vec<Interpreter> {
    let all = interpreters();
    if std::env::var_os("SCALENE_RS_ONLY_PYTHONS").is_some() {
        return all;
    }
    let mut chosen: Vec<Interpreter> = Vec::new();
    let mut missing = Vec::new();
    for (kind, is) in REPRESENTATIVE_KINDS {
        match all.iter().find(|i| is(i)) {
            Some(i) => chosen.push(i.clone()),
            None => missing.push(*kind),
        }
    }
    chosen.extend(
        all.iter()
            .filter(|i| i.label.starts_with("tailcall-"))
            .cloned(),
    );
    if !missing.is_empty() {
        let why = format!(
            "no interpreter of the kind(s) {missing:?} among {:?}",
            all.iter().map(|i| &i.label).collect::<Vec<_>>()
        );
        assert!(!ci_mode(), "the representative interpreters: {why}");
        say(&format!("representative interpreters: {why}: left out"));
    }
    chosen.sort_by(|a, b| (a.major, a.minor, &a.label).cmp(&(b.major, b.minor, &b.label)));
    chosen
}

/// Runs `check` on each of the [`representatives`], like [`for_each_interpreter`].
pub fn for_each_representative(check: impl Fn(&Interpreter) -> Result<String, String>) {
    let some = representatives();
    each_of(&some.iter().collect::<Vec<_>>(), check)
}

/// [`for_each_interpreter_alone_of`] over the [`representatives`].
pub fn for_each_representative_alone(check: impl Fn(&Interpreter) -> Result<String, String>) {
    let some = representatives();
    for_each_interpreter_alone_of(&some.iter().collect::<Vec<_>>(), check)
}

/// A setting of the test run: the environment variable `name`, else its line in the file
/// tools/setup.sh writes (`~/.cache/scalene-rs/setup.env`, or under `SCALENE_RS_CACHE`):
/// what the setup equipped (the interpreters with numpy) and what it expects (how many
/// interpreters the matrix has at least). None when neither says.
pub fn setup_setting(name: &str) -> Option<String> {
    if let Ok(v) = std::env::var(name) {
        return Some(v);
    }
    let cache = std::env::var_os("SCALENE_RS_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/scalene-rs")))?;
    let text = std::fs::read_to_string(cache.join("setup.env")).ok()?;
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.strip_prefix(name)?.strip_prefix('='))
        .map(|v| v.trim().to_string())
}

/// A setting of the test run that lists interpreters ([`setup_setting`]: labels separated
/// by commas, e.g. those tools/setup.sh installed numpy or gevent for). Empty when unset.
pub fn setup_labels(name: &str) -> Vec<String> {
    setup_setting(name)
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(String::from)
        .collect()
}

/// The repository root (where Cargo.toml is).
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Path of a file under `fixtures/`.
pub fn fixture(name: &str) -> PathBuf {
    repo_root().join("fixtures").join(name)
}

/// Output of one command run with [`run_limited`].
pub struct Run {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    pub timed_out: bool,
}

impl Run {
    /// Exit status, whether it was killed for taking too long, and its stderr.
    pub fn describe(&self) -> String {
        format!(
            "exit {:?}{}, stderr: {:?}",
            self.code,
            if self.timed_out {
                " (timed out, killed)"
            } else {
                ""
            },
            self.stderr.trim_end()
        )
    }
}

/// A fixture started by [`start_fixture`]: its stdout's lines arrive on `lines` as they are
/// printed; its stderr is read whole on a thread of its own.
pub struct Fixture {
    pub child: std::process::Child,
    pub pid: i32,
    /// Its stdin, when asked for (else it reads /dev/null).
    pub stdin: Option<std::process::ChildStdin>,
    pub lines: std::sync::mpsc::Receiver<String>,
    pub stderr: std::thread::JoinHandle<String>,
}

/// Starts `script` with `interp` in a plain environment: no bytecode files written, a UTF-8
/// locale (Python 3.6 decodes a non-ASCII argv — the script's path — as ASCII with
/// surrogate escapes under the C locale), no PYTHONPATH or PYTHONHOME of ours.
pub fn start_fixture<S: AsRef<std::ffi::OsStr>>(
    interp: &Interpreter,
    script: &Path,
    args: &[S],
    with_stdin: bool,
) -> Result<Fixture, String> {
    use std::io::BufRead;
    use std::process::Stdio;
    let mut child = Command::new(&interp.path)
        .arg(script)
        .args(args)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("LC_ALL", "C.UTF-8")
        .env_remove("PYTHONPATH")
        .env_remove("PYTHONHOME")
        .stdin(if with_stdin {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| {
            format!(
                "cannot start {} {}: {e}",
                interp.path.display(),
                script.display()
            )
        })?;
    let pid = child.id() as i32;
    let stdin = child.stdin.take();
    let stdout = child.stdout.take().unwrap();
    let (tx, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let stderr = drain(child.stderr.take().unwrap());
    Ok(Fixture {
        child,
        pid,
        stdin,
        lines,
        stderr,
    })
}

impl Fixture {
    /// The lines it prints before the line `ready`, waited for at most `within`.
    pub fn lines_until_ready(&self, within: std::time::Duration) -> Result<Vec<String>, String> {
        let deadline = std::time::Instant::now() + within;
        let mut lines = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) if l == "ready" => return Ok(lines),
                Ok(l) => lines.push(l),
                Err(_) => return Err(format!("no `ready` in {within:?}; printed {lines:?}")),
            }
        }
    }
}

/// A [`Fixture`] killed and reaped when dropped: a failed check leaves nothing behind.
pub struct Killed(pub Fixture);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.child.kill();
        let _ = self.0.child.wait();
    }
}

/// Reads all of `r` on a thread of its own (a child's pipe, so that it never blocks on a
/// full pipe while we wait for it).
pub fn drain<R: std::io::Read + Send + 'static>(mut r: R) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = r.read_to_end(&mut buf);
        String::from_utf8_lossy(&buf).into_owned()
    })
}

/// Runs `cmd` (stdin empty, stdout and stderr captured) and kills it when it takes longer
/// than `limit`.
pub fn run_limited(mut cmd: Command, limit: std::time::Duration) -> Run {
    use std::process::Stdio;
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
    let out = drain(child.stdout.take().unwrap());
    let err = drain(child.stderr.take().unwrap());
    let deadline = std::time::Instant::now() + limit;
    let mut timed_out = false;
    let status = loop {
        if let Some(s) = child.try_wait().expect("try_wait") {
            break s;
        }
        if std::time::Instant::now() > deadline {
            timed_out = true;
            let _ = child.kill();
            break child.wait().expect("wait");
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    };
    Run {
        code: status.code(),
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
        timed_out,
    }
}

/// A turn held across test processes, released when dropped.
///
/// - `cargo test` runs a binary's tests as threads of one process.
/// - `cargo nextest run` runs each test in a process of its own.
///
/// A static mutex serializes the first only, so the turn is an exclusive `flock` on a file
/// named for `name` in the target's temporary directory. Every holder of the same name, in
/// any test binary, waits for the others. The kernel releases it when the process dies.
pub struct Turn {
    _lock: nix::fcntl::Flock<std::fs::File>,
}

/// Waits for the turn named `name` (see [`Turn`]).
pub fn turn(name: &str) -> Turn {
    use nix::fcntl::{Flock, FlockArg};
    let path = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("turn-{name}.lock"));
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .unwrap_or_else(|e| panic!("cannot open {}: {e}", path.display()));
    loop {
        match Flock::lock(file, FlockArg::LockExclusive) {
            Ok(lock) => return Turn { _lock: lock },
            Err((back, nix::errno::Errno::EINTR)) => file = back,
            Err((_, e)) => panic!("flock {}: {e}", path.display()),
        }
    }
}

/// Like [`for_each_interpreter`] over the interpreters `some`, with no other test doing the
/// same at the same time (the turn "alone", in any test binary): for tests that start
/// several busy processes each, whose numbers mean something only when they do not compete
/// with another test's.
pub fn for_each_interpreter_alone_of(
    some: &[&Interpreter],
    check: impl Fn(&Interpreter) -> Result<String, String>,
) {
    let _turn = turn("alone");
    each_of(some, check)
}

/// Runs `check` on every interpreter, printing each one's summary, and fails with every
/// interpreter's error at the end (not at the first).
pub fn for_each_interpreter(check: impl Fn(&Interpreter) -> Result<String, String>) {
    let all = interpreters();
    each_of(&all.iter().collect::<Vec<_>>(), check)
}

fn each_of(some: &[&Interpreter], check: impl Fn(&Interpreter) -> Result<String, String>) {
    let mut failures = Vec::new();
    for py in some {
        match check(py) {
            Ok(summary) => eprintln!("{}: {summary}", py.label),
            Err(e) => failures.push(format!("{}: {e}", py.label)),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Whether this run is CI's (`CI=true`, as CI services set it, or `SCALENE_RS_CI=1`, which
/// `.ci/run` exports): there every test must run, and a test that cannot is a failure.
pub fn ci_mode() -> bool {
    let on = |var: &str| {
        std::env::var(var)
            .map(|v| matches!(v.trim().to_ascii_lowercase().as_str(), "1" | "true" | "yes"))
            .unwrap_or(false)
    };
    on("CI") || on("SCALENE_RS_CI")
}

/// For a test that cannot run on this machine (`why`): outside CI it says so, on stderr
/// written directly so that it shows without `--nocapture`, and the caller returns; in CI
/// ([`ci_mode`]) it panics, since `tools/setup.sh` (which `.ci/run` calls) provides
/// everything the tests need, and a skip there would be a check that silently never ran.
pub fn skip_or_fail(test: &str, why: &str) {
    if ci_mode() {
        panic!(
            "{test}: cannot run ({why}), and CI (CI=true or SCALENE_RS_CI=1) must run every \
             test: tools/setup.sh is meant to provide what it needs"
        );
    }
    say(&format!("{test}: SKIPPED: {why}"));
}

/// Writes `msg` to stderr directly, so that it shows in `cargo test`'s output even when the
/// test passes (the print macros' output is captured and shown only for a failure).
pub fn say(msg: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr().lock(), "{msg}");
}

/// Whether `go` (to read pprof files with `go tool pprof`) is there; if not, says so
/// (outside CI) or fails (in CI).
pub fn have_go(test: &str) -> bool {
    match Command::new("go").arg("version").output() {
        Ok(o) if o.status.success() => true,
        _ => {
            skip_or_fail(
                test,
                "no `go` to read pprof files with (Debian package golang-go)",
            );
            false
        }
    }
}

/// The stand-in NVML library (tests/support/fake_nvml.c) built with `define` (None: the
/// full one), once per test run; tests name it with SCALENE_RS_NVML_LIB.
pub fn fake_nvml(define: Option<&str>) -> PathBuf {
    static BUILT: std::sync::Mutex<Option<std::collections::HashMap<String, PathBuf>>> =
        std::sync::Mutex::new(None);
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    let map = built.get_or_insert_with(std::collections::HashMap::new);
    let key = define.unwrap_or("full").to_string();
    if let Some(p) = map.get(&key) {
        return p.clone();
    }
    let dir = tempdir("scalene-rs-fake-nvml");
    let out = dir.join(format!("libfake-nvml-{key}.so"));
    let mut cc = Command::new("cc");
    cc.args([
        "-shared", "-fPIC", "-O2", "-Wall", "-Wextra", "-Werror", "-o",
    ])
    .arg(&out)
    .arg(repo_root().join("tests/support/fake_nvml.c"));
    if let Some(d) = define {
        cc.arg(format!("-D{d}"));
    }
    let status = cc.arg("-lpthread").status().expect("cc");
    assert!(
        status.success(),
        "building the stand-in NVML ({key}) failed"
    );
    map.insert(key, out.clone());
    out
}

/// The profiler binary under test.
pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_scalene-rs")
}

/// Line number of the `# MARK: label` comment in a fixture.
pub fn mark(fixture: &Path, label: &str) -> u64 {
    let text = std::fs::read_to_string(fixture).unwrap();
    let needle = format!("# MARK: {label}");
    text.lines()
        .position(|l| l.trim_end().ends_with(&needle))
        .unwrap_or_else(|| panic!("{} has no MARK {label}", fixture.display())) as u64
        + 1
}

/// Seconds since the Unix epoch, as the fixtures' `time.time()` prints them.
pub fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// A new empty directory of this test run's own under the system's temporary directory.
pub fn tempdir(prefix: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "{prefix}-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    ));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A small deterministic generator (xorshift), so that a failing sequence can be replayed.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Line `n` of the file whose name ends with `file` in a profile's JSON.
#[allow(dead_code)]
pub fn profile_line<'a>(
    p: &'a serde_json::Value,
    file: &str,
    n: u64,
) -> Option<&'a serde_json::Value> {
    p["files"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|f| {
            f["filename"]
                .as_str()
                .is_some_and(|name| name.ends_with(file))
        })
        .flat_map(|f| f["lines"].as_array().into_iter().flatten())
        .find(|l| l["line"].as_u64() == Some(n))
}

/// A line's list of native functions (`native_functions` or `mem_native_functions` in a
/// profile's JSON) as (function, module, `value`'s number), in the profile's order.
#[allow(dead_code)]
pub fn native_function_list<'a>(
    line: &'a serde_json::Value,
    list: &str,
    value: &str,
) -> Vec<(&'a str, &'a str, f64)> {
    line[list]
        .as_array()
        .into_iter()
        .flatten()
        .map(|f| {
            (
                f["function"].as_str().unwrap_or(""),
                f["module"].as_str().unwrap_or(""),
                f[value].as_f64().unwrap_or(0.0),
            )
        })
        .collect()
}

/// Removes the files a SIGKILLed `attach` (process `profiler`) may have left in the places
/// where it puts them (a killed profiler cannot remove its ring or its copy of the library;
/// left there, they would meet a later profiler that has the same pid).
#[allow(dead_code)]
pub fn remove_attach_leftovers(profiler: u32) {
    for dir in ["/dev/shm", "/tmp", "/var/tmp"] {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with(&format!("scalene-rs-attach-{profiler}-")) {
                let _ = std::fs::remove_dir_all(e.path());
            } else if name.starts_with(&format!("scalene-rs-ring-{profiler}-")) {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
}

/// A child's stderr, line by line, read by a thread of its own (so a wait can time out):
/// what the attach tests wait on.
pub struct Lines(std::sync::mpsc::Receiver<String>);

impl Lines {
    pub fn of(child: &mut std::process::Child) -> Lines {
        let err = std::io::BufReader::new(child.stderr.take().unwrap());
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in err.lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Lines(rx)
    }

    /// Reads lines (into `seen`) until one contains `want` (true), the stream ends or
    /// 60 s pass (false).
    pub fn wait_for(&self, want: &str, seen: &mut Vec<String>) -> bool {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while let Some(left) = deadline.checked_duration_since(std::time::Instant::now()) {
            match self.0.recv_timeout(left) {
                Ok(line) => {
                    let hit = line.contains(want);
                    seen.push(line);
                    if hit {
                        return true;
                    }
                }
                Err(_) => return false,
            }
        }
        false
    }

    /// The remaining lines, once the child has ended.
    pub fn rest(&self, seen: &mut Vec<String>) {
        while let Ok(line) = self.0.recv_timeout(std::time::Duration::from_secs(10)) {
            seen.push(line);
        }
    }
}

/// `scalene-rs run --cpu-only EXTRA -o P.json -- PY FIXTURE ARGS` (at most 60 s): the
/// program's stdout, which must say "done", and the profile. Err: what went wrong.
#[allow(dead_code)]
pub fn record_cpu_profile(
    py: &Interpreter,
    fixture_name: &str,
    args: &[&str],
    extra: &[&str],
) -> Result<(String, serde_json::Value), String> {
    let dir = tempdir("scalene-rs-record");
    let out = dir.join("p.json");
    let mut cmd = std::process::Command::new(bin());
    cmd.args(["run", "--cpu-only"])
        .args(extra)
        .arg("-o")
        .arg(&out)
        .arg("--")
        .arg(&py.path)
        .arg(fixture(fixture_name))
        .args(args);
    let r = run_limited(cmd, std::time::Duration::from_secs(60));
    if r.code != Some(0) || !r.stdout.contains("done") {
        return Err(format!("run {extra:?}: {}", r.describe()));
    }
    let text = std::fs::read_to_string(&out).map_err(|e| e.to_string())?;
    let _ = std::fs::remove_dir_all(&dir);
    let profile = serde_json::from_str(&text).map_err(|e| e.to_string())?;
    Ok((r.stdout, profile))
}

/// The truth of fixtures/cpu/split.py (run with `SPLIT_ROUNDS=1`) over a stretch of wall
/// time, Unix seconds `from` to `to`: the python line's share of the two lines' CPU time,
/// percent. `None` when no round ended in it. A round is ~40 ms: a stretch of 2 s is told
/// within ~2%.
pub fn split_truth_between(stdout: &str, from: f64, to: f64) -> Option<f64> {
    let rounds: Vec<(f64, f64, f64)> = stdout
        .lines()
        .filter_map(|l| {
            let mut w = l
                .strip_prefix("round ")?
                .split_whitespace()
                .map(|x| x.parse::<f64>().ok());
            Some((w.next()??, w.next()??, w.next()??))
        })
        .collect();
    let at = |t: f64| {
        rounds
            .iter()
            .rev()
            .find(|r| r.0 <= t)
            .map_or((0.0, 0.0), |r| (r.1, r.2))
    };
    let ((p0, n0), (p1, n1)) = (at(from), at(to));
    let (p, n) = (p1 - p0, n1 - n0);
    (p + n > 0.0).then(|| 100.0 * p / (p + n))
}

/// CPU seconds process `pid` used so far (user + system, /proc/PID/stat); 0 when it cannot
/// be read.
#[allow(dead_code)]
pub fn cpu_s(pid: i32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect();
    // After the command's closing parenthesis: state is field 3, utime 14, stime 15.
    let ticks = |i: usize| fields.get(i - 3).and_then(|v| v.parse::<f64>().ok());
    // SAFETY: sysconf reads a configuration value; no memory is passed.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    (ticks(14).unwrap_or(0.0) + ticks(15).unwrap_or(0.0)) / hz
}
