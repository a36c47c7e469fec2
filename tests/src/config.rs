use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use crate::addr;

/// Which program plays a "CoreDNS" pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DnsServerKind {
    /// `dnsdist`: forwards every query, no de-duplication of in-flight questions, the way
    /// CoreDNS `forward` behaves; a forwarding loop through it sustains itself.
    Dnsdist,
    /// `dnsmasq`: a caching forwarder that de-duplicates identical in-flight questions,
    /// so a loop through it dies after a few hops with the client unanswered.
    Dnsmasq,
}

/// One "CoreDNS" pod behind the DNS Service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DnsPodConfig {
    pub kind: DnsServerKind,
    /// Where the pod forwards every query. Default: the upstream, `10.250.0.53:53`.
    /// Point it at the ClusterIP for a forwarding loop through the Service, or at a
    /// loopback address such as `127.0.0.53:53` for a loop over the pod's own `lo`.
    pub forward_to: SocketAddr,
}

impl DnsPodConfig {
    /// A pod of `kind` forwarding to the upstream.
    pub fn new(kind: DnsServerKind) -> Self {
        Self {
            kind,
            forward_to: SocketAddr::new(IpAddr::V4(addr::UPSTREAM), 53),
        }
    }

    /// The same pod forwarding to `target` instead.
    pub fn forwarding_to(mut self, target: SocketAddr) -> Self {
        self.forward_to = target;
        self
    }

    /// The same pod forwarding to its own Service (`10.96.0.10:53`): a forwarding loop.
    pub fn forwarding_to_cluster_ip(self) -> Self {
        self.forwarding_to(SocketAddr::new(IpAddr::V4(addr::CLUSTER_IP), 53))
    }

    /// Whether this pod answers `www.lab.test` once it runs (it forwards to the upstream);
    /// pods that do not are only checked for a listening socket at start, so that the
    /// readiness probe does not itself start a loop.
    pub fn forwards_to_upstream(&self) -> bool {
        self.forward_to.port() == 53
            && (self.forward_to.ip() == IpAddr::V4(addr::UPSTREAM)
                || self.forward_to.ip() == IpAddr::V6(addr::UPSTREAM6))
    }
}

impl Default for DnsPodConfig {
    fn default() -> Self {
        Self::new(DnsServerKind::Dnsdist)
    }
}

/// Which iptables the node's kube-proxy rules are written with. Both keep their rules per
/// network namespace; they differ in where the kernel accounts a `-j DROP`
/// (`nft_do_chain` vs `nf_hook_slow`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IptablesFlavor {
    #[default]
    Nft,
    Legacy,
}

impl IptablesFlavor {
    /// The `iptables` binary of this flavor.
    pub fn iptables(self) -> &'static str {
        match self {
            Self::Nft => "iptables-nft",
            Self::Legacy => "iptables-legacy",
        }
    }

    /// The `iptables-restore` binary of this flavor.
    pub fn restore(self) -> &'static str {
        match self {
            Self::Nft => "iptables-nft-restore",
            Self::Legacy => "iptables-legacy-restore",
        }
    }
}

/// The client pod's resolv.conf as kubelet writes it for a pod in namespace `default`
/// with `dnsPolicy: ClusterFirst`.
pub const KUBERNETES_RESOLV_CONF: &str =
    "search default.svc.cluster.local svc.cluster.local cluster.local\n\
nameserver 10.96.0.10\n\
options ndots:5\n";

/// What to build.
#[derive(Debug, Clone)]
pub struct LabConfig {
    /// The "CoreDNS" pods behind the Service, in order (`dnsa`, `dnsb`, ...); 1 to
    /// [`addr::MAX_DNS_PODS`]. Default: two dnsdist pods forwarding to the upstream.
    pub dns_pods: Vec<DnsPodConfig>,
    /// Send every Service query to this pod (index into `dns_pods`) instead of choosing
    /// at random, for deterministic tests.
    pub pin_backend: Option<usize>,
    pub iptables: IptablesFlavor,
    /// Content of the client's `/etc/resolv.conf` (through `/etc/netns/<client-ns>/`).
    pub client_resolv_conf: String,
    /// How long start-up waits for every server to answer.
    pub readiness_timeout: Duration,
    /// How long teardown waits after SIGTERM before SIGKILL.
    pub stop_grace: Duration,
}

impl Default for LabConfig {
    fn default() -> Self {
        Self {
            dns_pods: vec![DnsPodConfig::default(), DnsPodConfig::default()],
            pin_backend: None,
            iptables: IptablesFlavor::default(),
            client_resolv_conf: KUBERNETES_RESOLV_CONF.to_owned(),
            readiness_timeout: Duration::from_secs(10),
            stop_grace: Duration::from_secs(1),
        }
    }
}
