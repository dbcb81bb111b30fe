//! Response heads as the native engine writes them to the client: the
//! upstream's, parsed by httparse (as hyper's client parses it) and
//! rewritten in one pass without its hop-by-hop lines; and the proxy's own
//! (503s, errors), written from the [`Response`] the shared code builds,
//! as hyper's server writes it.

use bytes::Bytes;
use http_body_util::BodyExt as _;
use hyper::{Response, StatusCode};

use super::super::{
    body::ProxyBody,
    headers::{Seen, is_hop_by_hop},
};

/// As many header lines as hyper's HTTP/1 client reads.
pub const MAX_HEADERS: usize = 100;

/// The longest response head read, as hyper's client bounds it.
pub const MAX_HEAD_BYTES: usize = 8192 + 4096 * 100;

/// How the upstream framed a response's body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Framed {
    None,
    Length(u64),
    Chunked,
    /// Until the upstream closes.
    Close,
}

/// An upstream response head, as the client gets it.
pub struct Head {
    /// Its bytes at the front of the upstream connection's buffer.
    pub len: usize,
    pub status: StatusCode,
    pub body: Framed,
    /// The upstream will close the connection after this response.
    pub upstream_closes: bool,
    /// The head for the client, without its framing header and final
    /// CRLF (see [`finish`]).
    pub client: Vec<u8>,
}

/// What the bytes at the front of the upstream's buffer are.
pub enum Parsed {
    Partial,
    /// An interim (1xx) response of this many bytes, to skip.
    Interim(usize),
    Head(Head),
    /// Not a response hyper's client would read.
    Invalid,
}

/// Parses a response head to a request (`head`: it was a `HEAD`).
pub fn parse(buf: &[u8], head: bool) -> Parsed {
    let mut lines = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut res = httparse::Response::new(&mut lines);
    let len = match res.parse(buf) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Parsed::Partial,
        Err(_) => return Parsed::Invalid,
    };
    let (Some(code), Some(version)) = (res.code, res.version) else { return Parsed::Invalid };
    let Ok(status) = StatusCode::from_u16(code) else { return Parsed::Invalid };
    if status.is_informational() {
        // 101 is never asked for here (upgrades are hyper's).
        return if code == 101 { Parsed::Invalid } else { Parsed::Interim(len) };
    }
    let headers = &*res.headers;
    let seen = Seen::of_names(headers.iter().map(|h| h.name.as_bytes()));
    let mut length = None;
    let mut chunked = None;
    let mut upstream_closes = version == 0;
    for h in headers {
        let name = h.name.as_bytes();
        if name.eq_ignore_ascii_case(b"content-length") {
            let digits = h.value;
            let n = (!digits.is_empty() && digits.iter().all(u8::is_ascii_digit))
                .then(|| std::str::from_utf8(digits).ok()?.parse::<u64>().ok())
                .flatten();
            match (n, length) {
                (None, _) => return Parsed::Invalid,
                (Some(n), Some(m)) if n != m => return Parsed::Invalid,
                (Some(n), _) => length = Some(n),
            }
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            let last = h.value.rsplit(|&b| b == b',').next().unwrap_or_default().trim_ascii();
            chunked = Some(last.eq_ignore_ascii_case(b"chunked"));
        } else if name.eq_ignore_ascii_case(b"connection") {
            for token in h.value.split(|&b| b == b',').map(<[u8]>::trim_ascii) {
                if token.eq_ignore_ascii_case(b"close") {
                    upstream_closes = true;
                } else if token.eq_ignore_ascii_case(b"keep-alive") && version == 0 {
                    upstream_closes = false;
                }
            }
        }
    }
    let body = if head || code == 204 || code == 304 {
        Framed::None
    } else {
        match (chunked, length) {
            (Some(true), _) => Framed::Chunked,
            (Some(false), _) => Framed::Close,
            (None, Some(0)) => Framed::None,
            (None, Some(n)) => Framed::Length(n),
            (None, None) => Framed::Close,
        }
    };
    if body == Framed::Close {
        upstream_closes = true;
    }
    let named = super::request::named_by_connection(headers, &seen);
    let mut client = Vec::with_capacity(len + 64);
    client.extend_from_slice(b"HTTP/1.1 ");
    client.extend_from_slice(status.as_str().as_bytes());
    client.push(b' ');
    match res.reason.filter(|r| !r.is_empty()) {
        Some(reason) => client.extend_from_slice(reason.as_bytes()),
        None => client.extend_from_slice(status.canonical_reason().unwrap_or("<none>").as_bytes()),
    }
    client.extend_from_slice(b"\r\n");
    let mut dated = false;
    for h in headers {
        let name = h.name.as_bytes();
        if (seen.any_hop_by_hop() && is_hop_by_hop(name, &named))
            || name.eq_ignore_ascii_case(b"content-length")
        {
            continue;
        }
        dated |= name.eq_ignore_ascii_case(b"date");
        client.extend_from_slice(name);
        client.extend_from_slice(b": ");
        client.extend_from_slice(h.value);
        client.extend_from_slice(b"\r\n");
    }
    if !dated {
        date_line(&mut client);
    }
    // A `HEAD`'s or a 304's length says what a GET would have had.
    if body == Framed::None
        && let Some(n) = length
    {
        client.extend_from_slice(b"content-length: ");
        client.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
        client.extend_from_slice(b"\r\n");
    }
    Parsed::Head(Head { len, status, body, upstream_closes, client })
}

/// How a body goes to the client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToClient {
    /// Nothing (a `HEAD`, a 204, a 304, an empty body).
    Empty,
    /// All of it, of this length, in one write with the head.
    Length(u64),
    /// In chunks, as it comes.
    Chunked,
}

/// Ends a head: its framing line, `connection: close` when the connection
/// closes after it, and the final CRLF.
pub fn finish(head: &mut Vec<u8>, to: ToClient, close: bool) {
    match to {
        ToClient::Empty => {}
        ToClient::Length(n) => {
            head.extend_from_slice(b"content-length: ");
            head.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
            head.extend_from_slice(b"\r\n");
        }
        ToClient::Chunked => head.extend_from_slice(b"transfer-encoding: chunked\r\n"),
    }
    if close {
        head.extend_from_slice(b"connection: close\r\n");
    }
    head.extend_from_slice(b"\r\n");
}

/// A response of the proxy's own (its body is whole), as bytes (to a
/// `HEAD`: without the body, its length kept); its end-of-body hooks have
/// run. Returns whether it closes the connection, and the body's length
/// sent.
pub async fn own(response: Response<ProxyBody>, head: bool) -> (Vec<u8>, bool, u64) {
    let (parts, body) = response.into_parts();
    // The proxy's own bodies are whole: this resolves at once.
    let body: Bytes = body.collect().await.map(|c| c.to_bytes()).unwrap_or_default();
    let close = parts.headers.get(hyper::header::CONNECTION).is_some_and(|v| v.as_bytes() == b"close");
    let mut out = Vec::with_capacity(256 + body.len());
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(parts.status.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(parts.status.canonical_reason().unwrap_or("<none>").as_bytes());
    out.extend_from_slice(b"\r\n");
    for (name, value) in &parts.headers {
        if name == hyper::header::CONNECTION {
            continue;
        }
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    date_line(&mut out);
    finish(&mut out, ToClient::Length(body.len() as u64), close);
    if head {
        return (out, close, 0);
    }
    out.extend_from_slice(&body);
    (out, close, body.len() as u64)
}

/// A `date` line, as hyper's server adds one to a response without it:
/// the text is made once a second per thread.
fn date_line(out: &mut Vec<u8>) {
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
