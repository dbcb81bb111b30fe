//! The kernel gate as the daemon holds it: started (loaded or adopted) at
//! start-up, with what it did logged.

use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::{
    admin::api::GateOrigin,
    config::KernelConfig,
    kernel::{self, Gate, KernelError, Origin, Target},
};

pub struct HeldGate {
    /// Map handles: scrapes read them together (a scrape of a large source
    /// table takes a while), a reload writes alone, waiting only for the
    /// reads in progress (the lock prefers a waiting writer).
    pub gate: RwLock<Gate>,
    pub target: Target,
    pub origin: GateOrigin,
}

impl HeldGate {
    /// Loads or adopts the gate `config` describes, logging what was done
    /// (`owners`: see [`Gate::start`]).
    pub fn start(config: &KernelConfig, owners: &[u32]) -> Result<Self, KernelError> {
        let kernel::Started { gate, origin, target, changes, xdp, walked } = Gate::start(config, owners)?;
        let origin = match origin {
            Origin::Loaded { mounted_bpffs } => {
                tracing::info!(
                    pin_path = %config.pin_path.display(),
                    cgroup = %target.cgroup.display(),
                    netns = %target.netns.display(),
                    netns_cookie = target.netns_cookie,
                    mounted_bpffs,
                    preexisting_connections_counted = walked,
                    "kernel gate loaded and attached"
                );
                GateOrigin::Loaded
            }
            Origin::Adopted => {
                tracing::info!(
                    pin_path = %config.pin_path.display(),
                    "kernel gate adopted: it was pinned and enforcing; nothing re-attached"
                );
                GateOrigin::Adopted
            }
            Origin::Migrated { from } => {
                tracing::info!(
                    pin_path = %config.pin_path.display(),
                    from_layout = from,
                    "kernel gate adopted and migrated to this limiter's layout: it kept counting and refusing throughout"
                );
                GateOrigin::Migrated
            }
        };
        for x in &xdp {
            match &x.fallback_reason {
                None => tracing::info!(interface = %x.interface, mode = x.mode, "XDP refusal attached"),
                Some(why) => tracing::info!(
                    interface = %x.interface,
                    mode = x.mode,
                    why = %why,
                    "XDP refusal attached in generic mode, not driver mode"
                ),
            }
        }
        let ports: Vec<String> = changes.iter().map(ToString::to_string).collect();
        tracing::info!(changes = %ports.join(" "), "kernel gate enforcing");
        Ok(Self { gate: RwLock::new(gate), target, origin })
    }

    /// For reading the maps (many at once).
    pub fn read(&self) -> RwLockReadGuard<'_, Gate> {
        self.gate.read().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// For reading them unless a reload writes them now (`None`).
    pub fn try_read(&self) -> Option<RwLockReadGuard<'_, Gate>> {
        match self.gate.try_read() {
            Ok(g) => Some(g),
            Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }

    /// For writing them (a reload).
    pub fn write(&self) -> RwLockWriteGuard<'_, Gate> {
        self.gate.write().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
