//! HTTP/1.x on the wire, in one place, for both directions: request heads
//! from clients, response heads from the upstream, and the bodies of both
//! ([`body`]). Everything here reads strictly, as RFC 9112 asks of a
//! proxy, and everything limiter sends is written by limiter: a message
//! that two readers of HTTP/1.1 could frame differently is refused before
//! any of it goes on, never relayed.
//!
//! Heads are parsed by httparse (no obs-fold, no space before a colon, no
//! bare CR; a bare LF ending a head's line is read as a line end, and the
//! head limiter writes ends every line with CRLF). The body's framing is
//! decided here, once (RFC 9112 §6.3):
//!
//! - a request's: `Transfer-Encoding: chunked` (exactly that coding, on one
//!   line) or one `Content-Length` of digits (several lines must agree), or
//!   none; both together, a length that is not digits, lengths that differ,
//!   a coding list whose last coding is not `chunked`, or any coding in an
//!   HTTP/1.0 request is refused (400, `framing_conflict`); codings before a
//!   final `chunked` (`gzip, chunked`) get 501 (`transfer_encoding`);
//! - a response's: none for `HEAD`, 1xx, 204 and 304; chunked when the
//!   last coding is `chunked`; until the upstream closes for any other
//!   coding or no framing at all; else its length, which must be digits
//!   and agree across lines (or the response is the upstream's failure).

pub mod body;
#[cfg(test)]
mod tests;

use std::ops::Range;

/// As many header lines as a head may have (hyper's number).
pub const MAX_HEADERS: usize = 100;

/// The longest response head read from the upstream (hyper's client bound).
pub const MAX_RESPONSE_HEAD: usize = 8192 + 4096 * 100;

/// How a message's body is delimited.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Framing {
    None,
    Length(u64),
    Chunked,
    /// Until the sender closes (responses only).
    Close,
}

/// Bytes `start..end` of a head's buffer (`u32`: heads are small).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Span {
    pub start: u32,
    pub end: u32,
}

impl Span {
    pub fn of(range: Range<usize>) -> Self {
        Self { start: range.start as u32, end: range.end as u32 }
    }

    pub fn get(self, buf: &[u8]) -> &[u8] {
        &buf[self.start as usize..self.end as usize]
    }
}

/// One field line: where its name and value are in the head's buffer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Field {
    pub name: Span,
    pub value: Span,
}

/// Why a request head cannot be served.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeadError {
    /// Not a request httparse reads (a bad request line, obs-fold, a byte
    /// no field may have, a version other than 1.0 and 1.1).
    Malformed,
    /// Longer than `http.maxHeaderBytes`, or more than [`MAX_HEADERS`]
    /// lines.
    TooLarge,
    /// Framing two readers could read differently (see the module's list).
    FramingConflict,
    /// Codings before a final `chunked` (`gzip, chunked`, on one line or
    /// several): 501.
    TransferEncoding,
}

impl HeadError {
    /// Its name: the access log's `reason` and the `kind` label of
    /// `limiter_http_bad_requests_total`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Malformed => "malformed",
            Self::TooLarge => "too_large",
            Self::FramingConflict => "framing_conflict",
            Self::TransferEncoding => "transfer_encoding",
        }
    }
}

/// What a request head says of its message, as found in one pass.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestHead {
    /// The head's length in the buffer, its final empty line included.
    pub len: usize,
    pub method: Span,
    /// The target as sent, less a `#fragment`.
    pub target: Span,
    /// `0` for HTTP/1.0, `1` for HTTP/1.1.
    pub minor: u8,
    pub fields: Vec<Field>,
    pub framing: Framing,
    /// The client's say on keep-alive (HTTP/1.1: unless `close`; HTTP/1.0:
    /// only with `keep-alive`).
    pub keep_alive: bool,
    /// `Expect: 100-continue` (any other expectation is ignored).
    pub expect_continue: bool,
}

/// The method and target of a head [`parse_request`] refused, as far as
/// its request line was read (for the access log).
pub fn request_line(buf: &[u8]) -> (&[u8], &[u8]) {
    let mut req = httparse::Request::new(&mut []);
    // Too many headers for none: the request line is read all the same.
    let _ = req.parse(buf);
    (req.method.map_or(&b"-"[..], str::as_bytes), req.path.map_or(&b"-"[..], str::as_bytes))
}

/// Parses the request head at the front of `buf`: `Ok(None)` while it is
/// not whole (the caller bounds how much it waits for).
pub fn parse_request(buf: &[u8]) -> Result<Option<RequestHead>, HeadError> {
    let mut lines = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut lines);
    let len = match req.parse(buf) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => return Err(HeadError::TooLarge),
        Err(_) => return Err(HeadError::Malformed),
    };
    let (Some(method), Some(target), Some(minor)) = (req.method, req.path, req.version) else {
        return Err(HeadError::Malformed);
    };
    let at = |s: &[u8]| s.as_ptr() as usize - buf.as_ptr() as usize;
    let span = |s: &[u8]| Span::of(at(s)..at(s) + s.len());
    let target = target.as_bytes();
    let target = &target[..target.iter().position(|&b| b == b'#').unwrap_or(target.len())];
    let mut fields = Vec::with_capacity(req.headers.len());
    let mut lengths: Option<Result<u64, BadLength>> = None;
    let (mut codings, mut chunked_last, mut lone_chunked) = (0, false, false);
    let (mut close, mut keep_alive_token, mut expect_continue) = (false, false, false);
    for h in req.headers.iter() {
        let (name, value) = (h.name.as_bytes(), h.value);
        fields.push(Field { name: span(name), value: span(value) });
        match name.len() {
            6 if name.eq_ignore_ascii_case(b"expect") => {
                expect_continue |= value.trim_ascii().eq_ignore_ascii_case(b"100-continue");
            }
            10 if name.eq_ignore_ascii_case(b"connection") => {
                for token in tokens(value) {
                    close |= token.eq_ignore_ascii_case(b"close");
                    keep_alive_token |= token.eq_ignore_ascii_case(b"keep-alive");
                }
            }
            14 if name.eq_ignore_ascii_case(b"content-length") => {
                let this = digits(value);
                lengths = Some(match (lengths, this) {
                    (None, n) => n,
                    (Some(Ok(m)), Ok(n)) if m == n => Ok(n),
                    _ => Err(BadLength),
                });
            }
            17 if name.eq_ignore_ascii_case(b"transfer-encoding") => {
                codings += 1;
                chunked_last = tokens(value).last().is_some_and(|c| c.eq_ignore_ascii_case(b"chunked"));
                lone_chunked = value.trim_ascii().eq_ignore_ascii_case(b"chunked");
            }
            _ => {}
        }
    }
    let framing = match (codings, lengths) {
        (0, None) => Framing::None,
        (0, Some(Ok(0))) => Framing::None,
        (0, Some(Ok(n))) => Framing::Length(n),
        (0, Some(Err(BadLength))) => return Err(HeadError::FramingConflict),
        // A coding in HTTP/1.0 is faulty framing (RFC 9112 §6.1); with a
        // length too, the classic smuggling probe.
        (_, Some(_)) => return Err(HeadError::FramingConflict),
        (_, None) if minor == 0 || !chunked_last => return Err(HeadError::FramingConflict),
        (1, None) if lone_chunked => Framing::Chunked,
        (_, None) => return Err(HeadError::TransferEncoding),
    };
    Ok(Some(RequestHead {
        len,
        method: span(method.as_bytes()),
        target: span(target),
        minor,
        fields,
        framing,
        keep_alive: if minor == 0 { keep_alive_token && !close } else { !close },
        expect_continue,
    }))
}

/// A response head from the upstream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResponseHead {
    pub len: usize,
    pub status: u16,
    /// The reason phrase (may be empty).
    pub reason: Span,
    pub minor: u8,
    pub fields: Vec<Field>,
    pub framing: Framing,
    /// The `Content-Length` it gave (a `HEAD`'s or a 304's says what a
    /// `GET` would have had).
    pub length: Option<u64>,
    /// The upstream closes the connection after it.
    pub closes: bool,
}

/// What the front of an upstream connection's buffer holds (`101
/// Switching Protocols` is a final head: the caller knows whether it asked
/// for an upgrade).
#[derive(Debug, PartialEq, Eq)]
pub enum Response {
    /// Not a whole head yet.
    Partial,
    /// An interim (1xx) response of this many bytes.
    Interim {
        len: usize,
        status: u16,
    },
    Head(ResponseHead),
    /// Not a response limiter forwards (the upstream's failure), and why.
    Invalid(&'static str),
}

/// Parses a response head (`to_head`: the request was a `HEAD`).
pub fn parse_response(buf: &[u8], to_head: bool) -> Response {
    let mut lines = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut res = httparse::Response::new(&mut lines);
    let len = match res.parse(buf) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) if buf.len() < MAX_RESPONSE_HEAD => return Response::Partial,
        Ok(httparse::Status::Partial) => return Response::Invalid("a response head past 417 KiB"),
        Err(_) => return Response::Invalid("a response head httparse does not read"),
    };
    let (Some(status), Some(minor)) = (res.code, res.version) else {
        return Response::Invalid("a response head httparse does not read");
    };
    if !(100..=599).contains(&status) {
        return Response::Invalid("a status outside 100-599");
    }
    if (100..200).contains(&status) && status != 101 {
        return Response::Interim { len, status };
    }
    let at = |s: &[u8]| s.as_ptr() as usize - buf.as_ptr() as usize;
    let span = |s: &[u8]| Span::of(at(s)..at(s) + s.len());
    let mut fields = Vec::with_capacity(res.headers.len());
    let mut lengths: Option<Result<u64, BadLength>> = None;
    let (mut codings, mut chunked_last) = (false, false);
    let mut closes = minor == 0;
    for h in res.headers.iter() {
        let (name, value) = (h.name.as_bytes(), h.value);
        fields.push(Field { name: span(name), value: span(value) });
        if name.eq_ignore_ascii_case(b"content-length") {
            let this = digits(value);
            lengths = Some(match (lengths, this) {
                (None, n) => n,
                (Some(Ok(m)), Ok(n)) if m == n => Ok(n),
                _ => Err(BadLength),
            });
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            codings = true;
            chunked_last = tokens(value).last().is_some_and(|c| c.eq_ignore_ascii_case(b"chunked"));
        } else if name.eq_ignore_ascii_case(b"connection") {
            for token in tokens(value) {
                if token.eq_ignore_ascii_case(b"close") {
                    closes = true;
                } else if token.eq_ignore_ascii_case(b"keep-alive") && minor == 0 {
                    closes = false;
                }
            }
        }
    }
    let length = match lengths {
        Some(Err(BadLength)) if !codings => {
            return Response::Invalid("Content-Length values that differ or are not digits");
        }
        Some(Ok(n)) => Some(n),
        _ => None,
    };
    let framing = if to_head || status == 101 || status == 204 || status == 304 {
        Framing::None
    } else if codings {
        // With a length too, the coding wins and the connection ends after
        // it (RFC 9112 §6.3).
        if lengths.is_some() {
            closes = true;
        }
        if chunked_last { Framing::Chunked } else { Framing::Close }
    } else {
        match length {
            Some(0) => Framing::None,
            Some(n) => Framing::Length(n),
            None => Framing::Close,
        }
    };
    if framing == Framing::Close {
        closes = true;
    }
    Response::Head(ResponseHead {
        len,
        status,
        reason: res.reason.map_or_else(Span::default, |r| span(r.as_bytes())),
        minor,
        fields,
        framing,
        length: if codings { None } else { length },
        closes,
    })
}

/// A `date` line, as a server adds one to a response without it: the text
/// is made once a second per thread.
pub fn date_line(out: &mut Vec<u8>) {
    thread_local! {
        static DATE: std::cell::RefCell<(u64, [u8; 29])> = const { std::cell::RefCell::new((u64::MAX, [0; 29])) };
    }
    let now = std::time::SystemTime::now();
    let secs = now.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    DATE.with_borrow_mut(|(at, text)| {
        if *at != secs {
            let formatted = httpdate::fmt_http_date(now);
            if formatted.len() == text.len() {
                text.copy_from_slice(formatted.as_bytes());
                *at = secs;
            }
        }
        out.extend_from_slice(b"date: ");
        out.extend_from_slice(&text[..]);
        out.extend_from_slice(b"\r\n");
    });
}

/// The bytes of empty lines (CRLF, or a bare LF) at the front of `buf`,
/// which a server skips before a request line (RFC 9112 §2.2).
pub fn empty_lines(buf: &[u8]) -> usize {
    let mut at = 0;
    loop {
        match &buf[at..] {
            [b'\n', ..] => at += 1,
            [b'\r', b'\n', ..] => at += 2,
            _ => return at,
        }
    }
}

/// The comma-separated tokens of a field value, trimmed, empty ones
/// skipped.
pub fn tokens(value: &[u8]) -> impl Iterator<Item = &[u8]> {
    value.split(|&b| b == b',').map(<[u8]>::trim_ascii).filter(|t| !t.is_empty())
}

/// A `Content-Length` that is no length: not digits, too long, or two
/// that differ.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct BadLength;

/// A `Content-Length` value: digits only (httparse trimmed the spaces
/// around them), at most 18 of them (under 10^18).
fn digits(value: &[u8]) -> Result<u64, BadLength> {
    if value.is_empty() || value.len() > 18 || !value.iter().all(u8::is_ascii_digit) {
        return Err(BadLength);
    }
    Ok(value.iter().fold(0u64, |n, d| n * 10 + u64::from(d - b'0')))
}
