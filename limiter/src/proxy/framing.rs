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
//! out to carry both headers, the line end of the second one is replaced by
//! a NUL before hyper sees it; hyper then rejects the head as malformed and
//! answers `400 Bad Request`, and nothing is forwarded.
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
    /// A chunk-size line: the size so far, and whether we are past the
    /// digits (in an extension).
    ChunkSize {
        size: u64,
        in_ext: bool,
        digits: u8,
    },
    /// After a chunk-size line's CR, expecting LF.
    ChunkSizeLf {
        size: u64,
    },
    /// Chunk data, then CRLF.
    ChunkData(u64),
    ChunkDataCr,
    ChunkDataLf,
    /// Trailer lines after the last chunk, until an empty line.
    Trailers {
        line_empty: bool,
    },
    TrailersLf {
        line_empty: bool,
    },
    /// Not HTTP any more (an upgrade) or not followable: stop looking.
    Off,
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

/// The scanner for one client connection.
#[derive(Debug)]
pub struct Framing {
    state: Scan,
    // Head state.
    seen_request_line: bool,
    chunk_match: u8,
    name: Name,
    in_value: bool,
    cr: bool,
    line_bytes: usize,
    head_has_cl: bool,
    head_has_te: bool,
    head_has_upgrade: bool,
    chunked: bool,
    cl_value: u64,
    cl_valid: bool,
    /// The value of the Content-Length line being read.
    cl_line: u64,
    /// The value of an earlier Content-Length line of this head.
    cl_first: Option<u64>,
    /// Heads seen, and heads poisoned for carrying both framing headers.
    pub heads: u64,
    pub poisoned: u64,
}

impl Default for Framing {
    fn default() -> Self {
        Self {
            state: Scan::Head,
            seen_request_line: false,
            chunk_match: 0,
            name: Name::Matching { candidates: 0b111, matched: 0 },
            in_value: false,
            cr: false,
            line_bytes: 0,
            head_has_cl: false,
            head_has_te: false,
            head_has_upgrade: false,
            chunked: false,
            cl_value: 0,
            cl_valid: true,
            cl_line: 0,
            cl_first: None,
            heads: 0,
            poisoned: 0,
        }
    }
}

impl Framing {
    /// Scans bytes just read from the client, in place, before hyper sees
    /// them.
    pub fn feed(&mut self, buf: &mut [u8]) {
        let mut i = 0;
        while i < buf.len() {
            match self.state {
                Scan::Off => return,
                Scan::Body(n) => {
                    let take = n.min((buf.len() - i) as u64);
                    i += take as usize;
                    self.state = if n == take { Scan::Head } else { Scan::Body(n - take) };
                    if n == take {
                        self.reset_head();
                    }
                }
                Scan::ChunkData(n) => {
                    let take = n.min((buf.len() - i) as u64);
                    i += take as usize;
                    self.state = if n == take { Scan::ChunkDataCr } else { Scan::ChunkData(n - take) };
                }
                _ => {
                    self.step(buf, i);
                    i += 1;
                }
            }
        }
    }

    fn reset_head(&mut self) {
        self.seen_request_line = false;
        self.chunk_match = 0;
        self.name = Name::Matching { candidates: 0b111, matched: 0 };
        self.in_value = false;
        self.cr = false;
        self.line_bytes = 0;
        self.head_has_cl = false;
        self.head_has_te = false;
        self.head_has_upgrade = false;
        self.chunked = false;
        self.cl_value = 0;
        self.cl_valid = true;
        self.cl_line = 0;
        self.cl_first = None;
    }

    /// One byte of a head, a chunk-size line, a chunk end or a trailer.
    fn step(&mut self, buf: &mut [u8], i: usize) {
        let b = buf[i];
        match self.state {
            Scan::Head => self.head_byte(buf, i),
            Scan::ChunkSize { size, in_ext, digits } => match b {
                b'\r' => self.state = Scan::ChunkSizeLf { size },
                b'\n' => self.end_chunk_size(size),
                _ if in_ext => {}
                b';' | b' ' | b'\t' => self.state = Scan::ChunkSize { size, in_ext: true, digits },
                _ => match (b as char).to_digit(16) {
                    // Leading zeros are not significant (hyper accepts any
                    // number of them); 16 significant digits fill a u64.
                    Some(d) if digits < 16 => {
                        let significant = if size == 0 && d == 0 { digits } else { digits + 1 };
                        self.state =
                            Scan::ChunkSize { size: size * 16 + u64::from(d), in_ext, digits: significant }
                    }
                    // Not a chunk size hyper would accept: it will fail the
                    // request; stop following this connection.
                    _ => self.state = Scan::Off,
                },
            },
            Scan::ChunkSizeLf { size } => {
                if b == b'\n' {
                    self.end_chunk_size(size);
                } else {
                    self.state = Scan::Off;
                }
            }
            Scan::ChunkDataCr => self.state = if b == b'\r' { Scan::ChunkDataLf } else { Scan::Off },
            Scan::ChunkDataLf => {
                self.state =
                    if b == b'\n' { Scan::ChunkSize { size: 0, in_ext: false, digits: 0 } } else { Scan::Off }
            }
            Scan::Trailers { line_empty } => match b {
                b'\r' => self.state = Scan::TrailersLf { line_empty },
                b'\n' => self.end_trailer_line(line_empty),
                _ => self.state = Scan::Trailers { line_empty: false },
            },
            Scan::TrailersLf { line_empty } => {
                if b == b'\n' {
                    self.end_trailer_line(line_empty);
                } else {
                    self.state = Scan::Trailers { line_empty: false };
                }
            }
            Scan::Body(_) | Scan::ChunkData(_) | Scan::Off => unreachable!("handled in feed"),
        }
    }

    fn end_chunk_size(&mut self, size: u64) {
        self.state = if size == 0 { Scan::Trailers { line_empty: true } } else { Scan::ChunkData(size) };
    }

    fn end_trailer_line(&mut self, line_empty: bool) {
        if line_empty {
            self.state = Scan::Head;
            self.reset_head();
        } else {
            self.state = Scan::Trailers { line_empty: true };
        }
    }

    fn head_byte(&mut self, buf: &mut [u8], i: usize) {
        let b = buf[i];
        if b == b'\n' {
            let empty = self.line_bytes == 0;
            if !empty {
                self.end_header_line(buf, i);
            }
            self.line_bytes = 0;
            self.cr = false;
            self.in_value = false;
            self.name = Name::Matching { candidates: 0b111, matched: 0 };
            if empty && self.heads_started() {
                self.end_head();
            }
            return;
        }
        if b == b'\r' {
            self.cr = true;
            return;
        }
        self.cr = false;
        self.line_bytes += 1;
        if self.in_value {
            if let Name::ContentLength = self.name {
                match b {
                    b'0'..=b'9' => {
                        self.cl_line = self.cl_line.saturating_mul(10).saturating_add(u64::from(b - b'0'))
                    }
                    b' ' | b'\t' => {}
                    _ => self.cl_valid = false,
                }
            }
            if let Name::TransferEncoding = self.name {
                // "chunked" must be the final coding; hyper decides, this
                // only needs to know whether chunk framing follows.
                self.chunked_tail(b);
            }
            return;
        }
        if b == b':' {
            self.in_value = true;
            self.name = match self.name {
                Name::Matching { candidates, matched } => {
                    let hit = (0..3)
                        .find(|&k| candidates & (1 << k) != 0 && CANDIDATES[k].len() == matched as usize);
                    match hit {
                        Some(0) => Name::ContentLength,
                        Some(1) => Name::TransferEncoding,
                        Some(2) => Name::Upgrade,
                        _ => Name::Other,
                    }
                }
                other => other,
            };
            if let Name::TransferEncoding = self.name {
                self.chunk_match = 0;
            }
            return;
        }
        if let Name::Matching { candidates, matched } = self.name {
            let lower = b.to_ascii_lowercase();
            let mut still = 0;
            for (k, cand) in CANDIDATES.iter().enumerate() {
                if candidates & (1 << k) != 0 && cand.get(matched as usize) == Some(&lower) {
                    still |= 1 << k;
                }
            }
            self.name = if still == 0 {
                Name::Other
            } else {
                Name::Matching { candidates: still, matched: matched + 1 }
            };
        }
    }

    /// The request line does not count as a header line.
    fn heads_started(&self) -> bool {
        self.seen_request_line
    }

    fn end_header_line(&mut self, buf: &mut [u8], i: usize) {
        if !self.seen_request_line {
            self.seen_request_line = true;
            return;
        }
        match self.name {
            Name::ContentLength => {
                self.head_has_cl = true;
                // Identical duplicates are one length (as hyper reads
                // them); different ones make hyper refuse the head.
                match self.cl_first {
                    Some(first) if first != self.cl_line => self.cl_valid = false,
                    _ => self.cl_first = Some(self.cl_line),
                }
                self.cl_value = self.cl_line;
                self.cl_line = 0;
                if self.head_has_te {
                    self.poison(buf, i);
                }
            }
            Name::TransferEncoding => {
                self.head_has_te = true;
                self.chunked = self.chunk_match == CHUNKED.len() as u8;
                if self.head_has_cl {
                    self.poison(buf, i);
                }
            }
            Name::Upgrade => self.head_has_upgrade = true,
            _ => {}
        }
    }

    /// Makes this head malformed for hyper: the byte before the line's LF
    /// (its CR, or the last value byte) becomes NUL, which no header value
    /// may contain.
    fn poison(&mut self, buf: &mut [u8], lf: usize) {
        if lf > 0 {
            buf[lf - 1] = 0;
        } else {
            buf[lf] = 0;
        }
        self.poisoned += 1;
    }

    fn end_head(&mut self) {
        self.heads += 1;
        self.seen_request_line = false;
        self.state = if self.head_has_upgrade {
            // May become a tunnel; the proxy closes the connection if the
            // upgrade is refused, so nothing is lost by stopping here.
            Scan::Off
        } else if self.head_has_te {
            if self.chunked { Scan::ChunkSize { size: 0, in_ext: false, digits: 0 } } else { Scan::Off }
        } else if self.head_has_cl {
            if self.cl_valid { Scan::Body(self.cl_value) } else { Scan::Off }
        } else {
            Scan::Body(0)
        };
        if self.state == Scan::Body(0) {
            self.state = Scan::Head;
            self.reset_head();
        }
    }

    /// Tracks whether a Transfer-Encoding value ends in `chunked`.
    fn chunked_tail(&mut self, b: u8) {
        let lower = b.to_ascii_lowercase();
        if lower == b' ' || lower == b'\t' {
            return;
        }
        if lower == b',' {
            self.chunk_match = 0;
            return;
        }
        let m = self.chunk_match as usize;
        self.chunk_match = if m < CHUNKED.len() && CHUNKED[m] == lower {
            self.chunk_match + 1
        } else {
            // Anything else after (or instead of) "chunked": not final.
            u8::MAX
        };
    }
}

const CHUNKED: &[u8] = b"chunked";

#[cfg(test)]
mod tests;
