// The framing corpus: byte streams (pipelined requests, valid, near
// valid and hostile) that once showed a disagreement, or sit right on a
// rule, kept so that they run on every test run. Two tests read it: the
// framing watch against hyper (`differential.rs`, through this module)
// and the two HTTP/1.1 engines against each other
// (`tests/tests/h1_engines.rs`, through `include!`). A stream the framing
// test shrinks to goes here.

pub const CORPUS: &[&[u8]] = &[
    // Issue 12: a bare LF right after the last chunk starts a trailer
    // line for hyper (only CRLF ends the trailers). The scanner used to end
    // the body there, so it skipped the "body" of the GET below, where
    // hyper found a head carrying both framing headers.
    b"POST /r0 HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\n\
      GET /r1 HTTP/1.1\r\nContent-Length: 68\r\n\r\n\
      POST /r2 HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
    // A bare LF ending a later trailer line: the same smuggling, one line
    // further (the scanner used to end the trailers at the CRLF after it).
    b"POST /r0 HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nX: y\n\r\n\
      GET /r1 HTTP/1.1\r\nContent-Length: 68\r\n\r\n\
      POST /r2 HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
    // The same bare LF with the conflicting head right behind it: both
    // read it as trailer lines.
    b"POST /r0 HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\n\
      POST /r1 HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    // A bare LF inside a trailer line is a byte of that line for hyper's
    // decoder (httparse then refuses the trailers).
    b"POST /r0 HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nX: a\nY: b\r\n\r\nGET /r1 HTTP/1.1\r\n\r\n",
    // Trailers that look like a request, each line ended by CRLF.
    b"POST /r0 HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nContent-Length: 3\r\n\
      Transfer-Encoding: chunked\r\n\r\nGET /r1 HTTP/1.1\r\n\r\n",
    // Bare LFs ending chunk-size lines, with and without an extension,
    // and ending chunk data: hyper refuses each; so does the scanner.
    b"POST /r0 HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\n\r\nGET /r1 HTTP/1.1\r\n\r\n",
    b"POST /r0 HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5;ext\nhello\r\n0\r\n\r\nGET /r1 HTTP/1.1\r\n\r\n",
    b"POST /r0 HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\n0\r\n\r\nGET /r1 HTTP/1.1\r\n\r\n",
    // Extensions, whitespace after the size, zero padding, upper case.
    b"POST /r0 HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5 \t;a=\"b c\";d\r\nhello\r\n\
      000A\r\n0123456789\r\n00;x\r\n\r\nGET /r1 HTTP/1.1\r\n\r\n",
    // Digits after whitespace, a size line without digits, 17 hex digits.
    b"POST /r0 HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5 5\r\nhello\r\n0\r\n\r\n",
    b"POST /r0 HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n;x\r\n\r\nGET /r1 HTTP/1.1\r\n\r\n",
    b"POST /r0 HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n10000000000000000\r\nx\r\n0\r\n\r\n",
    // Lengths: a list, different values, the same value twice, padding.
    b"POST /r0 HTTP/1.1\r\nContent-Length: 5, 5\r\n\r\nhelloGET /r1 HTTP/1.1\r\n\r\n",
    b"POST /r0 HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 4\r\n\r\nhelloGET /r1 HTTP/1.1\r\n\r\n",
    b"POST /r0 HTTP/1.1\r\nContent-Length:  005 \t\r\ncontent-length: 5\r\n\r\nhelloGET /r1 HTTP/1.1\r\n\r\n",
    b"POST /r0 HTTP/1.1\r\nContent-Length: 18446744073709551616\r\n\r\nhello",
    // Codings: chunked last (in a list, on the last line), or not.
    b"POST /r0 HTTP/1.1\r\nTransfer-Encoding: gzip\r\ntransfer-encoding: gzip , CHUNKED \r\n\r\n\
      0\r\n\r\nGET /r1 HTTP/1.1\r\n\r\n",
    b"POST /r0 HTTP/1.1\r\nTransfer-Encoding: chunked, gzip\r\n\r\n0\r\n\r\nGET /r1 HTTP/1.1\r\n\r\n",
    b"POST /r0 HTTP/1.1\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\n\r\n0\r\n\r\n",
    // CL+TE behind bare-LF line ends, and a space before the colon (which
    // hyper refuses, so nothing is flagged).
    b"GET /r0 HTTP/1.1\nHost: t\n\nPOST /r1 HTTP/1.1\nContent-Length: 3\nTransfer-Encoding: chunked\n\n0\r\n\r\n",
    b"POST /r0 HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding : chunked\r\n\r\nabc",
    // Obs-fold, and a bare CR in a head: hyper refuses both; the scanner
    // stops at the byte after the CR.
    b"POST /r0 HTTP/1.1\r\nX: a\r\n chunked\r\nContent-Length: 3\r\n\r\nabc",
    b"POST /r0 HTTP/1.1\r\nX: a\rContent-Length: 3\r\n\r\nabcGET /r1 HTTP/1.1\r\n\r\n",
    // Empty lines before and between pipelined requests.
    b"\r\n\nGET /r0 HTTP/1.1\r\n\r\n\r\n\nPOST /r1 HTTP/1.1\nContent-Length: 2\n\n\r\n\r\nGET /r2 HTTP/1.1\r\n\r\n",
    // An Upgrade head: the scanner stops, the connection closes after it.
    b"GET /r0 HTTP/1.1\r\nUpgrade: x\r\nContent-Length: 3\r\n\r\nabcGET /r1 HTTP/1.1\r\n\r\n",
];
