//! A request head as the native engine reads it: parsed once by httparse
//! (as hyper parses it), checked by the same rules as on hyper's path
//! ([`super::super::head`], [`super::super::headers`]), and written for
//! the upstream in one pass over the client's own lines: hop-by-hop and
//! client-sent forwarding headers left out, limiter's forwarding headers
//! added, everything else byte for byte as the client sent it.
//!
//! What this engine does not serve itself it hands over, with the bytes
//! read so far, to hyper, which then serves the rest of the connection:
//! a head httparse does not accept (hyper answers it), a target other than
//! the origin form (absolute form, `*`, `CONNECT`'s), a target byte outside
//! the plain URI set, HTTP/1.0, `Upgrade`, `Expect`, and framing that is
//! not one plain `Content-Length` or one `Transfer-Encoding: chunked`.

use std::ops::Range;

use hyper::header::HeaderValue;

use super::super::{
    Tuning,
    head::{self, Bad},
    headers::{FORWARDING, Forwarding, Rewrite, Seen, connection_named, forwarding_index, is_hop_by_hop},
    path::{class_of, is_debug_path},
};
use crate::admission::Class;

/// As many header lines as hyper's HTTP/1 server reads.
pub const MAX_HEADERS: usize = 100;

/// How a request's body is framed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Framed {
    None,
    Length(u64),
    Chunked,
}

/// A request head the native engine serves.
pub struct Head {
    /// Its bytes at the front of the connection's buffer.
    pub len: usize,
    pub method: hyper::Method,
    /// The target, in the buffer.
    pub target: Range<usize>,
    pub debug: bool,
    pub class: Class,
    pub web: bool,
    /// The `Authorization` value, in the buffer.
    pub session: Option<Range<usize>>,
    pub body: Framed,
    /// The client asked to close after this request.
    pub close: bool,
    /// The head for the upstream, without its final CRLF (a chunked body
    /// adds its `Transfer-Encoding`).
    pub upstream: Vec<u8>,
}

/// What the bytes at the front of the buffer are.
pub enum Parsed {
    /// Not a whole head yet.
    Partial,
    /// A head to serve.
    Head(Box<Head>),
    /// A head refused before admission (its answer closes the connection;
    /// a `HEAD`'s has no body): why, its method and its target (in the
    /// buffer).
    Bad(Bad, hyper::Method, Range<usize>),
    /// Not this engine's to serve: hyper takes the connection over.
    HandOver,
}

/// Parses the head at the front of `buf` and, when it is this engine's,
/// writes its upstream head.
pub fn parse(buf: &[u8], fwd: &Forwarding, tuning: &Tuning) -> Parsed {
    let mut lines = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut lines);
    let len = match req.parse(buf) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Parsed::Partial,
        Err(_) => return Parsed::HandOver,
    };
    let (Some(method), Some(target), Some(1)) = (req.method, req.path, req.version) else {
        return Parsed::HandOver;
    };
    if !target.starts_with('/') || !target.bytes().all(|b| URI[usize::from(b)]) {
        return Parsed::HandOver;
    }
    let Ok(method) = hyper::Method::from_bytes(method.as_bytes()) else { return Parsed::HandOver };
    if method == hyper::Method::CONNECT {
        return Parsed::HandOver;
    }
    let headers = &*req.headers;
    let seen = Seen::of_names(headers.iter().map(|h| h.name.as_bytes()));
    if seen.upgrade() {
        return Parsed::HandOver;
    }
    let mut host = None;
    let mut coding = None;
    let mut last_coding: Option<&[u8]> = None;
    let mut length: Option<&[u8]> = None;
    let mut lengths = 0;
    let mut session = None;
    let mut close = false;
    let at = |s: &[u8]| s.as_ptr() as usize - buf.as_ptr() as usize;
    for h in headers {
        let name = h.name.as_bytes();
        match name.len() {
            4 if name.eq_ignore_ascii_case(b"host") => host = host.or(Some(h.value)),
            6 if name.eq_ignore_ascii_case(b"expect") => return Parsed::HandOver,
            10 if name.eq_ignore_ascii_case(b"connection") => {
                close |= h.value.split(|&b| b == b',').any(|t| t.trim_ascii().eq_ignore_ascii_case(b"close"));
            }
            13 if name.eq_ignore_ascii_case(b"authorization") => {
                session = session.or(Some(at(h.value)..at(h.value) + h.value.len()));
            }
            14 if name.eq_ignore_ascii_case(b"content-length") => {
                lengths += 1;
                length = Some(h.value);
            }
            17 if name.eq_ignore_ascii_case(b"transfer-encoding") => {
                coding = coding.or(Some(h.value));
                last_coding = Some(h.value);
            }
            _ => {}
        }
    }
    // The framing first: what hyper refuses as it parses the head, it
    // refuses before any of limiter's own checks.
    if last_coding.is_some_and(|c| !last_is_chunked(c)) {
        return Parsed::HandOver;
    }
    let body = match (coding, length) {
        (None, None) => Framed::None,
        (Some(_), None) => Framed::Chunked,
        (None, Some(digits))
            if lengths == 1 && !digits.is_empty() && digits.iter().all(u8::is_ascii_digit) =>
        {
            match std::str::from_utf8(digits).ok().and_then(|d| d.parse::<u64>().ok()) {
                Some(0) => Framed::None,
                Some(n) => Framed::Length(n),
                None => return Parsed::HandOver,
            }
        }
        // Both (the smuggling probe), several lengths, or one hyper may
        // read otherwise: hyper decides, and the framing watch in front of
        // it refuses the conflict.
        _ => return Parsed::HandOver,
    };
    let connection = headers.iter().filter(|h| h.name.eq_ignore_ascii_case("connection")).map(|h| h.value);
    if let Err(bad) = head::check_lines(host, coding, &seen)
        .and_then(|()| head::check_connection(connection))
        .and_then(|()| head::origin_form_host(true, &seen))
    {
        return Parsed::Bad(bad, method, at(target.as_bytes())..at(target.as_bytes()) + target.len());
    }
    let path = target.split('?').next().unwrap_or(target);
    let debug = is_debug_path(path);
    let class = if debug { Class::Normal } else { class_of(path, &tuning.critical, &tuning.sheddable) };
    let target_range = at(target.as_bytes())..at(target.as_bytes()) + target.len();
    let upstream = upstream_head(&method, target, headers, &seen, host, fwd);
    Parsed::Head(Box::new(Head {
        len,
        method,
        target: target_range,
        debug,
        class,
        web: seen.client_id,
        session: if seen.authorizations == 0 { None } else { session },
        body,
        close,
        upstream,
    }))
}

/// Whether a `Transfer-Encoding` value's last coding is `chunked`, as
/// hyper reads it (and the framing watch with it): the last piece after a
/// comma, trimmed, without case; a value with a byte beyond ASCII is not.
fn last_is_chunked(value: &[u8]) -> bool {
    value.is_ascii()
        && value
            .rsplit(|&b| b == b',')
            .next()
            .is_some_and(|c| c.trim_ascii().eq_ignore_ascii_case(b"chunked"))
}

/// The head the upstream gets: the request line in HTTP/1.1, the client's
/// lines less hop-by-hop and forwarding ones, then limiter's forwarding
/// headers; no final CRLF.
fn upstream_head(
    method: &hyper::Method,
    target: &str,
    headers: &[httparse::Header<'_>],
    seen: &Seen,
    host: Option<&[u8]>,
    fwd: &Forwarding,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(512);
    out.extend_from_slice(method.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(target.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\n");
    let mut rewrite = Lines { headers, drop: 0, extended: [None, None], tail: Vec::new() };
    fwd.apply(&mut rewrite, host, seen);
    let named = named_by_connection(headers, seen);
    let mut extended = rewrite.extended;
    for h in headers {
        let name = h.name.as_bytes();
        if seen.any_hop_by_hop() && is_hop_by_hop(name, &named) {
            continue;
        }
        if let Some(i) = forwarding_index(name) {
            if rewrite.drop & (1 << i) != 0 {
                continue;
            }
            if let Some(chain) = extended.get_mut(i) {
                // An extended chain goes where its first line was, once.
                if let Some(value) = chain.take() {
                    line(&mut out, FORWARDING[i].as_str().as_bytes(), &value);
                }
                continue;
            }
        }
        line(&mut out, name, h.value);
    }
    out.extend_from_slice(&rewrite.tail);
    out
}

/// The headers a head's `Connection` lines name (see
/// [`connection_named`]); none to look for without a hop-by-hop line.
pub(super) fn named_by_connection<'h>(headers: &[httparse::Header<'h>], seen: &Seen) -> Vec<&'h [u8]> {
    if !seen.any_hop_by_hop() {
        return Vec::new();
    }
    connection_named(headers.iter().filter(|h| h.name.eq_ignore_ascii_case("connection")).map(|h| h.value))
        .collect()
}

fn line(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// The forwarding rules' changes to a head being written: lines of the
/// client's to leave out, chains extended in place, lines added at the
/// end (as a [`hyper::HeaderMap`] appends a name it did not have).
struct Lines<'a, 'h> {
    headers: &'a [httparse::Header<'h>],
    /// Bits of [`FORWARDING`] whose client lines are left out.
    drop: u32,
    /// `X-Forwarded-For` and `Forwarded` extended (places 0 and 1).
    extended: [Option<Vec<u8>>; 2],
    tail: Vec<u8>,
}

impl Rewrite for Lines<'_, '_> {
    fn remove(&mut self, at: usize) {
        self.drop |= 1 << at;
    }

    fn set(&mut self, at: usize, value: &HeaderValue) {
        self.drop |= 1 << at;
        line(&mut self.tail, FORWARDING[at].as_str().as_bytes(), value.as_bytes());
    }

    fn extend(&mut self, at: usize, value: Vec<u8>) {
        let name = FORWARDING[at].as_str();
        let mut chain = Vec::with_capacity(value.len() + 64);
        for h in self.headers.iter().filter(|h| h.name.eq_ignore_ascii_case(name)) {
            chain.extend_from_slice(h.value);
            chain.extend_from_slice(b", ");
        }
        let prior = !chain.is_empty();
        chain.extend_from_slice(&value);
        match self.extended.get_mut(at) {
            Some(slot) if prior => *slot = Some(chain),
            _ => {
                self.drop |= 1 << at;
                line(&mut self.tail, name.as_bytes(), &chain);
            }
        }
    }
}

/// The bytes of a target this engine passes as they are: unreserved,
/// sub-delimiters, `:`, `@`, `/`, `?` and `%` (anything else, hyper
/// decides).
static URI: [bool; 256] = {
    let mut t = [false; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        t[b] = c.is_ascii_alphanumeric()
            || matches!(
                c,
                b'-' | b'.'
                    | b'_'
                    | b'~'
                    | b'!'
                    | b'$'
                    | b'&'
                    | b'\''
                    | b'('
                    | b')'
                    | b'*'
                    | b'+'
                    | b','
                    | b';'
                    | b'='
                    | b':'
                    | b'@'
                    | b'/'
                    | b'?'
                    | b'%'
            );
        b += 1;
    }
    t
};
