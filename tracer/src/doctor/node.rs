//! The node's own files, read through `--host-root` and each process's `/proc/PID/root`
//! (procfs.rs): the DNS servers of pod namespaces (processes with a socket on port 53), their
//! forward targets, the node's and the pods' resolv.conf. From them and kube-proxy's Services
//! (iptables.rs, kube_proxy.rs), static findings: a forwarding loop found before a packet is
//! sent, with the config line that causes it; resolv.conf files beyond the resolver's limits.
use std::{
    collections::{HashMap, HashSet},
    fs,
    net::{IpAddr, SocketAddr},
    path::Path,
};

use super::procfs::read_host;
use super::{
    config::{self, ConfigError, Forward, ResolvConf, ServerKind, Target},
    finding::{Finding, FindingKind},
    iptables::Service,
    procfs::{
        cmdline, holds_socket, list_in_process_root, local_addrs, port53_inodes, read_in_process,
        read_in_process_root, read_small,
    },
};
use crate::{
    host,
    kube::resolver::{ns_key, NsKey, PodResolver},
};

/// A process serving DNS (a socket on port 53) in a pod's network namespace.
#[derive(Debug)]
pub struct DnsServer {
    pub pid: u32,
    pub kind: Option<ServerKind>,
    pub program: String,
    pub args: Vec<String>,
    pub netns: NsKey,
    /// The namespace's local addresses.
    pub addrs: Vec<IpAddr>,
    /// `namespace/name` of its pod, where known.
    pub pod: Option<String>,
    /// It serves in the node's own namespace (a loopback stub such as systemd-resolved, or a
    /// hostNetwork server), not a pod's.
    pub on_node: bool,
    pub forwards: Result<Vec<Forward>, ConfigError>,
}

impl DnsServer {
    /// How a person knows it: its pod, and the process.
    pub fn name(&self) -> String {
        let prog: &str = match self.kind {
            Some(k) => k.as_str(),
            None => &self.program,
        };
        match &self.pod {
            Some(p) => format!("{p} ({prog} pid {})", self.pid),
            None if self.on_node => format!("the node's {prog} (pid {})", self.pid),
            None => format!("{prog} pid {}", self.pid),
        }
    }
}

/// What the node's files say.
#[derive(Debug, Default)]
pub struct NodeView {
    pub servers: Vec<DnsServer>,
    pub services: Vec<Service>,
    /// Pod namespaces whose resolv.conf was read: (who, file, parsed).
    pub pod_resolv: Vec<(String, String, ResolvConf)>,
    /// The node's own nameservers, a stub followed (127.0.0.53 → systemd-resolved's).
    pub node_nameservers: Vec<NodeNameserver>,
}

/// Where the node's own lookups go: a nameserver of its resolv.conf, or behind a loopback
/// stub there, the stub's upstream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeNameserver {
    pub ip: IpAddr,
    /// How it was found, e.g. `/etc/resolv.conf → 127.0.0.53 → the node's systemd-resolved
    /// (pid 7)`.
    pub how: String,
    /// The stub's config line that sends there.
    pub config: Option<super::finding::ConfigLine>,
}

/// A server's forward targets, from its command line and its config files read through
/// its own root.
pub fn server_forwards(
    pid: u32,
    kind: ServerKind,
    args: &[String],
) -> Result<Vec<Forward>, ConfigError> {
    match kind {
        ServerKind::Dnsdist => {
            let f =
                config::arg_value(args, &["-C", "--config"]).unwrap_or("/etc/dnsdist/dnsdist.conf");
            config::dnsdist_forwards(f, &read_in_process(pid, f)?)
        }
        ServerKind::CoreDns => {
            let f = config::arg_value(args, &["-conf", "--conf"]).unwrap_or("Corefile");
            config::corefile_forwards(f, &read_in_process(pid, f)?)
        }
        ServerKind::Unbound => {
            let f = config::arg_value(args, &["-c"]).unwrap_or("/etc/unbound/unbound.conf");
            config::unbound_forwards(f, &read_in_process(pid, f)?)
        }
        ServerKind::Dnsmasq => {
            let mut c = config::dnsmasq_args(args)?;
            let files = if c.conf_files.is_empty() {
                let default = "/etc/dnsmasq.conf";
                if read_in_process_root(pid, default).is_ok() {
                    vec![default.to_owned()]
                } else {
                    Vec::new()
                }
            } else {
                c.conf_files.clone()
            };
            for f in files {
                let text = read_in_process(pid, &f)?;
                config::dnsmasq_conf(&f, &text, &mut c)?;
            }
            Ok(c.targets("argv"))
        }
        ServerKind::SystemdResolved => resolved_forwards(pid),
    }
}

/// resolved.conf and its drop-ins as systemd reads them: the main file, then every
/// `*.conf` of the `resolved.conf.d` directories in file-name order (a name in /etc hides
/// the same name in /run and /usr/lib).
const RESOLVED_CONF: &str = "/etc/systemd/resolved.conf";
const RESOLVED_DROPINS: [&str; 4] = [
    "/etc/systemd/resolved.conf.d",
    "/run/systemd/resolved.conf.d",
    "/usr/local/lib/systemd/resolved.conf.d",
    "/usr/lib/systemd/resolved.conf.d",
];
/// systemd-resolved's upstreams as it uses them (global and per link).
const RESOLVED_RESOLV_CONF: &str = "/run/systemd/resolve/resolv.conf";

/// systemd-resolved's `DNS=` lines, read through its root.
fn resolved_conf_lines(pid: u32) -> Vec<(SocketAddr, super::finding::ConfigLine)> {
    let mut dns = Vec::new();
    if let Ok(t) = read_in_process(pid, RESOLVED_CONF) {
        config::resolved_conf_dns(RESOLVED_CONF, &t, &mut dns);
    }
    let mut dropins: std::collections::BTreeMap<String, String> = Default::default();
    for dir in RESOLVED_DROPINS {
        let Ok(entries) = list_in_process_root(pid, dir) else {
            continue;
        };
        for e in entries.flatten().take(256) {
            let Some(name) = e.file_name().to_str().map(str::to_owned) else {
                continue;
            };
            if name.ends_with(".conf") {
                dropins
                    .entry(name.clone())
                    .or_insert_with(|| format!("{dir}/{name}"));
            }
        }
    }
    for f in dropins.values() {
        if let Ok(t) = read_in_process(pid, f) {
            config::resolved_conf_dns(f, &t, &mut dns);
        }
    }
    dns
}

/// systemd-resolved's forward targets: the upstreams it writes to
/// `/run/systemd/resolve/resolv.conf` (what it really uses, per-link servers included), each
/// with the `DNS=` line of resolved.conf (or a drop-in) that sets it where one does, else the
/// `nameserver` line of that file. Without that file, the `DNS=` lines alone.
fn resolved_forwards(pid: u32) -> Result<Vec<Forward>, ConfigError> {
    let dns = resolved_conf_lines(pid);
    let from_conf = |dns: &[(SocketAddr, super::finding::ConfigLine)]| {
        dns.iter()
            .map(|(a, at)| Forward {
                target: Target::Addr(*a),
                at: at.clone(),
            })
            .collect::<Vec<_>>()
    };
    match read_in_process(pid, RESOLVED_RESOLV_CONF) {
        Ok(text) => Ok(config::resolv_conf_nameserver_lines(&text)
            .into_iter()
            .map(
                |(ip, line, raw)| match dns.iter().find(|(a, _)| a.ip() == ip) {
                    Some((a, at)) => Forward {
                        target: Target::Addr(*a),
                        at: at.clone(),
                    },
                    None => Forward {
                        target: Target::Addr(SocketAddr::new(ip, 53)),
                        at: super::finding::ConfigLine {
                            file: RESOLVED_RESOLV_CONF.to_owned(),
                            line,
                            text: raw,
                        },
                    },
                },
            )
            .collect()),
        Err(_) if !dns.is_empty() => Ok(from_conf(&dns)),
        Err(e) => Err(e),
    }
}

/// Reads the node: every process's namespace and sockets, the servers' configs, the pods'
/// resolv.conf, the node's resolver. `services`: kube-proxy's, from its rules.
pub fn read_node(services: Vec<Service>) -> NodeView {
    let own = ns_key(Path::new("/proc/self/ns/net"));
    let host_ns = ns_key(&host::path("/proc/1/ns/net"));
    let not_pods: HashSet<NsKey> = own.into_iter().chain(host_ns).collect();
    // The node's namespace is the one doctor runs in (a debug pod on the host network, or
    // the lab's node): its servers are the node's resolvers. Any other namespace that is not
    // a pod's (the machine's, when doctor runs in a namespace of its own) is left alone.
    let pods = PodResolver::new(host::root()).refresh(&not_pods);
    let mut by_netns: HashMap<NsKey, Vec<u32>> = HashMap::new();
    if let Ok(dir) = fs::read_dir(host::path("/proc")) {
        for e in dir.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            let Some(ns) = ns_key(&e.path().join("ns/net")) else {
                continue;
            };
            if not_pods.contains(&ns) && Some(ns) != own {
                continue;
            }
            by_netns.entry(ns).or_default().push(pid);
        }
    }
    let mut view = NodeView {
        services,
        ..Default::default()
    };
    let mut netns_sorted: Vec<_> = by_netns.into_iter().collect();
    netns_sorted.sort();
    for (ns, mut pids) in netns_sorted {
        pids.sort_unstable();
        let pod = pods
            .get(&ns)
            .map(|p| p.pod.label.clone().unwrap_or_else(|| p.pod.uid.clone()));
        let Some(&first) = pids.first() else { continue };
        let inodes = port53_inodes(first);
        let mut addrs = None;
        for &pid in &pids {
            if !inodes.is_empty() && holds_socket(pid, &inodes) {
                let args = cmdline(pid);
                let program = args.first().cloned().unwrap_or_default();
                let kind = ServerKind::from_program(&program);
                let forwards = match kind {
                    Some(k) => server_forwards(pid, k, args.get(1..).unwrap_or_default()),
                    None => Ok(Vec::new()),
                };
                view.servers.push(DnsServer {
                    pid,
                    kind,
                    program,
                    args,
                    netns: ns,
                    addrs: addrs.get_or_insert_with(|| local_addrs(first)).clone(),
                    pod: pod.clone(),
                    on_node: Some(ns) == own,
                    forwards,
                });
            }
        }
        // The pod's resolv.conf, as its first process sees it.
        if let Some(p) = &pod {
            if let Ok(text) = read_in_process_root(first, "/etc/resolv.conf") {
                view.pod_resolv.push((
                    p.clone(),
                    "/etc/resolv.conf".to_owned(),
                    config::parse_resolv_conf(&text),
                ));
            }
        }
    }
    if let Ok(text) = read_host("/etc/resolv.conf") {
        view.node_nameservers = node_nameservers(&config::parse_resolv_conf(&text), &view.servers);
    }
    view
}

/// The node's nameservers from its resolv.conf `rc`: a loopback one is followed to the
/// node's own servers (the stub, e.g. systemd-resolved on 127.0.0.53, read through its root)
/// and their upstreams with the config lines that set them; 127.0.0.53 with no such server
/// found, to the host's `/run/systemd/resolve/resolv.conf`.
fn node_nameservers(rc: &ResolvConf, servers: &[DnsServer]) -> Vec<NodeNameserver> {
    let mut out = Vec::new();
    for &ns in &rc.nameservers {
        if ns.is_loopback() {
            let stubs: Vec<&DnsServer> = servers
                .iter()
                .filter(|s| s.on_node && s.forwards.as_ref().is_ok_and(|f| !f.is_empty()))
                .filter(|s| {
                    // 127.0.0.53 is systemd-resolved's; another loopback address any server's.
                    ns != IpAddr::from([127, 0, 0, 53])
                        || s.kind == Some(ServerKind::SystemdResolved)
                })
                .collect();
            if !stubs.is_empty() {
                for s in stubs {
                    for fw in s.forwards.iter().flatten() {
                        if let Target::Addr(a) = fw.target {
                            out.push(NodeNameserver {
                                ip: a.ip(),
                                how: format!(
                                    "/etc/resolv.conf → {ns} → {} → {}:{} `{}`",
                                    s.name(),
                                    fw.at.file,
                                    fw.at.line,
                                    fw.at.text
                                ),
                                config: Some(fw.at.clone()),
                            });
                        }
                    }
                }
                continue;
            }
            if ns == IpAddr::from([127, 0, 0, 53]) {
                if let Ok(t) = read_host(RESOLVED_RESOLV_CONF) {
                    for up in config::parse_resolv_conf(&t).nameservers {
                        out.push(NodeNameserver {
                            ip: up,
                            how: format!("/etc/resolv.conf → 127.0.0.53 → {RESOLVED_RESOLV_CONF}"),
                            config: None,
                        });
                    }
                    continue;
                }
            }
        }
        out.push(NodeNameserver {
            ip: ns,
            how: "/etc/resolv.conf".to_owned(),
            config: None,
        });
    }
    out
}

/// NodeLocal DNSCache, if a process of the node's namespace (this one) listens on a
/// link-local address on port 53: its server, the line that binds it, the pods using it and
/// its NOTRACK rules in `raw` (`iptables-save -t raw`).
pub fn node_local(view: &NodeView, raw: &str) -> Option<super::node_local::NodeLocal> {
    use super::node_local as nl;
    let udp = read_small(Path::new("/proc/self/net/udp")).ok()?;
    // systemd-resolved's extra stub on a link-local address (`DNSStubListenerExtra=`, the
    // node's gateway address pods reach) is the node's resolver, not the cache.
    let (addr, server) = nl::link_local_listeners(&udp)
        .into_iter()
        .map(|(addr, inode)| {
            let inodes = HashSet::from([inode]);
            let server = view
                .servers
                .iter()
                .find(|s| s.on_node && holds_socket(s.pid, &inodes));
            (addr, server)
        })
        .find(|(_, s)| !s.is_some_and(|s| s.kind == Some(ServerKind::SystemdResolved)))?;
    let (notrack_rules, notrack_missing) = nl::notrack(raw, addr);
    let using = view
        .pod_resolv
        .iter()
        .filter(|(_, _, r)| r.nameservers.contains(&addr))
        .count();
    Some(nl::NodeLocal {
        address: addr.to_string(),
        server: server.map(DnsServer::name),
        pods_using: using,
        pods_not_using: view.pod_resolv.len() - using,
        notrack_rules,
        notrack_missing,
        bind: server.and_then(|s| bind_line(s, addr)),
    })
}

/// The line of `s`'s configuration that makes it listen on `addr`: node-cache's `-localip`,
/// a Corefile's `bind`, dnsdist's `setLocal`/`addLocal`.
fn bind_line(s: &DnsServer, addr: IpAddr) -> Option<super::finding::ConfigLine> {
    let a = addr.to_string();
    let args = s.args.get(1..).unwrap_or_default();
    if let Some(v) = config::arg_value(args, &["-localip", "--localip"]) {
        if v.contains(&a) {
            return Some(super::finding::ConfigLine {
                file: "argv".into(),
                line: 0,
                text: format!("-localip {v}").chars().take(400).collect(),
            });
        }
    }
    let (file, keys): (&str, &[&str]) = match s.kind? {
        ServerKind::CoreDns => (
            config::arg_value(args, &["-conf", "--conf"]).unwrap_or("Corefile"),
            &["bind"],
        ),
        ServerKind::Dnsdist => (
            config::arg_value(args, &["-C", "--config"]).unwrap_or("/etc/dnsdist/dnsdist.conf"),
            &["setLocal", "addLocal"],
        ),
        _ => return None,
    };
    let text = read_in_process(s.pid, file).ok()?;
    text.lines().enumerate().find_map(|(i, l)| {
        let t = l.trim();
        (t.contains(&a) && keys.iter().any(|k| t.starts_with(k))).then(|| {
            super::finding::ConfigLine {
                file: file.to_owned(),
                line: i + 1,
                text: t.chars().take(400).collect(),
            }
        })
    })
}

/// One step of a forwarding path: server `from` sends to `to` by `forward`'s line, `via` how.
#[derive(Clone, Debug)]
struct Step {
    from: usize,
    forward: Forward,
    via: String,
    to: usize,
}

/// Where `target` of server `s` goes: the servers it reaches, each with how.
fn reach(
    view: &NodeView,
    s: usize,
    target: &Target,
    read: &dyn Fn(u32, &str) -> Result<String, ConfigError>,
) -> Vec<(usize, String)> {
    let Some(server) = view.servers.get(s) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let addrs: Vec<(SocketAddr, String)> = match target {
        Target::Addr(a) => vec![(*a, String::new())],
        Target::ResolvConf(p) => match read(server.pid, p) {
            Ok(text) => config::parse_resolv_conf(&text)
                .nameservers
                .into_iter()
                .map(|ip| (SocketAddr::new(ip, 53), format!("{p}: nameserver {ip}; ")))
                .collect(),
            Err(_) => Vec::new(),
        },
    };
    for (a, prefix) in addrs {
        if a.ip().is_loopback() {
            for (i, o) in view.servers.iter().enumerate() {
                if o.netns == server.netns && a.port() == 53 {
                    out.push((
                        i,
                        format!("{prefix}{a} is the loopback of its own namespace"),
                    ));
                }
            }
            continue;
        }
        if let Some(svc) = view
            .services
            .iter()
            .find(|v| v.ip == a.ip() && v.port == a.port())
        {
            for b in &svc.backends {
                for (i, o) in view.servers.iter().enumerate() {
                    if o.addrs.contains(&b.ip()) {
                        out.push((
                            i,
                            format!(
                                "{prefix}{a} is Service {} whose DNAT rule sends to {b}",
                                svc.name.as_deref().unwrap_or("ClusterIP")
                            ),
                        ));
                    }
                }
            }
            continue;
        }
        for (i, o) in view.servers.iter().enumerate() {
            if o.addrs.contains(&a.ip()) && a.port() == 53 {
                out.push((i, format!("{prefix}{a} is its address")));
            }
        }
    }
    out
}

/// Forwarding loops from the configs: a path of forward lines from a server back to
/// itself. One finding per server whose own config closes a cycle.
pub fn static_loops(view: &NodeView) -> Vec<Finding> {
    static_loops_with(view, &read_in_process)
}

fn static_loops_with(
    view: &NodeView,
    read: &dyn Fn(u32, &str) -> Result<String, ConfigError>,
) -> Vec<Finding> {
    let mut out = Vec::new();
    for start in 0..view.servers.len() {
        let Some(path) = find_cycle(view, start, read) else {
            continue;
        };
        let first = &path[0];
        let s = &view.servers[start];
        let mut f = Finding::new(
            FindingKind::StaticForwardingLoop,
            s.name(),
            format!(
                "{} forwards to {}, which leads back to itself: a forwarding loop as soon as a query it cannot answer arrives",
                s.name(),
                first.forward.target
            ),
        );
        f.why = "Every query the server forwards comes back to it and is forwarded again: CoreDNS's loop plugin makes the pod exit (CrashLoopBackOff, `plugin/loop: Loop (…) detected`); without it the question circulates at CPU speed and every lookup of the cluster through this server fails.".into();
        for st in &path {
            let from = &view.servers[st.from];
            let to = &view.servers[st.to];
            f.evidence.push(format!(
                "{} {}:{}: `{}` → {} → {}",
                from.name(),
                st.forward.at.file,
                st.forward.at.line,
                st.forward.at.text,
                st.via,
                to.name()
            ));
        }
        f.fix = "Forward to a real upstream, not to the cluster DNS Service, the pod's own loopback, or a resolv.conf that leads back to cluster DNS: in the Corefile replace `forward . /etc/resolv.conf` (or the ClusterIP) with the upstream resolvers' addresses, or set kubelet's `resolvConf` to the real upstreams (`/run/systemd/resolve/resolv.conf` on systemd-resolved nodes).".into();
        f.config = Some(first.forward.at.clone());
        out.push(f);
    }
    out
}

/// A path of steps from `start` back to `start`, depth first, at most 8 steps.
fn find_cycle(
    view: &NodeView,
    start: usize,
    read: &dyn Fn(u32, &str) -> Result<String, ConfigError>,
) -> Option<Vec<Step>> {
    let mut stack: Vec<(usize, Vec<Step>)> = vec![(start, Vec::new())];
    let mut visited = HashSet::new();
    while let Some((s, path)) = stack.pop() {
        if path.len() >= 8 || !visited.insert(s) && s != start {
            continue;
        }
        let Some(Ok(forwards)) = view.servers.get(s).map(|x| x.forwards.as_ref()) else {
            continue;
        };
        for fw in forwards {
            for (to, via) in reach(view, s, &fw.target, read) {
                let mut p = path.clone();
                p.push(Step {
                    from: s,
                    forward: fw.clone(),
                    via,
                    to,
                });
                if to == start {
                    return Some(p);
                }
                stack.push((to, p));
            }
        }
    }
    None
}

/// Findings on resolv.conf files: the pods' and the node's.
pub fn resolv_findings(view: &NodeView) -> Vec<Finding> {
    let mut out = Vec::new();
    for (who, file, r) in &view.pod_resolv {
        let mut problems = r.problems.clone();
        if r.nameservers.is_empty() {
            problems.push("no nameserver: every lookup goes to 127.0.0.1".into());
        }
        let search_len: usize = r.search.iter().map(|s| s.len() + 1).sum();
        if r.search.len() > 32 || search_len > 2048 {
            problems.push(format!(
                "search list of {} domains, {search_len} characters: beyond kubelet's limits (32 domains, 2048 characters), the rest is dropped",
                r.search.len()
            ));
        }
        if problems.is_empty() {
            continue;
        }
        let mut f = Finding::new(
            FindingKind::ResolvConf,
            who.clone(),
            format!("{who}'s {file}: {}", problems.join("; ")),
        );
        f.why = "The pod's resolver works from this file: lines it cannot read are ignored, and lookups fail or go where nobody answers.".into();
        f.evidence = problems;
        f.fix = "Fix the pod's `dnsConfig`/`dnsPolicy` (or kubelet's `resolvConf`), then restart the pod.".into();
        out.push(f);
    }
    for NodeNameserver {
        ip: ns,
        how,
        config,
    } in &view.node_nameservers
    {
        if let Some(svc) = view.services.iter().find(|s| s.ip == *ns && s.port == 53) {
            let mut f = Finding::new(
                FindingKind::NodeResolverToClusterDns,
                "node",
                format!(
                    "the node's resolver ({how}) sends to {ns}, the cluster DNS Service {}",
                    svc.name.as_deref().unwrap_or("")
                ),
            );
            f.why = "Pods with `dnsPolicy: Default` — CoreDNS among them — get the node's resolv.conf: a CoreDNS that forwards to it forwards to itself.".into();
            f.evidence = vec![format!("{how}: nameserver {ns}")];
            if !svc.backends.is_empty() {
                let b: Vec<String> = svc.backends.iter().map(ToString::to_string).collect();
                f.evidence.push(format!(
                    "{ns}:53 is Service {} whose DNAT rules send to {}",
                    svc.name.as_deref().unwrap_or("ClusterIP"),
                    b.join(", ")
                ));
            }
            f.fix = match config {
                Some(c) if c.file.contains("resolved.conf") => format!(
                    "Point systemd-resolved at the real upstream resolvers, not at cluster DNS: change `{}` in {} (then `systemctl restart systemd-resolved`); keep kubelet's `resolvConf: /run/systemd/resolve/resolv.conf` so pods with `dnsPolicy: Default` get those real upstreams.",
                    c.text, c.file
                ),
                _ => "Point the node's resolver at the real upstream resolvers, not at cluster DNS; or set kubelet's `resolvConf` to a file that does.".into(),
            };
            f.config = config.clone();
            out.push(f);
        }
    }
    out
}

/// Servers whose config could not be read or parsed.
pub fn config_findings(view: &NodeView) -> Vec<Finding> {
    view.servers
        .iter()
        .filter_map(|s| {
            let e = s.forwards.as_ref().err()?;
            let mut f = Finding::new(
                FindingKind::ConfigUnreadable,
                s.name(),
                format!("{}'s configuration could not be read: {e}", s.name()),
            );
            f.why = "Its forwarding was not checked for loops.".into();
            f.fix = "Check the file named; run doctor with --host-root at the node's root.".into();
            Some(f)
        })
        .collect()
}

#[cfg(test)]
#[path = "node_tests.rs"]
mod tests;
