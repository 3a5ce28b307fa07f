//! Configuration read from files that change under a running server: certificates
//! renewed, a password file edited, signing keys rotated. A [`Watched`] value is
//! reloaded when its files change (polled) or on demand (SIGHUP); a reload that
//! fails keeps the previous value, and readers take the current one at each use, so
//! open connections are never affected.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::SystemTime;

use parking_lot::{Mutex, RwLock};

use crate::LoadError;

/// What a file looked like when last read: modification time, length, inode (a
/// Kubernetes secret volume swaps a symlink, which changes all three).
type Stamp = Option<(SystemTime, u64, u64)>;

fn stamps(files: &[PathBuf]) -> Vec<Stamp> {
    use std::os::unix::fs::MetadataExt as _;
    files
        .iter()
        .map(|f| {
            let m = std::fs::metadata(f).ok()?;
            Some((m.modified().ok()?, m.len(), m.ino()))
        })
        .collect()
}

type Loader<T> = Box<dyn Fn() -> Result<T, LoadError> + Send + Sync>;

/// A value loaded from files, replaced when they change.
pub struct Watched<T> {
    what: String,
    files: Vec<PathBuf>,
    loader: Loader<T>,
    current: RwLock<Arc<T>>,
    /// The files as last loaded, and as they were at the last failed load (not
    /// retried, nor logged again, until they change once more).
    seen: Mutex<(Vec<Stamp>, Option<Vec<Stamp>>)>,
}

impl<T> fmt::Debug for Watched<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Watched")
            .field("what", &self.what)
            .field("files", &self.files)
            .finish_non_exhaustive()
    }
}

impl<T: Send + Sync + 'static> Watched<T> {
    /// Loads the value now (an error here is a start-up error).
    pub fn load(
        what: impl Into<String>,
        files: Vec<PathBuf>,
        loader: impl Fn() -> Result<T, LoadError> + Send + Sync + 'static,
    ) -> Result<Arc<Watched<T>>, LoadError> {
        let seen = stamps(&files);
        let value = loader()?;
        Ok(Arc::new(Watched {
            what: what.into(),
            files,
            loader: Box::new(loader),
            current: RwLock::new(Arc::new(value)),
            seen: Mutex::new((seen, None)),
        }))
    }

    /// The current value.
    pub fn get(&self) -> Arc<T> {
        self.current.read().clone()
    }
}

/// Something [`Watched`] that a reloader drives.
pub trait Reload: Send + Sync + fmt::Debug {
    /// What it is, for the log ("TLS certificate of listener 0.0.0.0:8883").
    fn what(&self) -> &str;

    /// Reloads if the files changed since the last load, or always if `force`.
    /// `Ok(true)`: a new value is in use.
    fn reload(&self, force: bool) -> Result<bool, LoadError>;
}

impl<T: Send + Sync + 'static> Reload for Watched<T> {
    fn what(&self) -> &str {
        &self.what
    }

    fn reload(&self, force: bool) -> Result<bool, LoadError> {
        let now = stamps(&self.files);
        {
            let seen = self.seen.lock();
            if !force && (seen.0 == now || seen.1.as_ref() == Some(&now)) {
                return Ok(false);
            }
        }
        match (self.loader)() {
            Ok(value) => {
                *self.current.write() = Arc::new(value);
                *self.seen.lock() = (now, None);
                Ok(true)
            }
            Err(e) => {
                self.seen.lock().1 = Some(now);
                Err(e)
            }
        }
    }
}

impl statehub_broker::TlsSource for Watched<rustls::ServerConfig> {
    fn server_config(&self) -> Arc<rustls::ServerConfig> {
        self.get()
    }
}
