//! The preload library's cost on the allocation fast path.
//!
//! 1. `malloc`/`free` pairs in a native program (this binary, re-run as a child): without
//!    the library, and with it loaded but idle (no ring: the program is not Python).
//! 2. The same inside Python, where the library accounts every allocation: a loop making and
//!    dropping a small bytearray (two malloc/free pairs each), without the library and with
//!    it claiming a ring (handshakes off, so only the accounting is measured).
//!
//! Prints the fastest of several runs (on a shared machine the minimum is the best estimate
//! of the intrinsic cost), in ns per pair / per iteration, and the difference.
//! `SCALENE_RS_BENCH_PYTHON` picks the interpreter (default: python3).

use scalene_rs::memory::preload::PreloadFile;
use scalene_rs::memory::ring::{Ring, RING_ENV};
use std::process::Command;
use std::time::Instant;

const CHILD: &str = "SCALENE_RS_BENCH_MALLOC_CHILD";
const PAIRS: u64 = 5_000_000;
const RUNS: usize = 7;

fn child() {
    let start = Instant::now();
    for i in 0..PAIRS {
        // SAFETY: plain malloc/free of a block we own.
        unsafe {
            let p = libc::malloc(16 + (i as usize & 127));
            std::hint::black_box(p);
            libc::free(p);
        }
    }
    println!("{}", start.elapsed().as_nanos() as f64 / PAIRS as f64);
}

fn fastest(v: Vec<f64>) -> f64 {
    v.into_iter().fold(f64::INFINITY, f64::min)
}

fn run(cmd: &mut Command) -> f64 {
    let out = cmd.output().expect("running the benchmark child");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("a number")
}

const PY_LOOP: &str = "import time\n\
n = 2000000\n\
t = time.perf_counter()\n\
for i in range(n):\n    b = bytearray(64)\n\
print((time.perf_counter() - t) * 1e9 / n)\n";

fn main() {
    if std::env::var_os(CHILD).is_some() {
        child();
        return;
    }
    let lib = PreloadFile::write(&std::env::temp_dir()).expect("writing the library");
    let me = std::env::current_exe().expect("own path");
    let native = |preload: bool| {
        fastest(
            (0..RUNS)
                .map(|_| {
                    let mut c = Command::new(&me);
                    c.env(CHILD, "1");
                    if preload {
                        c.env("LD_PRELOAD", lib.path());
                    }
                    run(&mut c)
                })
                .collect(),
        )
    };
    let plain = native(false);
    let idle = native(true);
    println!("native malloc/free pair: {plain:.1} ns plain, {idle:.1} ns with the library loaded (idle): +{:.1} ns", idle - plain);

    let python = std::env::var("SCALENE_RS_BENCH_PYTHON").unwrap_or_else(|_| "python3".into());
    let py = |preload: bool| {
        fastest(
            (0..RUNS)
                .map(|_| {
                    let mut c = Command::new(&python);
                    c.args(["-c", PY_LOOP]).env("PYTHONMALLOC", "malloc");
                    let ring;
                    if preload {
                        ring = Ring::create(&std::env::temp_dir(), 1 << 12, 1 << 20, 1 << 20)
                            .expect("ring");
                        ring.set_handshake(false);
                        c.env("LD_PRELOAD", lib.path()).env(RING_ENV, ring.path());
                        let v = run(&mut c);
                        assert_ne!(ring.producer_pid(), 0, "the library did not claim the ring");
                        return v;
                    }
                    run(&mut c)
                })
                .collect(),
        )
    };
    let plain = py(false);
    let active = py(true);
    println!(
        "{python}: bytearray(64) churn (2 malloc/free pairs each): {plain:.1} ns plain, {active:.1} ns with the library accounting: +{:.1} ns per iteration ({:.2}x)",
        active - plain,
        active / plain
    );
}
