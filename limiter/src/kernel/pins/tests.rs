//! Pin-state classification and `unload`, on a temporary directory of
//! plain files (the functions look only at names).

use std::{
    fs,
    path::{Path, PathBuf},
    sync::atomic::{AtomicU32, Ordering},
};

use super::*;

/// A fresh directory under the system's temporary directory, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Self {
        static SEQ: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "limiter-pins-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }

    fn with(self, names: &[&str]) -> Self {
        for name in names {
            fs::write(self.0.join(name), b"").unwrap();
        }
        self
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn names(dir: &Path, paths: &[PathBuf]) -> Vec<String> {
    let mut out: Vec<String> =
        paths.iter().map(|p| p.strip_prefix(dir).unwrap().to_string_lossy().into_owned()).collect();
    out.sort();
    out
}

#[test]
fn a_directory_without_our_pins_is_empty_whatever_else_it_holds() {
    let dir = TempDir::new();
    assert_eq!(pin_state(&dir.0), PinState::Empty);
    let dir = dir.with(&["someone_elses_map", "link_sock_ops.bak"]);
    assert_eq!(pin_state(&dir.0), PinState::Empty);
    assert_eq!(pin_state(&dir.0.join("no-such-dir")), PinState::Empty);
}

#[test]
fn both_fixed_links_make_a_complete_gate() {
    let dir = TempDir::new().with(&[LINK_COUNT, LINK_REFUSE, "someone_elses_map"]);
    assert_eq!(pin_state(&dir.0), PinState::Complete);
}

#[test]
fn maps_or_one_link_alone_are_a_load_that_died_half_way() {
    let dir = TempDir::new().with(&[map_names::CONFIG, map_names::LIMITS, "link_xdp_veth0", "foreign"]);
    let PinState::Partial(stale) = pin_state(&dir.0) else { panic!("not partial") };
    // Ours only, the XDP link included; never the foreign file.
    assert_eq!(names(&dir.0, &stale), ["LIMITER_CONFIG", "LIMITER_LIMITS", "link_xdp_veth0"]);
    remove_stale(stale).unwrap();
    assert_eq!(pin_state(&dir.0), PinState::Empty);
    assert!(dir.0.join("foreign").exists());

    let dir = TempDir::new().with(&[LINK_COUNT]);
    assert!(matches!(pin_state(&dir.0), PinState::Partial(p) if p == [dir.0.join(LINK_COUNT)]));
}

#[test]
fn xdp_links_are_found_by_prefix_and_sorted() {
    let dir = TempDir::new().with(&["link_xdp_veth1", "link_xdp_eth0", "link_xdpfoo", LINK_COUNT]);
    assert_eq!(xdp_interfaces(&dir.0), ["eth0", "veth1"]);
    assert_eq!(xdp_link("eth0"), "link_xdp_eth0");
}

#[test]
fn our_pins_are_the_links_every_map_of_the_object_and_the_ledger_config_last() {
    for name in map_names::ALL.iter().chain([&map_names::PERMITS, &LINK_COUNT, &LINK_REFUSE]) {
        assert_eq!(OWN_PINS.iter().filter(|p| *p == name).count(), 1, "{name}");
    }
    assert!(OWN_PINS.iter().all(|p| !p.is_empty()));
    assert_eq!(&OWN_PINS[..2], [LINK_REFUSE, LINK_COUNT], "links first");
    assert_eq!(OWN_PINS.last(), Some(&map_names::CONFIG));
}

#[test]
fn unload_removes_only_our_pins_and_keeps_a_directory_that_is_not_empty() {
    let mut all: Vec<&str> = OWN_PINS.to_vec();
    all.extend(["link_xdp_veth0", "someone_elses_map"]);
    let dir = TempDir::new().with(&all);
    let out = unload(&dir.0).unwrap();
    assert_eq!(out.removed.len(), OWN_PINS.len() + 1);
    assert_eq!(out.removed[0], dir.0.join("link_xdp_veth0"), "links go first");
    assert_eq!(out.foreign, [dir.0.join("someone_elses_map")]);
    assert!(!out.removed_dir && dir.0.join("someone_elses_map").exists());
    // Nothing of ours is left: a second unload says so.
    let again = unload(&dir.0).unwrap_err();
    assert_eq!(
        again.to_string(),
        format!("no gate is pinned at {}: start it with `limiter run`", dir.0.display())
    );
}

#[test]
fn unload_removes_the_directory_it_emptied() {
    let dir = TempDir::new().with(&[LINK_COUNT, LINK_REFUSE, map_names::CONFIG]);
    let out = unload(&dir.0).unwrap();
    assert_eq!(names(&dir.0, &out.removed), ["LIMITER_CONFIG", "link_sk_lookup", "link_sock_ops"]);
    assert!(out.removed_dir && !dir.0.exists());
    assert!(matches!(unload(&dir.0), Err(KernelError::NotLoaded(_))));
}
