//! Where a span happened, as its OTLP `Resource`: the pod (Kubernetes semantic conventions,
//! `service.name` its workload), the namespace, the node.
use super::wire::{self, tag};
use crate::output::record::PodRef;

/// The workload a pod belongs to, from its name: a Deployment's pod
/// `coredns-5d78c9869d-x7k2p` is `coredns`, a DaemonSet's `node-local-dns-x7k2p`
/// `node-local-dns`; other names are kept.
fn workload(pod_name: &str) -> &str {
    fn hashy(seg: &str, min: usize, max: usize) -> bool {
        (min..=max).contains(&seg.len())
            && seg
                .bytes()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
    }
    let mut name = pod_name;
    if let Some((rest, last)) = name.rsplit_once('-') {
        if hashy(last, 5, 5) && !rest.is_empty() {
            name = rest;
            if let Some((rest2, rs)) = name.rsplit_once('-') {
                if hashy(rs, 6, 10) && rs.bytes().any(|c| c.is_ascii_digit()) && !rest2.is_empty() {
                    name = rest2;
                }
            }
        }
    }
    name
}

/// Where a span happened, as a `Resource` body in `out`: the pod (if the node knows it), its
/// namespace and the node.
pub(super) fn resource(out: &mut Vec<u8>, pod: &PodRef, netns: &str, node: Option<&str>) {
    const T: u32 = tag::RESOURCE_ATTRIBUTES;
    out.clear();
    match pod.pod.as_deref().and_then(|p| p.split_once('/')) {
        Some((ns, name)) => {
            wire::kv_str(out, T, "service.name", workload(name));
            wire::kv_str(out, T, "k8s.namespace.name", ns);
            wire::kv_str(out, T, "k8s.pod.name", name);
        }
        None => wire::kv_str(out, T, "service.name", netns),
    }
    if let Some(uid) = &pod.pod_uid {
        wire::kv_str(out, T, "k8s.pod.uid", uid);
    }
    if let Some(c) = &pod.container {
        wire::kv_str(out, T, "k8s.container.name", c);
    }
    if let Some(c) = &pod.container_id {
        wire::kv_str(out, T, "container.id", c);
    }
    if let Some(n) = node {
        wire::kv_str(out, T, "k8s.node.name", n);
    }
    wire::kv_str(out, T, "dnspath.netns", netns);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workloads_from_pod_names() {
        assert_eq!(workload("coredns-5d78c9869d-x7k2p"), "coredns");
        assert_eq!(workload("node-local-dns-x7k2p"), "node-local-dns");
        assert_eq!(workload("client"), "client");
        assert_eq!(workload("web-0"), "web-0");
    }
}
