//! The rows `dump`, `top` and `/metrics` show, from map values.

use limiter_common::{
    GateConfig, LIMIT_FLAG_DRY_RUN, PortLimit, PortStats, Refusals, ShedCounts, ShedPort, SourceKey, path,
    reason,
};

use super::*;

fn config(prefix_v4: u32, prefix_v6: u32) -> GateConfig {
    GateConfig { prefix_v4, prefix_v6, ..GateConfig::default() }
}

#[test]
fn groups_read_as_prefixes_of_the_configured_length() {
    let v4 = SourceKey { addr: [0xc000_0200, 0, 0, 0], port: 443, family: 4, _pad: 0 };
    assert_eq!(group_name(&v4, &config(24, 64)), "192.0.2.0/24");
    let v6 = SourceKey { addr: [0x2001_0db8, 0x0001_0000, 0, 0], port: 443, family: 6, _pad: 0 };
    assert_eq!(group_name(&v6, &config(24, 56)), "2001:db8:1::/56");
}

#[test]
fn refusals_are_summed_by_reason_and_by_path() {
    let mut r = Refusals::default();
    r.refused[path::SK_LOOKUP * reason::COUNT + reason::PORT] = 5;
    r.refused[path::XDP * reason::COUNT + reason::PORT] = 2;
    r.refused[path::XDP * reason::COUNT + reason::SOURCE] = 1;
    r.refused[path::SK_LOOKUP * reason::COUNT + reason::TABLE] = 6;
    r.trusted_admitted = 3;
    let limit = PortLimit { max_established: 400, flags: 0, per_source_max: 20, _pad: 0 };
    let stats = PortStats { established: 399, high_watermark: 401, admitted: 1000 };
    let row = row(8080, Some(&limit), &stats, Some(&r));
    assert_eq!((row.limit, row.per_source_max, row.dry_run), (Some(400), Some(20), false));
    assert_eq!((row.established, row.high_watermark, row.admitted), (399, 401, 1000));
    assert_eq!(row.refused, 14);
    assert_eq!(row.refused_by, RefusalRow { by_reason: [7, 1, 6, 0], by_path: [11, 3] });
    // [path][reason], in the order of limiter_common's tables (what /metrics labels).
    assert_eq!(row.refused_matrix, [[5, 0, 6, 0], [2, 1, 0, 0]]);
    assert_eq!((row.would_refuse, row.trusted_admitted), (0, 3));
}

#[test]
fn a_dry_run_port_shows_what_it_would_have_refused() {
    let mut r = Refusals::default();
    r.would_refuse[reason::PORT] = 4;
    r.would_refuse[reason::SOURCE] = 1;
    let limit = PortLimit { max_established: 0, flags: LIMIT_FLAG_DRY_RUN, per_source_max: 2, _pad: 0 };
    let row = row(9000, Some(&limit), &PortStats::default(), Some(&r));
    assert!(row.dry_run);
    // No cap on the port as a whole: no limit to show.
    assert_eq!((row.limit, row.per_source_max), (None, Some(2)));
    assert_eq!((row.refused, row.would_refuse), (0, 5));
    assert_eq!(row.would_refuse_by, RefusalRow { by_reason: [4, 1, 0, 0], by_path: [0, 0] });
}

#[test]
fn shedding_adds_its_reason_to_the_limits_and_shows_its_flag() {
    let mut r = Refusals::default();
    r.refused[path::SK_LOOKUP * reason::COUNT + reason::PORT] = 2;
    r.trusted_admitted = 1;
    let mut row = row(8080, None, &PortStats::default(), Some(&r));
    let counts = ShedCounts { refused: [10, 30], would_refuse: 0, probes: 3, trusted_admitted: 4 };
    let now = 5_000_000_000;
    let flag = ShedPort { until_boot_ns: now + 750_000_000, flags: 0, probe_one_in: 16 };
    add_shedding(&mut row, &flag, Some(&counts), now);
    assert_eq!(row.refused, 42);
    assert_eq!((row.refused_by.by_reason[reason::SHED], row.refused_by.by_reason[reason::PORT]), (40, 2));
    assert_eq!(row.refused_by.by_path, [12, 30]);
    assert_eq!(row.refused_matrix, [[2, 0, 0, 10], [0, 0, 0, 30]]);
    assert_eq!((row.trusted_admitted, row.shed_probes), (5, 3));
    assert_eq!(row.shedding, Some(ShedRow { expires_in_ms: 750, dry_run: false, probe_one_in: 16 }));
    // A flag past its deadline shows as lapsed; a lowered one not at all.
    let mut lapsed = super::row(8080, None, &PortStats::default(), None);
    add_shedding(&mut lapsed, &ShedPort { until_boot_ns: now - 1, flags: 1, probe_one_in: 0 }, None, now);
    assert_eq!(lapsed.shedding, Some(ShedRow { expires_in_ms: 0, dry_run: true, probe_one_in: 0 }));
    let mut lowered = super::row(8080, None, &PortStats::default(), None);
    add_shedding(&mut lowered, &ShedPort::default(), None, now);
    assert_eq!(lowered.shedding, None);
}

#[test]
fn a_counted_port_without_limits_or_refusals_shows_only_its_counts() {
    let stats = PortStats { established: 7, high_watermark: 9, admitted: 12 };
    let row = row(7101, None, &stats, None);
    assert_eq!((row.limit, row.per_source_max, row.dry_run), (None, None, false));
    assert_eq!((row.established, row.refused, row.would_refuse), (7, 0, 0));
    assert_eq!(row.refused_by, RefusalRow::default());
}

#[test]
fn the_top_sources_are_the_busiest_groups_first() {
    let key = |last: u32, port| SourceKey { addr: [0x0a00_0000 | last, 0, 0, 0], port, family: 4, _pad: 0 };
    let mut groups: Vec<(SourceKey, u64)> = (0..30).map(|i| (key(i, 80), u64::from(i % 5))).collect();
    groups.push((key(1, 443), 9));
    let top = top_sources(groups, &config(32, 64));
    assert_eq!(top.len(), TOP_SOURCES);
    assert_eq!(top[0], SourceRow { port: 443, group: "10.0.0.1/32".into(), established: 9 });
    // Equal counts: by port, then by group name.
    assert_eq!((top[1].group.as_str(), top[1].established), ("10.0.0.14/32", 4));
    assert!(top.windows(2).all(|w| w[0].established >= w[1].established));
}

/// The refusal rows' JSON (`/status`, `dump --json`, read by scripts and
/// the integration tests) is keyed by the tables' names, in their order,
/// as it was when the row had a field per name; it reads back, and a row
/// without `shed` (an older daemon's) reads as 0.
#[test]
fn refusal_rows_are_keyed_by_the_tables_names() {
    let row = RefusalRow { by_reason: [7, 1, 6, 2], by_path: [11, 5] };
    let json = serde_json::to_string(&row).unwrap();
    assert_eq!(
        json,
        r#"{"port_full":7,"source_full":1,"source_table_full":6,"shed":2,"sk_lookup":11,"xdp":5}"#
    );
    assert_eq!(serde_json::from_str::<RefusalRow>(&json).unwrap(), row);
    let old = r#"{"port_full":7,"source_full":1,"source_table_full":6,"sk_lookup":11,"xdp":5,"later":[1]}"#;
    assert_eq!(
        serde_json::from_str::<RefusalRow>(old).unwrap(),
        RefusalRow { by_reason: [7, 1, 6, 0], ..row }
    );
}
