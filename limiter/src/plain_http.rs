//! A plain HTTP/1.1 server for limiter's own endpoints (the admin API, the
//! built-in sample upstream), on the same framing as the proxy: each head
//! read within a timeout and a size, its body (if any) read whole within a
//! size, the handler's response written with its length. Keep-alive;
//! anything it cannot read gets 400 (431 for a head too large, 413 for a
//! body) and the connection closes.

use std::time::Duration;

use bytes::{Buf as _, Bytes, BytesMut};
use hyper::{Request, Response, StatusCode, header::HeaderValue};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};

use crate::proxy::framing::{Framing, HeadError, body::Decoder, empty_lines, parse_request};

/// What one connection is held to.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// A head must arrive within this long of the connection or of the
    /// previous response.
    pub header_timeout: Duration,
    pub max_head: usize,
    pub max_body: usize,
}

/// Serves `stream` until it closes, answering each request with `handler`.
pub async fn serve<S, F, Fut>(mut stream: S, limits: Limits, mut handler: F)
where
    S: AsyncRead + AsyncWrite + Unpin,
    F: FnMut(Request<Bytes>) -> Fut,
    Fut: Future<Output = Response<Bytes>>,
{
    let mut buf = BytesMut::with_capacity(4096);
    loop {
        let (req, keep_alive) = match read_request(&mut stream, &mut buf, limits).await {
            Ok(Some(read)) => read,
            Ok(None) => return,
            Err(status) => {
                let mut response = Response::new(Bytes::from(format!("{status}\n")));
                *response.status_mut() = status;
                let _ = write(&mut stream, response, false).await;
                let _ = stream.shutdown().await;
                return;
            }
        };
        let response = handler(req).await;
        if write(&mut stream, response, keep_alive).await.is_err() || !keep_alive {
            let _ = stream.shutdown().await;
            return;
        }
    }
}

/// The next request and whether the connection stays open after it;
/// `Ok(None)` when the client closed or sent no head in time.
async fn read_request<S>(
    stream: &mut S,
    buf: &mut BytesMut,
    limits: Limits,
) -> Result<Option<(Request<Bytes>, bool)>, StatusCode>
where
    S: AsyncRead + Unpin,
{
    let deadline = tokio::time::Instant::now() + limits.header_timeout;
    let head = loop {
        buf.advance(empty_lines(buf));
        if !buf.is_empty() {
            match parse_request(buf) {
                Ok(Some(head)) if head.len <= limits.max_head => break head,
                Ok(Some(_)) | Err(HeadError::TooLarge) => {
                    return Err(StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE);
                }
                Ok(None) if buf.len() >= limits.max_head => {
                    return Err(StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE);
                }
                Ok(None) => {}
                Err(_) => return Err(StatusCode::BAD_REQUEST),
            }
        }
        match tokio::time::timeout_at(deadline, stream.read_buf(buf)).await {
            Ok(Ok(0) | Err(_)) | Err(_) => return Ok(None),
            Ok(Ok(_)) => {}
        }
    };
    let head_bytes = buf.split_to(head.len).freeze();
    let target = std::str::from_utf8(head.target.get(&head_bytes)).map_err(|_| StatusCode::BAD_REQUEST)?;
    let mut req = Request::builder()
        .method(head.method.get(&head_bytes))
        .uri(target)
        .version(if head.minor == 0 { hyper::Version::HTTP_10 } else { hyper::Version::HTTP_11 });
    for f in &head.fields {
        let value =
            HeaderValue::from_maybe_shared(head_bytes.slice(f.value.start as usize..f.value.end as usize))
                .map_err(|_| StatusCode::BAD_REQUEST)?;
        req = req.header(f.name.get(&head_bytes), value);
    }
    if let Framing::Length(n) = head.framing
        && n > limits.max_body as u64
    {
        return Err(StatusCode::PAYLOAD_TOO_LARGE);
    }
    let mut decoder = Decoder::new(head.framing);
    let mut body = BytesMut::new();
    loop {
        let step = decoder.decode(buf).map_err(|_| StatusCode::BAD_REQUEST)?;
        body.extend_from_slice(&buf[step.data.clone()]);
        buf.advance(step.used);
        if body.len() > limits.max_body {
            return Err(StatusCode::PAYLOAD_TOO_LARGE);
        }
        if step.end || decoder.is_done() {
            break;
        }
        if step.used == 0 {
            match tokio::time::timeout(limits.header_timeout, stream.read_buf(buf)).await {
                Ok(Ok(n)) if n > 0 => {}
                _ => return Ok(None),
            }
        }
    }
    let req = req.body(body.freeze()).map_err(|_| StatusCode::BAD_REQUEST)?;
    Ok(Some((req, head.keep_alive)))
}

async fn write<S>(stream: &mut S, response: Response<Bytes>, keep_alive: bool) -> std::io::Result<()>
where
    S: AsyncWrite + Unpin,
{
    let (parts, body) = response.into_parts();
    let mut out = Vec::with_capacity(256 + body.len());
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(parts.status.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(parts.status.canonical_reason().unwrap_or("").as_bytes());
    out.extend_from_slice(b"\r\n");
    for (name, value) in &parts.headers {
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"content-length: ");
    out.extend_from_slice(itoa::Buffer::new().format(body.len()).as_bytes());
    out.extend_from_slice(b"\r\n");
    if !keep_alive {
        out.extend_from_slice(b"connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(&body);
    stream.write_all(&out).await
}
