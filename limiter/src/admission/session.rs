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
//! The key is a SipHash under a per-process random key, so hashes cannot
//! be compared across restarts or precomputed from a token; the value
//! itself is never stored.

use std::hash::{BuildHasher, Hasher, RandomState};

/// Derives session keys; one per process.
#[derive(Debug, Default)]
pub(super) struct SessionKeys(RandomState);

impl SessionKeys {
    /// The session key of an `Authorization` value.
    pub(super) fn key(&self, authorization: &[u8]) -> u64 {
        let (scheme, credentials) = split(authorization);
        let mut h = self.0.build_hasher();
        for b in scheme {
            h.write_u8(b.to_ascii_lowercase());
        }
        // A scheme is a token, never a space: nothing else can hash the same.
        h.write_u8(b' ');
        h.write(credentials);
        h.finish()
    }
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
    fn keys_are_per_process() {
        let (a, b) = (SessionKeys::default(), SessionKeys::default());
        assert_ne!(a.key(b"Bearer T"), b.key(b"Bearer T"));
    }

    #[test]
    fn values_split_at_the_first_run_of_spaces() {
        assert_eq!(split(b"Bearer  abc def"), (&b"Bearer"[..], &b"abc def"[..]));
        assert_eq!(split(b"  Basic"), (&b"Basic"[..], &b""[..]));
        assert_eq!(split(b""), (&b""[..], &b""[..]));
    }
}
