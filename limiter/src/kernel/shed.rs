//! The kernel side of coupled shedding: the per-port flag the daemon raises
//! while its HTTP pools are saturated (`LIMITER_SHED`, read by the refusal
//! programs on every SYN) and what the programs did under it
//! (`LIMITER_SHEDCNT`).
//!
//! A raised flag is a deadline on `CLOCK_BOOTTIME`, the clock of
//! `bpf_ktime_get_boot_ns`: the daemon renews it while it sheds and lowers
//! it when it stops. A daemon that dies stops renewing, and the programs
//! let connections in again once the deadline passes, at most one lease
//! ([`LEASE`]) later.

use std::{path::Path, time::Duration};

use aya::maps::{Array, MapData};
use limiter_common::{SHED_FLAG_DRY_RUN, ShedPort, map_names};

use super::{Incompatible, KernelError, maps};

/// How long a raised flag holds without renewal.
pub const LEASE: Duration = Duration::from_secs(1);

/// Nanoseconds of `CLOCK_BOOTTIME` now, the clock the programs compare
/// a flag's deadline with.
pub fn boot_ns() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME)
        .map_or(0, |t| t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64)
}

/// How a raised flag sheds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShedMode {
    /// Count what would be shed, shed nothing.
    pub dry_run: bool,
    /// Admit one attempt in this many as a probe (0: none).
    pub probe_one_in: u32,
}

/// The daemon's own handle on the flags: renewing never waits for a
/// scrape holding the gate's other maps.
pub struct ShedFlags {
    map: Array<MapData, ShedPort>,
}

impl std::fmt::Debug for ShedFlags {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShedFlags").finish_non_exhaustive()
    }
}

impl ShedFlags {
    /// Opens the flags of the gate pinned in `pin_dir`.
    pub fn open(pin_dir: &Path) -> Result<Self, KernelError> {
        let map = maps::open_pinned(pin_dir, map_names::SHED)?;
        let map = Array::try_from(map).map_err(|source| KernelError::IncompatiblePins {
            pin_dir: pin_dir.to_path_buf(),
            why: Box::new(Incompatible::Map { name: map_names::SHED, source }),
        })?;
        Ok(Self { map })
    }

    /// Raises (or renews) the flag of `port` for one [`LEASE`] from now.
    pub fn raise(&mut self, port: u16, mode: ShedMode) -> Result<(), KernelError> {
        let until = boot_ns() + LEASE.as_nanos() as u64;
        let value = ShedPort {
            until_boot_ns: until,
            flags: if mode.dry_run { SHED_FLAG_DRY_RUN } else { 0 },
            probe_one_in: mode.probe_one_in,
        };
        self.map
            .set(u32::from(port), value, 0)
            .map_err(KernelError::map(format!("raising the shedding flag of port {port}")))
    }

    /// Lowers the flag of `port`: its SYNs are decided by the limits alone.
    pub fn lower(&mut self, port: u16) -> Result<(), KernelError> {
        self.map
            .set(u32::from(port), ShedPort::default(), 0)
            .map_err(KernelError::map(format!("lowering the shedding flag of port {port}")))
    }
}
