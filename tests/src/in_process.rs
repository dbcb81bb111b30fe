//! The real daemon driven in this process: `daemon::prepare` and
//! `daemon::run` on `127.0.0.1:0`, the proxy alone (no kernel gate, so no
//! privileges), its reloads and its shutdown in the test's hands.

use std::{
    net::SocketAddr,
    path::PathBuf,
    sync::atomic::{AtomicU64, Ordering},
    thread,
    time::{Duration, Instant},
};

use limiter::{
    config::Config,
    daemon::{self, RunOptions},
};

use crate::client::{self, Reply};

/// A daemon running in this process, stopped on drop.
pub struct InProcess {
    pub dir: PathBuf,
    file: PathBuf,
    base: String,
    pub proxy: SocketAddr,
    /// `http.tls.listen`, when `extra` set it.
    pub tls: Option<SocketAddr>,
    /// `admin.metricsListen`, when `extra` set it.
    pub metrics: Option<SocketAddr>,
    pub admin: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<thread::JoinHandle<()>>,
}

static SEQ: AtomicU64 = AtomicU64::new(0);

impl InProcess {
    /// Starts the daemon in front of `upstream` with `extra` keys after
    /// the harness's own (one worker, both listeners on port 0).
    pub fn start(upstream: SocketAddr, extra: &str) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "limiter-inproc-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("limiter.ini");
        let base = format!(
            "kernel.enabled = false\nadmin.listen = 127.0.0.1:0\nadmin.socket = {}\nhttp.listen = 127.0.0.1:0\n\
             http.workers = 1\nhttp.upstream = {upstream}\n",
            dir.join("admin.sock").display()
        );
        std::fs::write(&file, format!("{base}{extra}")).unwrap();
        let config = Config::load(&file).unwrap();
        let options = RunOptions { config_path: file.clone(), unload_on_exit: false, user_uid: None };
        let prepared = daemon::prepare(config, options).unwrap();
        let admin = prepared.admin_addr().unwrap();
        let proxy = prepared.http_addr().expect("a proxy: http.upstream is set");
        let tls = prepared.tls_addr();
        let metrics = prepared.metrics_addr();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            runtime.block_on(async move {
                let (_reload_tx, reloads) = tokio::sync::mpsc::unbounded_channel();
                daemon::run(prepared, reloads, async move {
                    let _ = stopped.await;
                })
                .await
                .unwrap();
            });
        });
        Self { dir, file, base, proxy, tls, metrics, admin, stop: Some(stop), thread: Some(thread) }
    }

    /// Rewrites the file with `extra` after the harness's keys and reloads
    /// through `POST /reload`; fails the test unless it was applied.
    pub fn reload(&self, extra: &str) {
        std::fs::write(&self.file, format!("{}{extra}", self.base)).unwrap();
        let (status, text) = self.socket("POST", "/reload");
        assert_eq!(status, 200, "reload: {text}");
        assert!(text.contains("\"applied\":true"), "{text}");
    }

    /// The file the daemon reads, and the harness's own keys at its top.
    pub fn file(&self) -> (&std::path::Path, &str) {
        (&self.file, &self.base)
    }

    /// A request to the proxy.
    pub fn get(&self, path: &str, headers: &[&str]) -> Reply {
        client::get(self.proxy, path, headers)
    }

    /// A request to the admin socket: status and body.
    pub fn socket(&self, method: &str, path: &str) -> (u16, String) {
        crate::unix_request(&self.dir.join("admin.sock"), method, path)
            .expect("an answer on the admin socket")
    }

    /// A request to the admin listener (TCP).
    pub fn admin(&self, method: &str, path: &str, headers: &[&str]) -> Reply {
        let extra: String = headers.iter().map(|h| format!("{h}\r\n")).collect();
        let raw = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nContent-Length: 0\r\n{extra}\r\n",
            self.admin
        );
        client::send(self.admin, raw.as_bytes()).expect("an admin answer")
    }

    /// A sample of `/metrics` (its exact name and labels); fails the test
    /// when the page lacks it ([`crate::metric`]).
    pub fn metric(&self, sample: &str) -> f64 {
        crate::metric(&self.admin("GET", "/metrics", &[]).text(), sample)
    }

    /// Rewrites the file with `extra` and reloads; the reload's answer
    /// (applied or not).
    pub fn try_reload(&self, extra: &str) -> (u16, String) {
        std::fs::write(&self.file, format!("{}{extra}", self.base)).unwrap();
        self.socket("POST", "/reload")
    }

    /// The breaker's state, from `GET /breaker`.
    pub fn breaker_state(&self) -> String {
        let v: serde_json::Value = serde_json::from_str(&self.socket("GET", "/breaker").1).unwrap();
        v["state"].as_str().expect("a state").to_owned()
    }

    /// Stops the daemon (drain included); returns how long `run` took to
    /// return.
    pub fn stop(&mut self) -> Duration {
        let started = Instant::now();
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            t.join().expect("the daemon's thread");
        }
        started.elapsed()
    }
}

impl Drop for InProcess {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
