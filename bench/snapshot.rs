//! Cost of reading one process's stacks, measured on a known target.
//!
//! `cargo bench --bench snapshot` starts a Python process whose only thread is 30 Python
//! frames deep (blocked in `time.sleep`, then busy in a loop), and times:
//! - locating the interpreter (once per `dump`: ELF parsing, version, layout),
//! - one snapshot with the threads paused (what `dump` does),
//! - one snapshot without pausing (`--nonblocking`),
//! - one snapshot with native frames (`dump --native`), and one native sample with the
//!   modules read once (what `run --native` will take), with the part of it during which
//!   the threads are stopped for their registers and stack,
//! - one whole sample as `run` takes it (thread list, CPU times, stacks, aggregation), in
//!   the default mode (read without pausing, validate) and with `--blocking` (paused),
//! - the highest sampling rate sustained with ≥95% of the scheduled samples taken.
//!
//! `SCALENE_RS_BENCH_PARKED=N` starts N more threads in the target, parked on an event (a
//! thread pool at rest: what a sample pays for threads that do not run).
//! `SCALENE_RS_BENCH_PYTHON=/path/to/python` picks the interpreter (default: the newest
//! pyenv one, else `python3`); `SCALENE_RS_BENCH_ITERS` the number of snapshots (2000);
//! `SCALENE_RS_BENCH_SUSTAINED=0` skips the sustained-rate part; `SCALENE_RS_BENCH_ONLY=WORD`
//! runs only the cases whose label contains WORD (e.g. `sample`, `nonblocking`, `busy`).
//! Each case reports wall time and the CPU time our own thread used (user + system, from
//! `CLOCK_THREAD_CPUTIME_ID`): on a busy machine the wall time also counts waiting for a
//! CPU, the CPU time does not. Report medians, never a single run: the machine is shared
//! and noisy.

use scalene_rs::ptrace::ProcessMemory;
use scalene_rs::python::{self, LocateOptions, PythonProcess, PythonReader, SnapshotOptions};
use scalene_rs::sampler::{ReadMode, Sampler, SamplerConfig};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const DEPTH: usize = 30;

fn python() -> String {
    if let Ok(p) = std::env::var("SCALENE_RS_BENCH_PYTHON") {
        return p;
    }
    let root = std::env::var("HOME").unwrap_or_default() + "/.pyenv/versions";
    let mut best: Option<(u32, u32, String)> = None;
    for e in std::fs::read_dir(&root).into_iter().flatten().flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        let mut it = name.split('.');
        if let (Some(Ok(a)), Some(Ok(b))) = (it.next().map(str::parse), it.next().map(str::parse)) {
            let exe = format!("{root}/{name}/bin/python{a}.{b}");
            if std::path::Path::new(&exe).exists()
                && best.as_ref().is_none_or(|x| (a, b) > (x.0, x.1))
            {
                best = Some((a, b, exe));
            }
        }
    }
    best.map(|b| b.2).unwrap_or_else(|| "python3".into())
}

struct Target(Child);
impl Drop for Target {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start(py: &str, busy: bool) -> Target {
    // The module frame plus DEPTH-1 calls of `deep` = DEPTH frames.
    let leaf = if busy {
        "    x = 0\n    while True:\n        x += 1\n"
    } else {
        "    time.sleep(3600)\n"
    };
    let parked: usize = std::env::var("SCALENE_RS_BENCH_PARKED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let code = format!(
        "import sys, time, threading\n\
         stop = threading.Event()\n\
         for _ in range({parked}):\n    \
             threading.Thread(target=stop.wait, daemon=True).start()\n\
         def leaf():\n\
         {}\
         def deep(n):\n    \
             if n <= 1:\n        leaf()\n    else:\n        deep(n - 1)\n\
         sys.stdout.write('ready\\n'); sys.stdout.flush()\n\
         deep({})\n",
        leaf,
        DEPTH - 2
    );
    let mut child = Command::new(py)
        .arg("-c")
        .arg(code)
        .stdout(Stdio::piped())
        .spawn()
        .expect("start python");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "ready");
    std::thread::sleep(Duration::from_millis(200));
    Target(child)
}

/// The deepest stack of a snapshot (the busy or sleeping thread's, beside parked ones).
fn deepest(snap: &python::Snapshot) -> usize {
    snap.threads
        .iter()
        .map(|t| t.frames.len())
        .max()
        .unwrap_or(0)
}

/// CPU time used by the calling thread so far.
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we own; the clock id is a constant.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Whether the case labelled `label` runs (`SCALENE_RS_BENCH_ONLY`).
fn wanted(label: &str) -> bool {
    std::env::var("SCALENE_RS_BENCH_ONLY").map_or(true, |w| label.contains(&w))
}

/// Times `f` `iters` times: (wall times, CPU times).
fn time_it(iters: usize, mut f: impl FnMut()) -> (Vec<Duration>, Vec<Duration>) {
    let mut wall = Vec::with_capacity(iters);
    let mut cpu = Vec::with_capacity(iters);
    for _ in 0..iters {
        let (t, c) = (Instant::now(), thread_cpu());
        f();
        cpu.push(thread_cpu().saturating_sub(c));
        wall.push(t.elapsed());
    }
    (wall, cpu)
}

fn report(label: &str, (wall, cpu): (Vec<Duration>, Vec<Duration>)) {
    let median = |mut v: Vec<Duration>| {
        v.sort();
        v[v.len() / 2].as_secs_f64() * 1e6
    };
    println!(
        "{label:<34} cpu median {:7.1} µs   wall {}",
        median(cpu),
        stats(wall)
    );
}

fn stats(mut v: Vec<Duration>) -> String {
    v.sort();
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    let mean = v.iter().map(|d| us(*d)).sum::<f64>() / v.len() as f64;
    format!(
        "median {:8.1} µs   p99 {:8.1} µs   mean {:8.1} µs   (n={})",
        us(v[v.len() / 2]),
        us(v[v.len() * 99 / 100]),
        mean,
        v.len()
    )
}

fn main() {
    let py = python();
    let iters: usize = std::env::var("SCALENE_RS_BENCH_ITERS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2000);
    let parked = std::env::var("SCALENE_RS_BENCH_PARKED").unwrap_or_else(|_| "0".into());
    println!(
        "interpreter: {py}; stack depth {DEPTH}; {parked} parked threads; {iters} snapshots per case"
    );
    for busy in [false, true] {
        let target = start(&py, busy);
        let pid = target.0.id() as i32;
        let state = if busy { "busy" } else { "idle" };
        let locate_label = format!("{state} locate (once per dump)");
        if wanted(&locate_label) {
            report(
                &locate_label,
                time_it(20, || {
                    PythonProcess::locate(pid, &LocateOptions::default()).unwrap();
                }),
            );
        }
        let proc = PythonProcess::locate(pid, &LocateOptions::default()).unwrap();
        let mut reader = PythonReader::new(proc);
        for nonblocking in [false, true] {
            let mode = if nonblocking { "nonblocking" } else { "paused" };
            let label = format!("{state} {mode} snapshot (dump)");
            if !wanted(&label) {
                continue;
            }
            let opts = SnapshotOptions {
                mode: if nonblocking {
                    ReadMode::Nonblocking
                } else {
                    ReadMode::Paused
                },
                ..Default::default()
            };
            let mut depth = 0;
            let times = time_it(iters, || {
                let snap = reader.snapshot(&opts).unwrap();
                depth = deepest(&snap);
            });
            assert_eq!(depth, DEPTH, "the target's stack is {DEPTH} frames deep");
            report(&label, times);
        }
        // With native frames: a whole `dump --native` (the modules read each time, their
        // images from the cache), and a native sample as a profile will take it (the
        // modules read once): pause, registers and stack copied, unwound, named, merged.
        let label = format!("{state} paused native snapshot (dump --native)");
        let opts = SnapshotOptions {
            mode: ReadMode::Paused,
            ..Default::default()
        };
        let mut cache = scalene_rs::native::NativeCache::new();
        if wanted(&label) {
            let times = time_it(iters.min(500), || {
                let native = python::native_process(reader.process(), &mut cache).unwrap();
                reader.set_native(Some(native));
                reader.snapshot(&opts).unwrap();
            });
            reader.set_native(None);
            report(&label, times);
        }
        let label = format!("{state} native sample (modules read once)");
        if wanted(&label) {
            let native = python::native_process(reader.process(), &mut cache).unwrap();
            reader.set_native(Some(native));
            let mut stopped = Vec::with_capacity(iters);
            let mut depth = 0;
            let times = time_it(iters, || {
                let snap = reader.snapshot(&opts).unwrap();
                depth = deepest(&snap);
                stopped.push(reader.native().expect("set above").last_capture_time());
            });
            reader.set_native(None);
            assert_eq!(depth, DEPTH, "the target's stack is {DEPTH} frames deep");
            report(&label, times);
            println!(
                "    (of which the threads are stopped for the registers and stack: {})",
                stats(stopped)
            );
        }
        // The floor under any sample on this machine: the system calls no sample can do
        // without (one read of the target's memory, one read of a thread's CPU time).
        let floor_label = format!("{state} floor: one process_vm_readv (4 KiB)");
        if wanted(&floor_label) {
            let addr = reader.process().interp_head().unwrap();
            let mut page = vec![0u8; 4096];
            let times = time_it(iters, || {
                reader.process().mem.read(addr & !4095, &mut page).unwrap();
            });
            report(&floor_label, times);
        }
        let floor_label = format!("{state} floor: one pread of schedstat");
        if wanted(&floor_label) {
            let mut files = scalene_rs::sampler::cputime::ThreadFiles::new();
            let times = time_it(iters, || {
                files.read_sched(pid, pid).unwrap();
            });
            report(&floor_label, times);
        }
        // The kernel's part of a default sample: the one request that reads the ranges a
        // nonblocking snapshot of this target reads (its prefetch and its second look, as
        // the next snapshot would ask for them) and one pread of schedstat; no decoding.
        let floor_label = format!("{state} floor: a sample's own reads");
        if wanted(&floor_label) {
            let ranges = floor_ranges(&mut reader);
            let bytes: usize = ranges.iter().map(|r| r.1).sum();
            let pages: std::collections::HashSet<u64> = ranges
                .iter()
                .flat_map(|&(a, n)| (a >> 12)..=((a + n as u64 - 1) >> 12))
                .collect();
            let mut bufs: Vec<Vec<u8>> = ranges.iter().map(|r| vec![0u8; r.1]).collect();
            let mut files = scalene_rs::sampler::cputime::ThreadFiles::new();
            let times = time_it(iters, || {
                floor_reads(reader.process(), pid, &ranges, &mut bufs, &mut files);
            });
            report(&floor_label, times);
            println!(
                "    ({} ranges, {} bytes on {} pages, in one process_vm_readv; then one pread)",
                ranges.len(),
                bytes,
                pages.len()
            );
        }
        // One whole sample as `run`/`attach` take it: thread list, CPU times from /proc,
        // stacks, native tag, aggregation.
        for nonblocking in [false, true] {
            let mode = if nonblocking { "default" } else { "--blocking" };
            let label = format!("{state} {mode} sample");
            if !wanted(&label) {
                continue;
            }
            let p = PythonProcess::locate(pid, &LocateOptions::default()).unwrap();
            let mut sampler = Sampler::new(
                p,
                SamplerConfig {
                    mode: if nonblocking {
                        ReadMode::Auto
                    } else {
                        ReadMode::Paused
                    },
                    ..Default::default()
                },
            );
            let times = time_it(iters, || sampler.sample_once().unwrap());
            assert_eq!(sampler.stats.errors, 0, "{:?}", sampler.stats.error_kinds);
            report(&label, times);
            println!(
                "    ({} samples, {} read paused, {} ticks thinned; CPU times of the threads \
                 that ran lately only: {})",
                sampler.stats.samples,
                sampler.stats.paused_reads,
                sampler.stats.thinned,
                sampler.stats.short_cpu_reads
            );
        }
        // The two above, taken in turn: on a shared machine the time of a system call swings
        // by half from one minute to the next, so the ratio of a sample to its floor is only
        // meaningful when both are measured side by side.
        let label = format!("{state} in turn: default sample over its floor");
        if wanted(&label) {
            sample_over_floor(&label, pid, iters, &mut reader);
        }
    }
    if std::env::var("SCALENE_RS_BENCH_SUSTAINED").as_deref() != Ok("0") {
        sustained(&py);
    }
}

/// The ranges a nonblocking snapshot of the target reads (its prefetch and its second look,
/// as the next snapshot would ask for them), once ten snapshots have settled them.
fn floor_ranges(reader: &mut PythonReader) -> Vec<(u64, usize)> {
    let opts = SnapshotOptions {
        mode: ReadMode::Nonblocking,
        ..Default::default()
    };
    for _ in 0..10 {
        reader.snapshot(&opts).unwrap();
    }
    let walker = reader.walker();
    walker
        .page_hint
        .iter()
        .chain(&walker.recheck_hint)
        .copied()
        .collect()
}

/// The floor's reads: `ranges` in one request, then one pread of schedstat.
fn floor_reads(
    proc: &PythonProcess,
    pid: i32,
    ranges: &[(u64, usize)],
    bufs: &mut [Vec<u8>],
    files: &mut scalene_rs::sampler::cputime::ThreadFiles,
) {
    let mut reqs: Vec<(u64, &mut [u8])> = ranges
        .iter()
        .zip(bufs.iter_mut())
        .map(|(r, b)| (r.0, &mut b[..]))
        .collect();
    let want = reqs.len();
    assert_eq!(proc.mem.read_many(&mut reqs), want);
    files.read_sched(pid, pid).unwrap();
}

/// A default sample and the floor under it ("a sample's own reads", see above), one after
/// the other `iters` times: the median of each and their ratio.
fn sample_over_floor(label: &str, pid: i32, iters: usize, reader: &mut PythonReader) {
    let ranges = floor_ranges(reader);
    let mut bufs: Vec<Vec<u8>> = ranges.iter().map(|r| vec![0u8; r.1]).collect();
    let mut files = scalene_rs::sampler::cputime::ThreadFiles::new();
    let p = PythonProcess::locate(pid, &LocateOptions::default()).unwrap();
    let mut sampler = Sampler::new(
        p,
        SamplerConfig {
            mode: ReadMode::Auto,
            ..Default::default()
        },
    );
    let (mut floor, mut sample) = (Vec::with_capacity(iters), Vec::with_capacity(iters));
    for _ in 0..iters {
        let t = Instant::now();
        floor_reads(reader.process(), pid, &ranges, &mut bufs, &mut files);
        floor.push(t.elapsed());
        let t = Instant::now();
        sampler.sample_once().unwrap();
        sample.push(t.elapsed());
    }
    assert_eq!(sampler.stats.errors, 0, "{:?}", sampler.stats.error_kinds);
    let median = |v: &mut Vec<Duration>| {
        v.sort();
        v[v.len() / 2].as_secs_f64() * 1e6
    };
    let (f, s) = (median(&mut floor), median(&mut sample));
    println!(
        "{label:<34} wall median {s:8.1} µs over {f:.1} µs: {:.2}x   (n={iters} each)",
        s / f
    );
}

/// The highest rate the sampler keeps up with: sample the busy 30-deep target for two
/// seconds at rising rates and report the share of scheduled samples actually taken
/// (the goal is ≥95%). `--blocking` leaves the target running after each paused sample
/// for as long as the sample took (`drive`): its share falls once a paused sample takes
/// more than half the period, by design.
fn sustained(py: &str) {
    let target = start(py, true);
    let pid = target.0.id() as i32;
    for nonblocking in [false, true] {
        for rate in [1000.0, 2000.0, 5000.0, 10000.0, 20000.0] {
            let p = PythonProcess::locate(pid, &LocateOptions::default()).unwrap();
            let mut sampler = Sampler::new(
                p,
                SamplerConfig {
                    rate_hz: rate,
                    mode: if nonblocking {
                        ReadMode::Auto
                    } else {
                        ReadMode::Paused
                    },
                    ..Default::default()
                },
            );
            let t = Instant::now();
            sampler
                .run(&mut || t.elapsed() >= Duration::from_secs(2), &mut |_| {})
                .unwrap();
            let st = &sampler.stats;
            let taken = st.samples as f64 / (st.samples + st.missed).max(1) as f64;
            println!(
                "sustained {:<12} {:>6.0} Hz requested: {:>6.0} Hz taken ({:5.1}% of scheduled), {} errors",
                if nonblocking { "default" } else { "--blocking" },
                rate,
                st.samples as f64 / st.elapsed.as_secs_f64(),
                taken * 100.0,
                st.errors
            );
        }
    }
}
