//! Building a lab: a free prefix claimed, namespaces, routed veths, kube-proxy's rules, the
//! client's resolv.conf, and the servers started (bind9 upstream, the "CoreDNS" pods).
use std::fs;
use std::io::ErrorKind;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::cmd::{describe, find_tool, run, Tools};
use crate::process::{self, Tracked};
use crate::{
    addr, kube_proxy, servers, DnsServerKind, Lab, LabConfig, LabError, Pod, NETNS_ETC_DIR,
    NETNS_RUN_DIR, POD_IFACE,
};

impl Lab {
    pub(super) fn bring_up(&mut self) -> Result<(), LabError> {
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

    /// Picks an unused prefix and claims it by creating `/tmp/<prefix>`.
    pub(super) fn claim_prefix(cfg: LabConfig, tools: Tools) -> Result<Lab, LabError> {
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

    pub(super) fn start_dns_pod(&mut self, i: usize) -> Result<(), LabError> {
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
}

pub(super) fn validate(cfg: &LabConfig) -> Result<(), LabError> {
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

pub(super) fn resolve_tools(cfg: &LabConfig) -> Result<Tools, LabError> {
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
pub(super) fn candidate_prefix() -> String {
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
