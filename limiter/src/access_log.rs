//! The access log (`http.accessLog`): one JSON object per request and
//! line, written by a thread of its own so that a slow disk (or a pipe
//! nobody reads) never slows a request. Requests hand their [`Entry`] to
//! a bounded queue; one that does not fit is dropped and counted.
//!
//! The file is opened for appending; SIGUSR1 ([`reopen_all`]) and every
//! successful reload reopen it, so logrotate can move it away and have
//! the next line start a new file.

use std::{
    fs::OpenOptions,
    io::{self, Write},
    path::PathBuf,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
        mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError, sync_channel},
    },
    time::{Duration, SystemTime},
};

use crate::config::AccessLog as Target;

/// Entries that may wait for the writer; more are dropped.
pub const QUEUE: usize = 8192;

/// Bumped by SIGUSR1: every access log reopens its file.
static REOPENS: AtomicU64 = AtomicU64::new(0);

/// Asks every access log of the process to reopen its file (SIGUSR1).
pub fn reopen_all() {
    REOPENS.fetch_add(1, Ordering::Relaxed);
}

/// One request as the log tells it.
#[derive(Debug)]
pub struct Entry {
    pub ts: SystemTime,
    /// The request's id (its `X-Request-Id` upstream).
    pub id: crate::request_id::RequestId,
    pub client: std::net::SocketAddr,
    pub proto: &'static str,
    pub method: hyper::Method,
    pub path: String,
    pub status: u16,
    /// The refusal reason, for the proxy's own 503s.
    pub reason: Option<&'static str>,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub ms: f64,
    pub upstream_ms: Option<f64>,
    /// The keyed hash of the `Authorization` value (never the value).
    pub session: Option<u32>,
}

impl Entry {
    /// The JSON line (with its newline), fields in docs/access-log.md's order.
    pub fn line(&self) -> String {
        use std::fmt::Write as _;
        let text = |s: &str| serde_json::Value::from(s).to_string();
        let mut line = String::with_capacity(256);
        let _ = write!(
            line,
            "{{\"ts\":\"{}\",\"id\":{},\"client\":\"{}\",\"proto\":\"{}\",\"method\":{},\"path\":{},\"status\":{}",
            crate::utc::rfc3339(self.ts),
            text(self.id.as_str()),
            self.client,
            self.proto,
            text(self.method.as_str()),
            text(&self.path),
            self.status
        );
        if let Some(reason) = self.reason {
            let _ = write!(line, ",\"reason\":\"{reason}\"");
        }
        let _ = write!(
            line,
            ",\"bytes_in\":{},\"bytes_out\":{},\"ms\":{}",
            self.bytes_in,
            self.bytes_out,
            round3(self.ms)
        );
        match self.upstream_ms {
            Some(ms) => _ = write!(line, ",\"upstream_ms\":{}", round3(ms)),
            None => line.push_str(",\"upstream_ms\":null"),
        }
        match self.session {
            Some(h) => _ = writeln!(line, ",\"session\":\"{h:08x}\"}}"),
            None => line.push_str(",\"session\":null}\n"),
        }
        line
    }
}

fn round3(ms: f64) -> f64 {
    (ms * 1000.0).round() / 1000.0
}

/// The access log of one proxy.
#[derive(Debug)]
pub struct AccessLogger {
    tx: SyncSender<Entry>,
    enabled: AtomicBool,
    /// Where the writer should write from now on (set by a reload).
    target: Arc<Mutex<Target>>,
    /// Bumped by a reload: the writer reopens.
    reopens: Arc<AtomicU64>,
    pub stats: Arc<Stats>,
}

/// What the writer did, for the metrics.
#[derive(Debug, Default)]
pub struct Stats {
    pub written: AtomicU64,
    pub dropped: AtomicU64,
    pub write_errors: AtomicU64,
}

impl AccessLogger {
    /// Starts the writer thread for `target` (it idles while the log is
    /// off).
    pub fn start(target: &Target) -> Self {
        let (tx, rx) = sync_channel(QUEUE);
        let shared = Arc::new(Mutex::new(target.clone()));
        let reopens = Arc::new(AtomicU64::new(0));
        let stats = Arc::new(Stats::default());
        let writer = Writer {
            rx,
            target: shared.clone(),
            reopens: reopens.clone(),
            stats: stats.clone(),
            out: None,
            seen: (u64::MAX, u64::MAX),
        };
        std::thread::Builder::new()
            .name("access-log".into())
            .spawn(move || writer.run())
            .expect("spawn the access log thread");
        Self { tx, enabled: AtomicBool::new(*target != Target::Off), target: shared, reopens, stats }
    }

    /// Whether requests should be logged now.
    pub fn enabled(&self) -> bool {
        self.enabled.load(Ordering::Relaxed)
    }

    /// Queues `entry`, or drops and counts it when the queue is full.
    pub fn log(&self, entry: Entry) {
        match self.tx.try_send(entry) {
            Ok(()) => {}
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.stats.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// A reload: the new target, and the file reopened either way.
    pub fn reload(&self, target: &Target) {
        *self.target.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = target.clone();
        self.enabled.store(*target != Target::Off, Ordering::Relaxed);
        self.reopens.fetch_add(1, Ordering::Relaxed);
    }
}

/// A reopen asked for (SIGUSR1, a reload) happens at the next line, or
/// within this long when no line comes (the file rotated away is closed).
const IDLE_REOPEN: Duration = Duration::from_secs(5);

struct Writer {
    rx: Receiver<Entry>,
    target: Arc<Mutex<Target>>,
    reopens: Arc<AtomicU64>,
    stats: Arc<Stats>,
    out: Option<io::BufWriter<Box<dyn Write + Send>>>,
    /// The reopen generations (signal, reload) the open file is from.
    seen: (u64, u64),
}

impl Writer {
    fn run(mut self) {
        loop {
            match self.rx.recv_timeout(IDLE_REOPEN) {
                Ok(entry) => {
                    self.refresh();
                    self.write(&entry);
                    // Batch what is queued, then flush once.
                    while let Ok(entry) = self.rx.try_recv() {
                        self.write(&entry);
                    }
                    self.flush();
                }
                Err(RecvTimeoutError::Timeout) => self.refresh(),
                Err(RecvTimeoutError::Disconnected) => {
                    self.flush();
                    return;
                }
            }
        }
    }

    /// Reopens when a signal or a reload asked for it.
    fn refresh(&mut self) {
        let now = (REOPENS.load(Ordering::Relaxed), self.reopens.load(Ordering::Relaxed));
        if now == self.seen {
            return;
        }
        self.seen = now;
        self.flush();
        let target = self.target.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
        self.out = match target {
            Target::Off => None,
            Target::Stderr => Some(io::BufWriter::new(Box::new(io::stderr()))),
            Target::File(path) => open(&path),
        };
    }

    fn write(&mut self, entry: &Entry) {
        let Some(out) = &mut self.out else {
            self.stats.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        };
        match out.write_all(entry.line().as_bytes()) {
            Ok(()) => self.stats.written.fetch_add(1, Ordering::Relaxed),
            Err(_) => self.stats.write_errors.fetch_add(1, Ordering::Relaxed),
        };
    }

    fn flush(&mut self) {
        if let Some(out) = &mut self.out
            && out.flush().is_err()
        {
            self.stats.write_errors.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Opens the log for appending: created 0640 (lines can hold query
/// strings), never through a symbolic link (whoever can write the log's
/// directory could point one at a file only root may write).
fn open(path: &PathBuf) -> Option<io::BufWriter<Box<dyn Write + Send>>> {
    use std::os::unix::fs::OpenOptionsExt as _;
    match OpenOptions::new().create(true).append(true).mode(0o640).custom_flags(libc::O_NOFOLLOW).open(path) {
        Ok(file) => Some(io::BufWriter::with_capacity(64 * 1024, Box::new(file))),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            use std::os::unix::fs::MetadataExt as _;
            let (uid, mode) =
                std::fs::symlink_metadata(path).map_or((u32::MAX, 0), |m| (m.uid(), m.mode() & 0o7777));
            tracing::error!(
                path = %path.display(),
                link_owner_uid = uid,
                link_mode = format_args!("{mode:04o}"),
                "http.accessLog: the path is a symbolic link (owner uid {uid}, mode {mode:04o}): not followed; lines are dropped until it is a file"
            );
            None
        }
        Err(e) => {
            tracing::error!(path = %path.display(), "http.accessLog: cannot open the file: {e}; lines are dropped until a reload or SIGUSR1 opens it");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_log_is_created_0640_and_never_opened_through_a_link() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = std::env::temp_dir().join(format!("limiter-log-open-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("access.log");
        assert!(open(&log).is_some());
        assert_eq!(std::fs::metadata(&log).unwrap().permissions().mode() & 0o777, 0o640);
        let target = dir.join("root-only");
        std::fs::write(&target, "").unwrap();
        let link = dir.join("linked.log");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert!(open(&link).is_none(), "opened through a link");
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn entry() -> Entry {
        Entry {
            ts: std::time::UNIX_EPOCH + Duration::from_millis(1_764_583_200_123),
            id: crate::request_id::RequestId::Own(*b"00000000000000ab"),
            client: "127.0.0.1:5000".parse().unwrap(),
            proto: "h2+tls",
            method: hyper::Method::GET,
            path: "/a\"b\\c\n".into(),
            status: 503,
            reason: Some("session"),
            bytes_in: 0,
            bytes_out: 70,
            ms: 0.123_456,
            upstream_ms: None,
            session: Some(0xab),
        }
    }

    #[test]
    fn a_line_is_one_json_object_with_every_field() {
        let line = entry().line();
        assert!(line.ends_with('\n') && line.matches('\n').count() == 1, "{line}");
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["ts"], "2025-12-01T10:00:00.123Z");
        assert_eq!(v["path"], "/a\"b\\c\n");
        assert_eq!(v["session"], "000000ab");
        assert_eq!(v["reason"], "session");
        assert_eq!(v["ms"], 0.123);
        assert!(v["upstream_ms"].is_null());
        let keys: Vec<&String> = v.as_object().unwrap().keys().collect();
        assert_eq!(keys.len(), 13, "{keys:?}");
        assert_eq!(v["id"], "00000000000000ab");
        assert!(line.starts_with("{\"ts\":"), "{line}");
        let plain = Entry { reason: None, session: None, upstream_ms: Some(1.5), ..entry() };
        let v: serde_json::Value = serde_json::from_str(&plain.line()).unwrap();
        assert!(v.get("reason").is_none() && v["session"].is_null() && v["upstream_ms"] == 1.5);
    }

    #[test]
    fn a_full_queue_drops_and_counts_and_reload_reopens() {
        let dir = std::env::temp_dir().join(format!("limiter-access-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("access.log");
        let log = AccessLogger::start(&Target::File(path.clone()));
        for _ in 0..100 {
            log.log(entry());
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while log.stats.written.load(Ordering::Relaxed) + log.stats.dropped.load(Ordering::Relaxed) < 100 {
            assert!(std::time::Instant::now() < deadline, "the writer did not catch up");
            std::thread::sleep(Duration::from_millis(10));
        }
        let written = log.stats.written.load(Ordering::Relaxed);
        let lines = std::fs::read_to_string(&path).unwrap().lines().count() as u64;
        assert_eq!(lines, written);
        // Rotation: move the file away, reload, the next line is in a new file.
        std::fs::rename(&path, dir.join("access.log.1")).unwrap();
        log.reload(&Target::File(path.clone()));
        std::thread::sleep(Duration::from_millis(400));
        log.log(entry());
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while std::fs::read_to_string(&path).map_or(0, |t| t.lines().count()) != 1 {
            assert!(std::time::Instant::now() < deadline, "no new file after the reopen");
            std::thread::sleep(Duration::from_millis(10));
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
