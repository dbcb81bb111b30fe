//! HTTP/2 frames that cost the server work but carry no request: a client
//! may send a few (a cancelled stream, a PING to measure the round trip),
//! never a flood. This meter reads the frame headers of what a client
//! sends, before hyper's HTTP/2 codec, and counts those frames against a
//! token bucket per connection; a connection that overdraws it is cut.
//!
//! What it counts, and the attack each stands for:
//! - `RST_STREAM`: rapid reset (CVE-2023-44487), streams opened and
//!   cancelled at once so that the server starts work it never delivers;
//! - `PING` and `SETTINGS` without ACK: each makes the server answer
//!   (CVE-2019-9512, CVE-2019-9515);
//! - `PRIORITY`: CVE-2019-9513's tree churn;
//! - empty `DATA` without END_STREAM: CVE-2019-9518.
//!
//! hyper's codec (h2) bounds the rest itself: CONTINUATION frames per
//! header block and the size of a header list (CVE-2024-27316 family),
//! streams reset before they are accepted, and it answers one PING or
//! SETTINGS at a time, reading nothing more while the answer cannot be
//! written (so a client that does not read is cut by the write stall).

use std::time::Instant;

/// Free frames a connection may send in a burst.
pub const BURST: u32 = 200;
/// Free frames per second a connection may send for ever.
pub const PER_SECOND: u32 = 100;

const PREFACE_LEN: usize = 24;
const PING_FRAME: u8 = 0x6;
const HEADER_LEN: usize = 9;

/// A frame kind the meter counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flood {
    RstStream,
    Ping,
    Settings,
    Priority,
    EmptyData,
}

impl Flood {
    /// Every kind, in the order metrics list them.
    pub const ALL: [Flood; 5] =
        [Flood::RstStream, Flood::Ping, Flood::Settings, Flood::Priority, Flood::EmptyData];

    /// The `frame` label of `limiter_http2_floods_total`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::RstStream => "rst_stream",
            Self::Ping => "ping",
            Self::Settings => "settings",
            Self::Priority => "priority",
            Self::EmptyData => "empty_data",
        }
    }

    pub fn index(self) -> usize {
        self as usize
    }
}

/// The meter of one connection.
#[derive(Debug)]
pub struct Meter {
    /// Bytes of the client's connection preface still to skip.
    preface_left: usize,
    header: [u8; HEADER_LEN],
    header_len: usize,
    /// Payload bytes of the current frame still to skip.
    payload_left: usize,
    tokens: u32,
    refilled: Option<Instant>,
    /// Frames other than PING read so far: the client is using the
    /// connection (a PING may only answer the server's keep-alive).
    pub active_frames: u64,
}

impl Default for Meter {
    fn default() -> Self {
        Self {
            preface_left: PREFACE_LEN,
            header: [0; HEADER_LEN],
            header_len: 0,
            payload_left: 0,
            tokens: BURST,
            refilled: None,
            active_frames: 0,
        }
    }
}

impl Meter {
    /// Reads `bytes` (what the client sent next); `Err` names the kind of
    /// frame that overdrew the bucket.
    pub fn feed(&mut self, mut bytes: &[u8]) -> Result<(), Flood> {
        while !bytes.is_empty() {
            if self.preface_left > 0 {
                let n = self.preface_left.min(bytes.len());
                self.preface_left -= n;
                bytes = &bytes[n..];
            } else if self.payload_left > 0 {
                let n = self.payload_left.min(bytes.len());
                self.payload_left -= n;
                bytes = &bytes[n..];
            } else {
                let n = (HEADER_LEN - self.header_len).min(bytes.len());
                self.header[self.header_len..self.header_len + n].copy_from_slice(&bytes[..n]);
                self.header_len += n;
                bytes = &bytes[n..];
                if self.header_len == HEADER_LEN {
                    self.header_len = 0;
                    let h = self.header;
                    let len = usize::from(h[0]) << 16 | usize::from(h[1]) << 8 | usize::from(h[2]);
                    self.payload_left = len;
                    if h[3] != PING_FRAME {
                        self.active_frames += 1;
                    }
                    if let Some(kind) = costly(h[3], h[4], len) {
                        self.take(kind)?;
                    }
                }
            }
        }
        Ok(())
    }

    fn take(&mut self, kind: Flood) -> Result<(), Flood> {
        if self.tokens == 0 {
            let now = Instant::now();
            let since = self.refilled.map_or(0, |t| now.saturating_duration_since(t).as_millis());
            let earned = (since * u128::from(PER_SECOND) / 1000) as u32;
            if self.refilled.is_none() || earned > 0 {
                self.tokens = earned.min(BURST);
                self.refilled = Some(now);
            }
            if self.tokens == 0 {
                return Err(kind);
            }
        } else if self.refilled.is_none() {
            self.refilled = Some(Instant::now());
        }
        self.tokens -= 1;
        Ok(())
    }
}

/// Whether a frame of `kind` with `flags` and a `len`-byte payload is one
/// the meter counts.
fn costly(kind: u8, flags: u8, len: usize) -> Option<Flood> {
    const END_STREAM: u8 = 0x1;
    const ACK: u8 = 0x1;
    match kind {
        0x0 if len == 0 && flags & END_STREAM == 0 => Some(Flood::EmptyData),
        0x2 => Some(Flood::Priority),
        0x3 => Some(Flood::RstStream),
        0x4 if flags & ACK == 0 => Some(Flood::Settings),
        0x6 if flags & ACK == 0 => Some(Flood::Ping),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let len = payload.len();
        let mut out = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
        out.extend(stream.to_be_bytes());
        out.extend(payload);
        out
    }

    #[test]
    fn ordinary_traffic_costs_nothing() {
        let mut m = Meter::default();
        m.feed(PREFACE).unwrap();
        for i in 0..10_000u32 {
            let headers = frame(0x1, 0x5, 2 * i + 1, &[0x82, 0x87, 0x84]);
            let data = frame(0x0, 0x1, 2 * i + 1, b"hello");
            let window = frame(0x8, 0, 0, &[0, 0, 0x10, 0]);
            m.feed(&[headers, data, window].concat()).unwrap();
        }
        assert_eq!(m.tokens, BURST);
    }

    #[test]
    fn a_rapid_reset_flood_is_cut_after_the_burst_even_split_byte_by_byte() {
        let mut m = Meter::default();
        m.feed(PREFACE).unwrap();
        let mut sent = 0;
        let outcome = (0..10_000u32).try_for_each(|i| {
            let bytes =
                [frame(0x1, 0x5, 2 * i + 1, &[0x82]), frame(0x3, 0, 2 * i + 1, &[0, 0, 0, 8])].concat();
            sent += 1;
            bytes.iter().try_for_each(|b| m.feed(std::slice::from_ref(b)))
        });
        assert_eq!(outcome, Err(Flood::RstStream));
        // The bucket may have earned a token or two while the test ran.
        assert!((BURST as usize + 1..BURST as usize + 10).contains(&sent), "cut after {sent}");
    }

    #[test]
    fn acks_and_data_with_end_stream_are_free_pings_are_not() {
        let mut m = Meter::default();
        m.feed(PREFACE).unwrap();
        for _ in 0..1000 {
            m.feed(&frame(0x6, 0x1, 0, &[0; 8])).unwrap();
            m.feed(&frame(0x4, 0x1, 0, &[])).unwrap();
            m.feed(&frame(0x0, 0x1, 1, &[])).unwrap();
        }
        let pings = (0..1000).map(|_| m.feed(&frame(0x6, 0, 0, &[0; 8]))).position(|r| r.is_err());
        assert_eq!(pings, Some(BURST as usize));
    }

    #[test]
    fn large_payloads_are_skipped_not_parsed() {
        let mut m = Meter::default();
        m.feed(PREFACE).unwrap();
        // A DATA payload full of bytes that look like RST_STREAM headers.
        let fake = frame(0x3, 0, 1, &[0, 0, 0, 8]).repeat(1000);
        let data = frame(0x0, 0x0, 1, &fake);
        for chunk in data.chunks(7) {
            m.feed(chunk).unwrap();
        }
        assert_eq!(m.tokens, BURST);
    }
}
