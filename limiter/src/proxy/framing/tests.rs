use super::*;

/// Feeds `input` split at every position given, returns the bytes as hyper
/// would see them and the scanner.
fn scan(input: &[u8], splits: &[usize]) -> (Vec<u8>, Framing) {
    let mut f = Framing::default();
    let mut out = input.to_vec();
    let mut start = 0;
    for &end in splits.iter().chain(std::iter::once(&input.len())) {
        f.feed(&mut out[start..end]);
        start = end;
    }
    (out, f)
}

/// The same input fed whole, byte by byte, and at every single split point
/// must give the same result.
/// Where a poisoned line's NUL lands depends on whether its CR was still
/// in hand (it replaces the CR, or else the LF), so poisoned outputs are
/// compared by "has a NUL", clean ones byte for byte.
fn scan_all_ways(input: &[u8]) -> (Vec<u8>, Framing) {
    let (whole, f) = scan(input, &[]);
    let same = |other: &[u8], how: &str| {
        if f.poisoned == 0 {
            assert_eq!(whole, other, "{how}");
        } else {
            assert!(other.contains(&0), "{how}: not poisoned");
            assert_eq!(other.len(), whole.len(), "{how}");
        }
    };
    let bytes: Vec<usize> = (1..input.len()).collect();
    let (one_by_one, g) = scan(input, &bytes);
    same(&one_by_one, "byte by byte");
    assert_eq!((f.heads, f.poisoned), (g.heads, g.poisoned));
    for split in 1..input.len() {
        let (two, h) = scan(input, &[split]);
        same(&two, &format!("split at {split}"));
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
        11;ext=1\r\nContent-Length: 5\r\n\r\n0\r\nTrailer: x\r\n\r\n\
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
