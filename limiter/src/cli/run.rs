//! `limiter run`: process set-up around [`crate::daemon`]: signals held
//! first, the configuration read once, logging, the privileged start-up,
//! privileges dropped, then the runtime serves until SIGTERM or SIGINT.

use std::{path::PathBuf, process::ExitCode};

use super::{fail, fail_config};
use crate::{
    config::Config,
    daemon::{self, DaemonError, RunOptions, logging, privileges, signals},
};

/// What the command line says about `run`.
#[derive(Clone, Debug)]
pub struct Args {
    pub config: PathBuf,
    pub unload_on_exit: bool,
    pub log_json: bool,
    pub user: Option<String>,
}

pub fn main(args: Args) -> ExitCode {
    // First: a SIGHUP or SIGTERM during start-up waits for the daemon's
    // handlers instead of killing it.
    signals::block();
    let config = Config::load(&args.config);
    // The level comes from the file (a bad file is reported just below, at
    // the default level).
    let level = match &config {
        Ok(c) => c.admin.log_level.clone(),
        Err(_) => Config::default().admin.log_level,
    };
    logging::init(args.log_json, &level);
    let config = match config {
        Ok(c) => c,
        Err(e) => return fail_config(e),
    };
    let user_uid = match args.user.as_deref().map(privileges::uid_of).transpose() {
        Ok(uid) => uid,
        Err(e) => return fail(e),
    };
    let options = RunOptions { config_path: args.config, unload_on_exit: args.unload_on_exit, user_uid };
    let prepared = match daemon::prepare(config, options) {
        Ok(p) => p,
        // The unit and the configuration disagree: not worth a restart.
        Err(
            e @ (DaemonError::Config(_)
            | DaemonError::Activation(daemon::activation::ActivationError::Unused { .. })),
        ) => {
            return fail_config(e);
        }
        Err(e) => return fail(e),
    };
    if let Err(e) = privileges::drop_to(args.user.as_deref(), prepared.pin_path()) {
        return fail(format!("dropping privileges: {e}"));
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => return fail(format!("starting the runtime: {e}")),
    };
    let served = runtime.block_on(async move {
        let (reloads, shutdown) = match signals::install() {
            Ok(installed) => installed,
            Err(e) => return Err(Err(format!("installing signal handlers: {e}"))),
        };
        daemon::run(prepared, reloads, shutdown).await.map_err(Ok)
    });
    match served {
        Ok(()) => ExitCode::SUCCESS,
        // A fleet whose hash key is not this node's: the file is wrong.
        Err(Ok(e @ DaemonError::Fleet(_))) => fail_config(e),
        Err(Ok(e)) => fail(e.to_string()),
        Err(Err(e)) => fail(e),
    }
}
