//! The TLS certificate pair (`http.tls.certFile`, `http.tls.keyFile`):
//! read from PEM, checked (a key, one that matches the certificate, a
//! certificate still valid), and turned into the rustls configuration new
//! handshakes use. The crypto provider is rustls' `ring` one: it builds
//! from the crate registry with the C compiler every Rust toolchain here
//! already needs, where aws-lc-rs would also need cmake.
//!
//! A configuration is loaded (at start, reload and `check-config`) with
//! its pair read and checked, so a bad file is refused before anything
//! changes; a reload that changes the files' contents swaps the pair for
//! new handshakes, and established connections keep theirs.

use std::{
    fmt,
    path::Path,
    sync::Arc,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use rustls::{
    ServerConfig,
    crypto::ring,
    pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject as _},
    sign::CertifiedKey,
};

/// ALPN protocols the TLS listener offers, preferred first.
pub const ALPN: [&[u8]; 2] = [b"h2", b"http/1.1"];

/// Which file a bad pair is blamed on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Blame {
    Cert,
    Key,
}

/// A checked certificate chain and its private key.
#[derive(Clone)]
pub struct Pair {
    pub chain: Vec<CertificateDer<'static>>,
    key: Arc<PrivateKeyDer<'static>>,
    /// What new handshakes use, built once when the pair is loaded.
    server: Arc<ServerConfig>,
}

impl PartialEq for Pair {
    fn eq(&self, other: &Self) -> bool {
        self.chain == other.chain && self.key.secret_der() == other.key.secret_der()
    }
}

impl Eq for Pair {}

impl fmt::Debug for Pair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pair").field("certificates", &self.chain.len()).finish_non_exhaustive()
    }
}

impl Pair {
    /// Reads and checks the pair. `Err` names the file and what is wrong
    /// with its PEM; an expired (or not yet valid) certificate is not an
    /// error but comes back as [`Pair::warning`].
    pub fn load(cert_file: &Path, key_file: &Path) -> Result<Self, (Blame, String)> {
        let cert = |m| (Blame::Cert, m);
        let key = |m| (Blame::Key, m);
        let cert_text = read(cert_file).map_err(cert)?;
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&cert_text)
            .collect::<Result<_, _>>()
            .map_err(|e| cert(format!("{}: not a PEM certificate chain ({e})", cert_file.display())))?;
        if chain.is_empty() {
            return Err(cert(format!("{}: no CERTIFICATE block in the file", cert_file.display())));
        }
        let key_text = read(key_file).map_err(key)?;
        let private = PrivateKeyDer::from_pem_slice(&key_text).map_err(|e| {
            key(format!(
                "{}: no private key (a PRIVATE KEY, RSA PRIVATE KEY or EC PRIVATE KEY block): {e}",
                key_file.display()
            ))
        })?;
        let provider = ring::default_provider();
        let signing = provider
            .key_provider
            .load_private_key(private.clone_key())
            .map_err(|e| key(format!("{}: unusable private key: {e}", key_file.display())))?;
        match CertifiedKey::new(chain.clone(), signing).keys_match() {
            Ok(()) => {}
            Err(rustls::Error::InconsistentKeys(e)) => {
                return Err(key(format!(
                    "{}: the key does not match the certificate in {} ({e:?})",
                    key_file.display(),
                    cert_file.display()
                )));
            }
            Err(e) => {
                return Err(cert(format!("{}: the certificate cannot be used: {e}", cert_file.display())));
            }
        }
        let server = server_config(&chain, &private)
            .map_err(|e| key(format!("{}: rustls refuses the pair: {e}", key_file.display())))?;
        Ok(Self { chain, key: Arc::new(private), server })
    }

    /// What an operator should know about a pair that loads: an expired
    /// certificate (clients will refuse it) or one not valid yet.
    pub fn warning(&self, cert_file: &Path) -> Option<String> {
        let now = SystemTime::now();
        let (before, after) = validity(&self.chain[0])?;
        if after < now {
            Some(format!(
                "{}: the certificate expired at {}",
                cert_file.display(),
                crate::utc::rfc3339(after)
            ))
        } else if before > now {
            Some(format!(
                "{}: the certificate is not valid before {}",
                cert_file.display(),
                crate::utc::rfc3339(before)
            ))
        } else {
            None
        }
    }

    /// The rustls configuration of new handshakes.
    pub fn server_config(&self) -> Arc<ServerConfig> {
        self.server.clone()
    }
}

/// TLS 1.3 and 1.2, ALPN `h2` then `http/1.1`, no client certificates.
fn server_config(
    chain: &[CertificateDer<'static>],
    key: &PrivateKeyDer<'static>,
) -> Result<Arc<ServerConfig>, rustls::Error> {
    let mut config = ServerConfig::builder_with_provider(Arc::new(ring::default_provider()))
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?
        .with_no_client_auth()
        .with_single_cert(chain.to_vec(), key.clone_key())?;
    config.alpn_protocols = ALPN.iter().map(|p| p.to_vec()).collect();
    Ok(Arc::new(config))
}

fn read(path: &Path) -> Result<Vec<u8>, String> {
    use std::io::Read as _;
    let mut bytes = Vec::new();
    crate::dir_trust::open_trusted(path)?
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    Ok(bytes)
}

/// `notBefore` and `notAfter` of a DER certificate, read with the few DER
/// rules the path to them needs (rustls does not expose them). `None` for
/// anything that does not parse: the handshake's own checks stand.
pub fn validity(cert: &[u8]) -> Option<(SystemTime, SystemTime)> {
    let (cert_body, _) = der(cert, 0x30)?;
    let (tbs, _) = der(cert_body, 0x30)?;
    let mut rest = tbs;
    if rest.first() == Some(&0xa0) {
        rest = der(rest, 0xa0)?.1; // [0] version
    }
    rest = der(rest, 0x02)?.1; // serialNumber
    rest = der(rest, 0x30)?.1; // signature
    rest = der(rest, 0x30)?.1; // issuer
    let (validity, _) = der(rest, 0x30)?;
    let (before, rest) = time(validity)?;
    let (after, _) = time(rest)?;
    Some((before, after))
}

/// One DER element of tag `tag` at the start of `input`: its contents and
/// what follows it.
fn der(input: &[u8], tag: u8) -> Option<(&[u8], &[u8])> {
    let (&t, rest) = input.split_first()?;
    if t != tag {
        return None;
    }
    let (&first, mut rest) = rest.split_first()?;
    let len = if first < 0x80 {
        usize::from(first)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let len = rest[..n].iter().fold(0usize, |acc, &b| (acc << 8) | usize::from(b));
        rest = &rest[n..];
        len
    };
    (rest.len() >= len).then(|| rest.split_at(len))
}

/// A UTCTime or GeneralizedTime (`...Z`), and what follows it.
fn time(input: &[u8]) -> Option<(SystemTime, &[u8])> {
    let (digits, rest, year) = match input.first()? {
        0x17 => {
            let (t, rest) = der(input, 0x17)?;
            let yy = num(t.get(..2)?)?;
            (t.get(2..)?, rest, if yy >= 50 { 1900 + yy } else { 2000 + yy })
        }
        0x18 => {
            let (t, rest) = der(input, 0x18)?;
            (t.get(4..)?, rest, num(t.get(..4)?)?)
        }
        _ => return None,
    };
    if digits.len() != 11 || digits[10] != b'Z' {
        return None;
    }
    let field = |i: usize| num(&digits[i..i + 2]);
    let (month, day, hour, minute, second) = (field(0)?, field(2)?, field(4)?, field(6)?, field(8)?);
    let days = crate::utc::days_from_civil(year, month, day)?;
    let secs = days.checked_mul(86_400)? + hour * 3600 + minute * 60 + second;
    Some((UNIX_EPOCH + Duration::from_secs(secs), rest))
}

fn num(digits: &[u8]) -> Option<u64> {
    digits.iter().try_fold(0u64, |acc, &d| d.is_ascii_digit().then(|| acc * 10 + u64::from(d - b'0')))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn der_times_parse_in_both_forms() {
        let utc = b"\x17\x0d491231235959Z";
        let (t, rest) = time(utc).unwrap();
        assert!(rest.is_empty());
        assert_eq!(crate::utc::rfc3339(t), "2049-12-31T23:59:59.000Z");
        let utc_1900s = b"\x17\x0d991231235959Z";
        assert!(time(utc_1900s).is_some_and(|(t, _)| crate::utc::rfc3339(t).starts_with("1999-")));
        let general = b"\x18\x0f20991231235959Z";
        assert_eq!(crate::utc::rfc3339(time(general).unwrap().0), "2099-12-31T23:59:59.000Z");
        assert!(time(b"\x17\x0d4912312359590").is_none(), "not Z");
        assert!(time(b"\x17\x0c49123123595Z").is_none(), "too short");
    }

    #[test]
    fn lengths_in_long_form_and_truncation() {
        let mut long = vec![0x30, 0x82, 0x01, 0x00];
        long.extend(std::iter::repeat_n(0u8, 256));
        let (body, rest) = der(&long, 0x30).unwrap();
        assert_eq!((body.len(), rest.len()), (256, 0));
        assert!(der(&long[..100], 0x30).is_none(), "contents shorter than the length");
        assert!(der(&[0x30, 0x80], 0x30).is_none(), "indefinite length is not DER");
        assert!(der(&[0x31, 0x00], 0x30).is_none(), "wrong tag");
    }
}
