//! The shared maps the run loop reads and writes every turn — the kernel counters, storm
//! shedding's `SHED_*` maps — and the reader of the programs' diagnostics, on handles of
//! their own ([`super::Probes::maps`]): the run loop never waits for the lock the interface
//! watcher holds while it loads and attaches programs in a new namespace. Under pod churn
//! (two namespaces a second in the soak) that wait was ~75 % of the reader's time, and the
//! ring buffer overflowed (most events lost, counted) at under half a core.
use std::path::Path;

use aya::maps::{
    Array, HashMap as BpfHashMap, Map, MapData, PerCpuArray, PerCpuHashMap, PerCpuValues,
};
use tracer_common::{counter, LearntPort, PORT_LEARNT};

use super::KernelError;

/// Reader of the programs' `aya-log` statements (`-vv`).
pub(super) type KernelLog = aya_log::EbpfLogger<&'static dyn log::Log>;

/// Handles on the pinned maps the run loop uses, owned by it.
pub struct KernelMaps {
    counters: PerCpuArray<MapData, u64>,
    shed_on: BpfHashMap<MapData, u64, u8>,
    shed_count: PerCpuHashMap<MapData, u64, u64>,
    shed_active: Array<MapData, u32>,
    /// The watched ports (`PORTS`: `tracer_common::ports`' bits at a port's index).
    ports: Array<MapData, u8>,
    /// Ports captured in one namespace only (`LEARNT_PORTS`).
    learnt_ports: BpfHashMap<MapData, LearntPort, u8>,
    kernel_log: Option<KernelLog>,
}

fn pinned(dir: &Path, name: &str) -> Result<Map, KernelError> {
    let data = MapData::from_pin(dir.join(name))?;
    Ok(Map::from_map_data(data)?)
}

impl KernelMaps {
    /// Opens the maps pinned in `dir` (the primary instance's pins).
    pub(super) fn open(dir: &Path, kernel_log: Option<KernelLog>) -> Result<Self, KernelError> {
        Ok(Self {
            counters: PerCpuArray::try_from(pinned(dir, "COUNTERS")?)?,
            shed_on: BpfHashMap::try_from(pinned(dir, "SHED_ON")?)?,
            shed_count: PerCpuHashMap::try_from(pinned(dir, "SHED_COUNT")?)?,
            shed_active: Array::try_from(pinned(dir, "SHED_ACTIVE")?)?,
            ports: Array::try_from(pinned(dir, "PORTS")?)?,
            learnt_ports: BpfHashMap::try_from(pinned(dir, "LEARNT_PORTS")?)?,
            kernel_log,
        })
    }

    /// Sums of the per-CPU counters, indexed by `tracer_common::counter`.
    pub fn counters(&self) -> Result<[u64; counter::COUNT as usize], KernelError> {
        let mut out = [0u64; counter::COUNT as usize];
        for (i, slot) in out.iter_mut().enumerate() {
            let values = self.counters.get(&(i as u32), 0)?;
            *slot = values.iter().sum();
        }
        Ok(out)
    }

    /// Logs what the kernel programs said since the last call (with
    /// [`super::ProbeOptions::kernel_log`]; otherwise nothing).
    pub fn flush_kernel_log(&mut self) {
        if let Some(l) = self.kernel_log.as_mut() {
            l.flush();
        }
    }

    /// The TC programs capture `port` in namespace `netns` too from now on (a port its DNS
    /// is redirected to): the pair first, then the port's `PORT_LEARNT` bit, which sends its
    /// packets to the pair's lookup. Only the run loop changes that bit; a `--port`'s bit was
    /// set at load.
    pub fn capture_port_in(&mut self, netns: u64, port: u16) -> Result<(), KernelError> {
        self.learnt_ports.insert(learnt(netns, port), 1, 0)?;
        let flags = self.ports.get(&u32::from(port), 0)?;
        self.ports.set(u32::from(port), flags | PORT_LEARNT, 0)?;
        Ok(())
    }

    /// `port` is no longer captured in `netns` (gone); `elsewhere`: another namespace still
    /// has it learnt, so its `PORT_LEARNT` bit stays.
    pub fn release_port_in(
        &mut self,
        netns: u64,
        port: u16,
        elsewhere: bool,
    ) -> Result<(), KernelError> {
        if !elsewhere {
            let flags = self.ports.get(&u32::from(port), 0)?;
            self.ports.set(u32::from(port), flags & !PORT_LEARNT, 0)?;
        }
        match self.learnt_ports.remove(&learnt(netns, port)) {
            Ok(()) | Err(aya::maps::MapError::KeyNotFound) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Storm shedding (`tracer_common::shed`): from now on the TC programs only count the
    /// UDP packets of the question with this hash. `active` is how many questions are shed
    /// with this one.
    pub fn shed_start(&mut self, hash: u64, active: u32) -> Result<(), KernelError> {
        let cpus = aya::util::nr_cpus().map_err(|(what, e)| {
            KernelError::Io(std::io::Error::new(e.kind(), format!("{what}: {e}")))
        })?;
        // The count entry exists, zeroed on every CPU, before the programs can look for it.
        self.shed_count
            .insert(hash, PerCpuValues::try_from(vec![0u64; cpus])?, 0)?;
        self.shed_on.insert(hash, 1, 0)?;
        self.set_shed_active(active)
    }

    /// The TC programs copy this question's packets again; its count stays readable
    /// ([`KernelMaps::shed_count`]) until [`KernelMaps::shed_forget`].
    pub fn shed_stop(&mut self, hash: u64, active: u32) -> Result<(), KernelError> {
        match self.shed_on.remove(&hash) {
            Ok(()) | Err(aya::maps::MapError::KeyNotFound) => {}
            Err(e) => return Err(e.into()),
        }
        self.set_shed_active(active)
    }

    /// Packets of the question counted so far, over all CPUs.
    pub fn shed_count(&self, hash: u64) -> Result<u64, KernelError> {
        match self.shed_count.get(&hash, 0) {
            Ok(v) => Ok(v.iter().sum()),
            Err(aya::maps::MapError::KeyNotFound) => Ok(0),
            Err(e) => Err(e.into()),
        }
    }

    /// Removes the question's count (after its last read).
    pub fn shed_forget(&mut self, hash: u64) -> Result<(), KernelError> {
        match self.shed_count.remove(&hash) {
            Ok(()) | Err(aya::maps::MapError::KeyNotFound) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    fn set_shed_active(&mut self, active: u32) -> Result<(), KernelError> {
        self.shed_active.set(0, active, 0)?;
        Ok(())
    }
}

fn learnt(netns: u64, port: u16) -> LearntPort {
    LearntPort {
        netns,
        port,
        _pad: [0; 6],
    }
}
