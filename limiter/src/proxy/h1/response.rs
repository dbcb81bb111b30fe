//! An upstream response on its way to an HTTP/1 client: the head limiter
//! writes for it (the upstream's end-to-end lines, limiter's framing and
//! `connection` lines), then its body, read ahead whole or streamed holding
//! its permit.

use std::sync::atomic::Ordering;

use bytes::Bytes;
use hyper::StatusCode;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt as _};

use super::framing::{self as http1, ResponseHead, body::Encoder};
use crate::proxy::{
    Proxy,
    error::{Error, Kind},
    io::ClientIo,
    pipeline::Body,
    pressure::{PATIENCE, Pressure},
    request::{Request, Version, headers::response_lines},
    upstream::ResponseBody,
};

/// An upstream response for an HTTP/1 client.
pub struct Response<'a> {
    pub head: &'a ResponseHead,
    pub bytes: &'a [u8],
    pub body: Body,
    /// The connection closes after it.
    pub close: bool,
    pub req: &'a Request,
}

/// How a body goes to the client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToClient {
    /// Nothing (a `HEAD`, a 204, a 304, an empty body): the upstream's
    /// `Content-Length`, if it gave one, says what a `GET` would have had.
    Empty,
    Length(u64),
    Chunked,
    /// Until the connection closes (an HTTP/1.0 client, a length unknown).
    Close,
}

/// A body read ahead up to this size goes out in the same write as its
/// head (a copy is cheaper than a second system call).
const ONE_WRITE: usize = 16 * 1024;

/// Sends an upstream response: `Ok(true)` if the connection closes after
/// it, `Err` if it could not be sent whole (the client went away or was
/// cut, or the upstream broke the body off); `bytes_out` counts the body
/// bytes the client's connection took.
pub async fn send<S>(
    io: &mut ClientIo<S>,
    proxy: &Proxy,
    r: Response<'_>,
    bytes_out: &mut u64,
) -> Result<bool, Error>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let http10 = r.req.version == Version::Http10;
    let to = match r.body.length(r.head) {
        _ if r.body.is_none(r.head) => ToClient::Empty,
        Some(n) => ToClient::Length(n),
        None if http10 => ToClient::Close,
        None => ToClient::Chunked,
    };
    let close = r.close || to == ToClient::Close;
    let mut client_head = Vec::with_capacity(r.head.len + 128);
    write_head(&mut client_head, r.head, r.bytes, to, close, http10);
    let whole = match r.body {
        Body::Whole(whole) => whole,
        Body::Stream { first, rest } => {
            stream_body(io, proxy, client_head, first, rest, to, bytes_out).await?;
            return Ok(close);
        }
    };
    let written = if whole.len() <= ONE_WRITE {
        client_head.extend_from_slice(&whole);
        io.write_all(&client_head).await
    } else {
        io.write_all_buf(&mut bytes::Buf::chain(&client_head[..], &whole[..])).await
    };
    written.map_err(|e| gone(e).0)?;
    *bytes_out = whole.len() as u64;
    Ok(close)
}

/// Streams a body, holding its permit until the upstream has delivered
/// its last byte; under pressure, a client that leaves a chunk untaken
/// for [`PATIENCE`] is cut. A client that left has the rest followed to
/// the upstream's end ([`crate::proxy::upstream::abandon`]), and so does
/// one limiter cut (`client_slow`): the permit returns when the upstream
/// is done, never while it still works.
async fn stream_body<S>(
    io: &mut ClientIo<S>,
    proxy: &Proxy,
    mut pending: Vec<u8>,
    first: Bytes,
    mut rest: Box<ResponseBody>,
    to: ToClient,
    bytes_out: &mut u64,
) -> Result<(), Error>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let pressure = &proxy.pressure;
    let mut encoder = match to {
        ToClient::Chunked => Encoder::Chunked,
        ToClient::Length(n) => Encoder::Length(n),
        ToClient::Empty | ToClient::Close => Encoder::Close,
    };
    let too_long = |_| Error::rule(Kind::UpstreamBody, "the body ran past the length its head gave");
    let cut = |rest: &mut ResponseBody, (error, cut): (Error, bool)| {
        if cut {
            rest.cut();
        }
        error
    };
    let mut data = first;
    loop {
        // The upstream's framing said how long: a body that runs past it
        // cannot be sent as the head said.
        encoder.data(&mut pending, &data).map_err(too_long)?;
        if !pending.is_empty() {
            guarded_write(io, &pending, pressure, proxy).await.map_err(|e| cut(&mut rest, e))?;
            pending.clear();
        }
        *bytes_out += data.len() as u64;
        data = match rest.next().await? {
            Some(data) => data,
            None => break,
        };
    }
    encoder.finish(&mut pending).map_err(too_long)?;
    if !pending.is_empty() {
        guarded_write(io, &pending, pressure, proxy).await.map_err(|e| cut(&mut rest, e))?;
    }
    Ok(())
}

/// Writes an upstream response head for the client: the status line, the
/// upstream's end-to-end lines ([`response_lines`]), a `date` when it sent
/// none, then limiter's framing and `connection` lines.
pub fn write_head(
    out: &mut Vec<u8>,
    head: &ResponseHead,
    bytes: &[u8],
    to: ToClient,
    close: bool,
    http10: bool,
) {
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(itoa::Buffer::new().format(head.status).as_bytes());
    out.push(b' ');
    let reason = head.reason.get(bytes);
    if reason.is_empty() {
        let canonical = StatusCode::from_u16(head.status).ok().and_then(|s| s.canonical_reason());
        // A status http does not know keeps an empty reason (RFC 9112 §4).
        out.extend_from_slice(canonical.unwrap_or("").as_bytes());
    } else {
        out.extend_from_slice(reason);
    }
    out.extend_from_slice(b"\r\n");
    let mut dated = false;
    for (name, value) in response_lines(head, bytes) {
        dated |= name.eq_ignore_ascii_case(b"date");
        out.extend_from_slice(name);
        out.extend_from_slice(b": ");
        out.extend_from_slice(value);
        out.extend_from_slice(b"\r\n");
    }
    if !dated {
        http1::date_line(out);
    }
    match to {
        ToClient::Empty => {
            if head.status != 204
                && let Some(n) = head.length
            {
                length_line(out, n);
            }
        }
        ToClient::Length(n) => length_line(out, n),
        ToClient::Chunked => out.extend_from_slice(b"transfer-encoding: chunked\r\n"),
        ToClient::Close => {}
    }
    if head.status == 101 {
        if let Some(upgrade) = head.fields.iter().find(|f| f.name.get(bytes).eq_ignore_ascii_case(b"upgrade"))
        {
            out.extend_from_slice(b"upgrade: ");
            out.extend_from_slice(upgrade.value.get(bytes));
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(b"connection: upgrade\r\n");
    } else if close {
        out.extend_from_slice(b"connection: close\r\n");
    } else if http10 {
        out.extend_from_slice(b"connection: keep-alive\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

fn length_line(out: &mut Vec<u8>, n: u64) {
    out.extend_from_slice(b"content-length: ");
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
    out.extend_from_slice(b"\r\n");
}

/// The error of a failed write to the client, and whether limiter cut it
/// (a write timed out: the client read slower than its minimum rate, or
/// stopped for its idle timeout) rather than the client going away.
fn gone(e: std::io::Error) -> (Error, bool) {
    if e.kind() == std::io::ErrorKind::TimedOut {
        (Error::io(Kind::ClientCut, e), true)
    } else {
        (Error::io(Kind::ClientGone, e), false)
    }
}

/// Writes to the client; under pressure, one that leaves the bytes
/// untaken for [`PATIENCE`] is cut.
async fn guarded_write<S>(
    io: &mut ClientIo<S>,
    bytes: &[u8],
    pressure: &Pressure,
    proxy: &Proxy,
) -> Result<(), (Error, bool)>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let since = tokio::time::Instant::now();
    tokio::select! {
        written = io.write_all(bytes) => written.map_err(gone),
        () = patience_lost(pressure, since) => {
            proxy.counters.slow_readers.fetch_add(1, Ordering::Relaxed);
            Err((Error::rule(Kind::ClientCut, "a chunk left untaken for a second while a pool refuses"), true))
        }
    }
}

/// Resolves once the pools are under pressure and bytes have waited since
/// `since` for [`PATIENCE`].
async fn patience_lost(pressure: &Pressure, since: tokio::time::Instant) {
    loop {
        let began = pressure.began();
        tokio::pin!(began);
        began.as_mut().enable();
        let now = tokio::time::Instant::now();
        if pressure.on(now) {
            if since + PATIENCE <= now {
                return;
            }
            tokio::time::sleep_until(since + PATIENCE).await;
        } else {
            began.await;
        }
    }
}
