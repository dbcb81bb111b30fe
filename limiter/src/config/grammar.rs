//! The file's grammar, knowing nothing of keys: `key = value` lines, flat
//! dotted keys, `[section]` headers that prefix the keys under them, `#`
//! and `;` comments (at the start of a line or after blank space), and no
//! key twice.

use std::collections::HashMap;

use super::ConfigError;

/// One `key = value` line, with the section prefix applied.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Entry<'a> {
    pub line: usize,
    pub key: String,
    pub value: &'a str,
}

/// The entries of `text` (from a file called `file`), or the first line
/// that breaks the grammar.
pub(super) fn entries<'a>(text: &'a str, file: &str) -> Result<Vec<Entry<'a>>, ConfigError> {
    let mut out: Vec<Entry<'a>> = Vec::new();
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut section = String::new();
    for (index, raw) in text.lines().enumerate() {
        let line = index + 1;
        let err = |key: Option<&str>, message: String| ConfigError::at(file, line, key, None, message);
        let content = strip_comment(raw).trim();
        // Until a line has read as `key = value`, the file may be no
        // configuration at all (a symlink to /etc/shadow): a line that
        // breaks the grammar is named by its number, not quoted.
        let quoted = |what: &str| {
            if out.is_empty() && section.is_empty() {
                format!("{what} (not quoted: nothing before it reads as a configuration)")
            } else {
                format!("{what}, found `{content}`")
            }
        };
        if content.is_empty() {
            continue;
        }
        if let Some(header) = content.strip_prefix('[') {
            let inner = header.strip_suffix(']').map(str::trim);
            match inner {
                Some(inner) if !inner.is_empty() && !inner.contains(char::is_whitespace) => {
                    section = inner.to_owned();
                    continue;
                }
                _ => return Err(err(None, quoted("malformed section header"))),
            }
        }
        let Some((key, value)) = content.split_once('=') else {
            return Err(err(None, quoted("expected `key = value`")));
        };
        let (key, value) = (key.trim(), value.trim());
        if key.is_empty() || key.contains(char::is_whitespace) {
            return Err(err(None, quoted("malformed key")));
        }
        let key = if section.is_empty() { key.to_owned() } else { format!("{section}.{key}") };
        if let Some(first) = seen.insert(key.clone(), line) {
            return Err(err(Some(&key), format!("given twice (first at line {first})")));
        }
        out.push(Entry { line, key, value });
    }
    Ok(out)
}

/// Drops a `#` or `;` comment: at the start of the line, or after blank
/// space (so `postgres://x;y` keeps its `;`).
fn strip_comment(line: &str) -> &str {
    let bytes = line.as_bytes();
    for (i, &b) in bytes.iter().enumerate() {
        if (b == b'#' || b == b';') && (i == 0 || bytes[i - 1].is_ascii_whitespace()) {
            return &line[..i];
        }
    }
    line
}
