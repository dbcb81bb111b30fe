//! The framing module's fuzz oracle ([`limiter_tests::replay`]) on every
//! input kept: the fuzz target's seed corpus (`fuzz/corpus/framing`) and
//! every input the fuzzer or a generator ever found failing
//! (`fuzz/regressions/framing`), then on generated streams (requests of
//! every framing, with bytes flipped, cut at random), 2,000 a run unless
//! `PROPTEST_CASES` raises it. `cargo xtask fuzz` runs the target itself
//! under libFuzzer.

use std::path::Path;

use limiter_tests::replay::check;
use proptest::{
    prelude::*,
    test_runner::{Config, TestCaseError, TestRunner},
};

fn kept(dir: &str) -> Vec<(String, Vec<u8>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz").join(dir);
    let mut inputs: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| {
            let path = e.expect("a directory entry").path();
            (path.display().to_string(), std::fs::read(&path).expect("a kept input"))
        })
        .collect();
    inputs.sort();
    inputs
}

#[test]
fn every_kept_input_holds() {
    let inputs: Vec<_> = kept("corpus/framing").into_iter().chain(kept("regressions/framing")).collect();
    assert!(inputs.len() >= 20, "the seed corpus is there: {} inputs", inputs.len());
    let failures: Vec<String> = inputs
        .iter()
        .filter_map(|(name, input)| check(input).err().map(|e| format!("{name}: {e}")))
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A request of some framing, as bytes.
fn request() -> impl Strategy<Value = Vec<u8>> {
    let body = prop::collection::vec(any::<u8>(), 0..200);
    let head = prop::sample::select(
        &[
            "GET / HTTP/1.1\r\nHost: t\r\n",
            "POST /p?q=1 HTTP/1.1\r\nHost: t\r\nX-A: b\r\n",
            "PUT /u HTTP/1.0\r\n",
            "GET http://app.example/x HTTP/1.1\r\nHost: o\r\n",
            "POST /c HTTP/1.1\r\nHost: t\r\nConnection: keep-alive, x-a\r\nX-A: 1\r\n",
        ][..],
    );
    (head, body, 0u8..4, prop::collection::vec(1usize..50, 0..4)).prop_map(|(head, body, framing, chunks)| {
        let mut out = head.as_bytes().to_vec();
        match framing {
            0 => out.extend_from_slice(b"\r\n"),
            1 | 2 => {
                out.extend_from_slice(format!("Content-Length: {}\r\n\r\n", body.len()).as_bytes());
                out.extend_from_slice(&body);
            }
            _ => {
                out.extend_from_slice(b"Transfer-Encoding: chunked\r\n\r\n");
                let mut rest = &body[..];
                for size in chunks {
                    let n = size.min(rest.len());
                    out.extend_from_slice(format!("{n:X};e=1\r\n").as_bytes());
                    out.extend_from_slice(&rest[..n]);
                    out.extend_from_slice(b"\r\n");
                    rest = &rest[n..];
                }
                if !rest.is_empty() {
                    out.extend_from_slice(format!("{:x}\r\n", rest.len()).as_bytes());
                    out.extend_from_slice(rest);
                    out.extend_from_slice(b"\r\n");
                }
                out.extend_from_slice(b"0\r\nX-T: 1\r\n\r\n");
            }
        }
        out
    })
}

/// Pipelined requests, a few bytes of them replaced (by CR, LF, NUL,
/// space, `;` or anything), with the two bytes that choose the reads.
fn input() -> impl Strategy<Value = Vec<u8>> {
    let flip =
        (any::<prop::sample::Index>(), prop::sample::select(&[b'\r', b'\n', 0, b' ', b';', b'0', b'x'][..]));
    (any::<[u8; 2]>(), prop::collection::vec(request(), 1..4), prop::collection::vec(flip, 0..3)).prop_map(
        |(mode, requests, flips)| {
            let mut stream: Vec<u8> = requests.concat();
            for (at, byte) in flips {
                let i = at.index(stream.len());
                stream[i] = byte;
            }
            let mut input = mode.to_vec();
            input.extend_from_slice(&stream);
            input
        },
    )
}

#[test]
fn generated_inputs_hold() {
    let cases = std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(0).max(2000);
    let mut runner = TestRunner::new(Config { cases, failure_persistence: None, ..Config::default() });
    if let Err(e) = runner.run(&input(), |i| check(&i).map_err(TestCaseError::fail)) {
        panic!("a generated input fails (shrunk; keep it in fuzz/regressions/framing):\n{e}");
    }
}
