use std::path::Path;

use super::*;

fn parse(text: &str) -> Result<Config, ConfigError> {
    Config::parse(text, "limiter.ini")
}

fn error(text: &str) -> String {
    parse(text).expect_err("should be rejected").to_string()
}

#[test]
fn empty_file_gives_the_documented_defaults() {
    let c = parse("").unwrap();
    assert_eq!(c.http.max_threads, 208);
    assert_eq!(c.http.normal_limit(), 197);
    assert_eq!(c.http.max_session_connections, 0);
    assert_eq!(c.http.max_web_connections, 0);
    assert_eq!(c.kernel.pin_path, PathBuf::from("/sys/fs/bpf/limiter"));
    assert_eq!(c.kernel.cgroup, None);
    assert_eq!(c.kernel.netns, None);
    assert!(c.kernel.ports.is_empty());
    assert_eq!(c.admin.listen.to_string(), "127.0.0.1:9901");
    assert_eq!(c.breaker.failure_statuses, vec![(500, 599)]);
    assert_eq!(c.breaker.min_requests, 10);
    assert!(c.breaker.bypass_debug);
}

#[test]
fn ports_sections_and_comments() {
    let c = parse(
        "# limits\n\
         kernel.ports = 8080:400, 8443:200 ; two ports\n\
         \n\
         [http]\n\
         maxThreads = 20   # small\n\
         maxSessionConnections=2\n\
         [kernel]\n\
         pinPath = /sys/fs/bpf/x\n",
    )
    .unwrap();
    assert_eq!(c.kernel.ports, BTreeMap::from([(8080, 400), (8443, 200)]));
    assert_eq!(c.http.max_threads, 20);
    assert_eq!(c.http.normal_limit(), 9);
    assert_eq!(c.http.max_session_connections, 2);
    assert_eq!(c.kernel.pin_path, PathBuf::from("/sys/fs/bpf/x"));
}

#[test]
fn the_runtimes_own_config_ini_is_accepted_and_its_keys_ignored() {
    let c = parse(
        "[http]\nmaxThreads = 208\nport = 8080\ncompression = true\n\
         [db]\nurl = postgres://x;y\npool=10\n\
         logging.level = info\n",
    )
    .unwrap();
    assert_eq!(c.http.max_threads, 208);
    assert_eq!(c.ignored, vec!["http.port", "http.compression", "db.url", "db.pool", "db.logging.level"]);
}

#[test]
fn keys_are_case_sensitive() {
    // `http.maxthreads` is not the daemon's key: the runtime's, ignored.
    let c = parse("http.maxthreads = 20\n").unwrap();
    assert_eq!(c.http.max_threads, 208);
    // Under kernel. a wrong case is an unknown key: an error.
    assert_eq!(
        error("kernel.Ports = 80:1\n"),
        "limiter.ini:1: kernel.Ports = 80:1: unknown key under `kernel.` (keys there are the daemon's; see `limiter check-config` or the manual's key reference)"
    );
}

#[test]
fn errors_name_file_line_and_key() {
    assert_eq!(
        error("\n\nhttp.maxThreads = -3\n"),
        "limiter.ini:3: http.maxThreads = -3: must be at least 12"
    );
    assert_eq!(error("http.maxThreads = 11\n"), "limiter.ini:1: http.maxThreads = 11: must be at least 12");
    assert_eq!(
        error("[http]\nmaxThreads = lots\n"),
        "limiter.ini:2: http.maxThreads = lots: not a whole number (expected at least 12)"
    );
    assert_eq!(
        error("http.maxSessionConnections = -1\n"),
        "limiter.ini:1: http.maxSessionConnections = -1: must be at least 0"
    );
    assert_eq!(
        error("http.maxWebConnections = 1.5\n"),
        "limiter.ini:1: http.maxWebConnections = 1.5: not a whole number (expected at least 0)"
    );
}

#[test]
fn bad_ports_are_rejected() {
    assert_eq!(
        error("kernel.ports = 0:10\n"),
        "limiter.ini:1: kernel.ports = 0:10: `0:10`: port 0 is outside 1-65535"
    );
    assert_eq!(
        error("kernel.ports = 65536:10\n"),
        "limiter.ini:1: kernel.ports = 65536:10: `65536:10`: port 65536 is outside 1-65535"
    );
    assert_eq!(
        error("kernel.ports = 80:0\n"),
        "limiter.ini:1: kernel.ports = 80:0: `80:0`: the limit must be at least 1"
    );
    assert_eq!(
        error("kernel.ports = 80:-5\n"),
        "limiter.ini:1: kernel.ports = 80:-5: `80:-5`: the limit must be at least 1"
    );
    assert_eq!(
        error("kernel.ports = 80:5, 81:3, 80:7\n"),
        "limiter.ini:1: kernel.ports = 80:5, 81:3, 80:7: port 80 is listed twice"
    );
    assert_eq!(
        error("kernel.ports = 80\n"),
        "limiter.ini:1: kernel.ports = 80: `80`: expected port:max, such as 8080:400"
    );
    assert_eq!(
        error("kernel.ports = 80:1,,81:2\n"),
        "limiter.ini:1: kernel.ports = 80:1,,81:2: empty item in the list (expected port:max, port:max, ...)"
    );
    assert_eq!(
        error("kernel.ports = http:1\n"),
        "limiter.ini:1: kernel.ports = http:1: `http:1`: the port is not a number"
    );
    // An empty list is allowed: count everything, enforce nothing.
    assert!(parse("kernel.ports =\n").unwrap().kernel.ports.is_empty());
}

#[test]
fn duplicates_unknown_keys_and_malformed_lines() {
    assert_eq!(
        error("kernel.ports = 80:1\n[kernel]\nports = 81:1\n"),
        "limiter.ini:3: kernel.ports: given twice (first at line 1)"
    );
    assert_eq!(
        error("breaker.treshold = 0.5\n"),
        "limiter.ini:1: breaker.treshold = 0.5: unknown key under `breaker.` (keys there are the daemon's; see `limiter check-config` or the manual's key reference)"
    );
    assert_eq!(
        error("admin.port = 9\n"),
        "limiter.ini:1: admin.port = 9: unknown key under `admin.` (keys there are the daemon's; see `limiter check-config` or the manual's key reference)"
    );
    assert_eq!(error("a = 1\njust words\n"), "limiter.ini:2: expected `key = value`, found `just words`");
    assert_eq!(error("a = 1\n[http\n"), "limiter.ini:2: malformed section header, found `[http`");
    assert_eq!(error("a = 1\n= 3\n"), "limiter.ini:2: malformed key, found `= 3`");
    // A file that is no configuration at all (a symlink to /etc/shadow):
    // nothing of it is quoted.
    let shadow = error("root:$y$j9T$secret-hash:19000:0:99999:7:::\n");
    assert_eq!(
        shadow,
        "limiter.ini:1: expected `key = value` (not quoted: nothing before it reads as a configuration)"
    );
    // Even a runtime key may not appear twice: the file is ambiguous.
    assert_eq!(
        error("http.port = 1\nhttp.port = 2\n"),
        "limiter.ini:2: http.port: given twice (first at line 1)"
    );
}

#[test]
fn paths_and_addresses() {
    assert_eq!(
        error("kernel.pinPath = relative/dir\n"),
        "limiter.ini:1: kernel.pinPath = relative/dir: must be an absolute path"
    );
    assert_eq!(
        error("admin.listen = localhost\n"),
        "limiter.ini:1: admin.listen = localhost: expected an address and port such as 127.0.0.1:9901 or [::1]:9901"
    );
    let c = parse("kernel.netns = /var/run/netns/blue\nkernel.cgroup = /sys/fs/cgroup/unified/x\nhttp.upstream = http://127.0.0.1:9000/\n").unwrap();
    assert_eq!(c.kernel.netns, Some(PathBuf::from("/var/run/netns/blue")));
    assert_eq!(c.kernel.cgroup, Some(PathBuf::from("/sys/fs/cgroup/unified/x")));
    assert_eq!(c.http.upstream, Some(Upstream::At("127.0.0.1:9000".into())));
    assert_eq!(parse("http.upstream = sample\n").unwrap().http.upstream, Some(Upstream::Sample));
    assert!(error("http.upstream = https://a:1\n").contains("TLS"));
    assert!(error("http.upstream = nohost\n").contains("expected host:port"));
}

#[test]
fn breaker_keys() {
    let c = parse(
        "[breaker]\nthreshold = 0.25\nminRequests = 4\nsleepWindowMs = 500\nwindowMs = 10000\n\
         bucketMs = 500\nhalfOpenMaxProbes = 2\nhalfOpenSuccesses = 3\nfailureStatuses = 502-504, 429\n\
         bypassDebug = false\n",
    )
    .unwrap();
    assert_eq!(c.breaker.threshold, 0.25);
    assert_eq!(c.breaker.failure_statuses, vec![(502, 504), (429, 429)]);
    assert!(!c.breaker.bypass_debug);
    assert_eq!(
        error("breaker.threshold = 1.5\n"),
        "limiter.ini:1: breaker.threshold = 1.5: must be above 0 and below 1"
    );
    assert_eq!(
        error("breaker.windowMs = 1000\nbreaker.bucketMs = 3000\n"),
        "limiter.ini:2: breaker.bucketMs: 3000 ms buckets do not fit in a 1000 ms window"
    );
    assert_eq!(
        error("breaker.windowMs = 2500\n"),
        "limiter.ini:1: breaker.windowMs: 2500 ms is not a whole number of 1000 ms buckets"
    );
    assert_eq!(
        error("breaker.failureStatuses = 599-500\n"),
        "limiter.ini:1: breaker.failureStatuses = 599-500: `599-500`: the range is backwards"
    );
    assert_eq!(
        error("breaker.bypassDebug = yes\n"),
        "limiter.ini:1: breaker.bypassDebug = yes: expected `true` or `false`"
    );
}

#[test]
fn a_missing_file_names_the_file() {
    let e = Config::load(Path::new("/nonexistent/limiter.ini")).unwrap_err().to_string();
    assert!(e.starts_with("/nonexistent/limiter.ini: cannot read the file:"), "{e}");
}

#[test]
fn per_port_options_source_groups_and_trusted_prefixes() {
    let c = parse(
        "kernel.ports = 8080:400\n\
         [kernel]\n\
         port.8080.perSourceMax = 20\n\
         port.8080.dryRun = true\n\
         port.9090.perSourceMax = 5\n\
         sourcePrefixV4 = 24\n\
         sourcePrefixV6 = 56\n\
         sourceTableSize = 4096\n\
         trusted = 10.0.0.0/8, fd00::/8, 192.0.2.7, ::ffff:198.51.100.0/120\n\
         trustedReserve = 5\n\
         xdp.interfaces = eth0, eth1\n\
         xdp.mode = generic\n",
    )
    .unwrap();
    let k = &c.kernel;
    let limits = k.port_limits();
    assert_eq!(
        limits[&8080],
        limiter_common::PortLimit { max_established: 400, flags: 1, per_source_max: 20, _pad: 0 }
    );
    // A per-source cap alone enforces a port without a port-wide cap.
    assert_eq!(
        limits[&9090],
        limiter_common::PortLimit { max_established: 0, flags: 0, per_source_max: 5, _pad: 0 }
    );
    assert!(limits[&9090].enforced());
    assert_eq!((k.source_prefix_v4, k.source_prefix_v6, k.source_table_size), (24, 56, 4096));
    let trusted: Vec<String> = k.trusted.iter().map(ToString::to_string).collect();
    // An IPv4-mapped prefix is the IPv4 prefix (one trie key, one form).
    assert_eq!(trusted, ["10.0.0.0/8", "fd00::/8", "192.0.2.7/32", "198.51.100.0/24"]);
    assert_eq!(k.trusted_reserve, 5);
    assert_eq!(k.xdp_interfaces, ["eth0", "eth1"]);
    assert_eq!(k.xdp_mode, XdpModeChoice::Generic);

    let d = parse("").unwrap().kernel;
    assert_eq!(
        (d.source_prefix_v4, d.source_prefix_v6, d.source_table_size, d.trusted_reserve),
        (32, 64, 65_536, 3)
    );
    assert_eq!(d.connection_table_size, 262_144);
    assert_eq!(parse("kernel.connectionTableSize = 4096").unwrap().kernel.connection_table_size, 4096);
    assert_eq!(d.xdp_mode, XdpModeChoice::Auto);
}

#[test]
fn bad_kernel_options_name_what_is_wrong() {
    for (text, wanted) in [
        ("kernel.port.8080.perSourceMax = 0", "kernel.port.8080.perSourceMax = 0: must be at least 1"),
        ("kernel.port.0.dryRun = true", "`0` is not a port (1-65535)"),
        ("kernel.port.http.dryRun = true", "`http` is not a port"),
        ("kernel.port.8080.maxConn = 3", "unknown option `maxConn`"),
        ("kernel.port.8080 = 3", "expected kernel.port.<port>.perSourceMax"),
        ("kernel.port.8080.dryRun = true", "kernel.port.8080.dryRun: port 8080 has no limit to dry-run"),
        ("kernel.sourcePrefixV4 = 33", "must be between 1 and 32"),
        ("kernel.sourcePrefixV6 = 0", "must be between 1 and 128"),
        ("kernel.sourceTableSize = 5000", "5000 is not a power of two"),
        ("kernel.sourceTableSize = 512", "must be between 1024 and 1048576"),
        ("kernel.connectionTableSize = 100000", "100000 is not a power of two"),
        ("kernel.connectionTableSize = 2048", "must be between 4096 and 16777216"),
        ("kernel.trusted = 10.0.0.1/8", "`10.0.0.1/8` has host bits set; did you mean 10.0.0.0/8?"),
        ("kernel.trusted = 10.0.0.0/33", "prefix length must be 0-32"),
        ("kernel.trusted = fd00::/8, fd00::/8", "fd00::/8 is listed twice"),
        ("kernel.trusted = 10.0.0.0/8, ::ffff:10.0.0.0/104", "10.0.0.0/8 is listed twice"),
        ("kernel.trusted = example.com", "`example.com` is not an IPv4 or IPv6 address"),
        ("kernel.xdp.interfaces = eth0, eth0", "interface eth0 is listed twice"),
        ("kernel.xdp.interfaces = averyveryverylongname0", "is not an interface name"),
        ("kernel.xdp.mode = native", "expected auto, driver or generic"),
    ] {
        let e = error(text);
        assert!(e.contains(wanted), "{text}: got `{e}`, wanted `{wanted}`");
        assert!(e.starts_with("limiter.ini:1: kernel."), "{text}: names file, line and key: {e}");
    }
}

/// The manual's key reference is the key table's rendering; with
/// `LIMITER_BLESS=1` (what `cargo xtask docs` sets) the test writes it
/// there instead.
#[test]
fn the_manual_key_reference_is_the_key_table() {
    use super::reference::{markdown, splice};
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/configuration.md");
    let page = std::fs::read_to_string(&path).unwrap();
    let wanted = splice(&page, &markdown()).expect("docs/configuration.md has the generated table's markers");
    if std::env::var_os("LIMITER_BLESS").is_some() {
        std::fs::write(&path, &wanted).unwrap();
    } else {
        assert!(
            page == wanted,
            "docs/configuration.md's key reference differs from the key table: run `cargo xtask docs`"
        );
    }
}

/// Every row of the reference renders one key: no `|` inside a meaning
/// breaks the table, and each default is the table's.
#[test]
fn the_key_reference_has_one_row_per_key() {
    let table = super::reference::markdown();
    let rows: Vec<&str> = table.lines().skip(2).collect();
    assert_eq!(rows.len(), KEYS.len());
    for (row, key) in rows.iter().zip(KEYS) {
        let cells = row.matches(" | ").count();
        assert_eq!(cells, 3, "{}: a `|` in its text splits the row: {row}", key.name);
        assert!(!key.manual.contains('\n'), "{}: the manual text is one paragraph", key.name);
    }
}

#[test]
fn every_default_parses_and_per_port_defaults_match_their_options() {
    // The empty file applies every default through its own parser.
    let c = Config::default();
    assert_eq!(c.http.workers, std::thread::available_parallelism().map_or(2, |n| n.get()));
    assert_eq!(c.http.upstream, None);
    // Per-port keys are not applied (they need a port): their documented
    // default must be what an option left out means.
    let d = PortOptions::default();
    assert!(!d.dry_run && d.per_source_max == 0);
    for key in KEYS.iter().filter(|k| k.per_port()) {
        if let Some(v) = key.default_value() {
            let text = format!("kernel.ports = 1:1\n{} = {v}\n", key.name.replace("<port>", "1"));
            let port = parse(&text).unwrap().kernel.port_options[&1];
            assert_eq!(port, d, "{}", key.name);
        }
    }
}

#[test]
fn a_reload_diff_names_written_keys_and_restart_keys_compare_effective_values() {
    let old = parse("http.maxThreads = 20\nhttp.workers = 2\nkernel.ports = 80:1\n").unwrap();
    let new = parse("http.maxThreads = 30\nhttp.workers = 2\n").unwrap();
    assert_eq!(old.changes_to(&new), ["http.maxThreads: 20 -> 30", "kernel.ports: 80:1 -> (default)"]);
    assert!(old.restart_changes(&new).is_empty());
    let moved =
        parse("http.listen = 127.0.0.1:9\nbreaker.windowMs = 60000\nhttp.upstream = sample\n").unwrap();
    assert_eq!(old.restart_changes(&moved), ["http.listen", "http.upstream", "breaker.windowMs"]);
    // Writing a restart key's default out is no change.
    let explicit = parse("kernel.pinPath = /sys/fs/bpf/limiter\n").unwrap();
    assert!(parse("").unwrap().restart_changes(&explicit).is_empty());
}

#[test]
fn settings_list_every_key_with_where_its_value_came_from() {
    let c =
        parse("[http]\nmaxThreads = 14\nkernel.ports = 80:1\n[kernel]\nport.80.perSourceMax = 2\n").unwrap();
    let s = c.settings();
    let find = |k: &str| s.iter().find(|x| x.key == k).unwrap_or_else(|| panic!("{k} listed"));
    assert_eq!(
        (find("http.maxThreads").value.as_deref(), find("http.maxThreads").line),
        (Some("14"), Some(2))
    );
    assert_eq!((find("http.lingerMs").value.as_deref(), find("http.lingerMs").line), (Some("2000"), None));
    assert_eq!(find("kernel.port.80.perSourceMax").value.as_deref(), Some("2"));
    assert_eq!(find("http.upstream").value, None);
    assert_eq!(find("http.listen").reload, Reload::Restart);
    assert_eq!(s.len(), KEYS.len() - 2 + 1, "every plain key once, and the one per-port key written");
}

#[test]
fn a_config_with_neither_gate_nor_proxy_is_refused() {
    assert_eq!(
        error("kernel.enabled = false\n"),
        "limiter.ini:1: kernel.enabled: false, and no http.upstream: nothing to run (set http.upstream, or enable the kernel gate)"
    );
    assert!(parse("kernel.enabled = false\nhttp.upstream = sample\n").is_ok());
}

#[test]
fn a_per_source_cap_that_would_refuse_the_proxys_own_connections_is_refused() {
    let base = "[kernel]\nports = 8080:400\nport.8080.perSourceMax = 50\n[http]\nlisten = 0.0.0.0:8081\nupstream = 127.0.0.1:8080\nmaxThreads = 208\n";
    let err = Config::parse(base, "limiter.ini").unwrap_err().to_string();
    assert!(
        err.starts_with("limiter.ini:3: kernel.port.8080.perSourceMax: 50 is below the proxy's 200 slots"),
        "{err}"
    );
    assert!(err.contains("Add 127.0.0.1 to kernel.trusted"), "{err}");
    let trusted = base.replace("[http]", "trusted = 127.0.0.0/8, ::1\n[http]");
    assert!(Config::parse(&trusted, "limiter.ini").is_ok());
    let wide = base.replace("perSourceMax = 50", "perSourceMax = 200");
    assert!(Config::parse(&wide, "limiter.ini").is_ok());
    let elsewhere = base.replace("upstream = 127.0.0.1:8080", "upstream = 10.1.2.3:8080");
    assert!(Config::parse(&elsewhere, "limiter.ini").is_ok(), "a remote upstream is not this gate's");
    let named = base.replace("upstream = 127.0.0.1:8080", "upstream = localhost:8080");
    assert!(Config::parse(&named, "limiter.ini").is_err());
}

#[test]
fn prefixes_contain_their_addresses() {
    let p = |s: &str| {
        let (a, l) = s.split_once('/').unwrap();
        Prefix { addr: a.parse().unwrap(), len: l.parse().unwrap() }
    };
    assert!(p("127.0.0.0/8").contains("127.0.0.1".parse().unwrap()));
    assert!(!p("127.0.0.0/8").contains("128.0.0.1".parse().unwrap()));
    assert!(p("10.0.0.7/32").contains("10.0.0.7".parse().unwrap()));
    assert!(p("0.0.0.0/0").contains("1.2.3.4".parse().unwrap()));
    assert!(p("::1/128").contains("::1".parse().unwrap()));
    assert!(!p("::1/128").contains("127.0.0.1".parse().unwrap()));
    assert!(p("fd00::/8").contains("fd12::1".parse().unwrap()));
}

#[test]
fn an_admin_listener_beyond_loopback_needs_a_token() {
    let err = Config::parse("[admin]\nlisten = 0.0.0.0:9901\n", "limiter.ini").unwrap_err().to_string();
    assert!(
        err.starts_with("limiter.ini:2: admin.listen: 0.0.0.0:9901 is reachable beyond this host"),
        "{err}"
    );
    assert!(Config::parse("[admin]\nlisten = [::1]:9901\n", "limiter.ini").is_ok());
    let dir = std::env::temp_dir().join(format!("limiter-admin-token-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let token = dir.join("token");
    std::fs::write(&token, "0123456789abcdef0123\n").unwrap();
    let text = format!("[admin]\nlisten = 0.0.0.0:9901\ntokenFile = {}\n", token.display());
    // Others may read it: refused, naming the file and its mode.
    chmod(&token, 0o644);
    let err = Config::parse(&text, "limiter.ini").unwrap_err().to_string();
    assert!(
        err.contains(&format!(
            "admin.tokenFile = {0}: {0} (owner uid {1}, group {2}, mode 0644): other users can read it",
            token.display(),
            nix::unistd::geteuid(),
            nix::unistd::getegid()
        )),
        "{err}"
    );
    for mode in [0o600, 0o640, 0o400] {
        chmod(&token, mode);
        assert!(Config::parse(&text, "limiter.ini").is_ok(), "{mode:o}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

fn chmod(path: &std::path::Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

#[test]
fn two_listeners_on_one_port_are_refused_naming_both_keys() {
    let up = "http.upstream = 127.0.0.1:9000\n";
    for (text, key, other) in [
        ("http.listen = 127.0.0.1:8080\nadmin.listen = 127.0.0.1:8080\n", "admin.listen", "http.listen"),
        ("http.listen = 0.0.0.0:8080\nadmin.listen = 127.0.0.1:8080\n", "admin.listen", "http.listen"),
        (
            "http.tls.listen = 127.0.0.1:8080\nhttp.listen = 127.0.0.1:8080\n",
            "http.tls.listen",
            "http.listen",
        ),
        (
            "admin.metricsListen = 127.0.0.1:9901\nadmin.listen = 127.0.0.1:9901\n",
            "admin.metricsListen",
            "admin.listen",
        ),
    ] {
        let e = error(&format!("{up}{text}"));
        assert!(e.contains(key) && e.contains(&format!("the port of {other}")), "{text}: {e}");
    }
    // Different ports, or the same port on two distinct addresses, are fine.
    parse(&format!("{up}http.listen = 127.0.0.1:8080\nadmin.listen = 127.0.0.1:8081\n")).unwrap();
    parse(&format!("{up}http.listen = 127.0.0.1:8080\nadmin.listen = 127.0.0.2:8080\n")).unwrap();
    // Without an upstream http.listen is not bound.
    parse("http.listen = 127.0.0.1:9901\nadmin.listen = 127.0.0.1:9901\n").unwrap();
}

#[test]
fn adaptive_and_the_classes_parse_and_bad_values_name_what_is_wrong() {
    let c = parse("http.adaptive = on\nhttp.adaptive.minLimit = 6\nhttp.critical = /pay/, /health\nhttp.sheddable = /search/\n")
        .unwrap();
    assert!(c.http.adaptive);
    assert_eq!(c.http.adaptive_min_limit, 6);
    assert_eq!(c.http.critical, ["/pay/", "/health"]);
    assert_eq!(c.http.sheddable, ["/search/"]);
    let d = parse("").unwrap();
    assert!(!d.http.adaptive && d.http.adaptive_min_limit == 4 && d.http.critical.is_empty());
    for (text, says) in [
        ("http.adaptive = yes", "neither `on` nor `off`"),
        ("http.adaptive.minLimit = 0", "http.adaptive.minLimit"),
        ("http.critical = pay/", "does not start with `/`"),
        ("http.sheddable = /a/%2e/", "`%`"),
        ("http.sheddable = /a;v=1", "`;`"),
        ("http.critical = /a/../b", "`..` segment"),
        ("http.critical = /a//b", "empty"),
        ("http.critical = /a, /a", "listed twice"),
    ] {
        let e = error(text);
        assert!(e.contains(says), "{text}: {e}");
    }
    let floor = parse("http.maxThreads = 20\nhttp.adaptive = on\nhttp.adaptive.minLimit = 50\n").unwrap();
    assert!(floor.warnings.iter().any(|w| w.contains("above the static pool")), "{:?}", floor.warnings);
}

#[test]
fn a_retired_key_is_warned_about_not_refused() {
    let c =
        Config::parse("http.h1Engine = native\nhttp.maxThreads = 20\n", "limiter.ini").expect("still valid");
    assert!(
        c.warnings.iter().any(|w| w.contains("limiter.ini:1: http.h1Engine is ignored")),
        "{:?}",
        c.warnings
    );
    assert!(!c.ignored.iter().any(|k| k == "http.h1Engine"), "not listed as one of the runtime's keys");
    assert_eq!(c.http.max_threads, 20, "the rest of the file applies");
}

#[test]
fn fleet_keys_need_their_store_their_hash_key_and_a_timeout_inside_the_lease() {
    let dir = std::env::temp_dir().join(format!("limiter-fleet-keys-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let key = dir.join("fleet.key");
    std::fs::write(&key, "0123456789abcdef-fleet\n").unwrap();
    chmod(&key, 0o600);
    let pass = dir.join("redis.pass");
    std::fs::write(&pass, "pw\n").unwrap();
    chmod(&pass, 0o600);
    let up = "http.upstream = 127.0.0.1:9000\n";
    let ok = format!(
        "{up}[fleet]\nstore = redis+cluster://10.0.0.1:7000,10.0.0.2:7000\npasswordFile = {}\nhashKeyFile = {}\n\
         maxSessionConnections = 5\nmaxWebConnections = 100\nname = eu-1\nleaseMs = 3000\ntimeoutMs = 1000\nonStoreDown = refuse\n",
        pass.display(),
        key.display()
    );
    let c = parse(&ok).unwrap();
    let f = &c.fleet;
    assert_eq!(
        f.store.as_ref().map(ToString::to_string).as_deref(),
        Some("redis+cluster://10.0.0.1:7000,10.0.0.2:7000")
    );
    assert_eq!(
        (f.max_session_connections, f.max_web_connections, f.on_store_down),
        (5, 100, OnStoreDown::Refuse)
    );
    assert_eq!(f.password.as_ref().map(|p| p.0.as_str()), Some("pw"));
    assert!(!format!("{c:?}").contains("0123456789abcdef-fleet"), "the hash key is never shown");
    let defaults = Config::default().fleet;
    assert_eq!((defaults.store, defaults.lease_ms, defaults.timeout_ms), (None, 3000, 20));
    assert_eq!((defaults.name.as_str(), defaults.on_store_down), ("default", OnStoreDown::Share));
    for (text, says) in [
        (format!("{up}fleet.maxWebConnections = 3\n"), "fleet.maxWebConnections: needs fleet.store"),
        (
            format!("{up}fleet.store = redis://h\nfleet.maxSessionConnections = 3\n"),
            "fleet.maxSessionConnections: needs fleet.hashKeyFile",
        ),
        (
            format!("{up}fleet.store = redis://h\nfleet.timeoutMs = 1001\n"),
            "more than a third of fleet.leaseMs",
        ),
        ("fleet.store = redis://h\n".to_owned(), "fleet.store: needs http.upstream"),
        (format!("{up}fleet.store = redis://u:pw@h\n"), "fleet.passwordFile"),
        (format!("{up}fleet.nmae = x\n"), "unknown key under `fleet.`"),
        (format!("{up}fleet.onStoreDown = open\n"), "expected share, refuse or local"),
        (format!("{up}fleet.leaseMs = 100\n"), "at least 300"),
        (format!("{up}fleet.name = a:b\n"), "A-Z a-z 0-9"),
    ] {
        let err = error(&text);
        assert!(err.contains(says), "{text}: {err}");
    }
    // A hash key others may read, or too short, is refused naming it.
    chmod(&key, 0o644);
    assert!(error(&ok).contains("other users can read it"));
    chmod(&key, 0o600);
    std::fs::write(&key, "short\n").unwrap();
    assert!(error(&ok).contains("the hash key must be one line of at least 16 characters"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_reload_that_changes_a_fleet_secret_needs_a_restart() {
    let dir = std::env::temp_dir().join(format!("limiter-fleet-reload-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let key = dir.join("fleet.key");
    let write = |text: &str| {
        std::fs::write(&key, text).unwrap();
        chmod(&key, 0o600);
    };
    write("0123456789abcdef-one\n");
    let text = format!(
        "http.upstream = 127.0.0.1:9000\nfleet.store = redis://h\nfleet.hashKeyFile = {}\nfleet.maxSessionConnections = 2\n",
        key.display()
    );
    let before = parse(&text).unwrap();
    let live = parse(&text.replace("maxSessionConnections = 2", "maxSessionConnections = 3")).unwrap();
    assert!(before.restart_changes(&live).is_empty());
    write("0123456789abcdef-two\n");
    let after = parse(&text).unwrap();
    assert_eq!(before.restart_changes(&after), ["fleet.hashKeyFile"]);
    assert!(before.changes_to(&after).contains(&"fleet.hashKeyFile: (contents changed)".to_owned()));
    let moved = parse(&text.replace("redis://h", "redis://other")).unwrap();
    assert_eq!(after.restart_changes(&moved), ["fleet.store"]);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The README's first configuration (its one `ini` block) is valid and
/// means what the README says of it.
#[test]
fn the_readmes_first_configuration_is_valid() {
    let readme = include_str!("../../../README.md");
    let block = readme.split("```ini\n").nth(1).and_then(|b| b.split("```").next()).expect("an ini block");
    let c = Config::parse(block, "README.md").unwrap_or_else(|e| panic!("the README's configuration: {e}"));
    assert_eq!(c.kernel.ports, BTreeMap::from([(8080, 400)]));
    assert_eq!(c.http.normal_limit(), 208 - 8 - 3, "the README says 3 slots for /debug/, 8 for Jetty");
}
