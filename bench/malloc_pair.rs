//! The preload library's cost per call on the program's fast paths, in ns.
//!
//! A native loop (this binary, re-run as a child) times `malloc`/`free` pairs of small
//! blocks, and `memcpy` of 64 bytes: without the library; with it loaded but idle (no ring);
//! and with it accounting (the child runs as a copy of this binary named `python-...`, which
//! the library takes for an interpreter, so it claims a ring; handshakes are off and a thread
//! drains the ring, so only the per-call accounting and the sampled events are measured).
//! Then a Python loop making and dropping a small bytearray (two malloc/free pairs), with
//! `PYTHONMALLOC=malloc`, without and with the library accounting.
//!
//! Prints the fastest of several runs (on a shared machine the minimum is the best estimate
//! of an intrinsic cost). `SCALENE_RS_BENCH_PYTHON` picks the interpreter (default: python3);
//! `SCALENE_RS_BENCH_OTHER_LIB=PATH` measures another build of the library beside ours
//! (before/after a change, in the same runs).

use scalene_rs::memory::preload::PreloadFile;
use scalene_rs::memory::ring::{Ring, RING_ENV};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const CHILD: &str = "SCALENE_RS_BENCH_MALLOC_CHILD";
const PAIRS: u64 = 5_000_000;
const RUNS: usize = 9;

/// The child: ns per malloc/free pair, then ns per 64-byte memcpy.
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
    let pair = start.elapsed().as_nanos() as f64 / PAIRS as f64;
    let (src, mut dst) = ([7u8; 64], [0u8; 64]);
    let start = Instant::now();
    for _ in 0..PAIRS {
        // SAFETY: two distinct 64-byte buffers we own; black_box keeps the call a call.
        unsafe {
            libc::memcpy(
                std::hint::black_box(dst.as_mut_ptr()) as *mut libc::c_void,
                std::hint::black_box(src.as_ptr()) as *const libc::c_void,
                std::hint::black_box(64),
            )
        };
    }
    let copy = start.elapsed().as_nanos() as f64 / PAIRS as f64;
    std::hint::black_box(&dst);
    println!("{pair} {copy}");
}

/// A ring with handshakes off, drained by a thread until the returned guard is dropped.
struct Drained {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<i32>>,
}

impl Drained {
    fn new() -> Drained {
        let ring = Ring::create(&std::env::temp_dir(), 1 << 12, 1 << 20, 1 << 20).expect("ring");
        ring.set_handshake(false);
        let path = ring.path().to_path_buf();
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut ring = ring;
            let mut bell = 0;
            while !stop2.load(Ordering::Acquire) {
                while ring.next_event().is_some() {}
                bell = ring.wait_doorbell(bell, Duration::from_millis(2));
            }
            ring.producer_pid()
        });
        Drained {
            path,
            stop,
            thread: Some(thread),
        }
    }

    /// Stops draining; returns the pid that claimed the ring (0: none).
    fn finish(mut self) -> i32 {
        self.stop.store(true, Ordering::Release);
        self.thread.take().map_or(0, |t| t.join().unwrap_or(0))
    }
}

fn run(cmd: &mut Command) -> Vec<f64> {
    let out = cmd.output().expect("running the benchmark child");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(|v| v.parse().expect("a number"))
        .collect()
}

/// The element-wise minimum over `RUNS` runs of `f`.
fn fastest(f: impl Fn() -> Vec<f64>) -> Vec<f64> {
    let mut best: Vec<f64> = Vec::new();
    for _ in 0..RUNS {
        let v = f();
        if best.is_empty() {
            best = v;
        } else {
            best.iter_mut().zip(v).for_each(|(b, x)| *b = b.min(x));
        }
    }
    best
}

const PY_LOOP: &str = "import time\n\
n = 2000000\n\
t = time.perf_counter()\n\
for i in range(n):\n    b = bytearray(64)\n\
print((time.perf_counter() - t) * 1e9 / n)\n";

#[derive(Clone, Copy, PartialEq)]
enum Lib {
    None,
    Idle,
    Accounting,
}

fn main() {
    if std::env::var_os(CHILD).is_some() {
        child();
        return;
    }
    let ours = PreloadFile::write(&std::env::temp_dir()).expect("writing the library");
    let other = std::env::var_os("SCALENE_RS_BENCH_OTHER_LIB").map(PathBuf::from);
    let mut libs: Vec<(&str, &Path)> = vec![("ours", ours.path())];
    if let Some(o) = &other {
        libs.push(("other", o));
    }
    // A copy of this binary the library takes for a Python interpreter (by its name).
    let me = std::env::current_exe().expect("own path");
    let dir = std::env::temp_dir().join(format!("scalene-rs-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("bench directory");
    let as_python = dir.join("python-malloc-pair");
    std::fs::copy(&me, &as_python).expect("copying the bench binary");

    let native = |lib: Option<&Path>, mode: Lib| {
        fastest(|| {
            let exe = if mode == Lib::Accounting {
                &as_python
            } else {
                &me
            };
            let mut c = Command::new(exe);
            c.env(CHILD, "1");
            if let Some(l) = lib {
                c.env("LD_PRELOAD", l);
            }
            if mode != Lib::Accounting {
                return run(&mut c);
            }
            let ring = Drained::new();
            c.env(RING_ENV, &ring.path);
            let v = run(&mut c);
            assert_ne!(ring.finish(), 0, "the library did not claim the ring");
            v
        })
    };
    let plain = native(None, Lib::None);
    println!(
        "native, ns per malloc/free pair | per 64-byte memcpy (fastest of {RUNS}):\n  no library          {:6.1} | {:5.1}",
        plain[0], plain[1]
    );
    for (name, lib) in &libs {
        for (mode, label) in [(Lib::Idle, "idle"), (Lib::Accounting, "accounting")] {
            let v = native(Some(lib), mode);
            println!(
                "  {name:<5} {label:<13} {:6.1} | {:5.1}   (+{:.1} | +{:.1})",
                v[0],
                v[1],
                v[0] - plain[0],
                v[1] - plain[1]
            );
        }
    }

    let python = std::env::var("SCALENE_RS_BENCH_PYTHON").unwrap_or_else(|_| "python3".into());
    let py = |lib: Option<&Path>| {
        fastest(|| {
            let mut c = Command::new(&python);
            c.args(["-c", PY_LOOP]).env("PYTHONMALLOC", "malloc");
            let Some(lib) = lib else {
                return run(&mut c);
            };
            let ring = Drained::new();
            c.env("LD_PRELOAD", lib).env(RING_ENV, &ring.path);
            let v = run(&mut c);
            assert_ne!(ring.finish(), 0, "the library did not claim the ring");
            v
        })[0]
    };
    let plain = py(None);
    println!(
        "{python}, PYTHONMALLOC=malloc, ns per bytearray(64) made and dropped (2 pairs):\n  no library          {plain:6.1}"
    );
    for (name, lib) in &libs {
        let v = py(Some(lib));
        println!(
            "  {name:<5} accounting    {v:6.1}   (+{:.1}, {:.2}x)",
            v - plain,
            v / plain
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
