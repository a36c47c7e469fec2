//! Two "nodes" joined by a real Linux `vxlan` device over a veth underlay, as flannel's
//! VXLAN backend joins them (LAB.md, "Cluster shapes"): a client pod on node A, a DNS pod
//! (dnsmasq) on node B. Every namespace is named from a fresh prefix and removed on drop,
//! with the server this fixture started.
//!
//! ```text
//! client(eth0 10.244.1.2) ─ vcl ─ node-a ─ flannel.1 10.201.0.1/30 ┄┄ VXLAN vni 1, UDP 8472 ┄┄
//!   node-a eth0 10.200.0.1/24 ══ veth underlay ══ node-b eth0 10.200.0.2/24
//!   ┄┄ flannel.1 10.201.0.2/30 ─ node-b ─ vdn ─ dns(eth0 10.244.2.3, dnsmasq)
//! ```
use std::{
    net::Ipv4Addr,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use crate::LabError;

/// The underlay addresses of the nodes (the outer addresses of the tunnel's packets).
pub const NODE_A: Ipv4Addr = Ipv4Addr::new(10, 200, 0, 1);
pub const NODE_B: Ipv4Addr = Ipv4Addr::new(10, 200, 0, 2);
/// The pods.
pub const CLIENT: Ipv4Addr = Ipv4Addr::new(10, 244, 1, 2);
pub const DNS: Ipv4Addr = Ipv4Addr::new(10, 244, 2, 3);
/// The VXLAN id and port (flannel's).
pub const VNI: u32 = 1;
pub const VXLAN_PORT: u16 = 8472;
/// The Service ClusterIP [`VxlanNodes::add_cluster_ip`] makes on node A.
pub const CLUSTER_IP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
/// The address dnsmasq answers for `*.tunnel.test`.
pub const ANSWER: Ipv4Addr = Ipv4Addr::new(10, 9, 9, 9);

/// The two nodes, their pods and the DNS server; torn down on drop.
pub struct VxlanNodes {
    pub prefix: String,
    pub node_a: String,
    pub node_b: String,
    pub client: String,
    pub dns: String,
    /// `/tmp/<prefix>`: captures and logs.
    pub dir: PathBuf,
    server: Option<Child>,
}

fn run(args: &[&str]) -> Result<(), LabError> {
    let out = Command::new(args[0])
        .args(&args[1..])
        .stdin(Stdio::null())
        .output()
        .map_err(|source| LabError::Spawn {
            cmd: args.join(" "),
            source,
        })?;
    if !out.status.success() {
        return Err(LabError::Command {
            cmd: args.join(" "),
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        });
    }
    Ok(())
}

impl VxlanNodes {
    /// Builds the namespaces, links, routes, and starts dnsmasq in the DNS pod; returns once
    /// the client's query through the tunnel is answered.
    pub fn start() -> Result<VxlanNodes, LabError> {
        let mut claimed = None;
        for _ in 0..64 {
            let prefix = format!("dv{}", &crate::bring_up::candidate_prefix()[2..]);
            let dir = std::env::temp_dir().join(&prefix);
            let taken = Path::new("/run/netns")
                .join(format!("{prefix}-na"))
                .exists();
            if !taken && std::fs::create_dir(&dir).is_ok() {
                claimed = Some((prefix, dir));
                break;
            }
        }
        let (prefix, dir) = claimed.ok_or(LabError::NoFreePrefix(64))?;
        let mut n = VxlanNodes {
            node_a: format!("{prefix}-na"),
            node_b: format!("{prefix}-nb"),
            client: format!("{prefix}-cl"),
            dns: format!("{prefix}-dn"),
            prefix,
            dir,
            server: None,
        };
        n.build()?;
        Ok(n)
    }

    fn build(&mut self) -> Result<(), LabError> {
        let (a, b, cl, dn) = (
            self.node_a.as_str(),
            self.node_b.as_str(),
            self.client.as_str(),
            self.dns.as_str(),
        );
        for ns in [a, b, cl, dn] {
            run(&["ip", "netns", "add", ns])?;
            run(&["ip", "-n", ns, "link", "set", "lo", "up"])?;
        }
        for ns in [a, b] {
            for key in [
                "net.ipv4.ip_forward=1",
                "net.ipv4.conf.all.rp_filter=0",
                "net.ipv4.conf.default.rp_filter=0",
            ] {
                run(&["ip", "netns", "exec", ns, "sysctl", "-qw", key])?;
            }
        }
        // The underlay.
        run(&[
            "ip", "-n", a, "link", "add", "eth0", "type", "veth", "peer", "name", "eth0", "netns",
            b,
        ])?;
        for (ns, me, peer) in [(a, NODE_A, NODE_B), (b, NODE_B, NODE_A)] {
            let (me, peer) = (me.to_string(), peer.to_string());
            let flannel = if ns == a {
                "10.201.0.1/30"
            } else {
                "10.201.0.2/30"
            };
            run(&[
                "ip",
                "-n",
                ns,
                "addr",
                "add",
                &format!("{me}/24"),
                "dev",
                "eth0",
            ])?;
            run(&["ip", "-n", ns, "link", "set", "eth0", "up"])?;
            run(&[
                "ip",
                "-n",
                ns,
                "link",
                "add",
                "flannel.1",
                "type",
                "vxlan",
                "id",
                &VNI.to_string(),
                "local",
                &me,
                "remote",
                &peer,
                "dstport",
                &VXLAN_PORT.to_string(),
                "dev",
                "eth0",
            ])?;
            run(&["ip", "-n", ns, "addr", "add", flannel, "dev", "flannel.1"])?;
            run(&["ip", "-n", ns, "link", "set", "flannel.1", "up"])?;
        }
        // The pods: routed /32 veths, the node side 169.254.1.1.
        for (node, pod, veth, ip) in [(a, cl, "vcl", CLIENT), (b, dn, "vdn", DNS)] {
            let ip = ip.to_string();
            run(&[
                "ip", "-n", node, "link", "add", veth, "type", "veth", "peer", "name", "eth0",
                "netns", pod,
            ])?;
            run(&[
                "ip",
                "-n",
                node,
                "addr",
                "add",
                "169.254.1.1/32",
                "dev",
                veth,
            ])?;
            run(&["ip", "-n", node, "link", "set", veth, "up"])?;
            run(&[
                "ip",
                "-n",
                node,
                "route",
                "add",
                &format!("{ip}/32"),
                "dev",
                veth,
            ])?;
            run(&[
                "ip",
                "-n",
                pod,
                "addr",
                "add",
                &format!("{ip}/32"),
                "dev",
                "eth0",
            ])?;
            run(&["ip", "-n", pod, "link", "set", "eth0", "up"])?;
            run(&[
                "ip",
                "-n",
                pod,
                "route",
                "add",
                "169.254.1.1",
                "dev",
                "eth0",
                "scope",
                "link",
            ])?;
            run(&[
                "ip",
                "-n",
                pod,
                "route",
                "add",
                "default",
                "via",
                "169.254.1.1",
            ])?;
        }
        // Each node reaches the other's pod subnet through the tunnel.
        run(&[
            "ip",
            "-n",
            a,
            "route",
            "add",
            "10.244.2.0/24",
            "via",
            "10.201.0.2",
            "dev",
            "flannel.1",
            "onlink",
        ])?;
        run(&[
            "ip",
            "-n",
            b,
            "route",
            "add",
            "10.244.1.0/24",
            "via",
            "10.201.0.1",
            "dev",
            "flannel.1",
            "onlink",
        ])?;
        self.start_server()?;
        self.wait_answered(Duration::from_secs(20))
    }

    fn start_server(&mut self) -> Result<(), LabError> {
        let log = std::fs::File::create(self.dir.join("dnsmasq.log"))
            .map_err(|e| LabError::io("creating the dnsmasq log", e))?;
        let err = log
            .try_clone()
            .map_err(|e| LabError::io("creating the dnsmasq log", e))?;
        let dns = DNS.to_string();
        let mut cmd = Command::new("ip");
        cmd.args([
            "netns",
            "exec",
            &self.dns,
            "dnsmasq",
            "-k",
            "-C",
            "/dev/null",
        ])
        .args([
            "--no-resolv",
            "--no-hosts",
            "--user=root",
            "--log-facility=-",
        ])
        .arg(format!(
            "--pid-file={}",
            self.dir.join("dnsmasq.pid").display()
        ))
        .arg(format!("--listen-address={dns}"))
        .arg("--bind-interfaces")
        .arg(format!("--address=/tunnel.test/{ANSWER}"))
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(err);
        let child = cmd.spawn().map_err(|source| LabError::Spawn {
            cmd: "dnsmasq".into(),
            source,
        })?;
        self.server = Some(child);
        Ok(())
    }

    /// kube-proxy's part on node A: a Service ClusterIP [`CLUSTER_IP`]:53 (UDP and TCP)
    /// DNAT'd in node A's `nat PREROUTING` to the DNS pod on node B, so that the client's
    /// query to the Service crosses the overlay already DNAT'd, as in a cluster.
    pub fn add_cluster_ip(&self) -> Result<(), LabError> {
        let ipt = crate::cmd::find_tool(crate::IptablesFlavor::default().iptables(), "iptables")?;
        let ipt = ipt.to_string_lossy().into_owned();
        let to = format!("{DNS}:53");
        let cip = format!("{CLUSTER_IP}/32");
        for proto in ["udp", "tcp"] {
            run(&[
                "ip",
                "netns",
                "exec",
                &self.node_a,
                &ipt,
                "-t",
                "nat",
                "-A",
                "PREROUTING",
                "-d",
                &cip,
                "-p",
                proto,
                "--dport",
                "53",
                "-j",
                "DNAT",
                "--to-destination",
                &to,
            ])?;
        }
        Ok(())
    }

    /// `dig @SERVER NAME TYPE` in the client pod: its stdout (`+short`) and whether dig
    /// succeeded.
    pub fn dig_at(&self, server: Ipv4Addr, name: &str, qtype: &str) -> (bool, String) {
        let out = Command::new("ip")
            .args([
                "netns",
                "exec",
                &self.client,
                "dig",
                "+short",
                "+tries=1",
                "+time=2",
            ])
            .arg(format!("@{server}"))
            .arg(name)
            .arg(qtype)
            .stdin(Stdio::null())
            .output();
        out.map(|o| {
            (
                o.status.success(),
                String::from_utf8_lossy(&o.stdout).trim().to_owned(),
            )
        })
        .unwrap_or_default()
    }

    /// `dig @DNS NAME A` in the client pod: its stdout (`+short`).
    pub fn dig(&self, name: &str) -> String {
        self.dig_at(DNS, name, "A").1
    }

    fn wait_answered(&self, timeout: Duration) -> Result<(), LabError> {
        let deadline = Instant::now() + timeout;
        loop {
            let got = self.dig("ready.tunnel.test.");
            if got == ANSWER.to_string() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(LabError::NotReady {
                    target: format!("dnsmasq at {DNS} through VXLAN"),
                    probe: "dig ready.tunnel.test.".into(),
                    waited: timeout,
                    detail: format!("got {got:?}"),
                });
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The index of `ifname` in namespace `ns`.
    pub fn ifindex(&self, ns: &str, ifname: &str) -> Option<u32> {
        let out = Command::new("ip")
            .args(["netns", "exec", ns, "cat"])
            .arg(format!("/sys/class/net/{ifname}/ifindex"))
            .output()
            .ok()?;
        String::from_utf8_lossy(&out.stdout).trim().parse().ok()
    }
}

impl Drop for VxlanNodes {
    fn drop(&mut self) {
        if let Some(mut child) = self.server.take() {
            // Our own child, not yet reaped: the PID is still its.
            let _ = child.kill();
            let _ = child.wait();
        }
        for ns in [&self.client, &self.dns, &self.node_a, &self.node_b] {
            let _ = Command::new("ip")
                .args(["netns", "del", ns])
                .stderr(Stdio::null())
                .status();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
