//! What the machine did, counted: requests by command and result, notifications. Plain
//! integers: the machine is behind its owner's lock, so counting costs an add.

use crate::command::Command;

/// The commands, as counted (`invalid`: the request did not parse).
pub const COMMANDS: [&str; 7] = ["set", "get", "del", "vdel", "keynotify", "scan", "invalid"];

/// A request's result: `ok` (the command's own reply, `:-1` and nil included) or
/// `error` (a `-ERR` refusal).
pub const RESULTS: [&str; 2] = ["ok", "error"];

/// Counts since the machine was made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// `requests[command][result]`, indexed as [`COMMANDS`] and [`RESULTS`].
    pub requests: [[u64; 2]; 7],
    /// Notifications produced (one per observer and change), expiry's included.
    pub notifications: u64,
}

impl Counts {
    pub(super) fn request(&mut self, command: usize, ok: bool) {
        self.requests[command.min(6)][usize::from(!ok)] += 1;
    }
}

/// The index of `command` in [`COMMANDS`].
pub(super) fn index(command: &Command) -> usize {
    match command {
        Command::Set { .. } => 0,
        Command::Get { .. } => 1,
        Command::Del { .. } => 2,
        Command::VDel { .. } => 3,
        Command::KeyNotify { .. } => 4,
        Command::Scan { .. } => 5,
    }
}

/// The index of a request that did not parse.
pub(super) const INVALID: usize = 6;
