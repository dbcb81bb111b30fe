//! Which requests are diagnostic: a request is a `/debug/` one when its
//! path, resolved the way Jetty, Tomcat and Spring resolve it, starts with
//! `/debug/`. The path forwarded upstream is never changed; this
//! normalisation is for classification only.
//!
//! The rule, segment by segment (`/` separates them):
//! - a `;` ends the segment's name: `debug;v=1` is `debug`, `..;x` is `..`;
//! - percent escapes are decoded (`%2e` is `.`, `%64ebug` is `debug`);
//! - dot-segments are resolved (RFC 3986 §5.2.4): `.` stays, `..` climbs.
//!
//! A path the servers could resolve differently is *ambiguous* and always
//! normal: an encoded `/`, `\`, `;` or `%` (is it a separator, a parameter,
//! a second escape?), an encoded control byte, an invalid or truncated
//! escape (`%zz`, `%2`), a raw backslash, an empty segment before the last
//! one (Tomcat merges `//`, Jetty keeps it), and a `..` climbing above the
//! root (rejected or clamped, depending on the server). Normal is the safe
//! default: a diagnostic request skips the session and web limits, may take
//! a reserved slot and passes an open breaker.
//!
//! Nothing is allocated: only the depth of the resolved path and whether
//! its first segment is `debug` matter, and a `..` back to the root makes
//! the next segment the first one.

use crate::admission::Class;

/// Whether `path` (a request target's path, without the query) is a
/// diagnostic one.
pub fn is_debug_path(path: &str) -> bool {
    let Some(rest) = path.as_bytes().strip_prefix(b"/") else {
        return false;
    };
    if rest.contains(&b'\\') {
        return false;
    }
    // The resolved path so far: how many segments, and whether the first
    // is `debug`.
    let (mut depth, mut first_is_debug) = (0usize, false);
    let mut segments = rest.split(|&b| b == b'/').peekable();
    while let Some(raw) = segments.next() {
        let last = segments.peek().is_none();
        let name = raw.split(|&b| b == b';').next().unwrap_or_default();
        let Some(name) = Name::decode(name) else {
            return false;
        };
        match name {
            Name::Dot => {}
            Name::DotDot if depth == 0 => return false,
            Name::DotDot => depth -= 1,
            Name::Empty if !last => return false,
            Name::Empty | Name::Debug | Name::Other => {
                if depth == 0 {
                    first_is_debug = name == Name::Debug;
                }
                depth += 1;
            }
        }
        // A final `.` or `..` leaves a trailing slash: `/debug/x/..` is
        // `/debug/`.
        if last && matches!(name, Name::Dot | Name::DotDot) {
            if depth == 0 {
                first_is_debug = false;
            }
            depth += 1;
        }
    }
    first_is_debug && depth >= 2
}

/// The path as the servers resolve it, by the rule above: `/` and the
/// resolved segments joined by `/`, ending with `/` when the path does
/// (or ends with a dot-segment); `None` if it is ambiguous. Critical and
/// sheddable prefixes are matched against this (it allocates: only done
/// when some are configured); [`is_debug_path`] is
/// `normalised(p).starts_with("/debug/")` without the allocation, which
/// the tests check.
pub fn normalised(path: &str) -> Option<Vec<u8>> {
    let rest = path.as_bytes().strip_prefix(b"/")?;
    if rest.contains(&b'\\') {
        return None;
    }
    let mut resolved: Vec<Vec<u8>> = Vec::new();
    let mut trailing = false;
    let mut segments = rest.split(|&b| b == b'/').peekable();
    while let Some(raw) = segments.next() {
        let last = segments.peek().is_none();
        let name = raw.split(|&b| b == b';').next().unwrap_or_default();
        let decoded = decode(name)?;
        trailing = false;
        match decoded.as_slice() {
            b"." => trailing = last,
            b".." => {
                resolved.pop()?;
                trailing = last;
            }
            b"" if !last => return None,
            b"" => trailing = true,
            _ => resolved.push(decoded),
        }
    }
    let mut out = Vec::with_capacity(path.len());
    for segment in &resolved {
        out.push(b'/');
        out.extend_from_slice(segment);
    }
    if trailing || resolved.is_empty() {
        out.push(b'/');
    }
    Some(out)
}

/// A segment's name with its escapes decoded; `None` for an ambiguous
/// escape ([`unescape`]).
fn decode(raw: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        if raw[i] == b'%' {
            out.push(unescape(raw, i)?);
            i += 3;
        } else {
            out.push(raw[i]);
            i += 1;
        }
    }
    Some(out)
}

/// A request's class: critical if its normalised path starts with one of
/// `critical`, else sheddable if with one of `sheddable`, else normal (an
/// ambiguous path too, as for `/debug/`).
pub fn class_of(path: &str, critical: &[String], sheddable: &[String]) -> Class {
    if critical.is_empty() && sheddable.is_empty() {
        return Class::Normal;
    }
    let Some(p) = normalised(path) else {
        return Class::Normal;
    };
    let starts = |prefixes: &[String]| prefixes.iter().any(|x| p.starts_with(x.as_bytes()));
    if starts(critical) {
        Class::Critical
    } else if starts(sheddable) {
        Class::Sheddable
    } else {
        Class::Normal
    }
}

/// A segment's name after decoding, as far as classification cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Name {
    Empty,
    Dot,
    DotDot,
    Debug,
    Other,
}

impl Name {
    /// Decodes a segment's name (its parameters already cut off); `None`
    /// if it is ambiguous.
    fn decode(raw: &[u8]) -> Option<Self> {
        // The first bytes decoded, enough to tell the names above apart.
        let mut head = [0u8; 6];
        let mut len = 0usize;
        let mut i = 0;
        while i < raw.len() {
            let byte = if raw[i] == b'%' {
                i += 3;
                unescape(raw, i - 3)?
            } else {
                i += 1;
                raw[i - 1]
            };
            if let Some(slot) = head.get_mut(len) {
                *slot = byte;
            }
            len += 1;
        }
        Some(match head.get(..len) {
            Some(b"") => Self::Empty,
            Some(b".") => Self::Dot,
            Some(b"..") => Self::DotDot,
            Some(b"debug") => Self::Debug,
            _ => Self::Other,
        })
    }
}

/// The byte of the escape at `raw[i]` (a `%`), or `None` when it is
/// invalid, truncated or ambiguous: an encoded `/`, `\\`, `;`, `%` or
/// control byte.
fn unescape(raw: &[u8], i: usize) -> Option<u8> {
    let byte = (hex(*raw.get(i + 1)?)? << 4) | hex(*raw.get(i + 2)?)?;
    (!matches!(byte, b'/' | b'\\' | b';' | b'%') && !byte.is_ascii_control()).then_some(byte)
}

fn hex(digit: u8) -> Option<u8> {
    char::from(digit).to_digit(16).map(|d| d as u8)
}

#[cfg(test)]
mod tests;
