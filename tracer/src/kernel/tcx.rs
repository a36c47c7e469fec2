//! Attaching the shared TC programs as TCX links from any thread, without the probes' lock.
//!
//! Hook: `BPF_LINK_CREATE` with `BPF_TCX_INGRESS`/`BPF_TCX_EGRESS` (Linux ≥ 6.6). Each attach
//! waits in the kernel for an RCU grace period (`tcx_entry_sync`, ~14 ms here), so attaching
//! a node's few hundred interfaces one after another took 8 of the agent's 10 s to ready;
//! attaches on several threads share their grace periods. The link is an fd: closing it
//! detaches, from any namespace, and nothing outlives the process.
use std::{
    io,
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
    sync::Arc,
};

use aya::programs::{ProgramFd, SchedClassifier};

use super::{KernelError, TC_PROGRAMS};

/// `BPF_LINK_CREATE` from `enum bpf_cmd` (include/uapi/linux/bpf.h).
const BPF_LINK_CREATE: libc::c_long = 28;
/// `BPF_TCX_INGRESS` and `BPF_TCX_EGRESS` from `enum bpf_attach_type`.
const BPF_TCX_INGRESS: u32 = 46;
const BPF_TCX_EGRESS: u32 = 47;

/// The `link_create` member of `union bpf_attr` as far as TCX uses it: program, ifindex,
/// attach type, flags, then `tcx.relative_fd` and `tcx.expected_revision` (zero: append,
/// whatever else is attached). The kernel zero-fills the rest of the union.
#[repr(C)]
struct LinkCreateTcx {
    prog_fd: u32,
    target_ifindex: u32,
    attach_type: u32,
    flags: u32,
    relative_fd: u32,
    _pad: u32,
    expected_revision: u64,
}

/// The four TC programs' fds (of [`TC_PROGRAMS`], in order), shareable across threads.
#[derive(Clone)]
pub struct TcxAttacher {
    programs: Arc<Vec<ProgramFd>>,
}

impl TcxAttacher {
    /// Fds of the loaded programs, cloned.
    pub(super) fn new(progs: &[&SchedClassifier]) -> Result<Self, KernelError> {
        let mut programs = Vec::with_capacity(progs.len());
        for p in progs {
            programs.push(p.fd()?.try_clone()?);
        }
        Ok(Self {
            programs: Arc::new(programs),
        })
    }

    /// Attaches both directions to the interface `ifindex` of the calling thread's current
    /// namespace (the kernel looks the index up there).
    pub fn attach(&self, ifindex: u32, has_eth: bool) -> Result<Vec<OwnedFd>, KernelError> {
        let mut links = Vec::with_capacity(2);
        for (index, (name, eth, ty)) in TC_PROGRAMS.iter().enumerate() {
            if *eth != has_eth {
                continue;
            }
            let prog = self
                .programs
                .get(index)
                .ok_or_else(|| KernelError::Object(format!("program {name}")))?;
            let attach_type = match ty {
                aya::programs::TcAttachType::Ingress => BPF_TCX_INGRESS,
                _ => BPF_TCX_EGRESS,
            };
            // On an error the links made so far are closed (detached) with `links`.
            links.push(link_create(prog, ifindex, attach_type).map_err(|e| {
                KernelError::Netlink(format!("tcx link of {name} to ifindex {ifindex}: {e}"))
            })?);
        }
        Ok(links)
    }
}

fn link_create(prog: &ProgramFd, ifindex: u32, attach_type: u32) -> io::Result<OwnedFd> {
    use std::os::fd::AsFd as _;
    let attr = LinkCreateTcx {
        prog_fd: prog.as_fd().as_raw_fd() as u32,
        target_ifindex: ifindex,
        attach_type,
        flags: 0,
        relative_fd: 0,
        _pad: 0,
        expected_revision: 0,
    };
    // SAFETY: bpf(2) reads `size` bytes of `attr`, a live, initialised repr(C) value.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_LINK_CREATE,
            &attr as *const LinkCreateTcx,
            std::mem::size_of::<LinkCreateTcx>() as u32,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let fd = i32::try_from(fd).map_err(|_| io::Error::other("fd out of range"))?;
    // SAFETY: the kernel returned a new fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}
