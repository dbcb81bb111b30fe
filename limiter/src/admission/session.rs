//! The session a request belongs to: a keyed hash of its `Authorization`
//! value, normalised so that one credential is one session however it is
//! spelled.
//!
//! The scheme is case-insensitive (RFC 9110 §11.1) and separated from the
//! credentials by one or more spaces, so `Bearer T`, `bearer T` and
//! `Bearer  T` are the same session: the key covers the lower-cased scheme
//! and the credentials, with surrounding whitespace trimmed and the
//! credentials themselves compared exactly. A value without a space is a
//! scheme alone. Spelling variants cannot multiply a client's allowance
//! (each would still hold one of the upstream's threads).
//!
//! The key is a SipHash-2-4 under a random 128-bit key: per process, or
//! the one the daemons serving a gate share in their permit ledger (so
//! both count a session under the same key during a handover). Hashes
//! cannot be precomputed from a token; the value itself is never stored.

#[expect(deprecated, reason = "SipHash-2-4 with explicit keys; std keeps it stable")]
use std::hash::SipHasher;
use std::hash::{BuildHasher, Hasher, RandomState};

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

/// Feeds `sink` the normalised form of an `Authorization` value, in
/// pieces: the lower-cased scheme, one space, the credentials as they
/// are. (A scheme is a token, never a space: no other value gives the
/// same bytes.) Every keyed hash of a session is taken over this: the
/// local one here and the fleet's.
pub fn normalised(authorization: &[u8], mut sink: impl FnMut(&[u8])) {
    let (scheme, credentials) = split(authorization);
    let mut lower = [0u8; 32];
    for chunk in scheme.chunks(lower.len()) {
        let out = &mut lower[..chunk.len()];
        for (o, b) in out.iter_mut().zip(chunk) {
            *o = b.to_ascii_lowercase();
        }
        sink(out);
    }
    sink(b" ");
    sink(credentials);
}

/// The scheme and the credentials of an `Authorization` value.
fn split(value: &[u8]) -> (&[u8], &[u8]) {
    let value = value.trim_ascii();
    match value.iter().position(|&b| b == b' ' || b == b'\t') {
        Some(i) => (&value[..i], value[i..].trim_ascii_start()),
        None => (value, b""),
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
    }

    #[test]
    fn keys_are_per_process_unless_seeded_alike() {
        let (a, b) = (SessionKeys::default(), SessionKeys::default());
        assert_ne!(a.key(b"Bearer T"), b.key(b"Bearer T"));
        let (c, d) = (SessionKeys::with_seed((1, 2)), SessionKeys::with_seed((1, 2)));
        assert_eq!(c.key(b"Bearer T"), d.key(b"bearer  T"));
        assert_ne!(c.key(b"Bearer T"), SessionKeys::with_seed((1, 3)).key(b"Bearer T"));
    }

    #[test]
    fn the_normalised_form_is_the_lower_cased_scheme_a_space_and_the_credentials() {
        let form = |v: &[u8]| {
            let mut out = Vec::new();
            normalised(v, |b| out.extend_from_slice(b));
            out
        };
        assert_eq!(form(b" BeArEr  Tok en "), b"bearer Tok en");
        assert_eq!(form(b"Basic"), b"basic ");
        let long = [b'A'; 100];
        assert_eq!(form(&long), [&[b'a'; 100][..], b" "].concat());
    }

    #[test]
    fn values_split_at_the_first_run_of_spaces() {
        assert_eq!(split(b"Bearer  abc def"), (&b"Bearer"[..], &b"abc def"[..]));
        assert_eq!(split(b"  Basic"), (&b"Basic"[..], &b""[..]));
        assert_eq!(split(b""), (&b""[..], &b""[..]));
    }
}
