//! A bad file: where, which key, what was wrong.

use std::fmt;

/// A configuration error: where, which key, what was wrong.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct ConfigError {
    /// The file (or `<config>` for text without a file).
    pub file: String,
    /// 1-based line; 0 when the error is about the file as a whole.
    pub line: usize,
    /// The full dotted key, when the error is about one.
    pub key: Option<String>,
    /// The value as written, when the error is about one.
    pub value: Option<String>,
    pub message: String,
}

impl ConfigError {
    pub(super) fn at(
        file: &str,
        line: usize,
        key: Option<&str>,
        value: Option<&str>,
        message: String,
    ) -> Self {
        Self {
            file: file.to_owned(),
            line,
            key: key.map(str::to_owned),
            value: value.map(str::to_owned),
            message,
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file)?;
        if self.line > 0 {
            write!(f, ":{}", self.line)?;
        }
        match (&self.key, &self.value) {
            (Some(k), Some(v)) => write!(f, ": {k} = {v}")?,
            (Some(k), None) => write!(f, ": {k}")?,
            _ => {}
        }
        write!(f, ": {}", self.message)
    }
}
