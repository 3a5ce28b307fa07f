//! Mosquitto password files: one `user:hash` line per user, as `mosquitto_passwd`
//! writes them, so users bring their existing file.
//!
//! * `$7$<iterations>$<salt>$<hash>`: PBKDF2-HMAC-SHA512 (Mosquitto 2's default),
//!   salt and 64-byte hash in standard base64;
//! * `$6$<salt>$<hash>`: one SHA-512 of the password then the salt (Mosquitto 1.x).
//!
//! No plain password is ever kept: a file is read into hashes, a password given to
//! [`PasswordFile::verify`] is hashed and compared in constant time, and
//! [`hash_line`] writes a `$7$` line with a random salt.

use std::collections::HashMap;
use std::fmt;
use std::num::NonZeroU32;
use std::path::Path;

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use ring::rand::SecureRandom as _;
use subtle::ConstantTimeEq as _;

/// Iterations `statehub passwd` uses unless told otherwise. Mosquitto writes 101;
/// more makes a stolen file slower to crack, at the cost of CPU per CONNECT (about
/// 5 ms of one core at this count, on a blocking thread).
pub const DEFAULT_ITERATIONS: u32 = 10_000;
/// Salt length, as Mosquitto's.
const SALT_LEN: usize = 12;
const HASH_LEN: usize = 64;

/// Why a password file (or one of its lines) cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum PasswdError {
    #[error("cannot read password file {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("password file {path}, line {line}: {reason}")]
    Line {
        path: String,
        line: usize,
        reason: &'static str,
    },
    #[error("a user name may not be empty or contain ':'")]
    BadUser,
    #[error("iterations must be at least 1")]
    BadIterations,
    #[error("no system randomness for a salt")]
    Random,
}

/// One user's stored hash.
#[derive(Clone, PartialEq, Eq)]
enum Hash {
    Pbkdf2 {
        iterations: NonZeroU32,
        salt: Vec<u8>,
        hash: Vec<u8>,
    },
    Sha512 {
        salt: Vec<u8>,
        hash: Vec<u8>,
    },
}

impl fmt::Debug for Hash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Hash::Pbkdf2 { iterations, .. } => write!(f, "$7$ ({iterations} iterations)"),
            Hash::Sha512 { .. } => f.write_str("$6$"),
        }
    }
}

impl Hash {
    fn parse(text: &str) -> Result<Hash, &'static str> {
        let b64 = |s: &str| STANDARD.decode(s).map_err(|_| "bad base64");
        let parts: Vec<&str> = text.split('$').collect();
        match parts.as_slice() {
            ["", "7", iterations, salt, hash] => {
                let iterations = iterations
                    .parse::<NonZeroU32>()
                    .map_err(|_| "bad iteration count")?;
                let hash = b64(hash)?;
                if hash.len() != HASH_LEN {
                    return Err("a $7$ hash must be 64 bytes");
                }
                Ok(Hash::Pbkdf2 {
                    iterations,
                    salt: b64(salt)?,
                    hash,
                })
            }
            ["", "6", salt, hash] => {
                let hash = b64(hash)?;
                if hash.len() != HASH_LEN {
                    return Err("a $6$ hash must be 64 bytes");
                }
                Ok(Hash::Sha512 {
                    salt: b64(salt)?,
                    hash,
                })
            }
            _ => Err("not a $7$ (PBKDF2-SHA512) or $6$ (SHA-512) hash"),
        }
    }

    fn matches(&self, password: &[u8]) -> bool {
        match self {
            Hash::Pbkdf2 {
                iterations,
                salt,
                hash,
            } => {
                let mut out = [0u8; HASH_LEN];
                ring::pbkdf2::derive(
                    ring::pbkdf2::PBKDF2_HMAC_SHA512,
                    *iterations,
                    salt,
                    password,
                    &mut out,
                );
                bool::from(out.ct_eq(hash.as_slice()))
            }
            Hash::Sha512 { salt, hash } => {
                let mut ctx = ring::digest::Context::new(&ring::digest::SHA512);
                ctx.update(password);
                ctx.update(salt);
                bool::from(ctx.finish().as_ref().ct_eq(hash.as_slice()))
            }
        }
    }
}

/// The users of a password file and their hashes.
#[derive(Debug, Clone, Default)]
pub struct PasswordFile {
    users: HashMap<String, Hash>,
}

/// What an unknown user's password is checked against, so that an unknown user
/// costs what a known one does.
fn decoy() -> &'static Hash {
    static DECOY: std::sync::OnceLock<Hash> = std::sync::OnceLock::new();
    DECOY.get_or_init(|| Hash::Pbkdf2 {
        iterations: NonZeroU32::new(DEFAULT_ITERATIONS).unwrap_or(NonZeroU32::MIN),
        salt: vec![0; SALT_LEN],
        hash: vec![0; HASH_LEN],
    })
}

impl PasswordFile {
    /// Reads and parses `path`.
    pub fn load(path: &Path) -> Result<PasswordFile, PasswdError> {
        let text = std::fs::read_to_string(path).map_err(|source| PasswdError::Read {
            path: path.display().to_string(),
            source,
        })?;
        PasswordFile::parse(&text).map_err(|(line, reason)| PasswdError::Line {
            path: path.display().to_string(),
            line,
            reason,
        })
    }

    /// Parses a file's text; blank lines and `#` comments are skipped. An error
    /// gives the line number and what is wrong (never the line: it holds a hash).
    pub fn parse(text: &str) -> Result<PasswordFile, (usize, &'static str)> {
        let mut users = HashMap::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim_end_matches('\r');
            if line.trim().is_empty() || line.starts_with('#') {
                continue;
            }
            let (user, hash) = line
                .split_once(':')
                .ok_or((i + 1, "no ':' after the user name"))?;
            if user.is_empty() {
                return Err((i + 1, "empty user name"));
            }
            let hash = Hash::parse(hash).map_err(|reason| (i + 1, reason))?;
            users.insert(user.to_owned(), hash);
        }
        Ok(PasswordFile { users })
    }

    /// Number of users.
    pub fn len(&self) -> usize {
        self.users.len()
    }

    pub fn is_empty(&self) -> bool {
        self.users.is_empty()
    }

    /// Whether `user` has a line.
    pub fn has_user(&self, user: &str) -> bool {
        self.users.contains_key(user)
    }

    /// Whether `password` is `user`'s. Costs one hash whether or not the user
    /// exists. CPU-heavy at high iteration counts: call it off the async threads.
    pub fn verify(&self, user: &str, password: &[u8]) -> bool {
        match self.users.get(user) {
            Some(hash) => hash.matches(password),
            None => {
                let _ = decoy().matches(password);
                false
            }
        }
    }
}

/// A password file line for `user` with a fresh random salt and PBKDF2-SHA512 at
/// `iterations`: `user:$7$iterations$salt$hash`, as `mosquitto_passwd` writes.
pub fn hash_line(user: &str, password: &[u8], iterations: u32) -> Result<String, PasswdError> {
    if user.is_empty() || user.contains(':') || user.contains('\n') {
        return Err(PasswdError::BadUser);
    }
    let iterations = NonZeroU32::new(iterations).ok_or(PasswdError::BadIterations)?;
    let mut salt = [0u8; SALT_LEN];
    ring::rand::SystemRandom::new()
        .fill(&mut salt)
        .map_err(|_| PasswdError::Random)?;
    let mut hash = [0u8; HASH_LEN];
    ring::pbkdf2::derive(
        ring::pbkdf2::PBKDF2_HMAC_SHA512,
        iterations,
        &salt,
        password,
        &mut hash,
    );
    Ok(format!(
        "{user}:$7${iterations}${}${}",
        STANDARD.encode(salt),
        STANDARD.encode(hash)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_written_line_verifies_and_nothing_else_does() {
        let line = hash_line("alice", b"s3cret", 101).unwrap();
        assert!(line.starts_with("alice:$7$101$"));
        assert!(!line.contains("s3cret"));
        let file = PasswordFile::parse(&line).unwrap();
        assert!(file.verify("alice", b"s3cret"));
        assert!(!file.verify("alice", b"s3cret "));
        assert!(!file.verify("bob", b"s3cret"));
        // Two lines for one password differ: the salt is random.
        assert_ne!(line, hash_line("alice", b"s3cret", 101).unwrap());
    }

    #[test]
    fn sha512_lines_of_mosquitto_1_verify() {
        // SHA-512("pw" || salt) for salt "salt", as mosquitto 1.x computed it.
        let mut ctx = ring::digest::Context::new(&ring::digest::SHA512);
        ctx.update(b"pw");
        ctx.update(b"salt");
        let line = format!(
            "old:$6${}${}",
            STANDARD.encode(b"salt"),
            STANDARD.encode(ctx.finish())
        );
        let file = PasswordFile::parse(&line).unwrap();
        assert!(file.verify("old", b"pw"));
        assert!(!file.verify("old", b"pW"));
    }

    #[test]
    fn bad_lines_are_named_by_number_without_their_content() {
        let text = "# comment\n\nalice:$7$101$AAAA$BBBB\n";
        let err = PasswordFile::parse(text).unwrap_err();
        assert_eq!(err, (3, "a $7$ hash must be 64 bytes"));
        assert_eq!(
            PasswordFile::parse("bob:plaintext").unwrap_err(),
            (1, "not a $7$ (PBKDF2-SHA512) or $6$ (SHA-512) hash")
        );
        assert!(hash_line("a:b", b"x", 1).is_err());
        assert!(hash_line("a", b"x", 0).is_err());
    }
}
