//! A Kubernetes node in network namespaces, with real DNS servers, for dnspath's
//! integration tests and demo.
//!
//! ```text
//!                       node namespace  <p>-node
//!        (ip_forward, rp_filter=0, kube-proxy iptables-nft DNAT for 10.96.0.10)
//!   <p>-client      <p>-dnsa      <p>-dnsb        <p>-up      <p>-svc (sink for
//!      | veth         | veth        | veth          | veth       10.96.0.0/12)
//!   client          "CoreDNS"     "CoreDNS"       upstream
//!   10.244.1.2      10.244.1.3    10.244.1.4      10.250.0.53 (bind9, lab.test)
//!   fd00:244::2     fd00:244::3   fd00:244::4     fd00:250::53
//! ```
//!
//! Pods sit on routed /32 (/128) veths: the node-side end (named like the pod's namespace)
//! carries `169.254.1.1/32` and `fe80::1/64`, the pod's `eth0` its own address with
//! default routes via those. Nothing is configured in the machine's root namespace.
//! Every lab takes a fresh prefix `dpXXXX`, so labs can run side by side; [`Lab::teardown`]
//! (also run on drop, including during a panic) removes exactly what that lab made.

pub mod addr;
mod cmd;
mod config;
mod error;
pub mod frames;
pub mod hole;
pub mod image;
pub mod kube_proxy;
pub mod kubelet;
mod process;
pub mod race;
mod servers;
pub mod tracer;

use std::fs;
use std::io::ErrorKind;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use cmd::{describe, find_tool, run, Tools};
pub use config::{DnsPodConfig, DnsServerKind, IptablesFlavor, LabConfig, KUBERNETES_RESOLV_CONF};
pub use error::LabError;
use process::Tracked;

/// Name of every pod's interface inside its namespace.
pub const POD_IFACE: &str = "eth0";

const NETNS_RUN_DIR: &str = "/run/netns";
const NETNS_ETC_DIR: &str = "/etc/netns";

/// A namespace of the lab other than the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Pod {
    Client,
    /// "CoreDNS" pod `i` behind the Service (`dnsa` is 0).
    Dns(usize),
    /// The upstream authoritative server.
    Upstream,
}

/// A running lab. Dropping it tears it down.
#[derive(Debug)]
pub struct Lab {
    prefix: String,
    cfg: LabConfig,
    tools: Tools,
    /// `/tmp/<prefix>`: server configs and logs.
    dir: PathBuf,
    /// `/etc/netns/<client-ns>`: the client's resolv.conf.
    resolv_dir: PathBuf,
    node_ns: String,
    client_ns: String,
    dns_ns: Vec<String>,
    upstream_ns: String,
    svc_dev: String,
    /// Namespaces this lab created, with their (dev, inode) for finding their processes.
    created_ns: Vec<(String, Option<(u64, u64)>)>,
    owns_dir: bool,
    owns_resolv_dir: bool,
    procs: Mutex<Vec<Tracked>>,
    /// PID of the server each pod runs.
    servers: Vec<(Pod, u32)>,
    torn_down: bool,
}

impl Lab {
    /// Builds the namespaces, veths, routes and kube-proxy rules, starts bind9 and the
    /// "CoreDNS" pods, and waits until every server answers (see [`LabConfig`]).
    /// On error everything made so far is removed again.
    pub fn start(cfg: LabConfig) -> Result<Lab, LabError> {
        // SAFETY: geteuid has no preconditions and cannot fail.
        let uid = unsafe { libc::geteuid() };
        if uid != 0 {
            return Err(LabError::NotRoot(uid));
        }
        validate(&cfg)?;
        let tools = resolve_tools(&cfg)?;
        let mut lab = Lab::claim_prefix(cfg, tools)?;
        // On error `lab` is dropped here, which tears down whatever was built.
        lab.bring_up()?;
        Ok(lab)
    }

    fn bring_up(&mut self) -> Result<(), LabError> {
        self.create_namespaces()?;
        self.wire_pods()?;
        self.install_kube_proxy()?;
        self.write_client_resolv_conf()?;
        self.start_upstream()?;
        for i in 0..self.dns_ns.len() {
            self.start_dns_pod(i)?;
        }
        self.wait_ready()?;
        // Readiness probes leave conntrack entries; tests start from an empty table.
        let mut flush = self.command_in(&self.node_ns, &[]);
        flush.arg(&self.tools.conntrack).arg("-F");
        run(&mut flush, None).map(|_| ())
    }

    // ---- names and addresses ----

    /// `dpXXXX`: the start of every name this lab made.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The configuration the lab runs (after [`Lab::reconfigure_dns_pod`], the new one).
    pub fn config(&self) -> &LabConfig {
        &self.cfg
    }

    /// `<p>-node`: the node, where kube-proxy's rules and the pods' veths live.
    pub fn node_ns(&self) -> &str {
        &self.node_ns
    }

    /// `<p>-client`: the client pod.
    pub fn client_ns(&self) -> &str {
        &self.client_ns
    }

    /// `<p>-dnsa`, `<p>-dnsb`, ...: "CoreDNS" pod `i`. Panics if there is no pod `i`.
    pub fn dns_ns(&self, i: usize) -> &str {
        &self.dns_ns[i]
    }

    /// `<p>-up`: the upstream authoritative server.
    pub fn upstream_ns(&self) -> &str {
        &self.upstream_ns
    }

    /// Number of "CoreDNS" pods.
    pub fn dns_pod_count(&self) -> usize {
        self.dns_ns.len()
    }

    /// Every pod: client, DNS pods in order, upstream.
    pub fn pods(&self) -> Vec<Pod> {
        let mut v = vec![Pod::Client];
        v.extend((0..self.dns_ns.len()).map(Pod::Dns));
        v.push(Pod::Upstream);
        v
    }

    /// Every namespace of the lab, node first.
    pub fn namespaces(&self) -> Vec<&str> {
        let mut v = vec![self.node_ns.as_str(), self.client_ns.as_str()];
        v.extend(self.dns_ns.iter().map(String::as_str));
        v.push(self.upstream_ns.as_str());
        v
    }

    /// Namespace of `pod`.
    pub fn ns_of(&self, pod: Pod) -> &str {
        match pod {
            Pod::Client => &self.client_ns,
            Pod::Dns(i) => &self.dns_ns[i],
            Pod::Upstream => &self.upstream_ns,
        }
    }

    /// Node-side veth of `pod`, an interface in [`Lab::node_ns`]. It has the same name as
    /// the pod's namespace (at most 13 characters); the pod's end is [`POD_IFACE`].
    pub fn veth_of(&self, pod: Pod) -> &str {
        self.ns_of(pod)
    }

    /// Node-side veths of all pods.
    pub fn veths(&self) -> Vec<&str> {
        self.pods().into_iter().map(|p| self.veth_of(p)).collect()
    }

    /// The node's device that routes the service CIDR (10.96.0.0/12), so node-originated
    /// (hostNetwork) queries to the ClusterIP find a route before `nat OUTPUT` DNATs them.
    /// One end of a veth pair whose peer (`<this>x`, also in the node) stays down:
    /// anything not DNAT'ed is dropped there.
    pub fn service_dev(&self) -> &str {
        &self.svc_dev
    }

    /// IPv4 address of `pod`.
    pub fn ip_of(&self, pod: Pod) -> Ipv4Addr {
        match pod {
            Pod::Client => addr::CLIENT,
            Pod::Dns(i) => addr::dns_pod(i),
            Pod::Upstream => addr::UPSTREAM,
        }
    }

    /// IPv6 address of `pod`.
    pub fn ip6_of(&self, pod: Pod) -> Ipv6Addr {
        match pod {
            Pod::Client => addr::CLIENT6,
            Pod::Dns(i) => addr::dns_pod6(i),
            Pod::Upstream => addr::UPSTREAM6,
        }
    }

    /// The DNS Service's ClusterIP, 10.96.0.10.
    pub fn cluster_ip(&self) -> Ipv4Addr {
        addr::CLUSTER_IP
    }

    /// `iptables-nft` or `iptables-legacy`: the flavor the node's rules use; add rules
    /// with the same one.
    pub fn iptables(&self) -> &'static str {
        self.cfg.iptables.iptables()
    }

    /// `iptables OP RULE...` in namespace `ns` with the lab's iptables flavour, e.g.
    /// `lab.iptables_rule(ns, "-I", &["FORWARD", "-p", "udp", "-j", "DROP"])`.
    pub fn iptables_rule(&self, ns: &str, op: &str, rule: &[&str]) -> Output {
        let mut args = vec![self.iptables(), op];
        args.extend_from_slice(rule);
        self.exec(ns, &args)
    }

    /// As [`Lab::iptables_rule`], for IPv6 (`ip6tables` of the lab's flavour).
    pub fn ip6tables_rule(&self, ns: &str, op: &str, rule: &[&str]) -> Output {
        let ip6tables = self.iptables().replace("iptables", "ip6tables");
        let mut args = vec![ip6tables.as_str(), op];
        args.extend_from_slice(rule);
        self.exec(ns, &args)
    }

    /// `/tmp/<prefix>`: one directory per server pod (`up/`, `dnsa/`, ...) holding its
    /// config (`named.conf` and zone files, `dnsdist.conf`, `dnsmasq.args`) and its
    /// stdout/stderr (`server.log`).
    pub fn temp_dir(&self) -> &Path {
        &self.dir
    }

    /// PID of the server `pod` runs (`None` for the client).
    pub fn server_pid(&self, pod: Pod) -> Option<u32> {
        self.servers
            .iter()
            .find(|(p, _)| *p == pod)
            .map(|(_, pid)| *pid)
    }

    /// PIDs of every process this lab started (servers and [`Lab::spawn`]ed), including
    /// ones that have exited since.
    pub fn pids(&self) -> Vec<u32> {
        self.procs().iter().map(|t| t.pid).collect()
    }

    // ---- running things in the lab ----

    /// `ip netns exec NS ARGS...`, not yet run.
    pub fn command_in(&self, ns: &str, args: &[&str]) -> Command {
        let mut c = Command::new(&self.tools.ip);
        c.args(["netns", "exec", ns]).args(args);
        c
    }

    /// Runs `ARGS` in namespace `ns` and returns its output. If it cannot be started at
    /// all, the status is 127 (as a shell reports a missing command) and stderr says why.
    pub fn exec(&self, ns: &str, args: &[&str]) -> Output {
        let mut c = self.command_in(ns, args);
        c.stdin(Stdio::null());
        c.output().unwrap_or_else(|e| Output {
            status: ExitStatus::from_raw(127 << 8),
            stdout: Vec::new(),
            stderr: format!("could not run `{}`: {e}", describe(&c)).into_bytes(),
        })
    }

    /// `dig ARGS...` in the client pod (resolv.conf: [`LabConfig::client_resolv_conf`]).
    pub fn dig(&self, args: &[&str]) -> Output {
        let dig = self.tools.dig.to_string_lossy().into_owned();
        let mut all = vec![dig.as_str()];
        all.extend_from_slice(args);
        self.exec(&self.client_ns, &all)
    }

    /// Starts `ARGS` in namespace `ns` (stdin null, stdout and stderr piped) and records its
    /// PID for teardown. The caller owns the `Child` and should wait for it.
    pub fn spawn_in(&self, ns: &str, args: &[&str]) -> Result<Child, LabError> {
        let mut c = self.command_in(ns, args);
        c.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        self.spawn(&mut c)
    }

    /// Starts any command (e.g. from [`Lab::command_in`] with custom stdio) and records its
    /// PID for teardown.
    pub fn spawn(&self, cmd: &mut Command) -> Result<Child, LabError> {
        let label = describe(cmd);
        let child = cmd.spawn().map_err(|source| LabError::Spawn {
            cmd: label.clone(),
            source,
        })?;
        let t = Tracked::new(child.id(), label, None, None);
        self.procs().push(t);
        Ok(child)
    }

    /// Replaces "CoreDNS" pod `i`'s server with one configured as `pod` (e.g. to turn a
    /// healthy lab into a forwarding loop after a tracer has attached), and waits for it.
    pub fn reconfigure_dns_pod(&mut self, i: usize, pod: DnsPodConfig) -> Result<(), LabError> {
        if i >= self.dns_ns.len() {
            return Err(LabError::Config(format!("no DNS pod {i}")));
        }
        match pod.kind {
            DnsServerKind::Dnsdist if self.tools.dnsdist.is_none() => {
                self.tools.dnsdist = Some(find_tool("dnsdist", "dnsdist")?);
            }
            DnsServerKind::Dnsmasq if self.tools.dnsmasq.is_none() => {
                self.tools.dnsmasq = Some(find_tool("dnsmasq", "dnsmasq-base")?);
            }
            _ => {}
        }
        if let Some(pid) = self.server_pid(Pod::Dns(i)) {
            let mut old: Vec<Tracked> = {
                let mut procs = self.procs();
                let (old, keep) = procs.drain(..).partition(|t| t.pid == pid);
                *procs = keep;
                old
            };
            process::stop_all(&mut old, self.cfg.stop_grace);
            self.servers.retain(|(p, _)| *p != Pod::Dns(i));
        }
        self.cfg.dns_pods[i] = pod;
        self.start_dns_pod(i)?;
        let deadline = Instant::now() + self.cfg.readiness_timeout;
        self.wait_dns_pod(i, deadline)
    }

    /// Stops every process the lab started (SIGTERM, then SIGKILL after
    /// [`LabConfig::stop_grace`]), kills whatever else still runs inside the lab's
    /// namespaces, deletes the namespaces (and with them the veths and iptables rules),
    /// the temp dir and the client's `/etc/netns` dir. Idempotent; also run on drop.
    pub fn teardown(&mut self) {
        if self.torn_down {
            return;
        }
        self.torn_down = true;
        let mut procs = std::mem::take(&mut *self.procs());
        process::stop_all(&mut procs, self.cfg.stop_grace);
        let ids: Vec<(u64, u64)> = self.created_ns.iter().filter_map(|(_, id)| *id).collect();
        let stray = process::kill_netns_members(&ids);
        if stray > 0 {
            eprintln!(
                "lab {}: killed {stray} leftover process(es) inside its namespaces",
                self.prefix
            );
        }
        for (ns, _) in self.created_ns.drain(..).rev() {
            let mut c = Command::new(&self.tools.ip);
            c.args(["netns", "delete", &ns]);
            if let Err(e) = run(&mut c, None) {
                eprintln!("lab {}: {e}", self.prefix);
            }
        }
        if self.owns_resolv_dir {
            remove_dir_logged(&self.prefix, &self.resolv_dir);
            self.owns_resolv_dir = false;
        }
        if self.owns_dir {
            remove_dir_logged(&self.prefix, &self.dir);
            self.owns_dir = false;
        }
        self.servers.clear();
    }

    // ---- building ----

    fn procs(&self) -> MutexGuard<'_, Vec<Tracked>> {
        // A panic while holding the lock leaves the list intact; teardown still needs it.
        self.procs.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Picks an unused prefix and claims it by creating `/tmp/<prefix>`.
    fn claim_prefix(cfg: LabConfig, tools: Tools) -> Result<Lab, LabError> {
        const ATTEMPTS: u32 = 64;
        for _ in 0..ATTEMPTS {
            let prefix = candidate_prefix();
            let taken = fs::read_dir(NETNS_RUN_DIR).is_ok_and(|entries| {
                entries.flatten().any(|e| {
                    e.file_name()
                        .to_string_lossy()
                        .starts_with(&format!("{prefix}-"))
                })
            });
            let client_ns = format!("{prefix}-client");
            let resolv_dir = Path::new(NETNS_ETC_DIR).join(&client_ns);
            if taken || resolv_dir.exists() {
                continue;
            }
            let dir = std::env::temp_dir().join(&prefix);
            match fs::create_dir(&dir) {
                Ok(()) => {}
                Err(e) if e.kind() == ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(LabError::io(format!("creating {}", dir.display()), e)),
            }
            let dns_ns = (0..cfg.dns_pods.len())
                .map(|i| format!("{prefix}-dns{}", kube_proxy::pod_letter(i)))
                .collect();
            return Ok(Lab {
                node_ns: format!("{prefix}-node"),
                upstream_ns: format!("{prefix}-up"),
                svc_dev: format!("{prefix}-svc"),
                client_ns,
                dns_ns,
                resolv_dir,
                dir,
                prefix,
                cfg,
                tools,
                created_ns: Vec::new(),
                owns_dir: true,
                owns_resolv_dir: false,
                procs: Mutex::new(Vec::new()),
                servers: Vec::new(),
                torn_down: false,
            });
        }
        Err(LabError::NoFreePrefix(ATTEMPTS))
    }

    fn ip_batch(&self, ns: &str, lines: &[String]) -> Result<(), LabError> {
        let mut c = Command::new(&self.tools.ip);
        c.args(["-n", ns, "-batch", "-"]);
        run(&mut c, Some(&(lines.join("\n") + "\n"))).map(|_| ())
    }

    fn sysctl(&self, ns: &str, settings: &[String]) -> Result<(), LabError> {
        let mut c = self.command_in(ns, &[]);
        c.arg(&self.tools.sysctl).arg("-q").arg("-w").args(settings);
        run(&mut c, None).map(|_| ())
    }

    fn create_namespaces(&mut self) -> Result<(), LabError> {
        let names: Vec<String> = self.namespaces().into_iter().map(str::to_owned).collect();
        for ns in names {
            let mut c = Command::new(&self.tools.ip);
            c.args(["netns", "add", &ns]);
            run(&mut c, None)?;
            let id = process::netns_id(&Path::new(NETNS_RUN_DIR).join(&ns));
            self.created_ns.push((ns, id));
        }
        // Before any interface exists, so that every one inherits "default": no DAD delay
        // for the fixed addresses, no router solicitations from pods.
        let common = [
            "net.ipv6.conf.all.accept_dad=0",
            "net.ipv6.conf.default.accept_dad=0",
            "net.ipv6.conf.default.router_solicitations=0",
            "net.ipv6.conf.default.accept_ra=0",
        ]
        .map(String::from);
        let mut node = common.to_vec();
        node.extend(
            [
                "net.ipv4.ip_forward=1",
                "net.ipv6.conf.all.forwarding=1",
                "net.ipv4.conf.all.rp_filter=0",
                "net.ipv4.conf.default.rp_filter=0",
            ]
            .map(String::from),
        );
        self.sysctl(&self.node_ns, &node)?;
        for pod in self.pods() {
            self.sysctl(self.ns_of(pod), &common)?;
        }
        Ok(())
    }

    /// Routed veths, Calico style: see the crate docs.
    fn wire_pods(&self) -> Result<(), LabError> {
        let gw = addr::NODE_GATEWAY;
        let gw6 = addr::NODE_GATEWAY6;
        let pods = self.pods();
        let mut node = vec!["link set lo up".to_owned()];
        for &pod in &pods {
            node.push(format!(
                "link add {} type veth peer name {POD_IFACE} netns {}",
                self.veth_of(pod),
                self.ns_of(pod)
            ));
            node.push(format!("link set {} up", self.veth_of(pod)));
        }
        // A sink for service traffic nothing DNATs: one end of a veth pair whose other end
        // stays down, so whatever is sent there is dropped (`dummy` is not built into
        // every kernel, and loading it or `ifb` creates devices in the root namespace).
        node.push(format!(
            "link add {} type veth peer name {}x",
            self.svc_dev, self.svc_dev
        ));
        node.push(format!("link set {} up", self.svc_dev));
        self.ip_batch(&self.node_ns, &node)?;

        for &pod in &pods {
            let lines = [
                "link set lo up".to_owned(),
                format!("link set {POD_IFACE} up"),
                format!("addr add {}/32 dev {POD_IFACE}", self.ip_of(pod)),
                format!("addr add {}/128 dev {POD_IFACE} nodad", self.ip6_of(pod)),
                format!("route add {gw} dev {POD_IFACE} scope link"),
                format!("route add default via {gw} dev {POD_IFACE}"),
                format!("route add ::/0 via {gw6} dev {POD_IFACE}"),
            ];
            self.ip_batch(self.ns_of(pod), &lines)?;
        }

        let mut node = Vec::new();
        let mut rp = vec!["net.ipv4.conf.lo.rp_filter=0".to_owned()];
        for &pod in &pods {
            let veth = self.veth_of(pod);
            node.push(format!("addr add {gw}/32 dev {veth}"));
            node.push(format!("addr add {gw6}/64 dev {veth} nodad"));
            node.push(format!("route add {}/32 dev {veth}", self.ip_of(pod)));
            node.push(format!("route add {}/128 dev {veth}", self.ip6_of(pod)));
            rp.push(format!("net.ipv4.conf.{veth}.rp_filter=0"));
        }
        let (net, len) = addr::SERVICE_CIDR;
        node.push(format!("route add {net}/{len} dev {}", self.svc_dev));
        rp.push(format!("net.ipv4.conf.{}.rp_filter=0", self.svc_dev));
        self.ip_batch(&self.node_ns, &node)?;
        self.sysctl(&self.node_ns, &rp)
    }

    fn install_kube_proxy(&self) -> Result<(), LabError> {
        let backends: Vec<Ipv4Addr> = (0..self.dns_ns.len()).map(addr::dns_pod).collect();
        let rules = kube_proxy::nat_ruleset(&backends, self.cfg.pin_backend);
        let mut c = self.command_in(&self.node_ns, &[]);
        c.arg(&self.tools.iptables_restore);
        run(&mut c, Some(&rules)).map(|_| ())
    }

    fn write_client_resolv_conf(&mut self) -> Result<(), LabError> {
        fs::create_dir_all(NETNS_ETC_DIR)
            .map_err(|e| LabError::io(format!("creating {NETNS_ETC_DIR}"), e))?;
        fs::create_dir(&self.resolv_dir)
            .map_err(|e| LabError::io(format!("creating {}", self.resolv_dir.display()), e))?;
        self.owns_resolv_dir = true;
        let file = self.resolv_dir.join("resolv.conf");
        fs::write(&file, &self.cfg.client_resolv_conf)
            .map_err(|e| LabError::io(format!("writing {}", file.display()), e))
    }

    fn pod_dir(&self, pod: Pod) -> Result<PathBuf, LabError> {
        let name = self
            .ns_of(pod)
            .trim_start_matches(&format!("{}-", self.prefix));
        let d = self.dir.join(name);
        fs::create_dir_all(&d).map_err(|e| LabError::io(format!("creating {}", d.display()), e))?;
        Ok(d)
    }

    fn write(&self, path: &Path, text: &str) -> Result<(), LabError> {
        fs::write(path, text).map_err(|e| LabError::io(format!("writing {}", path.display()), e))
    }

    /// Starts `program ARGS` inside `pod`'s namespace with output to `<pod dir>/server.log`.
    fn start_server(&mut self, pod: Pod, program: &Path, args: &[String]) -> Result<(), LabError> {
        let log = self.pod_dir(pod)?.join("server.log");
        let out = fs::File::create(&log)
            .map_err(|e| LabError::io(format!("creating {}", log.display()), e))?;
        let err = out
            .try_clone()
            .map_err(|e| LabError::io(format!("duplicating {}", log.display()), e))?;
        let mut c = self.command_in(self.ns_of(pod), &[]);
        c.arg(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        let label = describe(&c);
        let child = c.spawn().map_err(|source| LabError::Spawn {
            cmd: label.clone(),
            source,
        })?;
        let pid = child.id();
        self.procs()
            .push(Tracked::new(pid, label, Some(child), Some(log)));
        self.servers.push((pod, pid));
        Ok(())
    }

    fn start_upstream(&mut self) -> Result<(), LabError> {
        let d = self.pod_dir(Pod::Upstream)?;
        let conf = d.join("named.conf");
        self.write(&conf, &servers::named_conf(&d))?;
        self.write(
            &d.join(format!("{}.zone", addr::ZONE)),
            &servers::lab_zone(),
        )?;
        self.write(
            &d.join("cluster.local.zone"),
            &servers::cluster_local_zone(),
        )?;
        let named = self.tools.named.clone();
        let args = ["-f", "-u", "root", "-c"].map(String::from);
        let mut args = args.to_vec();
        args.push(conf.to_string_lossy().into_owned());
        self.start_server(Pod::Upstream, &named, &args)
    }

    fn start_dns_pod(&mut self, i: usize) -> Result<(), LabError> {
        let pod = Pod::Dns(i);
        let d = self.pod_dir(pod)?;
        let pc = self.cfg.dns_pods[i].clone();
        match pc.kind {
            DnsServerKind::Dnsdist => {
                let conf = d.join("dnsdist.conf");
                self.write(&conf, &servers::dnsdist_conf(pc.forward_to))?;
                let prog = self.tools.dnsdist.clone().ok_or(LabError::MissingTool {
                    tool: "dnsdist",
                    package: "dnsdist",
                })?;
                let args = [
                    "--supervised".to_owned(),
                    "--disable-syslog".to_owned(),
                    "-C".to_owned(),
                    conf.to_string_lossy().into_owned(),
                ];
                self.start_server(pod, &prog, &args)
            }
            DnsServerKind::Dnsmasq => {
                let prog = self.tools.dnsmasq.clone().ok_or(LabError::MissingTool {
                    tool: "dnsmasq",
                    package: "dnsmasq-base",
                })?;
                let args = servers::dnsmasq_args(
                    addr::dns_pod(i),
                    addr::dns_pod6(i),
                    pc.forward_to,
                    &d.join("dnsmasq.pid"),
                );
                self.write(&d.join("dnsmasq.args"), &args.join("\n"))?;
                self.start_server(pod, &prog, &args)
            }
        }
    }

    // ---- readiness ----

    fn wait_ready(&self) -> Result<(), LabError> {
        let deadline = Instant::now() + self.cfg.readiness_timeout;
        self.wait_answer(IpAddr::V4(addr::UPSTREAM), false, deadline)?;
        self.wait_answer(IpAddr::V6(addr::UPSTREAM6), false, deadline)?;
        for i in 0..self.dns_ns.len() {
            self.wait_dns_pod(i, deadline)?;
        }
        // Probing the Service through a pod that forwards back into it would start the
        // very loop a test wants to observe from its beginning.
        let backends: Vec<usize> = match self.cfg.pin_backend {
            Some(p) => vec![p],
            None => (0..self.dns_ns.len()).collect(),
        };
        if backends
            .iter()
            .all(|&i| self.cfg.dns_pods[i].forwards_to_upstream())
        {
            self.wait_answer(IpAddr::V4(addr::CLUSTER_IP), false, deadline)?;
            self.wait_answer(IpAddr::V4(addr::CLUSTER_IP), true, deadline)?;
        }
        Ok(())
    }

    fn wait_dns_pod(&self, i: usize, deadline: Instant) -> Result<(), LabError> {
        if self.cfg.dns_pods[i].forwards_to_upstream() {
            self.wait_answer(IpAddr::V4(addr::dns_pod(i)), false, deadline)
        } else {
            self.wait_listening(Pod::Dns(i), deadline)
        }
    }

    /// Fails if a server the lab started has exited.
    fn check_servers(&self) -> Result<(), LabError> {
        let mut procs = self.procs();
        for t in procs.iter_mut() {
            let Some(child) = t.child.as_mut() else {
                continue;
            };
            if let Ok(Some(status)) = child.try_wait() {
                let log = t.log.clone().unwrap_or_default();
                return Err(LabError::ServerExited {
                    process: t.label.clone(),
                    status: status.to_string(),
                    log_tail: process::log_tail(&log, 2000),
                    log: log.display().to_string(),
                });
            }
        }
        Ok(())
    }

    /// Polls `dig @server www.lab.test A` from the client until it answers 10.250.0.80.
    fn wait_answer(&self, server: IpAddr, tcp: bool, deadline: Instant) -> Result<(), LabError> {
        let at = format!("@{server}");
        let mut args = vec!["+time=1", "+tries=1", "+short", at.as_str()];
        if tcp {
            args.push("+tcp");
        }
        let name = format!("www.{}", addr::ZONE);
        args.extend([name.as_str(), "A"]);
        let want = addr::WWW_A.to_string();
        let start = Instant::now();
        loop {
            let out = self.dig(&args);
            let stdout = String::from_utf8_lossy(&out.stdout);
            if out.status.success() && stdout.lines().any(|l| l.trim() == want) {
                return Ok(());
            }
            self.check_servers()?;
            if Instant::now() >= deadline {
                return Err(LabError::NotReady {
                    target: server.to_string(),
                    probe: format!("dig {}", args.join(" ")),
                    waited: start.elapsed(),
                    detail: format!(
                        "{}; stdout: {} stderr: {}",
                        out.status,
                        stdout.trim(),
                        String::from_utf8_lossy(&out.stderr).trim()
                    ),
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Polls until something listens on UDP port 53 in `pod`.
    fn wait_listening(&self, pod: Pod, deadline: Instant) -> Result<(), LabError> {
        let ss = self.tools.ss.to_string_lossy().into_owned();
        let args = [ss.as_str(), "-Hlun", "sport = :53"];
        let start = Instant::now();
        loop {
            let out = self.exec(self.ns_of(pod), &args);
            if out.status.success() && !out.stdout.is_empty() {
                return Ok(());
            }
            self.check_servers()?;
            if Instant::now() >= deadline {
                return Err(LabError::NotReady {
                    target: self.ns_of(pod).to_owned(),
                    probe: args.join(" "),
                    waited: start.elapsed(),
                    detail: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        self.teardown();
    }
}

fn validate(cfg: &LabConfig) -> Result<(), LabError> {
    let n = cfg.dns_pods.len();
    if n == 0 || n > addr::MAX_DNS_PODS {
        return Err(LabError::Config(format!(
            "{n} DNS pods; the lab supports 1 to {}",
            addr::MAX_DNS_PODS
        )));
    }
    if let Some(p) = cfg.pin_backend {
        if p >= n {
            return Err(LabError::Config(format!(
                "pin_backend {p} but only {n} DNS pods"
            )));
        }
    }
    Ok(())
}

fn resolve_tools(cfg: &LabConfig) -> Result<Tools, LabError> {
    let wants = |k| cfg.dns_pods.iter().any(|p| p.kind == k);
    Ok(Tools {
        ip: find_tool("ip", "iproute2")?,
        ss: find_tool("ss", "iproute2")?,
        sysctl: find_tool("sysctl", "procps")?,
        iptables_restore: find_tool(cfg.iptables.restore(), "iptables")?,
        conntrack: find_tool("conntrack", "conntrack")?,
        named: find_tool("named", "bind9")?,
        dig: find_tool("dig", "bind9-dnsutils")?,
        dnsdist: if wants(DnsServerKind::Dnsdist) {
            Some(find_tool("dnsdist", "dnsdist")?)
        } else {
            None
        },
        dnsmasq: if wants(DnsServerKind::Dnsmasq) {
            Some(find_tool("dnsmasq", "dnsmasq-base")?)
        } else {
            None
        },
    })
}

/// `dp` + 4 hex digits mixed from PID, clock and a per-process counter.
fn candidate_prefix() -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos() ^ (d.as_secs() as u32))
        .unwrap_or(0);
    let mut x = std::process::id().wrapping_mul(0x9e37_79b1) ^ nanos ^ n.wrapping_mul(0x85eb_ca6b);
    // murmur3 finalizer: every input bit reaches the low 16.
    x ^= x >> 16;
    x = x.wrapping_mul(0x7feb_352d);
    x ^= x >> 15;
    x = x.wrapping_mul(0x846c_a68b);
    x ^= x >> 16;
    format!("dp{:04x}", x & 0xffff)
}

fn remove_dir_logged(prefix: &str, dir: &Path) {
    match fs::remove_dir_all(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == ErrorKind::NotFound => {}
        Err(e) => eprintln!("lab {prefix}: removing {}: {e}", dir.display()),
    }
}

#[cfg(test)]
mod tests;
