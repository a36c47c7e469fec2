//! `dnspath doctor`: the runbooks' triage from one node. Reads the node's files ([`node`]'s
//! checks: static forwarding loops, resolv.conf; [`config`] parses DNS server and resolver
//! configs), watches the traffic for `--duration` through the live pipeline with a sink that
//! folds loops, races, drops and transactions into findings ([`crate::findings`]), then prints
//! them ranked by severity. Exit status by the worst finding
//! ([`Severity::exit_status`]). Schema of `-o json`: docs/doctor.md.
use std::{io::Write, time::Duration};

use serde::Serialize;

use finding::FindingKind;
use finding::{rank, Finding, Severity};
// The checks of the node's files name the findings' types as `super::finding`.
use crate::findings::{finding, watch::Watch};

pub mod cgroups;
pub mod config;
pub mod ct;
pub mod iptables;
pub mod kube_proxy;
pub mod kubelet;
pub mod node;
pub mod node_local;
mod procfs;
pub mod restarts;
pub mod services;

use crate::{
    engine::{self, LiveError, RunOptions},
    event::KernelSetup,
    output::{
        self,
        record::StatsRecord,
        sink::{Batch, Sink, Sinks},
        Format,
    },
    runner::stop::StopPolicy,
};

#[derive(Debug, thiserror::Error)]
pub enum DoctorError {
    #[error(transparent)]
    Live(#[from] LiveError),
    #[error("writing the report: {0}")]
    Io(#[from] std::io::Error),
    #[error("encoding the report: {0}")]
    Json(#[from] serde_json::Error),
}

pub struct DoctorOptions {
    /// The live run (`duration` set; every namespace).
    pub trace: RunOptions,
    pub format: Format,
    pub duration: Duration,
    /// A progress line on stderr (it is a terminal).
    pub progress: bool,
}

/// What was looked at, so "no finding" says how much was checked.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Checked {
    /// DNS server processes of pod namespaces (a socket on port 53).
    pub dns_servers: Vec<String>,
    /// Of them, those whose forwarding was followed from their config.
    pub configs_read: usize,
    /// Service ports from kube-proxy's rules.
    pub services: usize,
    pub pod_resolv_conf: usize,
    /// kubelet's container log files read (`/var/log/pods`).
    pub pod_logs: usize,
    /// DNS servers whose cgroups were read (OOM kills, throttling).
    pub cgroups: usize,
    /// The node namespace's conntrack: `COUNT of MAX entries`, or why not.
    pub conntrack: String,
    /// The node's nameservers (a stub followed).
    pub node_nameservers: Vec<String>,
    /// kube-proxy's modes whose rules are on the node: `iptables`, `nftables`, `ipvs`
    /// (none: no kube-proxy rules found).
    pub kube_proxy_mode: Vec<&'static str>,
    /// NodeLocal DNSCache, where a process of the node listens on a link-local address.
    pub node_local_dns: Option<node_local::NodeLocal>,
    /// kubelet's config.yaml, where it was read.
    pub kubelet: Option<kubelet::KubeletSeen>,
    pub transactions: u64,
    pub packets: u64,
    pub drops: u64,
    /// Transactions' legs and lookups not followed because a table was full (more than
    /// 4,096 servers, or 65,536 lookups of one client): the findings' counts are lower
    /// bounds.
    pub untracked: u64,
    /// Namespaces whose conntrack the watch did not follow: over its cap of 1,024, or a
    /// namespace change lost on its full queue (`stats.conntrack.netns_capped` and
    /// `netns_changes_lost`): races there are judged without the kernel's counters.
    pub conntrack_unfollowed: u64,
}

/// `-o json`: one document.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub version: u32,
    pub duration_s: f64,
    /// `none`, `info`, `warning`, `critical`.
    pub worst: &'static str,
    pub exit_status: u8,
    pub checked: Checked,
    pub findings: Vec<Finding>,
}

/// JSON schema version of [`Report`].
pub const REPORT_VERSION: u32 = 1;

/// kube-proxy's `nat` rules of this namespace, from whichever iptables flavour has them.
fn nat_rules() -> String {
    save_rules("nat")
}

/// `iptables-save -t TABLE` of every iptables flavour, concatenated.
fn save_rules(table: &str) -> String {
    let mut all = String::new();
    for prog in ["iptables-nft-save", "iptables-legacy-save", "iptables-save"] {
        let Some(mut cmd) = crate::host::command(prog) else {
            continue;
        };
        if let Ok(o) = cmd.args(["-t", table]).output() {
            if o.status.success() {
                all.push_str(&String::from_utf8_lossy(&o.stdout));
            }
        }
    }
    all
}

/// What the static half found and keeps for after the watch.
pub struct StaticPart {
    pub findings: Vec<Finding>,
    pub checked: Checked,
    pub view: node::NodeView,
    /// DNS Services without endpoints (their findings count the queries seen to them).
    pub no_endpoints: Vec<services::NoEndpoints>,
}

/// The static half: the node's files, before a packet is traced.
pub fn static_findings() -> StaticPart {
    let nat = nat_rules();
    let proxy = kube_proxy::read(&nat);
    let mut services = iptables::parse_iptables_nat(&nat);
    for s in proxy.services {
        iptables::add_service(&mut services, s);
    }
    let view = node::read_node(services);
    let mut f = node::static_loops(&view);
    f.extend(node::resolv_findings(&view));
    f.extend(node::config_findings(&view));
    let (logs, log_files) = restarts::read_pod_logs();
    f.extend(restarts::restart_findings(&logs));
    let mut no_endpoints = services::parse_filter(&save_rules("filter"));
    no_endpoints.extend(proxy.no_endpoints);
    no_endpoints.extend(services::nat_without_backends(&view.services));
    let node_local = node::node_local(&view, &save_rules("raw"));
    if let Some(nl) = &node_local {
        f.extend(node_local::findings(nl));
    }
    let node_local_ip = node_local.as_ref().and_then(|n| n.address.parse().ok());
    let kubelet = kubelet_findings(&view, node_local_ip, &mut f);
    let checked = Checked {
        pod_logs: log_files,
        dns_servers: view.servers.iter().map(node::DnsServer::name).collect(),
        configs_read: view
            .servers
            .iter()
            .filter(|s| s.kind.is_some() && s.forwards.is_ok())
            .count(),
        services: view.services.len(),
        pod_resolv_conf: view.pod_resolv.len(),
        node_nameservers: view
            .node_nameservers
            .iter()
            .map(|n| format!("{} ({})", n.ip, n.how))
            .collect(),
        kube_proxy_mode: proxy.modes,
        node_local_dns: node_local,
        kubelet,
        ..Default::default()
    };
    StaticPart {
        findings: f,
        checked,
        view,
        no_endpoints,
    }
}

/// kubelet's config.yaml beneath the host root (none: nothing to say), its `resolvConf`
/// file read there too; findings into `f`.
fn kubelet_findings(
    view: &node::NodeView,
    node_local: Option<std::net::IpAddr>,
    f: &mut Vec<Finding>,
) -> Option<kubelet::KubeletSeen> {
    let unreadable = |what: String| {
        let mut x = Finding::new(
            FindingKind::ConfigUnreadable,
            "kubelet",
            format!("kubelet's configuration could not be read: {what}"),
        );
        x.why = "Its clusterDNS and resolvConf were not checked.".into();
        x.fix = "Check the file named; run doctor with --host-root at the node's root.".into();
        x
    };
    let text = match procfs::read_host(kubelet::CONFIG) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => {
            f.push(unreadable(format!("{}: {e}", kubelet::CONFIG)));
            return None;
        }
    };
    let cfg = match kubelet::parse(&text) {
        Ok(c) => c,
        Err(e) => {
            f.push(unreadable(e.to_string()));
            return None;
        }
    };
    let file = cfg
        .resolv_conf
        .clone()
        .unwrap_or_else(|| kubelet::DEFAULT_RESOLV_CONF.to_owned());
    // kubelet's `resolvConf: ""` turns it off.
    let resolv = (!file.is_empty())
        .then(|| procfs::read_host(&file).ok())
        .flatten()
        .map(|t| kubelet::resolv(&t));
    f.extend(kubelet::findings(
        &cfg,
        resolv.as_ref(),
        &view.services,
        node_local,
    ));
    Some(kubelet::KubeletSeen {
        cluster_dns: cfg.cluster_dns,
        resolv_conf: file,
        resolv_conf_nameservers: resolv
            .map(|r| r.nameservers.iter().map(ToString::to_string).collect())
            .unwrap_or_default(),
    })
}

/// Findings of the counters read before and after the watch: cgroups of the DNS servers,
/// conntrack; the conntrack counters' growth goes to race findings as evidence when the race
/// detector attributed drops.
fn counter_findings(
    findings: &mut Vec<Finding>,
    cgroups: &[cgroups::ServerCgroups],
    ct_before: &ct::CtSample,
) {
    findings.extend(cgroups::findings(cgroups));
    let ct_after = ct::sample();
    let release = ct::kernel_release();
    let race_found = findings
        .iter()
        .any(|f| f.kind == FindingKind::ConntrackRace);
    if race_found {
        let ev = ct::growth_evidence(ct_before, &ct_after, &release);
        for f in findings
            .iter_mut()
            .filter(|f| f.kind == FindingKind::ConntrackRace)
        {
            f.evidence.extend(ev.iter().cloned());
        }
    }
    findings.extend(ct::findings(ct_before, &ct_after, &release, race_found));
}

/// The live half's sink: folds records into the caller's watch, shows progress.
struct DoctorSink<'w> {
    watch: &'w mut Watch,
    /// The final counts, set at the end.
    stats: &'w mut Option<StatsRecord>,
    progress: bool,
    started_ns: u64,
    duration: Duration,
}

impl Sink for DoctorSink<'_> {
    fn started(&mut self, _setup: &KernelSetup, now_ns: u64) {
        self.started_ns = now_ns;
    }
    fn batch(&mut self, batch: Batch<'_>) -> std::io::Result<()> {
        for r in batch.records {
            self.watch.observe(r);
        }
        Ok(())
    }
    fn periodic(&mut self, _stats: &StatsRecord, now_ns: u64) {
        if self.progress {
            let s = now_ns.saturating_sub(self.started_ns) / 1_000_000_000;
            eprint!(
                "\rdnspath doctor: watching {s}/{} s, {} transactions",
                self.duration.as_secs(),
                self.watch.traffic.transactions
            );
        }
    }
    fn finish(&mut self, stats: &mut StatsRecord, _now_ns: u64) -> std::io::Result<()> {
        if self.progress {
            eprintln!();
        }
        *self.stats = Some(stats.clone());
        Ok(())
    }
}

/// Runs the checks, writes the report to `out`; returns the exit status.
pub async fn run(opts: DoctorOptions, out: &mut dyn Write) -> Result<u8, DoctorError> {
    let StaticPart {
        mut findings,
        mut checked,
        view,
        no_endpoints,
    } = static_findings();
    let cgroups = cgroups::sample(&view.servers);
    checked.cgroups = cgroups.len();
    let ct_before = ct::sample();
    checked.conntrack = match (ct_before.count, ct_before.max) {
        (Some(c), Some(m)) => format!("{c} of {m} entries"),
        _ => "not loaded in this network namespace".to_owned(),
    };
    // Said before any packet is traced: a static loop is known before a query is sent.
    eprintln!(
        "dnspath doctor: {} DNS server(s) in pod namespaces, {} config(s) followed, {} finding(s) from the node's files",
        checked.dns_servers.len(),
        checked.configs_read,
        findings.len()
    );
    for f in &findings {
        eprintln!(
            "dnspath doctor: {} {:?}: {}",
            f.severity.as_str(),
            f.kind,
            output::escape(&f.seen)
        );
    }
    let mut watch = Watch::default();
    let mut final_stats = None;
    let mut sinks = Sinks::new();
    sinks.push(Box::new(DoctorSink {
        watch: &mut watch,
        stats: &mut final_stats,
        progress: opts.progress,
        started_ns: 0,
        duration: opts.duration,
    }));
    let summary = engine::run_live(opts.trace, &mut sinks, &mut StopPolicy::default()).await?;
    drop(sinks);
    findings.extend(watch.findings());
    findings.extend(services::findings(&no_endpoints, &|a| {
        watch.more.queries_to(a)
    }));
    counter_findings(&mut findings, &cgroups, &ct_before);
    rank(&mut findings);
    checked.transactions = watch.traffic.transactions;
    checked.untracked = watch.untracked();
    let stats = final_stats.unwrap_or(summary.stats);
    checked.packets = stats.decode.packets;
    checked.drops = stats.decode.drops;
    checked.conntrack_unfollowed = stats
        .conntrack
        .as_ref()
        .map_or(0, |c| c.netns_capped + c.netns_changes_lost);
    let worst = findings.iter().map(|f| f.severity).max();
    let report = Report {
        version: REPORT_VERSION,
        duration_s: opts.duration.as_secs_f64(),
        worst: worst.map_or("none", Severity::as_str),
        exit_status: Severity::exit_status(worst),
        checked,
        findings,
    };
    match opts.format {
        Format::Json => {
            serde_json::to_writer_pretty(&mut *out, &report)?;
            writeln!(out)?;
        }
        Format::Text => write_text(&report, out)?,
    }
    out.flush()?;
    Ok(report.exit_status)
}

/// The report for a person; every string from the host or the wire escaped.
pub fn write_text(r: &Report, out: &mut dyn Write) -> std::io::Result<()> {
    let e = |s: &str| output::escape(s).into_owned();
    let c = &r.checked;
    let proxy = if c.kube_proxy_mode.is_empty() {
        "no kube-proxy rules".to_owned()
    } else {
        format!("kube-proxy {}", c.kube_proxy_mode.join("+"))
    };
    let unfollowed = if c.conntrack_unfollowed > 0 {
        format!(
            " (not followed in {} namespace(s): races there judged without its counters)",
            c.conntrack_unfollowed
        )
    } else {
        String::new()
    };
    let looked = format!(
        "{} DNS server(s) ({} with cgroups), {} Service port(s) ({proxy}), {} pod resolv.conf, {} kubelet log file(s), conntrack {}{unfollowed}, {} transaction(s) in {:.0} s",
        c.dns_servers.len(),
        c.cgroups,
        c.services,
        c.pod_resolv_conf,
        c.pod_logs,
        e(&c.conntrack),
        c.transactions,
        r.duration_s
    );
    if r.findings.is_empty() {
        writeln!(out, "dnspath doctor: no findings. Checked {looked}.")?;
        return Ok(());
    }
    writeln!(
        out,
        "dnspath doctor: {} finding(s), worst {} (exit {}). Checked {looked}.",
        r.findings.len(),
        r.worst,
        r.exit_status
    )?;
    for (i, f) in r.findings.iter().enumerate() {
        writeln!(out)?;
        let kind = serde_json::to_value(f.kind)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default();
        writeln!(
            out,
            "{}. {} {kind} — {}",
            i + 1,
            f.severity.as_str().to_uppercase(),
            e(&f.subject)
        )?;
        writeln!(out, "   seen:     {}", e(&f.seen))?;
        writeln!(out, "   why:      {}", e(&f.why))?;
        for (j, ev) in f.evidence.iter().enumerate() {
            let label = if j == 0 { "evidence:" } else { "" };
            writeln!(out, "   {label:<9} {}", e(ev))?;
        }
        if let Some(cl) = &f.config {
            writeln!(
                out,
                "   config:   {}:{}: {}",
                e(&cl.file),
                cl.line,
                e(&cl.text)
            )?;
        }
        writeln!(out, "   fix:      {}", e(&f.fix))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::findings::finding::{Finding, FindingKind};

    fn report() -> Report {
        let mut f = Finding::new(
            FindingKind::StaticForwardingLoop,
            "kube-system/coredns-a",
            "coredns forwards to 10.96.0.10:53\u{1b}[31m",
        );
        f.evidence = vec!["e".into()];
        f.config = Some(crate::findings::finding::ConfigLine {
            file: "/etc/coredns/Corefile".into(),
            line: 3,
            text: "forward . 10.96.0.10".into(),
        });
        Report {
            version: REPORT_VERSION,
            duration_s: 30.0,
            worst: "critical",
            exit_status: 2,
            checked: Checked {
                dns_servers: vec!["x".into()],
                node_nameservers: vec!["y".into()],
                ..Default::default()
            },
            findings: vec![f],
        }
    }

    #[test]
    fn every_report_field_is_documented() {
        let doc = include_str!("../../../docs/doctor.md");
        let v = serde_json::to_value(report()).unwrap();
        let serde_json::Value::Object(m) = &v else {
            panic!("{v}")
        };
        for (k, val) in m {
            assert!(
                doc.contains(&format!("`{k}`")),
                "`{k}` not in docs/doctor.md"
            );
            if k == "checked" {
                for k in val.as_object().unwrap().keys() {
                    assert!(
                        doc.contains(&format!("`{k}`")),
                        "`{k}` not in docs/doctor.md"
                    );
                }
            }
        }
    }

    #[test]
    fn text_escapes_host_strings_and_healthy_says_so() {
        let mut out = Vec::new();
        write_text(&report(), &mut out).unwrap();
        let s = String::from_utf8(out).unwrap();
        assert!(!s.contains('\u{1b}'), "{s}");
        assert!(
            s.contains("1. CRITICAL static_forwarding_loop — kube-system/coredns-a"),
            "{s}"
        );
        assert!(
            s.contains("config:   /etc/coredns/Corefile:3: forward . 10.96.0.10"),
            "{s}"
        );
        let mut healthy = report();
        healthy.findings.clear();
        let mut out = Vec::new();
        write_text(&healthy, &mut out).unwrap();
        assert!(String::from_utf8(out)
            .unwrap()
            .starts_with("dnspath doctor: no findings."));
    }

    /// Namespaces conntrack did not follow are said only when there are some.
    #[test]
    fn text_names_unfollowed_conntrack_only_when_some() {
        let text = |r: &Report| {
            let mut out = Vec::new();
            write_text(r, &mut out).unwrap();
            String::from_utf8(out).unwrap()
        };
        let mut r = report();
        assert!(!text(&r).contains("not followed"), "{}", text(&r));
        r.checked.conntrack_unfollowed = 3;
        assert!(
            text(&r).contains(
                "(not followed in 3 namespace(s): races there judged without its counters)"
            ),
            "{}",
            text(&r)
        );
    }
}
