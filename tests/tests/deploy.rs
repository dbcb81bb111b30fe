//! The deployment files: the systemd units pass `systemd-analyze verify`,
//! the Kubernetes manifest passes a schema validator (kubernetes-validate,
//! from PyPI, installed by `cargo xtask setup`), and the configuration the
//! manifest ships passes `limiter check-config`. Each validator is also
//! shown a broken copy, so a validator that accepts anything would fail
//! these tests.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use limiter_tests::{limiter, limiter_bin};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ld-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `systemd-analyze verify` on copies of the units whose `ExecStart` points
/// at the binary under test (verify checks that it is executable).
fn verify_units(dir: &Path, edit: impl Fn(&str) -> String) -> (bool, String) {
    let mut files = Vec::new();
    for name in ["limiter.service", "limiter-bpffs.service", "limiter.socket"] {
        let text = std::fs::read_to_string(workspace().join("deploy/systemd").join(name)).unwrap();
        let text = edit(&text.replace("/usr/local/bin/limiter", limiter_bin().to_str().unwrap()));
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        files.push(path);
    }
    let out = limiter_tests::process::run_with_deadline(
        Command::new("systemd-analyze").arg("verify").args(&files).current_dir(dir),
        limiter_tests::process::DEADLINE,
    );
    (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
#[ignore = "black-box: the daemon binary, root, real sockets; run by `cargo xtask test`"]
fn the_systemd_units_pass_systemd_analyze_verify() {
    let dir = scratch("units");
    let (ok, stderr) = verify_units(&dir, str::to_owned);
    assert!(ok && stderr.trim().is_empty(), "systemd-analyze verify: {stderr}");
    let unit = std::fs::read_to_string(workspace().join("deploy/systemd/limiter.service")).unwrap();
    for line in [
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "ReadWritePaths=/sys/fs/bpf",
        "Type=notify",
        "ExecReload=/usr/local/bin/limiter reload --config /etc/limiter/limiter.ini",
        "RestartPreventExitStatus=78",
        "Restart=on-failure",
        "Requires=limiter-bpffs.service",
        "CapabilityBoundingSet=CAP_BPF CAP_NET_ADMIN CAP_SYS_ADMIN",
        "--user limiter",
    ] {
        assert!(unit.contains(line), "limiter.service lacks `{line}`");
    }
    let socket = std::fs::read_to_string(workspace().join("deploy/systemd/limiter.socket")).unwrap();
    for line in [
        "ListenStream=127.0.0.1:8080",
        "ListenStream=127.0.0.1:9901",
        "ReusePort=yes",
        "Service=limiter.service",
    ] {
        assert!(socket.contains(line), "limiter.socket lacks `{line}`");
    }
    // The socket unit's addresses are the example configuration's.
    let example = limiter::config::Config::load(&workspace().join("examples/limiter.ini")).unwrap();
    for (key, addr) in [("http.listen", example.http.listen.0), ("admin.listen", example.admin.listen.0)] {
        assert!(socket.contains(&format!("ListenStream={addr}")), "limiter.socket lacks {key} = {addr}");
    }
    // The validator does reject a broken unit.
    let (ok, stderr) = verify_units(&dir, |t| t.replace("ProtectSystem=strict", "ProtectSystem=sometimes"));
    assert!(
        !ok || stderr.contains("Failed to parse protect system value"),
        "a bad value went unnoticed: {stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

fn validate(manifest: &Path) -> (bool, String) {
    let validator = workspace().join("target/tools/venv/bin/kubernetes-validate");
    assert!(validator.is_file(), "{} is missing: run `cargo xtask setup`", validator.display());
    let out = limiter_tests::process::run_with_deadline(
        Command::new(validator).args(["--strict"]).arg(manifest),
        limiter_tests::process::DEADLINE,
    );
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

#[test]
#[ignore = "black-box: the daemon binary, root, real sockets; run by `cargo xtask test`"]
fn the_kubernetes_manifest_passes_schema_validation_and_ships_a_valid_config() {
    let manifest = workspace().join("deploy/kubernetes/limiter.yaml");
    let (ok, text) = validate(&manifest);
    assert!(ok, "kubernetes-validate: {text}");
    assert_eq!(text.matches("passed").count(), 4, "namespace, configmap, secret, daemonset: {text}");

    let yaml = std::fs::read_to_string(&manifest).unwrap();
    for needle in [
        "hostNetwork: true",
        "mountPropagation: Bidirectional",
        "path: /sys/fs/bpf",
        "path: /sys/fs/cgroup",
        "readinessProbe:",
        "livenessProbe:",
        "path: /healthz",
        "terminationGracePeriodSeconds: 45",
        "privileged: false",
        "drop: [\"ALL\"]",
        "automountServiceAccountToken: false",
        "type: RuntimeDefault",
        "startupProbe:",
        "preStop:",
        "secretName: limiter-admin-token",
        "defaultMode: 0440",
        "fsGroup: 65532",
        "args: [\"prepare-node\", \"--bpffs\", \"/sys/fs/bpf\"]",
        "socket = off",
        "prometheus.io/port: \"9902\"",
        "\"--user\", \"65532:65532\"",
        "maxSurge: 1",
        "maxUnavailable: 0",
        "runAsUser: 0",
    ] {
        assert!(yaml.contains(needle), "the manifest lacks `{needle}`");
    }
    // The validator does reject a broken manifest: a misspelt field
    // (strict mode), a value of the wrong type.
    let dir = scratch("k8s");
    let broken = dir.join("broken.yaml");
    for (from, to) in [
        ("mountPropagation: Bidirectional", "mountPropogation: Bidirectional"),
        ("terminationGracePeriodSeconds: 45", "terminationGracePeriodSeconds: forty-five"),
    ] {
        std::fs::write(&broken, yaml.replace(from, to)).unwrap();
        let (ok, text) = validate(&broken);
        assert!(!ok, "`{to}` went unnoticed: {text}");
    }

    // The ConfigMap's limiter.ini is a valid configuration (its token
    // file, from the Secret, written where the test can read it).
    assert!(
        !yaml.contains("containerPort:") && !yaml.contains("hostPort:"),
        "no ports: surge rollouts overlap"
    );
    let ini = shipped_ini().replace("/etc/limiter/secret/token", &token_file(&dir));
    let file = dir.join("limiter.ini");
    std::fs::write(&file, &ini).unwrap();
    let out = limiter(&["check-config", file.to_str().unwrap()]);
    assert!(out.status.success(), "{}\n{ini}", String::from_utf8_lossy(&out.stderr));
    let _ = std::fs::remove_dir_all(&dir);
}

/// The Secret's token, written in `dir` as the pod would see it.
fn token_file(dir: &Path) -> String {
    let yaml = std::fs::read_to_string(workspace().join("deploy/kubernetes/limiter.yaml")).unwrap();
    let token = yaml.lines().find_map(|l| l.trim().strip_prefix("token: ")).expect("the Secret's token");
    let path = dir.join("token");
    limiter_tests::write_secret(&path, &format!("{token}\n"));
    path.to_str().unwrap().to_owned()
}

/// The `limiter.ini` of the manifest's ConfigMap, as the pod sees it.
fn shipped_ini() -> String {
    let yaml = std::fs::read_to_string(workspace().join("deploy/kubernetes/limiter.yaml")).unwrap();
    yaml.split("limiter.ini: |\n")
        .nth(1)
        .unwrap()
        .lines()
        .take_while(|l| l.starts_with("    ") || l.is_empty())
        .map(|l| format!("{}\n", l.trim_start()))
        .collect()
}

#[test]
#[ignore = "black-box: the daemon binary, root, a network namespace and cgroup; run by `cargo xtask test`"]
fn the_shipped_configmap_carries_more_requests_than_its_per_source_cap_without_a_502() {
    limiter_tests::require_kernel!();
    let sb = limiter_tests::Sandbox::new().unwrap();
    // The ConfigMap's own file, its paths adapted to this machine: the
    // sandbox's pin directory and cgroup; nothing else changes.
    let ini = shipped_ini()
        .replace("pinPath = /sys/fs/bpf/limiter", &format!("pinPath = {}", sb.pin_path.display()))
        .replace("cgroup = /sys/fs/cgroup", &format!("cgroup = {}", sb.cgroup.display()))
        .replace("/etc/limiter/secret/token", &token_file(&sb.dir));
    let cap: usize = ini
        .lines()
        .find_map(|l| l.strip_prefix("port.8080.perSourceMax = "))
        .expect("the shipped per-source cap")
        .parse()
        .unwrap();
    let file = sb.dir.join("shipped.ini");
    std::fs::write(&file, &ini).unwrap();
    // The application on 127.0.0.1:8080, counted by the gate.
    let up = limiter_tests::upstream::Upstream::on(sb.listen("127.0.0.1:8080", 1024));
    let mut daemon = limiter_tests::Daemon::start_inside(&sb, &file, &[]).expect("the daemon starts");
    let requests = 2 * cap;
    let clients: Vec<_> = (0..requests)
        .map(|_| {
            let netns = sb.netns_file();
            std::thread::spawn(move || {
                limiter_tests::in_netns(&netns, || {
                    limiter_tests::client::send(
                        "127.0.0.1:8081".parse().unwrap(),
                        b"GET /hold HTTP/1.1\r\nHost: app\r\n\r\n",
                    )
                    .map(|r| r.status)
                    .map_err(|e| e.to_string())
                })
            })
        })
        .collect();
    up.wait_holding(requests as u64);
    up.release();
    let statuses: Vec<Result<u16, String>> = clients.into_iter().map(|c| c.join().unwrap()).collect();
    let ok = statuses.iter().filter(|s| matches!(s, Ok(200))).count();
    assert_eq!(ok, requests, "{requests} concurrent requests past the cap of {cap}: {statuses:?}");
    assert_eq!(limiter_tests::process::terminate(&mut daemon, std::time::Duration::from_secs(30)), Some(0));
    let _ = limiter(&["unload", "--pin-path", sb.pin_path.to_str().unwrap()]);
}

/// Every metric a dashboard panel or an alert names, from its expressions.
fn metric_names(text: &str) -> std::collections::BTreeSet<String> {
    let mut names = std::collections::BTreeSet::new();
    for (i, _) in text.match_indices("limiter_").chain(text.match_indices("process_")) {
        let name: String = text[i..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
        names.insert(name.trim_end_matches("_bucket").to_owned());
    }
    names
}

#[test]
#[ignore = "black-box: promtool (Debian's prometheus package), the daemon binary, root; run by `cargo xtask test`"]
fn the_alerting_rules_pass_promtool_and_their_unit_tests_and_name_real_metrics() {
    limiter_tests::require_kernel!();
    let dir = workspace().join("deploy/prometheus");
    let run = |args: &[&str]| {
        limiter_tests::process::run_with_deadline(
            Command::new("promtool").args(args).current_dir(&dir),
            limiter_tests::process::DEADLINE,
        )
    };
    let check = run(&["check", "rules", "limiter-rules.yaml"]);
    assert!(check.status.success(), "{}", String::from_utf8_lossy(&check.stdout));
    let tests = run(&["test", "rules", "limiter-rules.test.yaml"]);
    assert!(
        tests.status.success(),
        "{}{}",
        String::from_utf8_lossy(&tests.stdout),
        String::from_utf8_lossy(&tests.stderr)
    );
    // A broken copy is rejected: the unit tests catch a wrong threshold.
    let scratch = scratch("rules");
    let rules = std::fs::read_to_string(dir.join("limiter-rules.yaml")).unwrap();
    std::fs::write(scratch.join("limiter-rules.yaml"), rules.replace(">= 0.9", ">= 0.99")).unwrap();
    std::fs::copy(dir.join("limiter-rules.test.yaml"), scratch.join("limiter-rules.test.yaml")).unwrap();
    let broken = limiter_tests::process::run_with_deadline(
        Command::new("promtool").args(["test", "rules", "limiter-rules.test.yaml"]).current_dir(&scratch),
        limiter_tests::process::DEADLINE,
    );
    assert!(!broken.status.success(), "a wrong threshold went unnoticed");
    // Every metric the rules and the dashboard name is a family of a real
    // scrape of the daemon.
    let dashboard =
        std::fs::read_to_string(workspace().join("deploy/grafana/limiter-dashboard.json")).unwrap();
    let _: serde_json::Value = serde_json::from_str(&dashboard).expect("the dashboard is JSON");
    let full = limiter_tests::scrape::full();
    let served = limiter_tests::scrape::families(&full.page);
    let named: Vec<_> = metric_names(&rules).union(&metric_names(&dashboard)).cloned().collect();
    assert!(named.len() > 10, "the names the rules and dashboard use: {named:?}");
    let unknown: Vec<_> =
        named.iter().filter(|n| !limiter_tests::scrape::names_a_family(&served, n)).collect();
    assert!(unknown.is_empty(), "named by the rules or the dashboard but not served: {unknown:?}");
    let _ = std::fs::remove_dir_all(&scratch);
}

/// `systemd-analyze security --offline=true` on the shipped unit: its
/// overall exposure is what the manual reports (docs/trust.md, "Who can do
/// what on a node"), so a change to the unit that moves it must move the
/// manual too.
#[test]
#[ignore = "black-box: systemd-analyze; run by `cargo xtask test`"]
fn the_units_exposure_is_what_the_manual_reports() {
    let out = limiter_tests::process::run_with_deadline(
        Command::new("systemd-analyze")
            .args(["security", "--offline=true", "--no-pager"])
            .arg(workspace().join("deploy/systemd/limiter.service")),
        limiter_tests::process::DEADLINE,
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let score = text
        .lines()
        .find_map(|l| l.split("Overall exposure level for limiter.service:").nth(1))
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| {
            panic!("no overall exposure in:\n{text}\n{}", String::from_utf8_lossy(&out.stderr))
        })
        .to_owned();
    let value: f64 = score.parse().unwrap();
    assert!(value <= 3.5, "the unit's exposure rose to {score}");
    let page = std::fs::read_to_string(workspace().join("docs/trust.md")).unwrap();
    assert!(
        page.contains(&format!("scores **{score}**")),
        "docs/trust.md does not report the unit's {score}"
    );
}
