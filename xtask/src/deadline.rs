//! A deadline for each black-box test. Each test binary runs its tests one
//! at a time (`--test-threads=1`), and libtest then writes `test NAME ... `
//! as a test starts and its result when it ends. This runner passes the
//! binary's output on, watches for those two events, and when one test
//! runs past its deadline it kills the binary's run (the binary and what
//! it started: one process group) and fails naming the test, minutes
//! before anything else would notice a hang.

use std::{
    io::Read as _,
    os::unix::process::CommandExt as _,
    process::{Command, Stdio},
    sync::{Arc, Mutex},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

/// What any one black-box test may take. The slowest take about a minute
/// on two cores (a soak-like load, a layout migration under traffic).
pub const PER_TEST: Duration = Duration::from_secs(180);

/// The test running now, if any, and when it started.
#[derive(Default)]
struct Watch {
    running: Option<(String, Instant)>,
    line: Vec<u8>,
}

impl Watch {
    /// Takes a chunk of libtest's standard output.
    fn feed(&mut self, bytes: &[u8]) {
        for &b in bytes {
            if b == b'\n' {
                let line = String::from_utf8_lossy(&self.line).into_owned();
                // libtest's own "has been running for over 60 seconds"
                // note does not end the test.
                if !line.contains(" has been running for over ") {
                    self.running = None;
                }
                self.line.clear();
            } else {
                self.line.push(b);
                if b == b' ' && self.running.is_none() {
                    let line = String::from_utf8_lossy(&self.line);
                    if let Some(name) = line.strip_prefix("test ").and_then(|l| l.strip_suffix(" ... ")) {
                        self.running = Some((name.to_owned(), Instant::now()));
                    }
                }
            }
        }
    }

    /// The test past `limit`, with how long it has run.
    fn overdue(&self, limit: Duration) -> Option<(String, Duration)> {
        let (name, started) = self.running.as_ref()?;
        let ran = started.elapsed();
        (ran > limit).then(|| (name.clone(), ran))
    }
}

/// Runs `cmd` (a test binary, or a `cargo test`, with
/// `--test-threads=1`) with a deadline of `limit` for each test it runs,
/// passing its output to `out`.
pub fn run(
    what: &str,
    cmd: &mut Command,
    limit: Duration,
    mut out: impl std::io::Write + Send + 'static,
) -> Result<()> {
    let mut child = cmd
        .stdout(Stdio::piped())
        .process_group(0)
        .spawn()
        .with_context(|| format!("{what}: could not start {cmd:?}"))?;
    let group = child.id();
    let watch = Arc::new(Mutex::new(Watch::default()));
    let mut stdout = child.stdout.take().context("a piped stdout")?;
    let reader = {
        let watch = Arc::clone(&watch);
        thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = stdout.read(&mut buf) {
                if n == 0 {
                    break;
                }
                let _ = out.write_all(&buf[..n]);
                let _ = out.flush();
                watch.lock().expect("the watch").feed(&buf[..n]);
            }
        })
    };
    loop {
        if let Some(status) = child.try_wait()? {
            let _ = reader.join();
            if !status.success() {
                bail!("{what} failed ({status})");
            }
            return Ok(());
        }
        let overdue = watch.lock().expect("the watch").overdue(limit);
        if let Some((name, ran)) = overdue {
            // The whole group: cargo, the test binary, the daemons it started.
            // SAFETY: a plain system call on a process group this process
            // created; no memory is shared.
            unsafe { libc::kill(-(group as i32), libc::SIGKILL) };
            let _ = child.wait();
            bail!(
                "{what}: test `{name}` ran past its deadline ({} s; ran {} s) and was killed with the run",
                limit.as_secs(),
                ran.as_secs()
            );
        }
        thread::sleep(Duration::from_millis(200));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_test_is_watched_from_its_name_to_its_result() {
        let mut w = Watch::default();
        w.feed(b"\nrunning 2 tests\ntest a::b ... ");
        assert_eq!(w.running.as_ref().map(|r| r.0.as_str()), Some("a::b"));
        w.feed(b"test a::b has been running for over 60 seconds\n");
        assert!(w.running.is_some(), "libtest's note does not end it");
        w.feed(b"ok\ntest c ");
        assert!(w.running.is_none());
        w.feed(b"... FAILED\n\ntest result: FAILED. 1 passed; 1 failed\n");
        assert!(w.running.is_none());
    }

    #[test]
    fn a_hung_test_fails_the_run_by_name() {
        let script = "echo 'running 1 tests'; printf 'test hangs::forever ... '; exec sleep 30";
        let started = Instant::now();
        let err = run(
            "a hung run",
            Command::new("sh").args(["-c", script]),
            Duration::from_millis(300),
            std::io::sink(),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("test `hangs::forever` ran past its deadline"), "{err}");
        assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
    }

    #[test]
    fn a_run_within_its_deadlines_passes() {
        let script =
            "printf 'test quick ... '; sleep 0.2; echo ok; printf 'test quick2 ... '; sleep 0.2; echo ok";
        run("a quick run", Command::new("sh").args(["-c", script]), Duration::from_secs(2), std::io::sink())
            .unwrap();
    }
}
