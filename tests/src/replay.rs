//! The framing module's oracle, shared by the fuzz target
//! (`fuzz/fuzz_targets/framing.rs`, `cargo xtask fuzz`) and the test that
//! replays every input it or the generator ever kept
//! (`tests/tests/framing_corpus.rs`).
//!
//! An input is a client's byte stream (after two bytes that choose how it
//! is cut into reads and how bodies go upstream). It is read as limiter's
//! HTTP/1.x engine reads it, with the engine's own parts: heads by
//! `http1::parse_request` and [`Request::from_h1`], bodies by the
//! [`Decoder`] fed read by read, each admitted request written for the
//! upstream by [`Request::write_upstream`] and its body framed by the
//! [`Encoder`], exactly as the engine sends them. The oracle: the bytes
//! limiter would forward read, under a strict and a lenient reader alike,
//! as exactly the requests it admitted (method, target, body), framed as
//! limiter frames; and where the reads end does not change which requests
//! are admitted.

use bytes::BytesMut;
use limiter::proxy::{
    Proto,
    framing::{
        self as http1,
        body::{Decoder, Encoder},
    },
    request::{
        Outgoing, Request, Upstreamed,
        headers::{Client, Forwarding},
    },
};

use crate::wire;

/// What the engine admitted of a stream, and the bytes it would send.
#[derive(Debug, Default, PartialEq, Eq)]
struct Forwarded {
    /// Method, target, body.
    admitted: Vec<(String, String, Vec<u8>)>,
    bytes: Vec<u8>,
}

/// Reads `stream` in the pieces `cuts` makes, as the engine does.
fn forward(stream: &[u8], cuts: &[usize], chunked: bool) -> Forwarded {
    let fwd = Forwarding::new(Client {
        addr: "127.0.0.1:40000".parse().expect("an address"),
        proto: Proto::H1,
        port: 8080,
        trusted: false,
    });
    let mut pieces = cuts.iter().copied().chain(std::iter::once(stream.len())).scan(0, |at, cut| {
        let piece = &stream[(*at).min(cut)..cut];
        *at = cut.max(*at);
        Some(piece)
    });
    let mut buf = BytesMut::new();
    let mut out = Forwarded::default();
    loop {
        let _ = buf.split_to(http1::empty_lines(&buf));
        let head = loop {
            match http1::parse_request(&buf) {
                Ok(Some(head)) => break head,
                Ok(None) => match pieces.next() {
                    Some(piece) => buf.extend_from_slice(piece),
                    None => return out,
                },
                Err(_) => return out,
            }
        };
        let bytes = buf.split_to(head.len).freeze();
        let Ok(req) = Request::from_h1(bytes, head) else { return out };
        if req.check().is_err() || req.is_upgrade() {
            return out;
        }
        let mut decoder = Decoder::new(req.body.framing());
        let mut pieces_of_body: Vec<Vec<u8>> = Vec::new();
        while !decoder.is_done() {
            match decoder.decode(&buf) {
                Err(_) => return out,
                Ok(step) => {
                    if !step.data.is_empty() {
                        pieces_of_body.push(buf[step.data.clone()].to_vec());
                    }
                    let _ = buf.split_to(step.used);
                    if step.end {
                        break;
                    }
                    if step.used == 0 || buf.is_empty() {
                        match pieces.next() {
                            Some(piece) => buf.extend_from_slice(piece),
                            // The body never ends: nothing of it is sent.
                            None => return out,
                        }
                    }
                }
            }
        }
        let body: Vec<u8> = pieces_of_body.concat();
        let (outgoing, mut encoder) = match (body.is_empty(), chunked) {
            (true, _) => (Outgoing::None, Encoder::Length(0)),
            (false, true) => (Outgoing::Chunked, Encoder::Chunked),
            (false, false) => (Outgoing::Length(body.len() as u64), Encoder::Length(body.len() as u64)),
        };
        let id = limiter::request_id::RequestId::Own(*b"0000000000000000");
        let upstreamed = Upstreamed {
            fwd: &fwd,
            upstream: "upstream:80",
            body: outgoing,
            upgrade: false,
            id: &id,
            underscores: false,
        };
        req.write_upstream(&mut out.bytes, &upstreamed);
        for piece in &pieces_of_body {
            encoder.data(&mut out.bytes, piece).expect("the encoder takes what the decoder gave");
        }
        encoder.finish(&mut out.bytes).expect("the encoder ends where the decoder did");
        let target = String::from_utf8_lossy(req.target()).into_owned();
        out.admitted.push((req.method.to_string(), target, body));
    }
}

/// Checks one input against the oracle; `Err` says how it fails.
pub fn check(input: &[u8]) -> Result<(), String> {
    let (Some(&seed), Some(&mode)) = (input.first(), input.get(1)) else { return Ok(()) };
    let stream = &input[2..];
    // Reads of 1 to 16 bytes, from the seed.
    let mut cuts = Vec::new();
    let (mut at, mut x) = (0usize, u32::from(seed) | 1);
    while at < stream.len() {
        x = x.wrapping_mul(1_103_515_245).wrapping_add(12_345);
        at += 1 + (x >> 16) as usize % 16;
        cuts.push(at.min(stream.len()));
    }
    let chunked = mode & 1 == 1;
    let whole = forward(stream, &[], chunked);
    let cut = forward(stream, &cuts, chunked);
    if whole.admitted != cut.admitted {
        return Err(format!(
            "where the reads end changed what was admitted: whole {:?}, cut {:?}",
            whole.admitted, cut.admitted
        ));
    }
    let (strict, lenient) = (wire::strict(&cut.bytes), wire::lenient(&cut.bytes));
    if strict.messages != lenient.messages {
        return Err(format!(
            "a strict and a lenient reader read the forwarded bytes differently: {:?}",
            String::from_utf8_lossy(&cut.bytes)
        ));
    }
    if let Some(why) = strict.stopped {
        return Err(format!(
            "a strict reader refused the forwarded bytes ({why}): {:?}",
            String::from_utf8_lossy(&cut.bytes)
        ));
    }
    let read: Vec<(String, String, Vec<u8>)> =
        strict.messages.iter().map(|m| (m.method.clone(), m.target.clone(), m.body.clone())).collect();
    if read != cut.admitted {
        return Err(format!("the forwarded bytes read as {read:?}, not as the admitted {:?}", cut.admitted));
    }
    if let Some(m) = strict.messages.iter().find(|m| !m.canonical) {
        return Err(format!("{} {} was framed otherwise than limiter frames", m.method, m.target));
    }
    Ok(())
}
