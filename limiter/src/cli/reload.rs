//! `limiter reload --config FILE`: asks the running daemon to reload
//! (`POST /reload`) and returns only once it has applied or refused the
//! file, so systemd's `ExecReload` (and a deploy script) knows which. The
//! file is validated here first: a bad one is refused with 78 without
//! bothering the daemon (which would refuse it the same way).

use std::{path::Path, process::ExitCode, time::Duration};

use super::{
    fail, fail_config,
    status::{AdminApi, Unreached},
};
use crate::{admin::api::ReloadOutcome, config::Config};

/// How long a reload may take (a kernel map rewrite, a certificate read).
const TIMEOUT: Duration = Duration::from_secs(30);

pub fn main(file: &Path) -> ExitCode {
    let config = match Config::load(file) {
        Ok(c) => c,
        Err(e) => return fail_config(format!("reload refused: {e}")),
    };
    let api = AdminApi::from_config(&config);
    let admin = api.describe();
    let (status, body) = match api.request("POST", "/reload", TIMEOUT) {
        Ok(answer) => answer,
        Err(Unreached::NotRunning | Unreached::NoAnswer) => {
            return fail(format!("no daemon answered on {admin}"));
        }
        Err(Unreached::Refused(why)) => return fail(format!("not asking {admin} to reload: {why}")),
    };
    let outcome: Result<ReloadOutcome, _> = serde_json::from_str(&body);
    match (status, outcome) {
        (200, Ok(o)) if o.applied => {
            if o.changes.is_empty() {
                println!("reload applied: nothing changed");
            } else {
                println!("reload applied: {}", o.changes.join("; "));
            }
            ExitCode::SUCCESS
        }
        (422, Ok(o)) => {
            fail_config(format!("reload refused, nothing changed: {}", o.error.unwrap_or_default()))
        }
        (401, _) => fail(format!("{admin} refused the token (401)")),
        (status, _) => fail(format!("{admin} answered {status}: {}", body.trim())),
    }
}
