//! The framing module under libFuzzer (`cargo xtask fuzz`): whatever a
//! client sends, the bytes limiter would forward read, strictly and
//! leniently alike, as exactly the requests it admitted
//! (`limiter_tests::replay`).
#![no_main]

libfuzzer_sys::fuzz_target!(|input: &[u8]| {
    if let Err(why) = limiter_tests::replay::check(input) {
        panic!("{why}");
    }
});
