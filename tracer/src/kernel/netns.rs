//! Network namespaces and their interfaces: discovery, entering, listing links.
//!
//! A namespace is entered only for as long as it takes to open its link subscription and
//! attach programs, by the calling thread alone (`setns(2)` is per thread). No namespace file
//! is kept open; the subscription socket ([`LinkSubscription`]) does keep its namespace alive,
//! so it is closed as soon as no process or bind mount holds the namespace any more
//! (`attach::discover`): otherwise a deleted pod's namespace (and its veth) would live on.
use std::{
    collections::BTreeMap,
    fs::{self, File},
    os::{
        fd::{AsFd, AsRawFd},
        unix::fs::MetadataExt,
    },
    path::{Path, PathBuf},
};

use nix::sched::{setns, CloneFlags};

use super::KernelError;

mod links;
pub use links::{list_links, Link, LinkSubscription};

/// Identity of a namespace: device and inode of its nsfs file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NetnsId {
    pub dev: u64,
    pub ino: u64,
}

/// Where a namespace can be opened from, and what to call it.
#[derive(Clone, Debug)]
pub struct NetnsRef {
    pub id: NetnsId,
    pub path: PathBuf,
    /// `ip netns` name, `pid:COMM`, or `host` for the tracer's own namespace.
    pub name: String,
    pub is_own: bool,
}

pub fn id_of(path: &Path) -> Option<NetnsId> {
    let md = fs::metadata(path).ok()?;
    Some(NetnsId {
        dev: md.dev(),
        ino: md.ino(),
    })
}

pub fn own_netns() -> Result<NetnsRef, KernelError> {
    let path = PathBuf::from("/proc/self/ns/net");
    let id =
        id_of(&path).ok_or_else(|| KernelError::Netns("cannot stat /proc/self/ns/net".into()))?;
    let name = named_netns()
        .into_iter()
        .find(|n| n.id == id)
        .map(|n| n.name)
        .unwrap_or_else(|| "host".to_string());
    // /proc/self would follow whichever thread reads it; pin the tgid's path.
    let path = PathBuf::from(format!("/proc/{}/ns/net", std::process::id()));
    Ok(NetnsRef {
        id,
        path,
        name,
        is_own: true,
    })
}

/// Namespaces named by `ip netns add` (bind mounts under /run/netns, or /var/run/netns where
/// that is not the same directory), under the host root.
pub fn named_netns() -> Vec<NetnsRef> {
    let mut out: Vec<NetnsRef> = Vec::new();
    for dir in ["/run/netns", "/var/run/netns"] {
        let Ok(dir) = fs::read_dir(crate::host::path(dir)) else {
            continue;
        };
        for e in dir.flatten() {
            let path = e.path();
            if let Some(id) = id_of(&path) {
                if out.iter().any(|n| n.id == id) {
                    continue;
                }
                out.push(NetnsRef {
                    id,
                    name: e.file_name().to_string_lossy().into_owned(),
                    path,
                    is_own: false,
                });
            }
        }
    }
    out
}

/// What [`all_netns`] found.
#[derive(Debug, Default)]
pub struct AllNetns {
    /// The tracer's own namespace first, then one entry per other distinct namespace.
    pub namespaces: Vec<NetnsRef>,
    /// Processes whose `/proc/PID/ns/net` could not be read for lack of permission: a
    /// ptrace access check (proc(5)) that fails without CAP_SYS_PTRACE for processes of
    /// another user or with capabilities the tracer lacks. Their namespaces are not traced
    /// unless a named one is the same.
    pub unreadable: u64,
}

/// The tracer's own namespace, every named one, and those of running processes; one entry
/// per distinct namespace.
pub fn all_netns() -> Result<AllNetns, KernelError> {
    let own = own_netns()?;
    let mut by_id: BTreeMap<NetnsId, NetnsRef> = BTreeMap::new();
    for n in named_netns() {
        by_id.entry(n.id).or_insert(n);
    }
    let mut unreadable = 0;
    let proc = crate::host::path("/proc");
    if let Ok(dir) = fs::read_dir(&proc) {
        for e in dir.flatten() {
            let fname = e.file_name();
            let Some(pid) = fname.to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            let path = proc.join(format!("{pid}/ns/net"));
            let id = match fs::metadata(&path) {
                Ok(md) => NetnsId {
                    dev: md.dev(),
                    ino: md.ino(),
                },
                Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                    unreadable += 1;
                    continue;
                }
                // Gone meanwhile, or a kernel thread.
                Err(_) => continue,
            };
            by_id.entry(id).or_insert_with(|| {
                let comm = fs::read_to_string(proc.join(format!("{pid}/comm"))).unwrap_or_default();
                NetnsRef {
                    id,
                    path,
                    name: format!("pid{pid}:{}", comm.trim()),
                    is_own: false,
                }
            });
        }
    }
    by_id.remove(&own.id);
    let mut namespaces = vec![own];
    namespaces.extend(by_id.into_values());
    Ok(AllNetns {
        namespaces,
        unreadable,
    })
}

/// Runs `f` with the calling thread inside the namespace at `path`, then returns to the
/// thread's original namespace (or reports that it could not).
pub fn with_netns<T>(
    path: &Path,
    f: impl FnOnce() -> Result<T, KernelError>,
) -> Result<T, KernelError> {
    let original = File::open("/proc/thread-self/ns/net")?;
    let target = File::open(path).map_err(|e| {
        refused("open", path, e.raw_os_error())
            .unwrap_or_else(|| KernelError::Netns(format!("{}: {e}", path.display())))
    })?;
    setns(target.as_fd(), CloneFlags::CLONE_NEWNET).map_err(|e| {
        refused("setns", path, Some(e as i32))
            .unwrap_or_else(|| KernelError::Netns(format!("setns {}: {e}", path.display())))
    })?;
    drop(target);
    let result = f();
    setns(original.as_fd(), CloneFlags::CLONE_NEWNET)
        .map_err(|e| KernelError::Netns(format!("cannot return to own netns: {e}")))?;
    result
}

/// Identity of the calling thread's current namespace.
pub fn current_netns_id() -> Result<NetnsId, KernelError> {
    id_of(Path::new("/proc/thread-self/ns/net"))
        .ok_or_else(|| KernelError::Netns("cannot stat /proc/thread-self/ns/net".into()))
}

/// [`with_netns`], provided the namespace at `path` is still `id`: a `/proc/PID/ns/net`
/// found earlier names another namespace once that process is gone and its PID reused.
pub fn with_netns_id<T>(
    path: &Path,
    id: NetnsId,
    f: impl FnOnce() -> Result<T, KernelError>,
) -> Result<T, KernelError> {
    with_netns(path, || {
        if current_netns_id()? != id {
            return Err(KernelError::Netns(format!(
                "{}: no longer the namespace it named",
                path.display()
            )));
        }
        f()
    })
}

/// What an `op` (`open`, `setns`) on the namespace at `path` failing with `errno` means
/// when that is EPERM or EACCES: the capability to enter it is missing
/// ([`KernelError::NetnsPermission`]); `None` for any other failure.
fn refused(op: &'static str, path: &Path, errno: Option<i32>) -> Option<KernelError> {
    match errno {
        Some(e @ (libc::EPERM | libc::EACCES)) => Some(KernelError::NetnsPermission {
            op,
            path: path.to_path_buf(),
            errno: nix::errno::Errno::from_raw(e),
        }),
        _ => None,
    }
}

/// How namespaces are identified on this kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NetnsIdKind {
    /// `SO_NETNS_COOKIE` (Linux ≥ 5.14): the value `bpf_get_netns_cookie` gives, unique for
    /// the whole boot.
    Cookie,
    /// The namespace's inode number (`/proc/thread-self/ns/net`), on kernels without
    /// `SO_NETNS_COOKIE`; the drop program reads `net->ns.inum` to match.
    Inode,
}

impl NetnsIdKind {
    pub fn as_str(self) -> &'static str {
        match self {
            NetnsIdKind::Cookie => "cookie",
            NetnsIdKind::Inode => "inode",
        }
    }
}

/// Which id [`current_netns_cookie`] returns on this kernel (probed once).
pub fn netns_id_kind() -> NetnsIdKind {
    static KIND: std::sync::OnceLock<NetnsIdKind> = std::sync::OnceLock::new();
    *KIND.get_or_init(|| match so_netns_cookie() {
        Err(e) if e.raw_os_error() == Some(libc::ENOPROTOOPT) => NetnsIdKind::Inode,
        _ => NetnsIdKind::Cookie,
    })
}

fn so_netns_cookie() -> std::io::Result<u64> {
    let sock = nix::sys::socket::socket(
        nix::sys::socket::AddressFamily::Inet,
        nix::sys::socket::SockType::Datagram,
        nix::sys::socket::SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(std::io::Error::from)?;
    let mut cookie: u64 = 0;
    let mut len = std::mem::size_of::<u64>() as libc::socklen_t;
    // SAFETY: valid fd, out pointer and length describe `cookie`.
    let rc = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_NETNS_COOKIE,
            (&mut cookie as *mut u64).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(cookie)
}

/// Id of the calling thread's current network namespace: its cookie (`SO_NETNS_COOKIE`,
/// Linux 5.14, the same value `bpf_get_netns_cookie` gives the kernel programs), or on older
/// kernels its inode number (see [`NetnsIdKind`]).
pub fn current_netns_cookie() -> Result<u64, KernelError> {
    match netns_id_kind() {
        NetnsIdKind::Cookie => {
            so_netns_cookie().map_err(|e| KernelError::Netns(format!("SO_NETNS_COOKIE: {e}")))
        }
        NetnsIdKind::Inode => std::fs::metadata("/proc/thread-self/ns/net")
            .map(|m| std::os::unix::fs::MetadataExt::ino(&m))
            .map_err(|e| KernelError::Netns(format!("/proc/thread-self/ns/net: {e}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_namespace_has_loopback() {
        let links = list_links().unwrap();
        let lo = links.iter().find(|l| l.name == "lo").unwrap();
        assert_eq!(lo.index, 1);
        assert!(lo.has_eth);
        let own = own_netns().unwrap();
        let cookie = with_netns(&own.path, current_netns_cookie).unwrap();
        assert_eq!(cookie, current_netns_cookie().unwrap());
    }

    #[test]
    fn refused_entry_is_a_permission_error() {
        let path = Path::new("/run/netns/x");
        for (op, errno) in [("setns", libc::EPERM), ("open", libc::EACCES)] {
            match refused(op, path, Some(errno)) {
                Some(KernelError::NetnsPermission {
                    op: o,
                    path: p,
                    errno: e,
                }) => {
                    assert_eq!((o, p.as_path(), e as i32), (op, path, errno));
                }
                other => panic!("{op} {errno}: {other:?}"),
            }
        }
        let e = refused("setns", path, Some(libc::EPERM)).unwrap();
        assert_eq!(
            e.to_string(),
            "setns /run/netns/x: EPERM: Operation not permitted: entering another network \
             namespace needs CAP_SYS_ADMIN"
        );
        // Anything else is about the namespace, not the capability.
        assert!(refused("setns", path, Some(libc::EINVAL)).is_none());
        assert!(refused("open", path, Some(libc::ENOENT)).is_none());
        assert!(refused("open", path, None).is_none());
    }
}
