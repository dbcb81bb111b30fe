//! HTTP/2 frames written by hand, for the attacks no well-behaved client
//! sends: a few frame types, HPACK literals without Huffman coding, and a
//! reader of the frames the server sends back.

use std::{
    io::{self, Read, Write},
    net::{SocketAddr, TcpStream},
    time::{Duration, Instant},
};

pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

pub const DATA: u8 = 0x0;
pub const HEADERS: u8 = 0x1;
pub const PRIORITY: u8 = 0x2;
pub const RST_STREAM: u8 = 0x3;
pub const SETTINGS: u8 = 0x4;
pub const PING: u8 = 0x6;
pub const GOAWAY: u8 = 0x7;
pub const WINDOW_UPDATE: u8 = 0x8;
pub const CONTINUATION: u8 = 0x9;

pub const END_STREAM: u8 = 0x1;
pub const ACK: u8 = 0x1;
pub const END_HEADERS: u8 = 0x4;

/// `SETTINGS_INITIAL_WINDOW_SIZE`.
pub const INITIAL_WINDOW_SIZE: u16 = 0x4;

pub fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len();
    let mut out = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    out.extend((stream & 0x7fff_ffff).to_be_bytes());
    out.extend(payload);
    out
}

pub fn settings(values: &[(u16, u32)]) -> Vec<u8> {
    let payload: Vec<u8> = values
        .iter()
        .flat_map(|(id, v)| [id.to_be_bytes().to_vec(), v.to_be_bytes().to_vec()].concat())
        .collect();
    frame(SETTINGS, 0, 0, &payload)
}

/// A header block for `GET path` on `authority` with `extra` headers
/// (lower-case names), as HPACK literals that the server indexes nothing
/// of.
pub fn get_block(path: &str, extra: &[(&str, &str)]) -> Vec<u8> {
    // :method GET, :scheme http (static table 2 and 6).
    let mut out = vec![0x82, 0x86];
    literal_indexed_name(&mut out, 4, path); // :path
    literal_indexed_name(&mut out, 1, "a"); // :authority
    for (name, value) in extra {
        out.push(0x00);
        string(&mut out, name);
        string(&mut out, value);
    }
    out
}

fn literal_indexed_name(out: &mut Vec<u8>, index: u8, value: &str) {
    // Literal without indexing, indexed name (index < 15).
    out.push(index);
    string(out, value);
}

fn string(out: &mut Vec<u8>, s: &str) {
    assert!(s.len() < 127, "short strings only");
    out.push(s.len() as u8);
    out.extend(s.as_bytes());
}

/// A connection that has sent its preface and empty SETTINGS.
pub fn connect(addr: SocketAddr, settings_values: &[(u16, u32)]) -> TcpStream {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_nodelay(true).unwrap();
    s.write_all(&[PREFACE, &settings(settings_values)].concat()).unwrap();
    s
}

/// A frame the server sent.
#[derive(Debug)]
pub struct Frame {
    pub kind: u8,
    pub flags: u8,
    pub stream: u32,
    pub payload: Vec<u8>,
}

/// Reads one frame; `Ok(None)` at EOF, `Err` on a timeout or a reset.
pub fn read_frame(s: &mut TcpStream, timeout: Duration) -> io::Result<Option<Frame>> {
    // Wait for the first byte without taking it, so that a timeout never
    // leaves half a frame read; the rest of a frame follows at once.
    s.set_read_timeout(Some(timeout))?;
    if s.peek(&mut [0u8; 1])? == 0 {
        return Ok(None);
    }
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut head = [0u8; 9];
    match s.read_exact(&mut head) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
    let mut payload = vec![0u8; len];
    s.read_exact(&mut payload)?;
    let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
    Ok(Some(Frame { kind: head[3], flags: head[4], stream, payload }))
}

/// How a connection ended after an attack: what the server said last.
#[derive(Debug, PartialEq, Eq)]
pub enum End {
    /// GOAWAY with this error code, then the close.
    GoAway(u32),
    /// Closed (FIN or RST) without a GOAWAY.
    Closed,
    /// Still open after the deadline.
    Open,
}

/// Reads (and ACKs nothing) until the server closes the connection or
/// `within` passes, answering with how it ended.
pub fn ending(s: &mut TcpStream, within: Duration) -> End {
    let deadline = Instant::now() + within;
    let mut goaway = None;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return End::Open;
        }
        match read_frame(s, left) {
            Ok(Some(f)) if f.kind == GOAWAY && f.payload.len() >= 8 => {
                goaway = Some(u32::from_be_bytes([f.payload[4], f.payload[5], f.payload[6], f.payload[7]]));
            }
            Ok(Some(_)) => {}
            Ok(None) => return goaway.map_or(End::Closed, End::GoAway),
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                return End::Open;
            }
            Err(_) => return goaway.map_or(End::Closed, End::GoAway),
        }
    }
}
