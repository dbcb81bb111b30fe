//! Deadlines for what a test waits on. A test that starts a process bounds
//! how long it waits for it: a regression that makes `limiter` hang fails
//! the test, with what the process printed, instead of hanging CI. A test
//! that waits for something to happen polls for it with a deadline rather
//! than sleeping and hoping.

use std::{
    fs,
    io::Read as _,
    process::{Command, Output, Stdio},
    thread,
    time::{Duration, Instant},
};

use nix::{
    sys::signal::{Signal, kill},
    unistd::Pid,
};

use crate::{Daemon, limiter_bin};

/// How often a wait looks again.
const POLL: Duration = Duration::from_millis(10);

/// How long a `limiter` command (`dump`, `unload`, a `run` expected to
/// fail at start-up) may take before the test fails: generous, since CI
/// machines are slow, and finite.
pub const DEADLINE: Duration = Duration::from_secs(30);

/// Polls `cond` until it holds; fails the test naming `what` if it does
/// not within `within`.
pub fn wait_for(what: &str, within: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !cond() {
        assert!(Instant::now() < deadline, "{what}: not within {within:?}");
        thread::sleep(POLL);
    }
}

/// Runs `cmd` to completion and returns its output, like
/// [`Command::output`], but for at most `within`: past that the process
/// is killed (by its pid) and the calling test fails with its output.
/// (The process must not leave a child of its own holding its output
/// open; wrappers such as `setpriv` and `nsenter` exec, so they do not.)
pub fn run_with_deadline(cmd: &mut Command, within: Duration) -> Output {
    let what = format!("{cmd:?}");
    match try_run_with_deadline(cmd, within) {
        Ok(out) => out,
        Err(out) => panic!(
            "{what} did not finish within {within:?} and was killed\nstdout:\n{}\nstderr:\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    }
}

/// [`run_with_deadline`] without failing the test: `Err` holds what the
/// process printed before it was killed (for clean-up in `Drop`, where a
/// panic would abort).
pub fn try_run_with_deadline(cmd: &mut Command, within: Duration) -> Result<Output, Output> {
    let what = format!("{cmd:?}");
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("starting {what}: {e}"));
    // Drained while it runs, so a full pipe never blocks the child.
    let drain = |mut pipe: Box<dyn std::io::Read + Send>| {
        thread::spawn(move || {
            let mut out = Vec::new();
            let _ = pipe.read_to_end(&mut out);
            out
        })
    };
    let stdout = drain(Box::new(child.stdout.take().expect("piped stdout")));
    let stderr = drain(Box::new(child.stderr.take().expect("piped stderr")));
    let deadline = Instant::now() + within;
    let status = loop {
        if let Ok(Some(status)) = child.try_wait() {
            break Ok(status);
        }
        if Instant::now() >= deadline {
            let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGKILL);
            break Err(child.wait());
        }
        thread::sleep(POLL);
    };
    let stdout = stdout.join().expect("stdout reader");
    let stderr = stderr.join().expect("stderr reader");
    match status {
        Ok(status) => Ok(Output { status, stdout, stderr }),
        Err(killed) => {
            let status = killed.unwrap_or_else(|e| panic!("waiting for {what}: {e}"));
            Err(Output { status, stdout, stderr })
        }
    }
}

/// Runs `limiter ARGS` with [`run_with_deadline`].
pub fn limiter_with_deadline(args: &[&str], within: Duration) -> Output {
    run_with_deadline(Command::new(limiter_bin()).args(args), within)
}

/// Whether process `pid` (a child of this one) has exited within `within`.
/// It is not reaped: its owner still collects the status, at once.
pub fn exited_within(pid: Pid, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    loop {
        // A child that exited stays a zombie (state Z) until it is reaped.
        let state = fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|stat| stat.rsplit_once(')').and_then(|(_, rest)| rest.trim_start().chars().next()));
        if matches!(state, None | Some('Z' | 'X')) {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        thread::sleep(POLL);
    }
}

/// Sends SIGTERM to `daemon` and returns its exit code once it has
/// stopped; fails the test with the daemon's log if it takes longer than
/// `within` (the daemon is then killed when dropped).
pub fn terminate(daemon: &mut Daemon, within: Duration) -> Option<i32> {
    daemon.signal(Signal::SIGTERM);
    assert!(
        exited_within(daemon.pid(), within),
        "the daemon did not stop within {within:?} of SIGTERM:\n{}",
        daemon.log()
    );
    daemon.wait()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_finished_process_gives_its_output_and_status() {
        let out = run_with_deadline(
            Command::new("sh").args(["-c", "echo out; echo err >&2; exit 3"]),
            Duration::from_secs(10),
        );
        assert_eq!(
            (out.status.code(), &out.stdout[..], &out.stderr[..]),
            (Some(3), &b"out\n"[..], &b"err\n"[..])
        );
    }

    #[test]
    #[should_panic(expected = "did not finish within 200ms and was killed\nstdout:\nstarted\n")]
    fn a_process_past_its_deadline_is_killed_and_fails_the_test() {
        run_with_deadline(
            Command::new("sh").args(["-c", "echo started; exec sleep 30"]),
            Duration::from_millis(200),
        );
    }

    #[test]
    fn an_exit_is_seen_without_reaping_the_child() {
        let mut child = Command::new("sleep").arg("30").spawn().unwrap();
        let pid = Pid::from_raw(child.id() as i32);
        assert!(!exited_within(pid, Duration::from_millis(100)));
        kill(pid, Signal::SIGTERM).unwrap();
        assert!(exited_within(pid, Duration::from_secs(10)));
        // Still the owner's to collect.
        assert_eq!(std::os::unix::process::ExitStatusExt::signal(&child.wait().unwrap()), Some(15));
    }
}
