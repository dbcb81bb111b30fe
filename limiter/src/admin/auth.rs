//! The admin bearer token (`admin.tokenFile`).

use hyper::{Request, header};

use crate::config::Secret;

/// Whether `req` carries `token` (`None`: no token is required), compared
/// in constant time.
pub fn authorized<B>(req: &Request<B>, token: Option<&Secret>) -> bool {
    let Some(token) = token else { return true };
    let given =
        req.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(bearer).unwrap_or("");
    let (a, b) = (given.as_bytes(), token.0.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The credentials of a `Bearer` authorization: the scheme is
/// case-insensitive and one or more spaces follow it (RFC 9110 §11.1,
/// §11.4).
fn bearer(value: &str) -> Option<&str> {
    let (scheme, rest) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| rest.trim_start_matches(' '))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(auth: Option<&str>) -> Request<()> {
        let mut b = Request::builder();
        if let Some(a) = auth {
            b = b.header(header::AUTHORIZATION, a);
        }
        b.body(()).unwrap()
    }

    #[test]
    fn only_the_exact_bearer_token_passes() {
        let token = Secret("0123456789abcdef".into());
        assert!(authorized(&req(None), None));
        for good in ["Bearer 0123456789abcdef", "bearer 0123456789abcdef", "BEARER  0123456789abcdef"] {
            assert!(authorized(&req(Some(good)), Some(&token)), "{good}");
        }
        for bad in [
            None,
            Some("Bearer 0123456789abcde"),
            Some("Bearer 0123456789abcdefg"),
            Some("Basic 0123456789abcdef"),
            Some("Bearer0123456789abcdef"),
            Some("0123456789abcdef"),
        ] {
            assert!(!authorized(&req(bad), Some(&token)), "{bad:?}");
        }
    }
}
