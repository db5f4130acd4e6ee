//! `dump --native` names functions that only debug information kept apart from the module
//! knows: a separate debug file (by build id, by `.gnu_debuglink`) and MiniDebugInfo
//! (`.gnu_debugdata`). The truth is built here: fixtures/native/spinext.c, whose static
//! functions `spin_static` and `spin` are in `.symtab` only, stripped to its `.dynsym`
//! (`strip --strip-all`), with what was stripped put back in one of those forms by the
//! tools distributions use (binutils' objcopy, strip and nm; xz).
//!
//! - Separate debug file, made as Debian's `-dbgsym` packages are (`objcopy
//!   --only-keep-debug --compress-debug-sections`): the four frames `spin_inner`,
//!   `spin_static`, `spin_outer`, `spin` are named and have their file and line from it,
//!   while the module itself has neither. One target process, one dump after each change
//!   of the debug directories: nothing there (the static functions are unnamed, no lines);
//!   another build's debug file at our build id's path, then another debug file under the
//!   debuglink's name (both refused: build id, CRC32); ours under the debuglink's name (no
//!   build id in it: taken by CRC32); ours at the build id's path. The debug directory is
//!   named with `SCALENE_RS_DEBUG_DIRS`; for an interpreter that runs chrooted, also
//!   without it: the file put in the root's own /usr/lib/debug, which the profiler must
//!   read through /proc/PID/root.
//! - MiniDebugInfo, made as Fedora's find-debuginfo does: the debug file's function
//!   symbols that `.dynsym` lacks, kept alone (`objcopy -S --keep-symbols`),
//!   xz-compressed and added as `.gnu_debugdata` to the stripped module: all four frames
//!   are named, none has a line.
//!
//! Which debug information is used does not depend on the interpreter, only on the
//! module: each test runs on a few interpreters (the newest plain 3.x, 2.7, a
//! free-threaded one, the newest chrooted one), not the whole matrix, to keep the suite
//! short (each interpreter costs a compile and a few dumps).

mod common;
use common::spinext::{self, tool, Target};
use common::Interpreter;
use serde::Deserialize;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const DUMP_TIMEOUT: Duration = Duration::from_secs(60);
/// How long to keep dumping until the thread is in `spin_inner`.
const SETTLE: Duration = Duration::from_secs(10);
const DEBUG_DIRS: &str = "SCALENE_RS_DEBUG_DIRS";

// ---------------------------------------------------------------------------------------
// The JSON `dump --native --json` prints (the fields read here).

#[derive(Deserialize, Debug)]
struct Dump {
    threads: Vec<DThread>,
}

#[derive(Deserialize, Debug)]
struct DThread {
    frames: Vec<PyFrame>,
    native: View,
}

#[derive(Deserialize, Debug)]
struct PyFrame {
    function: String,
}

#[derive(Deserialize, Debug)]
struct View {
    stack: Vec<Entry>,
}

#[derive(Deserialize, Debug)]
#[serde(tag = "kind", rename_all = "lowercase")]
enum Entry {
    Python(#[allow(dead_code)] serde_json::Value),
    Native(NFrame),
}

#[derive(Deserialize, Debug, Clone, PartialEq)]
struct NFrame {
    symbol: Option<String>,
    module: Option<String>,
    file: Option<String>,
    line: Option<i64>,
}

/// The interpreters these tests run on (see the top of the file): of those the matrix has.
fn chosen() -> Vec<Interpreter> {
    let all = common::interpreters();
    // `interpreters` sorts by version: the newest is the last.
    let picks = [
        all.iter()
            .rfind(|i| i.major == 3 && i.root.is_none() && !i.free_threaded),
        all.iter().find(|i| i.is_py2()),
        all.iter().find(|i| i.free_threaded),
        all.iter().rfind(|i| i.root.is_some()),
    ];
    let mut out: Vec<Interpreter> = Vec::new();
    for p in picks.into_iter().flatten() {
        if !out.iter().any(|o| o.path == p.path) {
            out.push(p.clone());
        }
    }
    out
}

/// Runs `check` on each chosen interpreter; fails with every failure at the end.
fn for_each_chosen(check: impl Fn(&Interpreter) -> Result<String, String>) {
    let mut failures = Vec::new();
    let chosen = chosen();
    assert!(!chosen.is_empty(), "no interpreter to run on");
    for py in chosen {
        match check(&py) {
            Ok(summary) => common::say(&format!("{}: {summary}", py.label)),
            Err(e) => failures.push(format!("{}: {e}", py.label)),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

// ---------------------------------------------------------------------------------------
// Making the modules.

fn os<S: AsRef<OsStr> + ?Sized>(s: &S) -> &OsStr {
    s.as_ref()
}

/// The GNU build id of an ELF file, in hex (`readelf -n`).
fn build_id(file: &Path) -> Result<String, String> {
    let notes = tool("readelf", &[os("-n"), file.as_os_str()])?;
    notes
        .lines()
        .find_map(|l| l.trim().strip_prefix("Build ID: "))
        .map(|id| id.trim().to_string())
        .ok_or_else(|| format!("{} has no build id", file.display()))
}

/// Where a debug directory keeps the debug file of build id `id` (hex).
fn build_id_path(debug_dir: &Path, id: &str) -> PathBuf {
    debug_dir
        .join(".build-id")
        .join(&id[..2])
        .join(format!("{}.debug", &id[2..]))
}

/// Puts `file` at `to` (making its directories).
fn place(file: &Path, to: &Path) -> Result<(), String> {
    std::fs::create_dir_all(to.parent().unwrap()).map_err(|e| e.to_string())?;
    std::fs::copy(file, to)
        .map(|_| ())
        .map_err(|e| format!("copying {} to {}: {e}", file.display(), to.display()))
}

/// The extension built in `dir` (`work` holds the rest): `full` with its DWARF and
/// `.symtab`, `module` (the extension's file name in `dir`) stripped of them.
struct Built {
    dir: PathBuf,
    work: PathBuf,
    full: PathBuf,
    module: String,
}

fn build(interp: &Interpreter, what: &str) -> Result<Built, String> {
    let (_, suffix) = spinext::sysconfig(interp)?;
    let dir = common::tempdir(&format!("scalene-rs-debuginfo-{what}-{}", interp.label));
    let work = dir.join("work");
    std::fs::create_dir_all(&work).map_err(|e| e.to_string())?;
    let full = work.join("full.so");
    spinext::compile(interp, &full, &[])?;
    Ok(Built {
        dir,
        work,
        full,
        module: format!("spinext{suffix}"),
    })
}

impl Built {
    fn module_path(&self) -> PathBuf {
        self.dir.join(&self.module)
    }

    /// The stripped module: `strip --strip-all` of the full build (keeps `.dynsym` and the
    /// build id, drops `.symtab` and DWARF).
    fn strip(&self) -> Result<(), String> {
        tool(
            "strip",
            &[
                os("--strip-all"),
                self.full.as_os_str(),
                os("-o"),
                self.module_path().as_os_str(),
            ],
        )
        .map(drop)
    }

    /// `objcopy --only-keep-debug --compress-debug-sections` of `elf` into `out`, as
    /// Debian's debhelper makes a `-dbgsym` package's file.
    fn debug_file(elf: &Path, out: &Path) -> Result<(), String> {
        tool(
            "objcopy",
            &[
                os("--only-keep-debug"),
                os("--compress-debug-sections=zlib"),
                elf.as_os_str(),
                out.as_os_str(),
            ],
        )
        .map(drop)
    }
}

impl Drop for Built {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

// ---------------------------------------------------------------------------------------
// Reading the frames.

/// `dump --native --json` of `pid` with the debug directories `debug_dirs` (None: the
/// variable unset, the target's own /usr/lib/debug), again until the thread running
/// `caller` is in `spin_inner` (within [`SETTLE`]). Returns that thread's first four native
/// frames.
fn ext_frames(pid: i32, debug_dirs: Option<&Path>) -> Result<Vec<NFrame>, String> {
    let deadline = Instant::now() + SETTLE;
    loop {
        let mut cmd = Command::new(common::bin());
        cmd.args(["dump", "--native", "--json", &pid.to_string()]);
        match debug_dirs {
            Some(d) => cmd.env(DEBUG_DIRS, d),
            None => cmd.env_remove(DEBUG_DIRS),
        };
        let run = common::run_limited(cmd, DUMP_TIMEOUT);
        if run.code != Some(0) {
            return Err(format!("dump --native --json: {}", run.describe()));
        }
        let d: Dump = serde_json::from_str(&run.stdout)
            .map_err(|e| format!("unparsable JSON ({e}): {}", run.stdout))?;
        let frames: Vec<NFrame> = d
            .threads
            .iter()
            .find(|t| t.frames.iter().any(|f| f.function == "caller"))
            .map(|t| {
                t.native
                    .stack
                    .iter()
                    .take(4)
                    .filter_map(|e| match e {
                        Entry::Native(f) => Some(f.clone()),
                        Entry::Python(_) => None,
                    })
                    .collect()
            })
            .unwrap_or_default();
        let settled = frames.first().and_then(|f| f.symbol.as_deref()) == Some("spin_inner");
        if settled || Instant::now() > deadline {
            return Ok(frames);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The lines of spinext.c each of the four frames may be at (`# MARK:`s).
fn spin_lines() -> [Vec<i64>; 4] {
    let c = |label: &str| common::mark(&common::fixture("native/spinext.c"), label) as i64;
    [
        vec![c("inner-loop"), c("inner-step")],
        vec![c("static-call")],
        vec![c("outer-call")],
        vec![c("spin-call")],
    ]
}

/// What the extension's four frames must show.
#[derive(Clone, Copy, PartialEq)]
enum Want {
    /// Only the exported functions named (from `.dynsym`), no lines.
    Dynsym,
    /// Every function named, no lines.
    Named,
    /// Every function named, with its file and line in spinext.c.
    Placed,
}

/// Checks the four frames of the extension `module` against `want`.
fn expect(frames: &[NFrame], module: &str, want: Want) -> Result<(), String> {
    let (statics, lines) = (want != Want::Dynsym, want == Want::Placed);
    let names = [
        Some("spin_inner"),
        statics.then_some("spin_static"),
        Some("spin_outer"),
        statics.then_some("spin"),
    ];
    let source = common::fixture("native/spinext.c").display().to_string();
    let ok = frames.len() == 4
        && frames.iter().enumerate().all(|(i, f)| {
            let at_line = match (&f.file, f.line) {
                (Some(file), Some(line)) => *file == source && spin_lines()[i].contains(&line),
                _ => false,
            };
            f.module.as_deref() == Some(module)
                && f.symbol.as_deref() == names[i]
                && if lines {
                    at_line
                } else {
                    f.file.is_none() && f.line.is_none()
                }
        });
    if ok {
        return Ok(());
    }
    let shown: Vec<String> = frames
        .iter()
        .map(|f| {
            format!(
                "{} [{}] {}:{:?}",
                f.symbol.as_deref().unwrap_or("?"),
                f.module.as_deref().unwrap_or("?"),
                f.file.as_deref().unwrap_or("-"),
                f.line
            )
        })
        .collect();
    Err(format!(
        "want {names:?} in {module}{}; got:\n    {}",
        if lines {
            format!(" at {source}:{:?}", spin_lines())
        } else {
            ", no lines".into()
        },
        shown.join("\n    ")
    ))
}

// ---------------------------------------------------------------------------------------
// The tests.

fn separate_debug_file_check(interp: &Interpreter) -> Result<String, String> {
    let b = build(interp, "separate")?;
    let id = build_id(&b.full)?;
    // Ours, as a -dbgsym package has it; the same without its build id note (found by the
    // debuglink alone, checked by CRC32); the debuglink names the latter.
    let ours = b.work.join("ours.debug");
    Built::debug_file(&b.full, &ours)?;
    let linked = b.work.join("link").join("spinext.debug");
    std::fs::create_dir_all(linked.parent().unwrap()).map_err(|e| e.to_string())?;
    tool(
        "objcopy",
        &[
            os("--remove-section=.note.gnu.build-id"),
            ours.as_os_str(),
            linked.as_os_str(),
        ],
    )?;
    b.strip()?;
    let link = format!("--add-gnu-debuglink={}", linked.display());
    tool("objcopy", &[os(&link), b.module_path().as_os_str()])?;
    // Another build (another build id): its debug file, and the same without build id.
    let variant = b.work.join("variant.so");
    spinext::compile(interp, &variant, &["-DSPINEXT_VARIANT"])?;
    let theirs = b.work.join("theirs.debug");
    Built::debug_file(&variant, &theirs)?;
    let theirs_unlinked = b.work.join("theirs-nobuildid.debug");
    tool(
        "objcopy",
        &[
            os("--remove-section=.note.gnu.build-id"),
            theirs.as_os_str(),
            theirs_unlinked.as_os_str(),
        ],
    )?;

    let debug_dir = b.work.join("debug");
    std::fs::create_dir_all(&debug_dir).map_err(|e| e.to_string())?;
    let at_build_id = build_id_path(&debug_dir, &id);
    let at_link = b.dir.join(".debug").join("spinext.debug");
    let target = Target::start(interp, &b.dir, &[])?;
    let step = |what: &str, dirs: Option<&Path>, want: Want| {
        ext_frames(target.pid, dirs)
            .and_then(|f| expect(&f, &b.module, want))
            .map_err(|e| format!("{what}: {e}"))
    };
    let dirs = Some(debug_dir.as_path());
    step("no debug file", dirs, Want::Dynsym)?;
    place(&theirs, &at_build_id)?;
    step(
        "another build's debug file at our build id's path",
        dirs,
        Want::Dynsym,
    )?;
    place(&theirs_unlinked, &at_link)?;
    step(
        "another debug file under the debuglink's name",
        dirs,
        Want::Dynsym,
    )?;
    place(&linked, &at_link)?;
    step(
        "ours under the debuglink's name (by CRC32)",
        dirs,
        Want::Placed,
    )?;
    std::fs::remove_file(&at_link).map_err(|e| e.to_string())?;
    place(&ours, &at_build_id)?;
    step("ours at the build id's path", dirs, Want::Placed)?;
    let mut summary = "named and placed from the debug file (build id, debuglink)".to_string();
    // A chrooted target: its own /usr/lib/debug, which only /proc/PID/root shows.
    if let Some(root) = &interp.root {
        let debug = root.join("usr/lib/debug");
        let in_root = build_id_path(&debug, &id);
        // The same build makes the same build id: one left by a run that was killed goes.
        let clean = || {
            let _ = std::fs::remove_file(&in_root);
            for dir in [in_root.parent().unwrap(), &debug.join(".build-id"), &debug] {
                let _ = std::fs::remove_dir(dir); // only if empty
            }
        };
        clean();
        step("the root's /usr/lib/debug, empty", None, Want::Dynsym)?;
        place(&ours, &in_root)?;
        let seen = step("ours in the root's /usr/lib/debug", None, Want::Placed);
        clean();
        seen?;
        summary.push_str(", and from the root's /usr/lib/debug");
    }
    Ok(summary)
}

fn mini_debuginfo_check(interp: &Interpreter) -> Result<String, String> {
    let b = build(interp, "mini")?;
    b.strip()?;
    let module = b.module_path();
    // As find-debuginfo's add_minidebug: the function symbols of the debug file that
    // .dynsym lacks, kept alone in a copy of the debug file stripped of the rest.
    let debug = b.work.join("full.debug");
    Built::debug_file(&b.full, &debug)?;
    let names = |args: &[&OsStr]| -> Result<Vec<(String, String)>, String> {
        Ok(tool("nm", args)?
            .lines()
            .filter_map(|l| {
                let mut cols = l.split_whitespace();
                Some((cols.next()?.to_string(), cols.next()?.to_string()))
            })
            .collect())
    };
    let posix = [os("--format=posix"), os("--defined-only")];
    let dynamic: Vec<String> = names(&[&posix[..], &[os("-D"), module.as_os_str()]].concat())?
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    let keep: Vec<String> = names(&[&posix[..], &[debug.as_os_str()]].concat())?
        .into_iter()
        .filter(|(n, kind)| (kind == "T" || kind == "t") && !dynamic.contains(n))
        .map(|(n, _)| n)
        .collect();
    if !keep.iter().any(|n| n == "spin_static") {
        return Err(format!(
            "spin_static is not among the symbols to keep: {keep:?}"
        ));
    }
    let keep_file = b.work.join("keep_symbols");
    std::fs::write(&keep_file, keep.join("\n") + "\n").map_err(|e| e.to_string())?;
    let mini = b.work.join("mini_debuginfo");
    let keep_arg = format!("--keep-symbols={}", keep_file.display());
    tool(
        "objcopy",
        &[
            os("-S"),
            os("--remove-section=.gdb_index"),
            os("--remove-section=.comment"),
            os(&keep_arg),
            debug.as_os_str(),
            mini.as_os_str(),
        ],
    )?;
    tool("xz", &[os("--keep"), mini.as_os_str()])?;
    let section = format!(".gnu_debugdata={}.xz", mini.display());
    tool(
        "objcopy",
        &[os("--add-section"), os(&section), module.as_os_str()],
    )?;
    let target = Target::start(interp, &b.dir, &[])?;
    // No debug directory with anything in it: the names can only come from .gnu_debugdata.
    let empty = b.work.join("no-debug-files");
    std::fs::create_dir_all(&empty).map_err(|e| e.to_string())?;
    let frames = ext_frames(target.pid, Some(&empty))?;
    expect(&frames, &b.module, Want::Named)?;
    Ok(format!("{} symbols from .gnu_debugdata", keep.len()))
}

#[test]
fn a_separate_debug_file_names_and_places_a_stripped_modules_functions() {
    for_each_chosen(separate_debug_file_check);
}

#[test]
fn mini_debuginfo_names_the_functions_dynsym_lacks() {
    for_each_chosen(mini_debuginfo_check);
}
