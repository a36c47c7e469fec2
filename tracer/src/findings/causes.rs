//! One cause, one finding: a forwarder that fails a query because every query it forwarded
//! for it failed too (its child legs in the transaction: unanswered or SERVFAIL) shows a
//! symptom, and the server at the bottom of that chain of joined legs is the cause. Whatever
//! the chain (a CoreDNS forwarding upstream, a node cache asking cluster DNS asking
//! upstream), the failure is the cause's; the per-server findings ([`super::traffic`]) report
//! the cause with its symptoms folded under it. A forwarder failing with an upstream that
//! answered it, or asking none, fails on its own: that stays its own finding.
use std::{collections::BTreeMap, net::SocketAddr};

use super::servers::Failure;
use crate::correlate::record::TransactionRecord;

/// A server's failures that another server's caused: (how this server failed, the cause's
/// server, how the cause failed) → queries.
pub type CausedBy = BTreeMap<(Failure, SocketAddr, Failure), u64>;

/// Most causes kept per server (distinct upstreams and ways of failing); a failure whose
/// cause would be one more is counted as the server's own.
pub const MAX_CAUSES: usize = 16;

/// For each leg of `t`, the leg whose failure causes its own, if any: a failed leg all of
/// whose child legs failed is explained by its first child's cause (or that child, when it
/// failed on its own). `None` for legs that did not fail, failed on their own, and for every
/// leg of a transaction that closed a forwarding loop (the loop is the cause: its finding).
pub fn root_causes(t: &TransactionRecord) -> Vec<Option<usize>> {
    let n = t.legs.len();
    let mut out = vec![None; n];
    if t.first_loop().is_some() {
        return out;
    }
    let failed: Vec<bool> = t
        .legs
        .iter()
        .map(|l| Failure::of_leg(l).is_some())
        .collect();
    let mut children: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (i, l) in t.legs.iter().enumerate() {
        if let Some(p) = l.parent.filter(|&p| p < n && p != i) {
            children[p].push(i);
        }
    }
    // A failed leg is explained by its first child when every child failed.
    let explained_by = |i: usize| -> Option<usize> {
        let c = &children[i];
        let all_failed = failed[i] && !c.is_empty() && c.iter().all(|&k| failed[k]);
        all_failed.then(|| c[0])
    };
    for (i, cause) in out.iter_mut().enumerate() {
        let mut at = i;
        // Down the chain: at most every leg once (a malformed tree cannot loop here).
        for _ in 0..n {
            match explained_by(at) {
                Some(next) => at = next,
                None => break,
            }
        }
        if at != i {
            *cause = Some(at);
        }
    }
    out
}

/// How `server` failed `n` queries in words, for a symptom: `10.96.0.10:53 left 5 of its 5
/// queries unanswered`.
pub fn symptom_words(server: &SocketAddr, how: Failure, n: u64, queries: u64) -> String {
    match how {
        Failure::Unanswered => format!("{server} left {n} of its {queries} queries unanswered"),
        Failure::Servfail => format!("{server} answered SERVFAIL to {n} of its {queries} queries"),
    }
}

/// How the cause failed a query, for a symptom's evidence.
pub fn failed_words(how: Failure) -> &'static str {
    match how {
        Failure::Unanswered => "it went unanswered",
        Failure::Servfail => "it was answered SERVFAIL",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        correlate::{record::LegOutcome, LegRole},
        test_support::fixtures,
    };

    /// A transaction of `legs`: `(parent, server, outcome, rcode)`.
    fn tree(legs: &[(Option<usize>, &str, LegOutcome, Option<&str>)]) -> TransactionRecord {
        let legs = legs
            .iter()
            .map(|&(parent, server, outcome, rcode)| {
                let role = if parent.is_some() {
                    LegRole::Forward
                } else {
                    LegRole::Query
                };
                let mut l = fixtures::leg(role, "10.244.1.2:1000", server, server, rcode, None);
                l.parent = parent;
                l.outcome = outcome;
                l
            })
            .collect();
        fixtures::transaction("q.test.", "A", "10.244.1.2:1000", None, legs)
    }

    const SVC: &str = "10.96.0.10:53";
    const CACHE: &str = "169.254.20.10:53";
    const UP: &str = "10.250.0.54:53";
    const UP2: &str = "10.250.0.55:53";
    use LegOutcome::{Answered, Unanswered};

    #[test]
    fn a_forwarders_failure_is_its_failed_upstreams() {
        // The client's query unanswered because CoreDNS's forward was.
        let t = tree(&[
            (None, SVC, Unanswered, None),
            (Some(0), UP, Unanswered, None),
        ]);
        assert_eq!(root_causes(&t), [Some(1), None]);
        // SERVFAIL because the upstream never answered (CoreDNS's forward plugin).
        let t = tree(&[
            (None, SVC, Answered, Some("SERVFAIL")),
            (Some(0), UP, Unanswered, None),
        ]);
        assert_eq!(root_causes(&t), [Some(1), None]);
        // Node cache → cluster DNS → upstream: both in front fail for the last.
        let t = tree(&[
            (None, CACHE, Unanswered, None),
            (Some(0), SVC, Unanswered, None),
            (Some(1), UP, Unanswered, None),
        ]);
        assert_eq!(root_causes(&t), [Some(2), Some(2), None]);
        // Two upstreams tried, both silent: the first one asked.
        let t = tree(&[
            (None, SVC, Unanswered, None),
            (Some(0), UP, Unanswered, None),
            (Some(0), UP2, Unanswered, None),
        ]);
        assert_eq!(root_causes(&t), [Some(1), None, None]);
    }

    #[test]
    fn a_forwarder_failing_on_its_own_is_its_own_cause() {
        // Its upstream answered: the forwarder's own failure.
        let t = tree(&[
            (None, SVC, Unanswered, None),
            (Some(0), UP, Answered, Some("NOERROR")),
        ]);
        assert_eq!(root_causes(&t), [None, None]);
        // One upstream silent, the other answered: still its own.
        let t = tree(&[
            (None, SVC, Answered, Some("SERVFAIL")),
            (Some(0), UP, Unanswered, None),
            (Some(0), UP2, Answered, Some("NOERROR")),
        ]);
        assert_eq!(root_causes(&t), [None, None, None]);
        // It asked no one.
        let t = tree(&[(None, SVC, Unanswered, None)]);
        assert_eq!(root_causes(&t), [None]);
        // Answered: nothing to explain, whatever its upstream did.
        let t = tree(&[
            (None, SVC, Answered, Some("NOERROR")),
            (Some(0), UP, Unanswered, None),
        ]);
        assert_eq!(root_causes(&t), [None, None]);
        // A chain broken in the middle: the cache fails because cluster DNS failed on its
        // own (its upstream answered).
        let t = tree(&[
            (None, CACHE, Unanswered, None),
            (Some(0), SVC, Unanswered, None),
            (Some(1), UP, Answered, Some("NOERROR")),
        ]);
        assert_eq!(root_causes(&t), [Some(1), None, None]);
    }

    #[test]
    fn a_loop_is_its_own_cause() {
        let mut t = tree(&[
            (None, SVC, Unanswered, None),
            (Some(0), SVC, Unanswered, None),
        ]);
        t.legs[1].closes_loop = Some(Box::new(crate::correlate::record::LegLoop {
            cycle: vec![0, 1],
            hop_count: 1,
        }));
        assert_eq!(root_causes(&t), [None, None]);
    }
}
