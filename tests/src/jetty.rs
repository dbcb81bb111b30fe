//! A real Jetty 9.4 (Debian's `jetty9`, installed by set-up) as the
//! upstream: `tests/jetty/LimiterUpstream.java`, compiled here with `javac`
//! against Debian's jars and run with `java`, with Jetty's
//! `ForwardedRequestCustomizer` as operators run it behind a proxy. It
//! records every request it serves and counts how many it works on at
//! once; a control listener of its own (a JDK HTTP server: none of Jetty's
//! threads) reports both. `GET /view` answers Jetty's view of a request
//! ([`View`]); `?ms=N` holds a request N ms, `?bytes=N` streams N bytes
//! over them; `/secure/` is behind Jetty's `BasicAuthenticator` (`user:pas`).

use std::{
    io::{BufRead as _, BufReader},
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::Duration,
};

use crate::process::run_with_deadline;

/// Debian's jars the upstream is built and run against.
const JARS: [&str; 7] = [
    "/usr/share/java/jetty9-server.jar",
    "/usr/share/java/jetty9-http.jar",
    "/usr/share/java/jetty9-io.jar",
    "/usr/share/java/jetty9-util.jar",
    "/usr/share/java/jetty9-servlet.jar",
    "/usr/share/java/jetty9-security.jar",
    "/usr/share/java/servlet-api.jar",
];

/// One request Jetty served.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Served {
    pub method: String,
    /// Path and query.
    pub target: String,
    pub body_len: u64,
    /// `X-Forwarded-For`, `-` without one.
    pub forwarded_for: String,
    /// `X-Request-Id`, `-` without one.
    pub request_id: String,
}

/// What the servlet API told Jetty's servlet of a request (`GET /view`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct View {
    /// `name value` lines: `secure`, `remote_addr`, `scheme`, `server_name`,
    /// `server_port`, `ssl_session_id`, `cipher_suite`, `certificate`.
    pub facts: Vec<(String, String)>,
    /// The headers it got: names lower case, and values.
    pub headers: Vec<(String, String)>,
}

impl View {
    /// The view in a `GET /view` answer's body.
    pub fn parse(text: &str) -> Self {
        let mut view = Self::default();
        for line in text.lines() {
            let (name, value) = line.split_once(' ').unwrap_or((line, ""));
            if name == "header" {
                let (name, value) = value.split_once(' ').unwrap_or((value, ""));
                view.headers.push((name.to_owned(), value.to_owned()));
            } else {
                view.facts.push((name.to_owned(), value.to_owned()));
            }
        }
        assert!(view.facts.len() == 8, "a view of eight facts: {text:?}");
        view
    }

    pub fn fact(&self, name: &str) -> &str {
        self.facts.iter().find(|(n, _)| n == name).map_or("", |(_, v)| v)
    }
}

/// What Jetty's servlet counted since the last [`Jetty::reset`].
#[derive(Clone, Copy, Debug, Default)]
pub struct Stats {
    /// Requests in the servlet now.
    pub inflight: u64,
    /// The most in the servlet at once.
    pub peak: u64,
    /// The most queued in Jetty's thread pool, waiting for a thread.
    pub queued_peak: u64,
    pub served: u64,
}

/// The Jetty process, killed (by its pid) on drop.
pub struct Jetty {
    pub addr: SocketAddr,
    control: SocketAddr,
    child: Child,
}

/// The compiled upstream, built once per source change.
fn classes() -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("jetty/LimiterUpstream.java");
    let out = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/jetty-classes");
    let class = out.join("LimiterUpstream.class");
    let fresh = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    if fresh(&class).is_none() || fresh(&class) < fresh(&src) {
        for jar in JARS {
            assert!(
                Path::new(jar).is_file(),
                "{jar} is missing: run `cargo xtask setup` (it installs jetty9)"
            );
        }
        std::fs::create_dir_all(&out).expect("the classes' directory");
        let out_javac = run_with_deadline(
            Command::new("javac").arg("-d").arg(&out).arg("-cp").arg(JARS.join(":")).arg(&src),
            Duration::from_secs(120),
        );
        assert!(out_javac.status.success(), "javac failed: {}", String::from_utf8_lossy(&out_javac.stderr));
    }
    out
}

impl Jetty {
    /// Starts Jetty with `threads` threads in its pool.
    pub fn start(threads: usize) -> Self {
        let classes = classes();
        let [port, control] = crate::free_ports::<2>();
        let mut child = Command::new("java")
            .arg("-Xmx256m")
            .arg("-cp")
            .arg(format!("{}:{}", classes.display(), JARS.join(":")))
            .arg("LimiterUpstream")
            .args([port.to_string(), control.to_string(), threads.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting java (installed by set-up)");
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            let ready = lines.by_ref().any(|l| l.is_ok_and(|l| l == "READY"));
            let _ = tx.send(ready);
            // Keep the pipe drained.
            for _ in lines {}
        });
        let ready = rx.recv_timeout(Duration::from_secs(60)).unwrap_or(false);
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let control = SocketAddr::from(([127, 0, 0, 1], control));
        let jetty = Self { addr, control, child };
        assert!(ready, "Jetty did not say READY within 60 s");
        jetty
    }

    fn control(&self, method: &str, path: &str) -> String {
        let reply = crate::client::send(
            self.control,
            format!(
                "{method} {path} HTTP/1.1\r\nHost: ctl\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
            )
            .as_bytes(),
        )
        .expect("Jetty's control listener answers");
        assert_eq!(reply.status, 200, "Jetty's control listener: {}", reply.text());
        reply.text()
    }

    /// Every request served since the last reset, in order.
    pub fn served(&self) -> Vec<Served> {
        self.control("GET", "/served")
            .lines()
            .map(|line| {
                let f: Vec<&str> = line.split('\t').collect();
                assert_eq!(f.len(), 5, "a record of five fields: {line:?}");
                Served {
                    method: f[0].to_owned(),
                    target: f[1].to_owned(),
                    body_len: f[2].parse().expect("a body length"),
                    forwarded_for: f[3].to_owned(),
                    request_id: f[4].to_owned(),
                }
            })
            .collect()
    }

    pub fn stats(&self) -> Stats {
        let text = self.control("GET", "/stats");
        let get = |name: &str| -> u64 {
            text.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
                .unwrap_or_else(|| panic!("{name} missing from Jetty's stats: {text:?}"))
                .parse()
                .expect("a number")
        };
        Stats {
            inflight: get("inflight"),
            peak: get("peak"),
            queued_peak: get("queued_peak"),
            served: get("served"),
        }
    }

    /// Clears the records and the peaks.
    pub fn reset(&self) {
        self.control("POST", "/reset");
    }
}

impl Drop for Jetty {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
