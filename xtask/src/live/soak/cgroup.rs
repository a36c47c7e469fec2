//! The agent's memory cgroup, as the DaemonSet's limit puts it in one.
use std::{
    fs,
    path::{Path, PathBuf},
    thread,
    time::Duration,
};

use anyhow::anyhow;

/// A memory cgroup with the DaemonSet's limit (v2 where mounted, else v1's memory
/// controller); removed on drop once its processes are gone.
pub(super) struct Cgroup {
    dir: PathBuf,
    v2: bool,
}

impl Cgroup {
    pub(super) fn create(name: &str, limit: u64) -> crate::Result<Cgroup> {
        let v2 = Path::new("/sys/fs/cgroup/cgroup.controllers").exists();
        let dir = if v2 {
            PathBuf::from("/sys/fs/cgroup").join(name)
        } else {
            PathBuf::from("/sys/fs/cgroup/memory").join(name)
        };
        fs::create_dir_all(&dir).map_err(|e| anyhow!("{}: {e}", dir.display()))?;
        let cg = Cgroup { dir, v2 };
        let (file, value) = if v2 {
            ("memory.max", limit.to_string())
        } else {
            ("memory.limit_in_bytes", limit.to_string())
        };
        cg.write(file, &value)?;
        Ok(cg)
    }
    pub(super) fn write(&self, file: &str, value: &str) -> crate::Result<()> {
        let p = self.dir.join(file);
        fs::write(&p, value).map_err(|e| anyhow!("{}: {e}", p.display()))
    }
    pub(super) fn procs(&self) -> String {
        self.dir.join("cgroup.procs").to_string_lossy().into_owned()
    }
    pub(super) fn read_u64(&self, file: &str, key: Option<&str>) -> Option<u64> {
        let text = fs::read_to_string(self.dir.join(file)).ok()?;
        match key {
            None => text.trim().parse().ok(),
            Some(k) => text.lines().find_map(|l| {
                let (name, v) = l.split_once(' ')?;
                (name == k).then(|| v.trim().parse().ok())?
            }),
        }
    }
    /// Memory charged to the cgroup now (anonymous, kernel and page cache).
    pub(super) fn current(&self) -> Option<u64> {
        if self.v2 {
            self.read_u64("memory.current", None)
        } else {
            self.read_u64("memory.usage_in_bytes", None)
        }
    }
    /// (anonymous, kernel) bytes of [`Cgroup::current`] (v2; v1: rss, and no kernel figure).
    pub(super) fn split(&self) -> (Option<u64>, Option<u64>) {
        if self.v2 {
            (
                self.read_u64("memory.stat", Some("anon")),
                self.read_u64("memory.stat", Some("kernel")),
            )
        } else {
            (self.read_u64("memory.stat", Some("rss")), None)
        }
    }
    pub(super) fn oom_kills(&self) -> Option<u64> {
        if self.v2 {
            self.read_u64("memory.events", Some("oom_kill"))
        } else {
            self.read_u64("memory.oom_control", Some("oom_kill"))
        }
    }
    pub(super) fn peak(&self) -> Option<u64> {
        if self.v2 {
            self.read_u64("memory.peak", None)
        } else {
            self.read_u64("memory.max_usage_in_bytes", None)
        }
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        for _ in 0..50 {
            if fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            thread::sleep(Duration::from_millis(100));
        }
        eprintln!("soak: {} left behind", self.dir.display());
    }
}
