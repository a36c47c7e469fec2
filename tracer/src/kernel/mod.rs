//! Kernel side of the live source: loading the eBPF programs, attaching them to interfaces
//! in every watched network namespace, and reading their counters.
pub mod attach;
pub mod btf;
mod error;
pub use crate::kallsyms;
pub mod maps;
pub mod netns;
pub mod shed;

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
};

use aya::{
    maps::{Array, MapData, RingBuf},
    programs::{links::Link as _, tc, BtfTracePoint, KProbe, SchedClassifier, TcAttachType},
    util::KernelVersion,
    Ebpf, EbpfLoader,
};
use tracer_common::{CaptureConfig, KernelOffsets, MAX_SNAPLEN, SKB_WINDOW};

use crate::{ebpf::OBJECT, event::KernelSetup};
pub use error::KernelError;
pub(crate) use error::{effective_capabilities, CAP_SYS_PTRACE};
use error::{is_eperm, load_error};
pub use maps::KernelMaps;

/// What to load.
#[derive(Clone, Debug)]
pub struct ProbeOptions {
    pub ports: Vec<u16>,
    /// Payload bytes after the transport header.
    pub snaplen: u32,
    /// Load and attach the kfree_skb program.
    pub drops: bool,
    /// Kernel-side diagnostics (`-vv`): the programs' `aya-log` statements stay in (why a
    /// packet could not be parsed, which encapsulation was not entered) and are logged under
    /// the target `dnspath::kernel`. Off, the verifier removes them at load.
    pub kernel_log: bool,
}

/// `AYA_LOG_LEVEL` at load: nothing, or everything up to trace.
const KERNEL_LOG_OFF: u8 = 0;
const KERNEL_LOG_ALL: u8 = 0xff;

/// `uname -r`, e.g. `6.1.0-57-amd64`.
pub fn kernel_release() -> String {
    nix::sys::utsname::uname()
        .map(|u| u.release().to_string_lossy().into_owned())
        .unwrap_or_else(|_| "(unknown)".into())
}

/// The optional precise race hook, as named in `stats.kernel.hooks`.
pub const CONFIRM_HOOK: &str = "kprobe+kretprobe/__nf_conntrack_confirm";

/// How the TC programs attach, on every kernel: clsact filters over netlink. A TCX link
/// (Linux ≥ 6.6, aya's default there) waits for an RCU grace period holding the rtnl lock
/// (`tcx_link_attach` → `tcx_entry_sync`), one link at a time: 14 ms each here, 8.3 s of the
/// 10.6 s a node of 110 pods (675 links) took to be ready, and as long again to detach. A
/// clsact filter is added in well under a millisecond (ready in 0.7 s on that node); the
/// price is that filters outlive a killed process, so each start removes ours first.
fn netlink() -> tc::TcAttachOptions {
    tc::TcAttachOptions::Netlink(tc::NlOptions::default())
}

/// TC program names in the object, by framing and direction.
pub const TC_PROGRAMS: [(&str, bool, TcAttachType); 4] = [
    ("dnspath_tc_eth_ingress", true, TcAttachType::Ingress),
    ("dnspath_tc_eth_egress", true, TcAttachType::Egress),
    ("dnspath_tc_raw_ingress", false, TcAttachType::Ingress),
    ("dnspath_tc_raw_egress", false, TcAttachType::Egress),
];

/// Maps shared by every instance of the object, pinned so that later instances reuse them
/// (`SEEN` and `NEXT_MSG` are only used with BTF, by the one instance; shared, the others
/// cost no kernel memory of their own).
const SHARED_MAPS: [&str; 12] = [
    "EVENTS",
    "DROP_RESERVE",
    "AYA_LOGS",
    "PORTS",
    "LEARNT_PORTS",
    "COUNTERS",
    "FRAGS",
    "SHED_ON",
    "SHED_COUNT",
    "SHED_ACTIVE",
    "SEEN",
    "NEXT_MSG",
];
const BPFFS: &str = "/sys/fs/bpf";
/// `BPF_FS_MAGIC` from include/uapi/linux/magic.h.
const BPF_FS_MAGIC: i64 = 0xcafe4a11;

/// TC programs of one network namespace, on kernels without BTF only: an instance of the
/// object whose `NETNS_COOKIE` says which namespace its events come from. With BTF the
/// primary instance's programs read the namespace from the packet's device and are attached
/// everywhere ([`Probes::shared`]).
struct NetnsPrograms {
    ebpf: Ebpf,
    loaded: [bool; TC_PROGRAMS.len()],
}

/// The TC links (clsact filters) of one interface, owned here rather than by their program:
/// a program keeps its netlink links in a set keyed by (ifindex, priority, handle), which is
/// the same for `lo` (or `eth0`) of two namespaces, and a second such attach of one program
/// would fail.
#[derive(Debug, Default)]
pub struct TcLinks(Vec<tc::SchedClassifierLink>);

/// The loaded programs and maps.
pub struct Probes {
    /// Owns the shared maps and the kfree_skb program.
    primary: Ebpf,
    /// The primary instance's TC programs serve every namespace (they read the packet's
    /// namespace through BTF offsets): loaded and verified once. Without BTF, false, and
    /// each namespace gets an instance of its own in `per_netns`.
    shared: bool,
    per_netns: HashMap<u64, NetnsPrograms>,
    pin_dir: PathBuf,
    config: CaptureConfig,
    pub drops_enabled: bool,
    /// What could be set up on this kernel (said at start and in the final stats).
    pub setup: KernelSetup,
    /// Filters with our programs' names are removed before attaching (a killed earlier
    /// run's): only while the first scan attaches, and only if no other dnspath runs here
    /// (they may be its). Interfaces found later are new: nothing of an earlier run's is on
    /// them, and another dnspath started meanwhile may have attached there first.
    clean_stale: bool,
    /// This process's [`INSTANCE_SOCKET`], held while it runs.
    _instance: Option<std::os::unix::net::UnixListener>,
    /// The conntrack-confirm kprobes are attached (drops then say whether the confirm failed).
    pub confirm_hook: bool,
    /// Names of the kernel's drop reasons (`enum skb_drop_reason`), read from its BTF with
    /// the struct offsets (one parse of the BTF, tens of MiB while it lasts); empty without
    /// drops or BTF.
    pub drop_reasons: HashMap<u32, String>,
    /// `AYA_LOG_LEVEL` every instance is loaded with.
    log_level: &'static u8,
    /// Reader of the programs' diagnostics, with [`ProbeOptions::kernel_log`].
    kernel_log: Option<maps::KernelLog>,
}

fn ensure_bpffs() -> Result<(), KernelError> {
    let is_bpffs = nix::sys::statfs::statfs(BPFFS)
        .map(|s| s.filesystem_type().0 == BPF_FS_MAGIC)
        .unwrap_or(false);
    if !is_bpffs {
        nix::mount::mount(
            Some("bpf"),
            BPFFS,
            Some("bpf"),
            nix::mount::MsFlags::empty(),
            None::<&str>,
        )
        .map_err(|e| KernelError::Permission(format!("mounting bpffs at {BPFFS}: {e}")))?;
    }
    Ok(())
}

/// Prefix of the abstract unix socket (`@dnspath-instance-PID`) every running dnspath binds.
/// It belongs to the network namespace, as the TC filters do, and goes away with its process
/// however that ends; pin directories are per bpffs mount, and `ip netns exec` and
/// containers give each run a mount of its own, where another run's cannot be seen.
const INSTANCE_SOCKET: &str = "dnspath-instance-";

/// Binds this process's instance socket (kept for its lifetime), and says whether another
/// dnspath has one in this network namespace (`/proc/net/unix`).
fn claim_instance() -> (Option<std::os::unix::net::UnixListener>, bool) {
    use std::os::linux::net::SocketAddrExt as _;
    let own = format!("{INSTANCE_SOCKET}{}", std::process::id());
    let listener = std::os::unix::net::SocketAddr::from_abstract_name(own.as_bytes())
        .and_then(|a| std::os::unix::net::UnixListener::bind_addr(&a))
        .map_err(|e| log::debug!("instance socket @{own}: {e}"))
        .ok();
    let other = std::fs::read_to_string("/proc/net/unix").is_ok_and(|t| {
        t.lines().any(|l| {
            l.split_whitespace().last().is_some_and(|path| {
                path.strip_prefix('@')
                    .is_some_and(|n| n.starts_with(INSTANCE_SOCKET) && n != own)
            })
        })
    });
    (listener, other)
}

/// Removes pin directories of earlier runs whose process is gone; returns the pid of
/// another dnspath that is still running, if any.
fn remove_stale_pins() -> Option<u32> {
    let dir = std::fs::read_dir(BPFFS).ok()?;
    let own = std::process::id();
    let mut other = None;
    for e in dir.flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix("dnspath-"))
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if Path::new("/proc").join(pid.to_string()).exists() {
            if pid != own {
                other = Some(pid);
            }
        } else {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
    other
}

impl Probes {
    fn loader<'a>(
        pin_dir: &Path,
        config: &'a CaptureConfig,
        offsets: &'a KernelOffsets,
        cookie: &'a u64,
        log_level: &'static u8,
    ) -> EbpfLoader<'a> {
        let mut loader = EbpfLoader::new();
        // No kernel BTF for relocations: the object has no CO-RE relocations (Rust eBPF
        // makes none; `object_has_no_core_relocations` checks), and aya's default parses
        // the kernel's BTF (tens of MiB, most of start-up's memory peak) for every
        // namespace's instance.
        loader
            .btf(None)
            .override_global(aya_log::LEVEL, log_level, true)
            .override_global("CONFIG", config, true)
            .override_global("KERNEL_OFFSETS", offsets, true)
            .override_global("NETNS_COOKIE", cookie, true);
        for name in SHARED_MAPS {
            loader.map_pin_path(name, pin_dir.join(name));
        }
        loader
    }

    pub fn load(opts: &ProbeOptions) -> Result<Self, KernelError> {
        Self::load_adjusted(opts, |_| {})
    }

    /// As [`Probes::load`], with the offsets read from BTF changed by `adjust` before the
    /// programs see them (tests take the kfree_skb program's other paths with it).
    fn load_adjusted(
        opts: &ProbeOptions,
        adjust: impl FnOnce(&mut KernelOffsets),
    ) -> Result<Self, KernelError> {
        if nix::unistd::geteuid().as_raw() != 0 {
            return Err(KernelError::Permission(format!(
                "running as uid {}",
                nix::unistd::geteuid()
            )));
        }
        let version = KernelVersion::current().ok();
        let at_least = |a, b| version.is_some_and(|v| v >= KernelVersion::new(a, b, 0));
        let mut setup = KernelSetup {
            release: kernel_release(),
            tc_attach: "clsact",
            hooks: vec!["tc"],
            netns_id: netns::netns_id_kind().as_str(),
            ..Default::default()
        };
        // The kernel's BTF gives the struct offsets the TC programs read a packet's namespace
        // with (one program set for every namespace) and the drop program needs, and the
        // drop reasons' names; without it both degrade, neither fails.
        let mut offsets = KernelOffsets::UNSET;
        let mut drop_reasons = HashMap::new();
        // Read once: the drop program's load takes its hook's type id from the same reading
        // (`KernelBtf::for_tracepoint`), made now so that the file is handed back before the
        // object is loaded.
        let drop_hook_btf = match btf::KernelBtf::load().and_then(|b| Ok((b.kernel_offsets()?, b)))
        {
            Ok((o, b)) => {
                offsets = o;
                if opts.drops {
                    drop_reasons = b.drop_reasons();
                }
                opts.drops.then(|| b.for_tracepoint("kfree_skb"))
            }
            Err(e) => {
                if opts.drops {
                    setup.degraded.push(format!("kernel drops not traced: {e}"));
                }
                setup.degraded.push(format!(
                    "the TC programs are loaded and verified once per namespace (no struct \
                     offsets for reading a packet's namespace: {e})"
                ));
                None
            }
        };
        adjust(&mut offsets);
        let shared = offsets.skb_dev != 0 && offsets.dev_nd_net != 0;
        crate::memory::release_freed();
        if opts.drops && offsets.skb_head != 0 && offsets.has_skb_window == 0 {
            setup.degraded.push(format!(
                "kfree_skb reads skb->network_header, tail and head one by one (at {}, {}, {}: \
                 not in one {SKB_WINDOW}-byte window of sk_buff): every freed packet costs two \
                 more helper calls",
                offsets.skb_network_header, offsets.skb_tail, offsets.skb_head
            ));
        }
        let config = CaptureConfig {
            snaplen: opts.snaplen.min(MAX_SNAPLEN),
            _reserved: 0,
        };
        ensure_bpffs()?;
        let other_pinned = remove_stale_pins();
        let (instance, other_bound) = claim_instance();
        let pin_dir = Path::new(BPFFS).join(format!("dnspath-{}", std::process::id()));
        std::fs::create_dir_all(&pin_dir)?;
        let mut probes_dir_guard = PinDirGuard(Some(pin_dir.clone()));
        let log_level = if opts.kernel_log {
            &KERNEL_LOG_ALL
        } else {
            &KERNEL_LOG_OFF
        };
        let mut primary =
            match Self::loader(&pin_dir, &config, &offsets, &0, log_level).load(OBJECT) {
                Ok(p) => p,
                Err(e) => {
                    let e = KernelError::from(e);
                    if is_eperm(&e) {
                        return Err(KernelError::Permission(e.to_string()));
                    }
                    // Creating the maps is what fails on kernels without a BPF ring buffer.
                    if !at_least(5, 8) {
                        return Err(KernelError::MissingHook {
                            hook: "BPF ring buffer (Linux ≥ 5.8)",
                            detail: format!("Linux {} is too old: {e}", setup.release),
                        });
                    }
                    return Err(e);
                }
            };
        {
            let mut ports: Array<&mut MapData, u8> = Array::try_from(
                primary
                    .map_mut("PORTS")
                    .ok_or_else(|| KernelError::Object("map PORTS".into()))?,
            )?;
            for p in &opts.ports {
                ports.set(u32::from(*p), tracer_common::PORT_EVERYWHERE, 0)?;
            }
        }
        // The TC programs go through the verifier now, once, so that a rejection is one
        // error at start rather than a failure on every interface.
        for (name, _, _) in TC_PROGRAMS {
            let prog: &mut SchedClassifier = program(&mut primary, name)?.try_into()?;
            prog.load().map_err(|e| load_error(name, e))?;
        }
        let mut drops_enabled = false;
        if let (true, Some(btf)) = (offsets.skb_head != 0, drop_hook_btf) {
            match btf.and_then(|btf| Self::attach_drops(&mut primary, &btf, at_least(5, 17))) {
                Ok((hook, with_reason)) => {
                    drops_enabled = true;
                    setup.hooks.push(hook);
                    setup.drop_reason = with_reason;
                    if !with_reason {
                        setup.degraded.push(
                            "drops have no reason (tp_btf/kfree_skb has no reason argument before Linux 5.17); location only".into(),
                        );
                    }
                }
                Err(e @ KernelError::Permission(_)) => return Err(e),
                Err(e) => setup.degraded.push(format!("kernel drops not traced: {e}")),
            }
        }
        let mut confirm_hook = false;
        if drops_enabled {
            match Self::attach_confirm_hook(&mut primary) {
                Ok(()) => {
                    confirm_hook = true;
                    setup.hooks.push(CONFIRM_HOOK);
                }
                Err(e) => setup.degraded.push(format!(
                    "race verdicts from conntrack counters only: {CONFIRM_HOOK} unavailable ({e})"
                )),
            }
        }
        let mut kernel_log = None;
        if opts.kernel_log {
            match aya_log::EbpfLogger::init(&mut primary) {
                Ok(l) => kernel_log = Some(l),
                Err(e) => setup
                    .degraded
                    .push(format!("no kernel diagnostics (-vv): {e}")),
            }
        }
        probes_dir_guard.0 = None;
        Ok(Self {
            log_level,
            kernel_log,
            primary,
            shared,
            per_netns: HashMap::new(),
            pin_dir,
            config,
            drops_enabled,
            setup,
            clean_stale: other_pinned.is_none() && !other_bound,
            _instance: instance,
            confirm_hook,
            drop_reasons,
        })
    }

    /// The optional precise race hook: kprobe + kretprobe on `__nf_conntrack_confirm`.
    /// Needs CONFIG_KPROBES and the symbol (the `nf_conntrack` module loaded).
    fn attach_confirm_hook(ebpf: &mut Ebpf) -> Result<(), KernelError> {
        if !Path::new("/sys/bus/event_source/devices/kprobe").exists() {
            return Err(KernelError::MissingHook {
                hook: "kprobes",
                detail: "this kernel has none (CONFIG_KPROBES off)".into(),
            });
        }
        for name in ["dnspath_confirm_entry", "dnspath_confirm_exit"] {
            let prog: &mut KProbe = program(ebpf, name)?.try_into()?;
            prog.load().map_err(|e| load_error(name, e))?;
            prog.attach("__nf_conntrack_confirm", 0)?;
        }
        Ok(())
    }

    /// Loads and attaches the drop program: the variant with the `reason` argument where the
    /// kernel has it (≥ 5.17), else (or if the verifier refuses it) the one without.
    fn attach_drops(
        ebpf: &mut Ebpf,
        btf: &aya::Btf,
        reason_expected: bool,
    ) -> Result<(&'static str, bool), KernelError> {
        const HOOK: &str = "tp_btf/kfree_skb";
        let variants: &[(&'static str, bool)] = if reason_expected {
            &[
                ("dnspath_kfree_skb", true),
                ("dnspath_kfree_skb_noreason", false),
            ]
        } else {
            &[("dnspath_kfree_skb_noreason", false)]
        };
        let mut last = None;
        for (name, with_reason) in variants {
            let prog: &mut BtfTracePoint = program(ebpf, name)?.try_into()?;
            match prog.load("kfree_skb", btf) {
                Ok(()) => {}
                Err(e) => {
                    let e = load_error(name, e);
                    if matches!(e, KernelError::Permission(_)) {
                        return Err(e);
                    }
                    log::debug!("{e}");
                    last = Some(e);
                    continue;
                }
            }
            prog.attach().map_err(|e| KernelError::MissingHook {
                hook: HOOK,
                detail: e.to_string(),
            })?;
            return Ok((HOOK, *with_reason));
        }
        Err(last.unwrap_or(KernelError::MissingHook {
            hook: HOOK,
            detail: "no variant of the drop program".into(),
        }))
    }

    /// The ring buffer all events arrive on; can be taken once.
    pub fn take_events(&mut self) -> Result<RingBuf<MapData>, KernelError> {
        let map = self
            .primary
            .take_map("EVENTS")
            .ok_or_else(|| KernelError::Object("EVENTS ring buffer (already taken)".into()))?;
        Ok(RingBuf::try_from(map)?)
    }

    /// The drops' reserve ring (where a drop goes when `EVENTS` is full); can be taken once.
    pub fn take_drop_reserve(&mut self) -> Result<RingBuf<MapData>, KernelError> {
        let map = self.primary.take_map("DROP_RESERVE").ok_or_else(|| {
            KernelError::Object("DROP_RESERVE ring buffer (already taken)".into())
        })?;
        Ok(RingBuf::try_from(map)?)
    }

    /// The maps the run loop uses every turn, on handles of their own, and the reader of
    /// the programs' diagnostics (taken: a second call has none): the loop needs no lock
    /// the interface watcher holds.
    pub fn maps(&mut self) -> Result<KernelMaps, KernelError> {
        KernelMaps::open(&self.pin_dir, self.kernel_log.take())
    }

    /// Runs TC program `index` (of [`TC_PROGRAMS`]) once on `frame` with
    /// `BPF_PROG_TEST_RUN`, as if the frame had passed the hook: the kernel programs tested
    /// on crafted frames without a lab. Events go to the ring buffer as usual; returns the
    /// program's verdict.
    pub fn test_run_tc(&mut self, index: usize, frame: &[u8]) -> Result<u32, KernelError> {
        Ok(self.test_run_tc_repeat(index, frame, 1)?.0)
    }

    /// As [`Probes::test_run_tc`], `repeat` times in the kernel: the verdict and the
    /// kernel's mean time per run (no `bpf_stats` timestamps around each run), for the cost
    /// benchmark.
    pub fn test_run_tc_repeat(
        &mut self,
        index: usize,
        frame: &[u8],
        repeat: u32,
    ) -> Result<(u32, std::time::Duration), KernelError> {
        use aya::programs::{TestRun as _, TestRunOptions};
        let (name, _, _) = TC_PROGRAMS
            .get(index)
            .ok_or_else(|| KernelError::Object(format!("TC program {index}")))?;
        let prog: &mut SchedClassifier = program(&mut self.primary, name)?.try_into()?;
        let mut opts = TestRunOptions::new();
        opts.data_in = Some(frame);
        opts.repeat = repeat;
        let r = prog.test_run(opts)?;
        Ok((r.return_value, r.duration))
    }

    /// Time and runs of each loaded program of the primary instance so far, from
    /// `/proc/self/fdinfo` (`run_time_ns`, `run_cnt`; counted only while the kernel's BPF
    /// statistics are on: `kernel.bpf_stats_enabled` or a `BPF_ENABLE_STATS` descriptor).
    pub fn run_stats(&self) -> Vec<(String, u64, u64)> {
        use std::os::fd::{AsFd as _, AsRawFd as _};
        self.primary
            .programs()
            .filter_map(|(name, p)| {
                let fd = p.fd().ok()?.as_fd().as_raw_fd();
                let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{fd}")).ok()?;
                let field = |key: &str| {
                    info.lines()
                        .find_map(|l| l.strip_prefix(key))
                        .and_then(|v| v.trim().parse::<u64>().ok())
                };
                Some((name.to_owned(), field("run_time_ns:")?, field("run_cnt:")?))
            })
            .collect()
    }

    /// Instructions the verifier processed for each loaded program of the primary instance
    /// (`None` before Linux 5.16, which does not report it): the load-time cost that decides
    /// whether a slow machine loads the programs in time.
    pub fn verified_insns(&self) -> Vec<(String, Option<u32>)> {
        self.primary
            .programs()
            .filter_map(|(name, p)| {
                let info = p.info().ok()?;
                Some((name.to_owned(), info.verified_instruction_count()))
            })
            .collect()
    }

    /// The first scan is done: from now on interfaces are new, and no filter of ours is
    /// removed before attaching (see [`Probes::clean_stale`]).
    pub fn initial_attach_done(&mut self) {
        self.clean_stale = false;
    }

    /// Whether one program set serves every namespace (see [`Probes::shared`]).
    pub fn shared_programs(&self) -> bool {
        self.shared
    }

    /// The TC program `index` for the namespace with `cookie`: the primary instance's (loaded
    /// at start) where it serves every namespace, else the namespace's own instance, loaded
    /// on first use.
    fn tc_program(
        &mut self,
        cookie: u64,
        index: usize,
    ) -> Result<&mut SchedClassifier, KernelError> {
        let (name, _, _) = TC_PROGRAMS[index];
        if self.shared {
            return Ok(program(&mut self.primary, name)?.try_into()?);
        }
        let instance = match self.per_netns.entry(cookie) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => {
                let offsets = KernelOffsets::UNSET;
                let ebpf = Self::loader(
                    &self.pin_dir,
                    &self.config,
                    &offsets,
                    &cookie,
                    self.log_level,
                )
                .load(OBJECT)?;
                v.insert(NetnsPrograms {
                    ebpf,
                    loaded: [false; TC_PROGRAMS.len()],
                })
            }
        };
        let prog: &mut SchedClassifier = program(&mut instance.ebpf, name)?.try_into()?;
        if !instance.loaded[index] {
            prog.load().map_err(|e| load_error(name, e))?;
            instance.loaded[index] = true;
        }
        Ok(prog)
    }

    /// Attaches both directions to `iface` of the calling thread's current namespace, whose
    /// cookie is `cookie`. Returns the links, to detach later.
    pub fn attach_tc(
        &mut self,
        cookie: u64,
        iface: &str,
        has_eth: bool,
    ) -> Result<TcLinks, KernelError> {
        // clsact must exist for netlink attachment; remove filters a killed earlier run of
        // ours left (matched by our program names only: clsact filters outlive their
        // process).
        match tc::qdisc_add_clsact(iface) {
            Ok(()) => {}
            Err(tc::TcError::NetlinkError(e)) if e.raw_os_error() == Some(libc::EEXIST) => {}
            Err(e) => return Err(KernelError::Netlink(format!("clsact on {iface}: {e}"))),
        }
        if self.clean_stale {
            for (name, _, ty) in TC_PROGRAMS {
                let _ = tc::qdisc_detach_program(iface, ty, name);
            }
        }
        let mut links = TcLinks::default();
        for (index, (_, eth, ty)) in TC_PROGRAMS.iter().enumerate() {
            if *eth != has_eth {
                continue;
            }
            // Taken out of the program at once (see [`TcLinks`]).
            let attached = self.tc_program(cookie, index).and_then(|p| {
                let id = p.attach_with_options(iface, *ty, netlink())?;
                Ok(p.take_link(id)?)
            });
            match attached {
                Ok(link) => links.0.push(link),
                Err(e) => {
                    self.detach_tc(links);
                    return Err(e);
                }
            }
        }
        Ok(links)
    }

    /// Detaches links from [`Probes::attach_tc`], from inside their interface's namespace
    /// (clsact filters are removed over netlink there); errors (the interface is already
    /// gone) are expected and ignored.
    pub fn detach_tc(&mut self, links: TcLinks) {
        for link in links.0 {
            if let Err(e) = link.detach() {
                log::debug!("detaching a TC link: {e}");
            }
        }
    }

    /// Forgets links whose namespace has gone (and their interfaces and filters with it)
    /// without detaching them: a netlink link detaches by (ifindex, priority, handle) in the
    /// *current* namespace, where those may name a live filter of another interface (every
    /// `lo` is ifindex 1).
    pub fn abandon_tc(&mut self, links: TcLinks) {
        for link in links.0 {
            // A netlink link holds no fd: nothing leaks.
            std::mem::forget(link);
        }
    }

    /// Unloads the programs of a namespace that has gone away (without BTF, where it has
    /// an instance of its own).
    pub fn forget_netns(&mut self, cookie: u64) {
        self.per_netns.remove(&cookie);
    }
}

/// Removes the pin directory if loading fails half-way.
struct PinDirGuard(Option<PathBuf>);

impl Drop for PinDirGuard {
    fn drop(&mut self) {
        if let Some(dir) = self.0.take() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

impl Drop for Probes {
    fn drop(&mut self) {
        // Unpinning only removes names; the maps live while programs and fds use them.
        let _ = std::fs::remove_dir_all(&self.pin_dir);
    }
}

fn program<'a>(
    ebpf: &'a mut Ebpf,
    name: &str,
) -> Result<&'a mut aya::programs::Program, KernelError> {
    ebpf.program_mut(name)
        .ok_or_else(|| KernelError::Object(format!("program {name}")))
}

#[cfg(test)]
mod tests;
