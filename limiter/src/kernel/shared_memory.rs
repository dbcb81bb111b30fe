//! Memory the daemons serving one gate share: an array map of one element
//! pinned in the gate's directory and mapped into each daemon
//! (`BPF_F_MMAPABLE`). No kernel program reads it; it lives as long as the
//! gate's pins, so a daemon that starts beside another finds it by the pin
//! path they share. What goes in it is the caller's (`admission::ledger`).

use std::{io, os::fd::AsFd as _, path::Path};

use limiter_common::map_names;

use super::{KernelError, sys};
pub use sys::Mapping;

/// Maps the shared memory of the gate pinned in `pin_dir`, creating and
/// pinning it (`bytes` long, a multiple of 8) if it is not there yet.
pub fn open(pin_dir: &Path, bytes: u32) -> Result<Mapping, KernelError> {
    let name = map_names::PERMITS;
    let path = pin_dir.join(name);
    let fd = match sys::obj_get(&path) {
        Ok(fd) => fd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let fd = sys::create_mmapable(name, bytes)
                .map_err(|e| KernelError::io(format!("creating {name}"), e))?;
            match sys::obj_pin(fd.as_fd(), &path) {
                Ok(()) => fd,
                // Another daemon pinned its own first: share that one.
                Err(e) if e.raw_os_error() == Some(libc::EEXIST) => sys::obj_get(&path)
                    .map_err(|e| KernelError::io(format!("opening {}", path.display()), e))?,
                Err(e) => return Err(KernelError::io(format!("pinning {}", path.display()), e)),
            }
        }
        Err(e) => return Err(KernelError::io(format!("opening {}", path.display()), e)),
    };
    let info = aya::maps::MapInfo::from_pin(&path)
        .map_err(|e| KernelError::io(format!("reading {}", path.display()), io::Error::other(e)))?;
    if info.value_size() != bytes || info.max_entries() != 1 {
        return Err(KernelError::io(
            format!("opening {}", path.display()),
            io::Error::other(format!(
                "it holds {} element(s) of {} bytes, this limiter uses one of {bytes}",
                info.max_entries(),
                info.value_size()
            )),
        ));
    }
    Mapping::new(fd.as_fd(), bytes as usize)
        .map_err(|e| KernelError::io(format!("mapping {}", path.display()), e))
}
