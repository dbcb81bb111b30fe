//! Open handles on a pinned gate's maps, and every read and write the
//! daemon makes through them: port limits, trusted prefixes, the gate's
//! configuration, the XDP interfaces' MACs, and the counters the views
//! read.

use std::{
    collections::BTreeMap,
    fs, io,
    path::{Path, PathBuf},
};

use aya::maps::{
    Array, HashMap, Map, MapData, MapError, PerCpuArray, PerCpuHashMap,
    lpm_trie::{Key, LpmTrie},
};
use limiter_common::{
    ConnBucket, GateConfig, GateCounters, IfMac, LAYOUT_VERSION, LIMIT_FLAG_DRY_RUN, MIGRATES_FROM, PortKey,
    PortLimit, PortStats, Refusals, ShedCounts, ShedPort, SourceSlot, conns, map_names,
};

use super::{
    Incompatible, KernelError, env,
    reach::PinReach,
    source_index::{Groups, ReadCost, SourceIndex},
};
use crate::config::{KernelConfig, Prefix};

/// Open handles on a pinned gate's maps.
pub struct Gate {
    pin_dir: PathBuf,
    /// The pin directory held open: what the views read after the daemon
    /// has dropped its privileges (`reach`).
    reach: PinReach,
    limits: Array<MapData, PortLimit>,
    listed: HashMap<MapData, PortKey, PortLimit>,
    stats: Array<MapData, PortStats>,
    active: HashMap<MapData, PortKey, u32>,
    refused: PerCpuHashMap<MapData, PortKey, Refusals>,
    config: Array<MapData, GateConfig>,
    trusted: LpmTrie<MapData, [u8; 16], u32>,
    counters: PerCpuArray<MapData, GateCounters>,
    /// The source table and its change index, read by what changed.
    sources: SourceIndex,
    ifmac: HashMap<MapData, u32, IfMac>,
    /// Read here for the views; the daemon writes through its own
    /// handle (`shed::ShedFlags`).
    shed: Array<MapData, ShedPort>,
    shed_counts: PerCpuHashMap<MapData, PortKey, ShedCounts>,
    /// Entries of the connection table (`kernel.connectionTableSize`).
    connection_slots: u32,
    /// Map writes that putting back a failed change failed to undo.
    rollback_failures: u64,
    /// Since such a failure, until a change is applied whole: the maps
    /// hold neither the old configuration nor the new one.
    mixed: bool,
}

impl std::fmt::Debug for Gate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gate").field("pin_dir", &self.pin_dir).finish_non_exhaustive()
    }
}

/// One change made to the enforced limits of a port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LimitChange {
    pub port: u16,
    /// `None`: the port had no limits.
    pub from: Option<PortLimit>,
    /// `None`: the port's limits were removed.
    pub to: Option<PortLimit>,
}

fn describe(limit: &PortLimit) -> String {
    let mut parts = Vec::new();
    if limit.max_established != 0 {
        parts.push(format!("max {}", limit.max_established));
    }
    if limit.per_source_max != 0 {
        parts.push(format!("perSource {}", limit.per_source_max));
    }
    if limit.flags & LIMIT_FLAG_DRY_RUN != 0 {
        parts.push("dry-run".into());
    }
    parts.join(" ")
}

impl std::fmt::Display for LimitChange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (&self.from, &self.to) {
            (None, Some(to)) => write!(f, "+{}({})", self.port, describe(to)),
            (Some(from), None) => write!(f, "-{}({})", self.port, describe(from)),
            (Some(from), Some(to)) => write!(f, "{}({} -> {})", self.port, describe(from), describe(to)),
            (None, None) => write!(f, "{}(unchanged)", self.port),
        }
    }
}

impl Gate {
    /// The configuration of the gate pinned in `pin_dir`, whatever its
    /// layout version (from version 2 on, the value has this shape).
    pub(super) fn pinned_config(pin_dir: &Path) -> Result<GateConfig, KernelError> {
        let config = open_config(pin_dir)?;
        config.get(&0, 0).map_err(KernelError::map("reading the gate's configuration"))
    }

    /// Rewrites the layout version of the gate pinned in `pin_dir` (the
    /// last step of a migration), keeping the rest of its configuration.
    pub(super) fn set_layout_version(pin_dir: &Path, version: u32) -> Result<(), KernelError> {
        let mut config = open_config(pin_dir)?;
        let value = config.get(&0, 0).map_err(KernelError::map("reading the gate's configuration"))?;
        config
            .set(0, GateConfig { layout_version: version, ..value }, 0)
            .map_err(KernelError::map("writing the gate's layout version"))
    }

    /// Opens the maps pinned in `pin_dir`, checking their layout.
    pub fn open(pin_dir: &Path) -> Result<Self, KernelError> {
        let incompatible =
            |why| KernelError::IncompatiblePins { pin_dir: pin_dir.to_path_buf(), why: Box::new(why) };
        let open = |name: &'static str| open_pinned(pin_dir, name);
        let config = open_config(pin_dir)?;
        let value = config.get(&0, 0).map_err(KernelError::map("reading the gate's configuration"))?;
        if MIGRATES_FROM.contains(&value.layout_version) {
            return Err(KernelError::NeedsMigration {
                pin_dir: pin_dir.to_path_buf(),
                from: value.layout_version,
            });
        }
        if value.layout_version != LAYOUT_VERSION {
            return Err(incompatible(Incompatible::LayoutVersion(value.layout_version)));
        }
        let fd = |name: &'static str| {
            super::sys::obj_get(&pin_dir.join(name)).map_err(|e| match e.kind() {
                io::ErrorKind::NotFound => incompatible(Incompatible::MissingMap(name)),
                _ => KernelError::io(format!("opening pinned map {name}"), e),
            })
        };
        let bad = |name: &'static str| move |source| incompatible(Incompatible::Map { name, source });
        let sources: Array<MapData, SourceSlot> =
            Array::try_from(open(map_names::SOURCES)?).map_err(bad(map_names::SOURCES))?;
        let expected = u64::from(value.source_mask) + 1;
        if u64::from(sources.len()) != expected {
            return Err(incompatible(Incompatible::SourceTable { found: sources.len(), expected }));
        }
        // Opened for its shape only: nothing here reads its entries.
        let conns: Array<MapData, ConnBucket> =
            Array::try_from(open(map_names::CONNS)?).map_err(bad(map_names::CONNS))?;
        let connection_slots = conns.len().saturating_mul(conns::BUCKET_SLOTS);
        let reach = PinReach::open(pin_dir)
            .map_err(|e| KernelError::io(format!("opening the pin directory {}", pin_dir.display()), e))?;
        Ok(Self {
            pin_dir: pin_dir.to_path_buf(),
            reach,
            limits: Array::try_from(open(map_names::LIMITS)?).map_err(bad(map_names::LIMITS))?,
            listed: HashMap::try_from(open(map_names::LISTED)?).map_err(bad(map_names::LISTED))?,
            stats: Array::try_from(open(map_names::STATS)?).map_err(bad(map_names::STATS))?,
            active: HashMap::try_from(open(map_names::ACTIVE)?).map_err(bad(map_names::ACTIVE))?,
            refused: PerCpuHashMap::try_from(open(map_names::REFUSED)?).map_err(bad(map_names::REFUSED))?,
            trusted: LpmTrie::try_from(open(map_names::TRUSTED)?).map_err(bad(map_names::TRUSTED))?,
            counters: PerCpuArray::try_from(open(map_names::COUNTERS)?).map_err(bad(map_names::COUNTERS))?,
            ifmac: HashMap::try_from(open(map_names::IFMAC)?).map_err(bad(map_names::IFMAC))?,
            shed: Array::try_from(open(map_names::SHED)?).map_err(bad(map_names::SHED))?,
            shed_counts: PerCpuHashMap::try_from(open(map_names::SHED_COUNTS)?)
                .map_err(bad(map_names::SHED_COUNTS))?,
            config,
            connection_slots,
            rollback_failures: 0,
            mixed: false,
            sources: SourceIndex::new(fd(map_names::SOURCES)?, fd(map_names::SRCVER)?, sources.len()),
        })
    }

    /// The directory the maps are pinned in.
    pub(super) fn pin_dir(&self) -> &Path {
        &self.pin_dir
    }

    /// The pin directory reached through the descriptor the gate holds:
    /// the path to open pins by, with or without privileges.
    pub fn reach(&self) -> &Path {
        self.reach.path()
    }

    /// The gate's configuration as the kernel has it.
    pub fn config(&self) -> Result<GateConfig, KernelError> {
        self.config.get(&0, 0).map_err(KernelError::map("reading the gate's configuration"))
    }

    fn write_config(&mut self, value: GateConfig) -> Result<(), KernelError> {
        self.config.set(0, value, 0).map_err(KernelError::map("writing the gate's configuration"))
    }

    /// The enforced ports as the kernel has them now.
    pub fn limits(&self) -> Result<BTreeMap<u16, PortLimit>, KernelError> {
        let mut out = BTreeMap::new();
        for item in self.listed.iter() {
            let (key, limit) = item.map_err(KernelError::map("reading the enforced ports"))?;
            out.insert(key.port, limit);
        }
        Ok(out)
    }

    /// Applies everything reloadable from `config`: port limits, trusted
    /// prefixes and the trusted reserve. All or nothing: on a failed map
    /// write, what was written is put back. Returns the limit changes.
    pub fn apply(&mut self, config: &KernelConfig) -> Result<Vec<LimitChange>, KernelError> {
        let old_config = self.config()?;
        let old_trusted = self.trusted_prefixes()?;
        let changes = self.set_limits(&config.port_limits())?;
        let result = self.set_trusted(&old_trusted, &config.trusted).and_then(|()| {
            self.write_config(GateConfig {
                trusted_reserve: config.trusted_reserve,
                trusted_count: config.trusted.len() as u32,
                ..old_config
            })
        });
        if let Err(e) = result {
            let undone = self.set_trusted(&config.trusted, &old_trusted);
            self.undone("the trusted prefixes", undone);
            let undone = self.write_config(old_config);
            self.undone("the gate's configuration", undone);
            for change in &changes {
                let undone = self.write_limit(change.port, change.from.unwrap_or_default());
                self.undone(&format!("port {}'s limit", change.port), undone);
            }
            return Err(e);
        }
        self.mixed = false;
        Ok(changes)
    }

    /// What putting back a failed change did: a write that failed leaves
    /// the maps in neither configuration, which is logged, counted
    /// (`limiter_kernel_rollback_failures_total`) and said by `/healthz`
    /// until a change is applied whole.
    fn undone(&mut self, what: &str, result: Result<(), KernelError>) {
        if let Err(e) = result {
            self.rollback_failures += 1;
            self.mixed = true;
            tracing::error!(
                error = %e,
                "putting back {what} after a failed change failed: the gate's maps hold neither the old \
                 configuration nor the new one; reload again, or restart the daemon"
            );
        }
    }

    /// Map writes a rollback failed to undo, and whether the maps are in
    /// neither configuration since.
    pub fn rollback_state(&self) -> (u64, bool) {
        (self.rollback_failures, self.mixed)
    }

    /// Makes the enforced ports exactly `ports`, entry by entry (each
    /// update is atomic in the kernel; established connections are never
    /// touched). Returns what changed.
    pub fn set_limits(&mut self, ports: &BTreeMap<u16, PortLimit>) -> Result<Vec<LimitChange>, KernelError> {
        let current = self.limits()?;
        let mut changes = Vec::new();
        for (&port, limit) in ports {
            let old = current.get(&port);
            if old != Some(limit) {
                changes.push(LimitChange { port, from: old.copied(), to: Some(*limit) });
            }
        }
        for (&port, limit) in &current {
            if !ports.contains_key(&port) {
                changes.push(LimitChange { port, from: Some(*limit), to: None });
            }
        }
        for (done, change) in changes.iter().enumerate() {
            if let Err(e) = self.write_limit(change.port, change.to.unwrap_or_default()) {
                // All or nothing: put back what was already written,
                // including this one's array entry if only its index failed.
                for undo in &changes[..=done] {
                    let undone = self.write_limit(undo.port, undo.from.unwrap_or_default());
                    self.undone(&format!("port {}'s limit", undo.port), undone);
                }
                return Err(e);
            }
        }
        Ok(changes)
    }

    /// Writes one port's limit: the array the kernel reads first, then the
    /// readers' index (an all-zero limit removes it from both).
    fn write_limit(&mut self, port: u16, limit: PortLimit) -> Result<(), KernelError> {
        self.limits
            .set(u32::from(port), limit, 0)
            .map_err(KernelError::map(format!("setting the limit of port {port}")))?;
        let key = PortKey::new(port);
        let indexed = if limit.enforced() {
            self.listed.insert(key, limit, 0)
        } else {
            match self.listed.remove(&key) {
                Err(MapError::KeyNotFound) => Ok(()),
                other => other,
            }
        };
        indexed.map_err(KernelError::map(format!("indexing the limit of port {port}")))
    }

    /// The trusted prefixes in the trie, sorted.
    pub(super) fn trusted_prefixes(&self) -> Result<Vec<Prefix>, KernelError> {
        let mut out = Vec::new();
        for key in self.trusted.keys() {
            let key = key.map_err(KernelError::map("reading the trusted prefixes"))?;
            out.push(prefix_of(key.prefix_len(), key.data()));
        }
        out.sort();
        Ok(out)
    }

    /// Moves the trie from `old` to `new` (additions first, so no prefix
    /// that stays trusted is ever missing).
    fn set_trusted(&mut self, old: &[Prefix], new: &[Prefix]) -> Result<(), KernelError> {
        for p in new.iter().filter(|p| !old.contains(p)) {
            let (len, data) = trie_key(p);
            self.trusted
                .insert(&Key::new(len, data), 1, 0)
                .map_err(KernelError::map(format!("adding trusted prefix {p}")))?;
        }
        for p in old.iter().filter(|p| !new.contains(p)) {
            let (len, data) = trie_key(p);
            match self.trusted.remove(&Key::new(len, data)) {
                Ok(()) | Err(MapError::KeyNotFound) => {}
                Err(e) => return Err(KernelError::map(format!("removing trusted prefix {p}"))(e)),
            }
        }
        Ok(())
    }

    /// Records `interface`'s ifindex and MAC (as the gated namespace sees
    /// them) for the XDP program's "addressed to this host" check.
    pub(super) fn remember_mac(&mut self, interface: &str, netns: &fs::File) -> Result<(), KernelError> {
        let (index, mac) = env::interface_mac(netns, interface)?;
        self.ifmac
            .insert(index, IfMac { mac, _pad: [0; 2] }, 0)
            .map_err(KernelError::map(format!("recording the MAC of {interface}")))
    }

    /// The gate-wide counters, summed over the CPUs.
    pub(super) fn counters(&self) -> Result<GateCounters, KernelError> {
        let mut sum = GateCounters::default();
        for c in self.counters.get(&0, 0).map_err(KernelError::map("reading the gate counters"))?.iter() {
            sum.untracked_sockets += c.untracked_sockets;
            sum.untracked_sources += c.untracked_sources;
            sum.walked += c.walked;
        }
        Ok(sum)
    }

    /// Refusals of every port that has any, summed over the CPUs.
    pub(super) fn refusals(&self) -> Result<BTreeMap<u16, Refusals>, KernelError> {
        let mut out = BTreeMap::new();
        for item in self.refused.iter() {
            let (key, per_cpu) = item.map_err(KernelError::map("reading the refusals map"))?;
            let mut sum = Refusals::default();
            per_cpu.iter().for_each(|r| sum.add(r));
            out.insert(key.port, sum);
        }
        Ok(out)
    }

    /// What the shedding did, per port (the CPUs summed).
    pub(super) fn shed_counts(&self) -> Result<BTreeMap<u16, ShedCounts>, KernelError> {
        let mut out = BTreeMap::new();
        for item in self.shed_counts.iter() {
            let (key, per_cpu) = item.map_err(KernelError::map("reading the shedding counters"))?;
            let mut sum = ShedCounts::default();
            per_cpu.iter().for_each(|c| sum.add(c));
            out.insert(key.port, sum);
        }
        Ok(out)
    }

    /// The shedding flag of `port` as the programs read it.
    pub(super) fn shed_flag(&self, port: u16) -> Result<ShedPort, KernelError> {
        self.shed
            .get(&u32::from(port), 0)
            .map_err(KernelError::map(format!("reading the shedding flag of port {port}")))
    }

    /// Ports that ever had a connection counted.
    pub(super) fn active_ports(&self) -> Result<Vec<u16>, KernelError> {
        self.active
            .keys()
            .map(|key| key.map(|k| k.port).map_err(KernelError::map("reading the active ports")))
            .collect()
    }

    /// The counters of `port`.
    pub(super) fn port_stats(&self, port: u16) -> Result<PortStats, KernelError> {
        self.stats
            .get(&u32::from(port), 0)
            .map_err(KernelError::map(format!("reading the counters of port {port}")))
    }

    /// Entries in the connection table.
    pub(super) fn connection_slots(&self) -> u32 {
        self.connection_slots
    }

    /// Slots in the source table.
    pub(super) fn source_slots(&self) -> u32 {
        self.sources.slots()
    }

    /// Groups with connections now (duplicate slots of one group summed),
    /// and the number of slots holding them, read by what changed since
    /// the last call (see [`SourceIndex`]).
    pub(super) fn source_groups(&self) -> Result<(Groups, ReadCost), KernelError> {
        self.sources.groups().map_err(|e| KernelError::io("reading the source table", e))
    }
}

/// Opens the map `name` pinned in `pin_dir`.
pub(super) fn open_pinned(pin_dir: &Path, name: &'static str) -> Result<Map, KernelError> {
    let incompatible =
        |why| KernelError::IncompatiblePins { pin_dir: pin_dir.to_path_buf(), why: Box::new(why) };
    let data = MapData::from_pin(pin_dir.join(name)).map_err(|e| match e {
        MapError::SyscallError(ref s) if s.io_error.kind() == io::ErrorKind::NotFound => {
            incompatible(Incompatible::MissingMap(name))
        }
        // EPERM: bpf(2) itself was refused (no CAP_BPF where unprivileged
        // BPF is off); EACCES: the path or the pin's mode was.
        MapError::SyscallError(ref s) if s.io_error.raw_os_error() == Some(libc::EPERM) => {
            KernelError::Privileges { missing: "CAP_BPF".into() }
        }
        MapError::SyscallError(s) if s.io_error.raw_os_error() == Some(libc::EACCES) => {
            KernelError::io(format!("opening pinned map {}", pin_dir.join(name).display()), s.io_error)
        }
        other => KernelError::Map { what: format!("opening pinned map {name}"), source: other },
    })?;
    Map::from_map_data(data).map_err(|source| incompatible(Incompatible::Map { name, source }))
}

/// The gate's configuration map pinned in `pin_dir`.
fn open_config(pin_dir: &Path) -> Result<Array<MapData, GateConfig>, KernelError> {
    if !pin_dir.join(map_names::CONFIG).exists() {
        return Err(KernelError::NotLoaded(pin_dir.to_path_buf()));
    }
    Array::try_from(open_pinned(pin_dir, map_names::CONFIG)?).map_err(|source| {
        KernelError::IncompatiblePins {
            pin_dir: pin_dir.to_path_buf(),
            why: Box::new(Incompatible::OlderLayout { name: map_names::CONFIG, source }),
        }
    })
}

/// The trie key of a prefix: IPv4 as IPv4-mapped IPv6.
fn trie_key(p: &Prefix) -> (u32, [u8; 16]) {
    match p.addr {
        std::net::IpAddr::V4(a) => (u32::from(p.len) + 96, a.to_ipv6_mapped().octets()),
        std::net::IpAddr::V6(a) => (u32::from(p.len), a.octets()),
    }
}

/// The prefix a trie key stands for (the inverse of [`trie_key`]).
fn prefix_of(len: u32, data: [u8; 16]) -> Prefix {
    let v6 = std::net::Ipv6Addr::from(data);
    match v6.to_ipv4_mapped() {
        Some(v4) if len >= 96 => Prefix { addr: v4.into(), len: (len - 96) as u8 },
        _ => Prefix { addr: v6.into(), len: len as u8 },
    }
}

#[cfg(test)]
mod tests;
