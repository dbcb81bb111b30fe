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

pub struct RequestBody<'a, S> {
    io: &'a mut ClientIo<S>,
    buf: &'a mut BytesMut,
    decoder: Decoder,
    /// `100 Continue` is owed before the first read.
    expect: bool,
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
        Self { io, buf, decoder, expect: req.expect_continue && !done, done, received: 0 }
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
            if self.expect {
                self.expect = false;
                self.io
                    .write_all(b"HTTP/1.1 100 Continue\r\n\r\n")
                    .await
                    .map_err(|e| Error::io(Kind::ClientBody, e))?;
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
