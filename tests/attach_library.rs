//! The library side of `attach` with memory, without ptrace: a Python process loads the preload
//! library itself (`ctypes.PyDLL`, which keeps the GIL: the real attach calls from a thread
//! blocked outside Python, so this matches it only loosely, but it exercises everything the
//! library does) and calls `scalene_rs_attach` with a ring we made. Checked against each
//! representative interpreter (common::representatives): the return code (free-threaded builds
//! refuse), the bytes counted and the interpreter's share of them, the interpreter's allocator
//! wrapped by the pending call, no event once the ring says `detached` or its heartbeat is
//! stale, a second attach with a new ring, and 100 attach/detach cycles that leave at most a
//! couple of old rings mapped; the program's own output and exit status intact.

mod common;

use scalene_rs::memory::preload::PreloadFile;
use scalene_rs::memory::ring::layout::{self, EventData, Header};
use scalene_rs::memory::ring::Ring;
use std::process::Command;
use std::sync::atomic::Ordering;
use std::time::Duration;

const MIB: u64 = 1 << 20;
const WINDOW: u64 = 256 << 10;
const CYCLES: usize = 100;

/// The program: attaches, allocates, detaches itself by writing the ring's header (its own
/// mapping of the file), and so on; prints what it saw.
const SCRIPT: &str = r#"
import ctypes, mmap, struct, sys
lib = sys.argv[1]
off_det, off_hb, off_pw, off_head = [int(x) for x in sys.argv[2:6]]
rings = sys.argv[6:]
def say(*a):
    sys.stdout.write(" ".join([str(x) for x in a]) + "\n")
    sys.stdout.flush()
def header(path):
    f = open(path, "r+b")
    m = mmap.mmap(f.fileno(), 4096)
    f.close()
    return m
def get(m, off, fmt):
    return struct.unpack_from(fmt, m, off)[0]
def put(m, off, fmt, v):
    struct.pack_into(fmt, m, off, v)
def path(p):
    return p if bytes is str else p.encode()
pre = [bytearray(100000) for _ in range(300)]
pre_small = [(i, -i) for i in range(50000)]
d = ctypes.PyDLL(lib)
h1 = header(rings[0])
rc = d.scalene_rs_attach(path(rings[0]))
say("rc", rc)
if rc != 0:
    sys.exit(0)
del pre, pre_small
keep = [bytearray(1 << 20) for _ in range(64)]
small = [(i, i + 1) for i in range(100000)]
say("pymem_wrapped", get(h1, off_pw, "I"))
put(h1, off_det, "I", 1)
head = get(h1, off_head, "Q")
more = [bytearray(1 << 20) for _ in range(16)]
say("after_detach", get(h1, off_head, "Q") - head)
h2 = header(rings[1])
say("rc2", d.scalene_rs_attach(path(rings[1])))
keep2 = [bytearray(1 << 20) for _ in range(32)]
put(h2, off_hb, "Q", 1)
head = get(h2, off_head, "Q")
more2 = [bytearray(1 << 20) for _ in range(16)]
say("after_stale", get(h2, off_head, "Q") - head)
n = 0
for r in rings[2:]:
    h = header(r)
    rc = d.scalene_rs_attach(path(r))
    if rc != 0:
        say("cycle_rc", n, rc)
        break
    tmp = [bytearray(1 << 20) for _ in range(3)]
    put(h, off_det, "I", 1)
    head = get(h, off_head, "Q")
    tmp2 = [bytearray(1 << 20) for _ in range(3)]
    if get(h, off_head, "Q") != head:
        say("cycle_after_detach", n)
    del tmp, tmp2
    h.close()
    n += 1
names = [r.split("/")[-1] for r in rings[2:]]
mapped = [l for l in open("/proc/self/maps").read().splitlines() if l.split("/")[-1] in names]
say("cycles", n, "mapped", len(mapped))
say("done", len(keep), len(small), len(more), len(keep2), len(more2))
"#;

/// Every event written to `ring` (read without consuming: nobody else reads it).
fn events(ring: &Ring) -> Vec<EventData> {
    let h: &Header = ring.header();
    let (tail, head) = (
        h.tail.load(Ordering::Acquire),
        h.head.load(Ordering::Acquire),
    );
    (tail..head)
        // SAFETY: the ring's own mapping holds `capacity` slots after the header.
        .filter_map(|t| unsafe { h.slot(t) }.read(t))
        .collect()
}

/// Bytes allocated in all, and of those by the interpreter.
fn allocated(ring: &Ring) -> (u64, u64) {
    events(ring)
        .iter()
        .filter(|e| matches!(e.kind, layout::EV_ALLOC | layout::EV_ALLOC_LARGE))
        .fold((0, 0), |(a, p), e| (a + e.a, p + e.c))
}

fn line<'a>(out: &'a str, key: &str) -> Option<Vec<&'a str>> {
    out.lines()
        .find(|l| l.split(' ').next() == Some(key))
        .map(|l| l.split(' ').skip(1).collect())
}

fn num(out: &str, key: &str) -> Result<i64, String> {
    line(out, key)
        .and_then(|v| v.first().and_then(|x| x.parse().ok()))
        .ok_or_else(|| format!("no `{key}` line in {out:?}"))
}

fn check(py: &common::Interpreter) -> Result<String, String> {
    let dir = std::env::temp_dir();
    let lib = PreloadFile::write(&dir).map_err(|e| e.to_string())?;
    let make = |cap| {
        let r = Ring::create(&dir, cap, WINDOW, WINDOW).expect("ring");
        r.set_handshake(false);
        r
    };
    let rings: Vec<Ring> = [1 << 14, 1 << 14]
        .into_iter()
        .chain(std::iter::repeat_n(1 << 8, CYCLES))
        .map(make)
        .collect();
    let script = common::tempdir("attach-library").join("attach.py");
    std::fs::write(&script, SCRIPT).map_err(|e| e.to_string())?;
    let mut cmd = Command::new(&py.path);
    cmd.arg(&script).arg(lib.path());
    for off in [
        std::mem::offset_of!(Header, detached),
        std::mem::offset_of!(Header, heartbeat_ns),
        std::mem::offset_of!(Header, pymem_wrapped),
        std::mem::offset_of!(Header, head),
    ] {
        cmd.arg(off.to_string());
    }
    cmd.args(rings.iter().map(|r| r.path()));
    let run = common::run_limited(cmd, Duration::from_secs(120));
    let out = &run.stdout;
    if run.code != Some(0) {
        return Err(format!("{}; stdout {out:?}", run.describe()));
    }
    let rc = num(out, "rc")?;
    if py.free_threaded {
        return if rc == i64::from(layout::ATTACH_FREE_THREADED) && rings[0].producer_pid() == 0 {
            Ok(format!("free-threaded: refused ({rc}), nothing claimed"))
        } else {
            Err(format!(
                "free-threaded: rc {rc}, producer {}",
                rings[0].producer_pid()
            ))
        };
    }
    if rc != i64::from(layout::ATTACH_OK) {
        return Err(format!("attach returned {rc}; {}", run.describe()));
    }
    let mut problems = Vec::new();
    // 64 MiB of bytearrays and 100k tuples (~5 MiB), counted in windows of 256 KiB.
    let (bytes, python) = allocated(&rings[0]);
    if !(64 * MIB..=160 * MIB).contains(&bytes) {
        problems.push(format!("first attach counted {} MiB", bytes / MIB));
    }
    let share = python as f64 / bytes.max(1) as f64;
    if share < 0.8 {
        problems.push(format!("python share {share:.2}"));
    }
    let wrapped = num(out, "pymem_wrapped")?;
    let want_wrapped = i64::from(py.version() >= (3, 6));
    if wrapped != want_wrapped {
        problems.push(format!("pymem_wrapped {wrapped}, wanted {want_wrapped}"));
    }
    let h1 = rings[0].header();
    if h1.pymem_wrapped.load(Ordering::Acquire) as i64 != want_wrapped {
        problems.push("pymem_wrapped not in the header".into());
    }
    if num(out, "after_detach")? != 0 {
        problems.push("events after detached = 1".into());
    }
    if num(out, "rc2")? != 0 {
        problems.push(format!("second attach returned {}", num(out, "rc2")?));
    }
    let (bytes2, _) = allocated(&rings[1]);
    if !(31 * MIB..=80 * MIB).contains(&bytes2) {
        problems.push(format!("second attach counted {} MiB", bytes2 / MIB));
    }
    if want_wrapped == 1 && rings[1].header().pymem_wrapped.load(Ordering::Acquire) != 1 {
        problems.push("second ring not told the allocator is wrapped".into());
    }
    if num(out, "after_stale")? != 0 {
        problems.push("events after a stale heartbeat".into());
    }
    let cycles = line(out, "cycles").ok_or("no cycles line")?;
    if cycles.first() != Some(&CYCLES.to_string().as_str()) {
        problems.push(format!("cycles: {cycles:?}; {:?}", line(out, "cycle_rc")));
    }
    let mapped: usize = cycles.get(2).and_then(|x| x.parse().ok()).unwrap_or(99);
    if mapped > 2 {
        problems.push(format!("{mapped} rings of earlier attaches still mapped"));
    }
    if line(out, "cycle_after_detach").is_some() {
        problems.push("a cycle's ring got events after its detach".into());
    }
    let thin = rings[2..]
        .iter()
        .filter(|r| allocated(r).0 < 2 * MIB)
        .count();
    if thin > 0 {
        problems.push(format!("{thin} cycle rings with under 2 MiB counted"));
    }
    if line(out, "done") != Some(vec!["64", "100000", "16", "32", "16"]) {
        problems.push(format!("output: {out:?}"));
    }
    if problems.is_empty() {
        Ok(format!(
            "{} MiB counted ({:.0}% python), {} MiB after re-attach, {} cycles, {mapped} old rings mapped",
            bytes / MIB,
            share * 100.0,
            bytes2 / MIB,
            CYCLES
        ))
    } else {
        Err(problems.join("; "))
    }
}

#[test]
fn a_library_loaded_late_counts_until_detached() {
    common::for_each_representative_alone(check);
}

/// The newest Python 3 with a GIL that runs in our own root.
fn newest_plain_python3() -> common::Interpreter {
    common::interpreters()
        .into_iter()
        .rev()
        .find(|p| !p.free_threaded && !p.is_py2() && p.root.is_none())
        .expect("a Python 3 interpreter")
}

/// The codes of an attach that cannot count: the library preloaded (`run`), another copy
/// of it preloaded, a ring that is not there; nothing claimed.
#[test]
fn an_attach_that_cannot_count_says_why() {
    let py = newest_plain_python3();
    let dir = std::env::temp_dir();
    let lib = PreloadFile::write(&dir).unwrap();
    let copy = PreloadFile::write(&dir).unwrap();
    let ring = Ring::create(&dir, 1 << 8, WINDOW, WINDOW).unwrap();
    ring.set_handshake(false);
    let code = |load: &std::path::Path,
                ring: &std::path::Path,
                preload: Option<&std::path::Path>| {
        let mut cmd = Command::new(&py.path);
        cmd.args([
            "-c",
            "import ctypes, sys; print(ctypes.PyDLL(sys.argv[1]).scalene_rs_attach(sys.argv[2].encode()))",
        ])
        .arg(load)
        .arg(ring);
        if let Some(p) = preload {
            cmd.env("LD_PRELOAD", p);
        }
        let run = common::run_limited(cmd, Duration::from_secs(60));
        assert_eq!(run.code, Some(0), "{}", run.describe());
        run.stdout.trim().parse::<i32>().unwrap()
    };
    assert_eq!(
        code(lib.path(), ring.path(), Some(lib.path())),
        layout::ATTACH_PRELOADED,
        "the library preloaded"
    );
    assert_eq!(
        code(copy.path(), ring.path(), Some(lib.path())),
        layout::ATTACH_PRELOADED,
        "another copy preloaded"
    );
    assert_eq!(
        code(lib.path(), &dir.join("no-such-ring"), None),
        layout::ATTACH_NO_RING
    );
    assert_eq!(ring.producer_pid(), 0, "nothing claimed the ring");
    assert_eq!(code(lib.path(), ring.path(), None), layout::ATTACH_OK);
    assert_ne!(ring.producer_pid(), 0, "the attach claimed the ring");
}

/// An object loaded after the attach (`ctypes.CDLL` of libsqlite3: the `dlopen` wrapper)
/// has its slots patched: its own mallocs are counted, as not the interpreter's.
#[test]
fn objects_loaded_after_the_attach_are_counted() {
    let sqlite = std::path::Path::new("/usr/lib/x86_64-linux-gnu/libsqlite3.so.0");
    if !sqlite.exists() {
        // Debian's python3 depends on it: CI, which installs that, always has it.
        return common::skip_or_fail(
            "objects_loaded_after_the_attach_are_counted",
            &format!("no {}", sqlite.display()),
        );
    }
    let py = newest_plain_python3();
    let dir = std::env::temp_dir();
    let lib = PreloadFile::write(&dir).unwrap();
    let ring = Ring::create(&dir, 1 << 12, WINDOW, WINDOW).unwrap();
    ring.set_handshake(false);
    let script = "import ctypes, sys
d = ctypes.PyDLL(sys.argv[1])
print(d.scalene_rs_attach(sys.argv[2].encode()))
s = ctypes.CDLL(sys.argv[3])
s.sqlite3_malloc64.restype = ctypes.c_void_p
s.sqlite3_malloc64.argtypes = [ctypes.c_uint64]
ps = [s.sqlite3_malloc64(1 << 20) for _ in range(16)]
print(len([p for p in ps if p]))";
    let mut cmd = Command::new(&py.path);
    cmd.args(["-c", script])
        .arg(lib.path())
        .arg(ring.path())
        .arg(sqlite);
    let run = common::run_limited(cmd, Duration::from_secs(60));
    assert_eq!(run.code, Some(0), "{}", run.describe());
    assert_eq!(
        run.stdout.split_whitespace().collect::<Vec<_>>(),
        ["0", "16"]
    );
    // Allocations whose caller is not the interpreter: sqlite's.
    let native: u64 = events(&ring)
        .iter()
        .filter(|e| matches!(e.kind, layout::EV_ALLOC | layout::EV_ALLOC_LARGE))
        .map(|e| e.a - e.c)
        .sum();
    assert!(native >= 15 * MIB, "{} MiB counted as native", native / MIB);
}
