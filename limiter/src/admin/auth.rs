//! The admin bearer token (`admin.tokenFile`).

use hyper::{Request, header};

use crate::config::Secret;

/// Whether `req` carries `token` (`None`: no token is required), compared
/// in constant time.
pub fn authorized<B>(req: &Request<B>, token: Option<&Secret>) -> bool {
    let Some(token) = token else { return true };
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    let (a, b) = (given.as_bytes(), token.0.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
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
        assert!(authorized(&req(Some("Bearer 0123456789abcdef")), Some(&token)));
        for bad in
            [None, Some("Bearer 0123456789abcde"), Some("bearer 0123456789abcdef"), Some("0123456789abcdef")]
        {
            assert!(!authorized(&req(bad), Some(&token)), "{bad:?}");
        }
    }
}
