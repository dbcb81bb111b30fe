//! The kernel gate: loading, pinning, adopting and unloading the eBPF
//! programs and maps, and reading and writing the maps.
//!
//! Layout of the pin directory (`kernel.pinPath`):
//!
//! | pin | what |
//! |---|---|
//! | `LIMITER_CONFIG` | array, index 0: [`GateConfig`] (layout version, netns cookie) |
//! | `LIMITER_LIMITS` | array, index port → [`PortLimit`]: read on every SYN |
//! | `LIMITER_LISTED` | hash [`PortKey`] → [`PortLimit`]: the enforced ports (readers' index) |
//! | `LIMITER_STATS` | array, index port → [`PortStats`]: counters of every local port |
//! | `LIMITER_ACTIVE` | hash [`PortKey`] → `u32`: ports with counters (readers' index) |
//! | `LIMITER_REFUSED` | per-CPU hash [`PortKey`] → [`Refusals`]: refusals per port |
//! | `LIMITER_SOCKS` | sk_storage: marks of counted sockets |
//! | `LIMITER_SOURCES` | array of [`SourceSlot`]: connections per client group |
//! | `LIMITER_IFMAC` | hash ifindex → [`IfMac`]: MACs of the XDP interfaces |
//! | `LIMITER_TRUSTED` | LPM trie [`TrustedKey`] → `u32`: trusted prefixes |
//! | `LIMITER_COUNTS` | per-CPU array, index 0: [`GateCounters`] |
//! | `LIMITER_WALK` | array, index port → `u32`: scratch of the start-up walk |
//! | `link_sock_ops` | bpf link: `limiter_count` on the cgroup |
//! | `link_sk_lookup` | bpf link: `limiter_refuse` on the network namespace |
//! | `link_xdp_<interface>` | bpf link: `limiter_xdp` on one interface |
//!
//! The gate outlives the daemon: the daemon holds no link, so only removing
//! the link pins (`limiter unload`) detaches the programs.
//!
//! Minimum kernel: 5.19 (see [`env::MIN_KERNEL`]).

pub mod btf;
pub mod env;
#[allow(unsafe_code, reason = "the two bpf(2) calls aya does not expose; see sys.rs")]
mod sys;

use std::{
    collections::BTreeMap,
    fs, io,
    path::{Path, PathBuf},
};

use aya::{
    Btf, EbpfLoader,
    maps::{
        Array, HashMap, Map, MapData, MapError, PerCpuArray, PerCpuHashMap,
        lpm_trie::{Key, LpmTrie},
    },
    programs::{CgroupAttachMode, Iter, SkLookup, SockOps, Xdp, XdpMode, links::FdLink, links::PinnedLink},
};
use limiter_common::{
    GateConfig, GateCounters, IfMac, LAYOUT_VERSION, PortKey, PortLimit, PortStats, Refusals, SourceSlot,
    map_names, path as refusal_path, program_names, reason, source,
};
use serde::Serialize;

use crate::config::{KernelConfig, Prefix, XdpModeChoice};

/// The kernel programs, built by `build.rs` and embedded in the binary.
static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/limiter"));

/// Pin name of the sock_ops (counting) link.
pub const LINK_COUNT: &str = "link_sock_ops";
/// Pin name of the sk_lookup (refusing) link.
pub const LINK_REFUSE: &str = "link_sk_lookup";
/// Pin names of XDP links: this prefix and the interface name.
pub const LINK_XDP_PREFIX: &str = "link_xdp_";
/// Every fixed pin the daemon owns; `unload` removes exactly these and the
/// `link_xdp_*` pins.
pub const OWN_PINS: [&str; 14] = [
    LINK_REFUSE,
    LINK_COUNT,
    map_names::SOURCES,
    map_names::TRUSTED,
    map_names::COUNTERS,
    map_names::WALK,
    map_names::IFMAC,
    map_names::LIMITS,
    map_names::LISTED,
    map_names::STATS,
    map_names::ACTIVE,
    map_names::REFUSED,
    map_names::SOCKS,
    map_names::CONFIG,
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
        "kernel {}.{} is too old: limiter needs {}.{} or newer (a TCP socket iterator that \
         locks each socket, 5.19; bpf_get_netns_cookie in sock_ops, 5.15)",
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
    #[error(
        "the gate pinned at {dir} was created with {key} = {pinned}, and the configuration now says \
         {wanted}: this is fixed when the gate is created; run `limiter unload --pin-path {dir}` \
         (this drops the gate's counts) and start again, or put the old value back",
        dir = pin_dir.display()
    )]
    PinnedShape { pin_dir: PathBuf, key: &'static str, pinned: String, wanted: String },
    #[error("kernel.xdp.interfaces: no interface {0} in the gated network namespace")]
    NoInterface(String),
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
    if limit.flags & limiter_common::LIMIT_FLAG_DRY_RUN != 0 {
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

/// Refusals of one port, by reason and by path.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RefusalRow {
    pub port_full: u64,
    pub source_full: u64,
    pub source_table_full: u64,
    pub sk_lookup: u64,
    pub xdp: u64,
}

/// The state of one local port, as `dump` and `/metrics` show it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PortRow {
    pub port: u16,
    /// `None`: no cap on the port as a whole.
    pub limit: Option<u32>,
    /// `None`: no per-source cap.
    pub per_source_max: Option<u32>,
    pub dry_run: bool,
    pub established: u64,
    pub high_watermark: u64,
    pub admitted: u64,
    /// All refusals (both paths, every reason).
    pub refused: u64,
    pub refused_by: RefusalRow,
    /// Refusals by `[path][reason]` (`limiter_common::path`, `reason`).
    pub refused_matrix: [[u64; reason::COUNT]; refusal_path::COUNT],
    /// Would-be refusals of a dry-run port, every reason.
    pub would_refuse: u64,
    pub would_refuse_by: RefusalRow,
    /// Attempts from trusted prefixes admitted past a cap.
    pub trusted_admitted: u64,
    /// Client groups with connections on this port now.
    pub sources: u64,
}

/// One pinned link and the program behind it.
#[derive(Clone, Debug, Serialize)]
pub struct LinkRow {
    pub pin: String,
    pub link_id: Option<u32>,
    pub program_id: Option<u32>,
}

/// A client group with connections now.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SourceRow {
    pub port: u16,
    /// The group as a prefix, such as `192.0.2.0/24`.
    pub group: String,
    pub established: u64,
}

/// Everything the maps and link pins say.
#[derive(Clone, Debug, Serialize)]
pub struct Snapshot {
    pub pin_path: PathBuf,
    pub layout_version: u32,
    pub netns_cookie: u64,
    pub untracked_sockets: u64,
    pub untracked_sources: u64,
    /// Connections older than the gate, counted at start-up.
    pub walked: u64,
    pub source_prefix_v4: u32,
    pub source_prefix_v6: u32,
    pub source_slots: u64,
    /// Slots counting a group with connections now.
    pub source_slots_used: u64,
    pub trusted: Vec<String>,
    pub trusted_reserve: u32,
    pub links: Vec<LinkRow>,
    pub ports: Vec<PortRow>,
    /// The groups with the most connections (at most [`TOP_SOURCES`]).
    pub top_sources: Vec<SourceRow>,
}

/// How many groups a snapshot lists.
pub const TOP_SOURCES: usize = 20;

/// Open handles on a pinned gate's maps.
pub struct Gate {
    pin_dir: PathBuf,
    limits: Array<MapData, PortLimit>,
    listed: HashMap<MapData, PortKey, PortLimit>,
    stats: Array<MapData, PortStats>,
    active: HashMap<MapData, PortKey, u32>,
    refused: PerCpuHashMap<MapData, PortKey, Refusals>,
    settings: Array<MapData, GateConfig>,
    trusted: LpmTrie<MapData, [u8; 16], u32>,
    counters: PerCpuArray<MapData, GateCounters>,
    sources: Array<MapData, SourceSlot>,
    ifmac: HashMap<MapData, u32, IfMac>,
}

impl std::fmt::Debug for Gate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gate").field("pin_dir", &self.pin_dir).finish_non_exhaustive()
    }
}

/// What a pin directory holds of ours.
enum PinState {
    Empty,
    /// Every fixed link pinned: a gate is enforcing.
    Complete,
    /// Some of our pins but not every link: a load that died half-way.
    Partial(Vec<PathBuf>),
}

/// Our pins present in `pin_dir`, the fixed ones and the XDP links.
fn own_pins(pin_dir: &Path) -> Vec<PathBuf> {
    let mut present: Vec<PathBuf> =
        OWN_PINS.iter().map(|name| pin_dir.join(name)).filter(|p| p.exists()).collect();
    present.extend(xdp_pins(pin_dir).into_iter().map(|(_, path)| path));
    present
}

/// `link_xdp_<interface>` pins: (interface, path).
fn xdp_pins(pin_dir: &Path) -> Vec<(String, PathBuf)> {
    let Ok(entries) = fs::read_dir(pin_dir) else { return Vec::new() };
    let mut out: Vec<(String, PathBuf)> = entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.strip_prefix(LINK_XDP_PREFIX).map(|i| (i.to_owned(), e.path()))
        })
        .collect();
    out.sort();
    out
}

fn pin_state(pin_dir: &Path) -> PinState {
    let present = own_pins(pin_dir);
    if present.is_empty() {
        PinState::Empty
    } else if [LINK_COUNT, LINK_REFUSE].iter().all(|l| pin_dir.join(l).exists()) {
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

/// How one interface's XDP program was attached.
#[derive(Clone, Debug, Serialize)]
pub struct XdpAttachment {
    pub interface: String,
    /// `driver` or `generic` (`adopted`: pinned by an earlier run).
    pub mode: &'static str,
    /// Why driver mode was not used, when it was not.
    pub fallback_reason: Option<String>,
}

impl Gate {
    /// Probes the environment, then adopts the gate pinned at
    /// `config.pin_path` or loads and attaches a new one, and applies the
    /// configured limits and trusted prefixes.
    pub fn start(config: &KernelConfig) -> Result<Started, KernelError> {
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
        // Interfaces are names in the gated namespace: check them first, so
        // a typo changes nothing.
        for name in &config.xdp_interfaces {
            let found = env::in_netns(&netns_fd, || nix::net::if_::if_nametoindex(name.as_str()).is_ok())?;
            if !found {
                return Err(KernelError::NoInterface(name.clone()));
            }
        }
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
                let shape = |key, pinned: String, wanted: String| {
                    if pinned == wanted {
                        Ok(())
                    } else {
                        Err(KernelError::PinnedShape { pin_dir: pin_dir.clone(), key, pinned, wanted })
                    }
                };
                shape(
                    "kernel.sourceTableSize",
                    (u64::from(settings.source_mask) + 1).to_string(),
                    config.source_table_size.to_string(),
                )?;
                shape(
                    "kernel.sourcePrefixV4",
                    settings.prefix_v4.to_string(),
                    config.source_prefix_v4.to_string(),
                )?;
                shape(
                    "kernel.sourcePrefixV6",
                    settings.prefix_v6.to_string(),
                    config.source_prefix_v6.to_string(),
                )?;
                let pinned_xdp: Vec<String> = xdp_pins(&pin_dir).into_iter().map(|(i, _)| i).collect();
                // An interface pinned but no longer configured would keep
                // refusing there: that needs an unload. A configured one
                // without a pin failed to attach at load: say so, go on.
                let dropped: Vec<&String> =
                    pinned_xdp.iter().filter(|i| !config.xdp_interfaces.contains(i)).collect();
                if !dropped.is_empty() {
                    let mut wanted = config.xdp_interfaces.clone();
                    wanted.sort();
                    shape("kernel.xdp.interfaces", pinned_xdp.join(", "), wanted.join(", "))?;
                }
                for missing in config.xdp_interfaces.iter().filter(|i| !pinned_xdp.contains(i)) {
                    tracing::warn!(
                        interface = %missing,
                        "XDP is not attached to this interface (it failed when the gate was loaded); \
                         sk_lookup refuses there; `limiter unload` and a restart retry it"
                    );
                }
                let changes = gate.apply(config)?;
                for interface in &pinned_xdp {
                    gate.remember_mac(interface, &netns_fd)?;
                }
                // This binary's programs replace the pinned ones in the
                // same links, atomically: counting and refusing never stop,
                // no second attachment appears.
                for swap in swap_programs(&pin_dir, config.source_table_size, &pinned_xdp)? {
                    tracing::info!(
                        link = %swap.pin,
                        from_program = swap.from,
                        to_program = swap.to,
                        "program swapped in its pinned link (bpf_link_update)"
                    );
                }
                let xdp = pinned_xdp
                    .into_iter()
                    .map(|interface| XdpAttachment { interface, mode: "adopted", fallback_reason: None })
                    .collect();
                return Ok(Started { gate, origin: Origin::Adopted, target, changes, xdp, walked: 0 });
            }
            PinState::Partial(stale) => {
                tracing::warn!(
                    pins = ?stale,
                    "removing the pins of a gate whose load never completed (not every link was pinned)"
                );
                for path in stale {
                    fs::remove_file(&path)
                        .map_err(|e| KernelError::io(format!("removing stale pin {}", path.display()), e))?;
                }
            }
            PinState::Empty => {}
        }

        let offsets = btf::sock_offsets().map_err(KernelError::Load)?;
        let kernel_btf = Btf::from_sys_fs().map_err(KernelError::load)?;
        let mut rollback = PinRollback(Vec::new());
        let mut ebpf = EbpfLoader::new()
            .map_max_entries(map_names::SOURCES, config.source_table_size)
            .override_global("LIMITER_OFFSETS", &offsets, true)
            .load(EBPF_OBJECT)
            .map_err(KernelError::load)?;
        {
            let map = ebpf.map_mut(map_names::CONFIG).ok_or_else(|| missing(map_names::CONFIG))?;
            let mut settings: Array<&mut MapData, GateConfig> =
                Array::try_from(map).map_err(KernelError::map("opening the settings map"))?;
            let value = GateConfig {
                layout_version: LAYOUT_VERSION,
                netns_cookie: target.netns_cookie,
                cgroup_id: target.cgroup_id,
                hash_seed: fastrand::u32(..),
                source_mask: config.source_table_size - 1,
                prefix_v4: config.source_prefix_v4,
                prefix_v6: config.source_prefix_v6,
                trusted_reserve: config.trusted_reserve,
                ..GateConfig::default()
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
        let changes = gate.apply(config)?;

        // Counting before refusing, so the refusal never reads a count
        // nobody keeps.
        let count: &mut SockOps = program(&mut ebpf, program_names::COUNT)?;
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

        // Connections older than the gate: counted now that the close of
        // every counted socket is seen.
        let walked = walk(&mut ebpf, &kernel_btf, &netns_fd, &gate)?;

        let refuse: &mut SkLookup = program(&mut ebpf, program_names::REFUSE)?;
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

        let mut xdp = Vec::new();
        if !config.xdp_interfaces.is_empty() {
            let program: &mut Xdp = program(&mut ebpf, program_names::XDP)?;
            program.load().map_err(|e| KernelError::Load(format!("{}: {e}", program_names::XDP)))?;
            for interface in &config.xdp_interfaces {
                match attach_xdp(program, interface, &netns_fd, config.xdp_mode)? {
                    Ok((link, attachment)) => {
                        gate.remember_mac(interface, &netns_fd)?;
                        pin_link(
                            link,
                            &pin_dir.join(format!("{LINK_XDP_PREFIX}{interface}")),
                            &mut rollback,
                        )?;
                        xdp.push(attachment);
                    }
                    // The stack's sk_lookup still enforces on this
                    // interface: refusing later is better than not starting.
                    Err(reason) => tracing::warn!(
                        interface,
                        reason,
                        "XDP did not attach in driver or generic mode; sk_lookup still refuses on it"
                    ),
                }
            }
        }

        rollback.0.clear();
        Ok(Started { gate, origin: Origin::Loaded { mounted_bpffs }, target, changes, xdp, walked })
    }

    /// Opens the maps pinned in `pin_dir`, checking their layout.
    pub fn open(pin_dir: &Path) -> Result<Self, KernelError> {
        if !pin_dir.join(map_names::CONFIG).exists() {
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
        let settings_map = open(map_names::CONFIG)?;
        // Older layouts had a smaller settings value: say "incompatible",
        // not "wrong size".
        let settings: Array<MapData, GateConfig> = Array::try_from(settings_map)
            .map_err(|e| incompatible(format!("map {}: {e} (an older layout)", map_names::CONFIG)))?;
        let value = settings.get(&0, 0).map_err(KernelError::map("reading the settings map"))?;
        if value.layout_version != LAYOUT_VERSION {
            return Err(incompatible(format!(
                "layout version {}, this limiter uses {LAYOUT_VERSION}",
                value.layout_version
            )));
        }
        let bad = |name: &'static str| move |e: MapError| incompatible(format!("map {name}: {e}"));
        let sources: Array<MapData, SourceSlot> =
            Array::try_from(open(map_names::SOURCES)?).map_err(bad(map_names::SOURCES))?;
        let slots = u64::from(value.source_mask) + 1;
        if u64::from(sources.len()) != slots {
            return Err(incompatible(format!(
                "source table has {} slots, settings say {slots}",
                sources.len()
            )));
        }
        Ok(Self {
            pin_dir: pin_dir.to_path_buf(),
            limits: Array::try_from(open(map_names::LIMITS)?).map_err(bad(map_names::LIMITS))?,
            listed: HashMap::try_from(open(map_names::LISTED)?).map_err(bad(map_names::LISTED))?,
            stats: Array::try_from(open(map_names::STATS)?).map_err(bad(map_names::STATS))?,
            active: HashMap::try_from(open(map_names::ACTIVE)?).map_err(bad(map_names::ACTIVE))?,
            refused: PerCpuHashMap::try_from(open(map_names::REFUSED)?).map_err(bad(map_names::REFUSED))?,
            trusted: LpmTrie::try_from(open(map_names::TRUSTED)?).map_err(bad(map_names::TRUSTED))?,
            counters: PerCpuArray::try_from(open(map_names::COUNTERS)?).map_err(bad(map_names::COUNTERS))?,
            ifmac: HashMap::try_from(open(map_names::IFMAC)?).map_err(bad(map_names::IFMAC))?,
            settings,
            sources,
        })
    }

    pub fn settings(&self) -> Result<GateConfig, KernelError> {
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

    /// Applies everything reloadable from `config`: port limits, trusted
    /// prefixes and the trusted reserve. All or nothing: on a failed map
    /// write, what was written is put back. Returns the limit changes.
    pub fn apply(&mut self, config: &KernelConfig) -> Result<Vec<LimitChange>, KernelError> {
        let old_settings = self.settings()?;
        let old_trusted = self.trusted_prefixes()?;
        let changes = self.set_limits(&config.port_limits())?;
        let result = self.set_trusted(&old_trusted, &config.trusted).and_then(|()| {
            let settings = GateConfig {
                trusted_reserve: config.trusted_reserve,
                trusted_count: config.trusted.len() as u32,
                ..old_settings
            };
            self.settings.set(0, settings, 0).map_err(KernelError::map("writing the settings map"))
        });
        if let Err(e) = result {
            let _ = self.set_trusted(&config.trusted, &old_trusted);
            let _ = self.settings.set(0, old_settings, 0);
            for change in &changes {
                let _ = self.write_limit(change.port, change.from.unwrap_or_default());
            }
            return Err(e);
        }
        Ok(changes)
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
                    let _ = self.write_limit(undo.port, undo.from.unwrap_or_default());
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

    fn trusted_prefixes(&self) -> Result<Vec<Prefix>, KernelError> {
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

    /// Reads every counter and link.
    pub fn snapshot(&self) -> Result<Snapshot, KernelError> {
        let settings = self.settings()?;
        let limits = self.limits()?;
        let mut refusals: BTreeMap<u16, Refusals> = BTreeMap::new();
        for item in self.refused.iter() {
            let (key, per_cpu) = item.map_err(KernelError::map("reading the refusals map"))?;
            let mut sum = Refusals::default();
            per_cpu.iter().for_each(|r| sum.add(r));
            refusals.insert(key.port, sum);
        }
        let mut counters = GateCounters::default();
        for c in self.counters.get(&0, 0).map_err(KernelError::map("reading the gate counters"))?.iter() {
            counters.untracked_sockets += c.untracked_sockets;
            counters.untracked_sources += c.untracked_sources;
            counters.walked += c.walked;
        }
        let (groups, slots_used) = self.sources();
        let mut sources_per_port: BTreeMap<u16, u64> = BTreeMap::new();
        for (key, _) in &groups {
            *sources_per_port.entry(key.port).or_default() += 1;
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
            let mut row = row(port, limits.get(&port), &stats, refusals.get(&port));
            row.sources = sources_per_port.get(&port).copied().unwrap_or(0);
            rows.push(row);
        }
        let mut top: Vec<SourceRow> = groups
            .into_iter()
            .map(|(key, n)| SourceRow { port: key.port, group: group_name(&key, &settings), established: n })
            .collect();
        top.sort_by(|a, b| {
            b.established.cmp(&a.established).then(a.port.cmp(&b.port)).then(a.group.cmp(&b.group))
        });
        top.truncate(TOP_SOURCES);
        let mut pins: Vec<String> = [LINK_COUNT, LINK_REFUSE].iter().map(|s| (*s).to_owned()).collect();
        pins.extend(xdp_pins(&self.pin_dir).into_iter().map(|(i, _)| format!("{LINK_XDP_PREFIX}{i}")));
        let links = pins
            .into_iter()
            .map(|pin| {
                let info = PinnedLink::from_pin(self.pin_dir.join(&pin))
                    .ok()
                    .map(FdLink::from)
                    .and_then(|l| l.info().ok());
                LinkRow {
                    pin,
                    link_id: info.as_ref().map(|i| i.id()),
                    program_id: info.as_ref().map(|i| i.program_id()),
                }
            })
            .collect();
        Ok(Snapshot {
            pin_path: self.pin_dir.clone(),
            layout_version: settings.layout_version,
            netns_cookie: settings.netns_cookie,
            untracked_sockets: counters.untracked_sockets,
            untracked_sources: counters.untracked_sources,
            walked: counters.walked,
            source_prefix_v4: settings.prefix_v4,
            source_prefix_v6: settings.prefix_v6,
            source_slots: u64::from(self.sources.len()),
            source_slots_used: slots_used,
            trusted: self.trusted_prefixes()?.iter().map(ToString::to_string).collect(),
            trusted_reserve: settings.trusted_reserve,
            links,
            ports: rows,
            top_sources: top,
        })
    }

    /// Groups with connections now (duplicate slots of one group summed),
    /// and the number of slots holding them. One map read per slot: about
    /// 30 ms for the default 65,536 slots.
    fn sources(&self) -> (Vec<(limiter_common::SourceKey, u64)>, u64) {
        let mut groups: std::collections::HashMap<limiter_common::SourceKey, u64> =
            std::collections::HashMap::new();
        let mut used = 0;
        for slot in self.sources.iter().filter_map(Result::ok) {
            if source::state(slot.word) == source::LIVE && source::count(slot.word) > 0 {
                used += 1;
                *groups.entry(slot.key).or_default() += u64::from(source::count(slot.word));
            }
        }
        (groups.into_iter().collect(), used)
    }
}

/// What [`Gate::start`] did.
pub struct Started {
    pub gate: Gate,
    pub origin: Origin,
    pub target: Target,
    pub changes: Vec<LimitChange>,
    pub xdp: Vec<XdpAttachment>,
    /// Connections older than the gate counted by the walk (0 when adopted).
    pub walked: u64,
}

/// Runs the start-up walk (twice, see `limiter-ebpf/src/walk.rs`) inside
/// the gated namespace; returns how many connections it counted.
/// One program replaced in a pinned link.
struct Swap {
    pin: String,
    from: u32,
    to: u32,
}

/// Loads this binary's programs against the pinned maps and swaps each
/// pinned link over to them with `BPF_LINK_UPDATE`.
fn swap_programs(pin_dir: &Path, source_slots: u32, xdp: &[String]) -> Result<Vec<Swap>, KernelError> {
    use std::os::fd::AsFd as _;
    let offsets = btf::sock_offsets().map_err(KernelError::Load)?;
    let pins: Vec<(&str, PathBuf)> = map_names::ALL.iter().map(|n| (*n, pin_dir.join(n))).collect();
    let mut loader = EbpfLoader::new();
    loader.map_max_entries(map_names::SOURCES, source_slots).override_global(
        "LIMITER_OFFSETS",
        &offsets,
        true,
    );
    for (name, path) in &pins {
        loader.map_pin_path(name, path.as_path());
    }
    let mut ebpf = loader.load(EBPF_OBJECT).map_err(KernelError::load)?;
    let mut out = Vec::new();
    let mut swap = |pin: String, program: std::os::fd::BorrowedFd<'_>| -> Result<(), KernelError> {
        let path = pin_dir.join(&pin);
        let from = linked_program(&path);
        let link =
            sys::obj_get(&path).map_err(|e| KernelError::io(format!("opening {}", path.display()), e))?;
        sys::link_update(std::os::fd::AsFd::as_fd(&link), program)
            .map_err(|e| KernelError::io(format!("swapping the program of {}", path.display()), e))?;
        let to = linked_program(&path);
        out.push(Swap { pin, from, to });
        Ok(())
    };
    let count: &mut SockOps = program(&mut ebpf, program_names::COUNT)?;
    count.load().map_err(|e| KernelError::Load(format!("{}: {e}", program_names::COUNT)))?;
    swap(LINK_COUNT.to_owned(), count.fd().map_err(KernelError::load)?.as_fd())?;
    let refuse: &mut SkLookup = program(&mut ebpf, program_names::REFUSE)?;
    refuse.load().map_err(|e| KernelError::Load(format!("{}: {e}", program_names::REFUSE)))?;
    swap(LINK_REFUSE.to_owned(), refuse.fd().map_err(KernelError::load)?.as_fd())?;
    if !xdp.is_empty() {
        let program: &mut Xdp = program(&mut ebpf, program_names::XDP)?;
        program.load().map_err(|e| KernelError::Load(format!("{}: {e}", program_names::XDP)))?;
        for interface in xdp {
            swap(format!("{LINK_XDP_PREFIX}{interface}"), program.fd().map_err(KernelError::load)?.as_fd())?;
        }
    }
    Ok(out)
}

fn walk(ebpf: &mut aya::Ebpf, btf: &Btf, netns: &fs::File, gate: &Gate) -> Result<u64, KernelError> {
    let before = gate.walked()?;
    let program: &mut Iter = program(ebpf, program_names::WALK)?;
    program.load("tcp", btf).map_err(|e| KernelError::Load(format!("{}: {e}", program_names::WALK)))?;
    for _pass in 0..2 {
        let id = program
            .attach()
            .map_err(|e| KernelError::Load(format!("attaching {}: {e}", program_names::WALK)))?;
        let link = program.take_link(id).map_err(KernelError::load)?;
        let mut file = env::in_netns(netns, || link.into_file())?.map_err(KernelError::load)?;
        io::copy(&mut file, &mut io::sink())
            .map_err(|e| KernelError::io("running the socket walk".into(), e))?;
    }
    Ok(gate.walked()? - before)
}

impl Gate {
    /// Records `interface`'s ifindex and MAC (as the gated namespace sees
    /// them) for the XDP program's "addressed to this host" check.
    fn remember_mac(&mut self, interface: &str, netns: &fs::File) -> Result<(), KernelError> {
        let found = env::in_netns(netns, || -> Result<(u32, [u8; 6]), String> {
            let index = nix::net::if_::if_nametoindex(interface).map_err(|e| e.to_string())?;
            let addrs = nix::ifaddrs::getifaddrs().map_err(|e| e.to_string())?;
            addrs
                .filter(|a| a.interface_name == interface)
                .find_map(|a| a.address.as_ref().and_then(|s| s.as_link_addr()).and_then(|l| l.addr()))
                .map(|mac| (index, mac))
                .ok_or_else(|| "it has no link-layer address".to_owned())
        })?;
        let (index, mac) = found.map_err(|e| KernelError::Load(format!("interface {interface}: {e}")))?;
        self.ifmac
            .insert(index, IfMac { mac, _pad: [0; 2] }, 0)
            .map_err(KernelError::map(format!("recording the MAC of {interface}")))
    }

    fn walked(&self) -> Result<u64, KernelError> {
        Ok(self
            .counters
            .get(&0, 0)
            .map_err(KernelError::map("reading the gate counters"))?
            .iter()
            .map(|c| c.walked)
            .sum())
    }
}

/// Attaches the XDP program to `interface` in driver mode, or generic mode
/// when the driver has no XDP support. The outer error is fatal; the inner
/// one says why neither mode attached.
fn attach_xdp(
    program: &mut Xdp,
    interface: &str,
    netns: &fs::File,
    choice: XdpModeChoice,
) -> Result<Result<(FdLink, XdpAttachment), String>, KernelError> {
    let mut attempt = |flags| -> Result<FdLink, String> {
        let id = env::in_netns(netns, || program.attach(interface, flags))
            .map_err(|e| e.to_string())?
            .map_err(|e| error_chain(&e))?;
        let link = program.take_link(id).map_err(|e| e.to_string())?;
        FdLink::try_from(link).map_err(|e| e.to_string())
    };
    let attached = |link, mode, fallback_reason| {
        Ok(Ok((link, XdpAttachment { interface: interface.into(), mode, fallback_reason })))
    };
    match choice {
        XdpModeChoice::Generic => {
            return match attempt(XdpMode::Skb) {
                Ok(link) => attached(link, "generic", None),
                Err(e) => Ok(Err(format!("generic mode: {e}"))),
            };
        }
        XdpModeChoice::Driver => {
            return match attempt(XdpMode::Driver) {
                Ok(link) => attached(link, "driver", None),
                Err(e) => Ok(Err(format!("driver mode (kernel.xdp.mode = driver): {e}"))),
            };
        }
        XdpModeChoice::Auto => {}
    }
    match attempt(XdpMode::Driver) {
        Ok(link) => Ok(Ok((
            link,
            XdpAttachment { interface: interface.into(), mode: "driver", fallback_reason: None },
        ))),
        Err(driver) => match attempt(XdpMode::Skb) {
            Ok(link) => Ok(Ok((
                link,
                XdpAttachment { interface: interface.into(), mode: "generic", fallback_reason: Some(driver) },
            ))),
            Err(generic) => Ok(Err(format!("driver mode: {driver}; generic mode: {generic}"))),
        },
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

/// The trie key of a prefix: IPv4 as IPv4-mapped IPv6.
fn trie_key(p: &Prefix) -> (u32, [u8; 16]) {
    match p.addr {
        std::net::IpAddr::V4(a) => (u32::from(p.len) + 96, a.to_ipv6_mapped().octets()),
        std::net::IpAddr::V6(a) => (u32::from(p.len), a.octets()),
    }
}

fn prefix_of(len: u32, data: [u8; 16]) -> Prefix {
    let v6 = std::net::Ipv6Addr::from(data);
    match v6.to_ipv4_mapped() {
        Some(v4) if len >= 96 => Prefix { addr: v4.into(), len: (len - 96) as u8 },
        _ => Prefix { addr: v6.into(), len: len as u8 },
    }
}

/// A group as a prefix: `192.0.2.0/24`, `2001:db8::/64`.
fn group_name(key: &limiter_common::SourceKey, settings: &GateConfig) -> String {
    if key.family == 4 {
        format!("{}/{}", std::net::Ipv4Addr::from(key.addr[0]), settings.prefix_v4)
    } else {
        let bits = key.addr.iter().fold(0u128, |acc, w| (acc << 32) | u128::from(*w));
        format!("{}/{}", std::net::Ipv6Addr::from(bits), settings.prefix_v6)
    }
}

fn row(port: u16, limit: Option<&PortLimit>, s: &PortStats, r: Option<&Refusals>) -> PortRow {
    let r = r.copied().unwrap_or_default();
    PortRow {
        port,
        limit: limit.map(|l| l.max_established).filter(|&m| m != 0),
        per_source_max: limit.map(|l| l.per_source_max).filter(|&m| m != 0),
        dry_run: limit.is_some_and(|l| l.flags & limiter_common::LIMIT_FLAG_DRY_RUN != 0),
        established: s.established,
        high_watermark: s.high_watermark,
        admitted: s.admitted,
        refused: r.refused.iter().sum(),
        refused_by: RefusalRow {
            port_full: r.by_reason(reason::PORT),
            source_full: r.by_reason(reason::SOURCE),
            source_table_full: r.by_reason(reason::TABLE),
            sk_lookup: r.by_path(refusal_path::SK_LOOKUP),
            xdp: r.by_path(refusal_path::XDP),
        },
        refused_matrix: std::array::from_fn(|p| std::array::from_fn(|q| r.refused[p * reason::COUNT + q])),
        would_refuse: r.would_refuse.iter().sum(),
        would_refuse_by: RefusalRow {
            port_full: r.would_refuse[reason::PORT],
            source_full: r.would_refuse[reason::SOURCE],
            source_table_full: r.would_refuse[reason::TABLE],
            sk_lookup: 0,
            xdp: 0,
        },
        trusted_admitted: r.trusted_admitted,
        sources: 0,
    }
}

/// Program `name` of the loaded object, as its type.
fn program<'a, T>(ebpf: &'a mut aya::Ebpf, name: &str) -> Result<&'a mut T, KernelError>
where
    &'a mut T: TryFrom<&'a mut aya::programs::Program, Error = aya::programs::ProgramError>,
{
    ebpf.program_mut(name).ok_or_else(|| missing(name))?.try_into().map_err(KernelError::load)
}

/// The program behind the link pinned at `path` (0 if it cannot be read).
fn linked_program(path: &Path) -> u32 {
    PinnedLink::from_pin(path)
        .ok()
        .map(FdLink::from)
        .and_then(|l| l.info().ok())
        .map_or(0, |i| i.program_id())
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
    let xdp: Vec<String> =
        xdp_pins(pin_dir).into_iter().map(|(i, _)| format!("{LINK_XDP_PREFIX}{i}")).collect();
    for name in xdp.iter().map(String::as_str).chain(OWN_PINS) {
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
