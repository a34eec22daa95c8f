//! A temporary directory removed on drop.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// A freshly created, uniquely named directory under [`std::env::temp_dir`], removed with
/// everything in it when dropped.
#[derive(Debug)]
pub struct TempDir {
    path: PathBuf,
}

impl TempDir {
    /// Creates a new empty directory whose name starts with `leasehold-{prefix}-`.
    ///
    /// The name also holds the process id, a per-process counter and the clock, so tests
    /// running in parallel, in one process or several, never share a directory.
    ///
    /// # Panics
    ///
    /// If the directory cannot be created.
    pub fn new(prefix: &str) -> TempDir {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let base = std::env::temp_dir();
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        loop {
            let seq = NEXT.fetch_add(1, Ordering::Relaxed);
            let path = base.join(format!(
                "leasehold-{prefix}-{}-{seq}-{nanos}",
                std::process::id()
            ));
            // `create_dir` (not `create_dir_all`) fails if the directory exists, which is how
            // we learn a leftover from an earlier run happens to have the same name.
            match std::fs::create_dir(&path) {
                Ok(()) => return TempDir { path },
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => panic!("cannot create temporary directory {}: {e}", path.display()),
            }
        }
    }

    /// The directory's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directories_are_distinct_and_removed_on_drop() {
        let a = TempDir::new("t");
        let b = TempDir::new("t");
        assert_ne!(a.path(), b.path());
        std::fs::write(a.path().join("f"), b"x").unwrap();
        let path = a.path().to_owned();
        drop(a);
        assert!(!path.exists());
        assert!(b.path().is_dir());
    }
}
