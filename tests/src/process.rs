//! Processes the lab started, held by pidfd so that signalling them can never hit a
//! recycled PID (pidfd_open(2), Linux 5.3; pidfd_send_signal(2), Linux 5.1).

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Child;
use std::time::{Duration, Instant};

/// One process the lab started.
#[derive(Debug)]
pub(crate) struct Tracked {
    pub(crate) pid: u32,
    pub(crate) label: String,
    pidfd: Option<OwnedFd>,
    /// Set for the lab's own servers: the lab reaps them. `None` for [`crate::Lab::spawn`]ed
    /// processes, whose `Child` the caller owns.
    pub(crate) child: Option<Child>,
    /// Server log, for start-up errors.
    pub(crate) log: Option<std::path::PathBuf>,
}

fn pidfd_open(pid: u32) -> std::io::Result<OwnedFd> {
    let pid =
        libc::pid_t::try_from(pid).map_err(|_| std::io::Error::from_raw_os_error(libc::ESRCH))?;
    // SAFETY: pidfd_open takes (pid_t, unsigned int) and returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0u32) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let fd = i32::try_from(fd).map_err(|_| std::io::Error::from_raw_os_error(libc::EBADF))?;
    // SAFETY: the kernel just returned this fd to us and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn pidfd_signal(fd: &OwnedFd, sig: i32) -> std::io::Result<()> {
    // SAFETY: pidfd_send_signal(int pidfd, int sig, siginfo_t *info = NULL, unsigned flags = 0).
    let rc = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            fd.as_raw_fd(),
            sig,
            std::ptr::null::<libc::siginfo_t>(),
            0u32,
        )
    };
    if rc < 0 {
        let err = std::io::Error::last_os_error();
        // ESRCH: already exited (possibly a zombie waiting for its parent) - nothing to do.
        if err.raw_os_error() == Some(libc::ESRCH) {
            return Ok(());
        }
        return Err(err);
    }
    Ok(())
}

/// Waits until every fd in `fds` is readable (a pidfd is readable once its process has
/// exited, zombie or reaped) or `timeout` passes. Returns which ones exited.
fn wait_exited(fds: &[&OwnedFd], timeout: Duration) -> Vec<bool> {
    let mut exited = vec![false; fds.len()];
    let deadline = Instant::now() + timeout;
    loop {
        let pending: Vec<usize> = (0..fds.len()).filter(|&i| !exited[i]).collect();
        if pending.is_empty() {
            return exited;
        }
        let mut pfds: Vec<libc::pollfd> = pending
            .iter()
            .map(|&i| libc::pollfd {
                fd: fds[i].as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        let left = deadline.saturating_duration_since(Instant::now());
        let ms = i32::try_from(left.as_millis()).unwrap_or(i32::MAX);
        // SAFETY: pfds is a valid array of pfds.len() pollfd structs for the whole call.
        let n = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, ms) };
        if n < 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return exited;
        }
        for (k, p) in pfds.iter().enumerate() {
            if p.revents != 0 {
                exited[pending[k]] = true;
            }
        }
        if Instant::now() >= deadline {
            return exited;
        }
    }
}

impl Tracked {
    /// Starts tracking `pid`; call right after spawning, before anyone can reap it.
    pub(crate) fn new(
        pid: u32,
        label: String,
        child: Option<Child>,
        log: Option<std::path::PathBuf>,
    ) -> Self {
        // pidfd_open only fails here if the process is already gone (ESRCH after a reap)
        // or the kernel predates 5.3; either way there is nothing to signal later.
        let pidfd = pidfd_open(pid).ok();
        Self {
            pid,
            label,
            pidfd,
            child,
            log,
        }
    }
}

/// SIGTERM all, wait up to `grace` for them together, SIGKILL the rest and wait for those,
/// then reap the lab's own children.
pub(crate) fn stop_all(procs: &mut [Tracked], grace: Duration) {
    let fds: Vec<&OwnedFd> = procs.iter().filter_map(|p| p.pidfd.as_ref()).collect();
    for fd in &fds {
        let _ = pidfd_signal(fd, libc::SIGTERM);
    }
    let exited = wait_exited(&fds, grace);
    let stubborn: Vec<&OwnedFd> = fds
        .iter()
        .zip(&exited)
        .filter(|(_, e)| !**e)
        .map(|(fd, _)| *fd)
        .collect();
    for fd in &stubborn {
        let _ = pidfd_signal(fd, libc::SIGKILL);
    }
    if !stubborn.is_empty() {
        // SIGKILL cannot be caught; only a task stuck in uninterruptible sleep takes longer.
        let _ = wait_exited(&stubborn, Duration::from_secs(5));
    }
    for p in procs.iter_mut() {
        if let Some(child) = p.child.as_mut() {
            let _ = child.try_wait();
        }
        p.pidfd = None;
    }
}

/// (device, inode) of a network namespace handle such as `/run/netns/NAME` or
/// `/proc/PID/ns/net`.
pub(crate) fn netns_id(path: &Path) -> Option<(u64, u64)> {
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// SIGKILLs every process whose network namespace is one of `netns` (ids from
/// [`netns_id`]): descendants of lab processes, such as dnsmasq's per-TCP-connection
/// children, that would otherwise keep a deleted namespace and its veths alive. A `dnspath`
/// is spared: another lab's tracer (`--all-netns`, the agent) enters every namespace of the
/// machine for a moment while it scans, and is that lab's to stop; this lab's own were
/// stopped by PID before. Returns how many it killed.
pub(crate) fn kill_netns_members(netns: &[(u64, u64)]) -> usize {
    if netns.is_empty() {
        return 0;
    }
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0;
    };
    let mut fds = Vec::new();
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let ns_path = entry.path().join("ns/net");
        if !netns_id(&ns_path).is_some_and(|id| netns.contains(&id)) {
            continue;
        }
        let comm = std::fs::read_to_string(entry.path().join("comm")).unwrap_or_default();
        if comm.trim_end() == "dnspath" {
            continue;
        }
        // Pin the process first, then check again that it is the one we listed: a PID
        // recycled between the two reads fails the second check.
        let Ok(fd) = pidfd_open(pid) else { continue };
        if netns_id(&ns_path).is_some_and(|id| netns.contains(&id))
            && pidfd_signal(&fd, libc::SIGKILL).is_ok()
        {
            fds.push(fd);
        }
    }
    let refs: Vec<&OwnedFd> = fds.iter().collect();
    let _ = wait_exited(&refs, Duration::from_secs(2));
    fds.len()
}

/// The last `max` bytes of a log file, for error messages.
pub(crate) fn log_tail(path: &Path, max: usize) -> String {
    use std::io::{Read, Seek, SeekFrom};
    let Ok(mut f) = File::open(path) else {
        return String::from("(no log)");
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let start = len.saturating_sub(max as u64);
    let _ = f.seek(SeekFrom::Start(start));
    let mut buf = Vec::new();
    let _ = f.read_to_end(&mut buf);
    String::from_utf8_lossy(&buf).into_owned()
}
