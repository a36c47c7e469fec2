//! Kubernetes pods of a node, from what the node itself has (no API server): the processes of
//! each network namespace, their cgroups ([`cgroup`]), and kubelet's log directories
//! ([`logs`]). [`resolver::PodResolver`] maps namespaces to pods whenever the attacher sees
//! namespaces change; packets only look the result up.
pub(crate) mod cgroup;
pub(crate) mod logs;
pub(crate) mod resolver;

/// A pod as far as it is known on the node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pod {
    pub uid: String,
    /// `namespace/name`, when kubelet's log directory for the UID was found.
    pub label: Option<String>,
    /// Where the pod's namespace holds one container (besides the sandbox's pause process):
    /// its name and id.
    pub container: Option<String>,
    pub container_id: Option<String>,
}
