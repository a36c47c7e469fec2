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
//! Every lab takes a fresh prefix `dpXXXX`, so labs can run side by side (and a lab test
//! binary runs in namespaces of its own, [`sandbox`]); [`Lab::teardown`]
//! (also run on drop, including during a panic) removes exactly what that lab made.

pub mod addr;
mod bring_up;
mod cmd;
mod config;
mod error;
pub mod frames;
pub mod golden;
pub mod hole;
pub mod image;
pub mod kube_proxy;
pub mod kubelet;
pub mod node_cache;
mod process;
pub mod race;
mod ready;
pub mod resolved;
pub mod sandbox;
mod servers;
pub mod tracer;
pub mod tunnel;
pub mod watch;

use std::fs;
use std::io::ErrorKind;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

use bring_up::{resolve_tools, validate};
use cmd::{describe, find_tool, run, Tools};
pub use config::{DnsPodConfig, DnsServerKind, IptablesFlavor, LabConfig, KUBERNETES_RESOLV_CONF};
pub use error::LabError;

/// The node's FORWARD rule that drops DNS (UDP port 53) to the pods' subnet, 10.244.1.0/24
/// ([`Lab::pod_dns_drop`]).
pub const POD_DNS_DROP: [&str; 9] = [
    "FORWARD",
    "-p",
    "udp",
    "--dport",
    "53",
    "-d",
    "10.244.1.0/24",
    "-j",
    "DROP",
];
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

    /// `iptables OP` [`POD_DNS_DROP`] in the node's namespace: `-I` inserts the rule that drops
    /// every DNS query the node forwards to a pod (a lookup through the ClusterIP then fails
    /// with a `NETFILTER_DROP`), `-D` deletes it.
    pub fn pod_dns_drop(&self, op: &str) -> Output {
        self.iptables_rule(self.node_ns(), op, &POD_DNS_DROP)
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

    fn procs(&self) -> MutexGuard<'_, Vec<Tracked>> {
        // A panic while holding the lock leaves the list intact; teardown still needs it.
        self.procs.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        self.teardown();
    }
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
