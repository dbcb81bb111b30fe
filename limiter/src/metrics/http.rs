//! The HTTP proxy's families.

use std::sync::atomic::Ordering;

use super::Page;
use crate::{
    access_log,
    admission::{self, Refusal},
    proxy::{
        Counters, Reason,
        counters::HANDSHAKES,
        error::{BodyTimeout, Kind},
        h2::meter::Flood,
        h2::reset_groups::ResetGroups,
        proto::Proto,
        request::head::Bad,
        upstream::{
            Upstreams,
            abandon::{Cause, End},
        },
    },
};

/// The front door's families: connections and requests by protocol, TLS
/// handshakes, HTTP/2 refusals and floods, the access log.
pub fn write_front_door(page: &mut Page, c: &Counters, log: &access_log::Stats) {
    let load = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
    page.family(
        "limiter_http_protocol_connections_total",
        "counter",
        "Client connections served, by protocol (after the TLS handshake).",
    );
    for proto in Proto::ALL {
        page.sample(
            "limiter_http_protocol_connections_total",
            &[("proto", proto.as_str())],
            c.connections_by_proto[proto.index()].load(Ordering::Relaxed),
        );
    }
    page.family(
        "limiter_http_requests_total",
        "counter",
        "Requests received (HTTP/2: streams), by protocol.",
    );
    for proto in Proto::ALL {
        page.sample(
            "limiter_http_requests_total",
            &[("proto", proto.as_str())],
            c.requests_by_proto[proto.index()].load(Ordering::Relaxed),
        );
    }
    page.family(
        "limiter_tls_handshakes_total",
        "counter",
        "TLS handshakes, by result: ok or the cause of failure.",
    );
    for (i, result) in HANDSHAKES.iter().enumerate() {
        page.sample("limiter_tls_handshakes_total", &[("result", result)], load(&c.tls_handshakes[i]));
    }
    page.family(
        "limiter_http2_streams_refused_total",
        "counter",
        "HTTP/2 streams answered 503 (the connection stays open).",
    )
    .sample("limiter_http2_streams_refused_total", &[], load(&c.h2_streams_refused));
    page.family(
        "limiter_http2_floods_total",
        "counter",
        "HTTP/2 connections cut for a flood of frames that carry no request, by frame.",
    );
    for flood in Flood::ALL {
        page.sample(
            "limiter_http2_floods_total",
            &[("frame", flood.as_str())],
            load(&c.h2_floods[flood.index()]),
        );
    }
    page.family(
        "limiter_http2_reset_goaways_total",
        "counter",
        "HTTP/2 connections h2 ended with GOAWAY ENHANCE_YOUR_CALM for excessive stream resets.",
    )
    .sample("limiter_http2_reset_goaways_total", &[], load(&c.h2_reset_goaways));
    page.family(
        "limiter_http2_idle_closed_total",
        "counter",
        "HTTP/2 connections closed (GOAWAY) after http.idleTimeoutMs without a stream.",
    )
    .sample("limiter_http2_idle_closed_total", &[], load(&c.h2_idle_closed));
    page.family("limiter_access_log_lines_total", "counter", "Access log lines written.").sample(
        "limiter_access_log_lines_total",
        &[],
        load(&log.written),
    );
    page.family(
        "limiter_access_log_dropped_total",
        "counter",
        "Access log lines dropped: the queue was full (a slow or blocked file) or no file was open.",
    )
    .sample("limiter_access_log_dropped_total", &[], load(&log.dropped));
    page.family("limiter_access_log_write_errors_total", "counter", "Access log lines the file refused.")
        .sample("limiter_access_log_write_errors_total", &[], load(&log.write_errors));
}

/// The client groups refused at accept for their connections' resets.
pub fn write_reset_groups(page: &mut Page, g: &ResetGroups) {
    page.family(
        "limiter_http2_reset_groups_refused",
        "gauge",
        "Client groups refused at accept now: their HTTP/2 connections kept ending for stream resets.",
    )
    .sample("limiter_http2_reset_groups_refused", &[], g.refused_now());
    page.family(
        "limiter_http2_reset_group_refusals_total",
        "counter",
        "Times a client group started being refused at accept for its connections' stream resets.",
    )
    .sample("limiter_http2_reset_group_refusals_total", &[], g.groups_refused.load(Ordering::Relaxed));
    page.family(
        "limiter_http_connections_refused_for_resets_total",
        "counter",
        "Client connections closed at accept (RST) because their group was refused for stream resets.",
    )
    .sample(
        "limiter_http_connections_refused_for_resets_total",
        &[],
        g.refused_connections.load(Ordering::Relaxed),
    );
}

/// The upstream connections: open and connecting against their cap,
/// connects by result, requests finished for clients that went away.
pub fn write_upstreams(page: &mut Page, u: &Upstreams) {
    let load = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
    let connecting = u.connecting();
    page.family(
        "limiter_http_upstream_connections",
        "gauge",
        "Upstream connections, every worker's, by state (connecting, established).",
    )
    .sample("limiter_http_upstream_connections", &[("state", "connecting")], connecting)
    .sample(
        "limiter_http_upstream_connections",
        &[("state", "established")],
        u.open().saturating_sub(connecting),
    );
    page.family(
        "limiter_http_upstream_connection_limit",
        "gauge",
        "The cap on upstream connections open or connecting (http.maxUpstreamConnections, or http.maxThreads).",
    )
    .sample("limiter_http_upstream_connection_limit", &[], u.limit());
    page.family("limiter_http_upstream_connects_total", "counter", "Connects to the upstream, by result.")
        .sample("limiter_http_upstream_connects_total", &[("result", "ok")], load(&u.connects_ok))
        .sample("limiter_http_upstream_connects_total", &[("result", "error")], load(&u.connects_failed));
    page.family(
        "limiter_http_abandoned_total",
        "counter",
        "Requests limiter gave up on while the upstream still worked on them (cause: timeout, a 504; client_gone; client_body, an upload that failed half-way), followed holding their permits until the upstream was done (end: answered, closed) or http.upstreamAbandonMs passed (end: bound).",
    );
    for cause in Cause::ALL {
        for end in End::ALL {
            page.sample(
                "limiter_http_abandoned_total",
                &[("cause", cause.as_str()), ("end", end.as_str())],
                u.abandoned.count(cause, end),
            );
        }
    }
    page.family(
        "limiter_http_abandoned_in_flight",
        "gauge",
        "Requests limiter gave up on that the upstream is still working on now, holding their permits.",
    )
    .sample("limiter_http_abandoned_in_flight", &[], load(&u.abandoned.now));
    page.family(
        "limiter_http_upstream_retries_total",
        "counter",
        "Requests sent again on another connection: idempotent, their body in memory, a pooled connection that closed before any byte of the response.",
    )
    .sample("limiter_http_upstream_retries_total", &[], load(&u.retries));
    page.family(
        "limiter_http_upstream_borrowed_total",
        "counter",
        "Requests that found the cap reached and took an idle connection of another worker's pool.",
    )
    .sample("limiter_http_upstream_borrowed_total", &[], load(&u.borrowed));
}

/// Writes the proxy's families: admission's pools and refusals (with the
/// breaker's refusals, counted by the proxy), responses, upstream errors,
/// bad requests, connections, latencies.
pub fn write(page: &mut Page, a: &admission::Snapshot, c: &Counters, buffered_bytes: u64) {
    page.family("limiter_http_in_flight", "gauge", "Requests holding a permit, by pool.")
        .sample("limiter_http_in_flight", &[("pool", "normal")], a.normal_in_use)
        .sample("limiter_http_in_flight", &[("pool", "debug")], a.debug_in_use)
        .sample("limiter_http_in_flight", &[("pool", "web")], a.web_in_use);
    let peer = a.peer_in_use.unwrap_or_default();
    page.family(
        "limiter_http_handover_peer_in_flight",
        "gauge",
        "Permits held by the other daemon serving the same gate during a handover, by pool (counted against this daemon's pools too).",
    )
    .sample("limiter_http_handover_peer_in_flight", &[("pool", "normal")], peer[0])
    .sample("limiter_http_handover_peer_in_flight", &[("pool", "debug")], peer[1])
    .sample("limiter_http_handover_peer_in_flight", &[("pool", "web")], peer[2]);
    page.family(
        "limiter_http_handover_peer",
        "gauge",
        "1 while another daemon serves the same gate (a handover in progress).",
    )
    .sample("limiter_http_handover_peer", &[], u32::from(a.peer_in_use.is_some()));
    page.family("limiter_http_pool_limit", "gauge", "Configured size of each pool (0 = unlimited); the normal pool's is the ceiling of an adaptive limit.")
        .sample("limiter_http_pool_limit", &[("pool", "normal")], a.normal_ceiling)
        .sample("limiter_http_pool_limit", &[("pool", "debug")], a.debug_limit)
        .sample("limiter_http_pool_limit", &[("pool", "web")], a.web_limit)
        .sample("limiter_http_pool_limit", &[("pool", "session")], a.session_limit)
        .sample("limiter_http_pool_limit", &[("pool", "tunnels")], a.tunnels_limit);
    page.family(
        "limiter_http_tunnels",
        "gauge",
        "Upgraded connections (WebSocket tunnels) open, and upgrade requests that may become one, under http.maxTunnels.",
    )
    .sample("limiter_http_tunnels", &[], a.tunnels_in_use);
    page.family(
        "limiter_http_limit",
        "gauge",
        "The limit in force of each pool (0 = unlimited): the normal pool's is learnt with http.adaptive = on.",
    )
    .sample("limiter_http_limit", &[("pool", "normal")], a.normal_limit)
    .sample("limiter_http_limit", &[("pool", "debug")], a.debug_limit)
    .sample("limiter_http_limit", &[("pool", "web")], a.web_limit)
    .sample("limiter_http_limit", &[("pool", "session")], a.session_limit);
    if let Some(e) = &a.adaptive {
        page.family(
            "limiter_http_adaptive_base_latency_seconds",
            "gauge",
            "The adaptive controller's estimate of the upstream's answer time without a queue (0: not yet known).",
        )
        .sample("limiter_http_adaptive_base_latency_seconds", &[], e.base_latency);
        page.family(
            "limiter_http_adaptive_latency_seconds",
            "gauge",
            "Mean time to the response head of the normal pool's requests in the controller's last bin.",
        )
        .sample("limiter_http_adaptive_latency_seconds", &[], e.latency);
        page.family(
            "limiter_http_adaptive_throughput",
            "gauge",
            "Responses per second of the normal pool in the controller's last bin.",
        )
        .sample("limiter_http_adaptive_throughput", &[], e.throughput);
        page.family(
            "limiter_http_adaptive_capacity",
            "gauge",
            "Requests the upstream serves at once without queueing, as the last descent measured it (0: none yet).",
        )
        .sample("limiter_http_adaptive_capacity", &[], e.capacity);
        page.family(
            "limiter_http_adaptive_descents_total",
            "counter",
            "Descents of the adaptive limit (a queue or a probe), and those that found no queue.",
        )
        .sample("limiter_http_adaptive_descents_total", &[("found", "queue")], e.descents - e.rebased)
        .sample("limiter_http_adaptive_descents_total", &[("found", "no_queue")], e.rebased);
    }
    page.family(
        "limiter_http_sessions",
        "gauge",
        "Sessions with a request in flight (kept only while limited).",
    )
    .sample("limiter_http_sessions", &[], a.sessions);
    page.family("limiter_http_admitted_total", "counter", "Requests admitted, by pool asked for.")
        .sample("limiter_http_admitted_total", &[("pool", "normal")], a.admitted_normal)
        .sample("limiter_http_admitted_total", &[("pool", "debug")], a.admitted_debug);
    page.family("limiter_http_refused_total", "counter", "Requests answered 503 by admission, by reason.");
    for reason in Reason::ALL {
        let n = match reason {
            Reason::Admission(r) => a.refused[r as usize],
            Reason::Breaker => c.refused_breaker.load(Ordering::Relaxed),
            Reason::BufferFull => c.refused_buffer_full.load(Ordering::Relaxed),
            Reason::UpstreamFull => c.refused_upstream_full.load(Ordering::Relaxed),
        };
        page.sample("limiter_http_refused_total", &[("reason", reason.as_str())], n);
    }
    page.family(
        "limiter_http_would_refuse_total",
        "counter",
        "Requests http.dryRun admitted that a limit would have refused, by reason.",
    );
    for (i, refusal) in Refusal::ALL.iter().enumerate() {
        page.sample("limiter_http_would_refuse_total", &[("reason", refusal.as_str())], a.would_refuse[i]);
    }
    page.family("limiter_http_responses_total", "counter", "Responses sent to clients, by status class.");
    for (i, class) in ["1xx", "2xx", "3xx", "4xx", "5xx"].iter().enumerate() {
        page.sample(
            "limiter_http_responses_total",
            &[("class", class)],
            c.responses[i].load(Ordering::Relaxed),
        );
    }
    let errors = |kind: Kind| c.errors[kind.index()].load(Ordering::Relaxed);
    page.family(
        "limiter_http_errors_total",
        "counter",
        "Exchanges that failed, by kind: the upstream's (upstream_*) and the client's (client_*), each with its cause in the log.",
    );
    for kind in Kind::ALL {
        page.sample("limiter_http_errors_total", &[("kind", kind.as_str())], errors(kind));
    }
    let resets = errors(Kind::UpstreamClosed) + errors(Kind::UpstreamInvalid) + errors(Kind::UpstreamBody);
    page.family(
        "limiter_http_upstream_errors_total",
        "counter",
        "Upstream failures, by kind (from limiter_http_errors_total: reset is upstream_closed, upstream_invalid and upstream_body).",
    )
    .sample("limiter_http_upstream_errors_total", &[("kind", "connect")], errors(Kind::UpstreamConnect))
    .sample("limiter_http_upstream_errors_total", &[("kind", "timeout")], errors(Kind::UpstreamTimeout))
    .sample("limiter_http_upstream_errors_total", &[("kind", "reset")], resets);
    page.family("limiter_http_bad_requests_total", "counter", "Requests refused for their head, by kind (their connections closed; header_timeout: a head not whole in time, or a keep-alive connection idle past it), and request bodies the client broke off or framed wrongly (body).")
        .sample("limiter_http_bad_requests_total", &[("kind", "header_timeout")], c.header_timeouts.load(Ordering::Relaxed))
        .sample("limiter_http_bad_requests_total", &[("kind", "too_large")], c.heads_too_large.load(Ordering::Relaxed))
        .sample("limiter_http_bad_requests_total", &[("kind", "malformed")], c.malformed.load(Ordering::Relaxed))
        .sample("limiter_http_bad_requests_total", &[("kind", "framing_conflict")], c.framing_conflicts.load(Ordering::Relaxed))
        .sample("limiter_http_bad_requests_total", &[("kind", "body")], errors(Kind::ClientBody));
    for bad in Bad::ALL {
        page.sample(
            "limiter_http_bad_requests_total",
            &[("kind", bad.kind())],
            c.bad_heads[bad.index()].load(Ordering::Relaxed),
        );
    }
    page.family(
        "limiter_http_buffered_bytes",
        "gauge",
        "Bytes of request bodies and response read-ahead held in memory (within http.bufferMemoryBytes).",
    )
    .sample("limiter_http_buffered_bytes", &[], buffered_bytes);
    page.family(
        "limiter_http_bodies_receiving",
        "gauge",
        "Requests receiving their body before admission (holding no permit).",
    )
    .sample("limiter_http_bodies_receiving", &[], c.bodies_receiving.load(Ordering::Relaxed));
    page.family(
        "limiter_http_body_timeouts_total",
        "counter",
        "Request bodies too slow, answered 408, by rule.",
    );
    for rule in BodyTimeout::ALL {
        page.sample(
            "limiter_http_body_timeouts_total",
            &[("kind", rule.as_str())],
            errors(Kind::ClientSlowBody(rule)),
        );
    }
    page.family(
        "limiter_http_slow_readers_total",
        "counter",
        "Client connections (HTTP/2: streams) cut for taking a response too slowly: under http.minDataRate, or a chunk left 1 s while a pool refuses.",
    )
    .sample("limiter_http_slow_readers_total", &[], c.slow_readers.load(Ordering::Relaxed));
    page.family("limiter_http_connections_open", "gauge", "Client connections open.").sample(
        "limiter_http_connections_open",
        &[],
        c.connections_open.load(Ordering::Relaxed),
    );
    page.family("limiter_http_connections_total", "counter", "Client connections accepted.").sample(
        "limiter_http_connections_total",
        &[],
        c.connections_total.load(Ordering::Relaxed),
    );
    page.family(
        "limiter_http_upgrades_total",
        "counter",
        "Connections switched to another protocol (WebSocket).",
    )
    .sample("limiter_http_upgrades_total", &[], c.upgrades.load(Ordering::Relaxed));
    page.family(
        "limiter_http_underscore_fields_dropped_total",
        "counter",
        "Request fields not passed upstream for a _ in their name (http.underscoresInHeaders).",
    )
    .sample(
        "limiter_http_underscore_fields_dropped_total",
        &[],
        c.underscore_fields_dropped.load(Ordering::Relaxed),
    );
    page.histogram(
        "limiter_http_upstream_latency_seconds",
        "From the request sent upstream to the upstream's response head.",
        &c.upstream_latency,
    );
    page.histogram(
        "limiter_http_time_to_503_seconds",
        "From the request head parsed to the admission 503 handed to the connection.",
        &c.time_to_503,
    );
}

/// The coupled shedding's controller (`http.shedAtSyn`); the kernel's
/// side (what was shed, the flags) is in the kernel families.
pub fn write_shedding(page: &mut Page, s: &crate::admin::api::ShedStatus) {
    page.family(
        "limiter_http_shedding",
        "gauge",
        "1 while the normal pool keeps refusing and new connections to the proxy's ports are shed at the SYN.",
    )
    .sample("limiter_http_shedding", &[], u8::from(s.active));
    page.family(
        "limiter_http_shed_transitions_total",
        "counter",
        "Times coupled shedding started (to=\"shedding\") and stopped (to=\"open\").",
    )
    .sample("limiter_http_shed_transitions_total", &[("to", "shedding")], s.started)
    .sample("limiter_http_shed_transitions_total", &[("to", "open")], s.stopped);
}

#[cfg(test)]
mod tests {
    use super::*;

    use super::super::page::label_values as values;

    #[test]
    fn refusals_are_labelled_by_every_reason_once() {
        let mut page = Page::default();
        write(&mut page, &admission::Snapshot::default(), &Counters::default(), 0);
        let page = page.finish();
        let reasons: Vec<&str> = Reason::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(values(&page, "limiter_http_refused_total", "reason"), reasons);
        let limits: Vec<&str> = Refusal::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(values(&page, "limiter_http_would_refuse_total", "reason"), limits);
    }
}
