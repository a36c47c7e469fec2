//! docs/doctor.md documents every JSON field of a finding: each key a filled-in finding
//! serialises to must be named there, and every finding kind and severity too.
use serde_json::Value;

use super::{
    finding::{ConfigLine, Finding, FindingKind},
    watch::TRAFFIC_KINDS,
};

const DOC: &str = include_str!("../../../docs/doctor.md");

/// The kinds found in the node's files and counters. With the traffic's ([`TRAFFIC_KINDS`]):
/// every kind, each listed once.
const NODE_KINDS: [FindingKind; 15] = [
    FindingKind::StaticForwardingLoop,
    FindingKind::ResolvConf,
    FindingKind::NodeResolverToClusterDns,
    FindingKind::ConfigUnreadable,
    FindingKind::LoopPluginExit,
    FindingKind::ServiceWithoutEndpoints,
    FindingKind::Port53BindFailure,
    FindingKind::ConfigParseError,
    FindingKind::ConntrackInsertFailed,
    FindingKind::ConntrackTableFill,
    FindingKind::OomKilled,
    FindingKind::CpuThrottled,
    FindingKind::KubeletClusterDns,
    FindingKind::KubeletResolvConfLoopback,
    FindingKind::NodeCacheNotrackMissing,
];

/// Every kind of finding.
pub(super) fn kinds() -> impl Iterator<Item = FindingKind> {
    TRAFFIC_KINDS.into_iter().chain(NODE_KINDS)
}

fn documented(key: &str) -> bool {
    DOC.contains(&format!("`{key}`"))
        || DOC.lines().filter(|l| l.contains('{')).any(|l| {
            l.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .any(|w| w == key)
        })
}

#[test]
fn every_finding_field_kind_and_severity_is_documented() {
    for kind in kinds() {
        let mut f = Finding::new(kind, "s", "seen");
        f.config = Some(ConfigLine {
            file: "f".into(),
            line: 1,
            text: "t".into(),
        });
        f.evidence = vec!["e".into()];
        let v = serde_json::to_value(&f).unwrap();
        let Value::Object(m) = &v else { panic!("{v}") };
        for (k, val) in m {
            assert!(documented(k), "finding field `{k}` not in docs/doctor.md");
            if let Value::Object(inner) = val {
                for k in inner.keys() {
                    assert!(documented(k), "field `{k}` not in docs/doctor.md");
                }
            }
        }
        let name = v["kind"].as_str().unwrap();
        let sev = v["severity"].as_str().unwrap();
        assert!(
            DOC.contains(&format!("| `{name}` | {sev} |")),
            "kind `{name}` with severity {sev} not in docs/doctor.md's table"
        );
    }
}

#[test]
fn no_kind_is_listed_twice() {
    let all: std::collections::BTreeSet<FindingKind> = kinds().collect();
    assert_eq!(all.len(), kinds().count());
}
