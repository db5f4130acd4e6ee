//! `dump --locals` on every interpreter of the matrix (fixtures/dump_locals.py): the locals
//! of three parked frames (`leaf`, a closure `inner`, `outer`), values of every kind the
//! dump shows (a list of 10**6 items, a 1 MiB str, a dict that holds itself, big ints,
//! floats, bytes, sets, an instance, a cell and a free variable, a non-ASCII name on 3.x),
//! must equal, in JSON and in text, the truth the fixture wrote itself (its own reprs under
//! the same bounds), under the default bounds and under tight ones. And a thread that
//! rebuilds a tuple `(i, i * 2)` in a loop shows a consistent pair in every dump.

mod common;

use common::Killed as Target;

use common::Interpreter;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

/// How long the fixture may take to print `ready` (a list of 10**6 items, on a busy machine).
const READY: Duration = Duration::from_secs(60);

/// The bounds checked: `dump`'s defaults, then tight ones.
const BOUNDS: [(usize, usize); 2] = [(2, 32), (1, 5)];

/// Dumps of the mutating thread taken.
const MUTATION_DUMPS: usize = 5;

#[derive(Deserialize)]
struct Dump {
    threads: Vec<DThread>,
}

#[derive(Deserialize)]
struct DThread {
    frames: Vec<DFrame>,
}

#[derive(Deserialize)]
struct DFrame {
    function: String,
    line: Option<u32>,
    locals: Option<Vec<DLocal>>,
    locals_error: Option<String>,
}

#[derive(Deserialize, Debug, PartialEq)]
struct DLocal {
    name: String,
    kind: String,
    #[serde(rename = "type")]
    type_name: Option<String>,
    repr: String,
    address: String,
}

/// A frame as the fixture says the dump must show it.
#[derive(Deserialize)]
struct TruthFrame {
    line: u32,
    /// `[name, kind, type, repr, address]` each.
    locals: Vec<(String, String, String, String, String)>,
}

fn dump(pid: i32, json: bool, (depth, len): (usize, usize)) -> Result<String, String> {
    let mut cmd = Command::new(common::bin());
    cmd.args(["dump", "--locals", &pid.to_string()]);
    cmd.args(["--locals-depth", &depth.to_string()]);
    cmd.args(["--locals-len", &len.to_string()]);
    if json {
        cmd.arg("--json");
    }
    let r = common::run_limited(cmd, Duration::from_secs(60));
    if r.code != Some(0) {
        return Err(format!("dump --locals: {}", r.describe()));
    }
    Ok(r.stdout)
}

/// The frame whose function is `name` (3.11+: its qualified name ends with it).
fn frame<'a>(d: &'a Dump, name: &str) -> Option<&'a DFrame> {
    let is = |f: &&DFrame| f.function == name || f.function.ends_with(&format!(".{name}"));
    d.threads.iter().flat_map(|t| t.frames.iter()).find(is)
}

/// The JSON and text of one dump under `bounds` against the truth.
fn check_bounds(
    pid: i32,
    bounds: (usize, usize),
    truth: &BTreeMap<String, TruthFrame>,
    py: &Interpreter,
) -> Result<usize, String> {
    let json = dump(pid, true, bounds)?;
    let d: Dump = serde_json::from_str(&json).map_err(|e| format!("{e}: {json}"))?;
    let text = dump(pid, false, bounds)?;
    let mut errs = Vec::new();
    let mut checked = 0;
    for (name, want) in truth {
        let Some(f) = frame(&d, name) else {
            errs.push(format!("{bounds:?}: no frame {name} in {json}"));
            continue;
        };
        if f.line != Some(want.line) {
            errs.push(format!("{name}: line {:?}, want {}", f.line, want.line));
        }
        let want_locals: Vec<DLocal> = want
            .locals
            .iter()
            .map(|(n, k, t, r, a)| DLocal {
                name: n.clone(),
                kind: k.clone(),
                type_name: Some(t.clone()),
                repr: r.clone(),
                address: a.clone(),
            })
            .collect();
        match (&f.locals, &f.locals_error) {
            (Some(got), _) if *got == want_locals => checked += got.len(),
            (Some(got), _) => {
                for (i, w) in want_locals.iter().enumerate() {
                    if got.get(i) != Some(w) {
                        errs.push(format!(
                            "{bounds:?} {name}: #{i} {:?}, want {w:?}",
                            got.get(i)
                        ));
                    }
                }
                if got.len() != want_locals.len() {
                    errs.push(format!(
                        "{bounds:?} {name}: {} locals, want {}",
                        got.len(),
                        want_locals.len()
                    ));
                }
            }
            (None, e) => errs.push(format!("{name}: no locals ({e:?})")),
        }
        // Text: the frame's line, then its locals one per line, in the same order.
        let lines: Vec<String> = want_locals
            .iter()
            .map(|l| format!("         {:<5} {} = {}", l.kind, l.name, l.repr))
            .collect();
        let block = lines.join("\n");
        let header = format!(":{})\n", want.line);
        let found = text
            .match_indices(&header)
            .any(|(at, h)| text[at + h.len()..].starts_with(&format!("{block}\n")));
        if !found {
            errs.push(format!(
                "{bounds:?} {name}: text has no frame line ending in {header:?} followed by\n\
                 {block}\n--- text:\n{text}"
            ));
        }
    }
    if py.major >= 3 && !json.contains("n\u{e4}me_\u{4e2d}") {
        errs.push("the non-ASCII local is missing".into());
    }
    if errs.is_empty() {
        Ok(checked)
    } else {
        Err(errs.join("\n"))
    }
}

/// The mutating thread's `pair`, in every one of several dumps, is `(i, 2 * i)`.
fn check_mutation(pid: i32) -> Result<usize, String> {
    let mut pairs = 0;
    for _ in 0..MUTATION_DUMPS {
        let json = dump(pid, true, BOUNDS[0])?;
        let d: Dump = serde_json::from_str(&json).map_err(|e| e.to_string())?;
        let f = frame(&d, "mutate").ok_or(format!("no mutate frame in {json}"))?;
        let locals = f
            .locals
            .as_ref()
            .ok_or(format!("mutate: {:?}", f.locals_error))?;
        let Some(pair) = locals.iter().find(|l| l.name == "pair") else {
            continue;
        };
        let inner = pair
            .repr
            .strip_prefix('(')
            .and_then(|r| r.strip_suffix(')'))
            .ok_or(format!("pair is {:?}", pair.repr))?;
        let nums: Vec<u64> = inner
            .split(", ")
            .map(|n| n.parse().map_err(|_| format!("pair is {:?}", pair.repr)))
            .collect::<Result<_, _>>()?;
        if nums.len() != 2 || nums[1] != 2 * nums[0] {
            return Err(format!("pair {:?} is no value the loop made", pair.repr));
        }
        pairs += 1;
    }
    if pairs == 0 {
        return Err(format!("no dump of {MUTATION_DUMPS} showed `pair`"));
    }
    Ok(pairs)
}

fn check(py: &Interpreter) -> Result<String, String> {
    let dir = common::tempdir("dump-locals");
    let truth_file = dir.join("truth.json");
    let mut args = vec![truth_file.to_string_lossy().into_owned()];
    args.extend(BOUNDS.iter().map(|(d, l)| format!("{d},{l}")));
    let script = common::fixture("dump_locals.py");
    let t = Target(common::start_fixture(py, &script, &args, false)?);
    t.0.lines_until_ready(READY)?;
    let text = std::fs::read_to_string(&truth_file).map_err(|e| format!("truth: {e}"))?;
    let truth: BTreeMap<String, BTreeMap<String, TruthFrame>> =
        serde_json::from_str(&text).map_err(|e| format!("truth: {e}: {text}"))?;
    let mut summary = Vec::new();
    for bounds in BOUNDS {
        let key = format!("{},{}", bounds.0, bounds.1);
        let frames = truth.get(&key).ok_or(format!("no truth for {key}"))?;
        let n = check_bounds(t.0.pid, bounds, frames, py)?;
        summary.push(format!("{n} locals under {key}"));
    }
    let pairs = check_mutation(t.0.pid)?;
    summary.push(format!("{pairs} consistent pairs"));
    let _ = std::fs::remove_dir_all(&dir);
    Ok(summary.join(", "))
}

#[test]
fn locals_equal_the_fixtures_own_reprs() {
    common::for_each_interpreter(check);
}

#[test]
fn locals_are_refused_with_native_and_nonblocking() {
    for extra in ["--native", "--nonblocking", "--async"] {
        let out = Command::new(common::bin())
            .args(["dump", "--locals", extra, &std::process::id().to_string()])
            .output()
            .expect("runs");
        assert_eq!(out.status.code(), Some(2), "{extra}: {out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("--locals cannot be combined"),
            "{extra}: {err}"
        );
        assert_eq!(err.trim_end().lines().count(), 1, "{extra}: {err}");
    }
}
