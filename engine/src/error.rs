//! The engine's one error type. Every variant names the thing that is wrong.

use std::path::{Path, PathBuf};

use arrow::error::ArrowError;
use datafusion::error::DataFusionError;

/// Result alias used across the engine.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in the engine.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The caller passed something the engine cannot accept (a bad row, column,
    /// value, name or argument). Nothing was changed.
    #[error("{0}")]
    InvalidInput(String),

    /// A file or directory the engine needs does not exist.
    #[error("{what} not found: {}", path.display())]
    NotFound { what: &'static str, path: PathBuf },

    /// Stored bytes do not match what their header, index or checksum promises.
    #[error("corrupt cache file {}: {detail}", path.display())]
    Corrupt { path: PathBuf, detail: String },

    /// A file was written by a format version this build cannot read.
    #[error("unsupported format version {found} in {} (this build reads version {supported})", path.display())]
    UnsupportedVersion {
        path: PathBuf,
        found: u32,
        supported: u32,
    },

    /// An object store refused or failed a request (after its retries).
    #[error("object store error on {object}: {detail}")]
    Remote { object: String, detail: String },

    /// An operating-system I/O error, with the path it happened on.
    #[error("I/O error on {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// An update was derived from snapshot `base`, but another writer moved
    /// the head to `head` meanwhile. Nothing was changed.
    #[error(
        "conflict: this update was derived from snapshot {base}, but snapshot {head} is the \
         population now (another writer committed it in {}); call refresh(), redo the change \
         on the new population and update again, or pass force=True to replace it",
        dir.display()
    )]
    Conflict { dir: PathBuf, base: u64, head: u64 },

    /// An Arrow error that is not one of ours.
    #[error("arrow: {0}")]
    Arrow(ArrowError),

    /// A DataFusion error that is not one of ours (bad SQL, planning errors...).
    #[error("{0}")]
    DataFusion(DataFusionError),
}

impl Error {
    pub(crate) fn invalid(msg: impl Into<String>) -> Self {
        Error::InvalidInput(msg.into())
    }

    pub(crate) fn corrupt(path: impl AsRef<Path>, detail: impl Into<String>) -> Self {
        Error::Corrupt {
            path: path.as_ref().to_path_buf(),
            detail: detail.into(),
        }
    }

    /// Build a closure that wraps an `io::Error` with the path it happened on.
    pub(crate) fn io(path: impl AsRef<Path>) -> impl FnOnce(std::io::Error) -> Error {
        let path = path.as_ref().to_path_buf();
        move |source| Error::Io { path, source }
    }
}

impl From<ArrowError> for Error {
    fn from(err: ArrowError) -> Self {
        match err {
            ArrowError::ExternalError(inner) => match inner.downcast::<Error>() {
                Ok(ours) => *ours,
                Err(other) => Error::Arrow(ArrowError::ExternalError(other)),
            },
            other => Error::Arrow(other),
        }
    }
}

impl From<DataFusionError> for Error {
    fn from(err: DataFusionError) -> Self {
        match err {
            DataFusionError::External(inner) => match inner.downcast::<Error>() {
                Ok(ours) => *ours,
                Err(other) => Error::DataFusion(DataFusionError::External(other)),
            },
            DataFusionError::ArrowError(inner, _) => Error::from(*inner),
            DataFusionError::Context(_, inner) => Error::from(*inner),
            other => Error::DataFusion(other),
        }
    }
}

impl From<Error> for DataFusionError {
    fn from(err: Error) -> Self {
        match err {
            Error::DataFusion(inner) => inner,
            other => DataFusionError::External(Box::new(other)),
        }
    }
}
