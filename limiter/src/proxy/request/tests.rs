//! What a request head must satisfy, through the engine's reading of a
//! head ([`Request::from_h1`], [`Request::from_h2`]) and
//! [`Request::check`], the path every request takes (the rules are listed
//! in [`super::head`]).

use bytes::Bytes;

use super::{Refused, Request, head::Bad};
use crate::proxy::framing;

/// An HTTP/1.x head's verdict, through the engine's reading of it and
/// [`Request::check`], the path every request takes.
fn h1(request_line: &str, lines: &[(&str, &[u8])]) -> Result<(), Bad> {
    let mut head = format!("{request_line}\r\n").into_bytes();
    for (name, value) in lines {
        head.extend_from_slice(name.as_bytes());
        head.extend_from_slice(b": ");
        head.extend_from_slice(value);
        head.extend_from_slice(b"\r\n");
    }
    head.extend_from_slice(b"\r\n");
    let parsed = framing::parse_request(&head).expect("a head").expect("whole");
    match Request::from_h1(Bytes::from(head), parsed) {
        Ok(req) => req.check(),
        Err(Refused::Bad(bad)) => Err(bad),
        Err(refused) => panic!("{refused:?}"),
    }
}

/// An HTTP/2 stream's head's verdict.
fn h2(uri: &str, hosts: &[&str]) -> Result<(), Bad> {
    let mut req = hyper::Request::get(uri).version(hyper::Version::HTTP_2);
    for host in hosts {
        req = req.header(hyper::header::HOST, *host);
    }
    let (parts, ()) = req.body(()).unwrap().into_parts();
    Request::from_h2(&parts, true).expect("not CONNECT").check()
}

fn checked(lines: &[(&str, &[u8])]) -> Result<(), Bad> {
    h1("GET / HTTP/1.0", lines)
}

#[test]
fn heads_that_mean_two_things_are_refused() {
    assert_eq!(checked(&[("host", b"app")]), Ok(()));
    assert_eq!(checked(&[]), Ok(()), "HTTP/1.0 may omit Host");
    assert_eq!(checked(&[("host", b"app"), ("host", b"app")]), Err(Bad::Host));
    assert_eq!(checked(&[("Host", b"app"), ("HOST", b"app")]), Err(Bad::Host), "in any case");
    assert_eq!(checked(&[("host", b"app\",for=6.6.6.6;host=\"app")]), Err(Bad::Host));
    assert_eq!(checked(&[("authorization", b"Bearer a")]), Ok(()));
    assert_eq!(
        checked(&[("authorization", b"Bearer a"), ("authorization", b"Bearer a")]),
        Err(Bad::Authorization)
    );
    for named in [&b"Content-Length"[..], b"keep-alive, content-length", b"TRANSFER-ENCODING", b" host "] {
        assert_eq!(checked(&[("host", b"app"), ("connection", named)]), Err(Bad::Connection), "{named:?}");
    }
    let twice = [("host", &b"app"[..]), ("connection", b"keep-alive"), ("connection", b"Host")];
    assert_eq!(checked(&twice), Err(Bad::Connection), "a second line");
    for fine in [&b"keep-alive"[..], b"close", b"x-secret, upgrade", b"content-lengths", b"hosts"] {
        assert_eq!(checked(&[("host", b"app"), ("connection", fine)]), Ok(()), "{fine:?}");
    }
    // The first failing check names the refusal.
    assert_eq!(
        checked(&[("host", b"a b"), ("authorization", b"x"), ("authorization", b"y")]),
        Err(Bad::Host)
    );
}

#[test]
fn transfer_codings_are_the_framing_modules_to_refuse() {
    // Decided once, as the body's framing is read: `Request::check`
    // never sees a coding other than a lone `chunked`.
    let head = |te: &str| format!("POST / HTTP/1.1\r\nhost: a\r\ntransfer-encoding: {te}\r\n\r\n");
    for te in ["chunked", "Chunked", "CHUNKED"] {
        assert!(framing::parse_request(head(te).as_bytes()).is_ok_and(|h| h.is_some()), "{te}");
        assert_eq!(h1("POST / HTTP/1.1", &[("host", b"a"), ("transfer-encoding", te.as_bytes())]), Ok(()));
    }
    for (te, error) in [
        ("gzip, chunked", framing::HeadError::TransferEncoding),
        ("chunked, chunked", framing::HeadError::TransferEncoding),
        ("deflate,chunked", framing::HeadError::TransferEncoding),
        ("gzip", framing::HeadError::FramingConflict),
        ("identity", framing::HeadError::FramingConflict),
    ] {
        assert_eq!(framing::parse_request(head(te).as_bytes()), Err(error), "{te}");
    }
}

#[test]
fn targets_and_their_authorities_follow_the_rfcs() {
    assert_eq!(h1("GET /x HTTP/1.1", &[("host", b"app")]), Ok(()));
    assert_eq!(h1("GET /x HTTP/1.1", &[]), Err(Bad::Host), "HTTP/1.1 needs Host");
    assert_eq!(h1("GET /x HTTP/1.0", &[]), Ok(()), "HTTP/1.0 may omit it");
    assert_eq!(h1("GET http://app.example/x HTTP/1.1", &[("host", b"other")]), Ok(()), "the target wins");
    assert_eq!(h1("GET app:80 HTTP/1.1", &[("host", b"app")]), Err(Bad::Target), "authority form");
    assert_eq!(h1("GET * HTTP/1.1", &[("host", b"app")]), Err(Bad::Target));
    assert_eq!(h1("OPTIONS * HTTP/1.1", &[("host", b"app")]), Ok(()));
    assert_eq!(h1("GET http://u:p@app/x HTTP/1.1", &[("host", b"app")]), Err(Bad::Host), "userinfo");
    assert_eq!(h1("GET ftp://app/x HTTP/1.1", &[("host", b"app")]), Err(Bad::Target), "a scheme not HTTP's");
    // HTTP/2: `:authority` (in the URI) against `host`.
    assert_eq!(h2("https://app/x", &[]), Ok(()));
    assert_eq!(h2("https://app/x", &["APP"]), Ok(()));
    assert_eq!(h2("https://app/x", &["other"]), Err(Bad::Host));
    assert_eq!(h2("https://user@app/x", &[]), Err(Bad::Host));
    assert_eq!(h2("/x", &["app"]), Ok(()), "host without :authority");
    assert_eq!(h2("/x", &[]), Err(Bad::Host), "no authority at all");
}
