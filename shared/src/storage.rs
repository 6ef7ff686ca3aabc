//! Opening object stores from URLs: plain paths and `file://` (local file system, the
//! default), `s3://bucket/prefix` (Amazon S3 or any S3-compatible server, configured by
//! the usual `AWS_*` environment variables, e.g. `AWS_ENDPOINT_URL`, `AWS_ALLOW_HTTP`).

use std::sync::Arc;

use object_store::ObjectStore;
use object_store::aws::AmazonS3Builder;
use object_store::local::LocalFileSystem;
use object_store::path::Path;

/// Errors opening a store location.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    #[error("invalid store URL {url:?}: {reason}")]
    InvalidUrl { url: String, reason: String },
    #[error("cannot open store {url:?}: {source}")]
    Open { url: String, source: Box<dyn std::error::Error + Send + Sync> },
}

/// An object store plus the prefix inside it that a URL names.
#[derive(Clone, Debug)]
pub struct StoreLocation {
    pub store: Arc<dyn ObjectStore>,
    pub prefix: Path,
    /// The URL as given, for messages.
    pub url: String,
}

impl StoreLocation {
    /// `prefix/child` as an object path.
    pub fn child(&self, child: &str) -> Path {
        child.split('/').filter(|s| !s.is_empty()).fold(self.prefix.clone(), |p, part| p.join(part))
    }
}

/// A URL without `file://`, trailing slashes, and `.`/`..` segments; local paths made
/// absolute. Returns (scheme, normalised path) with scheme "file", "s3", or "other" (left
/// as it is: `storage` refuses it).
pub fn canonical_url(url: &str) -> (String, String) {
    let (scheme, rest) = match url.split_once("://") {
        Some(("s3" | "s3a", rest)) => ("s3", rest.to_string()),
        Some(("file", rest)) => ("file", rest.to_string()),
        Some(_) => return ("other".into(), url.to_string()),
        None => ("file", url.to_string()),
    };
    if scheme == "s3" {
        let parts: Vec<&str> = rest.split('/').filter(|p| !p.is_empty() && *p != ".").collect();
        return (scheme.into(), parts.join("/"));
    }
    let path = std::path::absolute(&rest).unwrap_or_else(|_| std::path::PathBuf::from(&rest));
    let mut normal = std::path::PathBuf::new();
    for part in path.components() {
        match part {
            std::path::Component::ParentDir => {
                normal.pop();
            }
            std::path::Component::CurDir => {}
            other => normal.push(other),
        }
    }
    // Resolve symbolic links in the longest part that exists.
    let existing = normal.ancestors().find(|a| a.exists()).map(std::path::Path::to_path_buf);
    if let Some(existing) = existing
        && let Ok(real) = existing.canonicalize()
        && let Ok(rest) = normal.strip_prefix(&existing)
    {
        // `join("")` would end an existing file's path with a separator.
        normal = if rest.as_os_str().is_empty() { real } else { real.join(rest) };
    }
    (scheme.into(), normal.to_string_lossy().into_owned())
}

/// `url` as any process on the machine (or any machine, for S3) names it: a local path made
/// absolute (symbolic links kept, so a worker that mounts the same path reads it), an
/// `s3://` URL normalised. What a coordinator sends its workers, whose working directories
/// may differ from its own.
pub fn absolute_url(url: &str) -> String {
    let absolute =
        |path: &str| std::path::absolute(path).map_or_else(|_| path.to_string(), |p| p.display().to_string());
    match url.split_once("://") {
        Some(("s3" | "s3a", _)) => format!("s3://{}", canonical_url(url).1),
        Some(("file", rest)) => absolute(rest),
        Some(_) => url.to_string(),
        None => absolute(url),
    }
}

/// Whether one location is the other or lies under it (after [`canonical_url`]).
pub fn nested(a: &str, b: &str) -> bool {
    let ((sa, pa), (sb, pb)) = (canonical_url(a), canonical_url(b));
    let under = |x: &str, y: &str| x == y || x.starts_with(&format!("{}/", y.trim_end_matches('/')));
    sa == sb && (under(&pa, &pb) || under(&pb, &pa))
}

/// Whether `url` is `root` or lies under it (after [`canonical_url`]). A URL with a `..`
/// segment is never inside anything: stores do not resolve it, and a local `L/..` where
/// `L` is a symbolic link leads elsewhere than the text says.
pub fn within(url: &str, root: &str) -> bool {
    if url.split('/').any(|p| p == "..") {
        return false;
    }
    let ((su, pu), (sr, pr)) = (canonical_url(url), canonical_url(root));
    let root = pr.trim_end_matches('/');
    su == sr && su != "other" && (pu.trim_end_matches('/') == root || pu.starts_with(&format!("{root}/")))
}

/// Opens the store holding one object (an input file): the URL's parent is the store, the
/// last segment the object. Nothing is created.
pub fn open_file(url: &str) -> Result<(StoreLocation, Path), StorageError> {
    let invalid = |reason: &str| StorageError::InvalidUrl { url: url.to_string(), reason: reason.to_string() };
    let (parent, name) = url.trim_end_matches('/').rsplit_once('/').unwrap_or((".", url));
    if name.is_empty() {
        return Err(invalid("no file name"));
    }
    let location = match url.split_once("://") {
        Some(("s3" | "s3a", _)) => open(parent)?,
        Some(("file", rest)) if !rest.contains('/') => open_existing(".", url)?,
        Some(("file", _)) => open_existing(parent.trim_start_matches("file://"), url)?,
        Some(_) => return Err(invalid("unsupported scheme (use a path, file:// or s3://)")),
        None => open_existing(if parent.is_empty() { "/" } else { parent }, url)?,
    };
    let path = location.child(name);
    Ok((location, path))
}

fn open_existing(dir: &str, url: &str) -> Result<StoreLocation, StorageError> {
    let fs = LocalFileSystem::new_with_prefix(dir)
        .map_err(|e| StorageError::Open { url: url.to_string(), source: Box::new(e) })?;
    Ok(StoreLocation { store: Arc::new(fs), prefix: Path::default(), url: url.to_string() })
}

/// Opens a prefix that must already exist (local directories are not created).
pub fn open_existing_prefix(url: &str) -> Result<StoreLocation, StorageError> {
    match url.split_once("://") {
        Some(("s3" | "s3a", _)) => open(url),
        Some(("file", rest)) => open_existing(rest, url),
        Some(_) => Err(StorageError::InvalidUrl { url: url.to_string(), reason: "unsupported scheme".into() }),
        None => open_existing(url, url),
    }
}

/// Opens the store a URL points to. Local directories are created if missing.
pub fn open(url: &str) -> Result<StoreLocation, StorageError> {
    let invalid = |reason: &str| StorageError::InvalidUrl { url: url.to_string(), reason: reason.to_string() };
    let open_err = |e: Box<dyn std::error::Error + Send + Sync>| StorageError::Open { url: url.to_string(), source: e };
    let (scheme, rest) = match url.split_once("://") {
        Some((scheme, rest)) => (scheme, rest),
        None => ("file", url),
    };
    match scheme {
        "file" => {
            if rest.is_empty() {
                return Err(invalid("empty path"));
            }
            // New directories are their user's alone, whatever the process's umask: a store
            // may hold private rows (scratch), the ledger or diagnostics.
            std::os::unix::fs::DirBuilderExt::mode(std::fs::DirBuilder::new().recursive(true), 0o700)
                .create(rest)
                .map_err(|e| open_err(Box::new(e)))?;
            // fsync: a ledger charge must be on disk before the output it pays for leaves.
            let fs = LocalFileSystem::new_with_prefix(rest).map_err(|e| open_err(Box::new(e)))?.with_fsync(true);
            Ok(StoreLocation { store: Arc::new(fs), prefix: Path::default(), url: url.to_string() })
        }
        "s3" | "s3a" => {
            let (bucket, key) = rest.split_once('/').unwrap_or((rest, ""));
            if bucket.is_empty() {
                return Err(invalid("missing bucket name"));
            }
            let s3 = AmazonS3Builder::from_env().with_bucket_name(bucket).build().map_err(|e| open_err(Box::new(e)))?;
            let prefix = Path::parse(key.trim_matches('/')).map_err(|e| invalid(&e.to_string()))?;
            Ok(StoreLocation { store: Arc::new(s3), prefix, url: url.to_string() })
        }
        other => Err(invalid(&format!("unsupported scheme {other:?} (use a path, file:// or s3://)"))),
    }
}

#[cfg(test)]
mod tests {
    use super::{canonical_url, nested, within};

    /// An existing file is named by its resolved path, without a trailing separator.
    #[test]
    fn an_existing_file_has_one_canonical_name() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a.csv");
        std::fs::write(&file, "a\n").unwrap();
        let real = std::fs::canonicalize(&file).unwrap().display().to_string();
        for spelled in [file.display().to_string(), format!("file://{}/./a.csv", dir.path().display())] {
            assert_eq!(canonical_url(&spelled), ("file".to_string(), real.clone()), "{spelled}");
        }
    }

    #[test]
    fn nested_locations_are_found_however_they_are_spelled() {
        assert!(nested("/data/out", "/data/out/"));
        assert!(nested("file:///data/out/x", "/data/./out"));
        assert!(nested("/data", "/data/ledger"));
        assert!(nested("s3://b/p/diagnostics/j", "s3a://b/p/diagnostics"));
        assert!(!nested("/data/out", "/data/outside"));
        assert!(!nested("s3://b/out", "/b/out"));
        assert!(!nested("s3://b/out", "s3://c/out"));
    }

    #[test]
    fn within_is_one_way_and_resolves_parents() {
        assert!(within("s3://b/alice/job-1", "s3://b/alice/"));
        assert!(within("s3a://b/alice", "s3://b/alice"));
        assert!(!within("s3://b/alice", "s3://b/alice/job-1"));
        assert!(!within("s3://b/alice/../bob", "s3://b/alice"));
        assert!(!within("s3://b/alice-and-bob", "s3://b/alice"));
        assert!(!within("/srv/out/alice/../bob", "/srv/out/alice"));
        assert!(!within("/srv/out/alice/x/../y", "/srv/out/alice"), "x may be a link");
        assert!(!within("/tmp/x", "s3://b/"));
        assert!(!within("gs://b/alice/x", "gs://b/alice"));
    }
}
