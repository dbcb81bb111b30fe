//! A request's id: what the upstream gets as `X-Request-Id`, the access
//! log as `id`, and the line about a request limiter gave up on while the
//! upstream still worked on it — so an operator can find one request in
//! limiter's logs and in the upstream's.
//!
//! limiter's own ids are 16 hexadecimal digits: 24 random bits drawn when
//! the process starts, then a 40-bit count of the process's requests (each
//! thread takes the count in blocks, so no two threads touch one counter
//! per request). A trusted forwarder's `X-Request-Id` (one to 128 visible
//! ASCII bytes) is kept instead: the id is then the one its own logs show.
//! A client outside `http.trustedForwarders` never chooses the id.

use std::{
    cell::Cell,
    hash::{BuildHasher as _, RandomState},
    sync::{
        LazyLock,
        atomic::{AtomicU64, Ordering},
    },
};

use bytes::Bytes;

/// A request's id.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum RequestId {
    /// limiter's own, as its 16 hexadecimal digits.
    Own([u8; 16]),
    /// A trusted forwarder's `X-Request-Id`.
    Forwarded(Bytes),
}

/// The longest `X-Request-Id` kept from a trusted forwarder.
pub const MAX_FORWARDED: usize = 128;

/// The count's bits; the rest of an id is random per process.
const COUNT_BITS: u32 = 40;

/// Ids a thread takes from the process's count at once.
const BLOCK: u64 = 1 << 16;

static PREFIX: LazyLock<u64> = LazyLock::new(|| RandomState::new().hash_one(0u8) << COUNT_BITS);
static BLOCKS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// The next id of this thread's block, and its block's end.
    static NEXT: Cell<(u64, u64)> = const { Cell::new((0, 0)) };
}

/// The next id of the process's count.
fn next() -> u64 {
    let n = NEXT.with(|next| {
        let (mut n, mut end) = next.get();
        if n == end {
            n = BLOCKS.fetch_add(BLOCK, Ordering::Relaxed);
            end = n + BLOCK;
        }
        next.set((n + 1, end));
        n
    });
    *PREFIX | (n & ((1 << COUNT_BITS) - 1))
}

impl RequestId {
    /// A trusted forwarder's `X-Request-Id` value, if it will do as an id
    /// (one to [`MAX_FORWARDED`] visible ASCII bytes).
    pub fn forwarded(value: Bytes) -> Option<Self> {
        ((1..=MAX_FORWARDED).contains(&value.len()) && value.iter().all(|b| (0x21..0x7f).contains(b)))
            .then_some(Self::Forwarded(value))
    }

    /// A new id of limiter's own.
    pub fn own() -> Self {
        let mut hex = [0u8; 16];
        let n = next();
        for (i, digit) in hex.iter_mut().enumerate() {
            *digit = b"0123456789abcdef"[(n >> (60 - 4 * i) & 0xf) as usize];
        }
        Self::Own(hex)
    }

    pub fn as_bytes(&self) -> &[u8] {
        match self {
            Self::Own(hex) => hex,
            Self::Forwarded(value) => value,
        }
    }

    /// As text (always visible ASCII).
    pub fn as_str(&self) -> &str {
        std::str::from_utf8(self.as_bytes()).unwrap_or("-")
    }
}

impl std::fmt::Display for RequestId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_ids_are_sixteen_hex_digits_and_never_repeat() {
        let ids: std::collections::HashSet<RequestId> = std::thread::scope(|s| {
            let threads: Vec<_> = (0..4)
                .map(|_| s.spawn(|| (0..70_000).map(|_| RequestId::own()).collect::<Vec<_>>()))
                .collect();
            threads.into_iter().flat_map(|t| t.join().unwrap()).collect()
        });
        assert_eq!(ids.len(), 4 * 70_000);
        for id in ids.iter().take(100) {
            assert_eq!(id.as_str().len(), 16);
            assert!(id.as_bytes().iter().all(u8::is_ascii_hexdigit), "{id}");
        }
    }

    #[test]
    fn a_forwarded_id_is_visible_ascii_of_at_most_128_bytes() {
        assert_eq!(RequestId::forwarded(Bytes::from_static(b"edge-42")).unwrap().as_str(), "edge-42");
        for bad in [&b""[..], b"a b", b"\x01", "\u{e9}".as_bytes(), &[b'x'; 129]] {
            assert!(RequestId::forwarded(Bytes::copy_from_slice(bad)).is_none(), "{bad:?}");
        }
        assert!(RequestId::forwarded(Bytes::from(vec![b'x'; 128])).is_some());
    }
}
