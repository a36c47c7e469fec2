//! Makes a lab's pods look like a kubelet's on a real node, for pod attribution: each pod's
//! process in a real cgroup named the way kubelet names them, and kubelet's log directories
//! under a lab-private host root (passed to dnspath with `--host-root`; `/proc` and `/run`
//! are symlinked into it, so nothing is created under the machine's real `/var/log/pods`).
//!
//! Forms used, so that both parsers run against real kernel output: the client and the first
//! "CoreDNS" pod under the systemd driver's naming in the cgroup v2 hierarchy
//! (`cri-containerd-<id>.scope`, `crio-<id>.scope`), the other "CoreDNS" pods under the
//! cgroupfs driver's (`kubepods/burstable/pod<UID>/<id>`) in the v1 `pids` hierarchy where the
//! machine has one (hybrid), else in v2. Each "CoreDNS" pod also has a sandbox process (kubelet's
//! pause) in a container cgroup of its own, so the pod keeps its name while its server is
//! restarted ([`Lab::reconfigure_dns_pod`]). All under a lab-unique parent, removed on drop; only
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

/// Which network namespace is the node's to the tracer: no pod lives there, whatever runs in it
/// (hostNetwork pods).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Node {
    /// The lab's node namespace: the tracer runs in it (`Tracer::start(lab, lab.node_ns(), …)`).
    Lab,
    /// This machine's own: the tracer runs in a container with `--net=host`, and the lab's node
    /// namespace is just another namespace to it.
    Machine,
}

/// How kubelet would place one pod's processes.
struct Placement {
    pod: Option<Pod>,
    /// The pod's main container's process.
    pid: u32,
    /// Its sandbox's ("pause"): keeps the pod's namespace named while the container's
    /// process is replaced (a DNS server restarted with another configuration).
    sandbox_pid: Option<u32>,
}

impl KubeletPods {
    /// [`KubeletPods::create`] for a test: a machine whose cgroups cannot be written fails the
    /// test like a missing root does
    /// ([`root_or_skip`](crate::tracer::root_or_skip)), unless `DNSPATH_SKIP_ROOT_TESTS=1`
    /// asks to skip (`None`, after saying so).
    pub fn for_test(lab: &Lab, node: Node) -> Option<KubeletPods> {
        match KubeletPods::create(lab, node) {
            Ok(pods) => Some(pods),
            Err(LabError::Config(why))
                if why.starts_with(NO_CGROUPS) && crate::tracer::skip_root_tests() =>
            {
                eprintln!("SKIPPED: kubelet-like pods need writable cgroups ({why}); DNSPATH_SKIP_ROOT_TESTS=1");
                None
            }
            Err(e) => panic!(
                "kubelet-like pods: {e} (set DNSPATH_SKIP_ROOT_TESTS=1 to skip the tests that need them)"
            ),
        }
    }

    /// Places the client's process (a `sleep` started here), a hostNetwork pod's (another, in
    /// the `node` namespace), and every "CoreDNS" pod's server next to a sandbox process of
    /// its own (a `sleep` started here, in its own container cgroup as kubelet's pause).
    pub fn create(lab: &Lab, node: Node) -> Result<KubeletPods, LabError> {
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
        // Host root: the real /proc and /run (netns), private kubelet logs. Absolute links, so
        // that in a container holding the machine's root at /host they resolve to the
        // container's /proc and /run (the machine's, with --pid=host and /run/netns mounted).
        fs::create_dir_all(me.host_root.join("var/log/containers")).map_err(io("host root"))?;
        symlink("/proc", me.host_root.join("proc")).map_err(io("host root proc"))?;
        symlink("/run", me.host_root.join("run")).map_err(io("host root run"))?;

        let client = me.sleep_in(lab, Some(lab.client_ns()))?;
        // A hostNetwork pod (kube-proxy's kind): in a pod cgroup, in the node's namespace,
        // which must stay the node's.
        let host_pod = me.sleep_in(lab, (node == Node::Lab).then(|| lab.node_ns()))?;
        let mut procs = vec![
            Placement {
                pod: Some(Pod::Client),
                pid: client,
                sandbox_pid: None,
            },
            Placement {
                pod: None,
                pid: host_pod,
                sandbox_pid: None,
            },
        ];
        for i in 0..lab.dns_pod_count() {
            if let Some(pid) = lab.server_pid(Pod::Dns(i)) {
                let sandbox = me.sleep_in(lab, Some(lab.dns_ns(i)))?;
                procs.push(Placement {
                    pod: Some(Pod::Dns(i)),
                    pid,
                    sandbox_pid: Some(sandbox),
                });
            }
        }
        for (n, placement) in procs.into_iter().enumerate() {
            let pod = placement.pod;
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
            let sandbox_id = format!("{:016x}", !seed ^ (n + 1)).repeat(4);
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
            let cgroup = |id: &str| {
                match (pod, &v1) {
                (Some(Pod::Client) | None, _) => (
                    v2.clone(),
                    "",
                    format!("{base}/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{uid_}.slice/cri-containerd-{id}.scope"),
                ),
                (Some(Pod::Dns(0)), _) => (
                    v2.clone(),
                    "",
                    format!("{base}/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid_}.slice/crio-{id}.scope"),
                ),
                (_, Some(v1)) => (
                    v1.clone(),
                    "pids",
                    format!("{base}/kubepods/burstable/pod{uid}/{id}"),
                ),
                (_, None) => (
                    v2.clone(),
                    "",
                    format!("{base}/kubepods/burstable/pod{uid}/{id}"),
                ),
            }
            };
            let (root, controller, path) = cgroup(&container_id);
            me.place(placement.pid, &root, controller, &path)?;
            if let Some(sandbox) = placement.sandbox_pid {
                // kubelet keeps no log of the sandbox: it has no name.
                let (root, controller, path) = cgroup(&sandbox_id);
                me.place(sandbox, &root, controller, &path)?;
            }
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

    /// Starts a `sleep` in the lab namespace `ns` (or, for `None`, in this process's own) that
    /// lives as long as this value, and waits until it is one.
    fn sleep_in(&mut self, lab: &Lab, ns: Option<&str>) -> Result<u32, LabError> {
        let child = match ns {
            Some(ns) => lab.spawn_in(ns, &["sleep", "3600"])?,
            None => lab.spawn(
                std::process::Command::new("sleep")
                    .arg("3600")
                    .stdin(std::process::Stdio::null()),
            )?,
        };
        let pid = child.id();
        self.children.push(child);
        wait_exec(pid, "sleep")?;
        Ok(pid)
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
