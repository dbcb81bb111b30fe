//! Bodies: decoded strictly as they arrive, whatever they are split into,
//! and written with framing of limiter's own.
//!
//! A chunked body is read by the grammar of RFC 9112 §7.1 and nothing
//! else: a size of hex digits, extensions (`;name[=token|"quoted"]`, with
//! optional spaces or tabs around `;` and `=`), CRLF; the data, CRLF; after
//! the last chunk, trailer fields (a token, `:`, a value of visible bytes,
//! spaces and tabs) each ended by CRLF, then CRLF. A bare LF or CR, a
//! control byte, obs-fold, a size of 2^60 or more or with no digit, data that does
//! not end where its size says, more than [`EXTENSION_BYTES`] of extensions
//! or [`TRAILER_BYTES`] / [`TRAILER_FIELDS`] of trailers fails the body.
//! Extensions and trailers are read and dropped: what goes on is the data,
//! in chunks limiter sizes itself ([`chunk_head`], [`LAST_CHUNK`]).

use std::ops::Range;

/// The most chunk-extension bytes one body may carry (hyper's bound).
pub const EXTENSION_BYTES: usize = 16 * 1024;
/// The most trailer-section bytes, and fields, one body may carry.
pub const TRAILER_BYTES: usize = 16 * 1024;
pub const TRAILER_FIELDS: usize = 100;
/// The most bytes of one chunk-size line before its extensions (leading
/// zeros included).
const SIZE_LINE: usize = 64;

/// Why a body cannot be read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BodyError {
    /// The chunked framing broke a rule (see the module's list).
    Chunked(&'static str),
    /// The body ended (its connection closed) before its framing did.
    Incomplete,
}

impl BodyError {
    /// The rule it broke, in words.
    pub fn rule(self) -> &'static str {
        match self {
            Self::Chunked(why) => why,
            Self::Incomplete => "the body ended before its framing did",
        }
    }
}

impl std::fmt::Display for BodyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Chunked(why) => write!(f, "malformed chunked body: {why}"),
            Self::Incomplete => f.write_str(self.rule()),
        }
    }
}

impl std::error::Error for BodyError {}

/// What one call of [`Decoder::decode`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    /// Bytes of the input it went past (framing and data).
    pub used: usize,
    /// The body's data among them (empty if none).
    pub data: Range<usize>,
    /// The body ended within them.
    pub end: bool,
}

/// A body being read.
#[derive(Clone, Debug)]
pub enum Decoder {
    /// This many bytes are left.
    Length(u64),
    Chunked(Chunked),
    /// Everything until the sender closes.
    Close,
}

impl Decoder {
    /// The decoder of a body framed so.
    pub fn new(framing: super::Framing) -> Self {
        match framing {
            super::Framing::None => Self::Length(0),
            super::Framing::Length(n) => Self::Length(n),
            super::Framing::Chunked => Self::Chunked(Chunked::default()),
            super::Framing::Close => Self::Close,
        }
    }

    /// Whether the body has ended.
    pub fn is_done(&self) -> bool {
        match self {
            Self::Length(n) => *n == 0,
            Self::Chunked(c) => c.state == State::Done,
            Self::Close => false,
        }
    }

    /// Bytes of data still to come, when known.
    pub fn remaining(&self) -> Option<u64> {
        match self {
            Self::Length(n) => Some(*n),
            _ => None,
        }
    }

    /// Reads what it can of `input`: framing, then at most one run of
    /// data. Call again on what is left (`used` short of `input.len()`)
    /// before reading more.
    pub fn decode(&mut self, input: &[u8]) -> Result<Step, BodyError> {
        match self {
            Self::Length(left) => {
                let n = (*left).min(input.len() as u64) as usize;
                *left -= n as u64;
                Ok(Step { used: n, data: 0..n, end: *left == 0 })
            }
            Self::Close => Ok(Step { used: input.len(), data: 0..input.len(), end: false }),
            Self::Chunked(c) => c.decode(input),
        }
    }

    /// The sender closed: `Ok` if that ends the body.
    pub fn eof(&self) -> Result<(), BodyError> {
        match self {
            Self::Close => Ok(()),
            _ if self.is_done() => Ok(()),
            _ => Err(BodyError::Incomplete),
        }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum State {
    /// The first byte of a chunk-size line: a hex digit.
    #[default]
    SizeStart,
    /// More digits, or what may follow them.
    Size,
    /// Spaces or tabs after the size: more, or `;`.
    SizeWs,
    /// After `;`: spaces or tabs, then a name's first byte.
    ExtStart,
    ExtName,
    /// After a name: spaces or tabs, `=`, `;` or CR.
    ExtNameWs,
    /// After `=`: spaces or tabs, then a token or a quoted string.
    ExtValueStart,
    ExtToken,
    ExtQuoted,
    ExtQuotedEscape,
    /// After a value: spaces or tabs, `;` or CR.
    ExtValueWs,
    /// A chunk-size line's CR came: LF.
    SizeLf,
    Data,
    DataCr,
    DataLf,
    /// At the start of a trailer line: CR (the end) or a name's first byte.
    TrailerStart,
    TrailerName,
    TrailerValue,
    TrailerLf,
    /// The final CR came: LF.
    EndLf,
    Done,
}

/// The state of a chunked body: a handful of counters whatever its size.
#[derive(Clone, Debug, Default)]
pub struct Chunked {
    state: State,
    /// The chunk's size, then what is left of its data.
    size: u64,
    /// Bytes of the current size line before its extensions.
    size_line: usize,
    extension_bytes: usize,
    trailer_bytes: usize,
    trailer_fields: usize,
}

/// Bytes a token may have (RFC 9110 §5.6.2).
pub(crate) static TOKEN: [bool; 256] = {
    let mut t = [false; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        t[b] = c.is_ascii_alphanumeric()
            || matches!(
                c,
                b'!' | b'#'
                    | b'$'
                    | b'%'
                    | b'&'
                    | b'\''
                    | b'*'
                    | b'+'
                    | b'-'
                    | b'.'
                    | b'^'
                    | b'_'
                    | b'`'
                    | b'|'
                    | b'~'
            );
        b += 1;
    }
    t
};

/// Bytes a field value (or a quoted string) may have besides spaces and
/// tabs: visible ASCII and obs-text.
fn visible(b: u8) -> bool {
    (0x21..=0x7e).contains(&b) || b >= 0x80
}

fn ws(b: u8) -> bool {
    b == b' ' || b == b'\t'
}

impl Chunked {
    fn decode(&mut self, input: &[u8]) -> Result<Step, BodyError> {
        if self.state == State::Done {
            return Ok(Step { used: 0, data: 0..0, end: true });
        }
        let mut i = 0;
        while i < input.len() {
            if self.state == State::Data {
                let n = self.size.min((input.len() - i) as u64) as usize;
                self.size -= n as u64;
                if self.size == 0 {
                    self.state = State::DataCr;
                }
                return Ok(Step { used: i + n, data: i..i + n, end: false });
            }
            self.byte(input[i])?;
            i += 1;
            if self.state == State::Done {
                return Ok(Step { used: i, data: i..i, end: true });
            }
        }
        Ok(Step { used: i, data: i..i, end: false })
    }

    fn extension(&mut self) -> Result<(), BodyError> {
        self.extension_bytes += 1;
        if self.extension_bytes > EXTENSION_BYTES {
            return Err(BodyError::Chunked("chunk extensions over 16 KiB"));
        }
        Ok(())
    }

    fn trailer(&mut self) -> Result<(), BodyError> {
        self.trailer_bytes += 1;
        if self.trailer_bytes > TRAILER_BYTES {
            return Err(BodyError::Chunked("trailers over 16 KiB"));
        }
        Ok(())
    }

    /// One byte of framing.
    fn byte(&mut self, b: u8) -> Result<(), BodyError> {
        use State as S;
        let bad = |why| Err(BodyError::Chunked(why));
        match self.state {
            S::SizeStart | S::Size => {
                self.size_line += 1;
                if self.size_line > SIZE_LINE {
                    return bad("a chunk size over 64 bytes");
                }
                match (b as char).to_digit(16) {
                    Some(d) => {
                        // One more digit would make it 2^60 or more.
                        if self.size >> 56 != 0 {
                            return bad("a chunk size of 2^60 or more");
                        }
                        self.size = self.size << 4 | u64::from(d);
                        self.state = S::Size;
                    }
                    None if self.state == S::SizeStart => return bad("a chunk size without a digit"),
                    None => return self.after_size(b),
                }
            }
            S::SizeWs => return self.after_size(b),
            S::ExtStart => {
                self.extension()?;
                match b {
                    _ if ws(b) => {}
                    _ if TOKEN[b as usize] => self.state = S::ExtName,
                    _ => return bad("a chunk extension without a name"),
                }
            }
            S::ExtName => {
                self.extension()?;
                match b {
                    _ if TOKEN[b as usize] => {}
                    _ => return self.after_ext(b, true),
                }
            }
            S::ExtNameWs => {
                self.extension()?;
                return self.after_ext(b, true);
            }
            S::ExtValueStart => {
                self.extension()?;
                match b {
                    _ if ws(b) => {}
                    b'"' => self.state = S::ExtQuoted,
                    _ if TOKEN[b as usize] => self.state = S::ExtToken,
                    _ => return bad("a chunk extension without a value after ="),
                }
            }
            S::ExtToken => {
                self.extension()?;
                if !TOKEN[b as usize] {
                    return self.after_ext(b, false);
                }
            }
            S::ExtQuoted => {
                self.extension()?;
                match b {
                    b'"' => self.state = S::ExtValueWs,
                    b'\\' => self.state = S::ExtQuotedEscape,
                    _ if ws(b) || visible(b) => {}
                    _ => return bad("a control byte in a quoted chunk extension"),
                }
            }
            S::ExtQuotedEscape => {
                self.extension()?;
                if !(ws(b) || visible(b)) {
                    return bad("a control byte in a quoted chunk extension");
                }
                self.state = S::ExtQuoted;
            }
            S::ExtValueWs => {
                self.extension()?;
                return self.after_ext(b, false);
            }
            S::SizeLf => {
                if b != b'\n' {
                    return bad("a CR not followed by LF");
                }
                self.size_line = 0;
                self.state = if self.size == 0 { S::TrailerStart } else { S::Data };
            }
            S::Data => unreachable!("data is taken in bulk"),
            S::DataCr => match b {
                b'\r' => self.state = S::DataLf,
                _ => return bad("chunk data longer than its size, or not ended by CRLF"),
            },
            S::DataLf => match b {
                b'\n' => self.state = S::SizeStart,
                _ => return bad("a CR not followed by LF"),
            },
            S::TrailerStart => {
                self.trailer()?;
                match b {
                    b'\r' => self.state = S::EndLf,
                    _ if TOKEN[b as usize] => {
                        self.trailer_fields += 1;
                        if self.trailer_fields > TRAILER_FIELDS {
                            return bad("more than 100 trailer fields");
                        }
                        self.state = S::TrailerName;
                    }
                    _ if ws(b) => return bad("obs-fold in the trailers"),
                    b'\n' => return bad("a bare LF"),
                    _ => return bad("a trailer field without a name"),
                }
            }
            S::TrailerName => {
                self.trailer()?;
                match b {
                    b':' => self.state = S::TrailerValue,
                    _ if TOKEN[b as usize] => {}
                    _ => return bad("a trailer field name with a byte no token has"),
                }
            }
            S::TrailerValue => {
                self.trailer()?;
                match b {
                    b'\r' => self.state = S::TrailerLf,
                    _ if ws(b) || visible(b) => {}
                    b'\n' => return bad("a bare LF"),
                    _ => return bad("a control byte in a trailer field"),
                }
            }
            S::TrailerLf => {
                self.trailer()?;
                match b {
                    b'\n' => self.state = S::TrailerStart,
                    _ => return bad("a CR not followed by LF"),
                }
            }
            S::EndLf => match b {
                b'\n' => self.state = S::Done,
                _ => return bad("a CR not followed by LF"),
            },
            S::Done => return bad("bytes after the end"),
        }
        Ok(())
    }

    /// After the size's digits (or the spaces after them).
    fn after_size(&mut self, b: u8) -> Result<(), BodyError> {
        match b {
            _ if ws(b) => self.state = State::SizeWs,
            b';' => self.state = State::ExtStart,
            b'\r' if self.state == State::Size => self.state = State::SizeLf,
            b'\r' => return Err(BodyError::Chunked("spaces after a chunk size without an extension")),
            b'\n' => return Err(BodyError::Chunked("a bare LF")),
            _ => return Err(BodyError::Chunked("a byte after a chunk size that no extension starts with")),
        }
        Ok(())
    }

    /// After an extension's name (`name`) or value.
    fn after_ext(&mut self, b: u8, name: bool) -> Result<(), BodyError> {
        match b {
            _ if ws(b) => self.state = if name { State::ExtNameWs } else { State::ExtValueWs },
            b'=' if name => self.state = State::ExtValueStart,
            b';' => self.state = State::ExtStart,
            b'\r' => self.state = State::SizeLf,
            b'\n' => return Err(BodyError::Chunked("a bare LF")),
            _ => return Err(BodyError::Chunked("a byte a chunk extension may not have")),
        }
        Ok(())
    }
}

/// A body that does not match the length its head gave.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the body does not match the length its head gave")]
pub struct LengthMismatch;

/// How limiter frames a body it sends, and what of it is still owed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Encoder {
    /// With a length: exactly this many bytes more.
    Length(u64),
    /// In chunks limiter sizes.
    Chunked,
    /// Until the connection closes (to an HTTP/1.0 client).
    Close,
}

impl Encoder {
    /// Appends `data`, framed, to `out`; `Err` if it runs past the length.
    pub fn data(&mut self, out: &mut Vec<u8>, data: &[u8]) -> Result<(), LengthMismatch> {
        if data.is_empty() {
            return Ok(());
        }
        match self {
            Self::Length(left) => {
                *left = left.checked_sub(data.len() as u64).ok_or(LengthMismatch)?;
                out.extend_from_slice(data);
            }
            Self::Chunked => {
                chunk_head(out, data.len());
                out.extend_from_slice(data);
                out.extend_from_slice(b"\r\n");
            }
            Self::Close => out.extend_from_slice(data),
        }
        Ok(())
    }

    /// Appends the body's end to `out`; `Err` if a length was not met.
    pub fn finish(self, out: &mut Vec<u8>) -> Result<(), LengthMismatch> {
        match self {
            Self::Length(0) | Self::Close => Ok(()),
            Self::Length(_) => Err(LengthMismatch),
            Self::Chunked => {
                out.extend_from_slice(LAST_CHUNK);
                Ok(())
            }
        }
    }
}

/// The line that starts a chunk of `len` bytes, as limiter writes it:
/// the size in lower-case hex, CRLF.
pub fn chunk_head(out: &mut Vec<u8>, len: usize) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let digits = (usize::BITS - len.leading_zeros()).div_ceil(4).max(1);
    for i in (0..digits).rev() {
        out.push(HEX[(len >> (i * 4)) & 0xf]);
    }
    out.extend_from_slice(b"\r\n");
}

/// What ends a chunked body limiter writes: the last chunk, no trailers.
pub const LAST_CHUNK: &[u8] = b"0\r\n\r\n";
