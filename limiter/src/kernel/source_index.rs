//! Reading the source table at the cost of what changed: the programs bump
//! a change counter per block of 16 slots and per super-block of 1,024
//! after every change of a count (`limiter_common::map_names::SRCVER`), and
//! a reader keeps what it read last with the counters it read it at. A
//! read then costs one batched read of the super-block counters, plus the
//! blocks under a counter that moved: not the size of the table.
//!
//! Counters are read before what they cover, and the programs bump them
//! after the change, so a change a read misses leaves a counter it has not
//! seen yet: the next read picks it up. The first read of a process reads
//! every slot once.

use std::{
    collections::{BTreeMap, HashMap},
    io,
    os::fd::{AsFd as _, OwnedFd},
    sync::Mutex,
};

use limiter_common::{
    SourceKey, SourceSlot,
    source::{self, BLOCK_SLOTS, SUPER_BLOCKS},
};

use super::sys;

/// Groups with connections now, and the number of slots holding them.
pub type Groups = (Vec<(SourceKey, u64)>, u64);

/// The source table and its change index, with what was read last.
pub struct SourceIndex {
    sources: OwnedFd,
    versions: OwnedFd,
    slots: u32,
    last: Mutex<Option<Read>>,
}

/// What a reader saw: every counter, and the live slots of each block
/// that has any.
struct Read {
    counters: Vec<u64>,
    blocks: BTreeMap<u32, Vec<(SourceKey, u32)>>,
    /// Map reads the last refresh made (batched calls), for tests and the
    /// benchmark.
    calls: u64,
}

/// How much a read cost.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReadCost {
    /// `BPF_MAP_LOOKUP_BATCH` calls.
    pub calls: u64,
}

impl SourceIndex {
    pub fn new(sources: OwnedFd, versions: OwnedFd, slots: u32) -> Self {
        Self { sources, versions, slots, last: Mutex::new(None) }
    }

    /// Slots in the table.
    pub fn slots(&self) -> u32 {
        self.slots
    }

    /// Groups with connections now (duplicate slots of one group summed).
    pub fn groups(&self) -> io::Result<(Groups, ReadCost)> {
        let mut last = self.last.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        match last.as_mut() {
            Some(read) => self.refresh(read)?,
            None => *last = Some(self.read_all()?),
        }
        let read = last.as_ref().expect("just set");
        let mut groups: HashMap<SourceKey, u64> = HashMap::new();
        let mut used = 0;
        for (key, count) in read.blocks.values().flatten() {
            used += 1;
            *groups.entry(*key).or_default() += u64::from(*count);
        }
        Ok(((groups.into_iter().collect(), used), ReadCost { calls: read.calls }))
    }

    /// Every counter, then every slot.
    fn read_all(&self) -> io::Result<Read> {
        let mut calls = 0;
        let counters = read_range(&self.versions, 0, source::index_len(self.slots), &mut calls)?;
        let mut blocks = BTreeMap::new();
        let slots: Vec<SourceSlot> = read_range(&self.sources, 0, self.slots, &mut calls)?;
        for (b, chunk) in slots.chunks(BLOCK_SLOTS as usize).enumerate() {
            let live = live(chunk);
            if !live.is_empty() {
                blocks.insert(b as u32, live);
            }
        }
        Ok(Read { counters, blocks, calls })
    }

    /// Rereads the super-blocks whose counter moved, and in them the blocks
    /// whose counter moved.
    fn refresh(&self, read: &mut Read) -> io::Result<()> {
        let mut calls = 0;
        let blocks = source::blocks(self.slots);
        let supers = source::index_len(self.slots) - blocks;
        let now: Vec<u64> = read_range(&self.versions, blocks, supers, &mut calls)?;
        for (s, &counter) in (0..supers).zip(&now) {
            if read.counters[(blocks + s) as usize] == counter {
                continue;
            }
            let first = s * SUPER_BLOCKS;
            let n = SUPER_BLOCKS.min(blocks - first);
            let block_counters: Vec<u64> = read_range(&self.versions, first, n, &mut calls)?;
            for (b, &bc) in (first..first + n).zip(&block_counters) {
                if read.counters[b as usize] == bc {
                    continue;
                }
                let slots: Vec<SourceSlot> = read_range(
                    &self.sources,
                    b * BLOCK_SLOTS,
                    BLOCK_SLOTS.min(self.slots - b * BLOCK_SLOTS),
                    &mut calls,
                )?;
                let live = live(&slots);
                if live.is_empty() {
                    read.blocks.remove(&b);
                } else {
                    read.blocks.insert(b, live);
                }
                read.counters[b as usize] = bc;
            }
            read.counters[(blocks + s) as usize] = counter;
        }
        read.calls = calls;
        Ok(())
    }
}

/// The live slots with connections among `slots`.
fn live(slots: &[SourceSlot]) -> Vec<(SourceKey, u32)> {
    slots
        .iter()
        .filter(|s| source::state(s.word) == source::LIVE && source::count(s.word) > 0)
        .map(|s| (s.key, source::count(s.word)))
        .collect()
}

/// Elements `first..first + n` of an array map, in batches of at most
/// 8,192; counts the calls.
fn read_range<T: bytemuck::Pod>(map: &OwnedFd, first: u32, n: u32, calls: &mut u64) -> io::Result<Vec<T>> {
    const BATCH: u32 = 8192;
    let size = size_of::<T>();
    let mut out = Vec::with_capacity(n as usize);
    let mut buf = vec![0u8; BATCH.min(n.max(1)) as usize * size];
    let mut at = first;
    while at < first + n {
        let want = BATCH.min(first + n - at) as usize;
        let after = at.checked_sub(1);
        let (read, _) = sys::array_lookup_batch(map.as_fd(), after, &mut buf[..want * size], size)?;
        *calls += 1;
        if read == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, format!("no element at index {at}")));
        }
        out.extend(buf[..read * size].chunks_exact(size).map(bytemuck::pod_read_unaligned::<T>));
        at += read as u32;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use limiter_common::source::{BLOCK_SLOTS, SUPER_BLOCKS, blocks, index_entries, index_len};

    #[test]
    fn every_slot_has_a_block_and_a_super_block_inside_the_index() {
        for slots in [1024u32, 4096, 65_536, 1 << 20] {
            let len = index_len(slots);
            assert_eq!(len, slots / BLOCK_SLOTS + slots / (BLOCK_SLOTS * SUPER_BLOCKS));
            for slot in [0, 15, 16, 1023, 1024, slots - 1].into_iter().filter(|&s| s < slots) {
                let [b, s] = index_entries(slot, slots);
                assert_eq!(b, slot / BLOCK_SLOTS);
                assert!(b < blocks(slots) && (blocks(slots)..len).contains(&s), "{slots} {slot}");
                assert_eq!(s - blocks(slots), slot / (BLOCK_SLOTS * SUPER_BLOCKS));
            }
        }
    }
}
