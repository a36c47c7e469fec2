//! Kernel side of the live source: loading the eBPF programs, attaching them to interfaces
//! in every watched network namespace, and reading their counters.
pub mod attach;
pub mod btf;
pub mod kallsyms;
pub mod netns;

use aya::{
    maps::{Array, MapData, PerCpuArray, RingBuf},
    programs::{tc, BtfTracePoint, SchedClassifier, TcAttachType},
    util::KernelVersion,
    Ebpf, EbpfLoader,
};
use tracer_common::{counter, CaptureConfig, KernelOffsets, MAX_SNAPLEN};

use crate::ebpf::OBJECT;

#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error("permission denied: dnspath needs root (CAP_BPF, CAP_NET_ADMIN, CAP_PERFMON, CAP_SYS_ADMIN): {0}")]
    Permission(String),
    #[error("kernel has no BTF ({0} missing): drop tracing (tp_btf/skb:kfree_skb) needs CONFIG_DEBUG_INFO_BTF; run with --no-drops to trace without it")]
    NoBtf(String),
    #[error("kernel BTF: {0}")]
    Btf(String),
    #[error("kernel lacks a needed hook: {hook}: {detail}")]
    MissingHook { hook: &'static str, detail: String },
    #[error("no such interface: {0}")]
    NoSuchInterface(String),
    #[error("network namespace: {0}")]
    Netns(String),
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

fn is_eperm(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            if io.raw_os_error() == Some(libc::EPERM) || io.raw_os_error() == Some(libc::EACCES) {
                return true;
            }
        }
        if err.to_string().contains("Operation not permitted") {
            return true;
        }
        cur = err.source();
    }
    false
}

/// What to load.
#[derive(Clone, Debug)]
pub struct ProbeOptions {
    pub ports: Vec<u16>,
    /// Payload bytes after the transport header.
    pub snaplen: u32,
    /// Load and attach the kfree_skb program.
    pub drops: bool,
}

/// TC program names in the object, by framing and direction.
pub const TC_PROGRAMS: [(&str, bool, TcAttachType); 4] = [
    ("dnspath_tc_eth_ingress", true, TcAttachType::Ingress),
    ("dnspath_tc_eth_egress", true, TcAttachType::Egress),
    ("dnspath_tc_raw_ingress", false, TcAttachType::Ingress),
    ("dnspath_tc_raw_egress", false, TcAttachType::Egress),
];

/// The loaded programs and maps.
pub struct Probes {
    ebpf: Ebpf,
    /// Kernel ≥ 6.6: TC attaches as TCX links, which go away with the process.
    pub tcx: bool,
    pub drops_enabled: bool,
}

impl Probes {
    pub fn load(opts: &ProbeOptions) -> Result<Self, KernelError> {
        let wrap_perm = |e: KernelError| -> KernelError {
            if is_eperm(&e) {
                KernelError::Permission(e.to_string())
            } else {
                e
            }
        };
        if nix::unistd::geteuid().as_raw() != 0 {
            return Err(KernelError::Permission(format!(
                "running as uid {}",
                nix::unistd::geteuid()
            )));
        }
        let offsets = if opts.drops {
            let btf = btf::KernelBtf::load()?;
            btf.kernel_offsets()?
        } else {
            KernelOffsets::UNSET
        };
        let config = CaptureConfig {
            snaplen: opts.snaplen.min(MAX_SNAPLEN),
            _reserved: 0,
        };
        let mut ebpf = EbpfLoader::new()
            .override_global("CONFIG", &config, true)
            .override_global("KERNEL_OFFSETS", &offsets, true)
            .load(OBJECT)
            .map_err(|e| wrap_perm(e.into()))?;

        {
            let mut ports: Array<&mut MapData, u8> = Array::try_from(
                ebpf.map_mut("PORTS")
                    .ok_or_else(|| KernelError::Btf("map PORTS missing from object".into()))?,
            )?;
            for p in &opts.ports {
                ports.set(u32::from(*p), 1, 0)?;
            }
        }
        for (name, _, _) in TC_PROGRAMS {
            let prog: &mut SchedClassifier = program(&mut ebpf, name)?.try_into()?;
            prog.load().map_err(|e| wrap_perm(e.into()))?;
        }
        let mut drops_enabled = false;
        if opts.drops {
            let btf = aya::Btf::from_sys_fs().map_err(|e| KernelError::Btf(e.to_string()))?;
            let prog: &mut BtfTracePoint = program(&mut ebpf, "dnspath_kfree_skb")?.try_into()?;
            prog.load("kfree_skb", &btf).map_err(|e| KernelError::MissingHook {
                hook: "tp_btf/skb:kfree_skb",
                detail: e.to_string(),
            })?;
            prog.attach().map_err(|e| KernelError::MissingHook {
                hook: "tp_btf/skb:kfree_skb",
                detail: e.to_string(),
            })?;
            drops_enabled = true;
        }
        Ok(Self {
            ebpf,
            tcx: KernelVersion::current().is_ok_and(|v| v >= KernelVersion::new(6, 6, 0)),
            drops_enabled,
        })
    }

    /// The ring buffer all events arrive on; can be taken once.
    pub fn take_events(&mut self) -> Result<RingBuf<MapData>, KernelError> {
        let map = self
            .ebpf
            .take_map("EVENTS")
            .ok_or_else(|| KernelError::Btf("EVENTS ring buffer already taken".into()))?;
        Ok(RingBuf::try_from(map)?)
    }

    /// Sums of the per-CPU counters, indexed by `tracer_common::counter`.
    pub fn counters(&self) -> Result<[u64; counter::COUNT as usize], KernelError> {
        let map = self
            .ebpf
            .map("COUNTERS")
            .ok_or_else(|| KernelError::Btf("COUNTERS map missing".into()))?;
        let arr: PerCpuArray<&MapData, u64> = PerCpuArray::try_from(map)?;
        let mut out = [0u64; counter::COUNT as usize];
        for (i, slot) in out.iter_mut().enumerate() {
            let values = arr.get(&(i as u32), 0)?;
            *slot = values.iter().sum();
        }
        Ok(out)
    }

    /// Attaches both directions to `iface` in the calling thread's current namespace.
    /// Returns the link ids to detach later, as (program name, link id).
    pub fn attach_tc(
        &mut self,
        iface: &str,
        has_eth: bool,
    ) -> Result<Vec<(&'static str, tc::SchedClassifierLinkId)>, KernelError> {
        if !self.tcx {
            // clsact must exist for netlink attachment; remove filters a killed earlier run
            // of ours left (matched by our program names only).
            match tc::qdisc_add_clsact(iface) {
                Ok(()) => {}
                Err(tc::TcError::NetlinkError(e)) if e.raw_os_error() == Some(libc::EEXIST) => {}
                Err(e) => return Err(KernelError::Netlink(format!("clsact on {iface}: {e}"))),
            }
            for (name, _, ty) in TC_PROGRAMS {
                let _ = tc::qdisc_detach_program(iface, ty, name);
            }
        }
        let mut links = Vec::new();
        for (name, eth, ty) in TC_PROGRAMS {
            if eth != has_eth {
                continue;
            }
            let prog: &mut SchedClassifier = program(&mut self.ebpf, name)?.try_into()?;
            match prog.attach(iface, ty) {
                Ok(id) => links.push((name, id)),
                Err(e) => {
                    // Undo the half we attached.
                    for (n, id) in links.drain(..) {
                        if let Ok(p) = program(&mut self.ebpf, n)
                            .and_then(|p| <&mut SchedClassifier>::try_from(p).map_err(Into::into))
                        {
                            let _ = p.detach(id);
                        }
                    }
                    return Err(e.into());
                }
            }
        }
        Ok(links)
    }

    /// Detaches links from [`Probes::attach_tc`]; errors (the interface is already gone) are
    /// expected and ignored.
    pub fn detach_tc(&mut self, links: Vec<(&'static str, tc::SchedClassifierLinkId)>) {
        for (name, id) in links {
            if let Ok(p) = program(&mut self.ebpf, name) {
                if let Ok(p) = <&mut SchedClassifier>::try_from(p) {
                    let _ = p.detach(id);
                }
            }
        }
    }
}

fn program<'a>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut aya::programs::Program, KernelError> {
    ebpf.program_mut(name)
        .ok_or_else(|| KernelError::Btf(format!("program {name} missing from object")))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Loads every program through the verifier and reads the counters back.
    #[test]
    fn programs_pass_the_verifier() {
        if nix::unistd::geteuid().as_raw() != 0 {
            eprintln!("skipped: needs root");
            return;
        }
        let probes = Probes::load(&ProbeOptions {
            ports: vec![53],
            snaplen: tracer_common::MAX_SNAPLEN,
            drops: true,
        })
        .unwrap();
        assert!(probes.drops_enabled);
        let c = probes.counters().unwrap();
        assert_eq!(c.len(), counter::COUNT as usize);
    }
}
