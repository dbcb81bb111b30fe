//! What a request head must satisfy before the breaker and admission see
//! it, whichever protocol brought it ([`super::Request::check`] applies
//! these): the headers the proxy itself interprets must mean one thing to
//! the proxy and to the upstream.
//!
//! - `Host`: at most one line, and a valid authority (RFC 9110 §7.2,
//!   RFC 3986 §3.2.2): a registered name or IPv4 address, or a bracketed
//!   IPv6 address, then an optional `:port`; never quotes, spaces, commas,
//!   semicolons or control bytes, so it cannot forge an element of
//!   `Forwarded`. An empty value is allowed (RFC 9112 §3.2); a missing one
//!   too (HTTP/1.0: the proxy names the upstream).
//! - `Authorization`: at most one line: it names the session, and two
//!   would be two sessions to count while the upstream picks one of them.
//! - `Connection`: it may name headers an intermediary drops (RFC 9110
//!   §7.6.1), never the message's own framing or routing. A `Connection`
//!   line naming `Content-Length`, `Transfer-Encoding` or `Host` is
//!   refused (400): obeying it would forward a body without its length
//!   (the upstream then reads the body as the next request) or a request
//!   without its authority.
//! - The request target and its authority (RFC 9112 §3.2, RFC 9113
//!   §8.3.1): an HTTP/1.1 request without `Host` is refused (400); an
//!   authority in the target (HTTP/1 absolute form, HTTP/2 `:authority`)
//!   must be a valid `Host` without userinfo, and on HTTP/2 a `host`
//!   header that names another authority than `:authority` is refused;
//!   the authority form (`GET app:80`) is CONNECT's only, and `*` is
//!   OPTIONS' only.
//!
//! `Transfer-Encoding` is decided where the body's framing is, once: on
//! HTTP/1 by the framing module (a coding list other than a lone
//! `chunked` is refused there, [`Bad::TransferEncoding`] naming the 501 of
//! codings before a final `chunked`); on HTTP/2 h2 refuses the header as
//! connection-specific (RFC 9113 §8.2.2) before limiter sees the stream.
//!
//! A head that fails is answered by the proxy with `Connection: close`
//! (on HTTP/2, its stream ends), never forwarded, takes no breaker ticket
//! and no permit, and is counted by [`Bad::kind`] under
//! `limiter_http_bad_requests_total`.

use std::net::Ipv6Addr;

use hyper::StatusCode;

use super::headers::Seen;

/// Why a request head was refused before admission.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bad {
    /// An invalid `Host`, or more than one.
    Host,
    /// More than one `Authorization`.
    Authorization,
    /// Codings before a final `chunked` (`gzip, chunked`): 501, found by
    /// the framing module as it reads the head.
    TransferEncoding,
    /// A request target this method cannot have (the authority form
    /// outside CONNECT, `*` outside OPTIONS).
    Target,
    /// A `Connection` line naming `Content-Length`, `Transfer-Encoding`
    /// or `Host`.
    Connection,
}

impl Bad {
    /// Every kind, in the order metrics list them.
    pub const ALL: [Bad; 5] =
        [Bad::Host, Bad::Authorization, Bad::TransferEncoding, Bad::Target, Bad::Connection];

    /// The `kind` label of `limiter_http_bad_requests_total`.
    pub fn kind(self) -> &'static str {
        match self {
            Self::Host => "host",
            Self::Authorization => "authorization",
            Self::TransferEncoding => "transfer_encoding",
            Self::Target => "target",
            Self::Connection => "connection",
        }
    }

    pub fn status(self) -> StatusCode {
        match self {
            Self::Host | Self::Authorization | Self::Target | Self::Connection => StatusCode::BAD_REQUEST,
            Self::TransferEncoding => StatusCode::NOT_IMPLEMENTED,
        }
    }

    pub fn text(self) -> &'static str {
        match self {
            Self::Host => {
                "400 Bad Request: the request's authority (Host, or the target's) is missing, invalid, repeated or contradicted\n"
            }
            Self::Target => "400 Bad Request: this method cannot have this request target\n",
            Self::Authorization => "400 Bad Request: more than one Authorization header\n",
            Self::TransferEncoding => "501 Not Implemented: only the chunked transfer coding is supported\n",
            Self::Connection => {
                "400 Bad Request: Connection names a header that frames or routes the request (Content-Length, Transfer-Encoding or Host)\n"
            }
        }
    }

    /// Its place in [`Bad::ALL`] and in the counters.
    pub fn index(self) -> usize {
        self as usize
    }
}

/// Refuses `Connection` lines that name `Content-Length`,
/// `Transfer-Encoding` or `Host` (in any case, anywhere in any line).
pub fn check_connection<'a>(mut values: impl Iterator<Item = &'a [u8]>) -> Result<(), Bad> {
    let framing = |token: &[u8]| {
        let token = token.trim_ascii();
        [&b"content-length"[..], b"transfer-encoding", b"host"].iter().any(|n| token.eq_ignore_ascii_case(n))
    };
    if values.any(|v| v.split(|&b| b == b',').any(framing)) { Err(Bad::Connection) } else { Ok(()) }
}

/// Checks `Host` (its first line's value) and `Authorization`, whose
/// lines `seen` has counted.
pub fn check_lines(host: Option<&[u8]>, seen: &Seen) -> Result<(), Bad> {
    if seen.hosts > 1 || (seen.hosts == 1 && !host.is_some_and(is_valid_host)) {
        return Err(Bad::Host);
    }
    if seen.authorizations > 1 {
        return Err(Bad::Authorization);
    }
    Ok(())
}

/// A target without an authority (the origin form) on HTTP/1.1 and later
/// needs a `Host`: HTTP/1.1 (RFC 9112 §3.2), and HTTP/2 with neither
/// `:authority` nor `host`: the upstream would be told its own name.
pub fn origin_form_host(http11: bool, seen: &Seen) -> Result<(), Bad> {
    if seen.hosts == 0 && http11 { Err(Bad::Host) } else { Ok(()) }
}

/// Whether `value` is a valid `Host`: empty, or `host [":" port]`.
pub fn is_valid_host(value: &[u8]) -> bool {
    if value.is_empty() {
        return true;
    }
    let (valid_host, port) = if let Some(literal) = value.strip_prefix(b"[") {
        let Some(end) = literal.iter().position(|&b| b == b']') else {
            return false;
        };
        let ipv6 = std::str::from_utf8(&literal[..end]).ok().and_then(|s| s.parse::<Ipv6Addr>().ok());
        (ipv6.is_some(), &literal[end + 1..])
    } else {
        let end = value.iter().position(|&b| b == b':').unwrap_or(value.len());
        (end > 0 && is_reg_name(&value[..end]), &value[end..])
    };
    let valid_port = match port.strip_prefix(b":") {
        None => port.is_empty(),
        Some(digits) => {
            (1..=5).contains(&digits.len())
                && digits.iter().all(u8::is_ascii_digit)
                && digits.iter().fold(0u32, |n, d| n * 10 + u32::from(d - b'0')) <= u32::from(u16::MAX)
        }
    };
    valid_host && valid_port
}

/// RFC 3986 `reg-name` (which covers IPv4 addresses): unreserved
/// characters, escapes and sub-delimiters, except `,` and `;`, which
/// delimit elements and pairs in `Forwarded`.
fn is_reg_name(name: &[u8]) -> bool {
    let mut i = 0;
    while i < name.len() {
        match name[i] {
            b'%' => {
                if !name.get(i + 1..i + 3).is_some_and(|hex| hex.iter().all(u8::is_ascii_hexdigit)) {
                    return false;
                }
                i += 3;
            }
            b if REG_NAME[usize::from(b)] => i += 1,
            _ => return false,
        }
    }
    true
}

/// The bytes of a `reg-name` other than `%` escapes, as a table (this runs
/// on every request's `Host`).
static REG_NAME: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        table[b] = c.is_ascii_alphanumeric()
            || matches!(
                c,
                b'-' | b'.' | b'_' | b'~' | b'!' | b'$' | b'&' | b'\'' | b'(' | b')' | b'*' | b'+' | b'='
            );
        b += 1;
    }
    table
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_are_authorities_and_nothing_else() {
        for host in [
            "",
            "app",
            "app.example",
            "app.example:8080",
            "APP-1.example_x~",
            "10.0.0.1",
            "10.0.0.1:80",
            "[::1]",
            "[::1]:8443",
            "[2001:db8::a:b]:1",
            "xn--bcher-kva.example",
            "a%41b",
            "a!$&'()*+=b",
            "app:65535",
            "app:00080",
        ] {
            assert!(is_valid_host(host.as_bytes()), "{host:?} is a valid Host");
        }
        for host in [
            "app\",for=6.6.6.6;host=\"app",
            "\"app\"",
            "app,evil",
            "app;for=1",
            "app example",
            "app\tx",
            "app\\x",
            "app/x",
            "app@x",
            "user@app",
            ":80",
            "app:",
            "app:65536",
            "app:+80",
            "app:80:80",
            "app:8x",
            "app:123456",
            "[::1",
            "[::1]x",
            "[::1]:",
            "[not-v6]",
            "[::1%25eth0]",
            "[v1.x]",
            "::1",
            "a%4",
            "a%zz",
            "caf\u{e9}",
        ] {
            assert!(!is_valid_host(host.as_bytes()), "{host:?} is not a valid Host");
        }
        assert!(!is_valid_host(b"app\x7f"));
        assert!(!is_valid_host(b"app\x80"));
    }

    #[test]
    fn kinds_are_listed_once_each() {
        let kinds: Vec<&str> = Bad::ALL.iter().map(|b| b.kind()).collect();
        assert_eq!(kinds, ["host", "authorization", "transfer_encoding", "target", "connection"]);
        assert!(Bad::ALL.iter().enumerate().all(|(i, b)| b.index() == i));
    }
}
