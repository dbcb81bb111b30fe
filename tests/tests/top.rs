//! `limiter top` in a real terminal (tmux, 80x24): the cells on its screen
//! match `limiter dump --json` taken at the same moment, and every line
//! fits 80 columns; without a terminal it prints plain lines.

use std::time::{Duration, Instant};

use limiter_tests::*;

fn tmux(args: &[&str]) -> String {
    run("tmux", args).unwrap_or_else(|e| panic!("tmux {}: {e}", args.join(" ")))
}

/// The row of `port` on a screen: its whitespace-separated cells.
fn row(screen: &str, port: u16) -> Vec<String> {
    screen
        .lines()
        .map(|l| l.split_whitespace().map(str::to_owned).collect::<Vec<_>>())
        .find(|cells| cells.first().map(String::as_str) == Some(&port.to_string()))
        .unwrap_or_else(|| panic!("no row for port {port} on\n{screen}"))
}

#[test]
#[ignore = "black-box: the daemon binary, root, real sockets; run by `cargo xtask test`"]
fn top_in_a_real_terminal_shows_what_the_dump_shows() {
    require_kernel!();
    let (p, q) = (free_port(), free_port());
    let sb = Sandbox::new().unwrap();
    let config = sb.config(&format!("{p}:3, {q}:10"), "http.upstream = sample\n");
    let daemon = Daemon::start(&config, &[]).unwrap();
    let lp = sb.listen(&format!("127.0.0.1:{p}"), 128);
    let lq = sb.listen(&format!("127.0.0.1:{q}"), 128);
    let held: Vec<_> = (0..3)
        .map(|_| sb.connect(&format!("127.0.0.1:{p}")).unwrap())
        .chain((0..4).map(|_| sb.connect(&format!("127.0.0.1:{q}")).unwrap()))
        .collect();
    wait_established(&sb.pin_path, p, 3);
    wait_established(&sb.pin_path, q, 4);
    for _ in 0..2 {
        assert!(sb.connect(&format!("127.0.0.1:{p}")).is_err());
    }

    let session = format!("limiter-top-{}", std::process::id());
    // `limiter top` runs until its session is killed: on every way out of
    // this test, a panic included.
    struct Session<'a>(&'a str);
    impl Drop for Session<'_> {
        fn drop(&mut self) {
            let _ = limiter_tests::process::try_run_with_deadline(
                std::process::Command::new("tmux").args(["kill-session", "-t", self.0]),
                limiter_tests::process::DEADLINE,
            );
        }
    }
    let command = format!("{} top --config {} --interval-ms 200", limiter_bin().display(), config.display());
    tmux(&["new-session", "-d", "-s", &session, "-x", "80", "-y", "24", &command]);
    let running = Session(&session);
    // Until the view has refreshed once after its first block (a rate is
    // shown only from the second sample on).
    let deadline = Instant::now() + Duration::from_secs(10);
    let screen = loop {
        let screen = tmux(&["capture-pane", "-p", "-t", &session]);
        // REF/s (the 7th cell) is `-` until there is a rate.
        let shown = |port: u16| {
            screen.lines().map(|l| l.split_whitespace().collect::<Vec<_>>()).any(|cells| {
                cells.first() == Some(&port.to_string().as_str()) && cells.get(6).is_some_and(|c| *c != "-")
            })
        };
        if (shown(p) && shown(q) && screen.contains("breaker")) || Instant::now() > deadline {
            break screen;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    drop(running);
    let d = dump(&sb.pin_path);

    for line in screen.lines() {
        assert!(line.chars().count() <= 80, "wider than 80 columns: {line:?}");
    }
    assert!(screen.contains(&format!("daemon pid {}", daemon.pid())), "{screen}");
    assert!(screen.contains("HTTP in use/limit") && screen.contains("breaker closed"), "{screen}");
    assert!(screen.contains("HTTP req/s by protocol: h1 "), "the protocols line: {screen}");
    for port in [p, q] {
        let cells = row(&screen, port);
        let want = limiter_tests::port(&d, port);
        // PORT LIMIT PER-SRC ESTAB PEAK REFUSED REF/s XDP/s SRC
        assert_eq!(cells[1], want.limit.unwrap().to_string(), "limit of {port}: {screen}");
        assert_eq!(cells[3], want.established.to_string(), "established on {port}: {screen}");
        assert_eq!(cells[4], want.high_watermark.to_string(), "peak of {port}: {screen}");
        assert_eq!(cells[5], want.refused.to_string(), "refused on {port}: {screen}");
        assert_eq!(cells[6], "0.0", "nothing is refused now: {screen}");
    }
    assert_eq!(limiter_tests::port(&d, p).refused, 2);

    // Not a terminal: plain lines, no escape sequences.
    let out = limiter(&["top", "--once", "--config", config.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && !text.contains('\x1b'), "{text:?}");
    assert_eq!(row(&text, p)[3], "3");
    drop((held, lp, lq));
}
