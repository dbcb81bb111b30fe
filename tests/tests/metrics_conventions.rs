//! A real scrape of the daemon (every part that exports metrics in use:
//! [`limiter_tests::scrape::full`]) follows Prometheus' conventions as
//! `promtool check metrics` lints them, is OpenMetrics-clean (no two
//! families share a name once a counter's `_total` is dropped), and is
//! exactly what the manual's metrics reference (docs/metrics.md) lists.

use std::{
    collections::BTreeMap,
    io::Write as _,
    process::{Command, Stdio},
};

use limiter_tests::{require_kernel, scrape};

#[test]
#[ignore = "black-box: the daemon binary, root, a network namespace and cgroup; run by `cargo xtask test`"]
fn a_real_scrape_passes_promtool_and_is_openmetrics_clean() {
    require_kernel!();
    let full = scrape::full();
    let page = &full.page;
    for family in
        ["limiter_kernel_scrape_success 1", "process_resident_memory_bytes ", "limiter_tls_handshakes_total{"]
    {
        assert!(page.contains(family), "{family} missing:\n{page}");
    }
    let mut promtool = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (Debian's prometheus package; cargo xtask setup installs it)");
    promtool.stdin.take().unwrap().write_all(page.as_bytes()).unwrap();
    let out = promtool.wait_with_output().unwrap();
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && said.trim().is_empty(), "promtool check metrics:\n{said}");

    // OpenMetrics names a counter's family without `_total`.
    let mut families: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for line in page.lines().filter_map(|l| l.strip_prefix("# TYPE ")) {
        let (name, kind) = line.split_once(' ').unwrap();
        let family = if kind == "counter" { name.strip_suffix("_total").unwrap_or(name) } else { name };
        families.entry(family.to_owned()).or_default().push(format!("{name} ({kind})"));
    }
    let clashes: Vec<_> = families.values().filter(|v| v.len() > 1).collect();
    assert!(clashes.is_empty(), "families sharing an OpenMetrics name: {clashes:?}");
}

#[test]
#[ignore = "black-box: the daemon binary, root, a network namespace and cgroup; run by `cargo xtask test`"]
fn the_readme_lists_exactly_the_families_of_a_real_scrape() {
    require_kernel!();
    let full = scrape::full();
    let served = scrape::families(&full.page);
    let listed = scrape::manual_metrics();
    let unlisted: Vec<_> = served.difference(&listed).collect();
    let unserved: Vec<_> = listed.difference(&served).collect();
    assert!(
        unlisted.is_empty() && unserved.is_empty(),
        "served but not in docs/metrics.md's table: {unlisted:?}; in the table but not served: {unserved:?}"
    );
}
