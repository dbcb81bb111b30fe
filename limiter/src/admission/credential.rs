//! What one credential is, however a client spells it: the normalised
//! form of an `Authorization` value that every keyed hash of a session is
//! taken over (the local limit's SipHash and the fleet's HMAC), so that
//! spelling variants the upstream reads as one credential are one session
//! and cannot multiply a client's allowance.
//!
//! - The scheme is case-insensitive (RFC 9110 §11.1) and separated from
//!   the credentials by one or more spaces; surrounding whitespace goes.
//! - **Basic** (RFC 7617): the credentials are what the upstream decodes.
//!   Jetty decodes them with `java.util.Base64`'s basic decoder, which
//!   takes the padding as optional and ignores the bits past the last
//!   whole byte, so `dXNlcjpwYXM=`, `dXNlcjpwYXM`, `dXNlcjpwYXN=` and
//!   `dXNlcjpwYXP` are all `user:pas`: the key is the decoded bytes. A value
//!   that decoder refuses is keyed as written (the upstream refuses it too).
//! - **Digest** (RFC 7616): the header changes with every request (nonce
//!   count, response): the key is the `username` (or `username*`) and the
//!   `realm`, their quoting undone. Without a username it is keyed as
//!   written.
//! - Any other scheme: the credentials exactly as sent.
//!
//! The forms cannot meet: a header value never holds a NUL, and the decoded
//! and Digest forms start with one.

/// Feeds `sink` the normalised form of an `Authorization` value, in
/// pieces: the lower-cased scheme, one space, then the credentials as the
/// module's doc says.
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
    if scheme.eq_ignore_ascii_case(b"basic") && java_base64(credentials, &mut |_| {}) {
        sink(b"\0decoded ");
        java_base64(credentials, &mut sink);
    } else if scheme.eq_ignore_ascii_case(b"digest")
        && let Some((user, realm)) = digest_identity(credentials)
    {
        sink(b"\0username ");
        unquoted(user, &mut sink);
        sink(b"\0realm ");
        if let Some(realm) = realm {
            unquoted(realm, &mut sink);
        }
    } else {
        sink(credentials);
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

/// The value of a base64 character (the standard alphabet), if it is one.
fn sextet(c: u8) -> Option<u32> {
    Some(u32::from(match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => return None,
    }))
}

/// Decodes `text` as `java.util.Base64.getDecoder()` does, feeding `sink`
/// the bytes: `false` (and what was fed is to be ignored) where Java
/// throws. Its rules: the standard alphabet only (no whitespace); `=`
/// ends the data and must complete the last unit (`xx==` or `xxx=`, never
/// `x=`, `xx=` alone or `=` at a unit's start), with nothing after it; a
/// last unit of two or three characters needs no padding; a lone
/// character in the last unit is refused, as is a text of one character;
/// the bits past the last whole byte are ignored.
fn java_base64(text: &[u8], sink: &mut impl FnMut(&[u8])) -> bool {
    if text.len() == 1 {
        return false;
    }
    let mut out = [0u8; 48];
    let mut filled = 0;
    let (mut bits, mut have) = (0u32, 0u8);
    let mut i = 0;
    while i < text.len() {
        let c = text[i];
        i += 1;
        if c == b'=' {
            match have {
                // `xx==`: the second `=` must follow.
                2 if text.get(i) == Some(&b'=') => i += 1,
                3 => {}
                _ => return false,
            }
            if i != text.len() {
                return false;
            }
            break;
        }
        let Some(v) = sextet(c) else { return false };
        bits = bits << 6 | v;
        have += 1;
        if have == 4 {
            out[filled..filled + 3].copy_from_slice(&bits.to_be_bytes()[1..]);
            filled += 3;
            (bits, have) = (0, 0);
            if filled == out.len() {
                sink(&out);
                filled = 0;
            }
        }
    }
    match have {
        0 => {}
        1 => return false,
        // The leftover bits are ignored, as Java ignores them.
        2 => {
            out[filled] = (bits >> 4) as u8;
            filled += 1;
        }
        _ => {
            out[filled..filled + 2].copy_from_slice(&((bits >> 2) as u16).to_be_bytes());
            filled += 2;
        }
    }
    sink(&out[..filled]);
    true
}

/// A Digest header's `username` (or `username*`) and `realm`, as written
/// (quoted or not); `None` without a username or where the parameters do
/// not parse.
fn digest_identity(params: &[u8]) -> Option<(&[u8], Option<&[u8]>)> {
    let (mut user, mut realm) = (None, None);
    let mut rest = params;
    loop {
        rest = rest.trim_ascii_start();
        while let Some(r) = rest.strip_prefix(b",") {
            rest = r.trim_ascii_start();
        }
        if rest.is_empty() {
            break;
        }
        let name_len = rest.iter().position(|&b| b == b'=' || b == b' ' || b == b'\t')?;
        let name = &rest[..name_len];
        rest = rest[name_len..].trim_ascii_start().strip_prefix(b"=")?.trim_ascii_start();
        let value_len = if rest.first() == Some(&b'"') { quoted_len(rest)? } else { token_len(rest) };
        let value = &rest[..value_len];
        rest = &rest[value_len..];
        if name.eq_ignore_ascii_case(b"username") || name.eq_ignore_ascii_case(b"username*") {
            user = Some(value);
        } else if name.eq_ignore_ascii_case(b"realm") {
            realm = Some(value);
        }
        rest = rest.trim_ascii_start();
        if !rest.is_empty() && rest[0] != b',' {
            return None;
        }
    }
    Some((user?, realm))
}

/// The length of a quoted-string at the start of `s` (quotes included).
fn quoted_len(s: &[u8]) -> Option<usize> {
    let mut i = 1;
    while i < s.len() {
        match s[i] {
            b'\\' => i += 2,
            b'"' => return Some(i + 1),
            _ => i += 1,
        }
    }
    None
}

/// The length of the token (or any value up to a separator) at the start
/// of `s`.
fn token_len(s: &[u8]) -> usize {
    s.iter().position(|&b| b == b',' || b == b' ' || b == b'\t').unwrap_or(s.len())
}

/// Feeds `sink` a parameter's value with its quoting undone.
fn unquoted(value: &[u8], sink: &mut impl FnMut(&[u8])) {
    let Some(inner) = value.strip_prefix(b"\"").and_then(|v| v.strip_suffix(b"\"")) else {
        sink(value);
        return;
    };
    let mut rest = inner;
    while let Some(at) = rest.iter().position(|&b| b == b'\\') {
        sink(&rest[..at]);
        // The escaped byte goes as itself.
        sink(&rest[at + 1..(at + 2).min(rest.len())]);
        rest = rest.get(at + 2..).unwrap_or_default();
    }
    sink(rest);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn form(v: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        normalised(v, |b| out.extend_from_slice(b));
        out
    }

    fn decoded(text: &str) -> Option<Vec<u8>> {
        let mut out = Vec::new();
        java_base64(text.as_bytes(), &mut |b| out.extend_from_slice(b)).then_some(out)
    }

    #[test]
    fn the_normalised_form_is_the_lower_cased_scheme_a_space_and_the_credentials() {
        assert_eq!(form(b" BeArEr  Tok en "), b"bearer Tok en");
        assert_eq!(form(b"Basic"), b"basic \0decoded ");
        let long = [b'A'; 100];
        assert_eq!(form(&long), [&[b'a'; 100][..], b" "].concat());
    }

    #[test]
    fn values_split_at_the_first_run_of_spaces() {
        assert_eq!(split(b"Bearer  abc def"), (&b"Bearer"[..], &b"abc def"[..]));
        assert_eq!(split(b"  Basic"), (&b"Basic"[..], &b""[..]));
        assert_eq!(split(b""), (&b""[..], &b""[..]));
    }

    /// What `java.util.Base64.getDecoder().decode(s)` returns, or that it
    /// throws (checked against a JDK 17 by hand for each line).
    #[test]
    fn base64_is_decoded_as_javas_basic_decoder_decodes_it() {
        let cases: &[(&str, Option<&[u8]>)] = &[
            ("dXNlcjpwYXM=", Some(b"user:pas")),
            ("dXNlcjpwYXM", Some(b"user:pas")),
            ("dXNlcjpwYXN=", Some(b"user:pas")),
            ("dXNlcjpwYXO=", Some(b"user:pas")),
            ("dXNlcjpwYXP", Some(b"user:pas")),
            ("dXNlcjpwYXNz", Some(b"user:pass")),
            ("dXNlcjpwYQ==", Some(b"user:pa")),
            ("dXNlcjpwYQ", Some(b"user:pa")),
            ("dXNlcjpwYR", Some(b"user:pa")),
            ("", Some(b"")),
            // `xx=` without its second `=`, `=` at a unit's start, a lone
            // last character, data after the padding, another alphabet,
            // whitespace, a single character.
            ("dXNlcjpwYQ=", None),
            ("dXNlcjpwYXNz=", None),
            ("dXNlcjpwY", None),
            ("dXNlcjpwY=", None),
            ("dXNlcjpwYXM=x", None),
            ("dXNlcjpwYQ==x", None),
            ("dXNlcj-wYXM", None),
            ("dXNlcjp wYXM", None),
            ("d", None),
            ("=", None),
        ];
        for (text, want) in cases {
            assert_eq!(decoded(text).as_deref(), *want, "{text:?}");
        }
        // Longer than one buffer of output, in pieces.
        let text = "QUJD".repeat(40);
        assert_eq!(decoded(&text).unwrap(), b"ABC".repeat(40));
    }

    #[test]
    fn every_spelling_of_one_basic_credential_is_one_form() {
        let user_pas = form(b"Basic dXNlcjpwYXM=");
        assert_eq!(user_pas, b"basic \0decoded user:pas");
        for same in ["basic dXNlcjpwYXM", "BASIC dXNlcjpwYXN=", "Basic  dXNlcjpwYXO=", " Basic dXNlcjpwYXP "]
        {
            assert_eq!(form(same.as_bytes()), user_pas, "{same:?}");
        }
        assert_ne!(form(b"Basic dXNlcjpwYXNz"), user_pas);
        // What Java refuses is keyed as written: never a decoded form.
        assert_eq!(form(b"Basic dXNlcjpwYQ="), b"basic dXNlcjpwYQ=");
        // Another scheme is never decoded.
        assert_eq!(form(b"Bearer dXNlcjpwYXM="), b"bearer dXNlcjpwYXM=");
    }

    #[test]
    fn digest_is_keyed_by_its_username_and_realm() {
        let a = form(
            br#"Digest username="Mufasa", realm="http-auth@example.org", uri="/dir/index.html", nc=00000001, cnonce="f2/wE4q74E6zIJEtWaHKaf5wv/H5QzzpXusqGemxURZJ", response="8ca523f5e9506fed4657c9700eebdbec", nonce="7ypf/xlj9XXwfDPEoM4URrv/xwf94BcCAzFZH4GiTo0v""#,
        );
        assert_eq!(a, b"digest \0username Mufasa\0realm http-auth@example.org");
        let b = form(
            br#"digest realm="http-auth@example.org",username=Mufasa,nc=00000002, response="0000", nonce="other""#,
        );
        assert_eq!(a, b);
        assert_eq!(form(br#"Digest username="a\"b", realm=r"#), b"digest \0username a\"b\0realm r");
        assert_ne!(form(br#"Digest username="Mufasa", realm="other""#), a);
        // No username, or parameters that do not parse: as written.
        assert_eq!(form(br#"Digest realm="r", nonce="n""#), br#"digest realm="r", nonce="n""#);
        assert_eq!(form(br#"Digest username="unterminated"#), br#"digest username="unterminated"#);
    }

    #[test]
    fn other_schemes_keep_their_credentials_exactly() {
        assert_eq!(form(b"Bearer T"), form(b"bearer   T"));
        assert_ne!(form(b"Bearer T"), form(b"Bearer t"));
        assert_eq!(form(b"Digest a=1,  b=2"), form(b"digest a=1,  b=2"), "no username: as written");
        assert_ne!(form(b"Digest a=1,  b=2"), form(b"Digest a=1, b=2"));
    }
}
