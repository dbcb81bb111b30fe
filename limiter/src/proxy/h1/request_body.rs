//! A request body as the client frames it, read from its connection: the
//! pipeline's [`BodySource`] on HTTP/1.

use bytes::{Buf as _, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};

use super::framing::body::Decoder;
use crate::proxy::{
    error::{Error, Kind},
    io::ClientIo,
    request::Request,
    upstream::BodySource,
};

/// The interim answer a client that sent `Expect: 100-continue` waits for.
const CONTINUE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";

pub struct RequestBody<'a, S> {
    io: &'a mut ClientIo<S>,
    buf: &'a mut BytesMut,
    decoder: Decoder,
    /// `100 Continue` is owed before the first read.
    expect: bool,
    /// Bytes of it written so far: a `next` dropped while it writes picks
    /// up where it stopped (the client never sees it twice or cut).
    continued: usize,
    done: bool,
    received: u64,
}

impl<'a, S> RequestBody<'a, S>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    pub fn new(io: &'a mut ClientIo<S>, buf: &'a mut BytesMut, req: &Request) -> Self {
        let decoder = Decoder::new(req.body.framing());
        let done = decoder.is_done();
        Self { io, buf, decoder, expect: req.expect_continue && !done, continued: 0, done, received: 0 }
    }

    /// The body was read to its end.
    pub fn read_whole(&self) -> bool {
        self.done
    }
}

impl<S> BodySource for RequestBody<'_, S>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    async fn next(&mut self) -> Result<Option<Bytes>, Error> {
        loop {
            if self.done {
                return Ok(None);
            }
            if !self.buf.is_empty() {
                let step =
                    self.decoder.decode(self.buf).map_err(|e| Error::rule(Kind::ClientBody, e.rule()))?;
                self.done = step.end;
                if !step.data.is_empty() {
                    self.buf.advance(step.data.start);
                    self.received += step.data.len() as u64;
                    return Ok(Some(self.buf.split_to(step.data.len()).freeze()));
                }
                self.buf.advance(step.used);
                if self.done || step.used > 0 {
                    continue;
                }
            }
            // Cancel-safe: what was written is counted before the next
            // write, and `expect` ends only once all of it is out.
            while self.expect {
                let n = self
                    .io
                    .write(&CONTINUE[self.continued..])
                    .await
                    .map_err(|e| Error::io(Kind::ClientBody, e))?;
                if n == 0 {
                    return Err(Error::closed(Kind::ClientBody));
                }
                self.continued += n;
                self.expect = self.continued < CONTINUE.len();
            }
            if self.buf.capacity() - self.buf.len() < 4096 {
                self.buf.reserve(16 * 1024);
            }
            match self.io.read_buf(self.buf).await {
                Ok(0) => {
                    return Err(Error::rule(Kind::ClientBody, "the connection closed before the body's end"));
                }
                Err(e) => return Err(Error::io(Kind::ClientBody, e)),
                Ok(_) => {}
            }
        }
    }

    fn received(&self) -> u64 {
        self.received
    }
}

#[cfg(test)]
mod tests {
    use std::{sync::Arc, time::Duration};

    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _, duplex};

    use super::*;
    use crate::proxy::{counters::Counters, h1::framing as http1, io::Watch};

    #[tokio::test(start_paused = true)]
    async fn a_next_dropped_while_100_continue_is_written_never_sends_it_twice_or_cut() {
        // A pipe of 8 bytes: the interim answer (25) is written in pieces.
        let (mut client, server) = duplex(8);
        let counters = Arc::new(Counters::default());
        let mut io = ClientIo::new(
            server,
            Watch::H1 { between_requests: false },
            Duration::from_secs(60),
            0,
            Duration::ZERO,
            counters,
        );
        let head = b"PUT /x HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\n";
        let mut raw = BytesMut::from(&head[..]);
        let parsed = http1::parse_request(&raw).unwrap().unwrap();
        let bytes = raw.split_to(parsed.len).freeze();
        let req = Request::from_h1(bytes, parsed).unwrap();
        let mut buf = BytesMut::new();
        let mut body = RequestBody::new(&mut io, &mut buf, &req);
        // Dropped twice mid-write (the pipe full), as a select! would.
        let mut seen = Vec::new();
        for _ in 0..2 {
            let cut = tokio::time::timeout(Duration::from_millis(10), body.next()).await;
            assert!(cut.is_err(), "it waits for the client to read");
            let mut piece = [0u8; 8];
            let n = client.read(&mut piece).await.unwrap();
            seen.extend_from_slice(&piece[..n]);
        }
        // The client reads the rest and sends the body.
        let reader = tokio::spawn(async move {
            let mut piece = [0u8; 64];
            while seen.len() < CONTINUE.len() {
                let n = client.read(&mut piece).await.unwrap();
                seen.extend_from_slice(&piece[..n]);
            }
            client.write_all(b"abc").await.unwrap();
            (seen, client)
        });
        let data = tokio::time::timeout(Duration::from_secs(5), body.next())
            .await
            .expect("the client saw the whole interim answer and sent its body")
            .unwrap()
            .unwrap();
        assert_eq!(&data[..], b"abc");
        let (seen, _client) = reader.await.unwrap();
        assert_eq!(seen, CONTINUE, "the interim answer once, whole");
    }
}
