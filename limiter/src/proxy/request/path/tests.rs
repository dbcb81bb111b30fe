use proptest::prelude::*;

use super::*;

/// Every rule of the module doc, with the path the servers resolve.
const CASES: &[(&str, bool)] = &[
    // Plain paths.
    ("/debug/pprof", true),
    ("/debug/", true),
    ("/debug/a.b/c..d", true),
    ("/debug/x/", true),
    ("/debug", false),
    ("/debugx", false),
    ("/debugx/y", false),
    ("/api/debug/x", false),
    ("/DEBUG/x", false),
    ("/", false),
    ("", false),
    ("*", false),
    ("debug/x", false),
    // Parameters are cut off every segment.
    ("/debug;v=1/x", true),
    ("/debug;/x", true),
    ("/debug/x;jsessionid=1", true),
    ("/debug;v=1", false),
    ("/debug/..;/api", false),
    ("/debug/..;x=1/api", false),
    ("/api/..;/debug/x", true),
    ("/api/.;/x", false),
    ("/;x/debug/x", false),
    ("/debug/;x/y", false),
    ("/debug/;x", true),
    // Dot-segments resolve (RFC 3986 §5.2.4).
    ("/debug/../api", false),
    ("/debug/./x", true),
    ("/debug/.", true),
    ("/debug/..", false),
    ("/debug/x/..", true),
    ("/debug/x/../..", false),
    ("/debug/x/../../debug/y", true),
    ("/api/../debug/x", true),
    ("/api/../debug", false),
    ("/./debug/x", true),
    ("/x/../debug/", true),
    // Escapes decode: dots, letters.
    ("/debug/%2e%2e/api", false),
    ("/debug/%2E%2E/api", false),
    ("/debug/.%2e/api", false),
    ("/api/%2e%2e/debug/x", true),
    ("/debug/%2e/x", true),
    ("/debug/a%2eb", true),
    ("/%64ebug/x", true),
    ("/%64%65%62%75%67/x", true),
    ("/debug%2fx", false),
    // Ambiguous: always normal.
    ("/debug/x%2Fy", false),
    ("/debug/x%2fy", false),
    ("/debug/%5c", false),
    ("/debug/x\\y", false),
    ("/debug/x%3by", false),
    ("/debug/..%3b/api", false),
    ("/debug%3bv=1/x", false),
    ("/debug/%252e", false),
    ("/debug/%00", false),
    ("/debug/%0a", false),
    ("/debug/%7f", false),
    ("/debug/%zz", false),
    ("/debug/%2", false),
    ("/debug/%", false),
    ("/debug/%+f", false),
    ("/debug/x%", false),
    ("/debug//x", false),
    ("//debug/x", false),
    ("/api//../debug/x", false),
    ("/..", false),
    ("/../debug/x", false),
    ("/debug/../../debug/x", false),
    ("/%2e%2e/debug/x", false),
    // Escapes of other bytes are fine.
    ("/debug/%20x", true),
    ("/debug/%c3%a9", true),
    ("/debug/%41", true),
];

#[test]
fn paths_are_diagnostic_as_the_servers_resolve_them() {
    let wrong: Vec<String> = CASES
        .iter()
        .filter(|(path, debug)| is_debug_path(path) != *debug)
        .map(|(path, debug)| format!("{path}: want {}", if *debug { "diagnostic" } else { "normal" }))
        .collect();
    assert!(wrong.is_empty(), "{wrong:#?}");
}

#[test]
fn the_oracle_agrees_with_the_table() {
    for (path, debug) in CASES {
        assert_eq!(oracle(path), *debug, "{path}");
    }
}

/// A second, independent implementation of the rule: decode every
/// segment into a string, then run RFC 3986 §5.2.4's buffer algorithm on
/// it behind a sentinel segment (a climb above the root eats the sentinel).
fn oracle(path: &str) -> bool {
    let Some(rest) = path.strip_prefix('/') else {
        return false;
    };
    if path.contains('\\') {
        return false;
    }
    let segments: Vec<&str> = rest.split('/').collect();
    let mut decoded: Vec<u8> = b"/\0".to_vec();
    for (i, segment) in segments.iter().enumerate() {
        let name = segment.split(';').next().unwrap_or_default();
        let Some(name) = percent_decode(name) else {
            return false;
        };
        if name.is_empty() && i + 1 < segments.len() {
            return false;
        }
        decoded.push(b'/');
        decoded.extend(name);
    }
    let out = remove_dot_segments(&decoded);
    out.strip_prefix(b"/\0").is_some_and(|p| p.starts_with(b"/debug/"))
}

fn percent_decode(s: &str) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    let mut bytes = s.bytes();
    while let Some(b) = bytes.next() {
        if b != b'%' {
            out.push(b);
            continue;
        }
        let hex: String = [bytes.next()?, bytes.next()?].iter().map(|&b| char::from(b)).collect();
        if !hex.chars().all(|c| c.is_ascii_hexdigit()) {
            return None;
        }
        let d = u8::from_str_radix(&hex, 16).ok()?;
        if b"/\\;%".contains(&d) || d < 0x20 || d == 0x7f {
            return None;
        }
        out.push(d);
    }
    Some(out)
}

/// RFC 3986 §5.2.4, step by step.
fn remove_dot_segments(input: &[u8]) -> Vec<u8> {
    let mut input = input.to_vec();
    let mut output: Vec<u8> = Vec::new();
    let pop = |output: &mut Vec<u8>| {
        let cut = output.iter().rposition(|&b| b == b'/').unwrap_or(0);
        output.truncate(cut);
    };
    while !input.is_empty() {
        if input.starts_with(b"../") {
            input.drain(..3);
        } else if input.starts_with(b"./") || input.starts_with(b"/./") {
            input.drain(..2);
        } else if input == b"/." {
            input = b"/".to_vec();
        } else if input.starts_with(b"/../") {
            input.drain(..3);
            pop(&mut output);
        } else if input == b"/.." {
            input = b"/".to_vec();
            pop(&mut output);
        } else if input == b"." || input == b".." {
            input.clear();
        } else {
            let start = usize::from(input[0] == b'/');
            let end = input[start..].iter().position(|&b| b == b'/').map_or(input.len(), |p| p + start);
            output.extend(input.drain(..end));
        }
    }
    output
}

/// Fragments that make the interesting paths.
fn fragment() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec![
        "/", "/", "/", "debug", "debug", "api", "x", ".", "..", ";", ";v=1", "%2e", "%2E", "%2f", "%3b",
        "%5c", "%25", "%64", "%", "%2", "%zz", "%00", "\\", "e",
    ])
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(20_000))]

    #[test]
    fn crafted_paths_classify_as_the_rfc_resolves_them(
        parts in prop::collection::vec(fragment(), 0..14),
        rooted in prop::bool::weighted(0.9),
    ) {
        let path = format!("{}{}", if rooted { "/" } else { "" }, parts.concat());
        prop_assert_eq!(is_debug_path(&path), oracle(&path), "{}", path);
        prop_assert_eq!(debug_by_prefix(&path), is_debug_path(&path), "{}", path);
    }

    #[test]
    fn any_path_classifies_without_panicking(path in "\\PC{0,64}") {
        prop_assert_eq!(is_debug_path(&path), oracle(&path), "{}", path);
        prop_assert_eq!(debug_by_prefix(&path), is_debug_path(&path), "{}", path);
    }

    #[test]
    fn a_path_under_debug_without_dots_or_escapes_stays_diagnostic(rest in "[a-z0-9_-]{1,8}(/[a-z0-9_.-]{1,8}){0,4}") {
        let path = format!("/debug/{rest}");
        prop_assume!(!path.split('/').any(|s| s == "." || s == ".."));
        prop_assert!(is_debug_path(&path), "{}", path);
    }
}

/// `/debug/` as a critical prefix: the rule of `http.critical` and
/// `http.sheddable`.
fn debug_by_prefix(path: &str) -> bool {
    class_of(path, &["/debug/".to_owned()], &[]) == Class::Critical
}

#[test]
fn a_prefix_matches_the_normalised_path_exactly_as_debug_is_matched() {
    for (path, debug) in CASES {
        assert_eq!(debug_by_prefix(path), *debug, "{path}");
    }
}

#[test]
fn classes_are_critical_first_then_sheddable_and_ambiguous_paths_are_normal() {
    let critical = ["/api/pay/".to_owned(), "/health".to_owned()];
    let sheddable = ["/api/".to_owned(), "/search".to_owned()];
    let cases = [
        ("/api/pay/charge", Class::Critical),
        ("/api/%70ay/charge", Class::Critical),
        ("/api/x/../pay/charge", Class::Critical),
        ("/api/pay;v=1/charge", Class::Critical),
        ("/api/payments", Class::Sheddable),
        ("/api/other", Class::Sheddable),
        ("/healthz", Class::Critical),
        ("/search?q=1", Class::Sheddable),
        ("/api/pay/../../search", Class::Sheddable),
        ("/other", Class::Normal),
        ("/api%2Fpay/charge", Class::Normal),
        ("/api//pay/charge", Class::Normal),
        ("/../api/pay/x", Class::Normal),
    ];
    for (path, class) in cases {
        let path = path.split('?').next().unwrap_or_default();
        assert_eq!(class_of(path, &critical, &sheddable), class, "{path}");
    }
    assert_eq!(class_of("/api/pay/x", &[], &[]), Class::Normal, "nothing configured: all normal");
    assert_eq!(normalised("/a/./b/../c/"), Some(b"/a/c/".to_vec()));
    assert_eq!(normalised("/a/b/.."), Some(b"/a/".to_vec()));
    assert_eq!(normalised("/"), Some(b"/".to_vec()));
}
