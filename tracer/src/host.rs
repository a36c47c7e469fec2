//! Where the host's files are: `/` normally, `/host` (say) in a debug container that mounts
//! the node's root there (`kubectl debug node/NAME --profile=sysadmin`). Every host path the
//! tracer reads (`/proc/<pid>`, `/run/netns`, `/var/run/netns`, `/var/log/pods`) goes
//! through [`path`]; the tracer's own `/proc/self` and `/proc/thread-self` do not.
use std::{
    ffi::{CString, OsStr},
    os::unix::{ffi::OsStrExt, fs::PermissionsExt, process::CommandExt},
    path::{Path, PathBuf},
    process::Command,
    sync::OnceLock,
};

static ROOT: OnceLock<PathBuf> = OnceLock::new();

/// Sets the host root for the whole process (`--host-root`); only the first call counts.
pub fn set_root(root: PathBuf) {
    let _ = ROOT.set(root);
}

pub fn root() -> &'static Path {
    ROOT.get().map_or(Path::new("/"), PathBuf::as_path)
}

/// `abs` (an absolute host path) under the host root.
pub fn path(abs: &str) -> PathBuf {
    under(root(), abs)
}

pub fn under(root: &Path, abs: &str) -> PathBuf {
    root.join(abs.trim_start_matches('/'))
}

/// Where the host keeps the programs [`command`] looks for, under its root.
const HOST_BIN_DIRS: [&str; 6] = [
    "/usr/local/sbin",
    "/usr/local/bin",
    "/usr/sbin",
    "/usr/bin",
    "/sbin",
    "/bin",
];

/// How [`command`] runs a program.
#[derive(Debug, PartialEq, Eq)]
pub enum Found {
    /// This process's own, found in `PATH`.
    Own(PathBuf),
    /// The host's, at this path inside the host root: run chrooted into the root.
    Host(PathBuf),
}

/// Where `prog` is: in one of `path`'s directories (a `PATH` value), else in the host's
/// program directories under `root`.
pub fn find(prog: &str, path: Option<&OsStr>, root: &Path) -> Option<Found> {
    let runnable = |p: &Path| {
        p.metadata()
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if let Some(own) = path
        .into_iter()
        .flat_map(std::env::split_paths)
        .map(|d| d.join(prog))
        .find(|p| runnable(p))
    {
        return Some(Found::Own(own));
    }
    // A symlink under the root counts as it is: its target (Debian's `/etc/alternatives/…`)
    // is absolute, so it resolves only inside the chroot the program runs in.
    let in_root = |p: &Path| {
        p.symlink_metadata()
            .is_ok_and(|m| m.file_type().is_symlink())
            || runnable(p)
    };
    HOST_BIN_DIRS
        .iter()
        .map(|d| Path::new(d).join(prog))
        .find(|inside| in_root(&under(root, &inside.to_string_lossy())))
        .map(Found::Host)
}

/// A host program (`iptables-save`, `nft`) to run: this process's own when its `PATH` has it;
/// else the host's own, under the host root, run chrooted into that root — a debug
/// container's image carries dnspath alone, while the node's program comes with its
/// libraries and dlopened plugins (iptables' xtables), in the version that wrote the rules.
/// `None`: neither has it. Chrooting needs CAP_SYS_CHROOT (`--profile=sysadmin` has it).
pub fn command(prog: &str) -> Option<Command> {
    let root = root();
    match find(prog, std::env::var_os("PATH").as_deref(), root)? {
        Found::Own(p) => Some(Command::new(p)),
        Found::Host(inside) => {
            // Made before the fork: the child may only make async-signal-safe calls.
            let c_root = CString::new(root.as_os_str().as_bytes()).ok()?;
            let mut cmd = Command::new(inside);
            // SAFETY: the closure runs in the forked child before exec and only calls
            // chroot(2) and chdir(2) on strings made before the fork (no allocation, no lock).
            unsafe {
                cmd.pre_exec(move || {
                    if libc::chroot(c_root.as_ptr()) != 0 || libc::chdir(c"/".as_ptr()) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
            Some(cmd)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_program_is_ours_in_path_else_the_hosts_under_its_root() {
        let dir = std::env::temp_dir().join(format!("dnspath-host-find-{}", std::process::id()));
        let (own, root) = (dir.join("own"), dir.join("root"));
        for d in [&own, &root.join("usr/sbin")] {
            std::fs::create_dir_all(d).unwrap();
        }
        let exe = |p: &Path| {
            std::fs::write(p, "#!/bin/sh\n").unwrap();
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).unwrap();
        };
        exe(&root.join("usr/sbin/nft"));
        let path = std::env::join_paths([&own]).unwrap();
        assert_eq!(
            find("nft", Some(&path), &root),
            Some(Found::Host(PathBuf::from("/usr/sbin/nft")))
        );
        exe(&own.join("nft"));
        assert_eq!(
            find("nft", Some(&path), &root),
            Some(Found::Own(own.join("nft")))
        );
        // A link to an absolute path that exists only inside the root (alternatives).
        std::os::unix::fs::symlink(
            "/nonexistent-outside-the-root/iptables-nft-save",
            root.join("usr/sbin/iptables-nft-save"),
        )
        .unwrap();
        assert_eq!(
            find("iptables-nft-save", Some(&path), &root),
            Some(Found::Host(PathBuf::from("/usr/sbin/iptables-nft-save")))
        );
        // Not runnable, or nowhere: not found.
        std::fs::write(root.join("usr/sbin/iptables-save"), "").unwrap();
        assert_eq!(find("iptables-save", Some(&path), &root), None);
        assert_eq!(find("ipvsadm", None, &root), None);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn joins_under_root() {
        assert_eq!(under(Path::new("/"), "/proc"), PathBuf::from("/proc"));
        assert_eq!(
            under(Path::new("/host"), "/var/log/pods"),
            PathBuf::from("/host/var/log/pods")
        );
    }
}
