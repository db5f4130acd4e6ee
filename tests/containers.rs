//! `dump` and `attach` on a process in other mount and PID namespaces, as in a container.
//!
//! The namespaces are made here: `unshare --mount --pid --fork` runs a shell script that
//! mounts a tmpfs over an empty directory of ours and execs a fixture, so Python is PID 1
//! of its namespace (it ignores SIGTERM: it is stopped with SIGKILL). Per interpreter:
//!   - `path_absent_on_host`: the interpreter (a pyenv tree bind-mounted, libpython
//!     included through LD_LIBRARY_PATH; the static build bind-mounted as one file) and the
//!     fixture run from a path that does not exist on our side;
//!   - `same_path_other_build_on_host`: the file that holds the interpreter (libpython, or
//!     the static executable) is, at the same path, another CPython build on our side (a
//!     hard link to another version's libpython) and the real one inside (a bind mount):
//!     reading our file of that path would give wrong symbols and the wrong version;
//!   - `chrooted`: the target is also chrooted inside its namespaces, so the paths of its
//!     mappings (from the namespace's root) and of its code (from its root) differ;
//!   - `active_without_gil`: threads running native code without the GIL are not idle;
//!   - `attach` to a CPU-bound fixture in the namespaces, plain and chrooted, until it
//!     exits: its two hot lines get the share the fixture measured itself, which needs its
//!     CPU time read under the thread ids of our namespace, and their source text, read
//!     while the target ran;
//!   - the library's file helpers: `open_in_root` (absolute symbolic links stay in the
//!     target's root) and `open_via_setns` (the helper that enters its mount namespace).
//!
//! The dump must give the exact stacks the interpreter itself reports (`truth` from
//! fixtures/dump_support.py), the right version, our TIDs (`native_id`, names from /proc)
//! and the target's own TIDs (`ns_native_id`, as each thread reported itself).
//! Without root or `unshare` the tests say that they are skipped and why (in CI they fail:
//! common::skip_or_fail). The Docker test (containers/docker.rs) needs an engine that
//! answers `docker info` (tools/docker.sh starts one). The namespaced target and its
//! scratch directory are in containers/ns_target.rs.

mod common;

use common::Interpreter;
use serde_json::Value;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_scalene-rs");
const READY_TIMEOUT: Duration = Duration::from_secs(30);

#[macro_use]
#[path = "containers/ns_target.rs"]
mod ns_target;
#[path = "containers/docker.rs"]
mod docker;
#[path = "containers/native.rs"]
mod native;
use ns_target::*;

/// The pyenv tree of a shared-libpython build and its libpython's file name, or None for a
/// static build.
fn shared_lib(interp: &Interpreter) -> Option<(PathBuf, String)> {
    let prefix = interp.path.parent()?.parent()?.to_path_buf();
    let (maj, min) = interp.version();
    ["", "m", "t"].iter().find_map(|abi| {
        let name = format!("libpython{maj}.{min}{abi}.so.1.0");
        prefix
            .join("lib")
            .join(&name)
            .is_file()
            .then(|| (prefix.clone(), name))
    })
}

fn exe_name(interp: &Interpreter) -> String {
    interp
        .path
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned()
}

/// The interpreter's full version, asked of itself.
fn full_version(interp: &Interpreter) -> String {
    let out = Command::new(&interp.path)
        .args(["-c", "import sys; print('%d.%d.%d' % sys.version_info[:3])"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Script lines that put `fixtures` into `<scratch>/mnt/app` on a tmpfs only the namespace
/// sees, plus the material of the file-helper checks.
fn namespace_prelude(d: &Scratch, fixtures: &[&str]) -> String {
    let mut s = format!(
        "mount -t tmpfs scalene-rs-ns {mnt}\nmkdir {mnt}/app\n",
        mnt = sh_quote(&d.s("mnt"))
    );
    for f in fixtures {
        s += &format!(
            "cp {} {}/app/\n",
            sh_quote(&common::fixture(f).to_string_lossy()),
            sh_quote(&d.s("mnt"))
        );
    }
    // `alt/decoy.txt` says "host" on our side and "inside" in the namespace; `mnt/link`
    // (only in the namespace) points to it by an absolute path.
    s += &format!(
        "mount -t tmpfs scalene-rs-ns-alt {alt}\necho inside > {alt}/decoy.txt\n\
         echo only-inside > {mnt}/only-inside.txt\nln -s {alt}/decoy.txt {mnt}/link\n",
        alt = sh_quote(&d.s("alt")),
        mnt = sh_quote(&d.s("mnt"))
    );
    s
}

fn prepare_scratch(name: &str) -> Scratch {
    let d = Scratch::new(name);
    for sub in ["mnt", "alt", "host/lib", "host/bin"] {
        std::fs::create_dir_all(d.path(sub)).unwrap();
    }
    std::fs::write(d.path("alt/decoy.txt"), "host\n").unwrap();
    d
}

/// Script that runs `fixture args` with the interpreter from `<scratch>/mnt/py`, a path we
/// do not have. Returns (script, the executable's path inside, the file holding the
/// interpreter inside).
fn script_path_absent(
    interp: &Interpreter,
    d: &Scratch,
    fixture: &str,
    args: &str,
) -> (String, String, String) {
    let py = d.s("mnt/py");
    let mut s = namespace_prelude(d, &[fixture, "dump_support.py"]);
    let fixture = Path::new(fixture).file_name().unwrap().to_string_lossy();
    if let Some((inside, holder)) = rooted_files(interp) {
        // Its wrapper runs it chrooted in its own root already: its path inside (the
        // executable's) is not ours; the fixture is on the namespace's tmpfs, which the
        // wrapper binds (with /tmp) into the root.
        s += &format!(
            "exec {} {}/app/{fixture} {args}\n",
            sh_quote(&interp.path.to_string_lossy()),
            sh_quote(&d.s("mnt"))
        );
        let _ = inside;
        return (s, holder_exe(interp), holder);
    }
    let exe = format!("{py}/bin/{}", exe_name(interp));
    let holder = match shared_lib(interp) {
        Some((prefix, lib)) => {
            s += &format!(
                "mkdir {q}\nmount --bind {} {q}\nexport LD_LIBRARY_PATH={q}/lib PYTHONHOME={q}\n",
                sh_quote(&prefix.to_string_lossy()),
                q = sh_quote(&py)
            );
            format!("{py}/lib/{lib}")
        }
        None => {
            s += &format!(
                "mkdir -p {q}/bin\ntouch {e}\nmount --bind {} {e}\nexport PYTHONHOME=/usr\n",
                sh_quote(&interp.path.to_string_lossy()),
                q = sh_quote(&py),
                e = sh_quote(&exe)
            );
            exe.clone()
        }
    };
    s += &format!(
        "exec {} {}/app/{fixture} {args}\n",
        sh_quote(&exe),
        sh_quote(&d.s("mnt"))
    );
    (s, exe, holder)
}

/// For an interpreter that runs chrooted in a root of its own (Debian's, made by
/// tools/pythons.sh): the path of its executable inside the root, and the file that holds
/// the interpreter as our side sees it (the root's executable, or its libpython).
fn rooted_files(interp: &Interpreter) -> Option<(String, String)> {
    let root = interp.root.as_ref()?;
    let name = exe_name(interp).trim_start_matches("debian-").to_string();
    let inside = format!("/usr/bin/{name}");
    let holder = if name.ends_with("-shared") {
        format!(
            "{}/usr/lib/x86_64-linux-gnu/libpython{}.{}.so.1.0",
            root.display(),
            interp.major,
            interp.minor
        )
    } else {
        format!("{}{inside}", root.display())
    };
    Some((inside, holder))
}

/// The executable of a rooted interpreter as `dump` names it (its path from our side).
fn holder_exe(interp: &Interpreter) -> String {
    let (inside, _) = rooted_files(interp).expect("a rooted interpreter");
    format!("{}{inside}", interp.root.as_ref().unwrap().display())
}

/// Another interpreter's libpython: an ELF file with CPython's symbols, of the nearest
/// other version (so that reading it would give plausible but wrong symbols).
fn decoy_for(interp: &Interpreter, all: &[Interpreter]) -> Option<PathBuf> {
    let rank = |i: &Interpreter| i.major as i64 * 100 + i.minor as i64;
    all.iter()
        .filter(|o| o.version() != interp.version())
        .filter_map(|o| shared_lib(o).map(|(p, lib)| (o, p.join("lib").join(lib))))
        .min_by_key(|(o, _)| (rank(o) - rank(interp)).abs())
        .map(|(_, path)| path)
}

/// `to` becomes the same file as `from` (a hard link; a copy across file systems).
fn place_decoy(from: &Path, to: &Path) {
    if std::fs::hard_link(from, to).is_err() {
        std::fs::copy(from, to).unwrap();
    }
}

/// Script where the file holding the interpreter has, at `<scratch>/host/...`, a decoy on
/// our side and the real build inside; it copies `fixtures` into the namespace, runs the
/// `setup` lines, then the interpreter with `run` (a script and its arguments, quoted).
/// Returns (script, executable inside, holder path).
fn script_other_build(
    interp: &Interpreter,
    d: &Scratch,
    decoy: &Path,
    fixtures: &[&str],
    setup: &str,
    run: &str,
) -> (String, String, String) {
    let mut s = namespace_prelude(d, fixtures);
    s += setup;
    let (exe, holder) = match shared_lib(interp) {
        Some((prefix, lib)) => {
            let holder = d.s(&format!("host/lib/{lib}"));
            place_decoy(decoy, Path::new(&holder));
            s += &format!(
                "mount --bind {} {h}\nexport LD_LIBRARY_PATH={}\n",
                sh_quote(&prefix.join("lib").join(&lib).to_string_lossy()),
                sh_quote(&d.s("host/lib")),
                h = sh_quote(&holder)
            );
            (interp.path.to_string_lossy().into_owned(), holder)
        }
        None => {
            let holder = d.s(&format!("host/bin/{}", exe_name(interp)));
            place_decoy(decoy, Path::new(&holder));
            s += &format!(
                "mount --bind {} {h}\nexport PYTHONHOME=/usr\n",
                sh_quote(&interp.path.to_string_lossy()),
                h = sh_quote(&holder)
            );
            (holder.clone(), holder)
        }
    };
    s += &format!("exec {} {run}\n", sh_quote(&exe));
    (s, exe, holder)
}

fn run_bin(args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(BIN).args(args).output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The target maps `holder`, so the case tests what it says it does.
fn check_mapped(t: &NsTarget, holder: &str) -> Result<(), String> {
    let maps = std::fs::read_to_string(format!("/proc/{}/maps", t.pid)).unwrap_or_default();
    if !maps.lines().any(|l| l.ends_with(holder)) {
        return Err(format!(
            "the target does not map {holder}; its maps:\n{maps}"
        ));
    }
    Ok(())
}

/// Dumps the namespaced dump_shapes.py and checks every thread against what it said.
/// Both ways: pausing the threads, and `--nonblocking`.
fn check_dump(t: &NsTarget, version: &str, exe: &str) -> Result<(), String> {
    check_dumps(t.pid, &t.printed, version, exe)
}

/// [`check_dump`] for process `pid` (ours) that printed `printed`; also used for Docker.
fn check_dumps(pid: i32, printed: &[String], version: &str, exe: &str) -> Result<(), String> {
    check_dump_with(pid, printed, version, exe, &[])?;
    check_dump_with(pid, printed, version, exe, &["--nonblocking"])
}

/// Where a dump's interpreter version or executable is not the expected one.
fn header_errors(dump: &Value, version: &str, exe: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if dump["python_version"] != version {
        errs.push(format!(
            "python_version {} (expected {version})",
            dump["python_version"]
        ));
    }
    if dump["executable"] != exe {
        errs.push(format!(
            "executable {} (expected {exe})",
            dump["executable"]
        ));
    }
    errs
}

/// The differences between a `dump --json` and the exact frames dump_shapes.py's threads
/// reported themselves (`printed`: its `truth` line): the interpreter's own view of every
/// thread but the reporter.
fn frame_errors(dump: &Value, printed: &[String]) -> Vec<String> {
    let mut errs = Vec::new();
    let threads = dump["threads"].as_array().cloned().unwrap_or_default();
    let by_ident: BTreeMap<String, &Value> = threads
        .iter()
        .map(|t| (t["thread_id"].to_string(), t))
        .collect();
    let truth = printed_json(printed, "truth");
    for (ident, stack) in truth.as_object().unwrap() {
        let Some(th) = by_ident.get(ident) else {
            errs.push(format!("thread {ident} missing from the dump"));
            continue;
        };
        let got: Vec<Value> = th["frames"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| serde_json::json!([f["function"], f["filename"], f["line"]]))
            .collect();
        if got != *stack.as_array().unwrap() {
            errs.push(format!(
                "thread {ident}: frames {got:?}, the interpreter says {stack}"
            ));
        }
    }
    errs
}

/// Waits until no thread of `pid` is running or runnable (state R in /proc).
fn wait_all_asleep(pid: i32) -> Result<(), String> {
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        let mut running = Vec::new();
        let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).map_err(|e| e.to_string())?;
        for t in tasks.flatten() {
            let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
            let state = stat
                .rsplit_once(')')
                .and_then(|(_, r)| r.trim_start().chars().next());
            if state == Some('R') {
                running.push(t.file_name().to_string_lossy().into_owned());
            }
        }
        if running.is_empty() {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!(
                "threads {running:?} of {pid} still running {READY_TIMEOUT:?} after `ready`"
            ));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn check_dump_with(
    pid: i32,
    printed: &[String],
    version: &str,
    exe: &str,
    extra: &[&str],
) -> Result<(), String> {
    // Every thread of the fixture blocks for good once it printed `ready`, but a dump that
    // paused them (the previous one) leaves each runnable for a moment as it restarts its
    // system call: on a busy machine, long enough for the next dump to find it running,
    // rightly reported active. What `idle` is checked against is that they are asleep.
    wait_all_asleep(pid)?;
    let pid = pid.to_string();
    let mut args = vec!["dump", pid.as_str(), "--json"];
    args.extend_from_slice(extra);
    let (code, out, err) = run_bin(&args);
    if code != Some(0) {
        return Err(format!("{args:?} exited {code:?}: {err}"));
    }
    let dump: Value = serde_json::from_str(&out).map_err(|e| format!("{e}: {out}"))?;
    let mut errs = header_errors(&dump, version, exe);
    errs.extend(frame_errors(&dump, printed));
    let threads = dump["threads"].as_array().cloned().unwrap_or_default();
    let by_ident: BTreeMap<String, &Value> = threads
        .iter()
        .map(|t| (t["thread_id"].to_string(), t))
        .collect();
    // Thread ids: ours (in /proc/PID/task, with the thread's own id as NSpid) and its own.
    let roles = printed_json(printed, "threads");
    for (role, v) in roles.as_object().unwrap() {
        let ident = v[0].to_string();
        let Some(th) = by_ident.get(&ident) else {
            errs.push(format!("{role}: thread {ident} missing"));
            continue;
        };
        let own = &v[1];
        if th["ns_native_id"] != *own {
            errs.push(format!(
                "{role}: ns_native_id {}, the thread says {own}",
                th["ns_native_id"]
            ));
        }
        let Some(ours) = th["native_id"].as_i64() else {
            errs.push(format!("{role}: no native_id"));
            continue;
        };
        let status =
            std::fs::read_to_string(format!("/proc/{pid}/task/{ours}/status")).unwrap_or_default();
        let nspid = status
            .lines()
            .find_map(|l| l.strip_prefix("NSpid:"))
            .and_then(|l| l.split_whitespace().last().map(str::to_string));
        if nspid.as_deref() != Some(own.to_string().as_str()) {
            errs.push(format!(
                "{role}: native_id {ours} has NSpid {nspid:?}, not {own}"
            ));
        }
        if role == "main" {
            if ours.to_string() != pid || *own != 1 {
                errs.push(format!(
                    "main: native_id {ours} / own id {own}, expected {pid} / 1"
                ));
            }
        } else {
            let want: String = role.chars().take(15).collect();
            if th["name"] != want.as_str() {
                errs.push(format!(
                    "{role}: name {}, the thread named itself {want}",
                    th["name"]
                ));
            }
        }
        if role != "reporter" && th["idle"] != true {
            errs.push(format!("{role}: blocked but not idle"));
        }
    }
    if errs.is_empty() {
        Ok(())
    } else {
        Err(format!("dump {}: {}", extra.join(" "), errs.join("\n")))
    }
}

fn for_each_interpreter(
    test: &str,
    case: impl Fn(&Interpreter, &[Interpreter]) -> Result<String, String>,
) {
    let all = common::interpreters();
    let mut failures = Vec::new();
    for interp in &all {
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| case(interp, &all))) {
            // What did not run shows even when the test passes.
            Ok(Ok(note)) if note.starts_with("SKIPPED") || note.starts_with("not run") => {
                common::say(&format!("{test} [{}]: {note}", interp.label))
            }
            Ok(Ok(note)) => println!("{test} [{}]: {note}", interp.label),
            Ok(Err(e)) => failures.push(format!("[{}] {e}", interp.label)),
            Err(_) => failures.push(format!("[{}] panicked", interp.label)),
        }
    }
    assert!(
        failures.is_empty(),
        "{test}: {} failure(s):\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn dump_a_namespaced_process_whose_interpreter_path_is_absent_on_host() {
    require_namespaces!("path_absent_on_host");
    for_each_interpreter("path_absent_on_host", |interp, _| {
        let d = prepare_scratch(&format!("absent-{}", interp.label));
        let (script, exe, holder) = script_path_absent(interp, &d, "dump_shapes.py", "");
        let t = NsTarget::start(&script, true)?;
        check_mapped(&t, &holder)?;
        // A rooted interpreter's file is ours to see at the root's path: what the target
        // uses, its path inside, is not.
        let absent = match rooted_files(interp) {
            Some((inside, _)) => vec![inside, d.s("mnt/app/dump_shapes.py")],
            None => vec![exe.clone(), holder.clone(), d.s("mnt/app/dump_shapes.py")],
        };
        for p in &absent {
            if Path::new(p).exists() {
                return Err(format!("{p} exists on our side: the case tests nothing"));
            }
        }
        check_dump(&t, &full_version(interp), &exe)?;

        // The file helpers, against the same target.
        use scalene_rs::proc::ns;
        let read = |f: std::io::Result<std::fs::File>| -> Result<String, String> {
            let mut s = String::new();
            f.map_err(|e| e.to_string())?
                .read_to_string(&mut s)
                .map_err(|e| e.to_string())?;
            Ok(s)
        };
        // (A rooted interpreter is chrooted by its wrapper.)
        if ns::root_is_namespace_root(t.pid) != interp.root.is_none() {
            return Err(format!(
                "root_is_namespace_root: {} for a target {}chrooted",
                interp.root.is_some(),
                if interp.root.is_none() { "not " } else { "" }
            ));
        }
        let only = read(ns::open_via_setns(
            t.pid,
            &d.s("mnt/only-inside.txt"),
            ns::Resolve::ProcessRoot,
        ))?;
        let link = read(ns::open_in_root(t.pid, &d.s("mnt/link")))?;
        let link_setns = read(ns::open_via_setns(
            t.pid,
            &d.s("mnt/link"),
            ns::Resolve::ProcessRoot,
        ))?;
        if (only.as_str(), link.as_str(), link_setns.as_str())
            != ("only-inside\n", "inside\n", "inside\n")
        {
            return Err(format!(
                "file helpers read {only:?}, {link:?}, {link_setns:?} (the link's target is \"host\" on our side)"
            ));
        }
        Ok(format!("{exe} (interpreter in {holder})"))
    });
}

#[test]
fn dump_a_namespaced_process_whose_interpreter_path_holds_another_build_on_host() {
    require_namespaces!("same_path_other_build_on_host");
    for_each_interpreter("same_path_other_build_on_host", |interp, all| {
        if interp.root.is_some() {
            // Its files are at paths inside its own root that we do not have (the case
            // above): no file of ours at them could be a decoy short of writing into the
            // host's /usr/bin.
            return Ok(
                "not run (does not apply): runs chrooted in a root of its own (see \
                 path_absent_on_host)"
                    .into(),
            );
        }
        let Some(decoy) = decoy_for(interp, all) else {
            let why = "no other CPython version's libpython to put on our side";
            if common::ci_mode() {
                return Err(format!(
                    "cannot run in CI: {why} (tools/pythons.sh makes them)"
                ));
            }
            return Ok(format!("SKIPPED: {why}"));
        };
        let d = prepare_scratch(&format!("other-{}", interp.label));
        let shapes = format!("{}/app/dump_shapes.py", sh_quote(&d.s("mnt")));
        let fixtures = ["dump_shapes.py", "dump_support.py"];
        let (script, exe, holder) = script_other_build(interp, &d, &decoy, &fixtures, "", &shapes);
        let t = NsTarget::start(&script, true)?;
        check_mapped(&t, &holder)?;
        let inside = std::fs::metadata(format!("/proc/{}/root{holder}", t.pid)).unwrap();
        let ours = std::fs::metadata(&holder).unwrap();
        if (inside.dev(), inside.ino()) == (ours.dev(), ours.ino()) {
            return Err(format!(
                "{holder} is the same file on both sides: the case tests nothing"
            ));
        }
        check_dump(&t, &full_version(interp), &exe)?;
        Ok(format!("{holder} is {} on our side", decoy.display()))
    });
}

/// `same_path_other_build_on_host` with `dump --native`: frames named from the target's
/// libpython (or static executable) and extension, not from ours at the same paths.
#[test]
fn dump_native_of_a_namespaced_process_names_frames_from_its_own_files() {
    require_namespaces!("native_same_path_other_build");
    for_each_interpreter("native_same_path_other_build", |interp, all| {
        if interp.root.is_some() {
            return Ok("not run (does not apply): runs chrooted in a root of its own".into());
        }
        let Some(decoy) = decoy_for(interp, all) else {
            let why = "no other CPython version's libpython to put on our side";
            if common::ci_mode() {
                return Err(format!("cannot run in CI: {why}"));
            }
            return Ok(format!("SKIPPED: {why}"));
        };
        native::native_other_build(interp, &decoy)
    });
}

/// A thread that runs native code without the GIL (fixtures/busy_native.py) is active, not
/// idle: its scheduler state must be read under our id for it, not its own.
#[test]
fn dump_reports_namespaced_threads_running_without_the_gil_as_active() {
    require_namespaces!("active_without_gil");
    for_each_interpreter("active_without_gil", |interp, _| {
        let d = prepare_scratch(&format!("busy-{}", interp.label));
        let (script, _, _) = script_path_absent(interp, &d, "busy_native.py", "");
        let t = NsTarget::start(&script, true)?;
        let roles = t.printed_json("threads");
        let pid = t.pid.to_string();
        let mut gil_free_active = 0;
        for round in 0..5 {
            let (code, out, err) = run_bin(&["dump", &pid, "--json"]);
            if code != Some(0) {
                return Err(format!("dump {round}: exit {code:?}: {err}"));
            }
            let dump: Value = serde_json::from_str(&out).map_err(|e| e.to_string())?;
            {
                let role = "deflater";
                let ident = &roles[role][0];
                let th = dump["threads"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|t| t["thread_id"] == *ident)
                    .ok_or_else(|| format!("dump {round}: no {role} thread"))?;
                if th["idle"] != false {
                    return Err(format!(
                        "dump {round}: {role} runs but is reported idle: {th}"
                    ));
                }
                if th["holds_gil"] == false {
                    gil_free_active += 1;
                }
            }
        }
        // Not holding the GIL is what makes `idle` depend on the scheduler state.
        if gil_free_active == 0 {
            return Err("the deflater held the GIL in every dump: nothing was tested".into());
        }
        Ok(format!(
            "{gil_free_active} of 5 dumps found the deflater running without the GIL"
        ))
    });
}

/// The target is chrooted inside its namespaces (to a recursive bind mount of /): the
/// kernel writes its mappings' paths from the namespace's root, its code objects hold
/// paths from its own root.
#[test]
fn dump_a_process_chrooted_inside_its_namespace() {
    require_namespaces!("chrooted");
    for_each_interpreter("chrooted", |interp, _| {
        let d = prepare_scratch(&format!("chroot-{}", interp.label));
        let jail = d.s("mnt/jail");
        let mut script = namespace_prelude(&d, &["dump_shapes.py", "dump_support.py"]);
        script += &format!(
            "mkdir {j}\nmount --rbind / {j}\nexec chroot {j} {} {}/app/dump_shapes.py\n",
            sh_quote(&interp.path.to_string_lossy()),
            sh_quote(&d.s("mnt")),
            j = sh_quote(&jail)
        );
        let t = NsTarget::start(&script, true)?;
        // The file holding the interpreter, and its path from the target's own root (a
        // rooted interpreter's wrapper chroots it once more, into its Debian root).
        let (real, from_own_root, exe) = match (rooted_files(interp), shared_lib(interp)) {
            (Some((_, holder)), _) => {
                let own = holder
                    .strip_prefix(&*interp.root.as_ref().unwrap().to_string_lossy())
                    .unwrap()
                    .to_string();
                (PathBuf::from(holder), own, holder_exe(interp))
            }
            (None, Some((prefix, lib))) => {
                let real = prefix.join("lib").join(lib);
                let own = real.to_string_lossy().into_owned();
                (real, own, interp.path.to_string_lossy().into_owned())
            }
            (None, None) => (
                interp.path.clone(),
                interp.path.to_string_lossy().into_owned(),
                interp.path.to_string_lossy().into_owned(),
            ),
        };
        let holder = format!("{jail}{}", real.display());
        check_mapped(&t, &holder)?;
        use scalene_rs::proc::ns;
        if ns::root_is_namespace_root(t.pid) {
            return Err("root_is_namespace_root: true for a chrooted target".into());
        }
        // The helper, both ways: the mapping's path from the namespace's root, the same
        // file from the target's own root.
        let want = std::fs::metadata(&real).unwrap();
        for (path, from) in [
            (holder.clone(), ns::Resolve::NamespaceRoot),
            (from_own_root, ns::Resolve::ProcessRoot),
        ] {
            let f = ns::open_via_setns(t.pid, &path, from).map_err(|e| format!("{path}: {e}"))?;
            let m = f.metadata().unwrap();
            if (m.dev(), m.ino()) != (want.dev(), want.ino()) {
                return Err(format!(
                    "open_via_setns({path}, {from:?}) opened another file"
                ));
            }
        }
        check_dump(&t, &full_version(interp), &format!("{jail}{exe}"))?;
        Ok(format!("interpreter mapped from {holder}"))
    });
}

#[test]
fn attach_to_a_namespaced_process_charges_its_hot_lines() {
    require_namespaces!("attach_namespaced");
    let (lp, ln, quoted) = split_marks();
    for_each_interpreter("attach_namespaced", |interp, _| {
        // As in path_absent_on_host.
        let d = prepare_scratch(&format!("attach-{}", interp.label));
        let (script, _, _) = script_path_absent(interp, &d, "cpu/split.py", RUN_SECONDS);
        let file = d.s("mnt/app/split.py");
        let plain = attach_and_check(&script, &d, &file, (lp, ln), &quoted)?;
        // Chrooted inside the namespaces, started by a relative name from the fixture's
        // directory (before 3.9 its code then says "split.py"): its working directory, as
        // /proc shows it, begins with the chroot directory, which must come off.
        let d = prepare_scratch(&format!("attach-chroot-{}", interp.label));
        let jail = d.s("mnt/jail");
        let mut script = namespace_prelude(&d, &["cpu/split.py"]);
        script += &format!(
            "mkdir {j}\nmount --rbind / {j}\nexec chroot {j} sh -c \"cd {} && exec {} split.py {RUN_SECONDS}\"\n",
            sh_quote(&d.s("mnt/app")),
            sh_quote(&interp.path.to_string_lossy()),
            j = sh_quote(&jail)
        );
        let file = if interp.version() >= (3, 9) {
            d.s("mnt/app/split.py")
        } else {
            "split.py".to_string()
        };
        let chrooted = attach_and_check(&script, &d, &file, (lp, ln), &quoted)?;
        Ok(format!("{plain}; chrooted: {chrooted}"))
    });
}

/// cpu/split.py's hot lines, Python then native (their MARK comments), and the Python
/// line's code as `view` must quote it.
fn split_marks() -> (u64, u64, String) {
    let text = std::fs::read_to_string(common::fixture("cpu/split.py")).unwrap();
    let mark = |label: &str| -> u64 {
        text.lines()
            .position(|l| l.contains(&format!("# MARK: {label}")))
            .map(|i| i as u64 + 1)
            .unwrap()
    };
    let (lp, ln) = (mark("python"), mark("native"));
    let quoted = text.lines().nth(lp as usize - 1).unwrap();
    let quoted = quoted.split('#').next().unwrap().trim().to_string();
    (lp, ln, quoted)
}

/// How long the attach fixture runs (seconds, as its argument).
const RUN_SECONDS: &str = "5";
/// How far our split of the two hot lines may be from the fixture's own measurement
/// (percentage points of the pair's time).
const SPLIT_TOLERANCE: f64 = 15.0;

/// Starts `script` in new namespaces, attaches from shortly after its start until it
/// exits, and checks the two hot lines of `file` (cpu/split.py): together most of the
/// time, and split between them as the fixture itself measured (its `truth` line: each
/// line's CPU seconds). Then `view`, with the target and its namespace gone, must still
/// quote the Python line: its source was read while the target ran, as the target saw the
/// file (we have none of that path).
fn attach_and_check(
    script: &str,
    d: &Scratch,
    file: &str,
    (lp, ln): (u64, u64),
    quoted: &str,
) -> Result<String, String> {
    let mut t = NsTarget::start(script, false)?;
    // Past start-up and calibration (a few tens of ms of CPU).
    std::thread::sleep(Duration::from_millis(1000));
    let out = d.s("a.json");
    let (code, _, err) = run_bin(&["attach", &t.pid.to_string(), "-o", &out]);
    if code != Some(0) {
        return Err(format!("attach exited {code:?}: {err}"));
    }
    t.wait_for("done")?;
    let truth_line = t
        .lines
        .recv_timeout(READY_TIMEOUT)
        .map_err(|e| format!("no truth line: {e}"))?;
    check_split_profile(&out, file, &truth_line, (lp, ln), quoted)
}

/// Checks the profile `out` that `attach` wrote for cpu/split.py, run as `file`, against
/// the `truth ...` line the fixture printed last: its hot lines `lp` (Python) and `ln`
/// (native) take most of the time, split as the fixture measured; `view` quotes `quoted`.
fn check_split_profile(
    out: &str,
    file: &str,
    truth_line: &str,
    (lp, ln): (u64, u64),
    quoted: &str,
) -> Result<String, String> {
    let truth: Vec<f64> = truth_line
        .strip_prefix("truth ")
        .map(|r| {
            r.split(' ')
                .filter_map(|kv| kv.split_once('=')?.1.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    let [py_s, native_s] = truth[..] else {
        return Err(format!("unexpected truth line {truth_line:?}"));
    };
    let p: Value = serde_json::from_str(&std::fs::read_to_string(out).unwrap()).unwrap();
    let f = p["files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["filename"] == file)
        .ok_or_else(|| format!("no {file} in the profile: {p}"))?;
    let pct = |line: u64| -> f64 {
        f["lines"]
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["line"] == line)
            .map(|l| {
                ["cpu_python_pct", "cpu_native_pct", "cpu_system_pct"]
                    .iter()
                    .map(|k| l[k].as_f64().unwrap())
                    .sum()
            })
            .unwrap_or(0.0)
    };
    let (code, view_out, view_err) = run_bin(&["view", out]);
    if code != Some(0) || !(view_out.clone() + &view_err).contains(quoted) {
        return Err(format!(
            "`view` should quote {quoted:?}; exit {code:?}, got:\n{view_out}{view_err}"
        ));
    }
    let (a, b) = (pct(lp), pct(ln));
    let ours = 100.0 * a / (a + b).max(1e-9);
    let theirs = 100.0 * py_s / (py_s + native_s).max(1e-9);
    let summary = format!(
        "hot lines {:.1}% of the time, python line {ours:.1}% of them (the fixture measured {theirs:.1}%)",
        a + b
    );
    if a + b < 80.0 || (ours - theirs).abs() > SPLIT_TOLERANCE {
        return Err(summary);
    }
    Ok(summary)
}

/// The root file system the Docker test imports as an image, run here as the root of new
/// namespaces (chroot): the interpreter and everything it loads come from files that exist
/// on our side only under that directory.
#[test]
fn dump_a_process_in_a_root_file_system_of_its_own() {
    require_namespaces!("own_root_file_system");
    let Some(interp) = docker::static_interpreter() else {
        return common::skip_or_fail(
            "own_root_file_system",
            "no static CPython build to put in a root file system",
        );
    };
    let d = prepare_scratch("rootfs");
    let root = docker::build_rootfs(&interp, &d);
    let exe = interp.path.to_string_lossy().into_owned();
    let script = format!(
        "exec chroot {} {} /app/dump_shapes.py\n",
        sh_quote(&root.to_string_lossy()),
        sh_quote(&exe)
    );
    let t = NsTarget::start(&script, true).unwrap();
    // Every mapped file, libc included, is one of the root file system's.
    let maps = std::fs::read_to_string(format!("/proc/{}/maps", t.pid)).unwrap();
    let root_s = root.to_string_lossy().into_owned();
    for l in maps.lines() {
        if let Some(p) = l.split_whitespace().nth(5).filter(|p| p.starts_with('/')) {
            assert!(
                p.starts_with(&root_s),
                "{p} is not from the root file system"
            );
        }
    }
    check_dumps(
        t.pid,
        &t.printed,
        &full_version(&interp),
        &format!("{root_s}{exe}"),
    )
    .unwrap();
}

#[test]
fn dump_a_process_in_a_docker_container() {
    if let Some(why) = docker::engine_missing() {
        return common::skip_or_fail("docker", &why);
    }
    docker::dump_in_container();
}
