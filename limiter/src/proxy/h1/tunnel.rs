//! An upgrade the upstream accepted: its `101` goes to the client, then the
//! two connections are joined byte for byte (what either side sent past
//! the heads goes first): nothing either side sends is read as HTTP any
//! more. The tunnel no longer counts under the upstream connections' cap;
//! its place under `http.maxTunnels` is the caller's, given back when
//! [`join`] returns.
//!
//! It ends when both sides have closed, when no byte went either way for
//! `http.tunnelIdleTimeoutMs`, or [`CLIENT_GONE_GRACE`] after the client's
//! side closed or failed (the upstream is told by a shutdown of its write
//! side, and a tunnel whose upstream never closes does not outlive its
//! client). A side that closes first has its close passed on; a write that
//! makes no progress for the idle bound ends the tunnel too.

use std::{
    pin::Pin,
    task::{Context, Poll},
    time::Duration,
};

use bytes::BytesMut;
use tokio::{
    io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _, ReadBuf},
    time::{Instant, sleep_until, timeout},
};

use super::{
    framing::ResponseHead,
    response::{ToClient, write_head},
};
use crate::proxy::{io::ClientIo, upstream::UpstreamConn};

/// After the client's side of a tunnel closed or failed, how long the
/// upstream has to close its side before the tunnel is closed anyway.
pub const CLIENT_GONE_GRACE: Duration = Duration::from_secs(1);
/// A chunk of a tunnel's traffic, each way.
const CHUNK: usize = 16 * 1024;
/// No idle bound (`http.tunnelIdleTimeoutMs = 0`): a year.
const FOREVER: Duration = Duration::from_secs(365 * 24 * 3600);

/// Joins the client's connection to the upstream's; returns the bytes that
/// went up (client to upstream) and down, past the heads. `idle`: the
/// tunnel's idle bound (`None`: none).
pub async fn join<S>(
    io: &mut ClientIo<S>,
    buf: &mut BytesMut,
    head: &ResponseHead,
    bytes: &[u8],
    conn: UpstreamConn,
    idle: Option<Duration>,
) -> (u64, u64)
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let idle = idle.unwrap_or(FOREVER);
    let mut out = Vec::with_capacity(head.len + 64);
    write_head(&mut out, head, bytes, ToClient::Empty, false, false);
    let (mut upstream, early) = conn.into_tunnel();
    let (mut up, down) = (0, early.len() as u64);
    out.extend_from_slice(&early);
    if !matches!(timeout(idle, io.write_all(&out)).await, Ok(Ok(()))) {
        return (up, 0);
    }
    if !buf.is_empty() {
        if !matches!(timeout(idle, upstream.write_all(buf)).await, Ok(Ok(()))) {
            return (up, down);
        }
        up += buf.len() as u64;
    }
    buf.clear();
    let (mut client, mut upstream) = (Counted::new(io), Counted::new(&mut upstream));
    relay(&mut client, &mut upstream, idle).await;
    (up + client.read, down + upstream.read)
}

/// Copies both ways until the tunnel ends (see the module's doc).
async fn relay<C, U>(client: &mut C, upstream: &mut U, idle: Duration)
where
    C: AsyncRead + AsyncWrite + Unpin,
    U: AsyncRead + AsyncWrite + Unpin,
{
    let (mut from_client, mut from_upstream) = (vec![0u8; CHUNK], vec![0u8; CHUNK]);
    let (mut client_open, mut upstream_open) = (true, true);
    let mut deadline = Instant::now() + idle;
    // Set once the client's side is gone: the tunnel ends by then.
    let mut gone_by: Option<Instant> = None;
    while client_open || upstream_open {
        let until = gone_by.map_or(deadline, |g| g.min(deadline));
        tokio::select! {
            r = client.read(&mut from_client), if client_open => match r {
                Ok(n) if n > 0 => {
                    if !matches!(timeout(idle, upstream.write_all(&from_client[..n])).await, Ok(Ok(()))) {
                        return;
                    }
                    deadline = Instant::now() + idle;
                }
                // Closed or failed: the upstream is told; it has the grace
                // to close its side.
                _ => {
                    client_open = false;
                    gone_by = Some(Instant::now() + CLIENT_GONE_GRACE);
                    let _ = timeout(CLIENT_GONE_GRACE, upstream.shutdown()).await;
                }
            },
            r = upstream.read(&mut from_upstream), if upstream_open => match r {
                Ok(n) if n > 0 => {
                    if !matches!(timeout(idle, client.write_all(&from_upstream[..n])).await, Ok(Ok(()))) {
                        return;
                    }
                    deadline = Instant::now() + idle;
                }
                _ => {
                    upstream_open = false;
                    let _ = timeout(idle, client.shutdown()).await;
                }
            },
            () = sleep_until(until) => return,
        }
    }
}

/// A stream that counts the bytes read from it (a tunnel's traffic each
/// way, also when it ends in an error).
struct Counted<'a, S> {
    inner: &'a mut S,
    read: u64,
}

impl<'a, S> Counted<'a, S> {
    fn new(inner: &'a mut S) -> Self {
        Self { inner, read: 0 }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Counted<'_, S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut *self.inner).poll_read(cx, buf);
        self.read += (buf.filled().len() - before) as u64;
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Counted<'_, S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bytes: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut *self.inner).poll_write(cx, bytes)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut *self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut *self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _, duplex};

    use super::*;

    const IDLE: Duration = Duration::from_secs(300);

    #[tokio::test(start_paused = true)]
    async fn a_tunnel_with_no_byte_either_way_ends_at_its_idle_bound_and_traffic_moves_it() {
        let (mut client, mut client_side) = duplex(1024);
        let (mut upstream, mut upstream_side) = duplex(1024);
        let started = Instant::now();
        let relay = tokio::spawn(async move { relay(&mut client_side, &mut upstream_side, IDLE).await });
        // Bytes each way, 200 s apart: each moves the bound.
        tokio::time::sleep(Duration::from_secs(200)).await;
        client.write_all(b"ping").await.unwrap();
        let mut got = [0u8; 4];
        upstream.read_exact(&mut got).await.unwrap();
        tokio::time::sleep(Duration::from_secs(200)).await;
        upstream.write_all(b"pong").await.unwrap();
        client.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"pong");
        relay.await.unwrap();
        // Ended 300 s after the last byte, both sides still open.
        assert_eq!(started.elapsed(), Duration::from_secs(700));
        let mut rest = Vec::new();
        assert_eq!(upstream.read_to_end(&mut rest).await.unwrap(), 0, "the upstream sees the tunnel close");
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_gone_ends_the_tunnel_within_the_grace_whatever_the_upstream_does() {
        let (client, mut client_side) = duplex(1024);
        let (mut upstream, mut upstream_side) = duplex(1024);
        let started = Instant::now();
        let relay = tokio::spawn(async move { relay(&mut client_side, &mut upstream_side, IDLE).await });
        tokio::time::sleep(Duration::from_secs(10)).await;
        drop(client);
        relay.await.unwrap();
        assert_eq!(started.elapsed(), Duration::from_secs(10) + CLIENT_GONE_GRACE);
        // The upstream was told (its read ends) though it never closed.
        let mut rest = Vec::new();
        assert_eq!(upstream.read_to_end(&mut rest).await.unwrap(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn an_upstream_that_closes_after_the_client_ends_the_tunnel_at_once() {
        let (client, mut client_side) = duplex(1024);
        let (mut upstream, mut upstream_side) = duplex(1024);
        let started = Instant::now();
        let relay = tokio::spawn(async move { relay(&mut client_side, &mut upstream_side, IDLE).await });
        drop(client);
        // The upstream reads the close and closes its side.
        let mut rest = Vec::new();
        upstream.read_to_end(&mut rest).await.unwrap();
        drop(upstream);
        relay.await.unwrap();
        assert!(started.elapsed() < CLIENT_GONE_GRACE);
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_that_stops_reading_cannot_hold_the_tunnel_past_the_idle_bound() {
        let (_client, mut client_side) = duplex(64);
        let (mut upstream, mut upstream_side) = duplex(64 * 1024);
        let started = Instant::now();
        let relay = tokio::spawn(async move { relay(&mut client_side, &mut upstream_side, IDLE).await });
        // More than the client's pipe holds: the write to it stalls.
        upstream.write_all(&[7u8; 4096]).await.unwrap();
        relay.await.unwrap();
        assert!(started.elapsed() <= IDLE + Duration::from_millis(1), "{:?}", started.elapsed());
    }
}
