//! A cleartext client connection that joins the worker's event loop only
//! when it has to wait.
//!
//! A client that opens a connection for one request has usually sent the
//! request by the time limiter accepts the connection, and a socket's send
//! buffer takes a small response whole. Registering the socket with epoll
//! up front costs two system calls per connection (`EPOLL_CTL_ADD` when it
//! is accepted, `EPOLL_CTL_DEL` when tokio lets it go) and a turn of the
//! event loop before the first read. So each read and write is first tried
//! on the socket itself, non-blocking; the first one that would block
//! registers the socket, and from then on tokio drives it as any other.
//! A connection that never waits is read, answered and closed without
//! epoll knowing of it (HAProxy's speculative I/O, in the same spirit).

use std::{
    io::{self, Write as _},
    net::Shutdown,
    pin::Pin,
    task::{Context, Poll},
};

use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::TcpStream,
};

pub struct Speculative {
    state: State,
}

enum State {
    /// Not registered: reads and writes go to the socket directly.
    Direct(std::net::TcpStream),
    /// Registered with the worker's event loop.
    Polled(TcpStream),
    /// Registering failed: the socket is closed.
    Gone,
}

impl Speculative {
    /// A connection fresh from `accept4(SOCK_NONBLOCK)`.
    pub fn direct(stream: std::net::TcpStream) -> Self {
        Self { state: State::Direct(stream) }
    }

    /// A connection already in the event loop.
    pub fn polled(stream: TcpStream) -> Self {
        Self { state: State::Polled(stream) }
    }

    /// Whether the socket has joined the event loop (for tests).
    #[cfg(test)]
    fn is_polled(&self) -> bool {
        matches!(self.state, State::Polled(_))
    }

    /// One read or write: `direct` on the socket while it is not
    /// registered; when that would block (or once registered), `polled`
    /// through the event loop. `arg` is what both take (the buffer).
    fn poll_io<A, T>(
        &mut self,
        cx: &mut Context<'_>,
        arg: &mut A,
        direct: impl FnOnce(&std::net::TcpStream, &mut A) -> io::Result<T>,
        polled: impl FnOnce(Pin<&mut TcpStream>, &mut Context<'_>, &mut A) -> Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        if let State::Direct(stream) = &self.state {
            match tried(direct(stream, arg)) {
                Ok(Some(t)) => return Poll::Ready(Ok(t)),
                Ok(None) => {}
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
        match self.register() {
            Ok(stream) => polled(Pin::new(stream), cx, arg),
            Err(e) => Poll::Ready(Err(e)),
        }
    }

    /// The socket would block: it joins the event loop.
    fn register(&mut self) -> io::Result<&mut TcpStream> {
        if matches!(self.state, State::Direct(_))
            && let State::Direct(stream) = std::mem::replace(&mut self.state, State::Gone)
        {
            self.state = State::Polled(TcpStream::from_std(stream)?);
        }
        match &mut self.state {
            State::Polled(stream) => Ok(stream),
            _ => Err(io::Error::new(
                io::ErrorKind::NotConnected,
                "the connection could not join the event loop",
            )),
        }
    }
}

/// One `recv` into the buffer's room, which need not be initialised first
/// (zeroing a connection's 4 KiB read buffer cost more than the two
/// `epoll_ctl` calls this module saves), as tokio's own sockets read.
#[allow(unsafe_code, reason = "a read into uninitialised room, as tokio's own sockets read")]
fn read_into(stream: &std::net::TcpStream, buf: &mut ReadBuf<'_>) -> io::Result<()> {
    // SAFETY: recv(2) writes at most the room's length and only whole
    // bytes; exactly the `n` it reports are marked initialised and filled.
    unsafe {
        let n = socket2::SockRef::from(stream).recv(buf.unfilled_mut())?;
        buf.assume_init(n);
        buf.advance(n);
    }
    Ok(())
}

/// `Ok(None)` when the call would block.
fn tried<T>(result: io::Result<T>) -> io::Result<Option<T>> {
    match result {
        Ok(t) => Ok(Some(t)),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
        Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(None),
        Err(e) => Err(e),
    }
}

impl AsyncRead for Speculative {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.poll_io(cx, buf, |s, buf| read_into(s, buf), |s, cx, buf| s.poll_read(cx, buf))
    }
}

impl AsyncWrite for Speculative {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        self.poll_io(cx, &mut &*data, |mut s, data| s.write(data), |s, cx, data| s.poll_write(cx, data))
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let direct = |mut s: &std::net::TcpStream, bufs: &mut &[io::IoSlice<'_>]| s.write_vectored(bufs);
        self.poll_io(cx, &mut &*bufs, direct, |s, cx, bufs| s.poll_write_vectored(cx, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.state {
            State::Direct(_) | State::Gone => Poll::Ready(Ok(())),
            State::Polled(stream) => Pin::new(stream).poll_flush(cx),
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.state {
            State::Direct(stream) => Poll::Ready(stream.shutdown(Shutdown::Write)),
            State::Polled(stream) => Pin::new(stream).poll_shutdown(cx),
            State::Gone => Poll::Ready(Ok(())),
        }
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    use super::*;

    /// A connected pair: limiter's side as accepted (non-blocking, in no
    /// event loop) and the client's.
    async fn pair() -> (Speculative, TcpStream) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        let (ours, _) = listener.accept().unwrap();
        ours.set_nonblocking(true).unwrap();
        (Speculative::direct(ours), client)
    }

    #[tokio::test]
    async fn a_request_already_there_is_read_and_answered_outside_the_event_loop() {
        let (mut ours, mut client) = pair().await;
        client.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
        // The bytes are in our receive queue once the client's write returns
        // on loopback.
        let mut buf = [0u8; 64];
        let n = ours.read(&mut buf).await.unwrap();
        assert_eq!(&buf[..n], b"GET / HTTP/1.1\r\n\r\n");
        ours.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n").await.unwrap();
        ours.shutdown().await.unwrap();
        assert!(!ours.is_polled(), "nothing waited: the socket never joined the event loop");
        let mut answer = Vec::new();
        client.read_to_end(&mut answer).await.unwrap();
        assert_eq!(answer, b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n", "the answer, then the FIN");
    }

    #[tokio::test]
    async fn a_read_that_would_block_joins_the_event_loop_and_is_woken() {
        let (mut ours, mut client) = pair().await;
        let read = tokio::spawn(async move {
            let mut buf = [0u8; 16];
            let n = ours.read(&mut buf).await.unwrap();
            (buf[..n].to_vec(), ours.is_polled())
        });
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        client.write_all(b"late").await.unwrap();
        let (got, polled) = read.await.unwrap();
        assert_eq!(got, b"late");
        assert!(polled, "it waited, so it was registered");
    }

    #[tokio::test]
    async fn a_write_larger_than_the_socket_takes_waits_for_the_reader() {
        let (mut ours, mut client) = pair().await;
        let big = vec![7u8; 8 << 20];
        let want = big.len();
        let reader = tokio::spawn(async move {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            let mut got = Vec::new();
            client.read_to_end(&mut got).await.unwrap();
            got.len()
        });
        ours.write_all(&big).await.unwrap();
        assert!(ours.is_polled(), "the send buffer filled: it waited in the event loop");
        ours.shutdown().await.unwrap();
        drop(ours);
        assert_eq!(reader.await.unwrap(), want, "every byte arrived");
    }

    #[tokio::test]
    async fn a_client_gone_before_the_read_is_an_end_not_a_wait() {
        let (mut ours, client) = pair().await;
        drop(client);
        let mut buf = [0u8; 16];
        assert_eq!(ours.read(&mut buf).await.unwrap(), 0, "EOF at once");
        assert!(!ours.is_polled());
    }
}
