//! The pin directory: which pins are the daemon's, what state a directory
//! is in, undoing a load that failed half-way, and `limiter unload`.
//!
//! Only the names in [`OWN_PINS`] and the `link_xdp_*` links are ever
//! created or removed: anything else in the directory is someone else's.

use std::{
    fs, io,
    path::{Path, PathBuf},
};

use aya::{
    maps::Map,
    programs::links::{FdLink, LinkError, LinkInfo, PinnedLink},
};
use limiter_common::map_names;
use serde::Serialize;

use super::KernelError;

/// Pin name of the sock_ops (counting) link.
pub const LINK_COUNT: &str = "link_sock_ops";
/// Pin name of the sk_lookup (refusing) link.
pub const LINK_REFUSE: &str = "link_sk_lookup";
/// Pin names of XDP links: this prefix and the interface name.
pub const LINK_XDP_PREFIX: &str = "link_xdp_";
/// Every fixed pin the daemon owns; `unload` removes exactly these and the
/// `link_xdp_*` pins: the links first (so the programs detach at once),
/// then every map of the kernel object and the permit ledger, the
/// configuration (which says a gate is here) last. Derived from
/// [`map_names::ALL`], so a map added to the object is unloaded with it.
pub const OWN_PINS: [&str; map_names::ALL.len() + 3] = fixed_pins();

const fn fixed_pins() -> [&'static str; map_names::ALL.len() + 3] {
    let mut out = [""; map_names::ALL.len() + 3];
    out[0] = LINK_REFUSE;
    out[1] = LINK_COUNT;
    let mut n = 2;
    let mut i = 0;
    while i < map_names::ALL.len() {
        // `CONFIG` goes last (compared byte by byte: a const fn cannot
        // use `==` on `&str`).
        if !same(map_names::ALL[i], map_names::CONFIG) {
            out[n] = map_names::ALL[i];
            n += 1;
        }
        i += 1;
    }
    out[n] = map_names::PERMITS;
    out[n + 1] = map_names::CONFIG;
    out
}

/// `a == b`, in a const fn.
const fn same(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// The pin name of the XDP link on `interface`.
pub(super) fn xdp_link(interface: &str) -> String {
    format!("{LINK_XDP_PREFIX}{interface}")
}

/// What a pin directory holds of ours.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum PinState {
    Empty,
    /// Every fixed link pinned: a gate is enforcing.
    Complete,
    /// Some of our pins but not every link: a load that died half-way.
    Partial(Vec<PathBuf>),
}

pub(super) fn pin_state(pin_dir: &Path) -> PinState {
    let present = own_pins(pin_dir);
    if present.is_empty() {
        PinState::Empty
    } else if [LINK_COUNT, LINK_REFUSE].iter().all(|l| pin_dir.join(l).exists()) {
        PinState::Complete
    } else {
        PinState::Partial(present)
    }
}

/// Our pins present in `pin_dir`, the fixed ones and the XDP links.
fn own_pins(pin_dir: &Path) -> Vec<PathBuf> {
    let mut present: Vec<PathBuf> =
        OWN_PINS.iter().map(|name| pin_dir.join(name)).filter(|p| p.exists()).collect();
    present.extend(xdp_pins(pin_dir).into_iter().map(|(_, path)| path));
    present
}

/// The interfaces with a pinned XDP link, sorted.
pub(super) fn xdp_interfaces(pin_dir: &Path) -> Vec<String> {
    xdp_pins(pin_dir).into_iter().map(|(interface, _)| interface).collect()
}

/// `link_xdp_<interface>` pins: (interface, path), sorted.
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

/// Removes the pins of a load that never completed.
pub(super) fn remove_stale(stale: Vec<PathBuf>) -> Result<(), KernelError> {
    tracing::warn!(
        pins = ?stale,
        "removing the pins of a gate whose load never completed (not every link was pinned)"
    );
    for path in stale {
        fs::remove_file(&path)
            .map_err(|e| KernelError::io(format!("removing stale pin {}", path.display()), e))?;
    }
    Ok(())
}

/// What the link pinned at `path` says about itself: `None` when there
/// is no such pin; an error when the pin is there but could not be read
/// (the link's state is then unknown, not detached).
pub(super) fn link_info(path: &Path) -> Result<Option<LinkInfo>, String> {
    match PinnedLink::from_pin(path) {
        Ok(link) => FdLink::from(link).info().map(Some).map_err(|e| format!("reading the link's info: {e}")),
        Err(LinkError::SyscallError(e)) if e.io_error.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("opening the pin: {e}")),
    }
}

/// The pins a load made so far, removed on drop (links first, so nothing
/// runs against half-removed maps) unless the load completed
/// ([`PinRollback::keep`]).
#[derive(Default)]
pub(super) struct PinRollback(Vec<PathBuf>);

impl PinRollback {
    pub(super) fn pin_map(&mut self, map: &Map, path: PathBuf) -> Result<(), KernelError> {
        map.pin(&path).map_err(|source| KernelError::Pin { path: path.clone(), source })?;
        self.0.push(path);
        Ok(())
    }

    pub(super) fn pin_link(&mut self, link: FdLink, path: PathBuf) -> Result<(), KernelError> {
        // Dropping the PinnedLink closes our fd: from here only the pin holds
        // the link, so removing the pin is what detaches the program.
        link.pin(&path).map_err(|source| KernelError::Pin { path: path.clone(), source })?;
        self.0.push(path);
        Ok(())
    }

    /// The load completed: the pins stay.
    pub(super) fn keep(mut self) {
        self.0.clear();
    }
}

impl Drop for PinRollback {
    fn drop(&mut self) {
        for path in self.0.iter().rev() {
            let _ = fs::remove_file(path);
        }
    }
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
    // Not while another process loads or adopts the gate here; a
    // directory removed meanwhile was unloaded by someone else.
    let _held = super::pin_lock::PinLock::acquire(pin_dir, super::pin_lock::WAIT, || {
        Err(KernelError::NotLoaded(pin_dir.to_path_buf()))
    })?;
    let mut out = Unloaded::default();
    let xdp: Vec<String> = xdp_interfaces(pin_dir).iter().map(|i| xdp_link(i)).collect();
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

#[cfg(test)]
mod tests;
