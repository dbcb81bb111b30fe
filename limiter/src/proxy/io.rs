//! The client side of a proxied connection: a `TcpStream` (or the TLS
//! stream over one) wrapped so that
//!
//! - on HTTP/2, every frame header passes the flood [`Meter`] before
//!   hyper's codec reads it;
//! - a write that cannot make progress for the idle timeout (a client that
//!   stopped reading) fails, and so does a client that, while the proxy
//!   has bytes for it, reads less than `http.minDataRate` on average after
//!   a grace: a slow reader cannot hold a permit for long;
//! - closing is a bounded *lingering close*: FIN first, then whatever the
//!   client still sends (an unread request body behind a 503) is read and
//!   discarded until it stops, a deadline passes or a byte cap is reached.
//!   Closing a socket with unread data would send a RST, which can destroy
//!   the 503 in the client's receive buffer before it is read. On HTTP/1,
//!   when every request the client sent was read whole and nothing more is
//!   waiting on the socket, the connection closes after the FIN at once
//!   (as nginx's `lingering_close on` does): most 503s, and every
//!   keep-alive connection's end, cost no second wake-up.

use std::{
    io,
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    task::{Context, Poll, ready},
    time::Duration,
};

use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::TcpStream,
    time::{Instant, Sleep, sleep, sleep_until},
};

use super::{
    Counters,
    h2::meter::{Flood, Meter},
};

/// What the connection knows of the protocol on it.
pub enum Watch {
    /// HTTP/1: the engine frames the requests itself and says whether it
    /// is between two of them.
    H1 { between_requests: bool },
    /// HTTP/2: the flood meter, where it reports the frames that show the
    /// client using the connection, and where it says it cut the
    /// connection for a flood of `RST_STREAM`.
    H2(Meter, Arc<AtomicU64>, Arc<AtomicBool>),
}

impl Watch {
    pub fn h2(activity: Arc<AtomicU64>, reset_flood: Arc<AtomicBool>) -> Self {
        Self::H2(Meter::default(), activity, reset_flood)
    }
}

/// Most bytes drained in a lingering close before closing anyway.
pub const LINGER_MAX_BYTES: u64 = 64 * 1024 * 1024;

pub struct ClientIo<S = TcpStream> {
    inner: S,
    watch: Watch,
    counters: Arc<Counters>,
    idle: Duration,
    write_stall: Option<Pin<Box<Sleep>>>,
    /// `http.minDataRate` for the client's reading (0: off).
    min_rate: u64,
    /// Since the socket first refused bytes of a response, with the bytes it
    /// took since: the client must drain at least `min_rate` bytes per
    /// second on average, until it sends its next request.
    blocked: Option<Blocked>,
    rate_timer: Option<Pin<Box<Sleep>>>,
    linger: Duration,
    closing: Option<Closing>,
    /// The last read took less than it had room for: the client's bytes
    /// were all read then.
    read_all: bool,
    /// Whether a close may trust `read_all` (see
    /// [`ClientIo::closing_on_what_was_read`]).
    trust_read_all: bool,
}

struct Blocked {
    since: Instant,
    bytes: u64,
    /// The last write was refused: the client is being waited for.
    last_pending: bool,
}

struct Closing {
    /// Set when the close lingers.
    deadline: Option<Pin<Box<Sleep>>>,
    drained: u64,
    fin_sent: bool,
}

impl<S> ClientIo<S> {
    pub fn new(
        inner: S,
        watch: Watch,
        idle: Duration,
        min_rate: u64,
        linger: Duration,
        counters: Arc<Counters>,
    ) -> Self {
        Self {
            inner,
            watch,
            counters,
            idle,
            write_stall: None,
            min_rate,
            blocked: None,
            rate_timer: None,
            linger,
            closing: None,
            read_all: false,
            trust_read_all: false,
        }
    }

    /// A close after requests read whole does not read once more to see
    /// whether anything came since (nginx's `lingering_close on` decides
    /// from what it read, too): for a transport whose read would otherwise
    /// be a system call, or the socket's joining the event loop
    /// ([`super::speculative`]), where tokio's readiness would have said
    /// "nothing" for free.
    pub fn closing_on_what_was_read(mut self) -> Self {
        self.trust_read_all = true;
        self
    }

    /// An HTTP/1 client's connection, with the timeouts and the rate in
    /// force.
    pub fn h1(inner: S, tuning: &super::Tuning, counters: Arc<Counters>) -> Self {
        let watch = Watch::H1 { between_requests: true };
        Self::new(inner, watch, tuning.idle_timeout, tuning.min_data_rate, tuning.linger, counters)
    }

    /// The HTTP/1 engine's say on whether every request it read was read
    /// whole (a lingering close then has nothing to protect).
    pub fn set_between_requests(&mut self, between: bool) {
        if let Watch::H1 { between_requests } = &mut self.watch {
            *between_requests = between;
        }
    }

    /// Accounts a write for the minimum reading rate.
    fn account(&mut self, poll: &Poll<io::Result<usize>>) {
        match poll {
            Poll::Pending => match &mut self.blocked {
                Some(b) => b.last_pending = true,
                None => self.blocked = Some(Blocked { since: Instant::now(), bytes: 0, last_pending: true }),
            },
            Poll::Ready(Ok(n)) => {
                if let Some(b) = &mut self.blocked {
                    b.bytes += *n as u64;
                    b.last_pending = false;
                }
            }
            Poll::Ready(Err(_)) => {}
        }
    }

    /// Whether the client, blocked on, has read too slowly: its deadline is
    /// when its average since the block began falls under the rate.
    fn too_slow(&mut self, cx: &mut Context<'_>) -> bool {
        let (Some(b), rate) = (&mut self.blocked, self.min_rate) else { return false };
        if rate == 0 {
            return false;
        }
        let due = super::rate::rate_due(&mut b.since, &mut b.bytes, rate);
        let timer = self.rate_timer.get_or_insert_with(|| Box::pin(sleep_until(due)));
        timer.as_mut().reset(due);
        timer.as_mut().poll(cx).is_ready()
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
                if self.too_slow(cx) {
                    self.blocked = None;
                    self.counters.slow_readers.fetch_add(1, Ordering::Relaxed);
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "client reads slower than http.minDataRate",
                    )));
                }
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

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for ClientIo<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let (before, room) = (buf.filled().len(), buf.remaining());
        ready!(Pin::new(&mut self.inner).poll_read(cx, buf))?;
        let this = &mut *self;
        let fresh = &mut buf.filled_mut()[before..];
        this.read_all = fresh.len() < room;
        if !fresh.is_empty() {
            // The client sends its next request: what it read of the last
            // response is no longer measured (unless the proxy is waiting
            // on it right now: bytes sent then cannot excuse slow reading).
            if this.blocked.as_ref().is_some_and(|b| !b.last_pending) {
                this.blocked = None;
            }
            match &mut this.watch {
                Watch::H1 { .. } => {}
                Watch::H2(meter, activity, reset_flood) => {
                    let before = meter.active_frames;
                    let fed = meter.feed(fresh);
                    if meter.active_frames != before {
                        activity.store(meter.active_frames, Ordering::Relaxed);
                    }
                    if let Err(flood) = fed {
                        this.counters.h2_floods[flood.index()].fetch_add(1, Ordering::Relaxed);
                        if flood == Flood::RstStream {
                            reset_flood.store(true, Ordering::Relaxed);
                        }
                        return Poll::Ready(Err(io::Error::other(format!(
                            "HTTP/2 flood of {} frames: the connection is cut",
                            flood.as_str()
                        ))));
                    }
                }
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for ClientIo<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.inner).poll_write(cx, data);
        self.account(&poll);
        self.stall(cx, poll)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.account(&poll);
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
        // Nothing of a next request has come (HTTP/1 only: an HTTP/2
        // client's frames keep coming after a GOAWAY).
        let between_requests = match &self.watch {
            Watch::H1 { between_requests } => *between_requests,
            Watch::H2(..) => false,
        };
        let this = &mut *self;
        let closing = this.closing.get_or_insert(Closing { deadline: None, drained: 0, fin_sent: false });
        if !closing.fin_sent {
            // A failed FIN (client already gone) ends the close here.
            if let Err(e) = ready!(Pin::new(&mut this.inner).poll_shutdown(cx)) {
                return Poll::Ready(Err(e));
            }
            closing.fin_sent = true;
            if linger.is_zero() || (between_requests && this.trust_read_all && this.read_all) {
                return Poll::Ready(Ok(()));
            }
        }
        // Never read: not zeroed either (8 KiB per close).
        let mut scratch = [std::mem::MaybeUninit::<u8>::uninit(); 8192];
        loop {
            if closing.drained >= LINGER_MAX_BYTES
                || closing.deadline.as_mut().is_some_and(|d| d.as_mut().poll(cx).is_ready())
            {
                return Poll::Ready(Ok(()));
            }
            let mut buf = ReadBuf::uninit(&mut scratch);
            match Pin::new(&mut this.inner).poll_read(cx, &mut buf) {
                Poll::Ready(Ok(())) if buf.filled().is_empty() => return Poll::Ready(Ok(())),
                Poll::Ready(Ok(())) => closing.drained += buf.filled().len() as u64,
                // A reset while draining: the client has what it wanted or
                // is gone; either way there is nothing left to protect.
                Poll::Ready(Err(_)) => return Poll::Ready(Ok(())),
                // Every request was read whole and nothing more waits:
                // nothing to protect the answer from.
                Poll::Pending if closing.deadline.is_none() && closing.drained == 0 && between_requests => {
                    return Poll::Ready(Ok(()));
                }
                Poll::Pending => {
                    if closing.deadline.is_none() {
                        let mut deadline = Box::pin(sleep(linger));
                        // Registered with this task's waker, so the deadline
                        // wakes it.
                        if deadline.as_mut().poll(cx).is_ready() {
                            return Poll::Ready(Ok(()));
                        }
                        closing.deadline = Some(deadline);
                    }
                    return Poll::Pending;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _, DuplexStream, duplex};

    use super::*;

    const IDLE: Duration = Duration::from_secs(60);
    const LINGER: Duration = Duration::from_secs(5);

    fn h1(between_requests: bool, pipe: usize, min_rate: u64) -> (ClientIo<DuplexStream>, DuplexStream) {
        let (client, server) = duplex(pipe);
        let io = ClientIo::new(
            server,
            Watch::H1 { between_requests },
            IDLE,
            min_rate,
            LINGER,
            Arc::new(Counters::default()),
        );
        (io, client)
    }

    #[tokio::test(start_paused = true)]
    async fn a_close_between_whole_requests_with_nothing_waiting_does_not_linger() {
        let (mut io, mut client) = h1(true, 1024, 0);
        io.write_all(b"HTTP/1.1 200 OK\r\n\r\n").await.unwrap();
        let started = Instant::now();
        io.shutdown().await.unwrap();
        assert_eq!(started.elapsed(), Duration::ZERO);
        let mut got = Vec::new();
        client.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"HTTP/1.1 200 OK\r\n\r\n", "the answer, then the FIN");
    }

    #[tokio::test(start_paused = true)]
    async fn a_close_on_what_was_read_does_not_read_again_after_a_read_that_took_everything() {
        for trusted in [false, true] {
            let (io, mut client) = h1(true, 1024, 0);
            let mut io = if trusted { io.closing_on_what_was_read() } else { io };
            client.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
            let mut buf = [0u8; 256];
            let n = io.read(&mut buf).await.unwrap();
            assert!(n < buf.len(), "a read that took everything there was");
            io.write_all(b"HTTP/1.1 200 OK\r\n\r\n").await.unwrap();
            // Sent after the last read, before the close.
            client.write_all(b"late").await.unwrap();
            let started = Instant::now();
            io.shutdown().await.unwrap();
            if trusted {
                assert_eq!(started.elapsed(), Duration::ZERO, "closed on what it had read");
            } else {
                assert_eq!(started.elapsed(), LINGER, "read the late bytes, so it lingered");
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_close_after_an_unread_body_drains_it_until_the_client_stops_then_the_deadline() {
        let (mut io, mut client) = h1(false, 1024, 0);
        io.write_all(b"HTTP/1.1 503 Service Unavailable\r\n\r\n").await.unwrap();
        // The client is still sending the body the 503 refused.
        let sender = tokio::spawn(async move {
            for _ in 0..10 {
                client.write_all(&[b'x'; 100]).await.unwrap();
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            client
        });
        let started = Instant::now();
        io.shutdown().await.unwrap();
        let mut client = sender.await.unwrap();
        assert_eq!(
            started.elapsed(),
            LINGER,
            "the client went quiet without closing: the close lingers to its deadline"
        );
        let mut got = Vec::new();
        client.read_to_end(&mut got).await.unwrap();
        assert!(got.starts_with(b"HTTP/1.1 503"), "the 503 reached the client intact");
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_that_closes_ends_the_lingering_at_once() {
        let (mut io, mut client) = h1(false, 1024, 0);
        client.write_all(b"part of a body").await.unwrap();
        client.shutdown().await.unwrap();
        let started = Instant::now();
        io.shutdown().await.unwrap();
        assert_eq!(started.elapsed(), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn lingering_stops_at_its_byte_cap() {
        let (mut io, mut client) = h1(false, 1 << 20, 0);
        let flood = tokio::spawn(async move {
            let chunk = vec![0u8; 1 << 20];
            while client.write_all(&chunk).await.is_ok() {}
        });
        io.shutdown().await.unwrap();
        assert!(io.closing.as_ref().is_some_and(|c| c.drained >= LINGER_MAX_BYTES));
        drop(io);
        flood.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_that_stops_reading_fails_the_write_after_the_idle_timeout() {
        let (mut io, _client) = h1(true, 64, 0);
        let started = Instant::now();
        let err = io.write_all(&[0u8; 1024]).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert_eq!(started.elapsed(), IDLE);
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_reading_under_the_minimum_rate_is_cut_after_the_grace() {
        let (mut io, mut client) = h1(true, 64, 1000);
        // 64 bytes a second, under 1000 B/s.
        let reader = tokio::spawn(async move {
            let mut buf = [0u8; 64];
            while client.read(&mut buf).await.is_ok_and(|n| n > 0) {
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        });
        let started = Instant::now();
        let err = io.write_all(&[0u8; 1 << 20]).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        let took = started.elapsed();
        assert!(
            took >= super::super::rate::GRACE && took < IDLE,
            "cut by the rate, not the idle timeout: {took:?}"
        );
        assert_eq!(io.counters.slow_readers.load(Ordering::Relaxed), 1);
        drop(io);
        reader.await.unwrap();
    }
}
