//! Per-CPU conntrack statistics of the calling thread's current network namespace.
use std::io;

use super::{
    boottime_ns,
    message::{stats_dump_request, CtMessage},
    procfs::{parse_cpu_list, parse_proc_stat},
    socket::CtSocket,
    ConntrackError,
};
use crate::event::{CtCpuStats, CtStatsSample};

/// `/proc/thread-self`, not `/proc/self` (`/proc/net` is a link to the latter): `self`
/// shows the main thread's namespace, and callers read this from threads moved elsewhere.
const PROC_STAT: &str = "/proc/thread-self/net/stat/nf_conntrack";
const POSSIBLE_CPUS: &str = "/sys/devices/system/cpu/possible";

/// One entry per possible CPU, sorted by CPU: from ctnetlink, or from procfs when ctnetlink
/// fails. [`ConntrackError::Unavailable`] when neither has conntrack.
pub fn read_stats() -> Result<Vec<CtCpuStats>, ConntrackError> {
    let netlink_err = match read_stats_netlink() {
        Ok(v) if !v.is_empty() => return Ok(v),
        Ok(_) => ConntrackError::Malformed("IPCTNL_MSG_CT_GET_STATS_CPU: no CPUs".into()),
        Err(e) => e,
    };
    match read_stats_procfs() {
        Ok(v) if !v.is_empty() => {
            log::debug!("conntrack statistics from {PROC_STAT}: ctnetlink failed: {netlink_err}");
            Ok(v)
        }
        Ok(_) => Err(netlink_err),
        Err(proc_err) => Err(match (netlink_err, proc_err) {
            (ConntrackError::Unavailable(a), ConntrackError::Unavailable(b)) => {
                ConntrackError::Unavailable(format!("{a}; {b}"))
            }
            (netlink_err, _) => netlink_err,
        }),
    }
}

/// IPCTNL_MSG_CT_GET_STATS_CPU (Linux 3.19): one reply per possible CPU, the CPU number in
/// the nfgenmsg `res_id`.
pub fn read_stats_netlink() -> Result<Vec<CtCpuStats>, ConntrackError> {
    read_stats_on(&mut CtSocket::open()?)
}

/// [`read_stats_netlink`] over `sock`, which stays in the namespace it was opened in.
fn read_stats_on(sock: &mut CtSocket) -> Result<Vec<CtCpuStats>, ConntrackError> {
    let mut out = Vec::new();
    let malformed = sock.dump("IPCTNL_MSG_CT_GET_STATS_CPU", stats_dump_request, |m| {
        if let CtMessage::Stats(s) = m {
            out.push(s);
        }
    })?;
    if malformed > 0 {
        return Err(ConntrackError::Malformed(format!(
            "IPCTNL_MSG_CT_GET_STATS_CPU: {malformed} replies did not parse"
        )));
    }
    out.sort_by_key(|s| s.cpu);
    Ok(out)
}

/// `/proc/net/stat/nf_conntrack` of the calling thread's namespace (CONFIG_NF_CONNTRACK_PROCFS).
pub fn read_stats_procfs() -> Result<Vec<CtCpuStats>, ConntrackError> {
    let text = std::fs::read_to_string(PROC_STAT).map_err(procfs_error)?;
    parse_procfs(&text)
}

fn procfs_error(e: io::Error) -> ConntrackError {
    match e.kind() {
        io::ErrorKind::NotFound => ConntrackError::Unavailable(format!(
            "no {PROC_STAT} (nf_conntrack not loaded, or CONFIG_NF_CONNTRACK_PROCFS off)"
        )),
        _ => ConntrackError::Procfs {
            path: PROC_STAT.into(),
            detail: e.to_string(),
        },
    }
}

fn parse_procfs(text: &str) -> Result<Vec<CtCpuStats>, ConntrackError> {
    let possible = std::fs::read_to_string(POSSIBLE_CPUS)
        .ok()
        .and_then(|t| parse_cpu_list(&t));
    let mut v = parse_proc_stat(text, possible.as_deref()).map_err(|e| match e {
        ConntrackError::Procfs { detail, .. } => ConntrackError::Procfs {
            path: PROC_STAT.into(),
            detail,
        },
        e => e,
    })?;
    v.sort_by_key(|s| s.cpu);
    Ok(v)
}

/// [`read_stats`] with the time and the namespace's cookie, as the pipeline takes it.
pub fn sample_stats(netns: u64) -> Result<CtStatsSample, ConntrackError> {
    let per_cpu = read_stats()?;
    Ok(CtStatsSample {
        ts_ns: boottime_ns(),
        netns,
        per_cpu,
    })
}

/// Where a watched namespace's statistics are read from, by a thread that may be in
/// another namespace: ctnetlink over the watcher's dump socket, or the procfs file opened
/// in the namespace (a `/proc/thread-self/net` file stays bound to the namespace of its
/// opener).
pub(crate) enum StatsSource {
    Netlink,
    Procfs(std::fs::File),
}

impl StatsSource {
    /// Picks the source in the calling thread's current namespace, as [`read_stats`] does:
    /// ctnetlink over `sock` (a socket of this namespace), else procfs.
    pub(crate) fn open(sock: &mut CtSocket) -> Result<Self, ConntrackError> {
        let netlink_err = match read_stats_on(sock) {
            Ok(v) if !v.is_empty() => return Ok(Self::Netlink),
            Ok(_) => ConntrackError::Malformed("IPCTNL_MSG_CT_GET_STATS_CPU: no CPUs".into()),
            Err(e) => e,
        };
        let mut source = match std::fs::File::open(PROC_STAT) {
            Ok(f) => Self::Procfs(f),
            Err(_) => return Err(netlink_err),
        };
        match source.read(sock) {
            Ok(v) if !v.is_empty() => {
                log::debug!(
                    "conntrack statistics from {PROC_STAT}: ctnetlink failed: {netlink_err}"
                );
                Ok(source)
            }
            _ => Err(netlink_err),
        }
    }

    /// The per-CPU statistics now, sorted by CPU; `sock` is the namespace's dump socket.
    pub(crate) fn read(&mut self, sock: &mut CtSocket) -> Result<Vec<CtCpuStats>, ConntrackError> {
        match self {
            Self::Netlink => read_stats_on(sock),
            Self::Procfs(f) => {
                use std::io::{Read, Seek, SeekFrom};
                let mut text = String::new();
                f.seek(SeekFrom::Start(0))
                    .and_then(|_| f.read_to_string(&mut text))
                    .map_err(procfs_error)?;
                parse_procfs(&text)
            }
        }
    }

    /// [`StatsSource::read`] with the time and the namespace's cookie.
    pub(crate) fn sample(
        &mut self,
        sock: &mut CtSocket,
        netns: u64,
    ) -> Result<CtStatsSample, ConntrackError> {
        let per_cpu = self.read(sock)?;
        Ok(CtStatsSample {
            ts_ns: boottime_ns(),
            netns,
            per_cpu,
        })
    }
}
