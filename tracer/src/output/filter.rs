//! What a run shows: `--pod`, `--namespace`, `--name`, `--qtype`, `--rcode`, `--failures`,
//! `--slower-than`. Applied where records are written, after every stage has seen them:
//! counters, stats and detection (loops, races) are never filtered.
//!
//! Different flags must all match; the values of one repeated flag are alternatives. A packet
//! or drop matches by its own DNS message and pod; a transaction when any of its legs or hops
//! does (its question, any leg's rcode, the client's or any hop's pod); a loop by its
//! question and its cycle's pods, a race by its queries and client pod. A record without the
//! thing a flag asks about does not match it (a packet has no latency, a loop no rcode); the
//! stats record is always written.
use globset::{Glob, GlobBuilder, GlobSet, GlobSetBuilder};

use super::record::{Record, RecordKind};
use crate::decode::dns::RrType;

#[derive(Debug, thiserror::Error)]
pub enum FilterError {
    #[error("{flag} {pattern:?}")]
    Glob {
        flag: &'static str,
        pattern: String,
        source: globset::Error,
    },
    #[error("{flag}: empty value")]
    Empty { flag: &'static str },
}

/// The flags as given.
#[derive(Clone, Debug, Default)]
pub struct FilterSpec {
    pub pods: Vec<String>,
    pub namespaces: Vec<String>,
    pub names: Vec<String>,
    pub qtypes: Vec<String>,
    pub rcodes: Vec<String>,
    pub failures: bool,
    pub slower_than_ns: Option<u64>,
}

#[derive(Clone, Debug, Default)]
pub struct Filter {
    pods: Option<GlobSet>,
    namespaces: Option<GlobSet>,
    names: Option<GlobSet>,
    /// `--qtype`: the types its words name (a word naming none matches nothing).
    qtypes: Option<Vec<RrType>>,
    rcodes: Vec<String>,
    failures: bool,
    slower_than_ns: Option<u64>,
}

fn globs(
    flag: &'static str,
    patterns: &[String],
    prep: impl Fn(&str) -> String,
    case_insensitive: bool,
) -> Result<Option<GlobSet>, FilterError> {
    if patterns.is_empty() {
        return Ok(None);
    }
    let mut b = GlobSetBuilder::new();
    for p in patterns {
        if p.is_empty() {
            return Err(FilterError::Empty { flag });
        }
        let glob: Glob = GlobBuilder::new(&prep(p))
            .case_insensitive(case_insensitive)
            .literal_separator(true)
            .build()
            .map_err(|source| FilterError::Glob {
                flag,
                pattern: p.clone(),
                source,
            })?;
        b.add(glob);
    }
    b.build().map(Some).map_err(|source| FilterError::Glob {
        flag,
        pattern: patterns.join(","),
        source,
    })
}

/// `A,aaaa` and repeated flags → `["A", "AAAA"]`.
fn list(flag: &'static str, values: &[String]) -> Result<Vec<String>, FilterError> {
    let mut out = Vec::new();
    for v in values {
        for item in v.split(',') {
            let item = item.trim();
            if item.is_empty() {
                return Err(FilterError::Empty { flag });
            }
            out.push(item.to_ascii_uppercase());
        }
    }
    Ok(out)
}

/// Query names compare without their trailing dot (and case-insensitively).
fn bare(name: &str) -> &str {
    name.strip_suffix('.').unwrap_or(name)
}

impl Filter {
    pub fn new(spec: &FilterSpec) -> Result<Self, FilterError> {
        Ok(Self {
            // A pattern without a `/` names pods in any namespace.
            pods: globs(
                "--pod",
                &spec.pods,
                |p| {
                    if p.contains('/') {
                        p.to_string()
                    } else {
                        format!("*/{p}")
                    }
                },
                false,
            )?,
            namespaces: globs("--namespace", &spec.namespaces, str::to_string, false)?,
            names: globs("--name", &spec.names, |p| bare(p).to_string(), true)?,
            qtypes: Some(list("--qtype", &spec.qtypes)?)
                .filter(|words| !words.is_empty())
                .map(|words| words.iter().filter_map(|w| RrType::named(w)).collect()),
            rcodes: list("--rcode", &spec.rcodes)?,
            failures: spec.failures,
            slower_than_ns: spec.slower_than_ns,
        })
    }

    /// Whether any flag was given.
    pub fn is_active(&self) -> bool {
        self.pods.is_some()
            || self.namespaces.is_some()
            || self.names.is_some()
            || self.qtypes.is_some()
            || !self.rcodes.is_empty()
            || self.failures
            || self.slower_than_ns.is_some()
    }

    fn pod_matches(&self, r: &dyn RecordKind) -> bool {
        let pod_ok = self.pods.as_ref().is_none_or(|set| {
            r.any_pod(&mut |p| p.pod.as_deref().is_some_and(|l| set.is_match(l)))
                || r.any_pod(&mut |p| {
                    p.pod_uid
                        .as_deref()
                        .is_some_and(|u| set.is_match(format!("*/{u}")) || set.is_match(u))
                })
        });
        let ns_ok = self.namespaces.as_ref().is_none_or(|set| {
            r.any_pod(&mut |p| {
                p.pod
                    .as_deref()
                    .and_then(|l| l.split_once('/'))
                    .is_some_and(|(ns, _)| set.is_match(ns))
            })
        });
        pod_ok && ns_ok
    }

    fn question_matches(&self, r: &dyn RecordKind) -> bool {
        let name_ok = self
            .names
            .as_ref()
            .is_none_or(|set| r.any_question(&mut |n, _| set.is_match(bare(n))));
        let type_ok = self
            .qtypes
            .as_ref()
            .is_none_or(|types| r.any_question(&mut |_, t| types.contains(&t)));
        name_ok && type_ok
    }

    fn rcode_matches(&self, r: &dyn RecordKind) -> bool {
        self.rcodes.is_empty()
            || r.any_rcode(&mut |rc| self.rcodes.iter().any(|w| w.eq_ignore_ascii_case(rc)))
    }

    /// Whether `r` is shown. Each kind says what it names ([`RecordKind`], next to its type).
    pub fn keep(&self, r: &Record) -> bool {
        if !self.is_active() {
            return true;
        }
        let r = r.kind();
        !r.is_filtered()
            || (self.pod_matches(r)
                && self.question_matches(r)
                && self.rcode_matches(r)
                && (!self.failures || r.is_failure())
                && self.slower_than_ns.is_none_or(|limit| r.slower_than(limit)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        correlate::{
            record::{Join, LegOutcome, Outcome, Summary},
            LegRole,
        },
        decode::dns::{DnsMessage, Flags, Question, RrClass},
        output::record::{
            HopRecord, LegRecord, LookupRef, PacketRecord, PodRef, QuestionRecord,
            TransactionRecord,
        },
        test_support::fixtures::addr,
    };

    fn packet_json(name: &str, qtype: &str, qr: bool, rcode: &str, pod: Option<&str>) -> Record {
        Record::Packet(PacketRecord {
            pod: pod.map(|p| {
                std::sync::Arc::new(PodRef {
                    pod: Some(p.to_string()),
                    ..Default::default()
                })
            }),
            ts_ns: 1,
            time: crate::time::WallTime(0),
            cpu: None,
            netns: "n".into(),
            netns_cookie: 1,
            ifname: "eth0".into(),
            ifindex: 2,
            dir: crate::event::Direction::Egress,
            proto: crate::decode::record::Proto::Udp,
            src: "10.0.0.1:1000"
                .parse::<std::net::SocketAddr>()
                .unwrap()
                .into(),
            dst: "10.0.0.2:53"
                .parse::<std::net::SocketAddr>()
                .unwrap()
                .into(),
            len: 60,
            caplen: 60,
            vlan: None,
            tunnel: None,
            dns: Some(
                DnsMessage {
                    id: 1,
                    qr,
                    opcode: "QUERY".into(),
                    rcode: rcode.to_owned().into(),
                    flags: Flags::default(),
                    questions: vec![Question {
                        name: name.into(),
                        qtype: qtype.into(),
                        class: "IN".into(),
                    }],
                    answers: Vec::new(),
                    authority: Vec::new(),
                    additional: Vec::new(),
                    edns: None,
                    cut: None,
                }
                .into(),
            ),
            malformed: None,
            capture_truncated: false,
        })
    }

    fn filter(f: impl FnOnce(&mut FilterSpec)) -> Filter {
        let mut spec = FilterSpec::default();
        f(&mut spec);
        Filter::new(&spec).unwrap()
    }

    fn transaction(
        outcome: &'static str,
        rcode: &str,
        latency_ms: Option<u64>,
    ) -> TransactionRecord {
        let rcode = (!rcode.is_empty()).then(|| crate::decode::dns::Rcode::from(rcode));
        let outcome = match outcome {
            "answered" => Outcome::Answered,
            "dropped" => Outcome::Dropped,
            "pending" => Outcome::Pending,
            _ => Outcome::Unanswered,
        };
        let hop = HopRecord {
            pod: Default::default(),
            ts_ns: 1,
            netns: "n".into(),
            ifname: "eth0".into(),
            dir: crate::event::Direction::Egress,
            src: addr("10.0.0.1:1000"),
            dst: addr("10.0.0.2:53"),
            dns_id: 1,
            qr: false,
            latency_ns: None,
            tunnel: None,
        };
        TransactionRecord {
            evidence: None,
            pod: Default::default(),
            id: 1,
            lookup: LookupRef { id: 1, step: 0 },
            ts_ns: 1,
            wall_ns: 1,
            client: addr("10.0.0.1:1000"),
            client_netns: "n".into(),
            question: QuestionRecord::new("www.lab.test.", RrType::A, RrClass::IN),
            outcome,
            rcode: rcode.clone(),
            answers: Vec::new(),
            answer_cut: None,
            latency_ns: latency_ms.map(|ms| ms * 1_000_000),
            summary: Summary::Pending,
            legs: vec![LegRecord {
                id: 1,
                parent: None,
                role: LegRole::Query,
                proto: crate::decode::record::Proto::Udp,
                client: addr("10.0.0.1:1000"),
                server: addr("10.0.0.2:53"),
                backend: addr("10.0.0.2:53"),
                dns_id: 1,
                join: Join::SameTuple,
                outcome: if outcome == Outcome::Answered {
                    LegOutcome::Answered
                } else {
                    LegOutcome::Unanswered
                },
                rcode,
                answers: Vec::new(),
                answer_cut: None,
                latency_ns: None,
                retransmits: 0,
                drop: None,
                node_cache: None,
                pod_proxy: None,
                hops: vec![hop.clone(), hop],
                race_drop: false,
                closes_loop: None,
                node: None,
            }],
            nodes: Vec::new(),
        }
    }

    #[test]
    fn no_flags_keep_everything() {
        let f = Filter::default();
        assert!(!f.is_active());
        assert!(f.keep(&packet_json("x.", "A", false, "NOERROR", None)));
    }

    #[test]
    fn name_glob_case_insensitive_trailing_dot_optional() {
        for pat in ["*.svc.cluster.local", "*.SVC.cluster.local."] {
            let f = filter(|s| s.names = vec![pat.into()]);
            assert!(f.keep(&packet_json(
                "kube-dns.kube-system.svc.cluster.local.",
                "A",
                false,
                "NOERROR",
                None
            )));
            assert!(f.keep(&packet_json(
                "Web.Default.SVC.Cluster.Local.",
                "A",
                false,
                "NOERROR",
                None
            )));
            assert!(!f.keep(&packet_json(
                "www.example.com.",
                "A",
                false,
                "NOERROR",
                None
            )));
        }
        let f = filter(|s| s.names = vec!["www.lab.test".into()]);
        assert!(f.keep(&packet_json("WWW.lab.test.", "A", false, "NOERROR", None)));
        assert!(
            f.keep(&Record::Stats(Default::default())),
            "stats always shown"
        );
    }

    #[test]
    fn qtype_and_rcode_lists() {
        let f = filter(|s| s.qtypes = vec!["a,aaaa".into()]);
        assert!(f.keep(&packet_json("x.", "AAAA", false, "NOERROR", None)));
        assert!(!f.keep(&packet_json("x.", "MX", false, "NOERROR", None)));
        let f = filter(|s| s.rcodes = vec!["NXDOMAIN".into(), "servfail".into()]);
        assert!(f.keep(&packet_json("x.", "A", true, "NXDOMAIN", None)));
        assert!(f.keep(&packet_json("x.", "A", true, "SERVFAIL", None)));
        assert!(!f.keep(&packet_json("x.", "A", true, "NOERROR", None)));
        // A query has no rcode to match.
        assert!(!f.keep(&packet_json("x.", "A", false, "NOERROR", None)));
        assert!(Filter::new(&FilterSpec {
            qtypes: vec!["A,".into()],
            ..Default::default()
        })
        .is_err());
    }

    #[test]
    fn pod_and_namespace() {
        let f = filter(|s| s.pods = vec!["kube-system/coredns-*".into()]);
        assert!(f.keep(&packet_json(
            "x.",
            "A",
            false,
            "NOERROR",
            Some("kube-system/coredns-5d-x")
        )));
        assert!(!f.keep(&packet_json(
            "x.",
            "A",
            false,
            "NOERROR",
            Some("default/coredns-5d-x")
        )));
        assert!(!f.keep(&packet_json("x.", "A", false, "NOERROR", None)));
        // Without a namespace: any namespace; `*` stays within a part.
        let f = filter(|s| s.pods = vec!["client".into()]);
        assert!(f.keep(&packet_json(
            "x.",
            "A",
            false,
            "NOERROR",
            Some("default/client")
        )));
        let f = filter(|s| s.pods = vec!["*".into()]);
        assert!(f.keep(&packet_json("x.", "A", false, "NOERROR", Some("a/b"))));
        let f = filter(|s| s.namespaces = vec!["kube-system".into()]);
        assert!(f.keep(&packet_json(
            "x.",
            "A",
            false,
            "NOERROR",
            Some("kube-system/coredns")
        )));
        assert!(!f.keep(&packet_json(
            "x.",
            "A",
            false,
            "NOERROR",
            Some("default/kube-system")
        )));
        assert!(Filter::new(&FilterSpec {
            pods: vec!["a/[".into()],
            ..Default::default()
        })
        .is_err());
    }

    #[test]
    fn transaction_matches_when_any_hop_does() {
        let mut t = transaction("answered", "NOERROR", Some(2));
        t.legs[0].hops[1].pod = Some(std::sync::Arc::new(PodRef {
            pod: Some("kube-system/coredns-a".into()),
            ..PodRef::default()
        }));
        let f = filter(|s| s.pods = vec!["kube-system/*".into()]);
        assert!(f.keep(&Record::Transaction(Box::new(t.clone()))));
        let f = filter(|s| s.pods = vec!["default/*".into()]);
        assert!(!f.keep(&Record::Transaction(Box::new(t.clone()))));
        let f = filter(|s| s.names = vec!["*.lab.test".into()]);
        assert!(f.keep(&Record::Transaction(Box::new(t.clone()))));
        // Any leg's rcode.
        t.legs[0].rcode = Some("SERVFAIL".into());
        let f = filter(|s| s.rcodes = vec!["SERVFAIL".into()]);
        assert!(f.keep(&Record::Transaction(Box::new(t))));
    }

    #[test]
    fn failures() {
        let f = filter(|s| s.failures = true);
        assert!(!f.keep(&Record::Transaction(Box::new(transaction(
            "answered",
            "NOERROR",
            Some(2)
        )))));
        assert!(!f.keep(&Record::Transaction(Box::new(transaction(
            "answered",
            "NXDOMAIN",
            Some(2)
        )))));
        assert!(f.keep(&Record::Transaction(Box::new(transaction(
            "answered",
            "SERVFAIL",
            Some(2)
        )))));
        assert!(f.keep(&Record::Transaction(Box::new(transaction(
            "answered",
            "REFUSED",
            Some(2)
        )))));
        assert!(f.keep(&Record::Transaction(Box::new(transaction(
            "unanswered",
            "",
            None
        )))));
        assert!(f.keep(&Record::Transaction(Box::new(transaction(
            "dropped", "", None
        )))));
        let mut t = transaction("answered", "NOERROR", Some(5000));
        t.legs[0].outcome = LegOutcome::Dropped;
        assert!(
            f.keep(&Record::Transaction(Box::new(t))),
            "a dropped leg, answered on retry"
        );
        assert!(f.keep(&packet_json("x.", "A", true, "SERVFAIL", None)));
        assert!(!f.keep(&packet_json("x.", "A", true, "NOERROR", None)));
    }

    #[test]
    fn loops_match_by_question_and_cycle_pods() {
        use crate::detect::loops::{LoopHop, LoopKind, LoopRecord, LoopState, Peer};
        let hop = |pod: Option<&str>| LoopHop {
            from: Peer::Socket(addr("10.244.1.3:1000")),
            server: Some(addr("10.96.0.10:53")),
            backend: Peer::Socket(addr("10.244.1.4:53")),
            at: Some(("node".into(), "veth".into())),
            pod: PodRef {
                pod: pod.map(str::to_string),
                ..Default::default()
            },
        };
        let l = Record::detected(LoopRecord {
            evidence: None,
            id: 1,
            state: LoopState::Detected,
            kind: LoopKind::Cycle,
            ts_ns: 1,
            wall_ns: 1,
            question: QuestionRecord::new("loop.lab.test.", RrType::A, RrClass::IN),
            loop_plugin_probe: false,
            cycle: vec![hop(None), hop(Some("kube-system/coredns-b"))],
            hop_count: 2,
            rate_pps: 1,
            packets: 1,
            summarised: 0,
            clients: Vec::new(),
            first_seen_ns: 1,
            detected_ns: 1,
            last_seen_ns: 1,
        });
        assert!(filter(|s| s.failures = true).keep(&l));
        assert!(filter(|s| s.names = vec!["loop.lab.test".into()]).keep(&l));
        assert!(!filter(|s| s.names = vec!["www.lab.test".into()]).keep(&l));
        assert!(filter(|s| s.namespaces = vec!["kube-system".into()]).keep(&l));
        assert!(!filter(|s| s.pods = vec!["default/*".into()]).keep(&l));
        assert!(!filter(|s| s.rcodes = vec!["SERVFAIL".into()]).keep(&l));
    }

    #[test]
    fn slower_than() {
        let f = filter(|s| s.slower_than_ns = Some(100_000_000));
        assert!(!f.keep(&Record::Transaction(Box::new(transaction(
            "answered",
            "NOERROR",
            Some(2)
        )))));
        assert!(f.keep(&Record::Transaction(Box::new(transaction(
            "answered",
            "NOERROR",
            Some(5000)
        )))));
        assert!(f.keep(&Record::Transaction(Box::new(transaction(
            "unanswered",
            "",
            None
        )))));
        // Packets have no latency.
        assert!(!f.keep(&packet_json("x.", "A", true, "NOERROR", None)));
    }
}
