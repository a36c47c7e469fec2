//! Ground truth for the live section: how many DNS packets crossed the lab's hops, counted
//! by netfilter. In each namespace of the lab a chain of its own, jumped to from mangle
//! PREROUTING (every packet a namespace receives, on any interface) and POSTROUTING (every
//! packet it sends), counts UDP packets from or to port 53; a packet forwarded by the node
//! is counted there twice, as it is seen on two interfaces, which is what a capture on every
//! interface (dnspath's TC programs, tcpdump -i any) sees.
use anyhow::anyhow;
use lab::Lab;

/// The counting chain, in the mangle table of every lab namespace.
const CHAIN: &str = "DNSPATH_BENCH";

/// The counters, installed in every namespace of a lab.
pub(super) struct Truth<'a> {
    lab: &'a Lab,
}

impl<'a> Truth<'a> {
    pub(super) fn install(lab: &'a Lab) -> crate::Result<Self> {
        for ns in lab.namespaces() {
            let steps: [&[&str]; 4] = [
                &["-t", "mangle", "-N", CHAIN],
                &[
                    "-t",
                    "mangle",
                    "-A",
                    CHAIN,
                    "-p",
                    "udp",
                    "-m",
                    "multiport",
                    "--ports",
                    "53",
                    "-j",
                    "RETURN",
                ],
                &["-t", "mangle", "-I", "PREROUTING", "-j", CHAIN],
                &["-t", "mangle", "-I", "POSTROUTING", "-j", CHAIN],
            ];
            for rule in steps {
                let o = lab.iptables_rule(ns, rule[0], &rule[1..]);
                if !o.status.success() {
                    return Err(anyhow!(
                        "bench: counting rule {rule:?} in {ns}: {}",
                        String::from_utf8_lossy(&o.stderr)
                    ));
                }
            }
        }
        Ok(Self { lab })
    }

    /// Zeroes every namespace's counter.
    pub(super) fn zero(&self) {
        for ns in self.lab.namespaces() {
            self.lab.iptables_rule(ns, "-t", &["mangle", "-Z", CHAIN]);
        }
    }

    /// DNS packets counted since [`Truth::zero`]: in every namespace of the lab, and in the
    /// node's alone (what tcpdump in the node's namespace can see).
    pub(super) fn read(&self) -> (Option<u64>, Option<u64>) {
        let mut all = Some(0u64);
        let mut node = None;
        for ns in self.lab.namespaces() {
            let o = self
                .lab
                .iptables_rule(ns, "-t", &["mangle", "-L", CHAIN, "-v", "-x", "-n"]);
            let n = packets(&String::from_utf8_lossy(&o.stdout));
            all = all.zip(n).map(|(a, b)| a + b);
            if ns == self.lab.node_ns() {
                node = n;
            }
        }
        (all, node)
    }
}

/// The packet count of the first rule in `iptables -L CHAIN -v -x -n` output (two header
/// lines, then `pkts bytes target ...`).
pub(super) fn packets(listing: &str) -> Option<u64> {
    listing
        .lines()
        .skip(2)
        .find_map(|l| l.split_whitespace().next()?.parse().ok())
}
