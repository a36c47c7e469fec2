//! A finding: one thing wrong on the node, how bad it is, what was seen, why it matters,
//! the evidence and the runbooks' fix. Serialized as documented in docs/doctor.md.
use serde::Serialize;

/// How bad a finding is. Ordered: `Critical` is the greatest.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// Worth knowing; not failing anything now (exit status 0).
    Info,
    /// Some lookups fail or are slow (exit status 1).
    Warning,
    /// DNS is broken, or will break as soon as it is asked (exit status 2).
    Critical,
}

impl Severity {
    /// `dnspath doctor`'s exit status for a run whose worst finding is this.
    pub fn exit_status(worst: Option<Severity>) -> u8 {
        match worst {
            None | Some(Severity::Info) => 0,
            Some(Severity::Warning) => 1,
            Some(Severity::Critical) => 2,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Info => "info",
            Severity::Warning => "warning",
            Severity::Critical => "critical",
        }
    }
}

/// Every kind of finding, with its severity.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FindingKind {
    /// A DNS server's configuration forwards, through the node's rules and resolvers, back
    /// to itself: found from the files, before a packet is sent.
    StaticForwardingLoop,
    /// A DNS server's container exited on CoreDNS's loop plugin (`plugin/loop: Loop (…)
    /// detected`), from kubelet's log files of the container.
    LoopPluginExit,
    /// A forwarding loop seen in the traffic (`loop` records).
    RuntimeLoop,
    /// A DNS Service (port 53) without endpoints: kube-proxy rejects its queries.
    ServiceWithoutEndpoints,
    /// The kernel dropped DNS packets (not races, not late answers): a NetworkPolicy or
    /// firewall rule on port 53.
    KernelDrops,
    /// A container could not bind port 53 (its log files).
    Port53BindFailure,
    /// A DNS server's configuration did not parse (CoreDNS `Error during parsing`, its log
    /// files).
    ConfigParseError,
    /// Queries lost to the conntrack A/AAAA insert race (`race` records).
    ConntrackRace,
    /// conntrack's `insert_failed`/`drop` grew during the watch, not attributed to queries.
    ConntrackInsertFailed,
    /// The conntrack table is nearly full.
    ConntrackTableFill,
    /// The kernel OOM-killed processes in a DNS server's cgroup (`oom_kill`).
    OomKilled,
    /// A DNS server was CPU-throttled during the watch (`cpu.stat`).
    CpuThrottled,
    /// A server left queries unanswered.
    UnansweredQueries,
    /// A server answered SERVFAIL.
    Servfail,
    /// Answers came after the client had given up (transaction outcome `late`).
    LateAnswers,
    /// Fragmented DNS datagrams lost fragments on a hop (MTU).
    FragmentLoss,
    /// Truncated answers (TC) a client never retried over TCP.
    TruncatedNotRetried,
    /// Client queries that went around NodeLocal DNSCache (legs labelled `bypass`).
    NodeCacheBypassed,
    /// Lookups that went through several NXDOMAINs of the search list first (`ndots`).
    NdotsAmplification,
    /// A pod's or the node's resolv.conf is unusable or beyond the resolver's limits.
    ResolvConf,
    /// The node's resolver leads to cluster DNS: any DNS pod with `dnsPolicy: Default`
    /// forwarding to it would loop.
    NodeResolverToClusterDns,
    /// A DNS server's configuration could not be read or parsed: its forwarding was not
    /// checked.
    ConfigUnreadable,
    /// kubelet's `clusterDNS` is not a DNS Service kube-proxy serves (nor NodeLocal
    /// DNSCache's address).
    KubeletClusterDns,
    /// kubelet's `resolvConf` names a loopback stub (127.0.0.53).
    KubeletResolvConfLoopback,
    /// NodeLocal DNSCache runs but its `raw` NOTRACK rules are missing.
    NodeCacheNotrackMissing,
}

impl FindingKind {
    /// Its name in JSON, events and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            FindingKind::StaticForwardingLoop => "static_forwarding_loop",
            FindingKind::LoopPluginExit => "loop_plugin_exit",
            FindingKind::RuntimeLoop => "runtime_loop",
            FindingKind::ServiceWithoutEndpoints => "service_without_endpoints",
            FindingKind::KernelDrops => "kernel_drops",
            FindingKind::Port53BindFailure => "port53_bind_failure",
            FindingKind::ConfigParseError => "config_parse_error",
            FindingKind::ConntrackRace => "conntrack_race",
            FindingKind::ConntrackInsertFailed => "conntrack_insert_failed",
            FindingKind::ConntrackTableFill => "conntrack_table_fill",
            FindingKind::OomKilled => "oom_killed",
            FindingKind::CpuThrottled => "cpu_throttled",
            FindingKind::UnansweredQueries => "unanswered_queries",
            FindingKind::Servfail => "servfail",
            FindingKind::LateAnswers => "late_answers",
            FindingKind::FragmentLoss => "fragment_loss",
            FindingKind::TruncatedNotRetried => "truncated_not_retried",
            FindingKind::NodeCacheBypassed => "node_cache_bypassed",
            FindingKind::NdotsAmplification => "ndots_amplification",
            FindingKind::ResolvConf => "resolv_conf",
            FindingKind::NodeResolverToClusterDns => "node_resolver_to_cluster_dns",
            FindingKind::ConfigUnreadable => "config_unreadable",
            FindingKind::KubeletClusterDns => "kubelet_cluster_dns",
            FindingKind::KubeletResolvConfLoopback => "kubelet_resolv_conf_loopback",
            FindingKind::NodeCacheNotrackMissing => "node_cache_notrack_missing",
        }
    }

    pub fn severity(self) -> Severity {
        match self {
            FindingKind::StaticForwardingLoop
            | FindingKind::LoopPluginExit
            | FindingKind::RuntimeLoop
            | FindingKind::ServiceWithoutEndpoints
            | FindingKind::KernelDrops
            | FindingKind::Port53BindFailure
            | FindingKind::ConfigParseError
            | FindingKind::KubeletClusterDns => Severity::Critical,
            FindingKind::ConntrackRace
            | FindingKind::ConntrackInsertFailed
            | FindingKind::ConntrackTableFill
            | FindingKind::OomKilled
            | FindingKind::CpuThrottled
            | FindingKind::FragmentLoss
            | FindingKind::TruncatedNotRetried
            | FindingKind::NodeCacheBypassed
            | FindingKind::UnansweredQueries
            | FindingKind::Servfail
            | FindingKind::LateAnswers
            | FindingKind::ResolvConf
            | FindingKind::NodeResolverToClusterDns
            | FindingKind::KubeletResolvConfLoopback
            | FindingKind::NodeCacheNotrackMissing => Severity::Warning,
            FindingKind::NdotsAmplification | FindingKind::ConfigUnreadable => Severity::Info,
        }
    }
}

/// The configuration line a finding is about.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ConfigLine {
    /// The file as the server sees it (inside its own root), or `argv` for a command-line
    /// argument.
    pub file: String,
    /// 1-based; 0 for a command-line argument.
    pub line: usize,
    pub text: String,
}

/// One finding.
#[derive(Clone, Debug, Serialize)]
pub struct Finding {
    pub kind: FindingKind,
    pub severity: Severity,
    /// Where: a pod (`namespace/name`), a network namespace, a server address, or `node`.
    pub subject: String,
    /// What was seen, one sentence.
    pub seen: String,
    /// Why it matters.
    pub why: String,
    /// The facts behind it, one a line.
    pub evidence: Vec<String>,
    /// What to do, in the runbooks' words.
    pub fix: String,
    /// The configuration line that causes it, where one does.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub config: Option<ConfigLine>,
    /// How many times it was seen (packets, queries, lookups; 1 for a static finding).
    pub count: u64,
}

impl Finding {
    pub fn new(kind: FindingKind, subject: impl Into<String>, seen: impl Into<String>) -> Self {
        Finding {
            kind,
            severity: kind.severity(),
            subject: subject.into(),
            seen: seen.into(),
            why: String::new(),
            evidence: Vec::new(),
            fix: String::new(),
            config: None,
            count: 1,
        }
    }
}

/// Most severe first; within a severity, static loops before runtime ones, then the most
/// frequent.
pub fn rank(findings: &mut [Finding]) {
    findings.sort_by(|a, b| {
        b.severity
            .cmp(&a.severity)
            .then(a.kind.cmp(&b.kind))
            .then(b.count.cmp(&a.count))
            .then(a.subject.cmp(&b.subject))
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_by_severity_then_kind() {
        let mut f = vec![
            Finding::new(FindingKind::NdotsAmplification, "a", "x"),
            Finding::new(FindingKind::LateAnswers, "b", "x"),
            Finding::new(FindingKind::RuntimeLoop, "c", "x"),
            Finding::new(FindingKind::StaticForwardingLoop, "d", "x"),
        ];
        rank(&mut f);
        let kinds: Vec<_> = f.iter().map(|f| f.kind).collect();
        assert_eq!(
            kinds,
            [
                FindingKind::StaticForwardingLoop,
                FindingKind::RuntimeLoop,
                FindingKind::LateAnswers,
                FindingKind::NdotsAmplification
            ]
        );
        assert_eq!(Severity::exit_status(None), 0);
        assert_eq!(Severity::exit_status(Some(Severity::Info)), 0);
        assert_eq!(Severity::exit_status(Some(Severity::Warning)), 1);
        assert_eq!(Severity::exit_status(Some(Severity::Critical)), 2);
    }

    #[test]
    fn kind_names_are_serde_names() {
        for kind in crate::findings::fields::kinds() {
            let json = serde_json::to_value(kind).unwrap();
            assert_eq!(json, kind.as_str(), "{kind:?}");
        }
    }
}
