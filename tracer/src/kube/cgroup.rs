//! Which pod and container a process belongs to, from its `/proc/<pid>/cgroup`.
//!
//! kubelet places every container under a per-pod cgroup whose name carries the pod's UID
//! (`pkg/kubelet/cm/cgroup_manager_linux.go`, `pod_container_manager_linux.go`):
//!
//! - systemd driver: `/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<UID>.slice/`
//!   with `_` for every `-` of the UID (systemd reserves `-` as the slice separator), then the
//!   runtime's scope: `cri-containerd-<id>.scope`, `crio-<id>.scope`, `docker-<id>.scope`.
//! - cgroupfs driver: `/kubepods/burstable/pod<UID>/<id>` (Guaranteed pods sit right under
//!   `/kubepods`), the container directory being the bare id (containerd, docker) or
//!   `crio-<id>`.
//!
//! With cgroup v1 every controller hierarchy has a line; with v2 there is one `0::` line;
//! hybrid machines have both. Any line naming a pod is taken.

/// The pod (and, where the process is in a container's cgroup, the container) a cgroup path
/// names.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct CgroupPod {
    /// The pod's UID as the API server spells it (with `-`).
    pub uid: String,
    /// Container id (hex) when the path goes down to a container's cgroup.
    pub container_id: Option<String>,
}

/// The pod named by any line of a `/proc/<pid>/cgroup` file.
pub(crate) fn parse_proc_cgroup(content: &str) -> Option<CgroupPod> {
    content.lines().find_map(|line| {
        // `hierarchy-ID:controller-list:cgroup-path`; the path may itself contain `:`.
        let mut parts = line.splitn(3, ':');
        let _id = parts.next()?;
        let _controllers = parts.next()?;
        parse_cgroup_path(parts.next()?)
    })
}

/// The pod named by one cgroup path.
pub(crate) fn parse_cgroup_path(path: &str) -> Option<CgroupPod> {
    let comps: Vec<&str> = path.split('/').filter(|c| !c.is_empty()).collect();
    let mut saw_kubepods = false;
    for (i, c) in comps.iter().enumerate() {
        if *c == "kubepods" {
            saw_kubepods = true;
            continue;
        }
        let uid = if let Some(slice) = c.strip_suffix(".slice") {
            // systemd: `kubepods-pod<UID>`, `kubepods-burstable-pod<UID>`, also with a
            // prefix (`kubelet-kubepods-…` under kind).
            if !slice.contains("kubepods") {
                continue;
            }
            match slice.rfind("-pod") {
                Some(at) => slice[at + 4..].replace('_', "-"),
                None => continue,
            }
        } else if saw_kubepods {
            match c.strip_prefix("pod") {
                Some(uid) => uid.to_string(),
                None => continue,
            }
        } else {
            continue;
        };
        if !valid_uid(&uid) {
            continue;
        }
        let container_id = comps.get(i + 1).and_then(|next| container_id(next));
        return Some(CgroupPod { uid, container_id });
    }
    None
}

/// A pod UID: a UUID (`8-4-4-4-12` hex), or for static pods the 32-hex-digit hash kubelet
/// uses in its place.
fn valid_uid(uid: &str) -> bool {
    (32..=36).contains(&uid.len()) && uid.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-')
}

/// The container id in a container cgroup's name.
fn container_id(comp: &str) -> Option<String> {
    let id = if let Some(scope) = comp.strip_suffix(".scope") {
        ["cri-containerd-", "crio-", "docker-"]
            .iter()
            .find_map(|p| scope.strip_prefix(p))?
    } else {
        comp.strip_prefix("crio-")
            .or_else(|| comp.strip_prefix("docker-"))
            .unwrap_or(comp)
    };
    ((12..=128).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_hexdigit()))
        .then(|| id.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "0f5c5b56-4c0a-4b8e-9a55-3f1f2e0d9c11";
    const UID_: &str = "0f5c5b56_4c0a_4b8e_9a55_3f1f2e0d9c11";
    const ID: &str = "4d2b1a7c9e8f0a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293";

    fn pod(container: Option<&str>) -> Option<CgroupPod> {
        Some(CgroupPod {
            uid: UID.into(),
            container_id: container.map(str::to_string),
        })
    }

    #[test]
    fn systemd_driver_containerd_v2() {
        let f = format!("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/cri-containerd-{ID}.scope\n");
        assert_eq!(parse_proc_cgroup(&f), pod(Some(ID)));
    }

    #[test]
    fn systemd_driver_guaranteed_crio_and_besteffort_docker() {
        let p = format!("/kubepods.slice/kubepods-pod{UID_}.slice/crio-{ID}.scope");
        assert_eq!(parse_cgroup_path(&p), pod(Some(ID)));
        let p = format!("/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice/docker-{ID}.scope");
        assert_eq!(parse_cgroup_path(&p), pod(Some(ID)));
    }

    #[test]
    fn systemd_driver_pod_level_and_kind_prefix() {
        // The pod's own slice (e.g. a process moved there), and kind's kubelet.slice nesting.
        let p =
            format!("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice");
        assert_eq!(parse_cgroup_path(&p), pod(None));
        let p = format!("/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod{UID_}.slice/cri-containerd-{ID}.scope");
        assert_eq!(parse_cgroup_path(&p), pod(Some(ID)));
    }

    #[test]
    fn cgroupfs_driver_v1_hybrid() {
        // cgroup v1 (and hybrid): one line per hierarchy, any of which names the pod.
        let f = format!(
            "12:pids:/kubepods/burstable/pod{UID}/{ID}\n11:memory:/kubepods/burstable/pod{UID}/{ID}\n1:name=systemd:/kubepods/burstable/pod{UID}/{ID}\n0::/\n"
        );
        assert_eq!(parse_proc_cgroup(&f), pod(Some(ID)));
        // Guaranteed: right under /kubepods; CRI-O names the container `crio-<id>`.
        let p = format!("/kubepods/pod{UID}/crio-{ID}");
        assert_eq!(parse_cgroup_path(&p), pod(Some(ID)));
        let p = format!("/kubepods/besteffort/pod{UID}/docker-{ID}");
        assert_eq!(parse_cgroup_path(&p), pod(Some(ID)));
    }

    #[test]
    fn under_a_parent_and_static_pod_hash() {
        // kubelet's --cgroup-root, or a lab's parent: the kubepods part is found anywhere.
        let p = format!("/lab-1234/kubepods/besteffort/pod{UID}/{ID}");
        assert_eq!(parse_cgroup_path(&p), pod(Some(ID)));
        let hash = "5d41402abc4b2a76b9719d911017c592";
        let p = format!("/kubepods.slice/kubepods-pod{hash}.slice/cri-containerd-{ID}.scope");
        assert_eq!(parse_cgroup_path(&p).map(|c| c.uid), Some(hash.to_string()));
    }

    #[test]
    fn not_pods() {
        for p in [
            "/",
            "/system.slice/containerd.service",
            "/user.slice/user-1000.slice/session-2.scope",
            // `pod<UID>` outside a kubepods tree is not kubelet's.
            "/machine.slice/pod0f5c5b56-4c0a-4b8e-9a55-3f1f2e0d9c11",
            "/kubepods/burstable/podnot-a-uid",
            "/kubepods.slice/kubepods-burstable.slice",
        ] {
            assert_eq!(parse_cgroup_path(p), None, "{p}");
        }
        // A container part that is not a container id is left out, the pod kept.
        let p = format!("/kubepods/burstable/pod{UID}/../../x");
        assert_eq!(parse_cgroup_path(&p), pod(None));
    }

    #[test]
    fn hostile_contents() {
        assert_eq!(parse_proc_cgroup(""), None);
        assert_eq!(parse_proc_cgroup("garbage\n::\n:::::\n\u{fffd}\u{0}"), None);
        let long = "/kubepods/".repeat(10_000);
        assert_eq!(parse_cgroup_path(&long), None);
        let f = format!("0::/kubepods/pod{UID}/\u{1b}[31m\n");
        assert_eq!(parse_proc_cgroup(&f), pod(None));
    }
}
