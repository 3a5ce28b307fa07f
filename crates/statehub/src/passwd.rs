//! `statehub passwd`: adds, changes or deletes a user in a Mosquitto-format password
//! file (`$7$` PBKDF2-SHA512 lines with a random salt, readable by Mosquitto and
//! statehub alike). The password is read from the terminal without echo (twice), or
//! as the first line of standard input when that is not a terminal; it is never
//! taken from the command line, printed or logged. The file is replaced atomically
//! and created readable by its owner only.

use std::io::{BufRead, Write};
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use statehub_auth::passwd::{hash_line, DEFAULT_ITERATIONS};

/// `statehub passwd` arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct PasswdArgs {
    /// Create (or overwrite) the file with just this user.
    #[arg(short = 'c', long)]
    pub create: bool,
    /// Delete the user instead.
    #[arg(short = 'D', long, conflicts_with = "create")]
    pub delete: bool,
    /// PBKDF2 iterations (Mosquitto writes 101; more makes a stolen file slower to
    /// crack and each password CONNECT costlier).
    #[arg(short = 'I', long, default_value_t = DEFAULT_ITERATIONS)]
    pub iterations: u32,
    /// The password file.
    pub file: PathBuf,
    /// The user name.
    pub user: String,
}

/// Why `statehub passwd` failed.
#[derive(Debug, thiserror::Error)]
enum PasswdError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Line(#[from] statehub_auth::passwd::PasswdError),
    #[error("reading the password: {0}")]
    Input(std::io::Error),
    #[error("the passwords do not match")]
    Mismatch,
    #[error("an empty password is refused")]
    Empty,
    #[error("user {0} is not in the file")]
    NoUser(String),
}

pub fn run(args: &PasswdArgs) -> ExitCode {
    match update(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("statehub passwd: {e}");
            ExitCode::FAILURE
        }
    }
}

fn update(args: &PasswdArgs) -> Result<(), PasswdError> {
    let io = |path: &Path| {
        let path = path.to_owned();
        move |source| PasswdError::Io { path, source }
    };
    let existing = match args.create {
        true => String::new(),
        false => std::fs::read_to_string(&args.file).map_err(io(&args.file))?,
    };
    let prefix = format!("{}:", args.user);
    let mut lines: Vec<String> = existing
        .lines()
        .filter(|l| !l.starts_with(&prefix))
        .map(str::to_owned)
        .collect();
    if args.delete {
        if lines.len() == existing.lines().count() {
            return Err(PasswdError::NoUser(args.user.clone()));
        }
    } else {
        // Checked before a password is asked for.
        hash_line(&args.user, b"", 1)?;
        let password = read_password()?;
        lines.push(hash_line(&args.user, password.as_bytes(), args.iterations)?);
    }
    let mut text = lines.join("\n");
    text.push('\n');
    write_atomically(&args.file, &text).map_err(io(&args.file))
}

/// Writes `text` to a temporary file beside `path` (mode 0600), then renames it.
fn write_atomically(path: &Path, text: &str) -> std::io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    file.write_all(text.as_bytes())?;
    file.sync_all()?;
    std::fs::rename(&tmp, path)
}

fn read_password() -> Result<String, PasswdError> {
    let stdin = std::io::stdin();
    let password = if rustix::termios::isatty(&stdin) {
        let first = prompt("Password: ")?;
        if prompt("Reenter password: ")? != first {
            return Err(PasswdError::Mismatch);
        }
        first
    } else {
        let mut line = String::new();
        stdin
            .lock()
            .read_line(&mut line)
            .map_err(PasswdError::Input)?;
        line.trim_end_matches(['\r', '\n']).to_owned()
    };
    if password.is_empty() {
        return Err(PasswdError::Empty);
    }
    Ok(password)
}

/// Reads a line from the terminal with echo off (restored afterwards).
fn prompt(text: &str) -> Result<String, PasswdError> {
    use rustix::termios::{tcgetattr, tcsetattr, LocalModes, OptionalActions};
    let stdin = std::io::stdin();
    let mut stderr = std::io::stderr();
    let _ = write!(stderr, "{text}");
    let _ = stderr.flush();
    let saved = tcgetattr(&stdin).map_err(|e| PasswdError::Input(e.into()))?;
    let mut quiet = saved.clone();
    quiet.local_modes.remove(LocalModes::ECHO);
    tcsetattr(&stdin, OptionalActions::Now, &quiet).map_err(|e| PasswdError::Input(e.into()))?;
    let mut line = String::new();
    let read = stdin.lock().read_line(&mut line);
    let _ = tcsetattr(&stdin, OptionalActions::Now, &saved);
    let _ = writeln!(stderr);
    read.map_err(PasswdError::Input)?;
    Ok(line.trim_end_matches(['\r', '\n']).to_owned())
}
