//! Where the host's files are: `/` normally, `/host` (say) in a debug container that mounts
//! the node's root there (`kubectl debug node/NAME --profile=sysadmin`). Every host path the
//! tracer reads (`/proc/<pid>`, `/run/netns`, `/var/run/netns`, `/var/log/pods`) goes
//! through [`path`]; the tracer's own `/proc/self` and `/proc/thread-self` do not.
use std::{
    path::{Path, PathBuf},
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn joins_under_root() {
        assert_eq!(under(Path::new("/"), "/proc"), PathBuf::from("/proc"));
        assert_eq!(
            under(Path::new("/host"), "/var/log/pods"),
            PathBuf::from("/host/var/log/pods")
        );
    }
}
