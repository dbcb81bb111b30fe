use super::*;

/// Feeds `input` split at every position given, returns the bytes hyper
/// would see and the scanner.
fn scan(input: &[u8], splits: &[usize]) -> (Vec<u8>, Framing) {
    let mut f = Framing::default();
    let mut out = Vec::new();
    let mut start = 0;
    for &end in splits.iter().chain(std::iter::once(&input.len())) {
        let mut piece = input[start..end].to_vec();
        let passed = f.feed(&mut piece);
        out.extend_from_slice(&piece[..passed]);
        start = end;
    }
    (out, f)
}

/// The same input fed whole, byte by byte, and at every single split point
/// must give the same result, byte for byte.
fn scan_all_ways(input: &[u8]) -> (Vec<u8>, Framing) {
    let (whole, f) = scan(input, &[]);
    let bytes: Vec<usize> = (1..input.len()).collect();
    let (one_by_one, g) = scan(input, &bytes);
    assert_eq!(whole, one_by_one, "byte by byte");
    assert_eq!((f.heads, f.poisoned), (g.heads, g.poisoned));
    for split in 1..input.len() {
        let (two, h) = scan(input, &[split]);
        assert_eq!(whole, two, "split at {split}");
        assert_eq!((f.heads, f.poisoned), (h.heads, h.poisoned), "split at {split}");
    }
    (whole, f)
}

#[test]
fn plain_requests_pass_untouched() {
    let input = b"GET / HTTP/1.1\r\nHost: a\r\n\r\nGET /b HTTP/1.1\r\nhost: a\r\n\r\n";
    let (out, f) = scan_all_ways(input);
    assert_eq!(&out, input);
    assert_eq!((f.heads, f.poisoned), (2, 0));
}

#[test]
fn bodies_are_skipped_by_length_even_when_they_look_like_headers() {
    let body = b"X: y\r\nTransfer-Encoding: chunked\r\n\r\n";
    let mut input = format!("POST / HTTP/1.1\r\nContent-Length: {}\r\n\r\n", body.len()).into_bytes();
    input.extend_from_slice(body);
    input.extend_from_slice(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n");
    let (out, f) = scan_all_ways(&input);
    assert_eq!(out, input);
    assert_eq!((f.heads, f.poisoned), (2, 0));
}

#[test]
fn chunked_bodies_are_followed_to_their_end() {
    let input = b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n\
        13;ext=1\r\nContent-Length: 5\r\n\r\n0\r\nTrailer: x\r\n\r\n\
        GET / HTTP/1.1\r\nHost: a\r\n\r\n";
    let (out, f) = scan_all_ways(input);
    assert_eq!(&out, input);
    assert_eq!((f.heads, f.poisoned), (2, 0));
}

#[test]
fn both_framing_headers_poison_the_head_in_either_order() {
    for head in [
        &b"POST / HTTP/1.1\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n"[..],
        &b"POST / HTTP/1.1\r\ntransfer-encoding: chunked\r\ncontent-length: 4\r\n\r\n"[..],
        &b"POST / HTTP/1.1\nTRANSFER-ENCODING: chunked\nContent-Length: 4\n\n"[..],
    ] {
        let (out, f) = scan_all_ways(head);
        assert_eq!(f.poisoned, 1, "{}", String::from_utf8_lossy(head));
        assert!(out.contains(&0), "no NUL in {:?}", String::from_utf8_lossy(&out));
        assert_eq!(out.len(), head.len());
    }
}

#[test]
fn a_smuggled_second_request_is_caught_after_a_chunked_first() {
    let input = b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n\
        POST /admin HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n";
    let (_, f) = scan_all_ways(input);
    assert_eq!((f.heads, f.poisoned), (2, 1));
}

#[test]
fn names_that_only_start_like_framing_headers_are_ignored() {
    let input = b"GET / HTTP/1.1\r\nContent-Lengths: 4\r\nX-Transfer-Encoding: chunked\r\nUpgrade-Insecure-Requests: 1\r\n\r\nGET / HTTP/1.1\r\n\r\n";
    let (out, f) = scan_all_ways(input);
    assert_eq!(&out, input);
    assert_eq!((f.heads, f.poisoned), (2, 0));
}

#[test]
fn an_upgrade_stops_the_scan() {
    let input = b"GET /ws HTTP/1.1\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n\x81\x05Content-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n";
    let (out, f) = scan_all_ways(input);
    assert_eq!(&out, input);
    assert_eq!((f.heads, f.poisoned), (1, 0));
}

#[test]
fn duplicate_identical_lengths_are_one_length() {
    let input = b"POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello\
        POST / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n";
    let (_, f) = scan_all_ways(input);
    assert_eq!((f.heads, f.poisoned), (2, 1));
}

#[test]
fn leading_zeros_in_chunk_sizes_do_not_lose_the_stream() {
    let input = b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n\
        000000000000000000000005\r\nhello\r\n0000000000000000000000\r\n\r\n\
        POST / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n";
    let (_, f) = scan_all_ways(input);
    assert_eq!((f.heads, f.poisoned), (2, 1));
}

#[test]
fn a_bare_lf_after_the_last_chunk_starts_a_trailer_line() {
    // hyper reads `\nGET ...` and the length line as trailer lines, up to
    // the CRLF on its own line; the conflicting head after them is a head.
    let smuggled = b"POST /admin HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n";
    let mut input = b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\n".to_vec();
    input.extend_from_slice(
        format!("GET / HTTP/1.1\r\nContent-Length: {}\r\n\r\n", smuggled.len()).as_bytes(),
    );
    input.extend_from_slice(smuggled);
    let (out, f) = scan_all_ways(&input);
    assert_eq!((f.heads, f.poisoned), (2, 1));
    assert_eq!(out.len(), input.len());
    assert_eq!(out.iter().position(|&b| b == 0), Some(input.len() - 3), "the conflicting line's LF");
}

#[test]
fn trailer_lines_end_at_crlf_only() {
    let input = b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nX: a\n\r\n\
        POST / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n\r\n";
    let (out, f) = scan_all_ways(input);
    // `X: a\n`, the request line and both framing lines are trailers.
    assert_eq!((f.heads, f.poisoned), (1, 0));
    assert_eq!(&out, input);
    assert_eq!(f.state, Scan::Head);
}

#[test]
fn the_stream_ends_behind_a_byte_hyper_refuses() {
    let chunked = "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n";
    // What hyper still sees (up to the byte it refuses), what it does not.
    for (seen, unseen) in [
        (format!("{chunked}0\n"), "\r\n"),
        (format!("{chunked}5;ext\n"), "hello\r\n0\r\n\r\n"),
        (format!("{chunked}5 5"), "\r\nhello\r\n0\r\n\r\n"),
        (format!("{chunked};"), "x\r\n0\r\n\r\n"),
        (format!("{chunked}5\r\nhello\n"), "0\r\n\r\n"),
        (format!("{chunked}10000000000000000"), "\r\n"),
        (format!("{chunked}0\r\nX: y\rZ"), "\r\n\r\n"),
        (format!("{chunked}0\r\n\rX"), ""),
        ("GET / HTTP/1.1\r\nX: a\rb".to_owned(), "\r\n\r\n"),
        ("POST / HTTP/1.1\r\nContent-Length: 5, 5\r\n\r\n".to_owned(), "hello"),
        ("POST / HTTP/1.1\r\nContent-Length: +5\r\n\r\n".to_owned(), "hello"),
        ("POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n".to_owned(), "hello"),
        ("POST / HTTP/1.1\r\nTransfer-Encoding: chunked, gzip\r\n\r\n".to_owned(), "0\r\n\r\n"),
        (
            "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chu nked\r\n\r\n".to_owned(),
            "0\r\n\r\n",
        ),
    ] {
        let input = format!("{seen}{unseen}GET / HTTP/1.1\r\n\r\n");
        let (out, f) = scan_all_ways(input.as_bytes());
        assert_eq!(String::from_utf8_lossy(&out), seen, "{input:?}");
        assert!(f.is_lost(), "{input:?}");
    }
}

#[test]
fn a_conflicting_head_is_the_last_thing_hyper_sees() {
    let input = b"POST / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET / HTTP/1.1\r\n\r\n";
    let (out, f) = scan_all_ways(input);
    let head = b"POST / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\0\r\n";
    assert_eq!(&out, head);
    assert!(f.is_lost());
}

#[test]
fn lists_padding_and_case_are_read_as_hyper_reads_them() {
    let input = b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\ntransfer-encoding: gzip , CHUNKED \t\r\n\r\n\
        5 \t;a=\"b c\"\r\nhello\r\n000a\r\n0123456789\r\n00;x\r\n\r\n\
        POST / HTTP/1.1\r\nContent-Length:  005 \t\r\ncontent-length: 5\r\n\r\nhello\
        \r\n\nGET / HTTP/1.1\nHost: a\n\n";
    let (out, f) = scan_all_ways(input);
    assert_eq!(&out, input);
    assert_eq!((f.heads, f.poisoned), (3, 0));
    assert_eq!(f.state, Scan::Head);
}
