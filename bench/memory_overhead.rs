//! What memory mode costs a program, part by part: each workload runs bare, then with one
//! more ingredient of `scalene-rs run` at a time, in interleaved rounds (so a change of the
//! machine's load hits every variant alike), and the report gives the median of the
//! per-round ratios to the bare run with their spread.
//!
//! Variants, each including the ones before it:
//! - `pymalloc-off`: `PYTHONMALLOC=malloc` (every object goes through the C allocator);
//! - `lib-idle`: the preload library loaded, no ring (the interposed calls pass through);
//! - `accounting`: a ring claimed, events drained by a thread, handshakes off (the per-call
//!   accounting and the sampled events, nobody reading stacks);
//! - `full`: `scalene-rs run -o /dev/null` (adds the handshakes and the CPU sampler);
//!   `cpu-only` (`run --cpu-only`) is measured beside it;
//! - `acct-pymalloc` and `full-pymalloc`: `accounting` and `full` with Python's small-object
//!   allocator left on (`run --keep-pymalloc`);
//! - `acct-wrapped`: `accounting` with pymalloc wrapped by the library, as `full` (run's
//!   default) has it on 3.8+; `full-malloc`: `run --python-allocator malloc`.
//!
//!   cargo bench --bench memory_overhead -- [--rounds N] [--python PY] [WORKLOAD.py ...]
//!
//! Workloads default to `../shared/bench/workloads/{allocs,julia,mdp}.py` when present;
//! `--python` defaults to `SCALENE_RS_BENCH_PYTHON` or python3. `--wrap -- CMD...` runs one
//! command in the `accounting` setting (for side-by-side runs with other tools).
//! `SCALENE_RS_BENCH_OTHER_LIB=PATH` adds `accounting` with another build of the library
//! (before/after a change, in the same rounds).
//!
//! Wall time is what the program feels; the CPU time of the program's processes (user +
//! system, from wait4) is printed too for the variants without the profiler: on a busy
//! machine it moves much less than wall time, so it attributes per-call costs better.

use scalene_rs::memory::preload::PreloadFile;
use scalene_rs::memory::ring::{layout, Ring, RING_ENV};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_scalene-rs");

#[derive(Clone, Copy, PartialEq)]
enum Variant {
    Bare,
    PymallocOff,
    LibIdle,
    Accounting,
    /// `Accounting` with the library of SCALENE_RS_BENCH_OTHER_LIB.
    OtherLib,
    CpuOnly,
    Full,
    AccountingPymalloc,
    FullPymalloc,
    /// `Accounting` with pymalloc wrapped by the library (run's default on 3.8+).
    AccountingWrapped,
    /// `run --python-allocator malloc`.
    FullMalloc,
}

const VARIANTS: [(Variant, &str); 11] = [
    (Variant::Bare, "bare"),
    (Variant::PymallocOff, "pymalloc-off"),
    (Variant::LibIdle, "lib-idle"),
    (Variant::Accounting, "accounting"),
    (Variant::OtherLib, "other-lib"),
    (Variant::CpuOnly, "cpu-only"),
    (Variant::Full, "full"),
    (Variant::AccountingPymalloc, "acct-pymalloc"),
    (Variant::FullPymalloc, "full-pymalloc"),
    (Variant::AccountingWrapped, "acct-wrapped"),
    (Variant::FullMalloc, "full-malloc"),
];

/// Runs `cmd` to its end; returns its exit status and the CPU seconds (user + system) of
/// it and its waited-for descendants.
// The child is reaped by wait4 (which also gives its rusage), not by Child::wait.
#[allow(clippy::zombie_processes)]
fn run_with_cpu(cmd: &mut Command) -> (std::process::ExitStatus, f64) {
    use std::os::unix::process::ExitStatusExt;
    let child = cmd.spawn().expect("running the workload");
    let mut status = 0;
    // SAFETY: rusage is plain data, filled by wait4.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: waits for our own child, whose pid we hold; fills `status` and `ru`.
    let r = unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut ru) };
    assert_eq!(r, child.id() as i32, "wait4");
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    (
        std::process::ExitStatus::from_raw(status),
        secs(ru.ru_utime) + secs(ru.ru_stime),
    )
}

/// Runs `cmd` with the library claiming a fresh ring (handshakes off) while a thread drains
/// the ring; returns the exit status and the number of events read.
fn run_accounting(lib: &Path, cmd: &mut Command) -> (std::process::ExitStatus, f64, u64) {
    let ring = Ring::create(&std::env::temp_dir(), 1 << 16, 1 << 20, 1 << 20).expect("ring");
    ring.set_handshake(false);
    cmd.env("LD_PRELOAD", lib).env(RING_ENV, ring.path());
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    let drain = std::thread::spawn(move || {
        let mut ring = ring;
        let mut n = 0u64;
        let mut bell = 0;
        loop {
            let stopping = stop2.load(Ordering::Acquire);
            let mut any = false;
            while ring.next_event().is_some() {
                n += 1;
                any = true;
            }
            if stopping && !any {
                return n;
            }
            bell = ring.wait_doorbell(bell, Duration::from_millis(2));
        }
    });
    let (status, cpu) = run_with_cpu(cmd);
    stop.store(true, Ordering::Release);
    (status, cpu, drain.join().expect("drain thread"))
}

/// Wall and CPU seconds of one run.
fn timed(v: Variant, python: &str, script: &Path, lib: &Path, other: Option<&Path>) -> (f64, f64) {
    let mut cmd = match v {
        Variant::CpuOnly | Variant::Full | Variant::FullPymalloc | Variant::FullMalloc => {
            let mut c = Command::new(BIN);
            c.args(["run", "-o", "/dev/null"]);
            if v == Variant::CpuOnly {
                c.arg("--cpu-only");
            }
            if v == Variant::FullPymalloc {
                c.arg("--keep-pymalloc");
            }
            if v == Variant::FullMalloc {
                c.args(["--python-allocator", "malloc"]);
            }
            c.arg("--").arg(python).arg(script).stderr(Stdio::null());
            c
        }
        _ => {
            let mut c = Command::new(python);
            c.arg(script);
            c
        }
    };
    cmd.stdout(Stdio::null());
    if matches!(
        v,
        Variant::PymallocOff | Variant::LibIdle | Variant::Accounting | Variant::OtherLib
    ) {
        cmd.env("PYTHONMALLOC", "malloc");
    }
    if v == Variant::LibIdle {
        cmd.env("LD_PRELOAD", lib);
    }
    if v == Variant::AccountingWrapped {
        // As `run` asks for it: the library drops PYTHONMALLOC where it wraps pymalloc.
        cmd.env("PYTHONMALLOC", "malloc")
            .env(layout::PYMEM_ENV, layout::PYMEM_HOOK);
    }
    let start = Instant::now();
    let (status, cpu) = match (v, other) {
        (Variant::Accounting | Variant::AccountingPymalloc | Variant::AccountingWrapped, _) => {
            let (s, c, _) = run_accounting(lib, &mut cmd);
            (s, c)
        }
        (Variant::OtherLib, Some(other)) => {
            let (s, c, _) = run_accounting(other, &mut cmd);
            (s, c)
        }
        _ => run_with_cpu(&mut cmd),
    };
    let t = start.elapsed().as_secs_f64();
    assert!(status.success(), "{} failed: {status}", script.display());
    (t, cpu)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn main() {
    let mut args = std::env::args().skip(1).collect::<Vec<_>>();
    // `cargo bench` passes --bench; ignore it.
    args.retain(|a| a != "--bench");
    let lib = PreloadFile::write(&std::env::temp_dir()).expect("writing the library");
    if let Some(i) = args.iter().position(|a| a == "--wrap") {
        let cmd = &args[i + 1..];
        let cmd = cmd.strip_prefix(&["--".to_string()]).unwrap_or(cmd);
        let (prog, rest) = cmd.split_first().expect("--wrap -- COMMAND...");
        let mut c = Command::new(prog);
        c.args(rest).env("PYTHONMALLOC", "malloc");
        let (status, _, events) = run_accounting(lib.path(), &mut c);
        eprintln!("accounting: {events} events");
        std::process::exit(status.code().unwrap_or(1));
    }
    let mut rounds = 5;
    let mut python = std::env::var("SCALENE_RS_BENCH_PYTHON").unwrap_or_else(|_| "python3".into());
    let mut scripts: Vec<PathBuf> = Vec::new();
    let mut it = args.into_iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--rounds" => rounds = it.next().and_then(|n| n.parse().ok()).expect("--rounds N"),
            "--python" => python = it.next().expect("--python PY"),
            _ => scripts.push(a.into()),
        }
    }
    if scripts.is_empty() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/bench/workloads");
        scripts = ["allocs", "julia", "mdp"]
            .iter()
            .map(|w| dir.join(format!("{w}.py")))
            .filter(|p| p.is_file())
            .collect();
        assert!(!scripts.is_empty(), "no workloads given or found");
    }
    let other = std::env::var_os("SCALENE_RS_BENCH_OTHER_LIB").map(PathBuf::from);
    let variants: Vec<(Variant, &str)> = VARIANTS
        .iter()
        .copied()
        .filter(|(v, _)| *v != Variant::OtherLib || other.is_some())
        .collect();
    println!(
        "{rounds} rounds after one warm-up, {python}; ratios to the bare run, median [min–max] \
         of the rounds: wall time (CPU time of the program)"
    );
    for script in &scripts {
        let mut wall: Vec<Vec<f64>> = vec![Vec::new(); variants.len()];
        let mut cpu: Vec<Vec<f64>> = vec![Vec::new(); variants.len()];
        for round in 0..=rounds {
            for (i, (v, _)) in variants.iter().enumerate() {
                let (w, c) = timed(*v, &python, script, lib.path(), other.as_deref());
                if round > 0 {
                    wall[i].push(w);
                    cpu[i].push(c);
                }
            }
        }
        let name = script.file_stem().unwrap_or_default().to_string_lossy();
        let ratios = |t: &[Vec<f64>], i: usize| -> Vec<f64> {
            t[i].iter().zip(&t[0]).map(|(t, b)| t / b).collect()
        };
        let spread = |r: &[f64]| {
            r.iter()
                .fold((f64::INFINITY, 0.0f64), |(a, b), &x| (a.min(x), b.max(x)))
        };
        println!("{name}: bare {:.2}s wall", median(wall[0].clone()));
        for (i, (v, label)) in variants.iter().enumerate().skip(1) {
            let r = ratios(&wall, i);
            let (lo, hi) = spread(&r);
            let mut line = format!("  {label:<13} {:.3} [{lo:.2}–{hi:.2}]", median(r));
            if !matches!(v, Variant::CpuOnly | Variant::Full | Variant::FullPymalloc) {
                let r = ratios(&cpu, i);
                let (lo, hi) = spread(&r);
                line += &format!("  (CPU {:.3} [{lo:.2}–{hi:.2}])", median(r));
            }
            println!("{line}");
        }
    }
}
