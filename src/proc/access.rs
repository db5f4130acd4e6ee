//! Why we may not read a process, and what to do about it.
//!
//! Owns: turning a failed OS call on a target into the right [`Error`] ([`os_error`]: gone,
//! not allowed, or other), and the permission message that names the missing capability
//! from the facts (our uid and capabilities, the target's owner, seccomp, Yama).
//! Must not: print; decide exit codes (that is `error`).

use crate::error::Error;
use std::io;

/// Builds the error for an OS failure on something belonging to process `pid`, telling
/// apart "gone", "not allowed" and the rest.
pub(crate) fn os_error(pid: i32, what: &str, err: io::Error) -> Error {
    match err.raw_os_error() {
        Some(libc::ESRCH) | Some(libc::ENOENT) => {
            if super::process_exists(pid) {
                Error::io(what, err)
            } else {
                Error::ProcessExited(pid)
            }
        }
        Some(libc::EPERM) | Some(libc::EACCES) => permission_denied(pid, what),
        _ => Error::io(format!("{what} of process {pid}"), err),
    }
}

/// The permission error with the capability that is missing and how to grant it.
pub(crate) fn permission_denied(pid: i32, what: &str) -> Error {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let facts = AccessFacts {
        euid: nix::unistd::geteuid().as_raw(),
        target_uid: std::fs::metadata(format!("/proc/{pid}"))
            .ok()
            .map(|m| std::os::unix::fs::MetadataExt::uid(&m)),
        has_cap_sys_ptrace: status_field(&status, "CapEff")
            .and_then(|v| u64::from_str_radix(v, 16).ok())
            .map(|caps| caps & (1 << CAP_SYS_PTRACE) != 0),
        seccomp_filter: status_field(&status, "Seccomp") == Some("2"),
        yama_scope: std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope")
            .ok()
            .and_then(|s| s.trim().parse().ok()),
    };
    Error::PermissionDenied {
        pid,
        what: what.to_string(),
        fix: permission_fix(&facts),
    }
}

/// Whether we run under a seccomp filter (`Seccomp: 2` in /proc/self/status).
pub(crate) fn seccomp_filtered() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status_field(&status, "Seccomp") == Some("2")
}

/// The capability number of CAP_SYS_PTRACE (linux/capability.h).
const CAP_SYS_PTRACE: u32 = 19;

fn status_field<'a>(status: &'a str, name: &str) -> Option<&'a str> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':').map(|v| v.trim()))
}

/// What decides whether we may read another process (ptrace access mode "read").
#[derive(Debug, Clone, Default)]
struct AccessFacts {
    euid: u32,
    /// The owner of /proc/PID, when readable.
    target_uid: Option<u32>,
    /// Whether CAP_SYS_PTRACE is in our effective set (None: unknown).
    has_cap_sys_ptrace: Option<bool>,
    /// We run under a seccomp filter (a container's default profile, say).
    seccomp_filter: bool,
    /// kernel.yama.ptrace_scope, when Yama is present.
    yama_scope: Option<u32>,
}

/// One line: what is missing, then how to grant it, most likely cause first.
fn permission_fix(f: &AccessFacts) -> String {
    let mut parts: Vec<String> = Vec::new();
    let in_container_hint = "in Docker start the container with `--cap-add SYS_PTRACE` \
        (Kubernetes: securityContext.capabilities.add: [\"SYS_PTRACE\"]), or run scalene-rs \
        from the host";
    match (f.euid, f.has_cap_sys_ptrace) {
        (0, Some(false)) => parts.push(format!(
            "scalene-rs runs as root but without CAP_SYS_PTRACE (its capabilities were \
             dropped, as in a container started without it): {in_container_hint}"
        )),
        (0, Some(true)) if f.seccomp_filter => parts.push(
            "scalene-rs runs as root with CAP_SYS_PTRACE, but under a seccomp filter that \
             refuses process_vm_readv or ptrace (a container's profile): start the container \
             with `--cap-add SYS_PTRACE` (Docker's default profile then allows both) or \
             `--security-opt seccomp=unconfined`, or run scalene-rs from the host"
                .into(),
        ),
        (0, Some(true)) => parts.push(
            "scalene-rs runs as root with CAP_SYS_PTRACE, yet the kernel refused: a security \
             module (Yama, AppArmor, SELinux) or the target's user namespace forbids it; run \
             scalene-rs from the host, outside any container"
                .into(),
        ),
        _ => match f.target_uid {
            Some(uid) if uid != f.euid => parts.push(format!(
                "reading another user's process needs CAP_SYS_PTRACE: the process belongs to \
                 uid {uid} and scalene-rs runs as uid {}; run scalene-rs as that user or as \
                 root (sudo); {in_container_hint}",
                f.euid
            )),
            _ => parts.push(format!(
                "reading another process needs ptrace access (CAP_SYS_PTRACE); run \
                 scalene-rs as root (sudo); {in_container_hint}"
            )),
        },
    }
    if f.seccomp_filter && !(f.euid == 0 && f.has_cap_sys_ptrace == Some(true)) {
        parts.push(
            "scalene-rs runs under a seccomp filter that may refuse process_vm_readv and ptrace \
             (older Docker releases' default profile, and custom profiles, allow them only with \
             `--cap-add SYS_PTRACE`; else `--security-opt seccomp=unconfined`)"
                .into(),
        );
    }
    match f.yama_scope {
        Some(1) if f.has_cap_sys_ptrace != Some(true) => parts.push(
            "Yama allows ptrace only of one's own descendants (kernel.yama.ptrace_scope=1): \
             run scalene-rs with CAP_SYS_PTRACE (sudo), or `sysctl kernel.yama.ptrace_scope=0`"
                .into(),
        ),
        Some(2) => parts.push(
            "Yama allows ptrace only with CAP_SYS_PTRACE (kernel.yama.ptrace_scope=2): run \
             scalene-rs as root (sudo)"
                .into(),
        ),
        Some(3) => parts.push(
            "Yama forbids ptrace altogether (kernel.yama.ptrace_scope=3) until the next reboot"
                .into(),
        ),
        _ => {}
    }
    parts.join("; also, ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fix_names_what_is_missing() {
        let dropped = AccessFacts {
            euid: 0,
            target_uid: Some(0),
            has_cap_sys_ptrace: Some(false),
            ..Default::default()
        };
        let m = permission_fix(&dropped);
        assert!(m.contains("without CAP_SYS_PTRACE"), "{m}");
        assert!(m.contains("--cap-add SYS_PTRACE"), "{m}");
        assert!(!m.contains("sudo"), "root already: {m}");

        let other_user = AccessFacts {
            euid: 1000,
            target_uid: Some(0),
            has_cap_sys_ptrace: Some(false),
            ..Default::default()
        };
        let m = permission_fix(&other_user);
        assert!(
            m.contains("uid 0") && m.contains("uid 1000") && m.contains("sudo"),
            "{m}"
        );

        let sandboxed = AccessFacts {
            euid: 0,
            has_cap_sys_ptrace: Some(true),
            seccomp_filter: true,
            yama_scope: Some(3),
            ..Default::default()
        };
        let m = permission_fix(&sandboxed);
        assert!(m.contains("seccomp") && m.contains("ptrace_scope=3"), "{m}");
        assert!(
            m.contains("--cap-add SYS_PTRACE") && !m.contains("sudo"),
            "{m}"
        );
        assert!(!m.contains('\n'));
        let yama1 = AccessFacts {
            euid: 1000,
            target_uid: Some(1000),
            has_cap_sys_ptrace: Some(false),
            yama_scope: Some(1),
            ..Default::default()
        };
        assert!(permission_fix(&yama1).contains("ptrace_scope=0"));
    }

    #[test]
    fn status_fields() {
        let s = "Name:\tx\nCapEff:\t000001ffffffffff\nSeccomp:\t2\n";
        assert_eq!(status_field(s, "CapEff"), Some("000001ffffffffff"));
        assert_eq!(status_field(s, "Seccomp"), Some("2"));
        assert_eq!(status_field(s, "Cap"), None);
    }
}
