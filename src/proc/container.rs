//! Which container a process runs in, from its cgroup path (/proc/PID/cgroup).
//!
//! Owns: [`container_id`] and [`pod_uid`] of a live process, and [`parse_cgroup`], the
//! pure reading of the file's text they use.
//! - A container's id is the 64 hex digits its runtime names its cgroup after. The id is
//!   the last segment of the path that holds one, as each runtime writes it:
//!   - Docker, cgroupfs driver: `/docker/<id>`;
//!   - Docker, systemd driver: `/system.slice/docker-<id>.scope`;
//!   - containerd's CRI plugin: `.../cri-containerd-<id>.scope`, or `<id>` under a pod;
//!   - CRI-O: `crio-<id>.scope`; Podman: `libpod-<id>.scope`.
//! - A Kubernetes pod's uid is in the segment above the container's:
//!   - cgroupfs: `pod<uid>` (dashes), under `kubepods/`, `kubepods/burstable/` or
//!     `kubepods/besteffort/`;
//!   - systemd: `kubepods-<qos>-pod<uid>.slice` or `kubepods-pod<uid>.slice`, the uid's
//!     dashes written as underscores (given back with dashes).
//! - cgroup v1 lines (`N:controllers:path`) and the v2 line (`0::path`) are read alike.
//!   The first line that names a container answers.
//!
//! Must not: guess. A path that names no container gives None (a process of the host).

/// What a process's cgroup path says of its container.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Cgroup {
    /// The container's id (64 lowercase hex digits).
    pub(crate) container_id: Option<String>,
    /// The Kubernetes pod's uid (`xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`).
    pub(crate) pod_uid: Option<String>,
}

/// The id of the container process `pid` runs in; None for a process of the host, or
/// when its cgroup file cannot be read.
pub(crate) fn container_id(pid: i32) -> Option<String> {
    read(pid)?.container_id
}

/// The uid of the Kubernetes pod process `pid` runs in, if it runs in one.
pub(crate) fn pod_uid(pid: i32) -> Option<String> {
    read(pid)?.pod_uid
}

/// Both, from one read of the file.
fn read(pid: i32) -> Option<Cgroup> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    Some(parse_cgroup(&text))
}

/// What the text of a /proc/PID/cgroup file says (see the module's doc).
pub(crate) fn parse_cgroup(text: &str) -> Cgroup {
    for line in text.lines() {
        // `hierarchy:controllers:path`; the path may hold ':' itself.
        let Some(path) = line.splitn(3, ':').nth(2) else {
            continue;
        };
        let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
        let Some(at) = segments.iter().rposition(|s| id_in_segment(s).is_some()) else {
            continue;
        };
        return Cgroup {
            container_id: id_in_segment(segments[at]).map(str::to_string),
            pod_uid: segments[..at].iter().rev().find_map(|s| uid_in_segment(s)),
        };
    }
    Cgroup::default()
}

/// The container id a path segment is named after: 64 hex digits, alone or between a
/// runtime's prefix and `.scope`.
fn id_in_segment(segment: &str) -> Option<&str> {
    let s = segment.strip_suffix(".scope").unwrap_or(segment);
    let s = [
        "docker-",
        "cri-containerd-",
        "crio-",
        "libpod-",
        "containerd-",
    ]
    .iter()
    .find_map(|p| s.strip_prefix(p))
    .unwrap_or(s);
    let hex = |c: char| c.is_ascii_digit() || ('a'..='f').contains(&c);
    (s.len() == 64 && s.chars().all(hex)).then_some(s)
}

/// The pod uid a path segment is named after (`pod<uid>`, `kubepods[-qos]-pod<uid>.slice`),
/// with dashes.
fn uid_in_segment(segment: &str) -> Option<String> {
    let s = segment.strip_suffix(".slice").unwrap_or(segment);
    let at = s.rfind("pod")?;
    // `pod` begins the segment or follows `kubepods-` / `kubepods-<qos>-`.
    if at > 0 && !(s.starts_with("kubepods") && s[..at].ends_with('-')) {
        return None;
    }
    let uid = s[at + 3..].replace('_', "-");
    let groups: Vec<usize> = uid.split('-').map(str::len).collect();
    let hex = uid.chars().all(|c| c == '-' || c.is_ascii_hexdigit());
    (hex && groups == [8, 4, 4, 4, 12]).then_some(uid)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "4e1bf6a2f7c5d2a9b0e38c1f6d7a5b4c3e2d1f0a9b8c7d6e5f4a3b2c1d0e9f8a";
    const UID: &str = "8f3c2d1e-5b4a-4c3d-9e8f-7a6b5c4d3e2f";

    fn of(text: &str) -> Cgroup {
        parse_cgroup(text)
    }

    #[test]
    fn docker_cgroupfs_v1() {
        let text = format!(
            "12:pids:/docker/{ID}\n11:memory:/docker/{ID}\n1:name=systemd:/docker/{ID}\n0::/\n"
        );
        assert_eq!(of(&text).container_id.as_deref(), Some(ID));
        assert_eq!(of(&text).pod_uid, None);
    }

    #[test]
    fn docker_systemd_v2() {
        let text = format!("0::/system.slice/docker-{ID}.scope\n");
        assert_eq!(of(&text).container_id.as_deref(), Some(ID));
    }

    #[test]
    fn containerd_cri_under_a_burstable_pod_systemd_v2() {
        let under = UID.replace('-', "_");
        let text = format!(
            "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{under}.slice/\
             cri-containerd-{ID}.scope\n"
        );
        let c = of(&text);
        assert_eq!(c.container_id.as_deref(), Some(ID));
        assert_eq!(c.pod_uid.as_deref(), Some(UID));
    }

    #[test]
    fn a_besteffort_pod_cgroupfs_v1() {
        let text = format!(
            "11:cpu,cpuacct:/kubepods/besteffort/pod{UID}/{ID}\n\
             10:memory:/kubepods/besteffort/pod{UID}/{ID}\n"
        );
        let c = of(&text);
        assert_eq!(c.container_id.as_deref(), Some(ID));
        assert_eq!(c.pod_uid.as_deref(), Some(UID));
    }

    #[test]
    fn a_guaranteed_pod_systemd_and_crio() {
        let under = UID.replace('-', "_");
        let text = format!("0::/kubepods.slice/kubepods-pod{under}.slice/crio-{ID}.scope\n");
        let c = of(&text);
        assert_eq!(c.container_id.as_deref(), Some(ID));
        assert_eq!(c.pod_uid.as_deref(), Some(UID));
    }

    #[test]
    fn docker_in_docker_names_the_inner_container() {
        let inner = ID.replace('4', "5");
        let text = format!("0::/docker/{ID}/docker/{inner}\n");
        assert_eq!(of(&text).container_id.as_deref(), Some(&inner[..]));
    }

    #[test]
    fn processes_of_the_host_have_none() {
        for text in [
            "0::/\n",
            "0::/user.slice/user-1000.slice/session-2.scope\n",
            "4:memory:/process_api/6911cc5fb375194db6aa687917079a7e\n0::/\n",
            "0::/system.slice/docker.service\n",
            // One hex digit short, or upper case, is not an id a runtime gives.
            &format!("0::/docker/{}\n", &ID[1..]),
            &format!("0::/docker/{}\n", ID.to_uppercase()),
            "",
        ] {
            assert_eq!(of(text), Cgroup::default(), "{text:?}");
        }
    }

    #[test]
    fn a_pod_segment_must_be_a_uid() {
        assert_eq!(uid_in_segment("podcast"), None);
        assert_eq!(uid_in_segment("mypod1234"), None);
        assert_eq!(uid_in_segment(&format!("pod{UID}")).as_deref(), Some(UID));
    }

    #[test]
    fn our_own_process_reads_without_error() {
        // Whatever this test runs in, the read gives an answer, not a panic.
        let _ = read(std::process::id() as i32).expect("our own cgroup file");
    }
}
