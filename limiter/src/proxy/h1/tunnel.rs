//! An upgrade the upstream accepted: its `101` goes to the client, then the
//! two connections are joined byte for byte (what either side sent past
//! the heads goes first) until one closes: nothing either side sends is
//! read as HTTP any more. The tunnel no longer counts under the upstream
//! connections' cap; its place under `http.maxTunnels` is the caller's.

use std::{
    pin::Pin,
    task::{Context, Poll},
};

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt as _, ReadBuf};

use super::{
    framing::ResponseHead,
    response::{ToClient, write_head},
};
use crate::proxy::{io::ClientIo, upstream::UpstreamConn};

/// Joins the client's connection to the upstream's; returns the bytes that
/// went up (client to upstream) and down, past the heads.
pub async fn join<S>(
    io: &mut ClientIo<S>,
    buf: &mut BytesMut,
    head: &ResponseHead,
    bytes: &[u8],
    conn: UpstreamConn,
) -> (u64, u64)
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut out = Vec::with_capacity(head.len + 64);
    write_head(&mut out, head, bytes, ToClient::Empty, false, false);
    let (mut upstream, early) = conn.into_tunnel();
    let (mut up, down) = (0, early.len() as u64);
    out.extend_from_slice(&early);
    if io.write_all(&out).await.is_err() {
        return (up, 0);
    }
    if !buf.is_empty() {
        if upstream.write_all(buf).await.is_err() {
            return (up, down);
        }
        up += buf.len() as u64;
    }
    buf.clear();
    let (mut client, mut upstream) = (Counted::new(io), Counted::new(&mut upstream));
    // Either side closing or failing ends the tunnel; what moved is counted
    // either way.
    let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
    (up + client.read, down + upstream.read)
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
