//! What can go wrong loading and attaching the programs, said so that a person can act on
//! it: which capability is missing, which program the verifier refused and why.
use std::path::PathBuf;

use super::kernel_release;

#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error("permission denied: {caps}: {0}", caps = missing_capabilities())]
    Permission(String),
    #[error("kernel has no BTF ({0} missing): drop tracing (tp_btf/skb:kfree_skb) needs CONFIG_DEBUG_INFO_BTF; run with --no-drops to trace without it")]
    NoBtf(String),
    #[error("kernel BTF: {0}")]
    Btf(String),
    /// The embedded eBPF object lacks a program or map this userspace expects: a build
    /// that mixed versions.
    #[error("the embedded eBPF object has no {0}: rebuild dnspath (tracer/build.rs)")]
    Object(String),
    /// A thread panicked holding a lock of the probes (a bug, reported instead of a crash).
    #[error("internal: {0} lock poisoned by a panicked thread")]
    Poisoned(&'static str),
    #[error("kernel lacks a needed hook: {hook}: {detail}")]
    MissingHook { hook: &'static str, detail: String },
    /// The verifier refused a program: one line a person can act on; the whole log is in
    /// the file named (or on stderr with `-v`).
    #[error("Linux {release} rejected eBPF program {program}: {last}{}", match log { Some(p) => format!(" (full verifier log: {})", p.display()), None => String::new() })]
    Rejected {
        program: &'static str,
        release: String,
        last: String,
        log: Option<PathBuf>,
    },
    #[error("attached to no interface: {0}")]
    NothingAttached(String),
    #[error("no such interface: {0}")]
    NoSuchInterface(String),
    #[error("network namespace: {0}")]
    Netns(String),
    /// Entering a network namespace was refused (EPERM/EACCES from `open` or `setns(2)`
    /// of its file): a capability is missing, not the namespace.
    #[error("{op} {}: {errno}: entering another network namespace needs CAP_SYS_ADMIN", path.display())]
    NetnsPermission {
        op: &'static str,
        path: PathBuf,
        errno: nix::errno::Errno,
    },
    #[error("netlink: {0}")]
    Netlink(String),
    #[error("eBPF: {0}")]
    Ebpf(#[from] aya::EbpfError),
    #[error("eBPF program: {0}")]
    Program(#[from] aya::programs::ProgramError),
    #[error("eBPF map: {0}")]
    Map(#[from] aya::maps::MapError),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// Capabilities loading and attaching needs, with their bit in `CapEff`
/// (include/uapi/linux/capability.h).
const NEEDED_CAPABILITIES: [(&str, u32); 4] = [
    ("CAP_BPF", 39),
    ("CAP_NET_ADMIN", 12),
    ("CAP_PERFMON", 38),
    ("CAP_SYS_ADMIN", 21),
];

/// What a permission error says: which of [`NEEDED_CAPABILITIES`] this process lacks
/// (a container given all but one should be told which), else (none or all of them
/// lacking) that it needs root.
fn missing_capabilities() -> String {
    let all = NEEDED_CAPABILITIES.map(|(name, _)| name).join(", ");
    let effective = effective_capabilities();
    let missing: Vec<&str> = match effective {
        Some(eff) => NEEDED_CAPABILITIES
            .iter()
            .filter(|(_, bit)| eff & (1u64 << bit) == 0)
            .map(|(name, _)| *name)
            .collect(),
        None => Vec::new(),
    };
    // Lacking them all is not running as root at all.
    if missing.is_empty() || missing.len() == NEEDED_CAPABILITIES.len() {
        format!("dnspath needs root ({all})")
    } else {
        format!("dnspath lacks {} (it needs {all})", missing.join(", "))
    }
}

/// This process's effective capability set (`CapEff` of /proc/self/status).
pub(crate) fn effective_capabilities() -> Option<u64> {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
}

/// `CAP_SYS_PTRACE`'s bit (include/uapi/linux/capability.h).
pub(crate) const CAP_SYS_PTRACE: u32 = 19;

pub(super) fn is_eperm(e: &(dyn std::error::Error + 'static)) -> bool {
    if let Some(KernelError::Rejected { .. }) = e.downcast_ref::<KernelError>() {
        return false;
    }
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        let errno = err
            .downcast_ref::<std::io::Error>()
            .and_then(std::io::Error::raw_os_error)
            // Transparent over its io::Error, which the source chain therefore never shows.
            .or_else(|| {
                err.downcast_ref::<aya::sys::NetlinkError>()
                    .and_then(aya::sys::NetlinkError::raw_os_error)
            })
            .or_else(|| err.downcast_ref::<nix::errno::Errno>().map(|e| *e as i32));
        if matches!(errno, Some(libc::EPERM | libc::EACCES)) {
            return true;
        }
        cur = err.source();
    }
    false
}

/// The line of a verifier log that says why: the last one before the statistics lines
/// (`processed N insns …`, `verification time …`, `stack depth …`).
pub(super) fn verifier_reason(log: &str) -> String {
    log.lines()
        .map(str::trim)
        .rfind(|l| {
            !l.is_empty()
                && !l.starts_with("processed ")
                && !l.starts_with("verification time")
                && !l.starts_with("stack depth")
                && !l.starts_with("-- END PROG LOAD LOG --")
        })
        .unwrap_or("(empty verifier log)")
        .to_string()
}

/// Where a rejected program's full verifier log goes.
fn verifier_log_path(program: &str) -> PathBuf {
    std::env::temp_dir().join(format!("dnspath-verifier-{program}.log"))
}

/// Turns a failed `load` of `program` into an error a person can act on: a verifier
/// rejection becomes one line naming the program, the kernel and the verifier's last
/// message, with the log written to a file (and to stderr at debug level); missing
/// permissions stay a permission error.
pub(super) fn load_error(program: &'static str, e: aya::programs::ProgramError) -> KernelError {
    if let aya::programs::ProgramError::LoadError {
        io_error,
        verifier_log,
    } = &e
    {
        let text = verifier_log.to_string();
        if text.trim().is_empty() {
            if matches!(io_error.raw_os_error(), Some(libc::EPERM)) {
                return KernelError::Permission(format!("loading {program}: {io_error}"));
            }
            return KernelError::Rejected {
                program,
                release: kernel_release(),
                last: io_error.to_string(),
                log: None,
            };
        }
        log::debug!("verifier log of {program}:\n{text}");
        let path = verifier_log_path(program);
        let log = std::fs::write(&path, &text).ok().map(|()| path);
        return KernelError::Rejected {
            program,
            release: kernel_release(),
            last: verifier_reason(&text),
            log,
        };
    }
    let e = KernelError::from(e);
    if is_eperm(&e) {
        KernelError::Permission(e.to_string())
    } else {
        e
    }
}
