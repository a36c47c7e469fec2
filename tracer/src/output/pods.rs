//! Names each record's pod from the namespace → pod map the rescans keep (a map lookup per
//! place in the record).
use crate::{names::Names, output::record::Record};

/// Fills in the pod fields of `r` where `names` knows the pod (each kind knows its places:
/// [`annotate_pods`](crate::output::record::RecordKind::annotate_pods)).
pub fn annotate(r: &mut Record, names: &Names) {
    r.kind_mut().annotate_pods(names);
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
}
