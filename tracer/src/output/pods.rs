//! Names each record's pod from the namespace → pod map the attacher keeps (a map lookup per
//! place in the record).
use crate::{names::Names, output::record::Record};

/// Fills in the pod fields of `r` where `names` knows the pod (each kind knows its places:
/// [`annotate_pods`](crate::output::record::RecordKind::annotate_pods)); a transaction's
/// hops only when `hops` (some sink reads them: [`Wants::hop_pods`]).
///
/// [`Wants::hop_pods`]: crate::output::sink::Wants::hop_pods
pub fn annotate(r: &mut Record, names: &Names, hops: bool) {
    match r {
        Record::Transaction(t) if !hops => t.annotate_pods_but_hops(names),
        _ => r.kind_mut().annotate_pods(names),
    }
}

#[cfg(test)]
mod tests {
    use std::{collections::HashMap, sync::Arc};

    use super::*;
    use crate::kube::Pod;

    #[test]
    fn records_get_the_pod_of_their_namespace_or_veth() {
        let mut names = Names::default();
        names.learn(7, "pid42:pause", 2, "eth0");
        names.learn(1, "host", 5, "veth-a");
        let pod = Arc::new(Pod {
            uid: "u-1".into(),
            label: Some("kube-system/coredns-1".into()),
            container: Some("coredns".into()),
            container_id: None,
        });
        names.set_pods(
            HashMap::from([(7, Arc::clone(&pod))]),
            HashMap::from([((1, "veth-a".to_string()), Arc::clone(&pod))]),
        );
        assert_eq!(
            names
                .pod_at("pid42:pause", "eth0")
                .map(|(p, v)| (p.uid.as_str(), v)),
            Some(("u-1", false))
        );
        assert_eq!(names.pod_at("pid42:pause", "").map(|(_, v)| v), Some(false));
        assert_eq!(names.pod_at("host", "veth-a").map(|(_, v)| v), Some(true));
        assert!(names.pod_at("host", "eth0").is_none());
        assert!(names.pod_at("host", "").is_none());
        assert!(names.pod_at("unknown", "veth-a").is_none());
        let r = names.pod_of("host", "veth-a");
        assert_eq!(r.pod.as_deref(), Some("kube-system/coredns-1"));
        assert_eq!(r.container.as_deref(), Some("coredns"));
        assert!(r.pod_veth);
    }

    /// A transaction's hops and drop share the names' pod (a reference count, not four
    /// strings copied a hop); a client seen only at its pod's veth is that pod, not a veth.
    #[test]
    fn transaction_hops_share_the_pod_of_their_place() {
        use crate::{correlate::LegRole, event::Direction, test_support::fixtures};
        let mut names = Names::default();
        names.learn(1, "host", 5, "veth-a");
        let pod = Arc::new(Pod {
            uid: "u-1".into(),
            label: Some("default/client-1".into()),
            container: None,
            container_id: None,
        });
        names.set_pods(
            HashMap::new(),
            HashMap::from([((1, "veth-a".to_string()), pod)]),
        );
        let mut leg = fixtures::leg(
            LegRole::Query,
            "10.244.1.2:40000",
            "10.96.0.10:53",
            "10.244.1.3:53",
            Some("NOERROR"),
            Some(1_000),
        );
        let at = |netns: &str, ifname: &str, qr| {
            let mut h = fixtures::hop(
                1,
                netns,
                Direction::Ingress,
                "10.244.1.2:40000",
                "10.96.0.10:53",
                qr,
                None,
            );
            h.ifname = ifname.into();
            h
        };
        leg.hops = vec![at("host", "veth-a", false), at("host", "eth0", false)];
        leg.drop = Some(crate::output::record::LegDrop {
            ts_ns: 2,
            netns: "host".into(),
            ifname: "veth-a".into(),
            pod: None,
            reason: "NETFILTER_DROP".into(),
            location: "nf_hook_slow".into(),
            response: true,
            fragments: None,
            fragment_drops_ns: Vec::new(),
        });
        let record = Record::Transaction(Box::new(fixtures::transaction(
            "www.lab.test.",
            "A",
            "10.244.1.2:40000",
            Some("NOERROR"),
            vec![leg],
        )));
        // No sink reads the hops' pods: the client's and the drop's are named all the same.
        let mut r = record.clone();
        annotate(&mut r, &names, false);
        let Record::Transaction(t) = r else {
            unreachable!()
        };
        assert!(t.legs[0].hops.iter().all(|h| h.pod.is_none()));
        let drop = t.legs[0].drop.as_ref().unwrap();
        assert!(Arc::ptr_eq(
            drop.pod.as_ref().unwrap(),
            names.pod_ref_at("host", "veth-a").unwrap()
        ));
        assert_eq!(t.pod.pod.as_deref(), Some("default/client-1"));
        assert!(!t.pod.pod_veth);

        let mut r = record;
        annotate(&mut r, &names, true);
        let Record::Transaction(t) = r else {
            unreachable!()
        };
        let shared = names.pod_ref_at("host", "veth-a").unwrap();
        let hops = &t.legs[0].hops;
        assert!(Arc::ptr_eq(hops[0].pod.as_ref().unwrap(), shared));
        assert!(hops[0].pod_ref().pod_veth);
        assert!(hops[1].pod.is_none(), "the node's eth0 is no pod's");
        let drop = t.legs[0].drop.as_ref().unwrap();
        assert!(Arc::ptr_eq(drop.pod.as_ref().unwrap(), shared));
        assert_eq!(t.pod.pod.as_deref(), Some("default/client-1"));
        assert!(!t.pod.pod_veth);
    }
}
