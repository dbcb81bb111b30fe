//! A streaming watch over the request framing a client sends, in front of
//! hyper's parser.
//!
//! hyper resolves a request carrying both `Content-Length` and
//! `Transfer-Encoding` by dropping the length (RFC 9112 §6.3 allows it), but
//! such a request is the classic smuggling probe and a proxy should refuse
//! it outright. By the time hyper hands over the request the length is gone,
//! so this scanner follows the byte stream itself: request heads line by
//! line, then each body by its length or its chunks, so it always knows
//! where the next head starts (keep-alive, pipelining). When a head turns
//! out to carry both headers, the LF ending the second one is replaced by
//! a NUL before hyper sees it; hyper then rejects the head as malformed and
//! answers `400 Bad Request`, and nothing is forwarded.
//!
//! The watch is only worth something if it finds each message's end where
//! hyper does, so it follows hyper's own rules (hyper 1.x as
//! `server::http1` configures it: httparse for heads, hyper's
//! chunked decoder for bodies), not the RFC's:
//!
//! - a head's lines end at LF, with or without a CR before it; empty lines
//!   before a request line are skipped; the first empty line after it ends
//!   the head;
//! - `Transfer-Encoding` frames a chunked body when the last coding of its
//!   last line is `chunked`; otherwise `Content-Length` lines, all the
//!   same digits; otherwise no body;
//! - a chunk-size line is hex digits (at least one, at most a `u64`), then
//!   optional spaces or tabs, an optional `;` extension, and CRLF; chunk
//!   data ends with CRLF; no bare LF anywhere;
//! - after the last chunk, trailer lines end at CRLF only (a bare LF is a
//!   byte of the line, even the first one) until an empty CRLF line.
//!
//! Where hyper refuses what it reads (a CR not followed by LF in a head, a
//! chunk-size line it cannot read, a length it cannot parse, a last coding
//! other than `chunked`, a conflicting head), the watch stops at the same
//! byte and lets nothing after it reach hyper, which sees the end of the
//! stream behind the byte it fails on: whatever the two disagreed about,
//! no request hyper could still read goes unwatched. Heads hyper refuses for
//! other reasons (a byte httparse does not allow, obs-fold, a space before
//! `:`, too many or too long headers) and hyper's limits (chunk extensions,
//! trailer bytes) need not be followed: hyper answers 400 and closes at the
//! first of them. A head with `Upgrade` may turn the connection into a
//! tunnel: the watch stops there and passes everything, and the proxy
//! closes the connection after that request unless it is upgraded.
//! `differential.rs` checks all of this against hyper itself.
//!
//! Only a few bytes of state are kept whatever the input: header names are
//! matched as they stream by, never buffered.

/// Where in the request stream the scanner is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Scan {
    /// Reading a head, line by line.
    Head,
    /// `n` body bytes to skip.
    Body(u64),
    /// A chunk-size line's first byte: a hex digit.
    ChunkStart,
    /// The size so far: more digits, or what may follow them.
    ChunkSize(u64),
    /// Spaces or tabs after the size: more of them, `;` or CR.
    ChunkSizeWs(u64),
    /// A chunk extension: anything but LF, until CR.
    ChunkExt(u64),
    /// After a chunk-size line's CR: LF.
    ChunkSizeLf(u64),
    /// Chunk data, then CR, LF.
    ChunkData(u64),
    ChunkDataCr,
    ChunkDataLf,
    /// After the last chunk, at a line's start: CR begins the final CRLF,
    /// any other byte (a bare LF too) a trailer line.
    TrailerStart,
    /// A trailer line: anything until CR.
    Trailer,
    /// After a trailer line's CR: LF.
    TrailerLf,
    /// After the final CR: LF ends the body.
    EndLf,
    /// The connection may switch protocols: stop looking, pass everything.
    Tunnel,
    /// hyper refuses what came: nothing more reaches it.
    Lost,
}

/// What [`Framing::body`] found in the bytes it was given.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BodyScan {
    /// All of them are the body's, and it goes on; the first `keep` are
    /// not of its trailer section.
    More { keep: usize },
    /// The body ends after `used` of them; the first `keep` are not of its
    /// trailer section.
    Ended { used: usize, keep: usize },
    /// hyper would refuse the body at one of them.
    Refused,
}

/// Which header the current head line is, as far as matched.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Name {
    /// Still matching; bit set of candidates and bytes matched so far.
    Matching {
        candidates: u8,
        matched: u8,
    },
    ContentLength,
    TransferEncoding,
    Upgrade,
    Other,
}

const CANDIDATES: [&[u8]; 3] = [b"content-length", b"transfer-encoding", b"upgrade"];

const NO_NAME: Name = Name::Matching { candidates: 0b111, matched: 0 };

/// A `Content-Length` value as hyper reads it: digits only, once httparse
/// has trimmed the spaces and tabs around them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Digits {
    #[default]
    Leading,
    In(u64),
    Trailing(u64),
    Invalid,
}

impl Digits {
    fn push(self, b: u8) -> Self {
        match (self, b) {
            (Self::Leading, b' ' | b'\t') => self,
            (Self::Leading, b'0'..=b'9') => Self::In(u64::from(b - b'0')),
            (Self::In(n), b'0'..=b'9') => n
                .checked_mul(10)
                .and_then(|n| n.checked_add(u64::from(b - b'0')))
                .map_or(Self::Invalid, Self::In),
            (Self::In(n) | Self::Trailing(n), b' ' | b'\t') => Self::Trailing(n),
            _ => Self::Invalid,
        }
    }

    fn value(self) -> Option<u64> {
        match self {
            Self::In(n) | Self::Trailing(n) => Some(n),
            _ => None,
        }
    }
}

/// Whether a `Transfer-Encoding` value's last coding is `chunked`, as hyper
/// decides it: split at commas, the last piece trimmed, compared without
/// case; a value with a byte beyond ASCII is no coding at all.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Coding {
    /// Spaces or tabs before a coding.
    #[default]
    Leading,
    /// This many bytes of `chunked` matched.
    Matching(u8),
    /// `chunked`, then maybe spaces or tabs.
    Chunked,
    /// Anything else, until the next comma.
    Other,
    /// A byte hyper cannot read as text: not chunked, whatever follows.
    Opaque,
}

impl Coding {
    fn push(self, b: u8) -> Self {
        const CHUNKED: &[u8] = b"chunked";
        match (self, b.to_ascii_lowercase()) {
            (Self::Opaque, _) | (_, 0x80..=0xff) => Self::Opaque,
            (_, b',') => Self::Leading,
            (Self::Leading | Self::Chunked, b' ' | b'\t') => self,
            (Self::Leading, b) if b == CHUNKED[0] => Self::Matching(1),
            (Self::Matching(m), b) if CHUNKED[m as usize] == b => {
                if m as usize + 1 == CHUNKED.len() {
                    Self::Chunked
                } else {
                    Self::Matching(m + 1)
                }
            }
            _ => Self::Other,
        }
    }
}

/// What the scanner knows of the head being read.
#[derive(Clone, Copy, Debug)]
struct HeadScan {
    /// The request line is behind (empty lines before it are skipped).
    request_line: bool,
    /// The current line has a byte other than its line end.
    line_started: bool,
    /// The last byte was a CR: only LF may follow.
    cr: bool,
    name: Name,
    in_value: bool,
    /// The current line's value, as a length and as codings.
    digits: Digits,
    coding: Coding,
    has_length: bool,
    /// The length of the `Content-Length` lines so far, `None` once one
    /// is invalid or differs from another.
    length: Option<u64>,
    has_codings: bool,
    /// Whether the last `Transfer-Encoding` line ends in `chunked`.
    chunked: bool,
    upgrade: bool,
    /// Both framing headers seen, the head made unparseable.
    poisoned: bool,
}

impl HeadScan {
    /// Whether the rest of this line, up to its CR or LF, is bytes the
    /// watch needs not look at: the request line, or a header line whose
    /// name is none of the candidates or whose value the watch does not
    /// read (a byte of it can only be followed by more of the line, and
    /// `line_started` is already set).
    fn skips_to_line_end(&self) -> bool {
        self.line_started
            && !self.cr
            && (!self.request_line
                || matches!(self.name, Name::Other)
                || (self.in_value && matches!(self.name, Name::Upgrade)))
    }
}

impl Default for HeadScan {
    fn default() -> Self {
        Self {
            request_line: false,
            line_started: false,
            cr: false,
            name: NO_NAME,
            in_value: false,
            digits: Digits::default(),
            coding: Coding::default(),
            has_length: false,
            length: None,
            has_codings: false,
            chunked: false,
            upgrade: false,
            poisoned: false,
        }
    }
}

/// The scanner for one client connection.
#[derive(Debug)]
pub struct Framing {
    state: Scan,
    head: HeadScan,
    /// Heads seen, and heads poisoned for carrying both framing headers.
    pub heads: u64,
    pub poisoned: u64,
    /// Bytes of chunk extensions in a body scanned by [`Framing::body`].
    extension_bytes: u64,
}

/// hyper refuses a body whose chunk extensions (the bytes after each `;`,
/// up to the CR) reach this many bytes in all.
const CHUNK_EXTENSIONS_LIMIT: u64 = 16 * 1024;

impl Default for Framing {
    fn default() -> Self {
        Self { state: Scan::Head, head: HeadScan::default(), heads: 0, poisoned: 0, extension_bytes: 0 }
    }
}

impl Framing {
    /// Scans bytes just read from the client, in place, before hyper sees
    /// them. Returns how many of them hyper may see: all, unless the watch
    /// stops at a byte hyper refuses, then those up to and including it
    /// (and none in later reads).
    pub fn feed(&mut self, buf: &mut [u8]) -> usize {
        let mut i = 0;
        while i < buf.len() {
            match self.state {
                Scan::Tunnel => return buf.len(),
                Scan::Lost => return i,
                Scan::Body(n) => {
                    let take = n.min((buf.len() - i) as u64);
                    i += take as usize;
                    if n == take {
                        self.next_message();
                    } else {
                        self.state = Scan::Body(n - take);
                    }
                }
                Scan::ChunkData(n) => {
                    let take = n.min((buf.len() - i) as u64);
                    i += take as usize;
                    self.state = if n == take { Scan::ChunkDataCr } else { Scan::ChunkData(n - take) };
                }
                Scan::Head if self.head.skips_to_line_end() => {
                    // Nothing before the line's CR or LF can change what
                    // the watch knows: jump there.
                    match memchr::memchr2(b'\r', b'\n', &buf[i..]) {
                        Some(at) => {
                            i += at;
                            self.step(buf, i);
                            i += 1;
                        }
                        None => i = buf.len(),
                    }
                }
                _ => {
                    self.step(buf, i);
                    i += 1;
                }
            }
        }
        i
    }

    /// A scanner for one chunked body from its first chunk-size line: the
    /// native engine relays such a body as the client framed it, and ends
    /// it (or refuses it) exactly where hyper would.
    pub fn chunked_body() -> Self {
        Self { state: Scan::ChunkStart, ..Self::default() }
    }

    /// Scans the next bytes of a body begun with [`Framing::chunked_body`].
    /// What it reports to keep is the body less its trailer section
    /// (trailer lines and the final CRLF): hyper drops trailers towards
    /// the upstream (and towards the client, once the `Trailer` header has
    /// gone as hop-by-hop), so a relay ends the kept bytes with a CRLF of
    /// its own.
    pub fn body(&mut self, buf: &mut [u8]) -> BodyScan {
        let mut i = 0;
        // Where the trailer section began in these bytes, if it did.
        let mut trailers = self.in_trailers().then_some(0);
        while i < buf.len() {
            match self.state {
                Scan::Head => break,
                Scan::Lost | Scan::Tunnel => return BodyScan::Refused,
                Scan::ChunkData(n) => {
                    let take = n.min((buf.len() - i) as u64);
                    i += take as usize;
                    self.state = if n == take { Scan::ChunkDataCr } else { Scan::ChunkData(n - take) };
                }
                _ => {
                    let in_extension = matches!(self.state, Scan::ChunkExt(_));
                    self.step(buf, i);
                    i += 1;
                    if in_extension && matches!(self.state, Scan::ChunkExt(_)) {
                        // hyper's bound on a body's chunk extensions.
                        self.extension_bytes += 1;
                        if self.extension_bytes >= CHUNK_EXTENSIONS_LIMIT {
                            self.state = Scan::Lost;
                            return BodyScan::Refused;
                        }
                    }
                    if trailers.is_none() && self.in_trailers() {
                        trailers = Some(i);
                    }
                }
            }
        }
        let keep = trailers.unwrap_or(i).min(i);
        match self.state {
            Scan::Head => BodyScan::Ended { used: i, keep },
            Scan::Lost | Scan::Tunnel => BodyScan::Refused,
            _ => BodyScan::More { keep },
        }
    }

    /// After the last chunk: its trailer lines or the final CRLF.
    fn in_trailers(&self) -> bool {
        matches!(self.state, Scan::TrailerStart | Scan::Trailer | Scan::TrailerLf | Scan::EndLf)
    }

    /// The watch stopped where hyper refuses the stream: hyper must see
    /// nothing more.
    pub fn is_lost(&self) -> bool {
        self.state == Scan::Lost
    }

    /// No byte of a next request has come: every request read so far was
    /// read whole, head and body.
    pub fn between_requests(&self) -> bool {
        self.state == Scan::Head && !self.head.request_line && !self.head.line_started && !self.head.cr
    }

    /// Bytes of a head have come, and not its end.
    pub fn in_head(&self) -> bool {
        self.state == Scan::Head && !self.between_requests()
    }

    fn next_message(&mut self) {
        self.state = Scan::Head;
        self.head = HeadScan::default();
    }

    /// One byte of a head, a chunk-size line, a chunk end or a trailer.
    fn step(&mut self, buf: &mut [u8], i: usize) {
        let b = buf[i];
        self.state = match (self.state, b) {
            (Scan::Head, _) => {
                self.head_byte(buf, i);
                return;
            }
            (Scan::ChunkStart, _) => match hex(b) {
                Some(d) => Scan::ChunkSize(d),
                None => Scan::Lost,
            },
            (Scan::ChunkSize(size), _) => match hex(b) {
                // No more than a u64 holds: hyper refuses an overflow.
                Some(d) => size.checked_mul(16).map_or(Scan::Lost, |s| Scan::ChunkSize(s | d)),
                None => after_size(size, b),
            },
            (Scan::ChunkSizeWs(size), _) => after_size(size, b),
            (Scan::ChunkExt(size), b'\r') => Scan::ChunkSizeLf(size),
            (Scan::ChunkExt(_), b'\n') => Scan::Lost,
            (Scan::ChunkExt(size), _) => Scan::ChunkExt(size),
            (Scan::ChunkSizeLf(0), b'\n') => Scan::TrailerStart,
            (Scan::ChunkSizeLf(size), b'\n') => Scan::ChunkData(size),
            (Scan::ChunkDataCr, b'\r') => Scan::ChunkDataLf,
            (Scan::ChunkDataLf, b'\n') => Scan::ChunkStart,
            (Scan::TrailerStart, b'\r') => Scan::EndLf,
            (Scan::Trailer, b'\r') => Scan::TrailerLf,
            (Scan::TrailerStart | Scan::Trailer, _) => Scan::Trailer,
            (Scan::TrailerLf, b'\n') => Scan::TrailerStart,
            (Scan::EndLf, b'\n') => {
                self.next_message();
                return;
            }
            (Scan::Body(_) | Scan::ChunkData(_) | Scan::Tunnel | Scan::Lost, _) => {
                unreachable!("handled in feed")
            }
            // A CR or LF where hyper's decoder wants the other.
            _ => Scan::Lost,
        };
    }

    fn head_byte(&mut self, buf: &mut [u8], i: usize) {
        let b = buf[i];
        let h = &mut self.head;
        if h.cr && b != b'\n' {
            // httparse allows a CR only right before LF.
            self.state = Scan::Lost;
            return;
        }
        match b {
            b'\n' => self.end_line(buf, i),
            b'\r' => h.cr = true,
            _ => {
                h.line_started = true;
                if h.in_value {
                    match h.name {
                        Name::ContentLength => h.digits = h.digits.push(b),
                        Name::TransferEncoding => h.coding = h.coding.push(b),
                        _ => {}
                    }
                } else if b == b':' {
                    h.in_value = true;
                    h.name = match h.name {
                        Name::Matching { candidates, matched } => {
                            let hit = (0..3).find(|&k| {
                                candidates & (1 << k) != 0 && CANDIDATES[k].len() == matched as usize
                            });
                            match hit {
                                Some(0) => Name::ContentLength,
                                Some(1) => Name::TransferEncoding,
                                Some(2) => Name::Upgrade,
                                _ => Name::Other,
                            }
                        }
                        other => other,
                    };
                } else if let Name::Matching { candidates, matched } = h.name {
                    let lower = b.to_ascii_lowercase();
                    let mut still = 0;
                    for (k, cand) in CANDIDATES.iter().enumerate() {
                        if candidates & (1 << k) != 0 && cand.get(matched as usize) == Some(&lower) {
                            still |= 1 << k;
                        }
                    }
                    h.name = if still == 0 {
                        Name::Other
                    } else {
                        Name::Matching { candidates: still, matched: matched + 1 }
                    };
                }
            }
        }
    }

    /// A head line's LF: the request line, a header line, or the empty
    /// line that ends the head.
    fn end_line(&mut self, buf: &mut [u8], lf: usize) {
        let line = self.head;
        let h = &mut self.head;
        h.line_started = false;
        h.cr = false;
        h.name = NO_NAME;
        h.in_value = false;
        h.digits = Digits::default();
        h.coding = Coding::default();
        if !line.line_started {
            if line.request_line {
                self.end_head();
            }
            return;
        }
        if !line.request_line {
            h.request_line = true;
            return;
        }
        match line.name {
            Name::ContentLength => {
                // Identical duplicates are one length (as hyper reads
                // them); different ones make hyper refuse the head.
                let value = line.digits.value();
                h.length = if h.has_length && h.length != value { None } else { value };
                h.has_length = true;
                if h.has_codings {
                    self.poison(buf, lf);
                }
            }
            Name::TransferEncoding => {
                h.has_codings = true;
                h.chunked = line.coding == Coding::Chunked;
                if h.has_length {
                    self.poison(buf, lf);
                }
            }
            Name::Upgrade => h.upgrade = true,
            _ => {}
        }
    }

    /// Makes this head malformed for hyper: the line's LF becomes NUL,
    /// which no header value may contain (and which httparse refuses after
    /// a CR too).
    fn poison(&mut self, buf: &mut [u8], lf: usize) {
        buf[lf] = 0;
        self.head.poisoned = true;
        self.poisoned += 1;
    }

    fn end_head(&mut self) {
        self.heads += 1;
        let h = self.head;
        self.state = if h.poisoned {
            // hyper answers 400 at the NUL.
            Scan::Lost
        } else if h.has_codings {
            // A last coding other than chunked: hyper answers 400.
            if h.chunked { Scan::ChunkStart } else { Scan::Lost }
        } else if h.has_length {
            // An invalid or a second, different length: 400 too.
            h.length.map_or(Scan::Lost, Scan::Body)
        } else {
            Scan::Body(0)
        };
        if h.upgrade && self.state != Scan::Lost {
            // May become a tunnel; the proxy closes the connection if the
            // upgrade does not happen, so nothing is lost by stopping here.
            self.state = Scan::Tunnel;
        }
        if self.state == Scan::Body(0) {
            self.next_message();
        }
    }
}

fn hex(b: u8) -> Option<u64> {
    (b as char).to_digit(16).map(u64::from)
}

/// What may follow a chunk size's digits: spaces or tabs, an extension,
/// the line's CR; a bare LF or anything else makes hyper refuse the body.
fn after_size(size: u64, b: u8) -> Scan {
    match b {
        b' ' | b'\t' => Scan::ChunkSizeWs(size),
        b';' => Scan::ChunkExt(size),
        b'\r' => Scan::ChunkSizeLf(size),
        _ => Scan::Lost,
    }
}

#[cfg(test)]
mod corpus;
#[cfg(test)]
mod differential;
#[cfg(test)]
mod tests;
