//! What /proc says about a process: every read of /proc/PID outside memory itself.
//!
//! Owns:
//! - whether a process exists;
//! - its threads and their scheduler states and names;
//! - its parent, children and descendants;
//! - executable and image ([`image_of`], what an exec changes);
//! - working directory ([`cwd`], as the target sees it);
//! - its memory map ([`maps`]);
//! - its container ([`container`]);
//! - why an OS call on it failed ([`access`]).
//!
//! Must not: read the target's memory (that is `ptrace`) or interpret what it maps (`elf`).

pub(crate) mod access;
pub(crate) mod container;
pub(crate) mod maps;
pub mod ns;

pub(crate) use access::{os_error, permission_denied};
pub(crate) use maps::{read_maps, MapEntry};

use crate::error::{Error, Result};

/// Whether `/proc/PID` exists and the process is neither a zombie nor on its way out.
///
/// A process that is exiting releases its memory and `/proc/PID/exe` before it becomes a
/// zombie. In that window its state still reads 'R' or 'D' but its flags carry PF_EXITING,
/// and every read fails. We call such a process gone.
pub fn process_exists(pid: i32) -> bool {
    const PF_EXITING: u64 = 0x4;
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => {
            // Fields after the parenthesised command name: state (3), ppid, pgrp, session,
            // tty_nr, tpgid, flags (9).
            let Some(mut fields) = stat_fields(&s) else {
                return false;
            };
            let state = fields.next().and_then(|f| f.chars().next());
            let flags: u64 = fields.nth(5).and_then(|f| f.parse().ok()).unwrap_or(0);
            !matches!(state, Some('Z') | Some('X') | None) && flags & PF_EXITING == 0
        }
        Err(_) => false,
    }
}

/// The fields of a /proc `stat` line from field 3 (the state) on. `.nth(n - 3)` is field
/// `n` as proc(5) numbers them. The command name (field 2) may hold spaces and parentheses,
/// so the fields start after its last ')'.
pub(crate) fn stat_fields(stat: &str) -> Option<std::str::SplitAsciiWhitespace<'_>> {
    Some(stat.get(stat.rfind(')')? + 1..)?.split_ascii_whitespace())
}

/// The thread ids (host TIDs) of a process, from /proc/PID/task, ascending.
pub(crate) fn threads(pid: i32) -> Result<Vec<i32>> {
    let dir = std::fs::read_dir(format!("/proc/{pid}/task")).map_err(|e| {
        if process_exists(pid) {
            os_error(pid, "listing its threads", e)
        } else {
            Error::NoSuchProcess(pid)
        }
    })?;
    let mut tids: Vec<i32> = dir
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect();
    tids.sort_unstable();
    Ok(tids)
}

/// Scheduler state of one thread from /proc/PID/task/TID/stat: ('R', 'S', 'D', 't', ...).
pub(crate) fn thread_state(pid: i32, tid: i32) -> Option<char> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat")).ok()?;
    stat_fields(&s)?.next()?.chars().next()
}

/// A thread's CPU time so far in nanoseconds (/proc/PID/task/TID/schedstat, its first
/// field); None when it cannot be read (no schedstat in this kernel, or the thread ended).
pub(crate) fn thread_run_ns(pid: i32, tid: i32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/schedstat")).ok()?;
    s.split_ascii_whitespace().next()?.parse().ok()
}

/// Waits until each thread of `before` (tid, CPU time then) has run since (its CPU time
/// grew), one that cannot be read or has ended counting as done, for `limit` at most.
pub(crate) fn wait_until_ran(pid: i32, before: &[(i32, u64)], limit: std::time::Duration) {
    let until = std::time::Instant::now() + limit;
    let mut left: Vec<(i32, u64)> = before.to_vec();
    loop {
        left.retain(|&(tid, then)| thread_run_ns(pid, tid).is_some_and(|now| now == then));
        if left.is_empty() || std::time::Instant::now() >= until {
            return;
        }
        std::thread::sleep(std::time::Duration::from_micros(50));
    }
}

/// The OS name of a thread (/proc/PID/task/TID/comm).
pub(crate) fn thread_name(pid: i32, tid: i32) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm"))
        .ok()
        .map(|s| s.trim_end_matches('\n').to_string())
}

/// The parent of a process (or thread: its process's parent), from /proc/PID/stat.
pub(crate) fn parent(pid: i32) -> Option<i32> {
    stat_fields(&stat(pid)?)?.nth(1)?.parse().ok()
}

/// The executable's path as the target sees it (the /proc/PID/exe link, without a
/// " (deleted)" suffix).
pub(crate) fn exe_path(pid: i32) -> Result<String> {
    let link = std::fs::read_link(format!("/proc/{pid}/exe")).map_err(|e| {
        if !process_exists(pid) {
            Error::NoSuchProcess(pid)
        } else {
            os_error(pid, "reading /proc/PID/exe", e)
        }
    })?;
    let s = link.to_string_lossy();
    Ok(s.strip_suffix(" (deleted)").unwrap_or(&s).to_string())
}

/// The id most recently given to a task (process or thread) in our PID namespace,
/// /proc/loadavg's last field. It changes whenever a task starts anywhere we can see
/// (a task started in a namespace below ours takes an id in ours too), so while it holds
/// still, no process has started. None where it cannot be read.
pub(crate) fn last_pid() -> Option<u32> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    text.split_ascii_whitespace().nth(4)?.parse().ok()
}

/// The direct children of every thread of `pid` (fork children hang off the thread that
/// forked). Empty when the process is gone or the kernel lacks CONFIG_PROC_CHILDREN.
pub(crate) fn children(pid: i32) -> Vec<i32> {
    let mut out = Vec::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for t in tasks.flatten() {
        let mut path = t.path();
        path.push("children");
        if let Ok(text) = std::fs::read_to_string(&path) {
            out.extend(
                text.split_ascii_whitespace()
                    .filter_map(|c| c.parse::<i32>().ok()),
            );
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// `root` and all its descendants, parents before children (at most 65,536).
pub(crate) fn descendants(root: i32) -> Vec<i32> {
    let mut out = vec![root];
    let mut i = 0;
    while i < out.len() && out.len() < 65536 {
        for c in children(out[i]) {
            if !out.contains(&c) {
                out.push(c);
            }
        }
        i += 1;
    }
    out
}

/// What a process is running:
/// - its executable;
/// - where its stack and its arguments start (`stat` fields 28 and 48, placed afresh by
///   each exec);
/// - its command line.
///
/// The last two change on every `exec`, even into the same executable (Python exec'ing
/// Python). A child forked without an exec has its parent's.
///
/// None when the process is gone, or when it exec'd while being read.
/// - The parts are three files, read one after the other. An `exec` between two reads
///   mixes two images: one scan saw Debian's chrooted 3.15 as `unshare`'s executable with
///   Python's stack, the next as Python's, and took it for a second process.
/// - So the executable is read again last. Another executable means an exec came between,
///   and the caller looks again at its next scan.
pub(crate) fn image_of(pid: i32) -> Option<String> {
    let exe = exe_path(pid).ok()?;
    let stat = stat(pid)?;
    let fields: Vec<&str> = stat_fields(&stat)?.collect();
    let at = |n: usize| fields.get(n - 3).copied().unwrap_or("");
    let image = format!("{exe}\0{}\0{}\0{}", at(28), at(48), command_line(pid));
    (exe_path(pid).ok()? == exe).then_some(image)
}

/// A process's command line, arguments joined by spaces.
pub(crate) fn command_line(pid: i32) -> String {
    arguments(pid).join(" ")
}

/// The arguments a process started with, one by one (/proc/PID/cmdline).
pub(crate) fn arguments(pid: i32) -> Vec<String> {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| {
            b.split(|&c| c == 0)
                .filter(|s| !s.is_empty())
                .map(|s| String::from_utf8_lossy(s).into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// The effective user and group a process runs as (/proc/PID/status), as our namespace
/// sees them.
pub(crate) fn owner(pid: i32) -> Option<(u32, u32)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |key: &str| -> Option<u32> {
        let line = status.lines().find(|l| l.starts_with(key))?;
        line.split_ascii_whitespace().nth(2)?.parse().ok()
    };
    Some((field("Uid:")?, field("Gid:")?))
}

/// When process `pid` started, µs since the Unix epoch (whole-second precision, because the
/// boot time is in seconds).
pub(crate) fn start_time_us(pid: i32) -> Option<u64> {
    let stat = stat(pid)?;
    let ticks: u64 = stat_fields(&stat)?.nth(22 - 3)?.parse().ok()?;
    let boot_s: u64 = std::fs::read_to_string("/proc/stat")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()?;
    // SAFETY: sysconf has no preconditions; it returns -1 on error, handled below.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let hz = if hz > 0 { hz as u64 } else { 100 };
    Some(boot_s * 1_000_000 + ticks * 1_000_000 / hz)
}

/// A process's `stat` line (/proc/PID/stat), for [`stat_fields`].
pub(crate) fn stat(pid: i32) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()
}

/// The system call thread `tid` is blocked in and its first argument
/// (/proc/PID/task/TID/syscall); None when it runs or it cannot be read.
pub(crate) fn blocked_syscall(pid: i32, tid: i32) -> Option<(i64, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/syscall")).ok()?;
    let mut it = text.split_ascii_whitespace();
    let nr = it.next()?.parse::<i64>().ok()?;
    let arg = u64::from_str_radix(it.next()?.trim_start_matches("0x"), 16).ok()?;
    Some((nr, arg))
}

/// The value of the environment variable `key` that process `pid` started with
/// (/proc/PID/environ; a change it made since is not seen).
pub(crate) fn environ_var(pid: i32, key: &str) -> Option<String> {
    let environ = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    environ.split(|&b| b == 0).find_map(|kv| {
        let v = kv.strip_prefix(key.as_bytes())?.strip_prefix(b"=")?;
        Some(String::from_utf8_lossy(v).into_owned())
    })
}

/// The target's working directory as the target sees it. /proc/PID/cwd is written from our
/// root (or its namespace's), so a chrooted target's root directory is taken off its front.
/// None when it cannot be read, or lies outside the target's root.
pub(crate) fn cwd(pid: i32) -> Option<String> {
    let link = |what: &str| {
        std::fs::read_link(format!("/proc/{pid}/{what}"))
            .ok()
            .map(|p| p.to_string_lossy().into_owned())
    };
    let cwd = link("cwd")?;
    match link("root") {
        Some(root) if root != "/" => within_root(&cwd, &root),
        _ => Some(cwd),
    }
}

/// `path` (from our root) as seen from inside `root`; None when it lies outside.
fn within_root(path: &str, root: &str) -> Option<String> {
    let rest = path.strip_prefix(root)?;
    match rest {
        "" => Some("/".to_string()),
        r if r.starts_with('/') => Some(r.to_string()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_skip_odd_command_names() {
        let s = "42 (a) b) (c) S 1 42 42 0 -1 4194560 ...";
        let mut f = stat_fields(s).unwrap();
        assert_eq!(f.next(), Some("S"));
        assert_eq!(f.next(), Some("1"));
    }

    #[test]
    fn paths_inside_a_root() {
        assert_eq!(within_root("/srv/r/app", "/srv/r").as_deref(), Some("/app"));
        assert_eq!(within_root("/srv/r", "/srv/r").as_deref(), Some("/"));
        assert_eq!(within_root("/srv/rx/app", "/srv/r"), None);
        assert_eq!(within_root("/elsewhere", "/srv/r"), None);
    }

    #[test]
    fn our_own_process() {
        let me = std::process::id() as i32;
        assert!(process_exists(me));
        assert!(threads(me).unwrap().contains(&me));
        assert_eq!(parent(me), Some(std::os::unix::process::parent_id() as i32));
        assert_eq!(
            cwd(me).as_deref(),
            std::env::current_dir()
                .ok()
                .as_deref()
                .and_then(|p| p.to_str())
        );
        assert!(exe_path(me).is_ok());
    }
}
