//! Conntrack reader for the correlate stage: entries of DNS flows (which ClusterIP a packet
//! was for, which backend DNAT chose) and per-CPU conntrack statistics, per network
//! namespace, over ctnetlink (`NETLINK_NETFILTER`, subsystem `NFNL_SUBSYS_CTNETLINK`).
//!
//! Messages are built and parsed with `netlink-packet-netfilter` (rust-netlink, on the same
//! `netlink-packet-core` 0.9 as `netlink-packet-route`): it models IPCTNL_MSG_CT_NEW/GET/DELETE
//! with the tuple, status, protoinfo, timeout and mark attributes. What it does not model is
//! taken from its generic `DefaultNla`s: `CTA_ZONE`, and IPCTNL_MSG_CT_GET_STATS_CPU (which it
//! parses as `ConntrackMessage::Other` with the `CTA_STATS_*` attributes as `DefaultNla`s).
//!
//! Sockets and procfs files work on the namespace of the thread that opened them (`setns(2)`
//! is per thread); [`ConntrackWatchers`] opens each namespace's sockets inside it and then
//! follows every namespace from one thread.
//!
//! Kernel references: `net/netfilter/nf_conntrack_netlink.c` (ctnetlink_conntrack_event,
//! ctnetlink_dump_table, ctnetlink_ct_stat_cpu_dump), `include/uapi/linux/netfilter/
//! nfnetlink_conntrack.h` (attributes), `net/netfilter/nf_conntrack_standalone.c`
//! (ct_cpu_seq_show, the /proc/net/stat/nf_conntrack format).
mod filter;
mod message;
mod procfs;
mod socket;
mod stats;
mod watch;
mod watchers;

pub use message::{decode_datagram, CtEntry, CtMessage};
pub use procfs::{parse_cpu_list, parse_proc_stat};
pub use stats::{read_stats, read_stats_netlink, read_stats_procfs, sample_stats};
pub use watch::{
    ConntrackStats, ConntrackWatcher, PortFilter, WatchCounters, WatchOptions, WatchSummary,
    MAX_DUMP_ENTRIES, MAX_NAMESPACES, QUEUE_EVENTS,
};
pub use watchers::{Added, ConntrackWatchers, CtNamespaces};

use crate::kernel::KernelError;

/// Why conntrack could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ConntrackError {
    /// No conntrack in this namespace or kernel (nf_conntrack / nf_conntrack_netlink missing,
    /// or procfs statistics turned off and ctnetlink unavailable). Callers warn and go on
    /// without conntrack data.
    #[error("conntrack is not available here: {0}")]
    Unavailable(String),
    #[error("permission denied: ctnetlink needs CAP_NET_ADMIN: {0}")]
    Permission(String),
    #[error("netlink socket: {op}: {source}")]
    Socket {
        op: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// NLMSG_ERROR in answer to a request; `errno` is positive.
    #[error("ctnetlink {request}: {}", std::io::Error::from_raw_os_error(*errno))]
    Kernel { request: &'static str, errno: i32 },
    /// A reply or event that does not parse: the kernel's bytes or ours are wrong.
    #[error("malformed ctnetlink message: {0}")]
    Malformed(String),
    #[error("{path}: {detail}")]
    Procfs { path: String, detail: String },
    #[error("{0}")]
    Netns(#[from] KernelError),
    #[error("starting the conntrack watch thread: {0}")]
    Thread(std::io::Error),
}

pub(crate) use crate::time::boottime_ns;

bitflags::bitflags! {
    /// `enum ip_conntrack_status` (include/uapi/linux/netfilter/nf_conntrack_common.h), as
    /// ctnetlink's CTA_STATUS and the kernel's `nf_conn.status` carry it.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct CtStatus: u64 {
        const EXPECTED = 1 << 0;
        const SEEN_REPLY = 1 << 1;
        const ASSURED = 1 << 2;
        const CONFIRMED = 1 << 3;
        const SRC_NAT = 1 << 4;
        const DST_NAT = 1 << 5;
        const SEQ_ADJUST = 1 << 6;
        const SRC_NAT_DONE = 1 << 7;
        const DST_NAT_DONE = 1 << 8;
        const DYING = 1 << 9;
        const FIXED_TIMEOUT = 1 << 10;
        const TEMPLATE = 1 << 11;
        const NAT_CLASH = 1 << 12;
        const HELPER = 1 << 13;
        const OFFLOAD = 1 << 14;
        const HW_OFFLOAD = 1 << 15;
    }
}

impl CtStatus {
    /// The kernel's names of the bits set (unknown bits left out).
    pub fn names(self) -> Vec<&'static str> {
        self.iter_names().map(|(name, _)| name).collect()
    }
}
