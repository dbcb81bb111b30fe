//! The kernel gate: loading, pinning, adopting and unloading the eBPF
//! programs and maps, and reading and writing the maps.
//!
//! Layout of the pin directory (`kernel.pinPath`):
//!
//! | pin | what |
//! |---|---|
//! | `LIMITER_CONFIG` | array, index 0: [`Settings`] (layout version, netns cookie) |
//! | `LIMITER_LIMITS` | array, index port → [`PortLimit`]: read on every SYN |
//! | `LIMITER_LISTED` | hash [`PortKey`] → [`PortLimit`]: the enforced ports (readers' index) |
//! | `LIMITER_STATS` | array, index port → [`PortStats`]: counters of every local port |
//! | `LIMITER_ACTIVE` | hash [`PortKey`] → `u32`: ports with counters (readers' index) |
//! | `LIMITER_REFUSED` | per-CPU hash [`PortKey`] → [`Refusals`]: refusals per port |
//! | `LIMITER_SOCKS` | sk_storage: marks of counted sockets |
//! | `link_sock_ops` | bpf link: `limiter_count` on the cgroup |
//! | `link_sk_lookup` | bpf link: `limiter_refuse` on the network namespace |
//!
//! The gate outlives the daemon: the daemon holds no link, so only removing
//! the link pins (`limiter unload`) detaches the programs.
//!
//! Minimum kernel: 5.15 (see [`env::MIN_KERNEL`]).

pub mod env;

use std::{
    collections::BTreeMap,
    fs, io,
    path::{Path, PathBuf},
};

use aya::{
    EbpfLoader,
    maps::{Array, HashMap, Map, MapData, MapError, PerCpuHashMap},
    programs::{CgroupAttachMode, SkLookup, SockOps, links::FdLink, links::PinnedLink},
};
use limiter_common::{
    LAYOUT_VERSION, PortKey, PortLimit, PortStats, Refusals, Settings, map_names, program_names,
};
use serde::Serialize;

use crate::config::KernelConfig;

/// The kernel programs, built by `build.rs` and embedded in the binary.
static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/limiter"));

/// Pin name of the sock_ops (counting) link.
pub const LINK_COUNT: &str = "link_sock_ops";
/// Pin name of the sk_lookup (refusing) link.
pub const LINK_REFUSE: &str = "link_sk_lookup";
/// Every pin the daemon owns; `unload` removes exactly these.
pub const OWN_PINS: [&str; 9] = [
    LINK_REFUSE,
    LINK_COUNT,
    map_names::LIMITS,
    map_names::LISTED,
    map_names::STATS,
    map_names::ACTIVE,
    map_names::REFUSED,
    map_names::SOCKS,
    map_names::SETTINGS,
];

/// Errors of the kernel gate; each renders as one sentence that says what
/// to do.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error(
        "limiter needs {missing} to load and attach its kernel programs; run it as root \
         (or with CAP_BPF, CAP_NET_ADMIN and CAP_SYS_ADMIN)"
    )]
    Privileges { missing: String },
    #[error("cannot tell the kernel version from /proc/sys/kernel/osrelease ({0:?})")]
    UnknownKernel(String),
    #[error(
        "kernel {}.{} is too old: limiter needs {}.{} or newer (sk_lookup needs 5.9, \
         bpf_get_netns_cookie in sock_ops 5.15)",
        found.0, found.1, env::MIN_KERNEL.0, env::MIN_KERNEL.1
    )]
    KernelTooOld { found: (u32, u32) },
    #[error(
        "no cgroup v2 is mounted (none in /proc/self/mounts): mount one \
         (mount -t cgroup2 none /sys/fs/cgroup/unified) or set kernel.cgroup"
    )]
    NoCgroup2,
    #[error("kernel.cgroup {0} does not exist: create the cgroup or fix the path")]
    CgroupMissing(PathBuf),
    #[error("kernel.cgroup {0} is not a cgroup v2 directory (sock_ops programs attach only to cgroup v2)")]
    NotCgroup2(PathBuf),
    #[error("kernel.netns {0}: {1}")]
    NetnsMissing(PathBuf, String),
    #[error(
        "{0} exists but is not on bpffs: set kernel.pinPath to a directory under a bpffs \
         mount such as /sys/fs/bpf"
    )]
    PinDirNotBpffs(PathBuf),
    #[error("could not mount bpffs on {0} ({1}): mount it yourself with `mount -t bpf bpf {0}`")]
    MountBpffs(PathBuf, String),
    #[error(
        "the pins in {dir} were made by an incompatible limiter ({detail}); run \
         `limiter unload --pin-path {dir}` (this drops the gate's counts) and start again",
        dir = pin_dir.display()
    )]
    IncompatiblePins { pin_dir: PathBuf, detail: String },
    #[error(
        "the gate pinned at {dir} counts the network namespace with cookie {pinned}, but the \
         configuration targets cookie {wanted}: changing kernel.netns needs `limiter unload` first",
        dir = pin_dir.display()
    )]
    NetnsChanged { pin_dir: PathBuf, pinned: u64, wanted: u64 },
    #[error(
        "the gate pinned at {dir} counts the sockets of another cgroup than kernel.cgroup {wanted}: \
         changing kernel.cgroup needs `limiter unload` first",
        dir = pin_dir.display(), wanted = wanted.display()
    )]
    CgroupChanged { pin_dir: PathBuf, wanted: PathBuf },
    #[error("no gate is pinned at {}: start it with `limiter run`", .0.display())]
    NotLoaded(PathBuf),
    #[error("loading the kernel programs failed: {0}")]
    Load(String),
    #[error("{what}: {source}")]
    Io { what: String, source: io::Error },
    #[error("{what}: {source}")]
    Map { what: String, source: MapError },
}

impl KernelError {
    pub(crate) fn io(what: String, source: io::Error) -> Self {
        Self::Io { what, source }
    }

    fn map(what: impl Into<String>) -> impl FnOnce(MapError) -> Self {
        let what = what.into();
        move |source| Self::Map { what, source }
    }

    fn load(e: impl std::fmt::Display) -> Self {
        Self::Load(e.to_string())
    }
}

/// How [`Gate::start`] found the gate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// Programs were loaded and attached now.
    Loaded { mounted_bpffs: bool },
    /// A gate was already pinned and enforcing; it was adopted as it is.
    Adopted,
}

/// Where the gate acts.
#[derive(Clone, Debug, Serialize)]
pub struct Target {
    pub cgroup: PathBuf,
    /// Inode of the cgroup directory (the kernel's cgroup id).
    pub cgroup_id: u64,
    pub netns: PathBuf,
    pub netns_inode: u64,
    pub netns_cookie: u64,
}

/// One change made to the enforced limits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LimitChange {
    Added { port: u16, max: u32 },
    Changed { port: u16, from: u32, to: u32 },
    Removed { port: u16, max: u32 },
}

impl std::fmt::Display for LimitChange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Added { port, max } => write!(f, "+{port}:{max}"),
            Self::Changed { port, from, to } => write!(f, "{port}:{from}->{to}"),
            Self::Removed { port, max } => write!(f, "-{port}:{max}"),
        }
    }
}

/// The state of one local port, as `dump` and `/metrics` show it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PortRow {
    pub port: u16,
    /// `None`: counted, not enforced.
    pub limit: Option<u32>,
    pub dry_run: bool,
    pub established: u64,
    pub high_watermark: u64,
    pub admitted: u64,
    pub refused: u64,
    pub would_refuse: u64,
}

/// One pinned link and the program behind it.
#[derive(Clone, Debug, Serialize)]
pub struct LinkRow {
    pub pin: String,
    pub link_id: Option<u32>,
    pub program_id: Option<u32>,
}

/// Everything the maps and link pins say.
#[derive(Clone, Debug, Serialize)]
pub struct Snapshot {
    pub pin_path: PathBuf,
    pub layout_version: u32,
    pub netns_cookie: u64,
    pub untracked_sockets: u64,
    pub links: Vec<LinkRow>,
    pub ports: Vec<PortRow>,
}

/// Open handles on a pinned gate's maps.
pub struct Gate {
    pin_dir: PathBuf,
    limits: Array<MapData, PortLimit>,
    listed: HashMap<MapData, PortKey, PortLimit>,
    stats: Array<MapData, PortStats>,
    active: HashMap<MapData, PortKey, u32>,
    refused: PerCpuHashMap<MapData, PortKey, Refusals>,
    settings: Array<MapData, Settings>,
}

impl std::fmt::Debug for Gate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gate").field("pin_dir", &self.pin_dir).finish_non_exhaustive()
    }
}

/// What a pin directory holds of ours.
enum PinState {
    Empty,
    /// Both links pinned: a gate is enforcing.
    Complete,
    /// Some of our pins but not both links: a load that died half-way.
    Partial(Vec<PathBuf>),
}

fn pin_state(pin_dir: &Path) -> PinState {
    let present: Vec<PathBuf> =
        OWN_PINS.iter().map(|name| pin_dir.join(name)).filter(|p| p.exists()).collect();
    if present.is_empty() {
        PinState::Empty
    } else if pin_dir.join(LINK_COUNT).exists() && pin_dir.join(LINK_REFUSE).exists() {
        PinState::Complete
    } else {
        PinState::Partial(present)
    }
}

/// Removes pins (links first, so nothing runs against half-removed maps)
/// when a load fails part-way.
struct PinRollback(Vec<PathBuf>);

impl Drop for PinRollback {
    fn drop(&mut self) {
        for path in self.0.iter().rev() {
            let _ = fs::remove_file(path);
        }
    }
}

impl Gate {
    /// Probes the environment, then adopts the gate pinned at
    /// `config.pin_path` or loads and attaches a new one, and applies
    /// `config.ports`.
    pub fn start(config: &KernelConfig) -> Result<(Self, Origin, Target, Vec<LimitChange>), KernelError> {
        env::check_privileges()?;
        env::check_kernel(env::kernel_version()?)?;
        let cgroup = match &config.cgroup {
            Some(path) => path.clone(),
            None => env::cgroup2_mount()?,
        };
        let cgroup_fd = env::open_cgroup(&cgroup)?;
        let netns = config.netns.clone().unwrap_or_else(|| PathBuf::from("/proc/self/ns/net"));
        let netns_fd = env::open_netns(&netns)?;
        let target = Target {
            cgroup_id: std::os::unix::fs::MetadataExt::ino(
                &cgroup_fd
                    .metadata()
                    .map_err(|e| KernelError::io(format!("reading {}", cgroup.display()), e))?,
            ),
            netns_inode: env::netns_inode(&netns_fd),
            netns_cookie: env::netns_cookie(&netns_fd)?,
            cgroup,
            netns,
        };
        let pin_dir = config.pin_path.clone();
        let mounted_bpffs = env::ensure_bpffs(&pin_dir)?;

        match pin_state(&pin_dir) {
            PinState::Complete => {
                let mut gate = Self::open(&pin_dir)?;
                let settings = gate.settings()?;
                let pinned = settings.netns_cookie;
                if pinned != target.netns_cookie {
                    return Err(KernelError::NetnsChanged { pin_dir, pinned, wanted: target.netns_cookie });
                }
                if settings.cgroup_id != target.cgroup_id {
                    return Err(KernelError::CgroupChanged { pin_dir, wanted: target.cgroup });
                }
                let changes = gate.set_limits(&config.ports)?;
                return Ok((gate, Origin::Adopted, target, changes));
            }
            PinState::Partial(stale) => {
                tracing::warn!(
                    pins = ?stale,
                    "removing the pins of a gate whose load never completed (no link was pinned)"
                );
                for path in stale {
                    fs::remove_file(&path)
                        .map_err(|e| KernelError::io(format!("removing stale pin {}", path.display()), e))?;
                }
            }
            PinState::Empty => {}
        }

        let mut rollback = PinRollback(Vec::new());
        let mut ebpf = EbpfLoader::new().load(EBPF_OBJECT).map_err(KernelError::load)?;
        {
            let map = ebpf.map_mut(map_names::SETTINGS).ok_or_else(|| missing(map_names::SETTINGS))?;
            let mut settings: Array<&mut MapData, Settings> =
                Array::try_from(map).map_err(KernelError::map("opening the settings map"))?;
            let value = Settings {
                layout_version: LAYOUT_VERSION,
                netns_cookie: target.netns_cookie,
                cgroup_id: target.cgroup_id,
                ..Settings::default()
            };
            settings.set(0, value, 0).map_err(KernelError::map("writing the settings map"))?;
        }
        for name in map_names::ALL {
            let path = pin_dir.join(name);
            let map = ebpf.map(name).ok_or_else(|| missing(name))?;
            map.pin(&path).map_err(|e| KernelError::Load(format!("pinning {}: {e}", path.display())))?;
            rollback.0.push(path);
        }
        // Limits before attaching: enforcement starts with the first SYN.
        let mut gate = Self::open(&pin_dir)?;
        let changes = gate.set_limits(&config.ports)?;

        // Counting first, so the refusal never reads a count nobody keeps.
        let count: &mut SockOps = ebpf
            .program_mut(program_names::COUNT)
            .ok_or_else(|| missing(program_names::COUNT))?
            .try_into()
            .map_err(KernelError::load)?;
        count.load().map_err(|e| KernelError::Load(format!("{}: {e}", program_names::COUNT)))?;
        let id = count.attach(&cgroup_fd, CgroupAttachMode::Single).map_err(|e| {
            KernelError::Load(format!(
                "attaching {} to {}: {e}",
                program_names::COUNT,
                target.cgroup.display()
            ))
        })?;
        let link: FdLink =
            count.take_link(id).map_err(KernelError::load)?.try_into().map_err(KernelError::load)?;
        pin_link(link, &pin_dir.join(LINK_COUNT), &mut rollback)?;

        let refuse: &mut SkLookup = ebpf
            .program_mut(program_names::REFUSE)
            .ok_or_else(|| missing(program_names::REFUSE))?
            .try_into()
            .map_err(KernelError::load)?;
        refuse.load().map_err(|e| KernelError::Load(format!("{}: {e}", program_names::REFUSE)))?;
        let id = refuse.attach(&netns_fd).map_err(|e| {
            KernelError::Load(format!(
                "attaching {} to {}: {e}",
                program_names::REFUSE,
                target.netns.display()
            ))
        })?;
        let link: FdLink = refuse.take_link(id).map_err(KernelError::load)?.into();
        pin_link(link, &pin_dir.join(LINK_REFUSE), &mut rollback)?;

        rollback.0.clear();
        Ok((gate, Origin::Loaded { mounted_bpffs }, target, changes))
    }

    /// Opens the maps pinned in `pin_dir`, checking their layout.
    pub fn open(pin_dir: &Path) -> Result<Self, KernelError> {
        if !pin_dir.join(map_names::SETTINGS).exists() {
            return Err(KernelError::NotLoaded(pin_dir.to_path_buf()));
        }
        let incompatible =
            |detail: String| KernelError::IncompatiblePins { pin_dir: pin_dir.to_path_buf(), detail };
        let open = |name: &str| -> Result<Map, KernelError> {
            let data = MapData::from_pin(pin_dir.join(name)).map_err(|e| match e {
                MapError::SyscallError(ref s) if s.io_error.kind() == io::ErrorKind::NotFound => {
                    incompatible(format!("map {name} is missing"))
                }
                MapError::SyscallError(ref s)
                    if s.io_error.raw_os_error() == Some(libc::EPERM)
                        || s.io_error.raw_os_error() == Some(libc::EACCES) =>
                {
                    KernelError::Privileges { missing: "CAP_BPF".into() }
                }
                other => KernelError::Map { what: format!("opening pinned map {name}"), source: other },
            })?;
            Map::from_map_data(data).map_err(|e| incompatible(format!("map {name}: {e}")))
        };
        let settings: Array<MapData, Settings> = Array::try_from(open(map_names::SETTINGS)?)
            .map_err(|e| incompatible(format!("map {}: {e}", map_names::SETTINGS)))?;
        let version =
            settings.get(&0, 0).map_err(KernelError::map("reading the settings map"))?.layout_version;
        if version != LAYOUT_VERSION {
            return Err(incompatible(format!(
                "layout version {version}, this limiter uses {LAYOUT_VERSION}"
            )));
        }
        let bad = |name: &'static str| move |e: MapError| incompatible(format!("map {name}: {e}"));
        Ok(Self {
            pin_dir: pin_dir.to_path_buf(),
            limits: Array::try_from(open(map_names::LIMITS)?).map_err(bad(map_names::LIMITS))?,
            listed: HashMap::try_from(open(map_names::LISTED)?).map_err(bad(map_names::LISTED))?,
            stats: Array::try_from(open(map_names::STATS)?).map_err(bad(map_names::STATS))?,
            active: HashMap::try_from(open(map_names::ACTIVE)?).map_err(bad(map_names::ACTIVE))?,
            refused: PerCpuHashMap::try_from(open(map_names::REFUSED)?).map_err(bad(map_names::REFUSED))?,
            settings,
        })
    }

    pub fn settings(&self) -> Result<Settings, KernelError> {
        self.settings.get(&0, 0).map_err(KernelError::map("reading the settings map"))
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

    /// Makes the enforced ports exactly `ports`, entry by entry (each
    /// update is atomic in the kernel; established connections are never
    /// touched). Returns what changed.
    pub fn set_limits(&mut self, ports: &BTreeMap<u16, u32>) -> Result<Vec<LimitChange>, KernelError> {
        let current = self.limits()?;
        let mut changes = Vec::new();
        for (&port, &max) in ports {
            let old = current.get(&port);
            if old.map(|l| l.max_established) != Some(max) {
                changes.push(match old {
                    Some(l) => LimitChange::Changed { port, from: l.max_established, to: max },
                    None => LimitChange::Added { port, max },
                });
            }
        }
        for (&port, limit) in &current {
            if !ports.contains_key(&port) {
                changes.push(LimitChange::Removed { port, max: limit.max_established });
            }
        }
        for (done, change) in changes.iter().enumerate() {
            let (port, limit) = match *change {
                LimitChange::Added { port, max } | LimitChange::Changed { port, to: max, .. } => {
                    let flags = current.get(&port).map_or(0, |l| l.flags);
                    (port, PortLimit { max_established: max, flags })
                }
                LimitChange::Removed { port, .. } => (port, PortLimit::default()),
            };
            if let Err(e) = self.write_limit(port, limit) {
                // All or nothing: put back what was already written.
                for undo in &changes[..done] {
                    let port = match *undo {
                        LimitChange::Added { port, .. }
                        | LimitChange::Changed { port, .. }
                        | LimitChange::Removed { port, .. } => port,
                    };
                    let _ = self.write_limit(port, current.get(&port).copied().unwrap_or_default());
                }
                return Err(e);
            }
        }
        Ok(changes)
    }

    /// Writes one port's limit: the array the kernel reads first, then the
    /// readers' index (`max_established == 0` removes it from both).
    fn write_limit(&mut self, port: u16, limit: PortLimit) -> Result<(), KernelError> {
        self.limits
            .set(u32::from(port), limit, 0)
            .map_err(KernelError::map(format!("setting the limit of port {port}")))?;
        let key = PortKey::new(port);
        let indexed = if limit.max_established == 0 {
            self.listed.remove(&key)
        } else {
            self.listed.insert(key, limit, 0)
        };
        indexed.map_err(KernelError::map(format!("indexing the limit of port {port}")))
    }

    /// Reads every counter and link.
    pub fn snapshot(&self) -> Result<Snapshot, KernelError> {
        let settings = self.settings()?;
        let limits = self.limits()?;
        let mut refusals: BTreeMap<u16, Refusals> = BTreeMap::new();
        for item in self.refused.iter() {
            let (key, per_cpu) = item.map_err(KernelError::map("reading the refusals map"))?;
            let sum = per_cpu.iter().fold(Refusals::default(), |a, r| Refusals {
                refused: a.refused + r.refused,
                would_refuse: a.would_refuse + r.would_refuse,
            });
            refusals.insert(key.port, sum);
        }
        let mut ports: Vec<u16> = Vec::new();
        for key in self.active.keys() {
            ports.push(key.map_err(KernelError::map("reading the active ports"))?.port);
        }
        ports.extend(limits.keys().chain(refusals.keys()));
        ports.sort_unstable();
        ports.dedup();
        let mut rows = Vec::with_capacity(ports.len());
        for port in ports {
            let stats = self
                .stats
                .get(&u32::from(port), 0)
                .map_err(KernelError::map(format!("reading the counters of port {port}")))?;
            rows.push(row(port, limits.get(&port), &stats, refusals.get(&port)));
        }
        let links = [LINK_COUNT, LINK_REFUSE]
            .into_iter()
            .map(|pin| {
                let info = PinnedLink::from_pin(self.pin_dir.join(pin))
                    .ok()
                    .map(FdLink::from)
                    .and_then(|l| l.info().ok());
                LinkRow {
                    pin: pin.to_owned(),
                    link_id: info.as_ref().map(|i| i.id()),
                    program_id: info.as_ref().map(|i| i.program_id()),
                }
            })
            .collect();
        Ok(Snapshot {
            pin_path: self.pin_dir.clone(),
            layout_version: settings.layout_version,
            netns_cookie: settings.netns_cookie,
            untracked_sockets: settings.untracked,
            links,
            ports: rows,
        })
    }
}

fn row(port: u16, limit: Option<&PortLimit>, s: &PortStats, r: Option<&Refusals>) -> PortRow {
    let r = r.copied().unwrap_or_default();
    PortRow {
        port,
        limit: limit.map(|l| l.max_established),
        dry_run: limit.is_some_and(|l| l.flags & limiter_common::LIMIT_FLAG_DRY_RUN != 0),
        established: s.established,
        high_watermark: s.high_watermark,
        admitted: s.admitted,
        refused: r.refused,
        would_refuse: r.would_refuse,
    }
}

fn missing(name: &str) -> KernelError {
    KernelError::Load(format!("the embedded object has no `{name}`"))
}

fn pin_link(link: FdLink, path: &Path, rollback: &mut PinRollback) -> Result<(), KernelError> {
    // Dropping the PinnedLink closes our fd: from here only the pin holds
    // the link, so removing the pin is what detaches the program.
    link.pin(path).map_err(|e| KernelError::Load(format!("pinning {}: {e}", path.display())))?;
    rollback.0.push(path.to_path_buf());
    Ok(())
}

/// What `unload` removed and what it left.
#[derive(Debug, Default, Serialize)]
pub struct Unloaded {
    pub removed: Vec<PathBuf>,
    /// Files in the pin directory that are not ours, left alone.
    pub foreign: Vec<PathBuf>,
    pub removed_dir: bool,
}

/// Detaches the gate by removing the daemon's own pins from `pin_dir`
/// (links first), and the directory if nothing else is in it.
pub fn unload(pin_dir: &Path) -> Result<Unloaded, KernelError> {
    if !pin_dir.is_dir() {
        return Err(KernelError::NotLoaded(pin_dir.to_path_buf()));
    }
    let mut out = Unloaded::default();
    for name in OWN_PINS {
        let path = pin_dir.join(name);
        match fs::remove_file(&path) {
            Ok(()) => out.removed.push(path),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(KernelError::io(format!("removing {}", path.display()), e)),
        }
    }
    let entries =
        fs::read_dir(pin_dir).map_err(|e| KernelError::io(format!("reading {}", pin_dir.display()), e))?;
    out.foreign = entries.filter_map(Result::ok).map(|e| e.path()).collect();
    if out.foreign.is_empty() {
        fs::remove_dir(pin_dir).map_err(|e| KernelError::io(format!("removing {}", pin_dir.display()), e))?;
        out.removed_dir = true;
    }
    if out.removed.is_empty() {
        return Err(KernelError::NotLoaded(pin_dir.to_path_buf()));
    }
    Ok(out)
}
