//! NodeLocal DNSCache's shape in the lab's node namespace (docs/lab.md, "Cluster shapes"):
//! a cache (dnsdist with a packet cache) listening on the link-local address
//! [`NODE_CACHE_ADDR`] and on the cluster DNS ClusterIP, both on the node's `lo`, with `raw`
//! NOTRACK rules for both so kube-proxy's DNAT never sees them; misses go over TCP to a
//! second Service, [`UPSTREAM_SERVICE`] (kube-dns-upstream), DNAT'd in the node's `nat
//! OUTPUT` to the first "CoreDNS" pod. Everything it adds lives in the lab's node namespace
//! and goes with it; the cache's process is the lab's to stop.
use std::{
    process::{Child, Output},
    thread,
    time::{Duration, Instant},
};

use crate::{Lab, LabError, Pod};

/// NodeLocal DNSCache's usual link-local address.
pub const NODE_CACHE_ADDR: &str = "169.254.20.10";

/// The Service the cache sends its misses to (kube-dns-upstream), over TCP.
pub const UPSTREAM_SERVICE: &str = "10.96.0.11";

/// The running cache; stopped (SIGKILL) on drop, the rest goes with the lab.
pub struct NodeCache {
    server: Option<Child>,
}

fn ok(what: &str, o: Output) -> Result<(), LabError> {
    if o.status.success() {
        Ok(())
    } else {
        Err(LabError::Command {
            cmd: what.to_string(),
            status: o.status.to_string(),
            stderr: String::from_utf8_lossy(&o.stderr).trim().to_string(),
        })
    }
}

impl NodeCache {
    /// Sets the node up as NodeLocal DNSCache does and starts the cache; returns once it
    /// answers.
    pub fn start(lab: &Lab) -> Result<Self, LabError> {
        let node = lab.node_ns();
        let cluster_ip = lab.cluster_ip().to_string();
        for addr in [NODE_CACHE_ADDR, cluster_ip.as_str()] {
            let cidr = format!("{addr}/32");
            let args = ["ip", "addr", "add", &cidr, "dev", "lo"];
            ok(&args.join(" "), lab.exec(node, &args))?;
            for proto in ["udp", "tcp"] {
                let rules: [[&str; 10]; 2] = [
                    [
                        "-t",
                        "raw",
                        "PREROUTING",
                        "-d",
                        addr,
                        "-p",
                        proto,
                        "--dport",
                        "53",
                        "-j",
                    ],
                    [
                        "-t", "raw", "OUTPUT", "-s", addr, "-p", proto, "--sport", "53", "-j",
                    ],
                ];
                for r in rules {
                    // `-t raw -I CHAIN …`: the table goes before the operation.
                    let mut rule = vec![r[0], r[1], "-I"];
                    rule.extend_from_slice(&r[2..]);
                    rule.push("NOTRACK");
                    let o = lab.exec(node, &[&[lab.iptables()][..], &rule[..]].concat());
                    ok(&rule.join(" "), o)?;
                }
            }
        }
        // kube-dns-upstream: DNAT of the node's own queries, and a route for them to take
        // before the DNAT rewrites it.
        let pod = format!("{}:53", lab.ip_of(Pod::Dns(0)));
        for proto in ["udp", "tcp"] {
            let rule = [
                "-t",
                "nat",
                "-I",
                "OUTPUT",
                "-d",
                UPSTREAM_SERVICE,
                "-p",
                proto,
                "--dport",
                "53",
                "-j",
                "DNAT",
                "--to-destination",
                &pod,
            ];
            ok(
                &rule.join(" "),
                lab.exec(node, &[&[lab.iptables()][..], &rule[..]].concat()),
            )?;
        }
        let svc = format!("{UPSTREAM_SERVICE}/32");
        let route = ["ip", "route", "add", &svc, "dev", lab.veth_of(Pod::Dns(0))];
        ok(&route.join(" "), lab.exec(node, &route))?;

        let conf = lab.temp_dir().join("node-cache.conf");
        let text = format!(
            "setLocal('{NODE_CACHE_ADDR}:53')\n\
addLocal('{cluster_ip}:53')\n\
setACL({{'0.0.0.0/0'}})\n\
setSecurityPollSuffix('')\n\
newServer({{address='{UPSTREAM_SERVICE}:53', tcpOnly=true}}):setUp()\n\
getPool(''):setCache(newPacketCache(10000))\n"
        );
        std::fs::write(&conf, text).map_err(|source| LabError::Io {
            what: format!("writing {}", conf.display()),
            source,
        })?;
        let conf = conf.to_string_lossy().into_owned();
        let server = lab.spawn_in(
            node,
            &["dnsdist", "--supervised", "--disable-syslog", "-C", &conf],
        )?;
        let cache = NodeCache {
            server: Some(server),
        };
        let deadline = Instant::now() + Duration::from_secs(15);
        let at = format!("@{NODE_CACHE_ADDR}");
        loop {
            // A name nobody else asks: the tests' own names start as misses.
            let probe = ["dig", "+time=1", "+tries=1", &at, "ns.lab.test.", "AAAA"];
            if lab.exec(node, &probe).status.success() {
                return Ok(cache);
            }
            if Instant::now() > deadline {
                return Err(LabError::Config(
                    "the node cache did not answer within 15 s".to_string(),
                ));
            }
            thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for NodeCache {
    fn drop(&mut self) {
        if let Some(mut s) = self.server.take() {
            let _ = s.kill();
            let _ = s.wait();
        }
    }
}
