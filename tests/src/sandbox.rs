//! A lab test binary in namespaces of its own, so that two can run at once.
//!
//! Labs see each other through what the machine shares: `/run/netns` (the agent's, doctor's
//! and `--all-netns` tests follow every namespace there), `/proc` (a lab's teardown ends
//! whatever runs in its namespaces, found through every process's `ns/net`), the pinned maps
//! in `/sys/fs/bpf` and the root network namespace. [`enter`], called before `main` (the
//! lab binary's constructor, while it has one thread), moves the process into new mount,
//! network and PID namespaces with fresh `/run/netns`, `/proc`, `/sys` (this network
//! namespace's) and bpffs, the machine's cgroup tree carried over. What is left shared is
//! the kernel itself: global tracepoints see every drop, and conntrack's global limit.
//!
//! The process tree: the test binary (outside) waits for a reaper, PID 1 of the new PID
//! namespace, which waits for the tests (its child) and every orphan adopted on the way,
//! and exits with the tests' status. The reaper dies with the outer process
//! (`PR_SET_PDEATHSIG`), and every process of the namespace with the reaper.
//!
//! Skipped without root, and when `DNSPATH_LAB_SHARED=1` asks to share the machine's
//! namespaces (as every lab did before); a namespace that cannot be made is said on stderr
//! and the tests run shared.
use std::{
    ffi::CStr,
    fs::File,
    os::fd::AsRawFd,
    sync::atomic::{AtomicBool, Ordering},
};

/// Asks [`enter`] to leave the tests in the machine's namespaces.
pub const SHARED_ENV: &str = "DNSPATH_LAB_SHARED";

/// Where the machine's cgroup tree is held while `/sys` is mounted again.
const CGROUP_HOLD: &CStr = c"/run/dnspath-lab-cgroup";

/// The machine's network namespace, kept (bound to this file in the private mount
/// namespace) for what only it can change: [`in_machine_netns`].
const MACHINE_NET: &CStr = c"/run/dnspath-lab-machine-net";

/// The tests run in namespaces of their own.
static ENTERED: AtomicBool = AtomicBool::new(false);

/// Runs `f` on a thread in the machine's network namespace (where the machine-wide
/// sysctls, such as `nf_conntrack_max`, can be written and read), or here when the tests
/// share it.
pub fn in_machine_netns<T: Send>(f: impl FnOnce() -> T + Send) -> std::io::Result<T> {
    if !ENTERED.load(Ordering::Relaxed) {
        return Ok(f());
    }
    let ns = File::open(MACHINE_NET.to_str().unwrap_or_default())?;
    std::thread::scope(|s| {
        s.spawn(|| {
            // SAFETY: a namespace file's descriptor, for this thread alone (its filesystem
            // context is not shared in a way setns(CLONE_NEWNET) changes).
            if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(f())
        })
        .join()
        .unwrap_or_else(|_| Err(std::io::Error::other("the thread panicked")))
    })
}

/// Moves this process into namespaces of its own (see the module's documentation). Call it
/// before any thread is started: only the process's first thread is moved.
pub fn enter() {
    if std::env::var_os(SHARED_ENV).is_some_and(|v| v == "1") || !crate::tracer::is_root() {
        return;
    }
    // SAFETY: unshare has no memory preconditions; the process has one thread (see above).
    let made = unsafe { libc::unshare(libc::CLONE_NEWNS) } == 0
        && keep_machine_netns()
        // SAFETY: as above.
        && unsafe { libc::unshare(libc::CLONE_NEWNET | libc::CLONE_NEWPID) } == 0;
    if !made {
        eprintln!(
            "lab: namespaces of its own could not be made ({}): the tests share the machine's",
            std::io::Error::last_os_error()
        );
        return;
    }
    if let Err(what) = mount_private() {
        eprintln!("lab: {what}");
        // SAFETY: _exit ends the process at once, as a failed setup must.
        unsafe { libc::_exit(101) };
    }
    ENTERED.store(true, Ordering::Relaxed);
    // SAFETY: fork in a one-threaded process.
    match unsafe { libc::fork() } {
        -1 => {
            eprintln!("lab: fork: {}", std::io::Error::last_os_error());
            // SAFETY: as above.
            unsafe { libc::_exit(101) }
        }
        0 => reaper(),
        pid => {
            let status = wait_for(pid);
            // SAFETY: as above; the status is the tests'.
            unsafe { libc::_exit(status) }
        }
    }
}

/// PID 1 of the new namespace: mounts its `/proc`, starts the tests and reaps until they end.
fn reaper() {
    // SAFETY: prctl with an integer argument; getppid has no preconditions.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
        if libc::getppid() == 1 {
            libc::_exit(101);
        }
    }
    if let Err(what) = mount(c"proc", c"/proc", c"proc", 0) {
        eprintln!("lab: {what}");
        // SAFETY: as in `enter`.
        unsafe { libc::_exit(101) };
    }
    loopback_up();
    // SAFETY: fork in a one-threaded process.
    let tests = unsafe { libc::fork() };
    match tests {
        -1 => {
            eprintln!("lab: fork: {}", std::io::Error::last_os_error());
            // SAFETY: as above.
            unsafe { libc::_exit(101) }
        }
        // The tests: back to the constructor's caller, then `main`.
        0 => {}
        tests => loop {
            let mut status = 0;
            // SAFETY: status is a valid pointer.
            let pid = unsafe { libc::waitpid(-1, &mut status, 0) };
            if pid == tests {
                // SAFETY: as above.
                unsafe { libc::_exit(exit_code(status)) }
            }
            if pid == -1 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
                // SAFETY: as above.
                unsafe { libc::_exit(101) }
            }
        },
    }
}

/// Waits for `pid`; its exit code (128 + the signal that ended it).
fn wait_for(pid: libc::pid_t) -> i32 {
    loop {
        let mut status = 0;
        // SAFETY: status is a valid pointer.
        if unsafe { libc::waitpid(pid, &mut status, 0) } == pid {
            return exit_code(status);
        }
        if std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return 101;
        }
    }
}

fn exit_code(status: i32) -> i32 {
    if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else {
        128 + libc::WTERMSIG(status)
    }
}

/// The machine's network namespace bound to [`MACHINE_NET`] in this (new, private) mount
/// namespace; false if it cannot be.
fn keep_machine_netns() -> bool {
    if mount(c"none", c"/", c"", libc::MS_REC | libc::MS_PRIVATE).is_err() {
        return false;
    }
    // SAFETY: a NUL-terminated path; the file is only a mount point.
    let fd = unsafe {
        libc::open(
            MACHINE_NET.as_ptr(),
            libc::O_CREAT | libc::O_RDONLY | libc::O_CLOEXEC,
            0o600,
        )
    };
    if fd < 0 {
        return false;
    }
    // SAFETY: the descriptor just opened.
    unsafe { libc::close(fd) };
    mount(c"/proc/self/ns/net", MACHINE_NET, c"", libc::MS_BIND).is_ok()
}

/// This mount namespace's own `/run/netns`, `/sys` and bpffs, the cgroup tree kept.
fn mount_private() -> Result<(), String> {
    // SAFETY: a NUL-terminated path; an existing directory is fine.
    unsafe { libc::mkdir(CGROUP_HOLD.as_ptr(), 0o700) };
    mount(
        c"/sys/fs/cgroup",
        CGROUP_HOLD,
        c"",
        libc::MS_BIND | libc::MS_REC,
    )?;
    mount(c"sysfs", c"/sys", c"sysfs", 0)?;
    mount(CGROUP_HOLD, c"/sys/fs/cgroup", c"", libc::MS_MOVE)?;
    mount(c"bpf", c"/sys/fs/bpf", c"bpf", 0)?;
    // Optional: the kernel programs' logs and older kernels' tracepoints.
    let _ = mount(c"tracefs", c"/sys/kernel/tracing", c"tracefs", 0);
    let _ = mount(c"debugfs", c"/sys/kernel/debug", c"debugfs", 0);
    // SAFETY: NUL-terminated paths; existing directories are fine.
    unsafe {
        libc::mkdir(c"/run".as_ptr(), 0o755);
        libc::mkdir(c"/run/netns".as_ptr(), 0o755);
    }
    mount(c"tmpfs", c"/run/netns", c"tmpfs", 0)
}

fn mount(src: &CStr, target: &CStr, fstype: &CStr, flags: libc::c_ulong) -> Result<(), String> {
    let fstype = if fstype.is_empty() {
        std::ptr::null()
    } else {
        fstype.as_ptr()
    };
    // SAFETY: NUL-terminated strings (or null for no type) and no data.
    let rc = unsafe {
        libc::mount(
            src.as_ptr(),
            target.as_ptr(),
            fstype,
            flags,
            std::ptr::null(),
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(format!(
            "mount {} on {}: {}",
            src.to_string_lossy(),
            target.to_string_lossy(),
            std::io::Error::last_os_error()
        ))
    }
}

/// The new network namespace's `lo` up (tests that use 127.0.0.1 outside the lab's own
/// namespaces).
fn loopback_up() {
    // SAFETY: a socket, an ifreq naming "lo", and two ioctls on it; closed after.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return;
        }
        let mut req: libc::ifreq = std::mem::zeroed();
        req.ifr_name[0] = b'l' as libc::c_char;
        req.ifr_name[1] = b'o' as libc::c_char;
        if libc::ioctl(fd, libc::SIOCGIFFLAGS, &mut req) == 0 {
            req.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
            libc::ioctl(fd, libc::SIOCSIFFLAGS, &req);
        }
        libc::close(fd);
    }
}
