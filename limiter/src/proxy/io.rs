//! The client side of a proxied connection: a `TcpStream` wrapped so that
//!
//! - every byte read passes the [`Framing`] watch before hyper parses it,
//!   and none after a byte the watch stopped at because hyper refuses it;
//! - a write that cannot make progress for the idle timeout (a client that
//!   stopped reading) fails, so a stalled client cannot hold a permit;
//! - closing is a bounded *lingering close*: FIN first, then whatever the
//!   client still sends (an unread request body behind a 503) is read and
//!   discarded until it stops, a deadline passes or a byte cap is reached.
//!   Closing a socket with unread data would send a RST, which can destroy
//!   the 503 in the client's receive buffer before it is read.

use std::{
    io,
    pin::Pin,
    sync::{Arc, atomic::Ordering},
    task::{Context, Poll, ready},
    time::Duration,
};

use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::TcpStream,
    time::{Instant, Sleep, sleep},
};

use super::{Counters, framing::Framing};

/// Most bytes drained after a 503 before closing anyway.
pub const LINGER_MAX_BYTES: u64 = 64 * 1024 * 1024;

pub struct ClientIo {
    inner: TcpStream,
    framing: Framing,
    counters: Arc<Counters>,
    idle: Duration,
    write_stall: Option<Pin<Box<Sleep>>>,
    linger: Duration,
    closing: Option<Closing>,
}

struct Closing {
    deadline: Pin<Box<Sleep>>,
    drained: u64,
    fin_sent: bool,
}

impl ClientIo {
    pub fn new(inner: TcpStream, idle: Duration, linger: Duration, counters: Arc<Counters>) -> Self {
        Self { inner, framing: Framing::default(), counters, idle, write_stall: None, linger, closing: None }
    }

    /// Progress was made: the stall clock stops. `Pending`: it runs, and
    /// once it has run for the idle timeout the write fails.
    fn stall<T>(&mut self, cx: &mut Context<'_>, poll: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        match poll {
            Poll::Ready(r) => {
                self.write_stall = None;
                Poll::Ready(r)
            }
            Poll::Pending => {
                let idle = self.idle;
                let timer = self.write_stall.get_or_insert_with(|| Box::pin(sleep(idle)));
                if timer.as_mut().poll(cx).is_ready() {
                    self.write_stall = None;
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "client stopped reading (http.idleTimeoutMs)",
                    )));
                }
                Poll::Pending
            }
        }
    }
}

impl AsyncRead for ClientIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.framing.is_lost() {
            // hyper refused what came before: for it the stream ends here.
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        ready!(Pin::new(&mut self.inner).poll_read(cx, buf))?;
        let this = &mut *self;
        let fresh = &mut buf.filled_mut()[before..];
        if !fresh.is_empty() {
            let poisoned_before = this.framing.poisoned;
            let passed = this.framing.feed(fresh);
            let poisoned = this.framing.poisoned - poisoned_before;
            if poisoned > 0 {
                this.counters.framing_conflicts.fetch_add(poisoned, Ordering::Relaxed);
            }
            buf.set_filled(before + passed);
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for ClientIo {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.inner).poll_write(cx, data);
        self.stall(cx, poll)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.stall(cx, poll)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let poll = Pin::new(&mut self.inner).poll_flush(cx);
        self.stall(cx, poll)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let linger = self.linger;
        let this = &mut *self;
        let closing = this.closing.get_or_insert_with(|| Closing {
            deadline: Box::pin(sleep(linger)),
            drained: 0,
            fin_sent: false,
        });
        if !closing.fin_sent {
            // A failed FIN (client already gone) ends the close here.
            if let Err(e) = ready!(Pin::new(&mut this.inner).poll_shutdown(cx)) {
                return Poll::Ready(Err(e));
            }
            closing.fin_sent = true;
            if linger.is_zero() {
                return Poll::Ready(Ok(()));
            }
            closing.deadline.as_mut().reset(Instant::now() + linger);
        }
        let mut scratch = [0u8; 8192];
        loop {
            if closing.deadline.as_mut().poll(cx).is_ready() || closing.drained >= LINGER_MAX_BYTES {
                return Poll::Ready(Ok(()));
            }
            let mut buf = ReadBuf::new(&mut scratch);
            match Pin::new(&mut this.inner).poll_read(cx, &mut buf) {
                Poll::Ready(Ok(())) if buf.filled().is_empty() => return Poll::Ready(Ok(())),
                Poll::Ready(Ok(())) => closing.drained += buf.filled().len() as u64,
                // A reset while draining: the client has what it wanted or
                // is gone; either way there is nothing left to protect.
                Poll::Ready(Err(_)) => return Poll::Ready(Ok(())),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}
