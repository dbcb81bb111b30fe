//! A request head as the pipeline sees it, whichever protocol brought it:
//! an HTTP/1.x head kept in the bytes the client sent ([`Request::from_h1`]),
//! or an HTTP/2 stream's head laid out the same way ([`Request::from_h2`]).
//! Its checks before admission ([`Request::check`]) and the head the
//! upstream gets ([`Request::write_upstream`]) are written once, here, for
//! both.
//!
//! The head the upstream gets is limiter's own: the request line in origin
//! form and HTTP/1.1; the client's field lines in its order and spelling,
//! less the hop-by-hop ones (and those `Connection` names), the framing
//! (`Content-Length`, `Transfer-Encoding`), `Expect` (limiter answers it),
//! names with a `_` (`http.underscoresInHeaders`) and the client's
//! forwarding headers where it is not trusted; `Host` as the request's
//! authority; limiter's forwarding headers and the request's id; then one
//! framing line of limiter's ([`Outgoing`]).

pub(crate) mod head;
pub mod headers;
pub(crate) mod path;
#[cfg(test)]
mod tests;

use bytes::{Bytes, BytesMut};
use hyper::Method;

use self::{
    head::Bad,
    headers::{FORWARDING, Forwarding, HopByHop, Rewrite, Seen, forwarding_index, underscore_passes},
};
use super::h1::framing::{Field, Framing, RequestHead, Span, tokens};
use crate::request_id::RequestId;

/// The protocol version a request came in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Version {
    Http10,
    Http11,
    H2,
}

/// What the client says of its body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BodyLen {
    None,
    Length(u64),
    /// HTTP/1.1 chunked: the length shows at its end.
    Chunked,
    /// An HTTP/2 stream without `content-length`.
    Unknown,
}

impl From<Framing> for BodyLen {
    /// What an HTTP/1 request head's framing says of its body.
    fn from(framing: Framing) -> Self {
        match framing {
            Framing::None | Framing::Close => Self::None,
            Framing::Length(n) => Self::Length(n),
            Framing::Chunked => Self::Chunked,
        }
    }
}

impl BodyLen {
    /// How the body is read as HTTP/1 framing: the inverse of
    /// `From<Framing>` (a length HTTP/2 did not give, [`BodyLen::Unknown`],
    /// reads as chunks).
    pub fn framing(self) -> Framing {
        match self {
            Self::None => Framing::None,
            Self::Length(n) => Framing::Length(n),
            Self::Chunked | Self::Unknown => Framing::Chunked,
        }
    }
}

/// How limiter frames the body it sends upstream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outgoing {
    None,
    Length(u64),
    Chunked,
}

/// What the head the upstream gets depends on besides the request.
pub struct Upstreamed<'a> {
    /// The client connection's forwarding headers.
    pub fwd: &'a Forwarding,
    /// Names the upstream for a request without an authority.
    pub upstream: &'a str,
    pub body: Outgoing,
    /// Keeps `Upgrade` and says `Connection: upgrade`.
    pub upgrade: bool,
    pub id: &'a RequestId,
    /// `http.underscoresInHeaders`: fields whose name holds a `_` may pass.
    pub underscores: bool,
}

/// A request head.
#[derive(Debug)]
pub struct Request {
    /// The bytes its spans point into.
    buf: Bytes,
    pub method: Method,
    /// The path and query, in origin form (`*` for `OPTIONS *`).
    target: Span,
    /// The target's own authority (absolute form, HTTP/2 `:authority`).
    authority: Option<Span>,
    pub version: Version,
    fields: Vec<Field>,
    pub seen: Seen,
    pub body: BodyLen,
    /// HTTP/1: the client's say on keep-alive.
    pub keep_alive: bool,
    /// HTTP/1: the client waits for `100 Continue` before its body.
    pub expect_continue: bool,
}

/// Why a head is not served: a check before admission, or `CONNECT`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    Bad(Bad),
    Connect,
}

impl Request {
    /// The request of an HTTP/1.x head; `buf` holds the head's bytes.
    pub fn from_h1(buf: Bytes, head: RequestHead) -> Result<Self, Refused> {
        let method = Method::from_bytes(head.method.get(&buf)).map_err(|_| Refused::Bad(Bad::Target))?;
        if method == Method::CONNECT {
            return Err(Refused::Connect);
        }
        let seen = Seen::of_names(head.fields.iter().map(|f| f.name.get(&buf)));
        let version = if head.minor == 0 { Version::Http10 } else { Version::Http11 };
        let body = BodyLen::from(head.framing);
        let mut req = Self {
            buf,
            method,
            target: head.target,
            authority: None,
            version,
            fields: head.fields,
            seen,
            body,
            keep_alive: head.keep_alive,
            expect_continue: head.expect_continue,
        };
        let target = req.target.get(&req.buf);
        if target.first() != Some(&b'/') && target != b"*" {
            req.absolute_form()?;
        }
        Ok(req)
    }

    /// An absolute-form target (`http://host/path`): its authority becomes
    /// the request's, its path and query the target.
    fn absolute_form(&mut self) -> Result<(), Refused> {
        let target = self.target.get(&self.buf);
        let scheme_end = target.windows(3).position(|w| w == b"://").ok_or(Refused::Bad(Bad::Target))?;
        let scheme = &target[..scheme_end];
        if !scheme.eq_ignore_ascii_case(b"http") && !scheme.eq_ignore_ascii_case(b"https") {
            return Err(Refused::Bad(Bad::Target));
        }
        let rest = &target[scheme_end + 3..];
        let authority_len = rest.iter().position(|&b| b == b'/' || b == b'?').unwrap_or(rest.len());
        let start = self.target.start as usize + scheme_end + 3;
        self.authority = Some(Span::of(start..start + authority_len));
        let path = Span::of(start + authority_len..self.target.end as usize);
        if path.get(&self.buf).first() == Some(&b'/') {
            self.target = path;
        } else {
            // `http://host` or `http://host?q`: the path is `/`.
            let mut buf = BytesMut::with_capacity(self.buf.len() + 1 + path.get(&self.buf).len());
            buf.extend_from_slice(&self.buf);
            let at = buf.len();
            buf.extend_from_slice(b"/");
            buf.extend_from_slice(path.get(&self.buf));
            self.target = Span::of(at..buf.len());
            self.buf = buf.freeze();
        }
        Ok(())
    }

    /// The request of an HTTP/2 stream's head, laid out in one buffer
    /// (split `cookie` fields joined, RFC 9113 §8.2.3); `end_stream`: it
    /// has no body.
    pub fn from_h2(parts: &hyper::http::request::Parts, end_stream: bool) -> Result<Self, Refused> {
        if parts.method == Method::CONNECT {
            return Err(Refused::Connect);
        }
        let mut buf = BytesMut::with_capacity(256);
        let target =
            put(&mut buf, parts.uri.path_and_query().map_or(b"/".as_slice(), |pq| pq.as_str().as_bytes()));
        let authority = parts.uri.authority().map(|a| put(&mut buf, a.as_str().as_bytes()));
        let mut fields: Vec<Field> = Vec::with_capacity(parts.headers.len());
        let mut cookie: Option<usize> = None;
        let mut length = None;
        for (name, value) in &parts.headers {
            if name == hyper::header::COOKIE
                && let Some(i) = cookie
            {
                // Joined onto the first: this field's value follows it.
                let mut joined = fields[i].value.get(&buf).to_vec();
                joined.extend_from_slice(b"; ");
                joined.extend_from_slice(value.as_bytes());
                fields[i].value = put(&mut buf, &joined);
                continue;
            }
            if name == hyper::header::CONTENT_LENGTH {
                length = std::str::from_utf8(value.as_bytes()).ok().and_then(|v| v.parse::<u64>().ok());
            }
            let name_at = put(&mut buf, name.as_str().as_bytes());
            let field = Field { name: name_at, value: put(&mut buf, value.as_bytes()) };
            if name == hyper::header::COOKIE {
                cookie = Some(fields.len());
            }
            fields.push(field);
        }
        let buf = buf.freeze();
        let seen = Seen::of_names(fields.iter().map(|f| f.name.get(&buf)));
        let body = match (end_stream, length) {
            (true, _) | (false, Some(0)) => BodyLen::None,
            (false, Some(n)) => BodyLen::Length(n),
            (false, None) => BodyLen::Unknown,
        };
        Ok(Self {
            buf,
            method: parts.method.clone(),
            target,
            authority,
            version: Version::H2,
            fields,
            seen,
            body,
            keep_alive: true,
            expect_continue: false,
        })
    }

    /// The target as the upstream gets it: the path and query.
    pub fn target(&self) -> &[u8] {
        self.target.get(&self.buf)
    }

    /// The path, without the query (as text; a path that is not UTF-8 is
    /// classified as no special path).
    pub fn path(&self) -> &str {
        let target = self.target();
        let path = &target[..target.iter().position(|&b| b == b'?').unwrap_or(target.len())];
        std::str::from_utf8(path).unwrap_or("")
    }

    /// The first field named `name` (lower case), if any.
    pub fn field(&self, name: &'static str) -> Option<&[u8]> {
        self.values(name).next()
    }

    /// Every field named `name` (lower case), in order.
    pub fn values(&self, name: &'static str) -> impl Iterator<Item = &[u8]> {
        self.fields
            .iter()
            .filter(move |f| f.name.get(&self.buf).eq_ignore_ascii_case(name.as_bytes()))
            .map(|f| f.value.get(&self.buf))
    }

    /// The `Authorization` value that names the session (none without one).
    pub fn authorization(&self) -> Option<&[u8]> {
        if self.seen.authorizations == 0 { None } else { self.field("authorization") }
    }

    /// The request's authority: the target's own, else `Host`.
    pub fn authority(&self) -> Option<&[u8]> {
        match self.authority {
            Some(a) => Some(a.get(&self.buf)),
            None if self.seen.hosts > 0 => self.field("host"),
            None => None,
        }
    }

    /// Whether it asks to switch protocols (WebSocket and the like), with
    /// `Connection: upgrade`. An upgrade to `h2c` is not passed on: HTTP/2
    /// inside a tunnel would bypass per-stream admission.
    pub fn is_upgrade(&self) -> bool {
        self.version == Version::Http11
            && self.seen.upgrade()
            && !self.values("upgrade").flat_map(tokens).any(|t| t.eq_ignore_ascii_case(b"h2c"))
            && self.values("connection").flat_map(tokens).any(|t| t.eq_ignore_ascii_case(b"upgrade"))
    }

    /// What the head must satisfy before admission (see [`head`]): `Host`,
    /// `Authorization`, `Transfer-Encoding` and `Connection`, then the
    /// target and its authority.
    pub fn check(&self) -> Result<(), Bad> {
        head::check_lines(self.field("host"), &self.seen)?;
        if self.seen.connection() {
            head::check_connection(self.values("connection"))?;
        }
        if self.target() == b"*" && self.method != Method::OPTIONS {
            return Err(Bad::Target);
        }
        match self.authority {
            Some(a) => {
                let a = a.get(&self.buf);
                // `user@host` is deprecated (RFC 9110 §4.2.4) and refused on
                // HTTP/2 (RFC 9113 §8.3.1); the authority becomes `Host`.
                if a.is_empty() || !head::is_valid_host(a) {
                    return Err(Bad::Host);
                }
                if self.version == Version::H2
                    && self.seen.hosts == 1
                    && !self.field("host").is_some_and(|h| h.eq_ignore_ascii_case(a))
                {
                    return Err(Bad::Host);
                }
                Ok(())
            }
            None => head::origin_form_host(self.version != Version::Http10, &self.seen),
        }
    }

    /// The request's id: a trusted forwarder's `X-Request-Id` (`trusted`:
    /// its client is one) if it will do as one, else a new one of limiter's.
    pub fn id(&self, trusted: bool) -> RequestId {
        if trusted && self.seen.request_id() {
            let value = self
                .fields
                .iter()
                .find(|f| f.name.get(&self.buf).eq_ignore_ascii_case(b"x-request-id"))
                .map(|f| self.buf.slice(f.value.start as usize..f.value.end as usize));
            if let Some(id) = value.and_then(RequestId::forwarded) {
                return id;
            }
        }
        RequestId::own()
    }

    /// Writes the head the upstream gets (see the module's doc); returns how
    /// many fields were left out for a `_` in their name.
    pub fn write_upstream(&self, out: &mut Vec<u8>, u: &Upstreamed<'_>) -> u32 {
        let buf = &self.buf[..];
        out.extend_from_slice(self.method.as_str().as_bytes());
        out.push(b' ');
        out.extend_from_slice(self.target());
        out.extend_from_slice(b" HTTP/1.1\r\n");
        let host = self.authority();
        // The target's authority wins over `Host` (RFC 9112 §3.2.2, RFC
        // 9113 §8.3.1); HTTP/1.0 without `Host`: the upstream's name, as
        // HTTP/1.1 needs one.
        let own_host = self.authority.is_some() || self.seen.hosts == 0;
        if own_host {
            line(out, b"host", host.unwrap_or(u.upstream.as_bytes()));
        }
        let mut rewrite = Lines { req: self, drop: 0, extended: [None, None], tail: Vec::new() };
        u.fwd.apply(&mut rewrite, host, &self.seen, u.id.as_bytes());
        let hop_by_hop = HopByHop::of(&self.seen, self.values("connection"));
        let mut extended = rewrite.extended;
        let mut underscored = 0;
        for f in &self.fields {
            let (name, value) = (f.name.get(buf), f.value.get(buf));
            if hop_by_hop.drops(name) {
                continue;
            }
            if self.seen.underscores && name.contains(&b'_') {
                if !underscore_passes(name, u.underscores) {
                    underscored += 1;
                    continue;
                }
                line(out, name, value);
                continue;
            }
            match name.len() {
                4 if own_host && name.eq_ignore_ascii_case(b"host") => continue,
                6 if name.eq_ignore_ascii_case(b"expect") => continue,
                14 if name.eq_ignore_ascii_case(b"content-length") => continue,
                _ => {}
            }
            if self.seen.forwarding != 0
                && let Some(i) = forwarding_index(name)
            {
                if rewrite.drop & (1 << i) != 0 {
                    continue;
                }
                if let Some(chain) = extended.get_mut(i) {
                    // An extended chain goes where its first line was, once.
                    if let Some(value) = chain.take() {
                        line(out, FORWARDING.name(i).as_bytes(), &value);
                    }
                    continue;
                }
            }
            line(out, name, value);
        }
        out.extend_from_slice(&rewrite.tail);
        match u.body {
            Outgoing::None => {}
            Outgoing::Length(n) => {
                out.extend_from_slice(b"content-length: ");
                out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
                out.extend_from_slice(b"\r\n");
            }
            Outgoing::Chunked => out.extend_from_slice(b"transfer-encoding: chunked\r\n"),
        }
        if u.upgrade
            && let Some(protocol) = self.field("upgrade")
        {
            line(out, b"upgrade", protocol);
            out.extend_from_slice(b"connection: upgrade\r\n");
        }
        out.extend_from_slice(b"\r\n");
        underscored
    }
}

/// Appends `bytes` to `buf`; where they are.
fn put(buf: &mut BytesMut, bytes: &[u8]) -> Span {
    let at = buf.len();
    buf.extend_from_slice(bytes);
    Span::of(at..buf.len())
}

fn line(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// The forwarding rules' changes to a head being written: lines of the
/// client's to leave out, chains extended in place, lines added at the end.
struct Lines<'a> {
    req: &'a Request,
    /// Bits of [`FORWARDING`] whose client lines are left out.
    drop: u64,
    /// `X-Forwarded-For` and `Forwarded` extended (places 0 and 1).
    extended: [Option<Vec<u8>>; 2],
    tail: Vec<u8>,
}

impl Rewrite for Lines<'_> {
    fn remove(&mut self, at: usize) {
        self.drop |= 1 << at;
    }

    fn set(&mut self, at: usize, value: &[u8]) {
        self.drop |= 1 << at;
        line(&mut self.tail, FORWARDING.name(at).as_bytes(), value);
    }

    fn extend(&mut self, at: usize, value: Vec<u8>) {
        let name = FORWARDING.name(at);
        let mut chain = Vec::with_capacity(value.len() + 64);
        for v in self.req.values(name) {
            chain.extend_from_slice(v);
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
