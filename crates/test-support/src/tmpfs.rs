//! A real full disk for tests: a size-limited tmpfs, mounted on a temporary directory.
//! Mounting needs privileges (root, as in the project's CI container); without them
//! [`Tmpfs::mount`] gives `None` and the test says so and passes without running.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// A tmpfs of a given size mounted on a temporary directory, unmounted on drop.
#[derive(Debug)]
pub struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    /// Mounts a tmpfs of `size` bytes, or `None` where this process may not mount.
    pub fn mount(size: u64) -> Option<Tmpfs> {
        let dir = tempfile::tempdir().ok()?;
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .stderr(Stdio::null())
            .status()
            .ok()?;
        status.success().then_some(Tmpfs { dir })
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.dir.path()).status();
    }
}

/// Fills the file system holding `dir` with a file of zeros, written `block` bytes at a
/// time until a write fails (so less than `block` bytes stay free), and returns its path.
pub fn fill_up(dir: &Path, block: usize) -> PathBuf {
    use std::io::Write;
    let path = dir.join("filler");
    let mut file = std::fs::File::create(&path).unwrap();
    let block = vec![0u8; block];
    while file.write_all(&block).and_then(|()| file.flush()).is_ok() {}
    path
}
