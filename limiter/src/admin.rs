//! The admin listener (`admin.listen`, loopback by default): `GET /metrics`
//! (Prometheus text), `GET /status` (JSON, what `limiter dump` adds when
//! the daemon runs), `GET /healthz` (503 while draining), `POST /reload`,
//! and the breaker override: `GET /breaker`, `POST /breaker/open`,
//! `POST /breaker/close`, `POST /breaker/auto`.
//!
//! With `admin.tokenFile`, every path but `/healthz` (which probes must
//! reach and which tells nothing) requires `Authorization: Bearer TOKEN`.

use std::{convert::Infallible, sync::Arc};

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, Request, Response, StatusCode, body::Incoming, header, service::service_fn};
use hyper_util::rt::TokioIo;
use tokio::{net::TcpListener, sync::watch};

use crate::{breaker::Mode, daemon::State};

type Body = Full<Bytes>;

/// Serves until `shutdown` turns true. Connections are short; each runs on
/// its own task.
pub async fn serve(listener: TcpListener, state: Arc<State>, mut shutdown: watch::Receiver<bool>) {
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let state = state.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |req| handle(req, state.clone()));
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
            _ = shutdown.changed() => return,
        }
    }
}

/// Whether `req` carries the configured token (compared in constant time).
fn authorized(req: &Request<Incoming>, state: &State) -> bool {
    let Some(token) = state.admin_token() else { return true };
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    let (a, b) = (given.as_bytes(), token.0.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn handle(req: Request<Incoming>, state: Arc<State>) -> Result<Response<Body>, Infallible> {
    if req.uri().path() != "/healthz" && !authorized(&req, &state) {
        let mut response =
            reply(StatusCode::UNAUTHORIZED, "text/plain", "a bearer token is required\n".into());
        response
            .headers_mut()
            .insert(header::WWW_AUTHENTICATE, header::HeaderValue::from_static("Bearer realm=\"limiter\""));
        return Ok(response);
    }
    let response = match (req.method(), req.uri().path()) {
        (&Method::GET, "/metrics") => match state.metrics() {
            Ok(text) => reply(StatusCode::OK, "text/plain; version=0.0.4; charset=utf-8", text),
            Err(e) => reply(StatusCode::INTERNAL_SERVER_ERROR, "text/plain", format!("{e}\n")),
        },
        (&Method::GET, "/status") => match state.status() {
            Ok(json) => reply(StatusCode::OK, "application/json", json.to_string()),
            Err(e) => reply(StatusCode::INTERNAL_SERVER_ERROR, "text/plain", format!("{e}\n")),
        },
        (&Method::GET, "/healthz") => {
            if state.draining.load(std::sync::atomic::Ordering::Relaxed) {
                reply(StatusCode::SERVICE_UNAVAILABLE, "text/plain", "draining\n".into())
            } else {
                reply(StatusCode::OK, "text/plain", "ok\n".into())
            }
        }
        (&Method::POST, "/reload") => {
            let state = state.clone();
            match tokio::task::spawn_blocking(move || state.reload()).await {
                Ok(Ok(changes)) => reply(
                    StatusCode::OK,
                    "application/json",
                    serde_json::json!({ "applied": true, "changes": changes }).to_string(),
                ),
                Ok(Err(why)) => reply(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "application/json",
                    serde_json::json!({ "applied": false, "error": why }).to_string(),
                ),
                Err(e) => reply(StatusCode::INTERNAL_SERVER_ERROR, "text/plain", format!("reload: {e}\n")),
            }
        }
        (&Method::GET, "/breaker") => {
            reply(StatusCode::OK, "application/json", state.breaker(None).to_string())
        }
        (&Method::POST, "/breaker/open") => {
            reply(StatusCode::OK, "application/json", state.breaker(Some(Mode::ForcedOpen)).to_string())
        }
        (&Method::POST, "/breaker/close") => {
            reply(StatusCode::OK, "application/json", state.breaker(Some(Mode::ForcedClosed)).to_string())
        }
        (&Method::POST, "/breaker/auto") => {
            reply(StatusCode::OK, "application/json", state.breaker(Some(Mode::Auto)).to_string())
        }
        (_, "/metrics" | "/status" | "/healthz" | "/breaker") => {
            reply(StatusCode::METHOD_NOT_ALLOWED, "text/plain", "GET only\n".into())
        }
        (_, "/breaker/open" | "/breaker/close" | "/breaker/auto" | "/reload") => {
            reply(StatusCode::METHOD_NOT_ALLOWED, "text/plain", "POST only\n".into())
        }
        _ => reply(
            StatusCode::NOT_FOUND,
            "text/plain",
            "not found: try /metrics, /status or /healthz\n".into(),
        ),
    };
    Ok(response)
}

fn reply(status: StatusCode, content_type: &'static str, body: String) -> Response<Body> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(header::CONTENT_TYPE, header::HeaderValue::from_static(content_type));
    response
}
