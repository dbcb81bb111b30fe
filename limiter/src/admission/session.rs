//! The session a request belongs to: a keyed hash of its `Authorization`
//! value, normalised ([`super::credential`]) so that one credential is one
//! session however it is spelled.
//!
//! The key is a SipHash-2-4 under a random 128-bit key: per process, or
//! the one the daemons serving a gate share in their permit ledger (so
//! both count a session under the same key during a handover). Hashes
//! cannot be precomputed from a token; the value itself is never stored.

#[expect(deprecated, reason = "SipHash-2-4 with explicit keys; std keeps it stable")]
use std::hash::SipHasher;
use std::hash::{BuildHasher, Hasher, RandomState};

use super::credential::normalised;

/// Derives session keys.
#[derive(Debug)]
pub(super) struct SessionKeys(u64, u64);

impl Default for SessionKeys {
    /// A random key for this process alone.
    fn default() -> Self {
        Self(random_u64(), random_u64())
    }
}

/// 64 random bits (from the standard library's per-instance random keys).
pub(super) fn random_u64() -> u64 {
    RandomState::new().hash_one(0u8)
}

impl SessionKeys {
    /// Keys under a shared seed.
    pub(super) fn with_seed((k0, k1): (u64, u64)) -> Self {
        Self(k0, k1)
    }

    /// The session key of an `Authorization` value.
    pub(super) fn key(&self, authorization: &[u8]) -> u64 {
        #[expect(deprecated, reason = "see the import")]
        let mut h = SipHasher::new_with_keys(self.0, self.1);
        normalised(authorization, |bytes| h.write(bytes));
        h.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_credential_is_one_session_however_it_is_spelled() {
        let keys = SessionKeys::default();
        let key = |v: &str| keys.key(v.as_bytes());
        let t = key("Bearer T");
        for same in ["bearer T", "BEARER T", "Bearer  T", "Bearer \t T", " Bearer T ", "bEaReR T\t"] {
            assert_eq!(key(same), t, "{same:?}");
        }
        for other in ["Bearer t", "Bearer T2", "Bearer", "Basic T", "BearerT", "Bearer T T", "T"] {
            assert_ne!(key(other), t, "{other:?}");
        }
        assert_eq!(key("Bearer"), key("bearer "));
        assert_eq!(key("Digest a=1,  b=2"), key("digest a=1,  b=2"));
        assert_ne!(key("Digest a=1,  b=2"), key("Digest a=1, b=2"));
        let basic = key("Basic dXNlcjpwYXM=");
        for same in ["Basic dXNlcjpwYXM", "basic dXNlcjpwYXN=", "BASIC dXNlcjpwYXO=", "Basic dXNlcjpwYXP"] {
            assert_eq!(key(same), basic, "{same:?}");
        }
    }

    #[test]
    fn keys_are_per_process_unless_seeded_alike() {
        let (a, b) = (SessionKeys::default(), SessionKeys::default());
        assert_ne!(a.key(b"Bearer T"), b.key(b"Bearer T"));
        let (c, d) = (SessionKeys::with_seed((1, 2)), SessionKeys::with_seed((1, 2)));
        assert_eq!(c.key(b"Bearer T"), d.key(b"bearer  T"));
        assert_ne!(c.key(b"Bearer T"), SessionKeys::with_seed((1, 3)).key(b"Bearer T"));
    }
}
