//! Pod and container names from kubelet's log directories, which every node has without the
//! API server (`pkg/kubelet/kuberuntime/kuberuntime_manager.go`, `BuildPodLogsDirectory`):
//!
//! - `/var/log/pods/<namespace>_<pod>_<uid>/<container>/<restart>.log`
//! - `/var/log/containers/<pod>_<namespace>_<container>-<container id>.log` (symlinks)
//!
//! Namespace, pod and container names cannot contain `_` (DNS labels and subdomains), so the
//! split is unambiguous. Directory names are taken lossily (hostile bytes become U+FFFD) and
//! escaped by the sinks.
use std::{collections::HashMap, fs, path::Path};

/// A pod's names, by its UID.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PodNames {
    pub namespace: String,
    pub name: String,
    /// Its containers' names (those kubelet has a log directory for), sorted.
    pub containers: Vec<String>,
}

/// Most directory entries read from one log directory: a node runs at most a few hundred pods
/// (kubelet's `--max-pods` default is 110); anything beyond is not a kubelet's.
pub(crate) const MAX_ENTRIES: usize = 16_384;
const MAX_CONTAINERS: usize = 64;

/// `<namespace>_<pod>_<uid>` → (namespace, pod, uid).
pub(crate) fn parse_pod_dir(name: &str) -> Option<(&str, &str, &str)> {
    let mut parts = name.split('_');
    let (ns, pod, uid) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() || ns.is_empty() || pod.is_empty() || uid.is_empty() {
        return None;
    }
    Some((ns, pod, uid))
}

/// `<pod>_<namespace>_<container>-<id>.log` → (container name, container id).
pub(crate) fn parse_container_log(name: &str) -> Option<(&str, &str)> {
    let stem = name.strip_suffix(".log")?;
    let (front, id) = stem.rsplit_once('-')?;
    let mut parts = front.split('_');
    let (_pod, _ns, container) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() || container.is_empty() || id.is_empty() {
        return None;
    }
    Some((container, id))
}

/// Every pod under `<root>/var/log/pods`, by UID.
pub(crate) fn read_pod_dirs(pods_dir: &Path) -> HashMap<String, PodNames> {
    let mut out = HashMap::new();
    let Ok(dir) = fs::read_dir(pods_dir) else {
        return out;
    };
    for e in dir.flatten().take(MAX_ENTRIES) {
        let fname = e.file_name();
        let fname = fname.to_string_lossy();
        let Some((ns, pod, uid)) = parse_pod_dir(&fname) else {
            continue;
        };
        let mut containers: Vec<String> = fs::read_dir(e.path())
            .map(|d| {
                d.flatten()
                    .take(MAX_CONTAINERS)
                    .filter(|c| c.file_type().is_ok_and(|t| t.is_dir()))
                    .map(|c| c.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        containers.sort();
        out.insert(
            uid.to_string(),
            PodNames {
                namespace: ns.to_string(),
                name: pod.to_string(),
                containers,
            },
        );
    }
    out
}

/// Container names by container id, from `<root>/var/log/containers`.
pub(crate) fn read_container_logs(containers_dir: &Path) -> HashMap<String, String> {
    let mut out = HashMap::new();
    let Ok(dir) = fs::read_dir(containers_dir) else {
        return out;
    };
    for e in dir.flatten().take(MAX_ENTRIES) {
        let fname = e.file_name();
        let fname = fname.to_string_lossy();
        if let Some((container, id)) = parse_container_log(&fname) {
            out.insert(id.to_string(), container.to_string());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::os::unix::ffi::OsStrExt;

    use super::*;

    #[test]
    fn pod_dir_names() {
        assert_eq!(
            parse_pod_dir(
                "kube-system_coredns-5d78c9869d-7xk2p_0f5c5b56-4c0a-4b8e-9a55-3f1f2e0d9c11"
            ),
            Some((
                "kube-system",
                "coredns-5d78c9869d-7xk2p",
                "0f5c5b56-4c0a-4b8e-9a55-3f1f2e0d9c11"
            ))
        );
        assert_eq!(parse_pod_dir("a_b"), None);
        assert_eq!(parse_pod_dir("a_b_c_d"), None);
        assert_eq!(parse_pod_dir("__"), None);
        assert_eq!(
            parse_container_log("coredns-5d78_kube-system_coredns-4d2b1a7c.log"),
            Some(("coredns", "4d2b1a7c"))
        );
        assert_eq!(parse_container_log("x.log"), None);
        assert_eq!(parse_container_log("a_b_c-d"), None);
    }

    #[test]
    fn reads_a_fixture_tree_with_hostile_names() {
        let root = std::env::temp_dir().join(format!("dnspath-logs-{}", std::process::id()));
        let pods = root.join("var/log/pods");
        let containers = root.join("var/log/containers");
        fs::create_dir_all(pods.join("kube-system_coredns-1_uid-1/coredns")).unwrap();
        fs::create_dir_all(pods.join("default_web_uid-2/app")).unwrap();
        fs::create_dir_all(pods.join("default_web_uid-2/sidecar")).unwrap();
        // Not UTF-8, with a terminal escape: read lossily, escaped later by the sinks.
        let evil = std::ffi::OsStr::from_bytes(b"ev\x1b[31mil\xff_p_uid-3");
        fs::create_dir_all(pods.join(evil).join("c")).unwrap();
        fs::create_dir_all(pods.join("not-a-pod-dir")).unwrap();
        fs::create_dir_all(&containers).unwrap();
        fs::write(containers.join("web_default_app-abc123.log"), "").unwrap();
        let by_uid = read_pod_dirs(&pods);
        assert_eq!(by_uid.len(), 3);
        assert_eq!(
            by_uid["uid-1"],
            PodNames {
                namespace: "kube-system".into(),
                name: "coredns-1".into(),
                containers: vec!["coredns".into()]
            }
        );
        assert_eq!(by_uid["uid-2"].containers, vec!["app", "sidecar"]);
        assert_eq!(by_uid["uid-3"].namespace, "ev\u{1b}[31mil\u{fffd}");
        assert_eq!(read_container_logs(&containers)["abc123"], "app");
        assert!(read_pod_dirs(&root.join("missing")).is_empty());
        fs::remove_dir_all(&root).unwrap();
    }
}
