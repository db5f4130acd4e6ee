//! `scalene-rs dump --native` against live processes of every interpreter on the machine,
//! on stacks whose truth is known by construction.
//!
//! - fixtures/native/spinext.c, built by the test with each interpreter's own headers
//!   (Debian's chrooted 3.13 has none installed: those of another 3.13 build, the same ABI),
//!   called from a known line of fixtures/native/spin.py: the merged stack reads exactly
//!   `spin_inner`, `spin_static`, `spin_outer`, `spin` (the extension's method), then only
//!   the interpreter's own call frames, `caller` at its line, `<module>` at its line, then
//!   the interpreter's start-up frames down to `_start`. A thread the extension started
//!   without Python shows `native_worker_loop` then `native_worker`.
//! - The same extension stripped (`strip --strip-all`): its exported functions are named
//!   from `.dynsym`, the static ones are `spinext…so+0xOFFSET`, never another name.
//! - fixtures/native/qsort_zlib.py: Python → ctypes → libc's qsort → a Python comparator →
//!   zlib: innermost first, libz's frames, `compare` at its line, libffi's closure frames,
//!   a libc frame named `qsort…`, libffi's call frames, `<module>` at the qsort line.
//! - `--native` with `--nonblocking`, or without the permission to stop threads: one line
//!   on stderr and the documented exit code.
//!
//! Every test loops over every interpreter, collects failures with the interpreter's label
//! and fails at the end. Chrooted interpreters see /tmp (where the extension is built) and
//! the repository (the fixtures) at the same paths.

mod common;

use common::spinext::{build_ext, compile_ext, sysconfig};
use common::{Interpreter, Run};
use serde::Deserialize;
use std::path::Path;
use std::process::{Child, Command};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_scalene-rs");
const READY_TIMEOUT: Duration = Duration::from_secs(20);
const DUMP_TIMEOUT: Duration = Duration::from_secs(60);
/// How long to keep dumping until the thread is where the fixture sends it.
const SETTLE: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------------------------------
// The JSON `dump --native --json` prints (the fields these tests read).

#[derive(Deserialize, Debug)]
struct Dump {
    executable: String,
    threads: Vec<DThread>,
    native: Summary,
}

#[derive(Deserialize, Debug)]
struct Summary {
    merged: usize,
    unmerged: usize,
    other_threads: Vec<OtherThread>,
}

#[derive(Deserialize, Debug)]
struct OtherThread {
    frames: Vec<NFrame>,
}

#[derive(Deserialize, Debug)]
struct DThread {
    frames: Vec<PyFrame>,
    native: View,
}

#[derive(Deserialize, Debug)]
struct View {
    merged: bool,
    truncated: bool,
    stack: Vec<Entry>,
    #[serde(default)]
    unmerged: Option<String>,
    #[serde(default)]
    unwind_stopped: Option<String>,
}

#[derive(Deserialize, Debug, Clone)]
#[serde(tag = "kind", rename_all = "lowercase")]
enum Entry {
    Python(PyFrame),
    Native(NFrame),
}

#[derive(Deserialize, Debug, Clone)]
struct PyFrame {
    function: String,
    filename: String,
    line: Option<i64>,
}

#[derive(Deserialize, Debug, Clone)]
struct NFrame {
    symbol: Option<String>,
    module: Option<String>,
    offset: u64,
    file: Option<String>,
    line: Option<i64>,
    #[serde(default)]
    module_note: Option<String>,
}

impl Entry {
    fn native(&self) -> Option<&NFrame> {
        match self {
            Entry::Native(f) => Some(f),
            Entry::Python(_) => None,
        }
    }
    fn python(&self) -> Option<&PyFrame> {
        match self {
            Entry::Python(f) => Some(f),
            Entry::Native(_) => None,
        }
    }
}

impl std::fmt::Display for Entry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Entry::Python(p) => write!(f, "{} ({}:{:?})", p.function, p.filename, p.line),
            Entry::Native(n) => write!(
                f,
                "{} [{}+{:#x}]",
                n.symbol.as_deref().unwrap_or("?"),
                n.module.as_deref().unwrap_or("?"),
                n.offset
            ),
        }
    }
}

fn show(stack: &[Entry]) -> String {
    stack
        .iter()
        .enumerate()
        .map(|(i, e)| format!("    #{i} {e}"))
        .collect::<Vec<_>>()
        .join("\n")
}

// ---------------------------------------------------------------------------------------
// Running things.

/// A fixture process; killed and reaped when dropped.
struct Target {
    child: Child,
    pid: i32,
    lines: Receiver<String>,
    stderr: Option<std::thread::JoinHandle<String>>,
}

impl Target {
    fn start(interp: &Interpreter, script: &Path, args: &[&str]) -> Result<Target, String> {
        let f = common::start_fixture(interp, script, args, false)?;
        let mut t = Target {
            child: f.child,
            pid: f.pid,
            lines: f.lines,
            stderr: Some(f.stderr),
        };
        match t.lines.recv_timeout(READY_TIMEOUT) {
            Ok(line) if line == "ready" => Ok(t),
            other => {
                let _ = t.child.kill();
                let _ = t.child.wait();
                let err = t.stderr.take().map(|h| h.join().unwrap_or_default());
                Err(format!(
                    "{} did not print `ready` ({other:?}); stderr: {}",
                    script.display(),
                    err.unwrap_or_default()
                ))
            }
        }
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn dump(args: &[&str]) -> Run {
    let mut cmd = Command::new(BIN);
    cmd.arg("dump").args(args);
    common::run_limited(cmd, DUMP_TIMEOUT)
}

/// `dump --native --json` of `pid`, again until `settled` says the thread of interest is
/// where the fixture sends it (it may still be on its way, or between two calls), within
/// [`SETTLE`]. Returns the dump and how many tries it took.
fn dump_until(pid: i32, settled: impl Fn(&Dump) -> bool) -> Result<(Dump, usize), String> {
    let deadline = Instant::now() + SETTLE;
    let mut tries = 0;
    loop {
        tries += 1;
        let run = dump(&["--native", "--json", &pid.to_string()]);
        if run.code != Some(0) {
            return Err(format!("dump --native --json: {}", run.describe()));
        }
        let d: Dump = serde_json::from_str(&run.stdout)
            .map_err(|e| format!("unparsable JSON ({e}): {}", run.stdout))?;
        if settled(&d) || Instant::now() > deadline {
            return Ok((d, tries));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether a native frame belongs to the interpreter itself (its executable, libpython),
/// the C library or the dynamic loader.
fn is_runtime(f: &NFrame, exe: &str) -> bool {
    let m = f.module.as_deref().unwrap_or("");
    m == exe || m.starts_with("libpython") || m.starts_with("libc.so") || m.starts_with("ld-linux")
}

/// The line of `# MARK: label` in a fixture.
fn mark(script: &str, label: &str) -> i64 {
    common::mark(&common::fixture(script), label) as i64
}

// ---------------------------------------------------------------------------------------
// The checks.

/// The lines of spinext.c each of the extension's four frames may be at (`# MARK:`s): the
/// innermost anywhere in its loop, the others at their call.
fn spin_lines() -> [Vec<i64>; 4] {
    let c = |label: &str| mark("native/spinext.c", label);
    [
        vec![c("inner-loop"), c("inner-step")],
        vec![c("static-call")],
        vec![c("outer-call")],
        vec![c("spin-call")],
    ]
}

/// The thread running `caller`, innermost first, checked frame by frame; `names` are the
/// extension's four frames as they must read (`None`: no symbol, shown by offset), with
/// their file and line from its DWARF when `lines`.
fn check_spin(
    d: &Dump,
    ext: &str,
    names: [Option<&str>; 4],
    lines: bool,
) -> Result<String, String> {
    let exe = Path::new(&d.executable)
        .file_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let t = d
        .threads
        .iter()
        .find(|t| t.frames.iter().any(|f| f.function == "caller"))
        .ok_or("no thread runs `caller`")?;
    let v = &t.native;
    let stack = &v.stack;
    let fail = |why: String| Err(format!("{why}\n{}", show(stack)));
    if !v.merged {
        return fail(format!("not merged: {:?}", v.unmerged));
    }
    if let Some(why) = &v.unwind_stopped {
        return fail(format!("the unwinding stopped: {why}"));
    }
    // The extension's four frames, exactly.
    for (i, want) in names.iter().enumerate() {
        let Some(f) = stack.get(i).and_then(Entry::native) else {
            return fail(format!("frame #{i} is not native"));
        };
        if f.module.as_deref() != Some(ext) || f.symbol.as_deref() != *want {
            return fail(format!("frame #{i}: want {want:?} in {ext}"));
        }
        let source = common::fixture("native/spinext.c").display().to_string();
        let at = (f.file.as_deref(), f.line);
        let right = if lines {
            at.0 == Some(source.as_str()) && at.1.is_some_and(|l| spin_lines()[i].contains(&l))
        } else {
            at == (None, None)
        };
        if !right {
            return fail(format!(
                "frame #{i} at {at:?}: want {}",
                if lines {
                    format!("{source}:{:?}", spin_lines()[i])
                } else {
                    "no line (stripped)".into()
                }
            ));
        }
    }
    // Then the interpreter's call frames, `caller` at its line, more of the interpreter's,
    // `<module>` at its line, then the start-up frames.
    let script = common::fixture("native/spin.py").display().to_string();
    let want_py = [
        ("caller", mark("native/spin.py", "call")),
        ("<module>", mark("native/spin.py", "module")),
    ];
    let mut next_py = 0;
    for (i, e) in stack.iter().enumerate().skip(4) {
        match e {
            Entry::Python(p) => {
                let Some(&(func, line)) = want_py.get(next_py) else {
                    return fail(format!("frame #{i}: a Python frame past <module>"));
                };
                if p.function != func || p.line != Some(line) || p.filename != script {
                    return fail(format!("frame #{i}: want {func} at {script}:{line}"));
                }
                next_py += 1;
            }
            Entry::Native(n) if !is_runtime(n, &exe) => {
                return fail(format!("frame #{i}: not the interpreter's or libc's"));
            }
            Entry::Native(_) => {}
        }
    }
    if next_py != want_py.len() {
        return fail("caller and <module> are not both there".into());
    }
    // Every file read is the one loaded (chrooted interpreters: the root's, not ours).
    if let Some(f) = stack
        .iter()
        .filter_map(Entry::native)
        .find(|f| f.module_note.is_some())
    {
        return fail(format!("{:?}: {:?}", f.module, f.module_note));
    }
    let last = stack.last().and_then(Entry::native);
    if last.and_then(|f| f.symbol.as_deref()) != Some("_start") {
        return fail("the stack does not end at _start".into());
    }
    if d.native.unmerged != 0 || d.native.merged != d.threads.len() {
        return fail(format!(
            "merged on {} threads, unmerged on {}",
            d.native.merged, d.native.unmerged
        ));
    }
    Ok(format!("{} frames", stack.len()))
}

/// The thread that never ran Python: `native_worker_loop` then `native_worker` (named when
/// `named`, else by offset in the extension).
fn check_worker(d: &Dump, ext: &str, named: bool) -> Result<(), String> {
    let found = d.native.other_threads.iter().any(|t| {
        t.frames.windows(2).any(|w| {
            let in_ext = |f: &NFrame| f.module.as_deref() == Some(ext);
            in_ext(&w[0])
                && in_ext(&w[1])
                && w[0].symbol.as_deref() == Some("native_worker_loop")
                && w[1].symbol.as_deref() == named.then_some("native_worker")
        })
    });
    if found {
        Ok(())
    } else {
        Err(format!(
            "no thread without Python shows native_worker_loop then native_worker: {:?}",
            d.native.other_threads
        ))
    }
}

/// Whether thread `t`'s innermost frame is the native function `symbol`.
fn innermost_is(t: &DThread, symbol: &str) -> bool {
    t.native
        .stack
        .first()
        .and_then(Entry::native)
        .and_then(|f| f.symbol.as_deref())
        == Some(symbol)
}

fn spin_check(interp: &Interpreter, strip: bool) -> Result<String, String> {
    let (dir, ext) = build_ext(interp, strip)?;
    let dir_s = dir.display().to_string();
    let target = Target::start(
        interp,
        &common::fixture("native/spin.py"),
        &[&dir_s, "thread"],
    )?;
    // The main thread in spin_inner (exported: named even when stripped), the other in
    // its loop (it may still be starting when the fixture says it is ready).
    let in_spin = |d: &Dump| {
        d.threads.iter().any(|t| innermost_is(t, "spin_inner"))
            && check_worker(d, &ext, !strip).is_ok()
    };
    let (d, tries) = dump_until(target.pid, in_spin)?;
    // Stripped, the static functions have no name: only .dynsym's are left.
    let names = if strip {
        [Some("spin_inner"), None, Some("spin_outer"), None]
    } else {
        [
            Some("spin_inner"),
            Some("spin_static"),
            Some("spin_outer"),
            Some("spin"),
        ]
    };
    let summary = check_spin(&d, &ext, names, !strip)?;
    check_worker(&d, &ext, !strip)?;
    // Nothing in the extension is ever given another function's name.
    let exported = ["spin_inner", "spin_outer", "native_worker_loop"];
    let all_static = ["spin_static", "spin", "native_worker"];
    let allowed: Vec<&str> = if strip {
        exported.to_vec()
    } else {
        exported.iter().chain(&all_static).copied().collect()
    };
    let python = d
        .threads
        .iter()
        .flat_map(|t| t.native.stack.iter().filter_map(Entry::native));
    let others = d.native.other_threads.iter().flat_map(|t| t.frames.iter());
    for f in python.chain(others) {
        let name = f
            .symbol
            .as_deref()
            .filter(|_| f.module.as_deref() == Some(ext.as_str()));
        if let Some(name) = name.filter(|n| !allowed.contains(n)) {
            return Err(format!("a frame of {ext} is named {name}"));
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(format!("{summary}, merged after {tries} dump(s)"))
}

#[test]
fn spin_extension_frames_are_exact() {
    common::for_each_interpreter(|interp| spin_check(interp, false));
}

#[test]
fn stripped_extension_frames_are_named_from_dynsym_or_by_offset() {
    common::for_each_interpreter(|interp| spin_check(interp, true));
}

/// What one stretch of a stack must show, and the test of a frame for it.
type Step<'a> = (&'a str, &'a dyn Fn(&Entry) -> bool);

#[test]
fn qsort_with_a_python_comparator_that_calls_zlib() {
    let script = "native/qsort_zlib.py";
    let compress = mark(script, "compress");
    let qsort = mark(script, "qsort");
    common::for_each_interpreter(|interp| {
        let target = Target::start(interp, &common::fixture(script), &[])?;
        let in_zlib = |d: &Dump| {
            d.threads.iter().any(|t| {
                t.native.merged
                    && t.native
                        .stack
                        .first()
                        .and_then(Entry::native)
                        .is_some_and(|f| {
                            f.module
                                .as_deref()
                                .is_some_and(|m| m.starts_with("libz.so"))
                        })
            })
        };
        let (d, tries) = dump_until(target.pid, in_zlib)?;
        let t = d
            .threads
            .iter()
            .find(|t| t.frames.iter().any(|f| f.function == "compare"))
            .ok_or("no thread runs `compare`")?;
        let stack = &t.native.stack;
        let fail = |why: &str| Err(format!("{why} ({tries} dumps)\n{}", show(stack)));
        if !t.native.merged {
            return fail(&format!("not merged: {:?}", t.native.unmerged));
        }
        let ffi = |e: &Entry| {
            e.native().is_some_and(|f| {
                f.module.as_deref().is_some_and(|m| m.contains("ffi"))
                    || f.symbol.as_deref().is_some_and(|s| s.starts_with("ffi_"))
            })
        };
        let file = common::fixture(script).display().to_string();
        let py_at = |e: &Entry, func: &str, line: i64| {
            e.python()
                .is_some_and(|p| p.function == func && p.line == Some(line) && p.filename == file)
        };
        // Innermost first: zlib, compare, libffi's closure, qsort, libffi's call, <module>.
        let steps: [Step; 6] = [
            ("libz's frames", &|e: &Entry| {
                e.native().is_some_and(|f| {
                    f.module
                        .as_deref()
                        .is_some_and(|m| m.starts_with("libz.so"))
                })
            }),
            ("compare at its line", &|e: &Entry| {
                py_at(e, "compare", compress)
            }),
            ("libffi's closure frames", &ffi),
            ("qsort", &|e: &Entry| {
                e.native().is_some_and(|f| {
                    f.module
                        .as_deref()
                        .is_some_and(|m| m.starts_with("libc.so"))
                        && f.symbol.as_deref().is_some_and(|s| s.contains("qsort"))
                })
            }),
            ("libffi's call frames", &ffi),
            ("<module> at the qsort line", &|e: &Entry| {
                py_at(e, "<module>", qsort)
            }),
        ];
        if !steps[0].1(&stack[0]) {
            return fail("the innermost frame is not libz's");
        }
        let mut at = 0;
        for (what, is) in steps {
            match stack[at..].iter().position(is) {
                Some(i) => at += i + 1,
                None => return fail(&format!("no {what} after frame #{at}")),
            }
        }
        // The Python frames are the interpreter's own, in order, and nothing else is.
        let py: Vec<&str> = stack
            .iter()
            .filter_map(Entry::python)
            .map(|p| p.function.as_str())
            .collect();
        if py != ["compare", "<module>"] {
            return fail(&format!("Python frames {py:?}"));
        }
        Ok(format!("{} frames, {tries} dump(s)", stack.len()))
    });
}

/// The Python frames of a merged stack, as (function, line).
fn python_frames(stack: &[Entry]) -> Vec<(&str, Option<i64>)> {
    stack
        .iter()
        .filter_map(Entry::python)
        .map(|p| (p.function.as_str(), p.line))
        .collect()
}

/// Four Python threads in C at once (the GIL released): each one's stack exact, the main
/// thread's (joining) merged too.
#[test]
fn four_threads_in_native_code_at_once() {
    let released = mark("native/spin.py", "released");
    common::for_each_interpreter(|interp| {
        let (dir, ext) = build_ext(interp, false)?;
        let args = [dir.to_str().unwrap(), "threads4"];
        let target = Target::start(interp, &common::fixture("native/spin.py"), &args)?;
        let spinning = |t: &DThread| innermost_is(t, "spin_inner");
        let (d, tries) = dump_until(target.pid, |d| {
            d.threads.iter().filter(|t| spinning(t)).count() == 4
        })?;
        let workers: Vec<&DThread> = d.threads.iter().filter(|t| spinning(t)).collect();
        if workers.len() != 4 {
            return Err(format!(
                "{} threads in spin_inner after {tries} dumps",
                workers.len()
            ));
        }
        let want = ["spin_inner", "spin_static", "spin_outer", "spin_released"];
        for t in &workers {
            let stack = &t.native.stack;
            let names: Vec<Option<&str>> = stack[..4]
                .iter()
                .map(|e| {
                    e.native()
                        .filter(|f| f.module.as_deref() == Some(ext.as_str()))
                })
                .map(|f| f.and_then(|f| f.symbol.as_deref()))
                .collect();
            let py = python_frames(stack);
            if !t.native.merged
                || names != want.map(Some)
                || py.first() != Some(&("worker", Some(released)))
            {
                return Err(format!(
                    "a worker's stack: {:?}\n{}",
                    t.native.unmerged,
                    show(stack)
                ));
            }
        }
        if d.native.merged != d.threads.len() {
            return Err(format!(
                "merged on {} of {} threads",
                d.native.merged,
                d.threads.len()
            ));
        }
        let _ = std::fs::remove_dir_all(&dir);
        Ok(format!("{} threads merged", d.threads.len()))
    });
}

/// A recursion through C at every level, 500 deep (fixtures/native/spin.py's `deep`):
/// every level's Python frame, each with the extension's `call_python` frame between it
/// and the next; cut with `--max-depth` (Python frames) or `--max-native-depth` (native
/// frames), merged as far as it goes and marked truncated, never unmerged.
#[test]
fn deep_recursion_through_c_merges_whole_and_cut() {
    let (bottom, recurse) = (
        mark("native/spin.py", "bottom"),
        mark("native/spin.py", "recurse"),
    );
    // spin.py's DEPTH.
    const DEPTH: usize = 500;
    // Where the native stack is cut: well inside the recursion (about 8 native frames a
    // level), past the extension's frames.
    const NATIVE_CUT: usize = 1000;
    common::for_each_interpreter(|interp| {
        let (dir, _ext) = build_ext(interp, false)?;
        let args = [dir.to_str().unwrap(), "deep"];
        let target = Target::start(interp, &common::fixture("native/spin.py"), &args)?;
        let at_bottom = |d: &Dump| d.threads.iter().any(|t| innermost_is(t, "spin_inner"));
        let (d, tries) = dump_until(target.pid, at_bottom)?;
        let t = &d.threads[0];
        let stack = &t.native.stack;
        if !t.native.merged || t.native.truncated {
            return Err(format!("{:?} after {tries} dumps", t.native.unmerged));
        }
        let py = python_frames(stack);
        let mut want = vec![("deep", Some(bottom))];
        want.extend(std::iter::repeat_n(("deep", Some(recurse)), DEPTH));
        want.push(("<module>", Some(mark("native/spin.py", "deep"))));
        if py != want {
            return Err(format!(
                "{} Python frames, not the {} expected",
                py.len(),
                want.len()
            ));
        }
        // Between two levels, the extension's call_python frame, once.
        let mut between = 0;
        for e in stack.iter().skip_while(|e| e.python().is_none()) {
            match e {
                Entry::Python(p) if p.function == "deep" => {
                    if between > 1 {
                        return Err("two call_python frames between two levels".into());
                    }
                    between = 0;
                }
                Entry::Native(f) if f.symbol.as_deref() == Some("call_python") => between += 1,
                _ => {}
            }
        }
        let calls = stack
            .iter()
            .filter(|e| e.native().and_then(|f| f.symbol.as_deref()) == Some("call_python"))
            .count();
        if calls != DEPTH {
            return Err(format!("{calls} call_python frames for {DEPTH} levels"));
        }
        // Cut at 50 Python frames: merged as far as it goes, and said.
        let run = dump(&[
            "--native",
            "--json",
            "--max-depth",
            "50",
            &target.pid.to_string(),
        ]);
        let cut: Dump = serde_json::from_str(&run.stdout)
            .map_err(|e| format!("--max-depth 50: {e}: {}", run.describe()))?;
        let v = &cut.threads[0].native;
        let n = python_frames(&v.stack).len();
        if !v.merged || !v.truncated || n == 0 || n > 50 {
            return Err(format!(
                "--max-depth 50: merged {}, truncated {}, {n} Python frames: {:?}",
                v.merged, v.truncated, v.unmerged
            ));
        }
        // Cut at NATIVE_CUT native frames: the innermost calls merged, each of them one
        // native frame replaced by one Python frame, so exactly NATIVE_CUT entries; on a
        // tail-call build two (the handler of the CALL instruction goes with the loop's
        // frame), so one entry fewer for each Python frame.
        let cut_args = ["--native", "--json", "--max-native-depth"];
        let limit = NATIVE_CUT.to_string();
        let pid = target.pid.to_string();
        let run = dump(&[&cut_args[..], &[limit.as_str(), pid.as_str()]].concat());
        let cut: Dump = serde_json::from_str(&run.stdout)
            .map_err(|e| format!("--max-native-depth: {e}: {}", run.describe()))?;
        let v = &cut.threads[0].native;
        let py = python_frames(&v.stack);
        let hidden = if interp.tail_call()? { py.len() } else { 0 };
        if !v.merged
            || !v.truncated
            || v.stack.len() + hidden != NATIVE_CUT
            || !innermost_is(&cut.threads[0], "spin_inner")
            || py.is_empty()
            || py.len() >= want.len()
            || py[..] != want[..py.len()]
        {
            return Err(format!(
                "--max-native-depth {NATIVE_CUT}: merged {}, truncated {}, {} entries, {} \
                 Python frames: {:?}",
                v.merged,
                v.truncated,
                v.stack.len(),
                py.len(),
                v.unmerged
            ));
        }
        // The text says where it was cut: after the frames it shows.
        let run = dump(&["--native", "--max-native-depth", &limit, &pid]);
        let said = format!("... stack truncated after {} frames", NATIVE_CUT - hidden);
        if !run.stdout.contains(&said) {
            return Err(format!("no {said:?} in the text: {}", run.describe()));
        }
        let _ = std::fs::remove_dir_all(&dir);
        Ok(format!(
            "{} frames, {n} Python frames when cut at 50, {} when cut at {NATIVE_CUT} native",
            stack.len(),
            py.len()
        ))
    });
}

/// The extension is replaced on disk (by rename, as installers do) while loaded, by a build
/// with another build id. Read through the mapped file itself (map_files), its frames keep
/// their names and say that the file changed on disk. Without CAP_SYS_ADMIN and
/// CAP_CHECKPOINT_RESTORE (no map_files),
/// only the new file at its path is there: its build id is not the one loaded, so it is
/// not read for names (frames by offset, saying why), and the merge stands.
#[test]
fn an_extension_replaced_on_disk_is_never_named_from_the_new_file() {
    common::for_each_interpreter(|interp| {
        let (inc, _) = sysconfig(interp)?;
        let (dir, ext) = build_ext(interp, false)?;
        let target = Target::start(
            interp,
            &common::fixture("native/spin.py"),
            &[dir.to_str().unwrap()],
        )?;
        let in_spin = |d: &Dump| d.threads.iter().any(|t| innermost_is(t, "spin_inner"));
        dump_until(target.pid, in_spin)?;
        let fresh = dir.join("variant.so");
        compile_ext(interp, &inc, &fresh, &["-DSPINEXT_VARIANT"])?;
        std::fs::rename(&fresh, dir.join(&ext)).map_err(|e| e.to_string())?;
        let ext_frames = |d: &Dump| -> Vec<NFrame> {
            d.threads[0]
                .native
                .stack
                .iter()
                .filter_map(Entry::native)
                .filter(|f| f.module.as_deref() == Some(ext.as_str()))
                .cloned()
                .collect()
        };
        let (d, _) = dump_until(target.pid, |_| true)?;
        let frames = ext_frames(&d);
        let names: Vec<Option<&str>> = frames.iter().map(|f| f.symbol.as_deref()).collect();
        if names
            != [
                Some("spin_inner"),
                Some("spin_static"),
                Some("spin_outer"),
                Some("spin"),
            ]
            || !frames.iter().all(|f| {
                f.module_note
                    .as_deref()
                    .is_some_and(|n| n.contains("replaced"))
            })
        {
            return Err(format!("read through map_files: {frames:?}"));
        }
        if interp.root.is_some() {
            // Chrooted: without CAP_SYS_ADMIN its files are out of reach altogether.
            return Ok("named from the loaded file".into());
        }
        let mut cmd = Command::new("setpriv");
        // Opening map_files takes CAP_SYS_ADMIN or CAP_CHECKPOINT_RESTORE.
        let caps = "-sys_admin,-checkpoint_restore";
        cmd.args([
            &format!("--inh-caps={caps}"),
            &format!("--bounding-set={caps}"),
        ])
        .args([
            "--",
            BIN,
            "dump",
            "--native",
            "--json",
            &target.pid.to_string(),
        ]);
        let run = common::run_limited(cmd, DUMP_TIMEOUT);
        let d: Dump = serde_json::from_str(&run.stdout)
            .map_err(|e| format!("without CAP_SYS_ADMIN: {e}: {}", run.describe()))?;
        let frames = ext_frames(&d);
        let noted = |f: &NFrame| {
            f.module_note
                .as_deref()
                .is_some_and(|n| n.contains("changed on disk"))
        };
        if frames.len() != 4
            || !frames.iter().all(|f| f.symbol.is_none() && noted(f))
            || !d.threads[0].native.merged
        {
            return Err(format!(
                "without map_files: {frames:?}\n{}",
                show(&d.threads[0].native.stack)
            ));
        }
        let _ = std::fs::remove_dir_all(&dir);
        Ok("named from the loaded file; by offset when only the new one is there".into())
    });
}

#[test]
fn native_with_nonblocking_is_a_usage_error_on_one_line() {
    let run = dump(&["--native", "--nonblocking", "1"]);
    let lines: Vec<&str> = run.stderr.lines().collect();
    assert_eq!(run.code, Some(2), "{}", run.describe());
    assert_eq!(lines.len(), 1, "{}", run.describe());
    assert!(
        lines[0].starts_with("error: --native") && lines[0].contains("--nonblocking"),
        "{}",
        run.describe()
    );
}

/// Root without CAP_SYS_PTRACE (a container started without `--cap-add SYS_PTRACE`) may
/// not stop a process's threads: `dump --native` says so on one line, exit 5.
#[test]
fn native_without_permission_to_stop_threads_fails_on_one_line() {
    const TEST: &str = "native_without_permission_to_stop_threads_fails_on_one_line";
    if !nix::unistd::geteuid().is_root() {
        return common::skip_or_fail(TEST, "not running as root");
    }
    if Command::new("setpriv").arg("--version").output().is_err() {
        return common::skip_or_fail(TEST, "no setpriv (util-linux)");
    }
    let interp = common::interpreters()
        .into_iter()
        .find(|i| i.major == 3 && i.root.is_none())
        .expect("a Python 3 in the matrix");
    let target = Target::start(&interp, &common::fixture("native/qsort_zlib.py"), &[]).unwrap();
    let mut cmd = Command::new("setpriv");
    cmd.args([
        "--inh-caps=-sys_ptrace",
        "--bounding-set=-sys_ptrace",
        "--",
        BIN,
        "dump",
    ])
    .args(["--native", &target.pid.to_string()]);
    let run = common::run_limited(cmd, DUMP_TIMEOUT);
    let lines: Vec<&str> = run.stderr.lines().collect();
    assert_eq!(run.code, Some(5), "{}", run.describe());
    assert_eq!(lines.len(), 1, "{}", run.describe());
    assert!(
        lines[0].contains(&target.pid.to_string()) && lines[0].contains("CAP_SYS_PTRACE"),
        "{}",
        run.describe()
    );
}

/// The human text carries the same: the merge line, the extension's frames with their
/// module, the Python frames with their lines.
#[test]
fn text_shows_the_merged_stack() {
    let interp = common::interpreters()
        .into_iter()
        .rev()
        .find(|i| i.major == 3 && i.root.is_none())
        .expect("a Python 3 in the matrix");
    let (dir, ext) = build_ext(&interp, false).unwrap();
    let target = Target::start(
        &interp,
        &common::fixture("native/spin.py"),
        &[&dir.display().to_string()],
    )
    .unwrap();
    let deadline = Instant::now() + SETTLE;
    let text = loop {
        let run = dump(&["--native", &target.pid.to_string()]);
        assert_eq!(run.code, Some(0), "{}", run.describe());
        if run.stdout.contains("spin_inner") || Instant::now() > deadline {
            break run.stdout;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let line = mark("native/spin.py", "call");
    let script = common::fixture("native/spin.py").display().to_string();
    let source = common::fixture("native/spinext.c").display().to_string();
    let static_call = mark("native/spinext.c", "static-call");
    for want in [
        "Native frames merged with Python's on 1 of 1 threads".to_string(),
        format!("#0   spin_inner ({source}:"),
        format!("#1   spin_static ({source}:{static_call}) [{ext}]"),
        format!("caller ({script}:{line})"),
    ] {
        assert!(text.contains(&want), "no {want:?} in:\n{text}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
