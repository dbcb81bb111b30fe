//! Two readers of an HTTP/1.1 request stream, to judge what a proxy
//! forwards: a strict one (RFC 9112 as a careful server reads it) and a
//! lenient one (what servers in the wild accept: LF line ends, obs-fold,
//! whitespace before `:`, `Transfer-Encoding` over `Content-Length`,
//! anything after a chunk size up to the LF). Bytes a proxy writes itself
//! must read the same way under both; where they differ, a request can be
//! hidden from one of them (request smuggling).
//!
//! And [`Capture`], an upstream that records every byte each connection
//! brings and answers each request the *lenient* reader finds, as a
//! lenient server would serve it (`served METHOD TARGET BODY_LENGTH`).

use std::{
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpListener, TcpStream},
    sync::{Arc, Mutex},
    thread,
};

/// One request as a reader found it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    pub method: String,
    pub target: String,
    /// Lowercased names, values trimmed.
    pub headers: Vec<(String, Vec<u8>)>,
    pub body: Vec<u8>,
    /// Its framing is the one way limiter writes it (see [`canonical`]).
    pub canonical: bool,
}

/// Whether a message's framing is written as limiter writes it: at most
/// one framing field, either `content-length` of plain decimal digits or
/// `transfer-encoding: chunked`, and for a chunked body size lines of
/// lower-case hex digits without leading zeros or extensions, no trailer
/// fields, and no empty chunk before the last.
fn canonical(headers: &[(String, Vec<u8>)], raw_body: &[u8]) -> bool {
    let framing: Vec<&(String, Vec<u8>)> =
        headers.iter().filter(|(n, _)| n == "content-length" || n == "transfer-encoding").collect();
    match framing.as_slice() {
        [] => raw_body.is_empty(),
        [(n, v)] if n == "content-length" => {
            !v.is_empty() && v.iter().all(u8::is_ascii_digit) && (v.len() == 1 || v[0] != b'0')
        }
        [(n, v)] if n == "transfer-encoding" && v == b"chunked" => {
            let mut rest = raw_body;
            loop {
                let Some(eol) = rest.windows(2).position(|w| w == b"\r\n") else { return false };
                let size = &rest[..eol];
                let valid = !size.is_empty()
                    && size.iter().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b))
                    && (size.len() == 1 || size[0] != b'0');
                if !valid {
                    return false;
                }
                let n =
                    usize::from_str_radix(std::str::from_utf8(size).unwrap_or("x"), 16).unwrap_or(usize::MAX);
                rest = &rest[eol + 2..];
                if n == 0 {
                    return rest == b"\r\n";
                }
                if rest.len() < n + 2 || &rest[n..n + 2] != b"\r\n" {
                    return false;
                }
                rest = &rest[n + 2..];
            }
        }
        _ => false,
    }
}

impl Message {
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_slice())
    }
}

/// What a reader made of a stream: the whole requests, then why it stopped
/// (`None`: the stream ended cleanly between requests; `Some("incomplete")`
/// when it ended inside one).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Read {
    pub messages: Vec<Message>,
    pub stopped: Option<String>,
    /// The bytes the whole requests took.
    pub consumed: usize,
}

/// Reads `stream` as a strict server would.
pub fn strict(stream: &[u8]) -> Read {
    read(stream, &Strict)
}

/// Reads `stream` as a lenient server would.
pub fn lenient(stream: &[u8]) -> Read {
    read(stream, &Lenient)
}

trait Rules {
    /// The next line at `at`: its content and where the one after begins
    /// (`Err` for a line this reader refuses; `Ok(None)`: not complete).
    fn line(&self, s: &[u8], at: usize) -> Result<Option<(Vec<u8>, usize)>, String>;
    /// Folded lines are joined to the previous one.
    fn obs_fold(&self) -> bool;
    /// The body's framing from the head's fields.
    fn framing(&self, headers: &[(String, Vec<u8>)]) -> Result<Framing, String>;
    /// A chunk-size line's size.
    fn chunk_size(&self, line: &[u8]) -> Result<u64, String>;
    /// What must follow a chunk's data (`None`: any line end).
    fn after_data(&self) -> Option<&'static [u8]>;
}

enum Framing {
    None,
    Length(u64),
    Chunked,
}

fn read(s: &[u8], rules: &dyn Rules) -> Read {
    let mut messages = Vec::new();
    let (mut at, mut consumed) = (0, 0);
    loop {
        // Empty lines before a request line are skipped (RFC 9112 §2.2).
        while s.get(at) == Some(&b'\n') || s[at..].starts_with(b"\r\n") {
            at += if s[at] == b'\n' { 1 } else { 2 };
        }
        if at >= s.len() {
            return Read { messages, stopped: None, consumed };
        }
        match message(s, at, rules) {
            Ok(Some((m, next))) => {
                messages.push(m);
                at = next;
                consumed = next;
            }
            Ok(None) => return Read { messages, stopped: Some("incomplete".into()), consumed },
            Err(e) => return Read { messages, stopped: Some(e), consumed },
        }
    }
}

fn message(s: &[u8], mut at: usize, rules: &dyn Rules) -> Result<Option<(Message, usize)>, String> {
    let Some((line, next)) = rules.line(s, at)? else { return Ok(None) };
    at = next;
    let parts: Vec<&[u8]> = line.split(|&b| b == b' ').collect();
    let [method, target, version] = parts[..] else {
        return Err(format!("request line {:?}", String::from_utf8_lossy(&line)));
    };
    if !version.starts_with(b"HTTP/1.") || method.is_empty() || target.is_empty() {
        return Err(format!("request line {:?}", String::from_utf8_lossy(&line)));
    }
    let mut headers: Vec<(String, Vec<u8>)> = Vec::new();
    loop {
        let Some((line, next)) = rules.line(s, at)? else { return Ok(None) };
        at = next;
        if line.is_empty() {
            break;
        }
        if line[0] == b' ' || line[0] == b'\t' {
            match headers.last_mut() {
                Some((_, value)) if rules.obs_fold() => {
                    value.push(b' ');
                    value.extend_from_slice(line.trim_ascii());
                    continue;
                }
                _ => return Err("obs-fold".into()),
            }
        }
        headers.push(field(&line, rules.obs_fold())?);
    }
    let mut body = Vec::new();
    let body_start = at;
    match rules.framing(&headers)? {
        Framing::None => {}
        Framing::Length(n) => {
            let n = n as usize;
            if s.len() - at < n {
                return Ok(None);
            }
            body.extend_from_slice(&s[at..at + n]);
            at += n;
        }
        Framing::Chunked => loop {
            let Some((line, next)) = rules.line(s, at)? else { return Ok(None) };
            at = next;
            let size = rules.chunk_size(&line)? as usize;
            if size == 0 {
                // Trailer fields, then the empty line.
                loop {
                    let Some((line, next)) = rules.line(s, at)? else { return Ok(None) };
                    at = next;
                    if line.is_empty() {
                        break;
                    }
                    field(&line, rules.obs_fold())?;
                }
                break;
            }
            if s.len() - at < size {
                return Ok(None);
            }
            body.extend_from_slice(&s[at..at + size]);
            at += size;
            match rules.after_data() {
                Some(end) => {
                    if s.len() - at < end.len() {
                        return Ok(None);
                    }
                    if &s[at..at + end.len()] != end {
                        return Err("chunk data not followed by CRLF".into());
                    }
                    at += end.len();
                }
                None => {
                    let Some((line, next)) = rules.line(s, at)? else { return Ok(None) };
                    if !line.is_empty() {
                        return Err("chunk data not followed by a line end".into());
                    }
                    at = next;
                }
            }
        },
    }
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    let canonical = canonical(&headers, &s[body_start..at]);
    Ok(Some((Message { method: text(method), target: text(target), headers, body, canonical }, at)))
}

/// `name: value`; a lenient reader also takes spaces before the colon.
fn field(line: &[u8], lenient: bool) -> Result<(String, Vec<u8>), String> {
    let colon = line.iter().position(|&b| b == b':').ok_or("a field without a colon")?;
    let mut name = &line[..colon];
    if lenient {
        name = name.trim_ascii_end();
    }
    let token = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
    if name.is_empty() || !name.iter().all(|&b| token(b)) {
        return Err(format!("field name {:?}", String::from_utf8_lossy(name)));
    }
    let value = line[colon + 1..].trim_ascii();
    if !lenient && value.iter().any(|&b| b < 0x20 && b != b'\t' || b == 0x7f) {
        return Err("a control byte in a field value".into());
    }
    Ok((String::from_utf8_lossy(name).to_ascii_lowercase(), value.to_vec()))
}

fn values<'a>(headers: &'a [(String, Vec<u8>)], name: &'a str) -> impl Iterator<Item = &'a [u8]> {
    headers.iter().filter(move |(n, _)| n == name).map(|(_, v)| v.as_slice())
}

struct Strict;

impl Rules for Strict {
    fn line(&self, s: &[u8], at: usize) -> Result<Option<(Vec<u8>, usize)>, String> {
        let Some(lf) = s[at..].iter().position(|&b| b == b'\n') else {
            return if s[at..].iter().any(|&b| b == b'\r' || b == 0) && !s.ends_with(b"\r") {
                Err("a bare CR or NUL".into())
            } else {
                Ok(None)
            };
        };
        let line = &s[at..at + lf];
        let Some(line) = line.strip_suffix(b"\r") else { return Err("a bare LF".into()) };
        if line.iter().any(|&b| b == b'\r' || b == 0) {
            return Err("a bare CR or NUL".into());
        }
        Ok(Some((line.to_vec(), at + lf + 1)))
    }

    fn obs_fold(&self) -> bool {
        false
    }

    fn framing(&self, headers: &[(String, Vec<u8>)]) -> Result<Framing, String> {
        let codings: Vec<&[u8]> = values(headers, "transfer-encoding").collect();
        let lengths: Vec<&[u8]> = values(headers, "content-length").collect();
        match (codings.as_slice(), lengths.as_slice()) {
            ([], []) => Ok(Framing::None),
            ([c], []) if c.eq_ignore_ascii_case(b"chunked") => Ok(Framing::Chunked),
            ([], [n]) if !n.is_empty() && n.len() <= 18 && n.iter().all(u8::is_ascii_digit) => {
                Ok(Framing::Length(String::from_utf8_lossy(n).parse().map_err(|_| "length")?))
            }
            _ => Err(format!("framing: {} codings, {} lengths", codings.len(), lengths.len())),
        }
    }

    fn chunk_size(&self, line: &[u8]) -> Result<u64, String> {
        let (size, ext) = match line.iter().position(|&b| b == b';') {
            Some(i) => (&line[..i], Some(&line[i + 1..])),
            None => (line, None),
        };
        if size.is_empty() || size.len() > 15 || !size.iter().all(u8::is_ascii_hexdigit) {
            return Err(format!("chunk size {:?}", String::from_utf8_lossy(line)));
        }
        if let Some(ext) = ext
            && ext.iter().any(|&b| b < 0x20 && b != b'\t')
        {
            return Err("a control byte in a chunk extension".into());
        }
        Ok(u64::from_str_radix(std::str::from_utf8(size).map_err(|_| "size")?, 16).map_err(|_| "size")?)
    }

    fn after_data(&self) -> Option<&'static [u8]> {
        Some(b"\r\n")
    }
}

struct Lenient;

impl Rules for Lenient {
    fn line(&self, s: &[u8], at: usize) -> Result<Option<(Vec<u8>, usize)>, String> {
        let Some(lf) = s[at..].iter().position(|&b| b == b'\n') else { return Ok(None) };
        let line = &s[at..at + lf];
        Ok(Some((line.strip_suffix(b"\r").unwrap_or(line).to_vec(), at + lf + 1)))
    }

    fn obs_fold(&self) -> bool {
        true
    }

    fn framing(&self, headers: &[(String, Vec<u8>)]) -> Result<Framing, String> {
        let chunked = values(headers, "transfer-encoding").any(|v| {
            v.rsplit(|&b| b == b',').next().is_some_and(|c| c.trim_ascii().eq_ignore_ascii_case(b"chunked"))
        });
        if chunked {
            return Ok(Framing::Chunked);
        }
        match values(headers, "content-length").next() {
            None => Ok(Framing::None),
            Some(n) => {
                let digits: Vec<u8> = n.iter().copied().take_while(u8::is_ascii_digit).collect();
                Ok(Framing::Length(String::from_utf8_lossy(&digits).parse().map_err(|_| "length")?))
            }
        }
    }

    fn chunk_size(&self, line: &[u8]) -> Result<u64, String> {
        let digits: Vec<u8> =
            line.trim_ascii_start().iter().copied().take_while(u8::is_ascii_hexdigit).collect();
        if digits.is_empty() {
            return Err(format!("chunk size {:?}", String::from_utf8_lossy(line)));
        }
        u64::from_str_radix(&String::from_utf8_lossy(&digits), 16).map_err(|_| "size".into())
    }

    fn after_data(&self) -> Option<&'static [u8]> {
        None
    }
}

/// The bytes one connection brought so far.
type Stream = Arc<Mutex<Vec<u8>>>;

/// An upstream that records what each connection brings and answers what
/// the lenient reader finds in it.
pub struct Capture {
    pub addr: SocketAddr,
    connections: Arc<Mutex<Vec<Stream>>>,
}

impl Capture {
    /// A capture upstream that serves what the lenient reader finds.
    pub fn start() -> Self {
        Self::reading(lenient)
    }

    /// A capture upstream that serves what `reader` finds (the strict
    /// reader: a strict upstream, which answers 400 and closes at the first
    /// byte it refuses).
    pub fn reading(reader: fn(&[u8]) -> Read) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the capture upstream");
        let addr = listener.local_addr().expect("its address");
        let connections: Arc<Mutex<Vec<Stream>>> = Arc::default();
        let list = connections.clone();
        thread::Builder::new()
            .name("capture".into())
            .spawn(move || {
                for stream in listener.incoming() {
                    let Ok(stream) = stream else { continue };
                    let bytes = Arc::new(Mutex::new(Vec::new()));
                    list.lock().expect("not poisoned").push(bytes.clone());
                    let _ = thread::Builder::new()
                        .name("capture-conn".into())
                        .spawn(move || serve(stream, &bytes, reader));
                }
            })
            .expect("the capture upstream's thread");
        Self { addr, connections }
    }

    /// Every connection's bytes so far, in the order they were accepted.
    pub fn streams(&self) -> Vec<Vec<u8>> {
        let list = self.connections.lock().expect("not poisoned");
        list.iter().map(|b| b.lock().expect("not poisoned").clone()).collect()
    }

    /// Every connection's bytes since the last take (or the start), taken:
    /// the next take, and [`Self::streams`], start after them.
    pub fn take(&self) -> Vec<Vec<u8>> {
        let list = self.connections.lock().expect("not poisoned");
        list.iter().map(|b| std::mem::take(&mut *b.lock().expect("not poisoned"))).collect()
    }

    /// The requests the lenient reader found on every connection so far.
    pub fn served(&self) -> Vec<Message> {
        self.streams().iter().flat_map(|s| lenient(s).messages).collect()
    }
}

fn serve(mut stream: TcpStream, bytes: &Mutex<Vec<u8>>, reader: fn(&[u8]) -> Read) {
    // What is not yet whole requests: read again, with the next bytes, until
    // it is (the recorded bytes are the test's, and may be taken).
    let mut pending = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    loop {
        let n = match stream.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        bytes.lock().expect("not poisoned").extend_from_slice(&buf[..n]);
        pending.extend_from_slice(&buf[..n]);
        let read = reader(&pending);
        for m in &read.messages {
            let body = format!("served {} {} {}\n", m.method, m.target, m.body.len());
            let answer = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}", body.len());
            if stream.write_all(answer.as_bytes()).is_err() {
                return;
            }
        }
        pending.drain(..read.consumed);
        if read.stopped.as_deref().is_some_and(|s| s != "incomplete") {
            let _ = stream
                .write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_readers_agree_on_plain_requests_and_part_on_the_classic_ambiguities() {
        let plain =
            b"GET /a HTTP/1.1\r\nHost: x\r\n\r\nPOST /b HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc\
POST /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n";
        assert_eq!(strict(plain), lenient(plain));
        assert_eq!(strict(plain).messages.len(), 3);
        assert_eq!(strict(plain).messages[2].body, b"abc");
        assert!(strict(plain).messages.iter().all(|m| m.canonical));
        for odd in [
            &b"POST /a HTTP/1.1\r\nContent-Length: 03\r\n\r\nabc"[..],
            b"POST /a HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3;x\r\nabc\r\n0\r\n\r\n",
            b"POST /a HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n03\r\nabc\r\n0\r\n\r\n",
            b"POST /a HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nA\r\n0123456789\r\n0\r\n\r\n",
            b"POST /a HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nX: 1\r\n\r\n",
        ] {
            let m = &strict(odd).messages[0];
            assert!(!m.canonical, "{odd:?}");
        }
        let bare_lf = b"POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\nGET /hidden HTTP/1.1\r\nHost: x\r\n\r\n";
        assert_eq!(strict(bare_lf).messages.len(), 0, "strict refuses the bare LF");
        assert_eq!(lenient(bare_lf).messages.len(), 2, "lenient reads on, and finds the hidden one");
        let te_cl = b"POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n";
        assert!(strict(te_cl).stopped.is_some());
        assert_eq!(lenient(te_cl).messages.len(), 1);
    }
}
