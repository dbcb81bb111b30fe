//! A recording upstream for differential tests: a raw [`TcpListener`]
//! served by one thread per connection, which parses HTTP/1.1 requests
//! itself ([`httparse`], keep-alive and pipelined), decodes their bodies
//! (`Content-Length`, or chunked with trailers), records each request as
//! it arrived and answers it from its path, byte for byte the same way
//! every time.
//!
//! | path (HEAD: the same head, no body) | answer |
//! |---|---|
//! | `/r/chunked` | `200`, chunked in four chunks; with `trailers` in the query, a `Trailer` header and two trailer fields |
//! | `/r/close` | `200` with neither length nor chunks: the body ends when the connection closes |
//! | `/r/204`, `/r/304` | no body |
//! | `/r/big` | `200`, a [`BIG`]-byte body with `Content-Length` |
//! | `/r/hop` | `200` carrying hop-by-hop headers a proxy must remove (`Connection: x-drop`, `X-Drop`, `Keep-Alive`, `Proxy-Connection`) |
//! | `/r/status/NNN` | status `NNN` (404, 500, 503, anything from 200 to 599), a short body |
//! | anything else | `200` and `METHOD TARGET LENGTH\n`: the method, target and decoded body length it received |
//!
//! A request with `Expect: 100-continue` first gets `100 Continue`; one
//! with `Connection: close` (or HTTP/1.0 without `keep-alive`) gets its
//! answer and the connection closes; a head httparse refuses gets `400`
//! with `Connection: close`, and the connection closes. Only a
//! close-delimited body (`/r/close`, not to HEAD) closes a connection
//! unannounced: any other unannounced close would race the proxy's next
//! request on its pooled connection.
//!
//! Each [`Recorded`] request names the listener port it says it came
//! through (`X-Forwarded-Port`) and the client its proxy says it serves
//! (the last `X-Forwarded-For` element): a test that sends each case from
//! its own loopback address through several proxies in front of one
//! recorder can take each proxy's requests for each case
//! ([`Recorder::take`]) while cases run in parallel.

use std::{
    fmt,
    io::{self, Read as _, Write as _},
    net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    thread,
    time::Duration,
};

/// The size of `/r/big`'s body: more than the proxy's 64 KiB read-ahead.
pub const BIG: usize = 300 * 1024;

/// The most header lines a recorded head may have.
const MAX_HEADERS: usize = 1024;

/// A header or trailer field: its name lowercased, its value's bytes.
pub type Field = (String, Vec<u8>);

/// One request as the upstream received it.
#[derive(Clone, PartialEq, Eq)]
pub struct Recorded {
    /// The `X-Forwarded-Port` it carried, when that is a number.
    pub port: Option<u16>,
    /// The last element of its last `X-Forwarded-For`, when an address.
    pub client: Option<IpAddr>,
    pub method: String,
    pub target: Vec<u8>,
    /// `1` for HTTP/1.1, `0` for HTTP/1.0.
    pub version: u8,
    /// In order, names lowercased.
    pub headers: Vec<Field>,
    /// The body, decoded.
    pub body: Vec<u8>,
    /// The trailer fields of a chunked body, `None` for any other body.
    pub trailers: Option<Vec<Field>>,
    /// Whether the body arrived whole (so far, while `false`).
    pub complete: bool,
    /// Why the head or the body could not be read, with the head's raw
    /// bytes for a head httparse refused.
    pub error: Option<String>,
}

impl fmt::Debug for Recorded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{} {} HTTP/1.{}", self.method, Escaped(&self.target), self.version)?;
        for (name, value) in &self.headers {
            writeln!(f, "{name}: {}", Escaped(value))?;
        }
        writeln!(f, "body: {}", BodyShown(&self.body))?;
        if let Some(trailers) = &self.trailers {
            for (name, value) in trailers {
                writeln!(f, "trailer {name}: {}", Escaped(value))?;
            }
        }
        if !self.complete {
            writeln!(f, "(body incomplete)")?;
        }
        if let Some(e) = &self.error {
            writeln!(f, "error: {e}")?;
        }
        Ok(())
    }
}

/// Bytes shown as the inside of a Rust byte string (`\r`, `\n`, `\x00`).
pub struct Escaped<'a>(pub &'a [u8]);

impl fmt::Display for Escaped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for &b in self.0 {
            match b {
                b'"' => f.write_str("\\\"")?,
                b'\'' => f.write_str("'")?,
                _ => write!(f, "{}", std::ascii::escape_default(b))?,
            }
        }
        Ok(())
    }
}

/// A body shown whole when short, else by its length, a hash and its
/// first bytes.
pub struct BodyShown<'a>(pub &'a [u8]);

impl fmt::Display for BodyShown<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.len() <= 200 {
            write!(f, "b\"{}\"", Escaped(self.0))
        } else {
            let hash = self
                .0
                .iter()
                .fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3));
            write!(f, "{} bytes, fnv {hash:016x}, b\"{}\"...", self.0.len(), Escaped(&self.0[..64]))
        }
    }
}

struct Shared {
    log: Mutex<Vec<Recorded>>,
    stop: AtomicBool,
}

/// The recording upstream; it stops accepting on drop (connections open
/// then end when their proxies close them).
pub struct Recorder {
    pub addr: SocketAddr,
    shared: Arc<Shared>,
}

impl Recorder {
    pub fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the recorder");
        let addr = listener.local_addr().expect("the recorder's address");
        let shared = Arc::new(Shared { log: Mutex::new(Vec::new()), stop: AtomicBool::new(false) });
        let accepting = shared.clone();
        thread::Builder::new()
            .name("recorder".into())
            .spawn(move || {
                for stream in listener.incoming() {
                    if accepting.stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let Ok(stream) = stream else { continue };
                    let shared = accepting.clone();
                    let _ = thread::Builder::new().name("recorder-conn".into()).spawn(move || {
                        let _ = serve(&shared, stream);
                    });
                }
            })
            .expect("the recorder's thread");
        Self { addr, shared }
    }

    /// Removes and returns, in arrival order, the requests that came
    /// through listener `port` for client `client`.
    pub fn take(&self, port: u16, client: IpAddr) -> Vec<Recorded> {
        let mut log = self.shared.log.lock().expect("not poisoned");
        let (mine, rest) = std::mem::take(&mut *log)
            .into_iter()
            .partition(|r: &Recorded| r.port == Some(port) && r.client == Some(client));
        *log = rest;
        mine
    }

    /// Everything recorded and not taken.
    pub fn remaining(&self) -> Vec<Recorded> {
        self.shared.log.lock().expect("not poisoned").clone()
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        let _ = TcpStream::connect(self.addr);
    }
}

/// A parsed head: what [`parse_head`] returns.
#[derive(Clone, Debug)]
pub struct Head {
    pub method: String,
    pub target: Vec<u8>,
    pub version: u8,
    pub headers: Vec<Field>,
    /// Its length in bytes, the empty line included.
    pub len: usize,
}

impl Head {
    /// The values of every `name` line (lowercase `name`).
    pub fn values<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a [u8]> + 'a {
        self.headers.iter().filter(move |(n, _)| n == name).map(|(_, v)| v.as_slice())
    }

    /// Whether a comma-separated `name` lists `token` (any case).
    pub fn lists(&self, name: &str, token: &str) -> bool {
        self.values(name)
            .flat_map(|v| v.split(|&b| b == b','))
            .any(|t| trim(t).eq_ignore_ascii_case(token.as_bytes()))
    }

    /// How the body that follows is framed (RFC 9112 §6.3, for a request).
    pub fn framing(&self) -> Result<Framing, String> {
        if let Some(last) = self.values("transfer-encoding").last() {
            let coding = last.rsplit(|&b| b == b',').next().map(trim).unwrap_or_default();
            return if coding.eq_ignore_ascii_case(b"chunked") {
                Ok(Framing::Chunked)
            } else {
                Err(format!("transfer coding `{}` is not chunked", Escaped(last)))
            };
        }
        let mut length = None;
        for v in self.values("content-length") {
            let n = std::str::from_utf8(trim(v))
                .ok()
                .and_then(|s| s.parse::<u64>().ok())
                .ok_or_else(|| format!("bad content-length `{}`", Escaped(v)))?;
            if length.is_some_and(|l| l != n) {
                return Err("different content-lengths".into());
            }
            length = Some(n);
        }
        Ok(length.map_or(Framing::None, Framing::Length))
    }
}

/// How a message body is delimited.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Framing {
    None,
    Length(u64),
    Chunked,
}

pub fn trim(v: &[u8]) -> &[u8] {
    let start = v.iter().position(|b| !b.is_ascii_whitespace()).unwrap_or(v.len());
    let end = v.iter().rposition(|b| !b.is_ascii_whitespace()).map_or(start, |e| e + 1);
    &v[start..end]
}

/// A request head at the start of `buf`, after any empty lines: `Ok(None)`
/// while incomplete. The head's `len` counts the empty lines skipped.
pub fn parse_head(buf: &[u8]) -> Result<Option<Head>, String> {
    let skipped = buf.iter().take_while(|&&b| b == b'\r' || b == b'\n').count();
    let mut headers = vec![httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    match req.parse(&buf[skipped..]) {
        Ok(httparse::Status::Complete(len)) => Ok(Some(Head {
            method: req.method.unwrap_or_default().to_owned(),
            target: req.path.unwrap_or_default().as_bytes().to_vec(),
            version: req.version.unwrap_or_default(),
            headers: req.headers.iter().map(|h| (h.name.to_ascii_lowercase(), h.value.to_vec())).collect(),
            len: skipped + len,
        })),
        Ok(httparse::Status::Partial) => Ok(None),
        Err(e) => Err(e.to_string()),
    }
}

/// An incremental chunked-body decoder, lenient where the test's own
/// parsers may be (a bare LF ends a line).
#[derive(Debug, Default)]
pub struct Chunked {
    state: ChunkState,
    line: Vec<u8>,
    pub body: Vec<u8>,
    pub trailers: Vec<Field>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum ChunkState {
    #[default]
    Size,
    Data(u64),
    DataEnd,
    Trailers,
    Done,
}

impl Chunked {
    /// Takes what it can from `input`; returns how many bytes it took.
    pub fn feed(&mut self, input: &[u8]) -> Result<usize, String> {
        let mut at = 0;
        while at < input.len() && self.state != ChunkState::Done {
            if let ChunkState::Data(left) = self.state {
                let n = usize::try_from(left).unwrap_or(usize::MAX).min(input.len() - at);
                self.body.extend_from_slice(&input[at..at + n]);
                at += n;
                let left = left - n as u64;
                self.state = if left == 0 { ChunkState::DataEnd } else { ChunkState::Data(left) };
                continue;
            }
            let b = input[at];
            at += 1;
            if b != b'\n' {
                self.line.push(b);
                if self.line.len() > 64 * 1024 {
                    return Err("a chunk line over 64 KiB".into());
                }
                continue;
            }
            let mut line = std::mem::take(&mut self.line);
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            self.state = match self.state {
                ChunkState::Size => {
                    let digits: Vec<u8> = line.iter().copied().take_while(u8::is_ascii_hexdigit).collect();
                    let size = std::str::from_utf8(&digits)
                        .ok()
                        .and_then(|d| u64::from_str_radix(d, 16).ok())
                        .ok_or_else(|| format!("bad chunk size line `{}`", Escaped(&line)))?;
                    if size == 0 { ChunkState::Trailers } else { ChunkState::Data(size) }
                }
                ChunkState::DataEnd if line.is_empty() => ChunkState::Size,
                ChunkState::DataEnd => return Err(format!("`{}` after chunk data", Escaped(&line))),
                ChunkState::Trailers if line.is_empty() => ChunkState::Done,
                ChunkState::Trailers => {
                    let colon = line.iter().position(|&b| b == b':').ok_or("a trailer line without `:`")?;
                    let name = String::from_utf8_lossy(&line[..colon]).to_ascii_lowercase();
                    self.trailers.push((name, trim(&line[colon + 1..]).to_vec()));
                    ChunkState::Trailers
                }
                ChunkState::Data(_) | ChunkState::Done => unreachable!("handled above"),
            };
        }
        Ok(at)
    }

    pub fn done(&self) -> bool {
        self.state == ChunkState::Done
    }
}

/// The methods of the requests pipelined in `bytes`, as far as they
/// parse (the bodies skipped by their framing).
pub fn request_methods(bytes: &[u8]) -> Vec<String> {
    let mut methods = Vec::new();
    let mut at = 0;
    while let Ok(Some(head)) = parse_head(&bytes[at..]) {
        at += head.len;
        methods.push(head.method.clone());
        match head.framing() {
            Ok(Framing::None) => {}
            Ok(Framing::Length(n)) => at = at.saturating_add(usize::try_from(n).unwrap_or(usize::MAX)),
            Ok(Framing::Chunked) => {
                let mut chunked = Chunked::default();
                match chunked.feed(&bytes[at..]) {
                    Ok(n) if chunked.done() => at += n,
                    _ => break,
                }
            }
            Err(_) => break,
        }
        if at >= bytes.len() {
            break;
        }
    }
    methods
}

/// Where a connection's requests are read from: what was read and not
/// yet used, and the socket.
struct Conn {
    stream: TcpStream,
    buf: Vec<u8>,
}

impl Conn {
    /// Reads more; `Ok(false)` at EOF.
    fn fill(&mut self) -> io::Result<bool> {
        let mut chunk = [0u8; 16 * 1024];
        let n = self.stream.read(&mut chunk)?;
        self.buf.extend_from_slice(&chunk[..n]);
        Ok(n > 0)
    }
}

fn serve(shared: &Shared, stream: TcpStream) -> io::Result<()> {
    stream.set_nodelay(true)?;
    // Proxies keep idle upstream connections for a while; this thread
    // goes when they close them (or the test process ends).
    stream.set_read_timeout(Some(Duration::from_secs(120)))?;
    let mut conn = Conn { stream, buf: Vec::new() };
    loop {
        let head = loop {
            match parse_head(&conn.buf) {
                Ok(Some(head)) => break head,
                Ok(None) if conn.buf.len() > 1 << 20 => {
                    record_refused(shared, &conn.buf, "a head over 1 MiB");
                    return answer_and_close(&mut conn.stream, &refusal());
                }
                Ok(None) => {
                    if !conn.fill()? {
                        if conn.buf.iter().any(|b| !b.is_ascii_whitespace()) {
                            record_refused(shared, &conn.buf, "the connection ended in a head");
                        }
                        return Ok(());
                    }
                }
                Err(e) => {
                    let end = find(&conn.buf, b"\r\n\r\n").map_or(conn.buf.len(), |e| e + 4);
                    record_refused(shared, &conn.buf[..end], &format!("httparse: {e}"));
                    return answer_and_close(&mut conn.stream, &refusal());
                }
            }
        };
        conn.buf.drain(..head.len);
        let index = {
            let mut log = shared.log.lock().expect("not poisoned");
            log.push(Recorded {
                port: forwarded_port(&head),
                client: forwarded_client(&head),
                method: head.method.clone(),
                target: head.target.clone(),
                version: head.version,
                headers: head.headers.clone(),
                body: Vec::new(),
                trailers: None,
                complete: false,
                error: None,
            });
            log.len() - 1
        };
        if head.lists("expect", "100-continue") {
            conn.stream.write_all(b"HTTP/1.1 100 Continue\r\n\r\n")?;
        }
        let mut body = BodyReader::new(&head);
        let outcome = loop {
            match body.step(&mut conn.buf) {
                Err(e) => break Err(e),
                Ok(true) => break Ok(()),
                Ok(false) => {}
            }
            sync(shared, index, &head, &body, false, None);
            match conn.fill() {
                Ok(true) => {}
                Ok(false) => break Err("the connection ended in the body".to_owned()),
                Err(e) => break Err(format!("reading the body: {e}")),
            }
        };
        match outcome {
            Ok(()) => sync(shared, index, &head, &body, true, None),
            Err(e) => {
                sync(shared, index, &head, &body, false, Some(e));
                return Ok(());
            }
        }
        let (response, close) = respond(&head, body.len());
        if close {
            return answer_and_close(&mut conn.stream, &response);
        }
        conn.stream.write_all(&response)?;
    }
}

/// Writes the state of request `index`'s body into the log: found again
/// by its head and client, since [`Recorder::take`] may have moved it.
fn sync(
    shared: &Shared,
    index: usize,
    head: &Head,
    body: &BodyReader,
    complete: bool,
    error: Option<String>,
) {
    let mut log = shared.log.lock().expect("not poisoned");
    let port = forwarded_port(head);
    let client = forwarded_client(head);
    let found = match log.get(index) {
        Some(r) if r.port == port && r.client == client && r.headers == head.headers && !r.complete => {
            Some(index)
        }
        _ => log.iter().rposition(|r| {
            r.port == port
                && r.client == client
                && r.headers == head.headers
                && !r.complete
                && r.error.is_none()
        }),
    };
    if let Some(r) = found.and_then(|i| log.get_mut(i)) {
        r.body = body.body().to_vec();
        r.trailers = body.trailers();
        r.complete = complete;
        r.error = error;
    }
}

/// A request body being read.
enum BodyReader {
    Length { left: u64, body: Vec<u8> },
    Chunked(Chunked),
}

impl BodyReader {
    fn new(head: &Head) -> Self {
        match head.framing() {
            Ok(Framing::Chunked) => Self::Chunked(Chunked::default()),
            Ok(Framing::Length(n)) => Self::Length { left: n, body: Vec::new() },
            // The proxy frames what it sends; anything else is no body.
            Ok(Framing::None) | Err(_) => Self::Length { left: 0, body: Vec::new() },
        }
    }

    /// Takes what it can from `buf`; `Ok(true)` when the body is whole.
    fn step(&mut self, buf: &mut Vec<u8>) -> Result<bool, String> {
        match self {
            Self::Length { left, body } => {
                let n = usize::try_from(*left).unwrap_or(usize::MAX).min(buf.len());
                body.extend(buf.drain(..n));
                *left -= n as u64;
                Ok(*left == 0)
            }
            Self::Chunked(c) => {
                let n = c.feed(buf)?;
                buf.drain(..n);
                Ok(c.done())
            }
        }
    }

    fn body(&self) -> &[u8] {
        match self {
            Self::Length { body, .. } => body,
            Self::Chunked(c) => &c.body,
        }
    }

    fn len(&self) -> usize {
        self.body().len()
    }

    fn trailers(&self) -> Option<Vec<Field>> {
        match self {
            Self::Length { .. } => None,
            Self::Chunked(c) => Some(c.trailers.clone()),
        }
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

fn forwarded_port(head: &Head) -> Option<u16> {
    head.values("x-forwarded-port").find_map(|v| std::str::from_utf8(trim(v)).ok()?.parse().ok())
}

fn forwarded_client(head: &Head) -> Option<IpAddr> {
    let last = head.values("x-forwarded-for").last()?;
    let element = last.rsplit(|&b| b == b',').next()?;
    std::str::from_utf8(trim(element)).ok()?.parse().ok()
}

/// Records a head httparse refused, with what can be found of the
/// forwarding headers by scanning its lines.
fn record_refused(shared: &Shared, raw: &[u8], why: &str) {
    let mut headers = Vec::new();
    for line in raw.split(|&b| b == b'\n').skip(1) {
        if let Some(colon) = line.iter().position(|&b| b == b':') {
            let name = String::from_utf8_lossy(trim(&line[..colon])).to_ascii_lowercase();
            headers.push((name, trim(&line[colon + 1..]).to_vec()));
        }
    }
    let head = Head { method: String::new(), target: Vec::new(), version: 1, headers, len: 0 };
    shared.log.lock().expect("not poisoned").push(Recorded {
        port: forwarded_port(&head),
        client: forwarded_client(&head),
        method: String::new(),
        target: Vec::new(),
        version: 1,
        headers: Vec::new(),
        body: Vec::new(),
        trailers: None,
        complete: false,
        error: Some(format!("{why}; the head: b\"{}\"", Escaped(raw))),
    });
}

/// The answer to a head the recorder cannot read: 400, and the close
/// announced (so the proxy never sends another request on it).
fn refusal() -> Vec<u8> {
    b"HTTP/1.1 400 Bad Request\r\nServer: recorder\r\nConnection: close\r\nContent-Length: 0\r\n\r\n".to_vec()
}

fn answer_and_close(stream: &mut TcpStream, response: &[u8]) -> io::Result<()> {
    stream.write_all(response)?;
    stream.flush()?;
    let _ = stream.shutdown(Shutdown::Write);
    // Read what the proxy still sends, so that the close is a FIN, never
    // a reset that could wipe the answer.
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    let mut sink = [0u8; 16 * 1024];
    while matches!(stream.read(&mut sink), Ok(n) if n > 0) {}
    Ok(())
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        204 => "No Content",
        304 => "Not Modified",
        400 => "Bad Request",
        404 => "Not Found",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "Whatever",
    }
}

/// The headers every answer carries (duplicates and odd case included).
const COMMON: &[u8] = b"Server: recorder\r\nX-Upstream: Recorder\r\nSet-Cookie: a=1\r\nset-cookie: b=2\r\n\
    Cache-Control: no-store\r\n";

fn status_response(status: u16, method: &[u8]) -> Vec<u8> {
    let body = format!("status {status}\n");
    let mut out = format!("HTTP/1.1 {status} {}\r\n", reason(status)).into_bytes();
    out.extend_from_slice(COMMON);
    out.extend_from_slice(b"Content-Type: text/plain\r\n");
    out.extend_from_slice(format!("Content-Length: {}\r\n\r\n", body.len()).as_bytes());
    if method != b"HEAD" {
        out.extend_from_slice(body.as_bytes());
    }
    out
}

/// The answer to `head` whose body had `body_len` bytes, and whether the
/// connection closes after it.
fn respond(head: &Head, body_len: usize) -> (Vec<u8>, bool) {
    let head_only = head.method == "HEAD";
    let close =
        head.lists("connection", "close") || (head.version == 0 && !head.lists("connection", "keep-alive"));
    let target = &head.target;
    let path_end = target.iter().position(|&b| b == b'?').unwrap_or(target.len());
    let (path, query) = (&target[..path_end], &target[path_end..]);
    let with = |mut out: Vec<u8>, body: &[u8]| {
        if !head_only {
            out.extend_from_slice(body);
        }
        out
    };
    let length_response = |status: u16, extra: &[u8], body: &[u8]| {
        let mut out = format!("HTTP/1.1 {status} {}\r\n", reason(status)).into_bytes();
        out.extend_from_slice(COMMON);
        out.extend_from_slice(extra);
        out.extend_from_slice(
            format!("Content-Type: text/plain\r\nContent-Length: {}\r\n\r\n", body.len()).as_bytes(),
        );
        with(out, body)
    };
    let response = match path {
        b"/r/chunked" => {
            let trailers = find(query, b"trailers").is_some();
            let mut out = b"HTTP/1.1 200 OK\r\n".to_vec();
            out.extend_from_slice(COMMON);
            out.extend_from_slice(b"Content-Type: text/plain\r\nTransfer-Encoding: chunked\r\n");
            if trailers {
                out.extend_from_slice(b"Trailer: X-Checksum, X-Count\r\n");
            }
            out.extend_from_slice(b"\r\n");
            if !head_only {
                let filler = vec![b'z'; 3000];
                for chunk in [&b"first chunk,"[..], b" second,", &filler, b" and the last\n"] {
                    out.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
                    out.extend_from_slice(chunk);
                    out.extend_from_slice(b"\r\n");
                }
                out.extend_from_slice(b"0\r\n");
                if trailers {
                    out.extend_from_slice(b"X-Checksum: 5eb63bbbe01eeed0\r\nX-Count: 4\r\n");
                }
                out.extend_from_slice(b"\r\n");
            }
            out
        }
        b"/r/close" => {
            let mut out = b"HTTP/1.1 200 OK\r\n".to_vec();
            out.extend_from_slice(COMMON);
            out.extend_from_slice(b"Content-Type: text/plain\r\n\r\n");
            // The body ends with the connection; a HEAD's answer has none,
            // so its connection stays (closing it would race the proxy's
            // next request on it).
            return (with(out, b"a body delimited by the connection's close\n"), close || !head_only);
        }
        b"/r/204" => {
            let mut out = b"HTTP/1.1 204 No Content\r\n".to_vec();
            out.extend_from_slice(COMMON);
            out.extend_from_slice(b"\r\n");
            out
        }
        b"/r/304" => {
            let mut out = b"HTTP/1.1 304 Not Modified\r\n".to_vec();
            out.extend_from_slice(COMMON);
            out.extend_from_slice(b"ETag: \"v1\"\r\n\r\n");
            out
        }
        b"/r/big" => {
            let body: Vec<u8> = (0..BIG).map(|i| b"0123456789abcdefghijklmnopqrstuvwxyz\n"[i % 37]).collect();
            length_response(200, b"", &body)
        }
        b"/r/hop" => length_response(
            200,
            b"Connection: x-drop\r\nX-Drop: 1\r\nKeep-Alive: timeout=5\r\n\
              Proxy-Connection: keep-alive\r\nX-Kept: 1\r\n",
            b"hop-by-hop headers were sent\n",
        ),
        _ if path.starts_with(b"/r/status/") => {
            let status = std::str::from_utf8(&path[10..])
                .ok()
                .and_then(|s| s.parse::<u16>().ok())
                .filter(|s| (200..600).contains(s) && *s != 204 && *s != 304)
                .unwrap_or(400);
            status_response(status, head.method.as_bytes())
        }
        _ => {
            let body = format!("{} {} {body_len}\n", head.method, Escaped(target));
            length_response(200, b"", body.as_bytes())
        }
    };
    (response, close)
}
