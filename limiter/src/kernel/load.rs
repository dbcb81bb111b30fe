//! Starting the gate: probe the target, then either adopt the gate pinned
//! there (check its shape, swap this binary's programs into its pinned
//! links) or load, pin and attach a new one.
//!
//! Both ways put the programs in place with one sequence, [`install`]:
//! counting first, then refusing in the stack, then at the driver. What
//! differs is only how each program goes in ([`Links`]): a new link,
//! attached and pinned ([`Attach`]), or the program swapped inside the
//! pinned link with `BPF_LINK_UPDATE` ([`Swap`]), so an adopted gate never
//! stops counting or refusing and never gets a second attachment.

use std::{
    fs::File,
    io,
    os::fd::{AsFd as _, BorrowedFd},
    path::{Path, PathBuf},
};

use aya::{
    Ebpf, EbpfLoader,
    maps::{Array, MapData},
    programs::{CgroupAttachMode, Iter, SkLookup, SockOps, Xdp, XdpMode, links::FdLink},
};
use limiter_common::{GateConfig, LAYOUT_VERSION, conns, map_names, program_names};
use serde::Serialize;

use super::{
    Gate, KernelError, LimitChange, XdpAttachError, XdpModeError, btf, env, migrate,
    pin_lock::{self, PinLock},
    pins::{self, LINK_COUNT, LINK_REFUSE, PinRollback, PinState},
    sys,
};
use crate::config::{KernelConfig, XdpModeChoice};

/// The kernel programs, built by `build.rs` and embedded in the binary.
static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/limiter"));

/// How [`Gate::start`] found the gate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// Programs were loaded and attached now.
    Loaded { mounted_bpffs: bool },
    /// A gate was already pinned and enforcing; it was adopted as it is.
    Adopted,
    /// A gate of the older layout `from` was pinned and enforcing; it was
    /// adopted and migrated in place.
    Migrated { from: u32 },
}

/// Where the gate acts.
#[derive(Clone, Debug, Serialize, serde::Deserialize)]
pub struct Target {
    pub cgroup: PathBuf,
    /// Inode of the cgroup directory (the kernel's cgroup id).
    pub cgroup_id: u64,
    pub netns: PathBuf,
    pub netns_inode: u64,
    pub netns_cookie: u64,
}

/// How one interface's XDP program was attached.
#[derive(Clone, Debug, Serialize)]
pub struct XdpAttachment {
    pub interface: String,
    /// `driver` or `generic` (`adopted`: pinned by an earlier run).
    pub mode: &'static str,
    /// Why driver mode was not used, when it was not (the rendered
    /// [`XdpModeError`]).
    pub fallback_reason: Option<String>,
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

/// What the probe found: where the gate acts, and open handles on it.
struct Probed {
    target: Target,
    cgroup: File,
    netns: File,
}

impl Gate {
    /// Probes the environment, then adopts the gate pinned at
    /// `config.pin_path` or loads and attaches a new one, and applies the
    /// configured limits and trusted prefixes.
    ///
    /// `owners`: the uids besides root's that may own the pin directory
    /// and those above it (the daemon's own, the `--user`'s); see
    /// `crate::dir_trust`.
    pub fn start(config: &KernelConfig, owners: &[u32]) -> Result<Started, KernelError> {
        let probed = probe(config)?;
        let mounted_bpffs = env::ensure_bpffs(&config.pin_path)?;
        env::check_pin_trust(&config.pin_path, owners)?;
        // Held until the gate is loaded or adopted: another process's
        // half-made pins are never taken for a load that died.
        let _held = PinLock::acquire(&config.pin_path, pin_lock::WAIT, || {
            env::ensure_bpffs(&config.pin_path).map(drop)
        })?;
        match pins::pin_state(&config.pin_path) {
            PinState::Complete => return adopt(config, probed),
            PinState::Partial(stale) => pins::remove_stale(stale)?,
            PinState::Empty => {}
        }
        load(config, probed, mounted_bpffs)
    }
}

/// Privileges, kernel, the cgroup and network namespace to gate, and the
/// XDP interfaces in that namespace.
fn probe(config: &KernelConfig) -> Result<Probed, KernelError> {
    env::check_privileges()?;
    env::check_kernel(env::kernel_version()?)?;
    let cgroup = match &config.cgroup {
        Some(path) => path.clone(),
        None => env::cgroup2_mount()?,
    };
    let cgroup_fd = env::open_cgroup(&cgroup)?;
    let netns = config.netns.clone().unwrap_or_else(|| PathBuf::from("/proc/self/ns/net"));
    let netns_fd = env::open_netns(&netns)?;
    let cgroup_meta =
        cgroup_fd.metadata().map_err(|e| KernelError::io(format!("reading {}", cgroup.display()), e))?;
    let target = Target {
        cgroup_id: std::os::unix::fs::MetadataExt::ino(&cgroup_meta),
        netns_inode: env::netns_inode(&netns_fd),
        netns_cookie: env::netns_cookie(&netns_fd)?,
        cgroup,
        netns,
    };
    // Interfaces are names in the gated namespace: check them first, so
    // a typo changes nothing.
    for name in &config.xdp_interfaces {
        if !env::has_interface(&netns_fd, name)? {
            return Err(KernelError::NoInterface(name.clone()));
        }
    }
    Ok(Probed { target, cgroup: cgroup_fd, netns: netns_fd })
}

/// Fails unless the gate pinned at `pin_dir` (whose configuration is
/// `pinned`) is the one `config` asks for in everything fixed at creation.
/// Returns the interfaces with a pinned XDP link.
fn check_shape(
    pinned: &GateConfig,
    config: &KernelConfig,
    target: &Target,
    pin_dir: &Path,
) -> Result<Vec<String>, KernelError> {
    if pinned.netns_cookie != target.netns_cookie {
        return Err(KernelError::NetnsChanged {
            pin_dir: pin_dir.to_path_buf(),
            pinned: pinned.netns_cookie,
            wanted: target.netns_cookie,
        });
    }
    if pinned.cgroup_id != target.cgroup_id {
        return Err(KernelError::CgroupChanged {
            pin_dir: pin_dir.to_path_buf(),
            wanted: target.cgroup.clone(),
        });
    }
    let same = |key, pinned: String, wanted: String| {
        if pinned == wanted {
            Ok(())
        } else {
            Err(KernelError::PinnedShape { pin_dir: pin_dir.to_path_buf(), key, pinned, wanted })
        }
    };
    same(
        "kernel.sourceTableSize",
        (u64::from(pinned.source_mask) + 1).to_string(),
        config.source_table_size.to_string(),
    )?;
    // Layouts before 5 have no connection table: the migration creates it
    // at the configured size.
    if let Some(buckets) = pinned_len(&pin_dir.join(map_names::CONNS))? {
        same(
            "kernel.connectionTableSize",
            (u64::from(buckets) * u64::from(conns::BUCKET_SLOTS)).to_string(),
            config.connection_table_size.to_string(),
        )?;
    }
    same("kernel.sourcePrefixV4", pinned.prefix_v4.to_string(), config.source_prefix_v4.to_string())?;
    same("kernel.sourcePrefixV6", pinned.prefix_v6.to_string(), config.source_prefix_v6.to_string())?;
    let pinned_xdp = pins::xdp_interfaces(pin_dir);
    // An interface pinned but no longer configured would keep refusing
    // there: that needs an unload.
    if pinned_xdp.iter().any(|i| !config.xdp_interfaces.contains(i)) {
        let mut wanted = config.xdp_interfaces.clone();
        wanted.sort();
        same("kernel.xdp.interfaces", pinned_xdp.join(", "), wanted.join(", "))?;
    }
    Ok(pinned_xdp)
}

/// The `max_entries` of the map pinned at `path`, if one is pinned there.
fn pinned_len(path: &Path) -> Result<Option<u32>, KernelError> {
    if !path.exists() {
        return Ok(None);
    }
    let info = aya::maps::MapInfo::from_pin(path)
        .map_err(|e| KernelError::io(format!("reading {}", path.display()), io::Error::other(e)))?;
    Ok(Some(info.max_entries()))
}

/// Adopts the gate pinned at `config.pin_path`: checks its shape, applies
/// `config`, and swaps this binary's programs into its links.
fn adopt(config: &KernelConfig, probed: Probed) -> Result<Started, KernelError> {
    let pin_dir = &config.pin_path;
    let pinned = Gate::pinned_config(pin_dir)?;
    let plan = migrate::plan(pin_dir, pinned.layout_version)?;
    let pinned_xdp = check_shape(&pinned, config, &probed.target, pin_dir)?;
    // A configured interface without a pin failed to attach at load: say
    // so, go on.
    for missing in config.xdp_interfaces.iter().filter(|i| !pinned_xdp.contains(i)) {
        tracing::warn!(
            interface = %missing,
            "XDP is not attached to this interface (it failed when the gate was loaded); \
             sk_lookup refuses there; `limiter unload` and a restart retry it"
        );
    }
    // Against the pinned maps; a map an older layout lacks is created and
    // pinned here (aya pins what it does not find).
    let mut ebpf = load_object(config, Some(pin_dir))?;
    install(&mut ebpf, &pinned_xdp, &mut Swap { pin_dir })?;
    migrate::finish(pin_dir, plan)?;
    let mut gate = Gate::open(pin_dir)?;
    let changes = gate.apply(config)?;
    for interface in &pinned_xdp {
        gate.remember_mac(interface, &probed.netns)?;
    }
    let xdp = pinned_xdp
        .into_iter()
        .map(|interface| XdpAttachment { interface, mode: "adopted", fallback_reason: None })
        .collect();
    let origin = match plan {
        migrate::Plan::Current => Origin::Adopted,
        migrate::Plan::Migrate { from } => Origin::Migrated { from },
    };
    Ok(Started { gate, origin, target: probed.target, changes, xdp, walked: 0 })
}

/// Loads a new gate into an empty `config.pin_path`: writes its
/// configuration, pins the maps, applies the limits, then attaches and
/// pins the programs. A failure removes every pin it made.
fn load(config: &KernelConfig, probed: Probed, mounted_bpffs: bool) -> Result<Started, KernelError> {
    let pin_dir = &config.pin_path;
    let mut ebpf = load_object(config, None)?;
    let kernel_btf = aya::Btf::from_sys_fs().map_err(KernelError::KernelBtf)?;
    let created = GateConfig {
        layout_version: LAYOUT_VERSION,
        netns_cookie: probed.target.netns_cookie,
        cgroup_id: probed.target.cgroup_id,
        hash_seed: fastrand::u32(..),
        source_mask: config.source_table_size - 1,
        prefix_v4: config.source_prefix_v4,
        prefix_v6: config.source_prefix_v6,
        trusted_reserve: config.trusted_reserve,
        ..GateConfig::default()
    };
    let map = ebpf.map_mut(map_names::CONFIG).ok_or(KernelError::NotInObject(map_names::CONFIG))?;
    Array::<&mut MapData, GateConfig>::try_from(map)
        .map_err(KernelError::map("opening the gate's configuration"))?
        .set(0, created, 0)
        .map_err(KernelError::map("writing the gate's configuration"))?;
    let mut rollback = PinRollback::default();
    for name in map_names::ALL {
        let map = ebpf.map(name).ok_or(KernelError::NotInObject(name))?;
        rollback.pin_map(map, pin_dir.join(name))?;
    }
    // Limits before attaching: enforcement starts with the first SYN.
    let mut gate = Gate::open(pin_dir)?;
    let changes = gate.apply(config)?;
    let mut attach = Attach {
        pin_dir,
        probed: &probed,
        mode: config.xdp_mode,
        kernel_btf,
        gate: &mut gate,
        rollback,
        xdp: Vec::new(),
        walked: 0,
    };
    install(&mut ebpf, &config.xdp_interfaces, &mut attach)?;
    let Attach { rollback, xdp, walked, .. } = attach;
    rollback.keep();
    Ok(Started {
        gate,
        origin: Origin::Loaded { mounted_bpffs },
        target: probed.target,
        changes,
        xdp,
        walked,
    })
}

/// Loads the embedded object with the walk's offsets for this kernel; with
/// `pinned`, against the maps pinned there instead of new ones.
fn load_object(config: &KernelConfig, pinned: Option<&Path>) -> Result<Ebpf, KernelError> {
    let offsets = btf::sock_offsets()?;
    let paths: Vec<(&str, PathBuf)> =
        pinned.map(|dir| map_names::ALL.iter().map(|n| (*n, dir.join(n))).collect()).unwrap_or_default();
    let source_slots = config.source_table_size;
    let buckets = conns::buckets(config.connection_table_size);
    let mask = buckets - 1;
    let mut loader = EbpfLoader::new();
    loader.map_max_entries(map_names::SOURCES, source_slots);
    loader.map_max_entries(map_names::CONNS, buckets);
    loader
        .map_max_entries(map_names::SRCVER, limiter_common::source::index_len(source_slots))
        .override_global("LIMITER_OFFSETS", &offsets, true)
        .override_global("LIMITER_CONN_MASK", &mask, true);
    for (name, path) in &paths {
        loader.map_pin_path(name, path.as_path());
    }
    Ok(loader.load(EBPF_OBJECT)?)
}

/// How [`install`] puts each program in place.
trait Links {
    fn count(&mut self, program: &mut SockOps, pin: &str) -> Result<(), KernelError>;
    /// Called once counting runs and before anything refuses.
    fn counting(&mut self, _ebpf: &mut Ebpf) -> Result<(), KernelError> {
        Ok(())
    }
    fn refuse(&mut self, program: &mut SkLookup, pin: &str) -> Result<(), KernelError>;
    fn xdp(&mut self, program: &mut Xdp, interface: &str, pin: &str) -> Result<(), KernelError>;
}

/// Loads the programs into the kernel and puts them in place, in the one
/// safe order: counting before refusing, so the refusal never reads a
/// count nobody keeps; XDP (on `interfaces`) last.
fn install(ebpf: &mut Ebpf, interfaces: &[String], links: &mut impl Links) -> Result<(), KernelError> {
    let count: &mut SockOps = program(ebpf, program_names::COUNT)?;
    count.load().map_err(KernelError::program(program_names::COUNT))?;
    links.count(count, LINK_COUNT)?;
    links.counting(ebpf)?;
    let refuse: &mut SkLookup = program(ebpf, program_names::REFUSE)?;
    refuse.load().map_err(KernelError::program(program_names::REFUSE))?;
    links.refuse(refuse, LINK_REFUSE)?;
    if !interfaces.is_empty() {
        let xdp: &mut Xdp = program(ebpf, program_names::XDP)?;
        xdp.load().map_err(KernelError::program(program_names::XDP))?;
        for interface in interfaces {
            links.xdp(xdp, interface, &pins::xdp_link(interface))?;
        }
    }
    Ok(())
}

/// New links: attached to the target and pinned (a fresh gate).
struct Attach<'a> {
    pin_dir: &'a Path,
    probed: &'a Probed,
    mode: XdpModeChoice,
    /// The running kernel's BTF, for the walk's iterator.
    kernel_btf: aya::Btf,
    gate: &'a mut Gate,
    rollback: PinRollback,
    xdp: Vec<XdpAttachment>,
    walked: u64,
}

impl Links for Attach<'_> {
    fn count(&mut self, program: &mut SockOps, pin: &str) -> Result<(), KernelError> {
        let name = program_names::COUNT;
        let id = program.attach(&self.probed.cgroup, CgroupAttachMode::Single).map_err(|source| {
            KernelError::Attach { program: name, target: Some(self.probed.target.cgroup.clone()), source }
        })?;
        let link: FdLink = program
            .take_link(id)
            .map_err(KernelError::program(name))?
            .try_into()
            .map_err(KernelError::link(name))?;
        self.rollback.pin_link(link, self.pin_dir.join(pin))
    }

    /// Connections older than the gate: counted now that the close of
    /// every counted socket is seen.
    fn counting(&mut self, ebpf: &mut Ebpf) -> Result<(), KernelError> {
        self.walked = walk(ebpf, &self.kernel_btf, &self.probed.netns, self.gate)?;
        Ok(())
    }

    fn refuse(&mut self, program: &mut SkLookup, pin: &str) -> Result<(), KernelError> {
        let name = program_names::REFUSE;
        let id = program.attach(&self.probed.netns).map_err(|source| KernelError::Attach {
            program: name,
            target: Some(self.probed.target.netns.clone()),
            source,
        })?;
        let link: FdLink = program.take_link(id).map_err(KernelError::program(name))?.into();
        self.rollback.pin_link(link, self.pin_dir.join(pin))
    }

    fn xdp(&mut self, program: &mut Xdp, interface: &str, pin: &str) -> Result<(), KernelError> {
        match attach_xdp(program, interface, &self.probed.netns, self.mode) {
            Ok((link, attachment)) => {
                self.gate.remember_mac(interface, &self.probed.netns)?;
                self.rollback.pin_link(link, self.pin_dir.join(pin))?;
                self.xdp.push(attachment);
            }
            // The stack's sk_lookup still enforces on this interface:
            // refusing later is better than not starting.
            Err(reason) => tracing::warn!(
                interface,
                reason = %reason,
                "XDP did not attach in driver or generic mode; sk_lookup still refuses on it"
            ),
        }
        Ok(())
    }
}

/// The pinned links, each given this binary's program (an adopted gate).
struct Swap<'a> {
    pin_dir: &'a Path,
}

impl Swap<'_> {
    /// Makes the link pinned as `pin` run `program`, atomically.
    fn swap(&self, pin: &str, program: BorrowedFd<'_>) -> Result<(), KernelError> {
        let path = self.pin_dir.join(pin);
        let from = linked_program(&path);
        let link =
            sys::obj_get(&path).map_err(|e| KernelError::io(format!("opening {}", path.display()), e))?;
        sys::link_update(link.as_fd(), program)
            .map_err(|e| KernelError::io(format!("swapping the program of {}", path.display()), e))?;
        tracing::info!(
            link = %pin,
            from_program = %from,
            to_program = %linked_program(&path),
            "program swapped in its pinned link (bpf_link_update)"
        );
        Ok(())
    }
}

impl Links for Swap<'_> {
    fn count(&mut self, program: &mut SockOps, pin: &str) -> Result<(), KernelError> {
        self.swap(pin, program.fd().map_err(KernelError::program(program_names::COUNT))?.as_fd())
    }

    fn refuse(&mut self, program: &mut SkLookup, pin: &str) -> Result<(), KernelError> {
        self.swap(pin, program.fd().map_err(KernelError::program(program_names::REFUSE))?.as_fd())
    }

    fn xdp(&mut self, program: &mut Xdp, _interface: &str, pin: &str) -> Result<(), KernelError> {
        self.swap(pin, program.fd().map_err(KernelError::program(program_names::XDP))?.as_fd())
    }
}

/// The program behind the link pinned at `path`, for the log: its id,
/// `none`, or why it could not be read (never a made-up id).
fn linked_program(path: &Path) -> String {
    match pins::link_info(path) {
        Ok(Some(info)) => info.program_id().to_string(),
        Ok(None) => "none".to_owned(),
        Err(why) => format!("unknown ({why})"),
    }
}

/// Runs the start-up walk (twice, see `limiter-ebpf/src/walk.rs`) inside
/// the gated namespace; returns how many connections it counted.
fn walk(ebpf: &mut Ebpf, btf: &aya::Btf, netns: &File, gate: &Gate) -> Result<u64, KernelError> {
    let name = program_names::WALK;
    let before = gate.counters()?.walked;
    let program: &mut Iter = program(ebpf, name)?;
    program.load("tcp", btf).map_err(KernelError::program(name))?;
    for _pass in 0..2 {
        let id =
            program.attach().map_err(|source| KernelError::Attach { program: name, target: None, source })?;
        let link = program.take_link(id).map_err(KernelError::program(name))?;
        // The iterator walks the namespace it is opened from.
        let mut file = env::in_netns(netns, || link.into_file().map_err(KernelError::link(name)))?;
        io::copy(&mut file, &mut io::sink()).map_err(|e| KernelError::io("running the socket walk", e))?;
    }
    Ok(gate.counters()?.walked - before)
}

/// Attaches the XDP program to `interface` in driver mode, or generic mode
/// when the driver has no XDP support (`auto`), or in the one mode
/// `kernel.xdp.mode` names.
fn attach_xdp(
    program: &mut Xdp,
    interface: &str,
    netns: &File,
    choice: XdpModeChoice,
) -> Result<(FdLink, XdpAttachment), XdpAttachError> {
    let mut attempt = |mode| -> Result<FdLink, XdpModeError> {
        // Interface names resolve in the caller's namespace.
        let id = env::in_netns(netns, || program.attach(interface, mode).map_err(XdpModeError::Attach))?;
        let link = program.take_link(id).map_err(XdpModeError::Attach)?;
        FdLink::try_from(link).map_err(XdpModeError::Link)
    };
    let attached = |link, mode, fallback_reason| {
        (link, XdpAttachment { interface: interface.into(), mode, fallback_reason })
    };
    match choice {
        XdpModeChoice::Generic => {
            attempt(XdpMode::Skb).map(|l| attached(l, "generic", None)).map_err(XdpAttachError::Generic)
        }
        XdpModeChoice::Driver => {
            attempt(XdpMode::Driver).map(|l| attached(l, "driver", None)).map_err(XdpAttachError::Driver)
        }
        XdpModeChoice::Auto if super::link_kind::kind(netns, interface).as_deref() == Some("veth") => {
            // Driver mode's XDP_TX on a veth waits on a peer without XDP of
            // its own: the refused client would time out instead.
            let why = "a veth: in driver mode a frame sent with XDP_TX waits on the peer unless the peer runs an XDP program (set kernel.xdp.mode = driver to insist)";
            attempt(XdpMode::Skb)
                .map(|l| attached(l, "generic", Some(why.to_owned())))
                .map_err(XdpAttachError::Generic)
        }
        XdpModeChoice::Auto => match attempt(XdpMode::Driver) {
            Ok(link) => Ok(attached(link, "driver", None)),
            Err(driver) => match attempt(XdpMode::Skb) {
                Ok(link) => Ok(attached(link, "generic", Some(driver.to_string()))),
                Err(generic) => {
                    Err(XdpAttachError::Neither { driver: Box::new(driver), generic: Box::new(generic) })
                }
            },
        },
    }
}

/// Program `name` of the loaded object, as its type.
fn program<'a, T>(ebpf: &'a mut Ebpf, name: &'static str) -> Result<&'a mut T, KernelError>
where
    &'a mut T: TryFrom<&'a mut aya::programs::Program, Error = aya::programs::ProgramError>,
{
    ebpf.program_mut(name)
        .ok_or(KernelError::NotInObject(name))?
        .try_into()
        .map_err(KernelError::program(name))
}
