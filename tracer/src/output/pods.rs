//! Names each record's pod from the namespace → pod map the rescans keep (a map lookup per
//! place in the record).
use crate::{
    kube::Pod,
    names::Names,
    output::record::{PodRef, Record},
};

fn pod_ref(found: Option<(&std::sync::Arc<Pod>, bool)>) -> PodRef {
    match found {
        Some((p, veth)) => PodRef::of(p, veth),
        None => PodRef::default(),
    }
}

/// Fills in the pod fields of `r` where `names` knows the pod.
pub fn annotate(r: &mut Record, names: &Names) {
    match r {
        // Per packet: a shared pod, not a copy of its names.
        Record::Packet(p) => p.pod = names.pod_ref_at(&p.netns, &p.ifname).cloned(),
        Record::Drop(d) => d.pod = names.pod_ref_at(&d.netns, &d.ifname).cloned(),
        Record::FragmentLoss(f) => f.pod = names.pod_ref_at(&f.netns, &f.ifname).cloned(),
        Record::Transaction(t) => {
            for leg in &mut t.legs {
                for h in &mut leg.hops {
                    h.pod = pod_ref(names.pod_at(&h.netns, &h.ifname));
                }
                if let Some(d) = &mut leg.drop {
                    d.pod = pod_ref(names.pod_at(&d.netns, &d.ifname));
                }
            }
            t.pod = pod_ref(names.pod_at(&t.client_netns, ""));
            // Traced from the node side only: the client's pod is that of the veth its
            // query was first seen on.
            if !t.pod.is_known() {
                if let Some(h) = t.legs.first().and_then(|l| l.hops.first()) {
                    t.pod = PodRef {
                        pod_veth: false,
                        ..h.pod.clone()
                    };
                }
            }
        }
        Record::Race(race) => race.pod = pod_ref(names.pod_at(&race.client_netns, "")),
        Record::Loop(l) => {
            for h in &mut l.cycle {
                if let Some((ns, ifname)) = &h.at {
                    h.pod = pod_ref(names.pod_at(ns, ifname));
                }
            }
        }
        Record::Stats(_) => {}
    }
}

#[cfg(test)]
mod tests {
    use std::{collections::HashMap, sync::Arc};

    use super::*;

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
        let r = pod_ref(names.pod_at("host", "veth-a"));
        assert_eq!(r.pod.as_deref(), Some("kube-system/coredns-1"));
        assert_eq!(r.container.as_deref(), Some("coredns"));
        assert!(r.pod_veth);
    }
}
