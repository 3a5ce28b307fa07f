//! Ctrl-C (SIGINT) and SIGTERM end a streaming command cleanly. Registered before the
//! command says it is ready, so a signal sent after that is never the default action.

use tokio::signal::unix::{signal, Signal, SignalKind};

use crate::error::{CliError, ClientError};

#[derive(Debug)]
pub struct Signals {
    interrupt: Signal,
    terminate: Signal,
}

impl Signals {
    pub fn install() -> Result<Signals, CliError> {
        let register = |kind| signal(kind).map_err(|e| CliError::Client(ClientError::Io(e)));
        Ok(Signals {
            interrupt: register(SignalKind::interrupt())?,
            terminate: register(SignalKind::terminate())?,
        })
    }

    pub async fn recv(&mut self) {
        tokio::select! {
            _ = self.interrupt.recv() => {}
            _ = self.terminate.recv() => {}
        }
    }
}
