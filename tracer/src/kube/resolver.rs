//! Network namespace → pod, refreshed when the attacher sees namespaces or interfaces change
//! (then a few times more, every 500 ms) and at its safety rescan (`attach::discover`).
//!
//! Each refresh looks only at processes it has not seen before, or first saw less than
//! [`REREADS`] refreshes ago (one `stat` of `/proc/<pid>/ns/net` and one bounded read of
//! `/proc/<pid>/cgroup` each), forgets those that are gone, and reads kubelet's log
//! directories only when a pod UID has no names yet (at most every [`LOGS_EVERY`]).
use std::{
    collections::{BTreeSet, HashMap, HashSet},
    fs::{self, File},
    io::Read,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, Instant},
};

use super::{
    cgroup::{parse_proc_cgroup, CgroupPod},
    logs::{read_container_logs, read_pod_dirs, PodNames, MAX_ENTRIES},
    Pod,
};
use crate::host;

/// A namespace's identity: device and inode of its nsfs file.
pub(crate) type NsKey = (u64, u64);

/// Longest `/proc/<pid>/cgroup` read: a v1 machine has a line per hierarchy, each well under
/// 4 KiB (PATH_MAX).
const MAX_CGROUP_FILE: u64 = 64 * 1024;
/// New processes looked at per refresh; the rest wait for the next one.
const MAX_NEW_PIDS: usize = 4096;
/// Most processes remembered.
const MAX_PIDS: usize = 4 * MAX_ENTRIES;
pub(crate) const LOGS_EVERY: Duration = Duration::from_secs(2);

#[derive(Clone, Debug)]
struct Process {
    netns: NsKey,
    pod: Option<CgroupPod>,
    /// Refreshes left that read it again: a container's first process shows up before the
    /// runtime has put it in its cgroup and namespace (`runc init`).
    rereads: u8,
}

/// Refreshes that read a new process again (2 s at the attacher's 500 ms follow-ups).
const REREADS: u8 = 4;

/// A namespace that belongs to a pod, and a path to open it by.
#[derive(Clone, Debug)]
pub(crate) struct PodNetns {
    pub pod: Arc<Pod>,
    pub path: PathBuf,
}

pub(crate) struct PodResolver {
    root: PathBuf,
    procs: HashMap<u32, Process>,
    names: HashMap<String, PodNames>,
    container_names: HashMap<String, String>,
    logs_read: Option<Instant>,
}

impl PodResolver {
    /// Reads under `root` (`/`, or `--host-root`).
    pub(crate) fn new(root: &Path) -> Self {
        Self {
            root: root.to_path_buf(),
            procs: HashMap::new(),
            names: HashMap::new(),
            container_names: HashMap::new(),
            logs_read: None,
        }
    }

    fn path(&self, abs: &str) -> PathBuf {
        host::under(&self.root, abs)
    }

    /// The host's own namespace (that of its pid 1): hostNetwork pods live there, and it is
    /// never one pod's.
    pub(crate) fn host_netns(&self) -> Option<NsKey> {
        ns_key(&self.path("/proc/1/ns/net"))
    }

    /// One pass over the processes: the pod of every namespace whose pod processes all belong
    /// to one pod (processes in no pod's cgroup are left out; two pods in one namespace make
    /// it no pod's). Namespaces in `not_pods` (the host's, the tracer's own) are never a pod's,
    /// whatever runs in them (hostNetwork pods).
    pub(crate) fn refresh(&mut self, not_pods: &HashSet<NsKey>) -> HashMap<NsKey, PodNetns> {
        self.scan_procs();
        let mut by_netns: HashMap<NsKey, (BTreeSet<&str>, BTreeSet<&str>, u32)> = HashMap::new();
        for (pid, p) in &self.procs {
            // Processes of no pod (`nsenter` from the node, a debugger) say nothing.
            let Some(c) = &p.pod else { continue };
            if not_pods.contains(&p.netns) {
                continue;
            }
            let e = by_netns
                .entry(p.netns)
                .or_insert_with(|| (BTreeSet::new(), BTreeSet::new(), *pid));
            e.0.insert(c.uid.as_str());
            if let Some(id) = &c.container_id {
                e.1.insert(id.as_str());
            }
        }
        let unnamed = by_netns
            .values()
            .filter_map(|(uids, _, _)| single(uids))
            .any(|uid| !uid.is_empty() && !self.names.contains_key(uid));
        let due = self.logs_read.is_none_or(|t| t.elapsed() >= LOGS_EVERY);
        if unnamed && due {
            self.logs_read = Some(Instant::now());
            self.names = read_pod_dirs(&self.path("/var/log/pods"));
            self.container_names = read_container_logs(&self.path("/var/log/containers"));
        }
        let mut out = HashMap::new();
        for (netns, (uids, ids, pid)) in by_netns {
            let Some(uid) = single(&uids).filter(|u| !u.is_empty()) else {
                continue;
            };
            let names = self.names.get(uid);
            let named: BTreeSet<(&str, &str)> = ids
                .iter()
                .filter_map(|id| Some((self.container_names.get(*id)?.as_str(), *id)))
                .collect();
            let (container, container_id) = if named.len() == 1 {
                named
                    .first()
                    .map(|(n, id)| (Some(n.to_string()), Some(id.to_string())))
                    .unwrap_or_default()
            } else {
                let only = names
                    .filter(|n| n.containers.len() == 1)
                    .and_then(|n| n.containers.first().cloned());
                // The one id seen is that container's only if nothing says otherwise: where
                // /var/log/containers names containers, an id it does not name is a sandbox's
                // (pause), e.g. while the container itself is restarting.
                let id = (only.is_some() && ids.len() == 1 && self.container_names.is_empty())
                    .then(|| ids.first().map(|s| s.to_string()))
                    .flatten();
                (only, id)
            };
            let pod = Pod {
                uid: uid.to_string(),
                label: names.map(|n| format!("{}/{}", n.namespace, n.name)),
                container,
                container_id,
            };
            out.insert(
                netns,
                PodNetns {
                    pod: Arc::new(pod),
                    path: self.path(&format!("/proc/{pid}/ns/net")),
                },
            );
        }
        out
    }

    /// Looks at new processes, forgets gone ones.
    fn scan_procs(&mut self) {
        let Ok(dir) = fs::read_dir(self.path("/proc")) else {
            return;
        };
        let mut live = HashSet::new();
        let mut fresh = 0;
        for e in dir.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            live.insert(pid);
            let rereads = match self.procs.get(&pid) {
                Some(p) if p.rereads == 0 => continue,
                Some(p) => p.rereads - 1,
                None if self.procs.len() >= MAX_PIDS => continue,
                None => REREADS,
            };
            if fresh >= MAX_NEW_PIDS {
                continue;
            }
            fresh += 1;
            let base = e.path();
            let Some(netns) = ns_key(&base.join("ns/net")) else {
                continue;
            };
            let pod = read_bounded(&base.join("cgroup")).and_then(|c| parse_proc_cgroup(&c));
            self.procs.insert(
                pid,
                Process {
                    netns,
                    pod,
                    rereads,
                },
            );
        }
        self.procs.retain(|pid, _| live.contains(pid));
    }
}

fn single<'a>(s: &BTreeSet<&'a str>) -> Option<&'a str> {
    (s.len() == 1).then(|| s.first().copied()).flatten()
}

pub(crate) fn ns_key(path: &Path) -> Option<NsKey> {
    let md = fs::metadata(path).ok()?;
    Some((md.dev(), md.ino()))
}

/// A small text file, at most [`MAX_CGROUP_FILE`] bytes of it, lossily.
fn read_bounded(path: &Path) -> Option<String> {
    let mut buf = Vec::new();
    File::open(path)
        .ok()?
        .take(MAX_CGROUP_FILE)
        .read_to_end(&mut buf)
        .ok()?;
    Some(String::from_utf8_lossy(&buf).into_owned())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;

    use super::*;

    const UID_A: &str = "0f5c5b56-4c0a-4b8e-9a55-3f1f2e0d9c11";
    const UID_B: &str = "9a8b7c6d-1111-2222-3333-444455556666";
    const ID_A: &str = "4d2b1a7c9e8f0a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293";

    /// A fake host root: `/proc/<pid>/{ns/net,cgroup}` where `ns/net` is a symlink to a
    /// file standing for the namespace (its inode is the identity), and kubelet's logs.
    struct Fixture(PathBuf);
    impl Fixture {
        fn new(tag: &str) -> Self {
            let root =
                std::env::temp_dir().join(format!("dnspath-pods-{tag}-{}", std::process::id()));
            let _ = fs::remove_dir_all(&root);
            fs::create_dir_all(root.join("ns")).unwrap();
            fs::create_dir_all(root.join("proc/1/ns")).unwrap();
            fs::write(root.join("ns/host"), "").unwrap();
            symlink(root.join("ns/host"), root.join("proc/1/ns/net")).unwrap();
            fs::write(root.join("proc/1/cgroup"), "0::/init.scope\n").unwrap();
            Self(root)
        }
        fn proc(&self, pid: u32, netns: &str, cgroup: &[u8]) {
            let ns = self.0.join("ns").join(netns);
            if !ns.exists() {
                fs::write(&ns, "").unwrap();
            }
            let dir = self.0.join(format!("proc/{pid}"));
            fs::create_dir_all(dir.join("ns")).unwrap();
            symlink(&ns, dir.join("ns/net")).unwrap();
            fs::write(dir.join("cgroup"), cgroup).unwrap();
        }
        fn key(&self, netns: &str) -> NsKey {
            ns_key(&self.0.join("ns").join(netns)).unwrap()
        }
    }
    impl Drop for Fixture {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn namespaces_to_pods() {
        let f = Fixture::new("map");
        let sd = UID_A.replace('-', "_");
        f.proc(10, "pod-a", format!("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{sd}.slice/cri-containerd-{ID_A}.scope\n").as_bytes());
        f.proc(11, "pod-a", format!("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{sd}.slice/cri-containerd-{ID_A}.scope\n").as_bytes());
        f.proc(
            20,
            "pod-b",
            format!("4:pids:/kubepods/besteffort/pod{UID_B}/abcdef0123456789\n").as_bytes(),
        );
        // hostNetwork pod: in the host namespace with a pod cgroup.
        f.proc(
            30,
            "host",
            format!("0::/kubepods/pod{UID_B}/abcdef0123456789\n").as_bytes(),
        );
        // A namespace of no pod; one of a pod with a process entered from the node (counts
        // for the pod); one with two pods' processes (no one's).
        f.proc(40, "plain", b"0::/system.slice/x.service\n");
        let b = format!("0::/kubepods/pod{UID_B}/abcdef0123456789\n");
        f.proc(50, "entered", b.as_bytes());
        f.proc(51, "entered", b"0::/user.slice\n");
        f.proc(52, "two", b.as_bytes());
        f.proc(53, "two", format!("0::/kubepods/pod{UID_A}/\n").as_bytes());
        // Hostile: binary garbage and a huge file.
        f.proc(60, "garbage", b"\xff\xfe\x00::::\n\x1b[31m");
        let huge = format!("0::/kubepods/pod{UID_A}/{}\n", "a".repeat(200_000));
        f.proc(61, "huge", huge.as_bytes());
        fs::create_dir_all(f.0.join(format!(
            "var/log/pods/kube-system_coredns-7d_{UID_A}/coredns"
        )))
        .unwrap();
        fs::create_dir_all(f.0.join("var/log/containers")).unwrap();
        fs::write(
            f.0.join(format!(
                "var/log/containers/coredns-7d_kube-system_coredns-{ID_A}.log"
            )),
            "",
        )
        .unwrap();

        let mut r = PodResolver::new(&f.0);
        let host = r.host_netns().unwrap();
        assert_eq!(host, f.key("host"));
        let pods = r.refresh(&HashSet::from([host]));
        let a = &pods[&f.key("pod-a")].pod;
        assert_eq!(a.uid, UID_A);
        assert_eq!(a.label.as_deref(), Some("kube-system/coredns-7d"));
        assert_eq!(a.container.as_deref(), Some("coredns"));
        assert_eq!(a.container_id.as_deref(), Some(ID_A));
        // No log directory for B: known by UID only.
        let b = &pods[&f.key("pod-b")].pod;
        assert_eq!((b.uid.as_str(), b.label.as_deref()), (UID_B, None));
        assert_eq!(pods[&f.key("entered")].pod.uid, UID_B);
        for not in ["host", "plain", "two", "garbage"] {
            assert!(!pods.contains_key(&f.key(not)), "{not}");
        }
        // Cut at 64 KiB: the container part is lost, the pod is not.
        assert_eq!(pods[&f.key("huge")].pod.uid, UID_A);

        // A new process is read again on the next few refreshes (the runtime moves it into its
        // cgroup just after it appears), then no more; a gone process is forgotten.
        fs::write(
            f.0.join("proc/40/cgroup"),
            format!("0::/kubepods/pod{UID_B}/\n"),
        )
        .unwrap();
        let pods = r.refresh(&HashSet::from([host]));
        assert_eq!(pods[&f.key("plain")].pod.uid, UID_B);
        for _ in 0..REREADS {
            r.refresh(&HashSet::from([host]));
        }
        fs::write(f.0.join("proc/20/cgroup"), "0::/\n").unwrap();
        fs::remove_dir_all(f.0.join("proc/10")).unwrap();
        let pods = r.refresh(&HashSet::from([host]));
        assert!(pods.contains_key(&f.key("pod-b")));
        assert!(!r.procs.contains_key(&10));
        assert_eq!(pods[&f.key("pod-a")].path, f.0.join("proc/11/ns/net"));
    }

    #[test]
    fn a_sandbox_alone_is_not_taken_for_the_container() {
        let f = Fixture::new("sandbox");
        let sd = UID_A.replace('-', "_");
        let pause = "c0ffee00".repeat(8);
        let scope = |id: &str| {
            format!("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{sd}.slice/cri-containerd-{id}.scope\n")
        };
        f.proc(10, "pod-a", scope(&pause).as_bytes());
        fs::create_dir_all(f.0.join(format!(
            "var/log/pods/kube-system_coredns-7d_{UID_A}/coredns"
        )))
        .unwrap();
        fs::create_dir_all(f.0.join("var/log/containers")).unwrap();
        let log = |id: &str| {
            f.0.join(format!(
                "var/log/containers/coredns-7d_kube-system_coredns-{id}.log"
            ))
        };
        fs::write(log(ID_A), "").unwrap();
        let mut r = PodResolver::new(&f.0);
        let pods = r.refresh(&HashSet::new());
        let a = &pods[&f.key("pod-a")].pod;
        assert_eq!(a.label.as_deref(), Some("kube-system/coredns-7d"));
        assert_eq!(a.container.as_deref(), Some("coredns"));
        assert_eq!(a.container_id, None, "the pause's id taken for coredns'");
        // With the container back, its id.
        f.proc(11, "pod-a", scope(ID_A).as_bytes());
        let pods = r.refresh(&HashSet::new());
        assert_eq!(
            pods[&f.key("pod-a")].pod.container_id.as_deref(),
            Some(ID_A)
        );
        // Without /var/log/containers the one id is all there is.
        let f = Fixture::new("sandbox-nologs");
        f.proc(10, "pod-a", scope(ID_A).as_bytes());
        fs::create_dir_all(f.0.join(format!(
            "var/log/pods/kube-system_coredns-7d_{UID_A}/coredns"
        )))
        .unwrap();
        let pods = PodResolver::new(&f.0).refresh(&HashSet::new());
        assert_eq!(
            pods[&f.key("pod-a")].pod.container_id.as_deref(),
            Some(ID_A)
        );
    }
}
