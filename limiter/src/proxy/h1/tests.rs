//! The HTTP/1 session against scripted I/O: the client is an in-memory
//! pipe, the upstream a loopback listener whose every byte the test
//! writes (see [`crate::proxy::testing`]).

use std::{sync::atomic::Ordering, time::Duration};

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use crate::proxy::{
    error::Kind,
    testing::{Rig, answer, exactly, head, header, status, to_end},
    upstream::{Cause, End},
};

/// `http.maxThreads` for one permit in the normal pool (8 system threads,
/// 3 diagnostic slots).
const ONE_PERMIT: &str = "http.maxThreads = 12";

#[tokio::test]
async fn pipelined_requests_are_answered_in_order_over_one_kept_upstream_connection() {
    let rig = Rig::new("").await;
    let (mut client, _) = rig.connect();
    client
        .write_all(b"GET /one HTTP/1.1\r\nHost: a\r\n\r\n\r\nGET /two HTTP/1.1\r\nHost: a\r\n\r\n")
        .await
        .unwrap();
    let mut up = rig.accept().await;
    let first = head(&mut up).await;
    assert!(first.starts_with("GET /one HTTP/1.1\r\n"), "{first}");
    assert!(header(&first, "x-request-id").is_some_and(|id| id.len() == 16), "{first}");
    answer(&mut up, "one").await;
    let (one, body) = (head(&mut client).await, exactly(&mut client, 3).await);
    assert_eq!((status(&one), &body[..]), (200, &b"one"[..]));
    // The second goes on the same upstream connection, once the first is done.
    assert!(head(&mut up).await.starts_with("GET /two HTTP/1.1\r\n"));
    answer(&mut up, "two").await;
    assert_eq!(status(&head(&mut client).await), 200);
    assert_eq!(exactly(&mut client, 3).await, b"two");
    assert_eq!(rig.proxy.upstreams.connects_ok.load(Ordering::Relaxed), 1);
    let lines = rig.log_lines(2).await;
    let paths: Vec<_> =
        lines.iter().map(|l| (l["path"].as_str().unwrap(), l["status"].as_u64().unwrap())).collect();
    assert_eq!(paths, [("/one", 200), ("/two", 200)]);
    assert_eq!(rig.in_use(), 0);
}

#[tokio::test]
async fn a_head_refused_as_it_is_read_is_answered_logged_and_closes() {
    let rig = Rig::new("").await;
    for bytes in [
        &b"GET /a HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n"[..],
        b"POST /b HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
        b"GET /c HTTP/1.1\r\nHost: a\r\nConnection: host\r\n\r\n",
        b"GET /d HTTP/1.1\r\nHost: a\r\nBad Name: x\r\n\r\n",
    ] {
        let (mut client, served) = rig.connect();
        client.write_all(bytes).await.unwrap();
        let answer = String::from_utf8(to_end(&mut client).await).unwrap();
        assert_eq!(status(&answer), 400, "{answer}");
        assert_eq!(header(&answer, "connection"), Some("close"), "{answer}");
        served.await.unwrap();
    }
    let lines = rig.log_lines(4).await;
    let seen: Vec<_> = lines
        .iter()
        .map(|l| {
            (
                l["method"].as_str().unwrap().to_owned(),
                l["path"].as_str().unwrap().to_owned(),
                l["reason"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let want = [
        ("GET", "/a", "host"),
        ("POST", "/b", "framing_conflict"),
        ("GET", "/c", "connection"),
        ("GET", "/d", "malformed"),
    ];
    assert_eq!(seen, want.map(|(m, p, r)| (m.to_owned(), p.to_owned(), r.to_owned())));
    assert!(
        tokio::time::timeout(Duration::from_millis(50), rig.upstream.accept()).await.is_err(),
        "nothing went upstream"
    );
}

#[tokio::test]
async fn expect_100_continue_is_answered_before_the_body_is_read_and_bytes_in_is_the_body() {
    let rig = Rig::new("").await;
    let (mut client, _) = rig.connect();
    client
        .write_all(b"PUT /up HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n")
        .await
        .unwrap();
    assert_eq!(head(&mut client).await, "HTTP/1.1 100 Continue\r\n\r\n");
    client.write_all(b"hello").await.unwrap();
    let mut up = rig.accept().await;
    let h = head(&mut up).await;
    assert!(header(&h, "expect").is_none(), "the expectation was met here: {h}");
    assert_eq!(exactly(&mut up, 5).await, b"hello");
    answer(&mut up, "ok").await;
    assert_eq!(status(&head(&mut client).await), 200);
    let line = &rig.log_lines(1).await[0];
    assert_eq!((line["bytes_in"].as_u64(), line["bytes_out"].as_u64()), (Some(5), Some(2)));
}

#[tokio::test]
async fn a_request_over_the_limit_is_refused_at_once_and_the_permit_returns_with_the_response() {
    let rig = Rig::new(ONE_PERMIT).await;
    let (mut first, _) = rig.connect();
    first.write_all(b"GET /slow HTTP/1.1\r\nHost: a\r\n\r\n").await.unwrap();
    let mut up = rig.accept().await;
    head(&mut up).await;
    assert_eq!(rig.in_use(), 1);
    let (mut second, _) = rig.connect();
    second.write_all(b"GET /more HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nabc").await.unwrap();
    let refused = String::from_utf8(to_end(&mut second).await).unwrap();
    assert_eq!(status(&refused), 503, "{refused}");
    assert_eq!(header(&refused, "x-limiter-refused"), Some("normal"), "{refused}");
    assert_eq!(header(&refused, "connection"), Some("close"));
    assert!(header(&refused, "retry-after").is_some());
    answer(&mut up, "done").await;
    assert_eq!(status(&head(&mut first).await), 200);
    exactly(&mut first, 4).await;
    assert_eq!(rig.in_use(), 0, "the permit is back once the upstream's body was delivered");
    let lines = rig.log_lines(2).await;
    assert_eq!(lines[0]["reason"], "normal");
    assert_eq!(lines[0]["bytes_in"], 0, "the refused body was not read");
    assert_eq!(lines[1]["status"], 200);
}

#[tokio::test]
async fn after_a_504_the_permit_is_held_until_the_upstream_is_done() {
    let rig =
        Rig::new(&format!("{ONE_PERMIT}\nhttp.upstreamTimeoutMs = 200\nhttp.upstreamAbandonMs = 30000"))
            .await;
    let (mut client, _) = rig.connect();
    client.write_all(b"GET /work HTTP/1.1\r\nHost: a\r\n\r\n").await.unwrap();
    let mut up = rig.accept().await;
    head(&mut up).await;
    let timed_out = String::from_utf8(to_end(&mut client).await).unwrap();
    assert_eq!(status(&timed_out), 504, "{timed_out}");
    assert_eq!(rig.in_use(), 1, "the upstream still works on it");
    let (mut other, _) = rig.connect();
    other.write_all(b"GET /next HTTP/1.1\r\nHost: a\r\n\r\n").await.unwrap();
    assert_eq!(status(&head(&mut other).await), 503, "no permit while the upstream works");
    answer(&mut up, "late").await;
    assert_eq!(rig.until_free().await, 0, "the permit is back once the upstream answered");
    assert_eq!(rig.proxy.upstreams.abandoned.count(Cause::Timeout, End::Answered), 1);
    assert_eq!(rig.errors(Kind::UpstreamTimeout), 1);
}

#[tokio::test]
async fn a_request_the_upstream_took_is_never_sent_again_whatever_its_method() {
    let rig = Rig::new("").await;
    let (mut client, _) = rig.connect();
    client.write_all(b"GET /1 HTTP/1.1\r\nHost: a\r\n\r\n").await.unwrap();
    let mut pooled = rig.accept().await;
    head(&mut pooled).await;
    answer(&mut pooled, "1").await;
    head(&mut client).await;
    exactly(&mut client, 1).await;
    // The next request goes on the pooled connection; the upstream reads it
    // (it may be running it) and closes without a byte of answer: a GET is
    // not sent again either, the client gets 502.
    client.write_all(b"GET /2 HTTP/1.1\r\nHost: a\r\n\r\n").await.unwrap();
    assert!(head(&mut pooled).await.starts_with("GET /2 "));
    drop(pooled);
    let failed = head(&mut client).await;
    assert_eq!(status(&failed), 502, "{failed}");
    assert!(tokio::time::timeout(Duration::from_millis(50), rig.upstream.accept()).await.is_err());
    assert_eq!(rig.proxy.upstreams.retries.load(Ordering::Relaxed), 0);
}

#[tokio::test]
async fn an_upstream_connection_that_says_close_is_not_reused() {
    let rig = Rig::new("").await;
    let (mut client, _) = rig.connect();
    client.write_all(b"GET /1 HTTP/1.1\r\nHost: a\r\n\r\n").await.unwrap();
    let mut up = rig.accept().await;
    head(&mut up).await;
    up.write_all(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 1\r\n\r\n1").await.unwrap();
    let h = head(&mut client).await;
    assert_eq!(header(&h, "connection"), None, "the upstream's close is its own hop's: {h}");
    exactly(&mut client, 1).await;
    client.write_all(b"GET /2 HTTP/1.1\r\nHost: a\r\n\r\n").await.unwrap();
    let mut next = rig.accept().await;
    assert!(head(&mut next).await.starts_with("GET /2 "));
    answer(&mut next, "2").await;
    head(&mut client).await;
    assert_eq!(rig.proxy.upstreams.connects_ok.load(Ordering::Relaxed), 2);
    let mut rest = [0u8; 1];
    assert_eq!(up.read(&mut rest).await.unwrap(), 0, "the first connection was closed");
}

#[tokio::test]
async fn an_upstream_that_breaks_its_framing_is_a_502_and_its_connection_goes() {
    let rig = Rig::new("").await;
    let (mut client, _) = rig.connect();
    client.write_all(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n").await.unwrap();
    let mut up = rig.accept().await;
    head(&mut up).await;
    up.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab").await.unwrap();
    let failed = String::from_utf8(to_end(&mut client).await).unwrap();
    assert_eq!(status(&failed), 502, "{failed}");
    assert_eq!(rig.errors(Kind::UpstreamInvalid), 1);
    assert_eq!(rig.log_lines(1).await[0]["reason"], "upstream_invalid");
    assert_eq!(rig.in_use(), 0);
}

#[tokio::test]
async fn a_drain_closes_an_idle_keep_alive_connection_and_lets_a_request_in_flight_finish() {
    let rig = Rig::new("").await;
    let (mut idle, idle_served) = rig.connect();
    idle.write_all(b"GET /1 HTTP/1.1\r\nHost: a\r\n\r\n").await.unwrap();
    let mut up = rig.accept().await;
    head(&mut up).await;
    answer(&mut up, "1").await;
    head(&mut idle).await;
    exactly(&mut idle, 1).await;
    let (mut busy, _) = rig.connect();
    busy.write_all(b"GET /2 HTTP/1.1\r\nHost: a\r\n\r\n").await.unwrap();
    head(&mut up).await;
    rig.drain();
    tokio::time::timeout(Duration::from_secs(5), idle_served)
        .await
        .expect("the idle connection ends")
        .unwrap();
    assert_eq!(to_end(&mut idle).await, b"");
    answer(&mut up, "2").await;
    let last = head(&mut busy).await;
    assert_eq!((status(&last), header(&last, "connection")), (200, Some("close")), "{last}");
}

#[tokio::test]
async fn a_head_cut_at_the_header_timeout_is_logged_408_and_an_idle_connection_is_not() {
    let rig = Rig::new("http.headerReadTimeoutMs = 100").await;
    let (mut slow, slow_served) = rig.connect();
    slow.write_all(b"GET /half HTTP/1.1\r\nHost: a\r\n").await.unwrap();
    let (mut idle, idle_served) = rig.connect();
    idle.write_all(b"GET /whole HTTP/1.1\r\nHost: a\r\n\r\n").await.unwrap();
    let mut up = rig.accept().await;
    head(&mut up).await;
    answer(&mut up, "").await;
    head(&mut idle).await;
    slow_served.await.unwrap();
    idle_served.await.unwrap();
    assert_eq!(to_end(&mut slow).await, b"", "nothing is sent to a head cut off");
    let lines = rig.log_lines(2).await;
    let seen: Vec<_> =
        lines.iter().map(|l| (l["path"].as_str().unwrap(), l["status"].as_u64().unwrap())).collect();
    assert!(seen.contains(&("/half", 408)) && seen.contains(&("/whole", 200)), "{seen:?}");
    assert_eq!(rig.proxy.counters.header_timeouts.load(Ordering::Relaxed), 2, "both count as timeouts");
}

#[tokio::test]
async fn a_client_that_leaves_mid_download_keeps_its_permit_until_the_upstream_is_done() {
    let rig = Rig::new(ONE_PERMIT).await;
    let (mut client, served) = rig.connect();
    client.write_all(b"GET /dl HTTP/1.1\r\nHost: a\r\n\r\n").await.unwrap();
    let mut up = rig.accept().await;
    head(&mut up).await;
    up.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\n\r\n").await.unwrap();
    up.write_all(&[b'x'; 16384]).await.unwrap();
    head(&mut client).await;
    exactly(&mut client, 16384).await;
    drop(client);
    up.write_all(&[b'x'; 16384]).await.unwrap();
    served.await.unwrap();
    assert_eq!(rig.in_use(), 1, "the upstream still sends: its permit is held");
    up.write_all(&vec![b'x'; 1_000_000 - 2 * 16384]).await.unwrap();
    assert_eq!(rig.until_free().await, 0, "back once the upstream delivered its last byte");
    assert_eq!(rig.proxy.upstreams.abandoned.count(Cause::ClientGone, End::Answered), 1);
    assert_eq!(rig.log_lines(1).await[0]["status"], 200);
}

#[tokio::test]
async fn a_timeout_on_a_pooled_connection_is_a_504_never_a_retry() {
    let rig = Rig::new("http.upstreamTimeoutMs = 200\nhttp.upstreamAbandonMs = 30000").await;
    let (mut client, _) = rig.connect();
    client.write_all(b"GET /1 HTTP/1.1\r\nHost: a\r\n\r\n").await.unwrap();
    let mut up = rig.accept().await;
    head(&mut up).await;
    answer(&mut up, "1").await;
    head(&mut client).await;
    exactly(&mut client, 1).await;
    // The next GET goes on the pooled connection; the upstream works on it
    // past the timeout. Sending it again elsewhere would run it twice.
    client.write_all(b"GET /2 HTTP/1.1\r\nHost: a\r\n\r\n").await.unwrap();
    assert!(head(&mut up).await.starts_with("GET /2 "));
    assert_eq!(status(&head(&mut client).await), 504);
    assert!(
        tokio::time::timeout(Duration::from_millis(300), rig.upstream.accept()).await.is_err(),
        "sent once"
    );
    assert_eq!(rig.proxy.upstreams.retries.load(Ordering::Relaxed), 0);
    answer(&mut up, "2").await;
}

#[tokio::test]
async fn an_upload_the_upstream_does_not_read_yet_is_a_502_whose_permit_waits_for_the_upstream() {
    use crate::proxy::upstream::abandon::{Cause, End};
    let rig = Rig::new("http.idleTimeoutMs = 300\nhttp.upstreamAbandonMs = 30000").await;
    let (client, _) = rig.connect();
    let (mut reader, mut writer) = tokio::io::split(client);
    // More than loopback's socket buffers hold: the upload stalls while the
    // upstream computes before it reads.
    const BODY: usize = 32 << 20;
    let upload = tokio::spawn(async move {
        let head = format!("PUT /big HTTP/1.1\r\nHost: a\r\nContent-Length: {BODY}\r\n\r\n");
        writer.write_all(head.as_bytes()).await.unwrap();
        let chunk = vec![b'x'; 64 * 1024];
        for _ in 0..BODY / chunk.len() {
            if writer.write_all(&chunk).await.is_err() {
                return;
            }
        }
    });
    let mut up = rig.accept().await;
    assert!(head(&mut up).await.starts_with("PUT /big "));
    let failed = head(&mut reader).await;
    assert_eq!(status(&failed), 502, "{failed}");
    // The upstream is alive: its permit stays until it is done.
    assert_eq!(rig.proxy.admission.snapshot().normal_in_use, 1);
    assert_eq!(rig.proxy.upstreams.abandoned.now.load(Ordering::Relaxed), 1);
    // It reads now: the body ends where limiter stopped (a half-close),
    // and its answer ends the exchange.
    let mut sink = vec![0u8; 1 << 20];
    let mut read = 0;
    loop {
        match up.read(&mut sink).await.unwrap() {
            0 => break,
            n => read += n,
        }
    }
    assert!(read < BODY, "the body was cut short: {read} bytes");
    answer(&mut up, "late").await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while rig.proxy.admission.snapshot().normal_in_use != 0 {
        assert!(tokio::time::Instant::now() < deadline, "the permit came back once the upstream answered");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(rig.proxy.upstreams.abandoned.count(Cause::Stalled, End::Answered), 1);
    assert!(
        tokio::time::timeout(Duration::from_millis(50), rig.upstream.accept()).await.is_err(),
        "sent once"
    );
    upload.abort();
}
