//! Makes a lab's pods look like a kubelet's on a real node, for pod attribution: each pod's
//! process in a real cgroup named the way kubelet names them, and kubelet's log directories
//! under a lab-private host root (passed to dnspath with `--host-root`; `/proc` and `/run`
//! are symlinked into it, so nothing is created under the machine's real `/var/log/pods`).
//!
//! Forms used, so that both parsers run against real kernel output: the client and the first
//! "CoreDNS" pod under the systemd driver's naming in the cgroup v2 hierarchy
//! (`cri-containerd-<id>.scope`, `crio-<id>.scope`), the other "CoreDNS" pods under the
//! cgroupfs driver's (`kubepods/burstable/pod<UID>/<id>`) in the v1 `pids` hierarchy where the
//! machine has one (hybrid), else in v2. All under a lab-unique parent, removed on drop; only
//! PIDs this lab started are moved, and moved back first.
use std::{
    collections::hash_map::DefaultHasher,
    fs,
    hash::{Hash, Hasher},
    os::unix::fs::symlink,
    path::{Path, PathBuf},
    process::Child,
};

use crate::{Lab, LabError, Pod};

/// Start of the [`LabError::Config`] message when this machine's cgroups cannot be written.
pub const NO_CGROUPS: &str = "cgroups not writable here";

/// One pod as kubelet would know it.
#[derive(Clone, Debug)]
pub struct FakePod {
    /// The lab pod; `None` for the hostNetwork pod in the node's namespace.
    pub pod: Option<Pod>,
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub container: String,
    pub container_id: String,
}

impl FakePod {
    /// `namespace/name`, as dnspath names it.
    pub fn label(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

pub struct KubeletPods {
    pub host_root: PathBuf,
    pub pods: Vec<FakePod>,
    /// Cgroup directories made, parents first.
    cgroups: Vec<PathBuf>,
    /// Processes moved: pid, and the `cgroup.procs` it came from.
    moved: Vec<(u32, PathBuf)>,
    /// Processes started here: the client pod's (its "pause"), and a hostNetwork pod's in
    /// the node namespace.
    children: Vec<Child>,
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> LabError {
    let what = what.into();
    move |source| LabError::Io { what, source }
}

/// The cgroup v2 mount: `/sys/fs/cgroup` (unified) or `/sys/fs/cgroup/unified` (hybrid).
fn v2_root() -> Option<PathBuf> {
    ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| {
            p.join("cgroup.controllers").exists() || p.join("cgroup.subtree_control").exists()
        })
}

/// The v1 `pids` hierarchy of a hybrid or v1 machine.
fn v1_pids_root() -> Option<PathBuf> {
    let p = PathBuf::from("/sys/fs/cgroup/pids");
    p.join("cgroup.procs").exists().then_some(p)
}

/// The cgroup `pid` is in, in the hierarchy mounted at `root` (v2 if `controller` is empty).
fn current_cgroup(pid: u32, root: &Path, controller: &str) -> Option<PathBuf> {
    let text = fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    text.lines().find_map(|l| {
        let mut parts = l.splitn(3, ':');
        let (_, ctrl, path) = (parts.next()?, parts.next()?, parts.next()?);
        let hit = if controller.is_empty() {
            ctrl.is_empty()
        } else {
            ctrl.split(',').any(|c| c == controller)
        };
        hit.then(|| root.join(path.trim_start_matches('/')))
    })
}

/// Waits until `ip netns exec` (`pid`) has entered its namespace and become `comm`: a tracer
/// started earlier would see the process in the namespace it came from.
fn wait_exec(pid: u32, comm: &str) -> Result<(), LabError> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let now = fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        if now.trim() == comm {
            return Ok(());
        }
        if std::time::Instant::now() > deadline {
            return Err(LabError::Config(format!(
                "process {pid} did not become {comm} within 10 s"
            )));
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

impl KubeletPods {
    /// Places the client's (a `sleep` started here) and every "CoreDNS" pod's process.
    pub fn create(lab: &Lab) -> Result<KubeletPods, LabError> {
        let v2 = v2_root()
            .ok_or_else(|| LabError::Config(format!("{NO_CGROUPS}: no cgroup v2 hierarchy")))?;
        let v1 = v1_pids_root();
        let prefix = lab.prefix().to_string();
        let mut h = DefaultHasher::new();
        prefix.hash(&mut h);
        let seed = h.finish();
        let mut me = KubeletPods {
            host_root: lab.temp_dir().join("hostroot"),
            pods: Vec::new(),
            cgroups: Vec::new(),
            moved: Vec::new(),
            children: Vec::new(),
        };
        // Host root: the real /proc and /run (netns), private kubelet logs.
        fs::create_dir_all(me.host_root.join("var/log/containers")).map_err(io("host root"))?;
        symlink("/proc", me.host_root.join("proc")).map_err(io("host root proc"))?;
        symlink("/run", me.host_root.join("run")).map_err(io("host root run"))?;

        let client = lab.spawn_in(lab.client_ns(), &["sleep", "3600"])?;
        let client_pid = client.id();
        me.children.push(client);
        wait_exec(client_pid, "sleep")?;
        // A hostNetwork pod (kube-proxy's kind): in a pod cgroup, in the node's namespace,
        // which must stay the node's.
        let host_pod = lab.spawn_in(lab.node_ns(), &["sleep", "3600"])?;
        let host_pid = host_pod.id();
        me.children.push(host_pod);
        wait_exec(host_pid, "sleep")?;
        let mut procs = vec![(Some(Pod::Client), client_pid), (None, host_pid)];
        for i in 0..lab.dns_pod_count() {
            if let Some(pid) = lab.server_pid(Pod::Dns(i)) {
                procs.push((Some(Pod::Dns(i)), pid));
            }
        }
        for (n, (pod, pid)) in procs.into_iter().enumerate() {
            let n = n as u64;
            let uid = format!(
                "{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}",
                seed >> 32,
                seed & 0xffff,
                n,
                (seed >> 16) & 0xfff,
                (seed ^ n) & 0xffff_ffff_ffff
            );
            let container_id = format!("{:016x}", seed ^ (n + 1)).repeat(4);
            let (namespace, name, container) = match pod {
                Some(Pod::Dns(i)) => (
                    "kube-system".to_string(),
                    format!("coredns-{prefix}-{}", char::from(b'a' + (i % 26) as u8)),
                    "coredns",
                ),
                Some(_) => ("default".to_string(), format!("client-{prefix}"), "dig"),
                None => (
                    "kube-system".to_string(),
                    format!("kube-proxy-{prefix}"),
                    "kube-proxy",
                ),
            };
            let uid_ = uid.replace('-', "_");
            let base = format!("dnspath-lab-{prefix}");
            let (root, controller, path) = match (pod, &v1) {
                (Some(Pod::Client) | None, _) => (
                    v2.clone(),
                    "",
                    format!("{base}/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{uid_}.slice/cri-containerd-{container_id}.scope"),
                ),
                (Some(Pod::Dns(0)), _) => (
                    v2.clone(),
                    "",
                    format!("{base}/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid_}.slice/crio-{container_id}.scope"),
                ),
                (_, Some(v1)) => (
                    v1.clone(),
                    "pids",
                    format!("{base}/kubepods/burstable/pod{uid}/{container_id}"),
                ),
                (_, None) => (
                    v2.clone(),
                    "",
                    format!("{base}/kubepods/burstable/pod{uid}/{container_id}"),
                ),
            };
            me.place(pid, &root, controller, &path)?;
            let dir = me
                .host_root
                .join(format!("var/log/pods/{namespace}_{name}_{uid}/{container}"));
            fs::create_dir_all(&dir).map_err(io("pod log dir"))?;
            fs::write(dir.join("0.log"), "").map_err(io("pod log"))?;
            symlink(
                dir.join("0.log"),
                me.host_root.join(format!(
                    "var/log/containers/{name}_{namespace}_{container}-{container_id}.log"
                )),
            )
            .map_err(io("container log link"))?;
            me.pods.push(FakePod {
                pod,
                namespace,
                name,
                uid,
                container: container.to_string(),
                container_id,
            });
        }
        Ok(me)
    }

    /// Makes the cgroup `root/path` (each missing level) and moves `pid` into it.
    fn place(
        &mut self,
        pid: u32,
        root: &Path,
        controller: &str,
        path: &str,
    ) -> Result<(), LabError> {
        let mut dir = root.to_path_buf();
        for comp in path.split('/') {
            dir.push(comp);
            if !dir.exists() {
                fs::create_dir(&dir).map_err(|e| match e.raw_os_error() {
                    // A read-only or delegated cgroup tree (some containers): the machine
                    // cannot host this lab, which is no failure of dnspath's.
                    Some(libc::EROFS | libc::EACCES | libc::EPERM) => {
                        LabError::Config(format!("{NO_CGROUPS}: mkdir {}: {e}", dir.display()))
                    }
                    _ => LabError::Io {
                        what: format!("mkdir {}", dir.display()),
                        source: e,
                    },
                })?;
                self.cgroups.push(dir.clone());
            }
        }
        let from = current_cgroup(pid, root, controller)
            .unwrap_or_else(|| root.to_path_buf())
            .join("cgroup.procs");
        fs::write(dir.join("cgroup.procs"), pid.to_string())
            .map_err(io(format!("move {pid} to {}", dir.display())))?;
        self.moved.push((pid, from));
        Ok(())
    }

    pub fn of(&self, pod: Pod) -> Option<&FakePod> {
        self.pods.iter().find(|p| p.pod == Some(pod))
    }
}

impl Drop for KubeletPods {
    fn drop(&mut self) {
        for mut c in self.children.drain(..) {
            let _ = c.kill();
            let _ = c.wait();
        }
        for (pid, from) in self.moved.drain(..).rev() {
            // A process that exited needs no moving.
            let _ = fs::write(&from, pid.to_string());
        }
        for dir in self.cgroups.drain(..).rev() {
            if let Err(e) = fs::remove_dir(&dir) {
                eprintln!("lab: could not remove cgroup {}: {e}", dir.display());
            }
        }
        let _ = fs::remove_dir_all(&self.host_root);
    }
}
