//! `dump --native` of a process in other namespaces (see tests/containers.rs): its native
//! frames must be named from the files it mapped, never from ours of the same path.
//!
//! The target is fixtures/native/spin.py, which calls the extension fixtures/native/spinext.c
//! (built for the interpreter) from a known line and spins there: its stack is known by
//! construction. In the case `same_path_other_build_on_host`, the file holding the
//! interpreter is another CPython's libpython on our side at the same path, and the
//! extension's path holds on our side another build of it (`-DSPINEXT_VARIANT`, another
//! build id): every frame must still be named from the target's files — each frame of the
//! interpreter by the symbol that covers its address in the target's file (from `nm`; no
//! name where it has none, as for a stripped executable's static functions), at least one
//! of them where our decoy has no such symbol, the extension's four frames by
//! their names, and no frame may say its file changed. Then the same without CAP_SYS_ADMIN
//! and CAP_CHECKPOINT_RESTORE, which opening /proc/PID/map_files takes: the files are then
//! opened by their paths through /proc/PID/root, which must be the target's too.

use super::*;
use std::collections::HashMap;

/// Each defined symbol of an ELF file with a size, from `.symtab` and `.dynsym` (`nm`,
/// `nm -D`; a stripped executable has the second only): name → its [start, end) SVMAs.
fn symbol_ranges(file: &Path) -> Result<HashMap<String, Vec<(u64, u64)>>, String> {
    let mut text = String::new();
    for dynamic in [false, true] {
        let mut nm = Command::new("nm");
        nm.args(["--defined-only", "-S"]);
        if dynamic {
            nm.arg("-D");
        }
        let out = nm
            .arg(file)
            .output()
            .map_err(|e| format!("cannot run nm (binutils): {e}"))?;
        text += &String::from_utf8_lossy(&out.stdout);
    }
    let mut ranges: HashMap<String, Vec<(u64, u64)>> = HashMap::new();
    for l in text.lines() {
        let cols: Vec<&str> = l.split_whitespace().collect();
        if let [addr, size, _kind, name] = cols[..] {
            let (Ok(a), Ok(s)) = (u64::from_str_radix(addr, 16), u64::from_str_radix(size, 16))
            else {
                continue;
            };
            ranges.entry(name.to_string()).or_default().push((a, a + s));
        }
    }
    if ranges.is_empty() {
        return Err(format!("nm lists no sized symbols in {}", file.display()));
    }
    Ok(ranges)
}

/// Whether `ranges` has `name` over `offset` (a frame's SVMA: for a return address, the
/// call before it, so one byte back counts too).
fn covers(ranges: &HashMap<String, Vec<(u64, u64)>>, name: &str, offset: u64) -> bool {
    ranges.get(name).is_some_and(|rs| {
        rs.iter()
            .any(|&(a, b)| (a..b).contains(&offset) || (a..b).contains(&offset.wrapping_sub(1)))
    })
}

/// What the check of a native dump of spin.py needs to know.
pub struct SpinTruth<'a> {
    /// The extension's file name.
    pub ext: &'a str,
    /// The file that holds the interpreter (libpython or the executable) as the target
    /// has it, readable on our side (the real one).
    pub real: &'a Path,
    /// Another file at its path on our side, if any.
    pub decoy: Option<&'a Path>,
    /// spin.py's path as the target sees it.
    pub script: &'a str,
}

/// Checks `dump --native --json` of spin.py (what `run` gives, with the pid last) until
/// its main thread spins in the extension (within 10 s); returns a summary.
pub fn check_native_spin(
    run: &dyn Fn() -> Result<Value, String>,
    t: &SpinTruth,
) -> Result<String, String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let stack = loop {
        let dump = run()?;
        let stack = dump["threads"]
            .as_array()
            .and_then(|ts| {
                ts.iter().find(|t| {
                    t["frames"]
                        .as_array()
                        .is_some_and(|f| f.iter().any(|f| f["function"] == "caller"))
                })
            })
            .map(|t| t["native"].clone())
            .ok_or("no thread runs `caller`")?;
        if stack["stack"][0]["symbol"] == "spin_inner" || Instant::now() > deadline {
            break stack;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let entries = stack["stack"].as_array().cloned().unwrap_or_default();
    let show = || {
        entries
            .iter()
            .enumerate()
            .map(|(i, e)| format!("    #{i} {e}"))
            .collect::<Vec<_>>()
            .join("\n")
    };
    let fail = |why: String| Err(format!("{why}\n{}", show()));
    if stack["merged"] != true {
        return fail(format!("not merged: {}", stack["unmerged"]));
    }
    // The extension's four frames, by name, from the target's build of it.
    let want = ["spin_inner", "spin_static", "spin_outer", "spin"];
    for (i, name) in want.iter().enumerate() {
        let e = &entries[i];
        if e["kind"] != "native" || e["module"] != t.ext || e["symbol"] != *name {
            return fail(format!("frame #{i}: want {name} in {}", t.ext));
        }
    }
    // No file is said to have changed: each was the one loaded.
    if let Some(e) = entries.iter().find(|e| e.get("module_note").is_some()) {
        return fail(format!("{} says {}", e["module"], e["module_note"]));
    }
    // The Python frames: `caller` at its line, then `<module>` at its.
    let py: Vec<(&str, &str, i64)> = entries
        .iter()
        .filter(|e| e["kind"] == "python")
        .map(|e| {
            let s = |k: &str| e[k].as_str().unwrap_or("");
            (
                s("function"),
                s("filename"),
                e["line"].as_i64().unwrap_or(0),
            )
        })
        .collect();
    let spin = common::fixture("native/spin.py");
    let want_py = vec![
        ("caller", t.script, common::mark(&spin, "call") as i64),
        ("<module>", t.script, common::mark(&spin, "module") as i64),
    ];
    if py != want_py {
        return fail(format!("Python frames {py:?}, want {want_py:?}"));
    }
    // Every frame of the interpreter's file named by the symbol that covers its address in
    // the target's file; some of them not by our decoy's.
    let holder = t.real.file_name().unwrap().to_string_lossy().into_owned();
    let real = symbol_ranges(t.real)?;
    let decoy = t.decoy.map(symbol_ranges).transpose()?;
    let (mut named, mut not_in_decoy) = (0, 0);
    for e in entries.iter().filter(|e| e["module"] == holder.as_str()) {
        let Some(off) = e["offset"].as_u64() else {
            return fail(format!("a frame of {holder} has no offset: {e}"));
        };
        let Some(sym) = e["symbol"].as_str() else {
            // Unnamed only where the file names nothing (a stripped executable's static
            // functions).
            if let Some(name) = real.keys().find(|name| covers(&real, name, off)) {
                return fail(format!(
                    "{holder}+{off:#x} is unnamed, the file says {name}"
                ));
            }
            continue;
        };
        if !covers(&real, sym, off) {
            return fail(format!(
                "{holder}+{off:#x} is not {sym} in {}",
                t.real.display()
            ));
        }
        named += 1;
        if decoy.as_ref().is_some_and(|d| !covers(d, sym, off)) {
            not_in_decoy += 1;
        }
    }
    if named == 0 || (t.decoy.is_some() && not_in_decoy == 0) {
        return fail(format!(
            "{named} frames of {holder}, {not_in_decoy} of them named otherwise in the decoy: \
             the case tests nothing"
        ));
    }
    if entries.last().and_then(|e| e["symbol"].as_str()) != Some("_start") {
        return fail("the stack does not end at _start".into());
    }
    let decoyed = match t.decoy {
        Some(_) => format!(" ({not_in_decoy} of them would not be from ours)"),
        None => String::new(),
    };
    Ok(format!(
        "{} frames, {named} of {holder} named from the target's file{decoyed}",
        entries.len()
    ))
}

/// `dump --native --json PID` by our binary, under `setpriv` with `drop_caps` dropped when
/// given.
fn native_dump(pid: i32, drop_caps: Option<&str>) -> Result<Value, String> {
    let pid = pid.to_string();
    let args = [BIN, "dump", "--native", "--json", pid.as_str()];
    let out = match drop_caps {
        None => Command::new(BIN).args(&args[1..]).output(),
        Some(caps) => Command::new("setpriv")
            .args([
                format!("--inh-caps={caps}"),
                format!("--bounding-set={caps}"),
            ])
            .arg("--")
            .args(args)
            .output(),
    }
    .map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!(
            "dump --native exited {:?}: {}",
            out.status.code(),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    serde_json::from_slice(&out.stdout).map_err(|e| format!("unparsable dump: {e}"))
}

/// Opening /proc/PID/map_files takes one of these.
const MAP_FILES_CAPS: &str = "-sys_admin,-checkpoint_restore";

/// The case `same_path_other_build_on_host` with `dump --native` (see the top).
pub fn native_other_build(interp: &Interpreter, decoy: &Path) -> Result<String, String> {
    let (built, ext) = common::spinext::build_ext(interp, false)?;
    let d = prepare_scratch(&format!("native-other-{}", interp.label));
    // Ours at the extension's path: another build of it; the target's, inside.
    std::fs::create_dir_all(d.path("mnt/app/ext")).unwrap();
    let (inc, _) = common::spinext::sysconfig(interp)?;
    let variant = d.path("mnt/app/ext").join(&ext);
    common::spinext::compile_ext(interp, &inc, &variant, &["-DSPINEXT_VARIANT"])?;
    let setup = format!(
        "mkdir {mnt}/app/ext\ncp {} {mnt}/app/ext/\n",
        sh_quote(&built.join(&ext).to_string_lossy()),
        mnt = sh_quote(&d.s("mnt"))
    );
    let run = format!(
        "{}/app/spin.py {}/app/ext",
        sh_quote(&d.s("mnt")),
        sh_quote(&d.s("mnt"))
    );
    let (script, _, holder) =
        script_other_build(interp, &d, decoy, &["native/spin.py"], &setup, &run);
    let t = NsTarget::start(&script, true)?;
    check_mapped(&t, &holder)?;
    let real = match shared_lib(interp) {
        Some((prefix, lib)) => prefix.join("lib").join(lib),
        None => interp.path.clone(),
    };
    let script_path = d.s("mnt/app/spin.py");
    let truth = SpinTruth {
        ext: &ext,
        real: &real,
        decoy: Some(decoy),
        script: &script_path,
    };
    let with = check_native_spin(&|| native_dump(t.pid, None), &truth)?;
    let without = check_native_spin(&|| native_dump(t.pid, Some(MAP_FILES_CAPS)), &truth)
        .map_err(|e| format!("without CAP_SYS_ADMIN (no map_files): {e}"))?;
    let _ = std::fs::remove_dir_all(&built);
    Ok(format!("{with}; without map_files: {without}"))
}
