//! The container a process runs in, from the cgroup path of `/proc/PID/cgroup`.
//!
//! Owns: [`container_id`] and [`pod_uid`], and their parsers over the file's text
//! ([`container_id_of`], [`pod_uid_of`]), which the tests feed with the paths runtimes write:
//! - Docker: `/docker/ID` (cgroup v1), `/system.slice/docker-ID.scope` (systemd driver);
//! - containerd and CRI: `/…/cri-containerd-ID.scope`, `/containerd/ID`, `/…/crio-ID.scope`;
//! - Podman: `/…/libpod-ID.scope`;
//! - Kubernetes: `/kubepods/burstable/podUID/ID` (cgroupfs driver) and
//!   `/kubepods.slice/…/kubepods-burstable-podUID.slice/cri-containerd-ID.scope` (systemd
//!   driver, the uid's dashes written as underscores).
//!
//! An id is 64 lowercase hex digits, as every runtime above makes them; a path with none is
//! a process outside containers (`/user.slice/…`, `/init.scope`, `/`).
//! Must not: enter the process's namespaces or read anything but its cgroup file.

/// The id of the container `pid` runs in, when it runs in one.
pub fn container_id(pid: i32) -> Option<String> {
    container_id_of(&std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?)
}

/// The Kubernetes pod uid of `pid`, when its cgroup path names one.
pub fn pod_uid(pid: i32) -> Option<String> {
    pod_uid_of(&std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?)
}

/// The cgroup paths of a `/proc/PID/cgroup` text (`ID:CONTROLLERS:PATH` a line).
fn paths(cgroup: &str) -> impl Iterator<Item = &str> {
    cgroup
        .lines()
        .filter_map(|l| l.splitn(3, ':').nth(2))
        .filter(|p| !p.is_empty())
}

/// The container id in a `/proc/PID/cgroup` text: the innermost path component that holds
/// one, on the first line that has any.
pub fn container_id_of(cgroup: &str) -> Option<String> {
    paths(cgroup).find_map(|path| path.rsplit('/').find_map(id_in_component))
}

/// A 64-hex id in one path component: the whole component, or after the last `-` with a
/// `.scope` suffix (`docker-ID.scope`, `cri-containerd-ID.scope`).
fn id_in_component(c: &str) -> Option<String> {
    let c = c.strip_suffix(".scope").unwrap_or(c);
    let id = c.rsplit('-').next().unwrap_or(c);
    let hex = id.len() == 64
        && id
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    hex.then(|| id.to_string())
}

/// The pod uid in a `/proc/PID/cgroup` text: a component `podUID` (cgroupfs) or
/// `kubepods-CLASS-podUID.slice` (systemd, underscores for dashes), the uid 36 characters
/// long with its dashes.
pub fn pod_uid_of(cgroup: &str) -> Option<String> {
    paths(cgroup)
        .filter(|p| p.contains("kubepods"))
        .find_map(|path| {
            path.split('/').find_map(|c| {
                let c = c.strip_suffix(".slice").unwrap_or(c);
                let uid = c.rsplit_once("pod").map(|(_, u)| u)?.replace('_', "-");
                let shape = uid.len() == 36
                    && uid.bytes().enumerate().all(|(i, b)| match i {
                        8 | 13 | 18 | 23 => b == b'-',
                        _ => b.is_ascii_hexdigit(),
                    });
                shape.then_some(uid)
            })
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "3f1c0e2a9b8d7c6e5f4a3b2c1d0e9f8a7b6c5d4e3f2a1b0c9d8e7f6a5b4c3d2e";
    const UID: &str = "0a1b2c3d-4e5f-6789-abcd-ef0123456789";

    #[test]
    fn docker_paths_give_the_container_id() {
        let v1 = format!("12:pids:/docker/{ID}\n11:memory:/docker/{ID}\n");
        assert_eq!(container_id_of(&v1).as_deref(), Some(ID));
        let v2 = format!("0::/system.slice/docker-{ID}.scope\n");
        assert_eq!(container_id_of(&v2).as_deref(), Some(ID));
    }

    #[test]
    fn containerd_crio_and_podman_paths_give_the_container_id() {
        for path in [
            format!("/system.slice/containerd.service/cri-containerd-{ID}.scope"),
            format!("/containerd/{ID}"),
            format!("/machine.slice/crio-{ID}.scope"),
            format!("/user.slice/user-1000.slice/user@1000.service/libpod-{ID}.scope"),
        ] {
            let text = format!("0::{path}\n");
            assert_eq!(container_id_of(&text).as_deref(), Some(ID), "{path}");
        }
    }

    #[test]
    fn kubernetes_paths_give_the_container_and_the_pod() {
        let cgroupfs = format!("0::/kubepods/burstable/pod{UID}/{ID}\n");
        assert_eq!(container_id_of(&cgroupfs).as_deref(), Some(ID));
        assert_eq!(pod_uid_of(&cgroupfs).as_deref(), Some(UID));
        let systemd = format!(
            "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{}.slice/\
             cri-containerd-{ID}.scope\n",
            UID.replace('-', "_")
        );
        assert_eq!(container_id_of(&systemd).as_deref(), Some(ID));
        assert_eq!(pod_uid_of(&systemd).as_deref(), Some(UID));
    }

    #[test]
    fn a_process_outside_containers_has_none() {
        for text in [
            "0::/user.slice/user-1000.slice/session-2.scope\n",
            "0::/init.scope\n",
            "0::/\n",
            "12:pids:/\n1:name=systemd:/system.slice/ssh.service\n",
            "",
        ] {
            assert_eq!(container_id_of(text), None, "{text:?}");
            assert_eq!(pod_uid_of(text), None, "{text:?}");
        }
        // Almost an id: 63 digits, or upper case.
        assert_eq!(container_id_of(&format!("0::/docker/{}\n", &ID[1..])), None);
        assert_eq!(
            container_id_of(&format!("0::/docker/{}\n", ID.to_uppercase())),
            None
        );
    }
}
