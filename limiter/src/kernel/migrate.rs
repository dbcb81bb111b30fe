//! Pinned layouts older than this binary's, migrated in place when a daemon
//! adopts them: no `limiter unload`, no moment without counting or refusing.
//!
//! A migration only ever adds: the maps the older layout lacks are created
//! and pinned (empty: what they hold is derived from the maps kept, or
//! starts at zero), this binary's programs are swapped into the pinned
//! links, and the layout version is rewritten last. Every map the older
//! layout had keeps its shape and its content, so the counts are exact
//! across the swap. A migration that fails half-way leaves a gate that
//! still enforces (the links swapped so far run the new programs against
//! the same maps) and is retried by the next adoption.
//!
//! | from | to | what is added |
//! |---|---|---|
//! | 2 | 3 | `LIMITER_SRCVER` (the source table's change counters; readers read the whole table once), `LIMITER_PERMITS` (the HTTP permit ledger, see `ledger`) |
//! | 3 | 4 | `LIMITER_SHED`, `LIMITER_SHEDCNT` (coupled shedding: flags lowered, nothing counted) |
//! | 4 | 5 | `LIMITER_CONNS` (the connection table; sockets the old programs marked in `LIMITER_SOCKS` are uncounted through their marks at their close, new ones go into the table) |
//! | 2 or 3 | 5 | every row from there |

use std::path::Path;

use limiter_common::{LAYOUT_VERSION, MIGRATES_FROM, map_names};

use super::{Gate, Incompatible, KernelError};

/// What adopting the gate pinned in `pin_dir` involves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Plan {
    /// The pinned layout is this binary's.
    Current,
    /// Layout `from`, migrated by [`finish`] once the programs are swapped.
    Migrate { from: u32 },
}

/// Decides from the pinned layout version.
pub(super) fn plan(pin_dir: &Path, version: u32) -> Result<Plan, KernelError> {
    if version == LAYOUT_VERSION {
        Ok(Plan::Current)
    } else if MIGRATES_FROM.contains(&version) {
        let missing: Vec<&str> =
            map_names::ALL.iter().copied().filter(|m| !pin_dir.join(m).exists()).collect();
        tracing::info!(
            from = version,
            to = LAYOUT_VERSION,
            creating = ?missing,
            "migrating the pinned gate's layout in place (counts kept, links never detached)"
        );
        Ok(Plan::Migrate { from: version })
    } else {
        Err(KernelError::IncompatiblePins {
            pin_dir: pin_dir.to_path_buf(),
            why: Box::new(Incompatible::LayoutVersion(version)),
        })
    }
}

/// The last step, once every link runs this binary's programs: the
/// version that tells readers the new maps are there.
pub(super) fn finish(pin_dir: &Path, plan: Plan) -> Result<(), KernelError> {
    if let Plan::Migrate { from } = plan {
        Gate::set_layout_version(pin_dir, LAYOUT_VERSION)?;
        tracing::info!(from, to = LAYOUT_VERSION, pin_dir = %pin_dir.display(), "pinned gate migrated");
    }
    Ok(())
}
