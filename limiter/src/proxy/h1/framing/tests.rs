//! One test per rule of the framing module, with the bytes that broke the
//! engines before it (issue 33), and every rule checked at every split of
//! its input: the decoder keeps only counters, so where the reads end
//! must not change what it finds.

use super::{
    Framing, HeadError, Response,
    body::{BodyError, Decoder, LAST_CHUNK, chunk_head},
    parse_request, parse_response,
};

fn request(head: &str) -> Result<Option<super::RequestHead>, HeadError> {
    parse_request(head.as_bytes())
}

fn framing(head: &str) -> Result<Framing, HeadError> {
    request(head).map(|h| h.expect("a whole head").framing)
}

#[test]
fn a_request_has_one_length_or_chunked_or_nothing() {
    assert_eq!(framing("GET / HTTP/1.1\r\nHost: a\r\n\r\n"), Ok(Framing::None));
    assert_eq!(framing("POST / HTTP/1.1\r\nContent-Length: 5\r\n\r\n"), Ok(Framing::Length(5)));
    assert_eq!(framing("POST / HTTP/1.1\r\nContent-Length: 0\r\n\r\n"), Ok(Framing::None));
    assert_eq!(
        framing("POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n"),
        Ok(Framing::Length(5))
    );
    assert_eq!(framing("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"), Ok(Framing::Chunked));
    assert_eq!(framing("POST / HTTP/1.1\r\nTransfer-Encoding:  CHUNKED \r\n\r\n"), Ok(Framing::Chunked));
}

#[test]
fn framing_two_readers_could_read_differently_is_refused() {
    for head in [
        "POST / HTTP/1.1\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n",
        "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n",
        "POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
        "POST / HTTP/1.1\r\nContent-Length: 5, 5\r\n\r\n",
        "POST / HTTP/1.1\r\nContent-Length: +5\r\n\r\n",
        "POST / HTTP/1.1\r\nContent-Length: 0x5\r\n\r\n",
        "POST / HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n",
        "POST / HTTP/1.1\r\nContent-Length: \r\n\r\n",
        "POST / HTTP/1.1\r\nTransfer-Encoding: chunked, identity\r\n\r\n",
        "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\n\r\n",
        "POST / HTTP/1.1\r\nTransfer-Encoding: xchunked\r\n\r\n",
        "POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n",
    ] {
        assert_eq!(framing(head), Err(HeadError::FramingConflict), "{head:?}");
    }
    for head in [
        "POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
        "POST / HTTP/1.1\r\nTransfer-Encoding: chunked, chunked\r\n\r\n",
        "POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n",
    ] {
        assert_eq!(framing(head), Err(HeadError::TransferEncoding), "{head:?}");
    }
}

#[test]
fn heads_with_obs_fold_a_bare_cr_or_a_space_before_a_colon_are_malformed() {
    for head in [
        "POST / HTTP/1.1\r\nX-A: 1\r\n 2\r\n\r\n",
        "POST / HTTP/1.1\r\nTransfer-Encoding:\r\n chunked\r\n\r\n",
        "POST / HTTP/1.1\r\nX-A: 1\rContent-Length: 0\r\n\r\n",
        "POST / HTTP/1.1\r\nTransfer-Encoding : chunked\r\n\r\n",
        "POST / HTTP/1.1\r\nX-A: a\0b\r\n\r\n",
        "POST / HTTP/1.1\r\nTransfer-Encoding: \x0bchunked\r\n\r\n",
        "GET / HTTP/2.0\r\n\r\n",
        "GET  / HTTP/1.1\r\n\r\n",
    ] {
        assert_eq!(framing(head), Err(HeadError::Malformed), "{head:?}");
    }
}

#[test]
fn a_bare_lf_ends_a_head_line_and_is_never_sent_on() {
    // httparse reads it as a line end; the head limiter writes is its own.
    let head = request("POST /a HTTP/1.1\nHost: app\nContent-Length: 3\n\nabc").unwrap().unwrap();
    assert_eq!(head.framing, Framing::Length(3));
    assert_eq!(head.len, "POST /a HTTP/1.1\nHost: app\nContent-Length: 3\n\n".len());
}

#[test]
fn too_many_lines_are_too_large() {
    let mut head = String::from("GET / HTTP/1.1\r\n");
    for i in 0..=super::MAX_HEADERS {
        head.push_str(&format!("X-{i}: 1\r\n"));
    }
    head.push_str("\r\n");
    assert_eq!(framing(&head), Err(HeadError::TooLarge));
}

#[test]
fn keep_alive_expect_and_the_fragment_are_read_from_the_head() {
    let h = request("GET /a#frag HTTP/1.1\r\nConnection: keep-alive, close\r\n\r\n").unwrap().unwrap();
    let buf = b"GET /a#frag HTTP/1.1\r\nConnection: keep-alive, close\r\n\r\n";
    assert_eq!(h.target.get(buf), b"/a");
    assert!(!h.keep_alive);
    assert!(request("GET / HTTP/1.1\r\n\r\n").unwrap().unwrap().keep_alive);
    assert!(!request("GET / HTTP/1.0\r\n\r\n").unwrap().unwrap().keep_alive);
    assert!(request("GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n").unwrap().unwrap().keep_alive);
    assert!(request("PUT / HTTP/1.1\r\nExpect: 100-Continue\r\n\r\n").unwrap().unwrap().expect_continue);
    assert!(!request("PUT / HTTP/1.1\r\nExpect: something\r\n\r\n").unwrap().unwrap().expect_continue);
    assert_eq!(request("GET / HTTP/1.1\r\nHost: a\r\n"), Ok(None), "not whole yet");
}

/// Decodes `input` fed in the pieces `splits` cuts it into: the data, the
/// bytes used up to the end, or the error.
fn decode_split(framing: Framing, input: &[u8], splits: &[usize]) -> Result<(Vec<u8>, usize), BodyError> {
    let mut d = Decoder::new(framing);
    let mut data = Vec::new();
    let mut buf: Vec<u8> = Vec::new();
    let (mut consumed, mut fed) = (0, 0);
    let mut cuts = splits.iter().copied().chain(std::iter::once(input.len()));
    loop {
        let step = d.decode(&buf)?;
        data.extend_from_slice(&buf[step.data.clone()]);
        buf.drain(..step.used);
        consumed += step.used;
        if step.end {
            return Ok((data, consumed));
        }
        if step.used > 0 && !buf.is_empty() {
            continue;
        }
        match cuts.next() {
            Some(cut) if cut > fed => {
                buf.extend_from_slice(&input[fed..cut]);
                fed = cut;
            }
            Some(_) => {}
            None => {
                d.eof()?;
                return Ok((data, consumed));
            }
        }
    }
}

/// [`decode_split`] whole and at every single split (every 97th of a long
/// input), which must agree.
fn decode(framing: Framing, input: &[u8]) -> Result<(Vec<u8>, usize), BodyError> {
    let whole = decode_split(framing, input, &[]);
    let step = if input.len() > 4096 { 97 } else { 1 };
    for at in (1..input.len()).step_by(step) {
        assert_eq!(decode_split(framing, input, &[at]), whole, "{input:?} split at {at}");
    }
    let bytewise: Vec<usize> = (1..input.len()).step_by(step).collect();
    assert_eq!(decode_split(framing, input, &bytewise), whole, "{input:?} a byte at a time");
    whole
}

fn chunked(input: &str) -> Result<(Vec<u8>, usize), BodyError> {
    decode(Framing::Chunked, input.as_bytes())
}

#[test]
fn chunks_decode_to_their_data_whatever_the_reads() {
    let body = "5\r\nhello\r\n6;name=value;x=\"q \\\" d\"\r\n world\r\n0\r\n\r\nGET /next HTTP/1.1\r\n\r\n";
    let (data, used) = chunked(body).unwrap();
    assert_eq!(data, b"hello world");
    assert_eq!(&body[used..], "GET /next HTTP/1.1\r\n\r\n", "it stops at the body's end");
    assert_eq!(chunked("000A\r\n0123456789\r\n00\r\n\r\n").unwrap().0, b"0123456789", "zeros and upper case");
    assert_eq!(chunked("3 ;a\r\nabc\r\n0\r\n\r\n").unwrap().0, b"abc", "spaces before ;");
    assert_eq!(chunked("3;a = b ; c\r\nabc\r\n0\r\n\r\n").unwrap().0, b"abc", "spaces around = and ;");
}

#[test]
fn trailers_are_read_to_their_end_and_dropped() {
    let body = "5\r\nhello\r\n0\r\nX-T: 1\r\nX-Checksum: abc\r\n\r\nGET /next HTTP/1.1\r\n";
    let (data, used) = chunked(body).unwrap();
    assert_eq!(data, b"hello");
    assert_eq!(&body[used..], "GET /next HTTP/1.1\r\n");
    assert!(chunked("0\r\nContent-Length: 70\r\n\r\n").is_ok(), "any field: it is dropped");
}

fn refused(input: &str) -> &'static str {
    match chunked(input) {
        Err(BodyError::Chunked(why)) => why,
        other => panic!("{input:?} was read: {other:?}"),
    }
}

#[test]
fn a_bare_lf_or_cr_anywhere_in_the_framing_fails_the_body() {
    refused("0\r\n\nGET /smuggled HTTP/1.1\r\n\r\n");
    refused("0\r\nX-T: 1\nGET /smuggled HTTP/1.1\r\n\r\n");
    refused("3\nabc\r\n0\r\n\r\n");
    refused("3;e\nabc\r\n0\r\n\r\n");
    refused("3\r\nabc\n0\r\n\r\n");
    refused("3\rX\r\nabc\r\n0\r\n\r\n");
    refused("0\r\nX-T: 1\r\r\n\r\n");
    refused("0\r\n\r\r");
}

#[test]
fn chunk_sizes_are_hex_digits_within_2_to_the_60() {
    assert_eq!(refused("\r\nabc\r\n0\r\n\r\n"), "a chunk size without a digit");
    refused("0x3\r\nabc\r\n0\r\n\r\n");
    refused("-3\r\nabc\r\n0\r\n\r\n");
    refused(" 3\r\nabc\r\n0\r\n\r\n");
    assert_eq!(refused("1000000000000000\r\nabc\r\n"), "a chunk size of 2^60 or more");
    assert_eq!(refused("1000000000000000000000003\r\nabc\r\n"), "a chunk size of 2^60 or more");
    // 2^60 - 1 is a size (the body then waits for its data).
    let mut d = Decoder::new(Framing::Chunked);
    assert_eq!(d.decode(b"0fffffffffffffff\r\n").map(|s| s.used), Ok(18));
    assert_eq!(d.remaining(), None);
    assert_eq!(refused(&format!("{}3\r\nabc\r\n", "0".repeat(64))), "a chunk size over 64 bytes");
}

#[test]
fn spaces_after_a_size_need_an_extension_and_extensions_are_tokens_or_quoted() {
    assert_eq!(refused("3 \r\nabc\r\n0\r\n\r\n"), "spaces after a chunk size without an extension");
    refused("3\t\r\nabc\r\n0\r\n\r\n");
    refused("3;\0\r\nabc\r\n0\r\n\r\n");
    refused("3;\r\nabc\r\n0\r\n\r\n");
    refused("3;a=\r\nabc\r\n0\r\n\r\n");
    refused("3;a=\"b\0\"\r\nabc\r\n0\r\n\r\n");
    refused("3;GET /smuggled HTTP/1.1 Host: app\r\nabc\r\n0\r\n\r\n");
    refused("3x\r\nabc\r\n0\r\n\r\n");
}

#[test]
fn extensions_are_bounded_per_body() {
    let long = format!("3;{}\r\nabc\r\n0\r\n\r\n", "e".repeat(20_000));
    assert_eq!(refused(&long), "chunk extensions over 16 KiB");
    let many = format!("{}0\r\n\r\n", "1;eeeeeeeeee\r\nx\r\n".repeat(2000));
    assert_eq!(refused(&many), "chunk extensions over 16 KiB");
}

#[test]
fn chunk_data_must_end_where_its_size_says() {
    refused("3\r\nabcdef\r\n0\r\n\r\n");
    refused("3\r\nab\r\n0\r\n\r\n");
}

#[test]
fn trailers_are_fields_ended_by_crlf_without_obs_fold_within_bounds() {
    refused("0\r\nX-T: a\0b\r\n\r\n");
    assert_eq!(refused("0\r\nX-T: a\r\n b\r\n\r\n"), "obs-fold in the trailers");
    refused("0\r\n: x\r\n\r\n");
    refused("0\r\nX T: x\r\n\r\n");
    let many = format!("0\r\n{}\r\n", "X: 1\r\n".repeat(101));
    assert_eq!(refused(&many), "more than 100 trailer fields");
    let big = format!("0\r\nX: {}\r\n\r\n", "v".repeat(17_000));
    assert_eq!(refused(&big), "trailers over 16 KiB");
}

#[test]
fn a_body_cut_short_is_incomplete() {
    assert_eq!(chunked("5\r\nhel"), Err(BodyError::Incomplete));
    assert_eq!(chunked("5\r\nhello\r\n0\r\nX: 1\r\n"), Err(BodyError::Incomplete));
    assert_eq!(decode(Framing::Length(5), b"hel"), Err(BodyError::Incomplete));
    assert_eq!(decode(Framing::Length(5), b"hello, and more").unwrap(), (b"hello".to_vec(), 5));
    assert_eq!(decode(Framing::Close, b"all of it").unwrap(), (b"all of it".to_vec(), 9));
}

#[test]
fn chunks_are_written_in_plain_hex_and_end_without_trailers() {
    let mut out = Vec::new();
    for (len, hex) in [(1, "1"), (15, "f"), (16, "10"), (4096, "1000"), (70_000, "11170")] {
        out.clear();
        chunk_head(&mut out, len);
        assert_eq!(out, format!("{hex}\r\n").as_bytes());
    }
    assert_eq!(LAST_CHUNK, b"0\r\n\r\n");
    // What limiter writes reads back as what it wrote.
    let mut written = Vec::new();
    chunk_head(&mut written, 11);
    written.extend_from_slice(b"hello world\r\n");
    written.extend_from_slice(LAST_CHUNK);
    assert_eq!(decode(Framing::Chunked, &written).unwrap(), (b"hello world".to_vec(), written.len()));
}

fn response(head: &str, to_head: bool) -> super::ResponseHead {
    match parse_response(head.as_bytes(), to_head) {
        Response::Head(h) => h,
        other => panic!("{head:?}: {other:?}"),
    }
}

#[test]
fn a_responses_framing_follows_rfc_9112_section_6_3() {
    let r = |h: &str| response(h, false);
    assert_eq!(r("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n").framing, Framing::Length(5));
    assert_eq!(r("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n").framing, Framing::Chunked);
    assert_eq!(r("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n").framing, Framing::Chunked);
    let close = r("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n");
    assert_eq!((close.framing, close.closes), (Framing::Close, true));
    let both = r("HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n");
    assert_eq!((both.framing, both.closes), (Framing::Chunked, true), "the coding wins; the connection ends");
    let none = r("HTTP/1.1 200 OK\r\n\r\n");
    assert_eq!((none.framing, none.closes), (Framing::Close, true));
    assert_eq!(r("HTTP/1.1 204 No Content\r\n\r\n").framing, Framing::None);
    let not_modified = r("HTTP/1.1 304 Not Modified\r\nContent-Length: 9\r\n\r\n");
    assert_eq!((not_modified.framing, not_modified.length), (Framing::None, Some(9)));
    let head = response("HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n", true);
    assert_eq!((head.framing, head.length), (Framing::None, Some(9)));
    assert!(r("HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\n").closes);
    assert!(!r("HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 1\r\n\r\n").closes);
    assert!(r("HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 1\r\n\r\n").closes);
}

#[test]
fn responses_limiter_cannot_frame_are_the_upstreams_failure() {
    let differ = "Content-Length values that differ or are not digits";
    let unread = "a response head httparse does not read";
    for (head, why) in [
        ("HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n", differ),
        ("HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n", differ),
        ("HTTP/1.1 999 Nine\r\n\r\n", "a status outside 100-599"),
        ("HTTP/1.1 200 OK\r\nX: 1\r\n 2\r\n\r\n", unread),
        ("nonsense\r\n\r\n", unread),
    ] {
        assert_eq!(parse_response(head.as_bytes(), false), Response::Invalid(why), "{head:?}");
    }
    let endless = format!("HTTP/1.1 200 OK\r\nx-a: {}", "b".repeat(super::MAX_RESPONSE_HEAD));
    assert_eq!(parse_response(endless.as_bytes(), false), Response::Invalid("a response head past 417 KiB"));
    assert_eq!(
        parse_response(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\n", false),
        Response::Interim { len: 25, status: 100 }
    );
    assert_eq!(parse_response(b"HTTP/1.1 200 OK\r\n", false), Response::Partial);
}

#[test]
fn the_encoder_frames_as_limiter_frames_and_holds_a_length_to_its_word() {
    use super::body::Encoder;
    let mut out = Vec::new();
    let mut chunked = Encoder::Chunked;
    chunked.data(&mut out, b"hello").unwrap();
    chunked.data(&mut out, b"").unwrap();
    chunked.data(&mut out, b" world").unwrap();
    chunked.finish(&mut out).unwrap();
    assert_eq!(out, b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n", "no empty chunk before the last");
    let mut out = Vec::new();
    let mut length = Encoder::Length(5);
    length.data(&mut out, b"hel").unwrap();
    assert!(length.finish(&mut out).is_err(), "short of its length");
    let mut length = Encoder::Length(5);
    assert!(length.data(&mut out, b"hello!").is_err(), "past its length");
    let mut length = Encoder::Length(5);
    let mut out = Vec::new();
    length.data(&mut out, b"hello").unwrap();
    length.finish(&mut out).unwrap();
    assert_eq!(out, b"hello");
}
