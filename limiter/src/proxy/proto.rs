//! How a client connection speaks: the four ways in, as the access log,
//! the metrics and the forwarding headers name them.

/// The protocol of a client connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proto {
    /// HTTP/1.x in cleartext on `http.listen`.
    H1,
    /// HTTP/1.1 on `http.tls.listen` (ALPN `http/1.1`, or none).
    H1Tls,
    /// HTTP/2 on `http.tls.listen` (ALPN `h2`).
    H2Tls,
    /// Prior-knowledge cleartext HTTP/2 on `http.listen` (`http.h2c`).
    H2c,
}

impl Proto {
    /// Every protocol, in the order metrics list them.
    pub const ALL: [Proto; 4] = [Proto::H1, Proto::H1Tls, Proto::H2Tls, Proto::H2c];

    /// The `proto` label and access-log field.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::H1 => "h1",
            Self::H1Tls => "h1+tls",
            Self::H2Tls => "h2+tls",
            Self::H2c => "h2c",
        }
    }

    /// The scheme the forwarding headers tell the upstream.
    pub fn scheme(self) -> &'static str {
        match self {
            Self::H1 | Self::H2c => "http",
            Self::H1Tls | Self::H2Tls => "https",
        }
    }

    /// Its place in [`Proto::ALL`] and in the counters.
    pub fn index(self) -> usize {
        self as usize
    }
}
