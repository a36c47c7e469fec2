//! A process's files as it sees them, read beneath its root (a pod's symlink never reaches
//! the host's files), the node's through `--host-root`, and the sockets a process holds.
use std::{
    collections::{BTreeSet, HashSet},
    fs::{self, File},
    io::Read,
    net::IpAddr,
    os::fd::AsRawFd,
    path::Path,
};

use super::config::{self, ConfigError};
use crate::host;

/// At most this much of a `/proc` or config file.
pub(super) fn read_small(path: &Path) -> std::io::Result<String> {
    let mut buf = Vec::new();
    File::open(path)?
        .take(config::MAX_CONFIG_BYTES)
        .read_to_end(&mut buf)?;
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

/// `p` (a path a pod's process or its files name) as process `pid` sees it, at most
/// [`config::MAX_CONFIG_BYTES`] of it: under its root if absolute, its working directory if
/// not, never outside them (see [`read_beneath`]).
pub(super) fn read_in_process_root(pid: u32, p: &str) -> std::io::Result<String> {
    let (base, rel) = match p.strip_prefix('/') {
        Some(rel) => ("root", rel),
        None => ("cwd", p),
    };
    let dir = File::open(host::path(&format!("/proc/{pid}/{base}")))?;
    read_beneath(&dir, rel)
}

/// The node's file `p` under the host root, its symlinks (`/etc/resolv.conf` →
/// `/run/systemd/resolve/stub-resolv.conf`) followed from that root, not from this
/// container's (see [`read_beneath`]).
pub(super) fn read_host(p: &str) -> std::io::Result<String> {
    read_beneath(&File::open(host::root())?, p.trim_start_matches('/'))
}

/// At most [`config::MAX_CONFIG_BYTES`] of the regular file `rel` under the directory `root`,
/// resolved as if `root` were `/`: `..` stops at it and absolute symlinks start from it
/// (`openat2`'s `RESOLVE_IN_ROOT`, Linux ≥ 5.6). A pod's process names these paths, and the
/// pod's files are its own: joined to `/proc/PID/root` as a string, `../../etc/shadow` or a
/// symlink `/etc/resolv.conf -> /etc/shadow` would have been read on the host, and a
/// symlink to a FIFO or a device (a host's `/dev/watchdog`) opened. Opened as a path first:
/// only a regular file is then opened for reading (`/dev/null`, the device, reads as empty).
pub(super) fn read_beneath(root: &File, rel: &str) -> std::io::Result<String> {
    use nix::fcntl::{openat2, OFlag, OpenHow, ResolveFlag};
    use std::io::{Error, ErrorKind};
    let how = OpenHow::new()
        .flags(OFlag::O_PATH | OFlag::O_CLOEXEC)
        .resolve(ResolveFlag::RESOLVE_IN_ROOT | ResolveFlag::RESOLVE_NO_MAGICLINKS);
    let rel = if rel.is_empty() { "." } else { rel };
    let at = File::from(openat2(root, rel, how).map_err(Error::from)?);
    let meta = at.metadata()?;
    if !meta.is_file() {
        // `-C /dev/null`: dnsmasq's way of saying no conf file. Empty, not opened.
        use std::os::unix::fs::{FileTypeExt, MetadataExt};
        if meta.file_type().is_char_device() && meta.rdev() == libc::makedev(1, 3) {
            return Ok(String::new());
        }
        return Err(Error::new(ErrorKind::InvalidInput, "not a regular file"));
    }
    // The O_PATH descriptor reopened for reading: the very file checked.
    read_small(Path::new(&format!("/proc/self/fd/{}", at.as_raw_fd())))
}

pub(super) fn read_in_process(pid: u32, p: &str) -> Result<String, ConfigError> {
    read_in_process_root(pid, p).map_err(|e| ConfigError::File {
        file: p.to_owned(),
        what: e.to_string(),
    })
}

/// Socket inodes bound to local port 53 in `/proc/PID/net/{udp,udp6,tcp,tcp6}` (UDP any
/// state, TCP listening).
pub(super) fn port53_inodes(pid: u32) -> HashSet<u64> {
    let mut out = HashSet::new();
    for (file, tcp) in [
        ("udp", false),
        ("udp6", false),
        ("tcp", true),
        ("tcp6", true),
    ] {
        let Ok(text) = read_small(&host::path(&format!("/proc/{pid}/net/{file}"))) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            let (Some(local), Some(state), Some(inode)) = (f.get(1), f.get(3), f.get(9)) else {
                continue;
            };
            let port = local.rsplit(':').next().unwrap_or_default();
            if port != "0035" || (tcp && *state != "0A") {
                continue;
            }
            if let Ok(i) = inode.parse::<u64>() {
                if i != 0 {
                    out.insert(i);
                }
            }
        }
    }
    out
}

/// The namespace's local IPv4 addresses (`/proc/PID/net/fib_trie`, `/32 host LOCAL`) and
/// IPv6 ones (`if_inet6`).
pub(super) fn local_addrs(pid: u32) -> Vec<IpAddr> {
    let mut out = BTreeSet::new();
    if let Ok(text) = read_small(&host::path(&format!("/proc/{pid}/net/fib_trie"))) {
        let mut last: Option<IpAddr> = None;
        for line in text.lines() {
            let t = line.trim_start_matches([' ', '|', '+', '-', '`']);
            if let Ok(ip) = t.trim().parse::<IpAddr>() {
                last = Some(ip);
            } else if t.contains("host LOCAL") {
                if let Some(ip) = last {
                    out.insert(ip);
                }
            }
        }
    }
    if let Ok(text) = read_small(&host::path(&format!("/proc/{pid}/net/if_inet6"))) {
        for line in text.lines() {
            let Some(hex) = line.split_whitespace().next() else {
                continue;
            };
            if hex.len() == 32 {
                if let Ok(v) = u128::from_str_radix(hex, 16) {
                    out.insert(IpAddr::from(std::net::Ipv6Addr::from(v)));
                }
            }
        }
    }
    out.into_iter().collect()
}

/// The process's arguments (`/proc/PID/cmdline`), empty when it cannot be read.
pub(super) fn cmdline(pid: u32) -> Vec<String> {
    read_small(&host::path(&format!("/proc/{pid}/cmdline")))
        .map(|s| {
            s.split('\0')
                .filter(|a| !a.is_empty())
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

/// The entries of directory `p` (absolute) as process `pid` sees it, resolved beneath its
/// root as [`read_beneath`] does: a pod's symlink cannot list a host directory.
pub(super) fn list_in_process_root(pid: u32, p: &str) -> std::io::Result<fs::ReadDir> {
    use nix::fcntl::{openat2, OFlag, OpenHow, ResolveFlag};
    let root = File::open(host::path(&format!("/proc/{pid}/root")))?;
    let how = OpenHow::new()
        .flags(OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC)
        .resolve(ResolveFlag::RESOLVE_IN_ROOT | ResolveFlag::RESOLVE_NO_MAGICLINKS);
    let rel = p.trim_start_matches('/');
    let dir = File::from(openat2(&root, if rel.is_empty() { "." } else { rel }, how)?);
    fs::read_dir(format!("/proc/self/fd/{}", dir.as_raw_fd()))
}

/// Whether process `pid` has a descriptor open on one of the socket `inodes`.
pub(super) fn holds_socket(pid: u32, inodes: &HashSet<u64>) -> bool {
    let Ok(dir) = fs::read_dir(host::path(&format!("/proc/{pid}/fd"))) else {
        return false;
    };
    dir.flatten().any(|e| {
        fs::read_link(e.path())
            .ok()
            .and_then(|l| {
                l.to_str()?
                    .strip_prefix("socket:[")?
                    .strip_suffix(']')?
                    .parse::<u64>()
                    .ok()
            })
            .is_some_and(|i| inodes.contains(&i))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pod's paths stay in its root: an absolute symlink and `..` resolve from the root
    /// given, not from the host's; a FIFO or a directory is refused, without blocking.
    #[test]
    fn files_a_pod_names_are_read_beneath_its_root_only() {
        let root = std::env::temp_dir().join(format!("dnspath-beneath-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        fs::create_dir_all(root.join("etc")).unwrap();
        fs::write(root.join("etc/hostname"), "inside the root\n").unwrap();
        std::os::unix::fs::symlink("/etc/hostname", root.join("etc/resolv.conf")).unwrap();
        std::os::unix::fs::symlink("/../../../../etc/hostname", root.join("etc/up")).unwrap();
        nix::unistd::mkfifo(&root.join("etc/fifo"), nix::sys::stat::Mode::S_IRWXU).unwrap();
        std::os::unix::fs::symlink("/etc/fifo", root.join("etc/to-fifo")).unwrap();
        let dir = File::open(&root).unwrap();
        let read = |p: &str| read_beneath(&dir, p);
        for p in [
            "etc/hostname",
            "etc/resolv.conf",
            "etc/up",
            "../../../etc/hostname",
        ] {
            assert_eq!(read(p).unwrap(), "inside the root\n", "{p}");
        }
        // What the host has there is not what was read (the test proves something only then).
        let host = fs::read_to_string("/etc/hostname").unwrap_or_default();
        assert_ne!(host, "inside the root\n");
        for p in ["etc/fifo", "etc/to-fifo", "etc", ""] {
            let e = read(p).unwrap_err();
            assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput, "{p}: {e}");
        }
        assert!(read("etc/missing").is_err());
        // dnsmasq's `-C /dev/null`: the null device reads as empty; other devices are refused.
        let slash = File::open("/").unwrap();
        assert_eq!(read_beneath(&slash, "dev/null").unwrap(), "");
        let e = read_beneath(&slash, "dev/zero").unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput, "{e}");
        fs::remove_dir_all(&root).unwrap();
    }
}
