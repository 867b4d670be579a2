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
    /// value, name or argument). Nothing was changed. `culprit` names what,
    /// where known, so callers need not parse the message.
    #[error("{message}")]
    InvalidInput {
        message: String,
        culprit: Box<Culprit>,
    },

    /// A file or directory the engine needs does not exist.
    #[error("{what} not found: {}", path.display())]
    NotFound { what: &'static str, path: PathBuf },

    /// Stored bytes do not match what their header, index or checksum promises.
    /// `record` says which record, where one is at fault.
    #[error("corrupt cache file {}: {detail}", path.display())]
    Corrupt {
        path: PathBuf,
        detail: String,
        record: Option<RecordAt>,
    },

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

    /// A bug in DatasetRT: a worker thread panicked, a task was lost, or an
    /// invariant did not hold. Never the caller's fault.
    #[error("internal error (a bug in DatasetRT; please report it): {0}")]
    Internal(String),

    /// A DataFusion error that is not one of ours (bad SQL, planning errors...).
    #[error("{0}")]
    DataFusion(DataFusionError),
}

/// What an invalid input was, where known: the row, column and value at fault.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Culprit {
    pub row: Option<u64>,
    pub column: Option<String>,
    pub value: Option<String>,
}

/// Where a corrupt record is: its sample id, shard and byte offset in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordAt {
    pub record: u64,
    pub shard: Option<u32>,
    pub offset: Option<u64>,
}

impl Error {
    pub fn invalid(msg: impl Into<String>) -> Self {
        Error::InvalidInput {
            message: msg.into(),
            culprit: Box::default(),
        }
    }

    /// This error with the row at fault recorded (invalid input only).
    pub(crate) fn at_row(mut self, row: usize) -> Self {
        if let Error::InvalidInput { culprit, .. } = &mut self {
            culprit.row = Some(row as u64);
        }
        self
    }

    /// This error with the column and value at fault recorded (invalid input only).
    pub(crate) fn at_column(mut self, column: &str, value: Option<String>) -> Self {
        if let Error::InvalidInput { culprit, .. } = &mut self {
            culprit.column = Some(column.to_string());
            culprit.value = value;
        }
        self
    }

    pub(crate) fn corrupt(path: impl AsRef<Path>, detail: impl Into<String>) -> Self {
        Error::Corrupt {
            path: path.as_ref().to_path_buf(),
            detail: detail.into(),
            record: None,
        }
    }

    /// A corrupt record: `record` of `path`, at `shard` and `offset` where known.
    pub(crate) fn corrupt_record(
        path: impl AsRef<Path>,
        record: u64,
        shard: Option<u32>,
        offset: Option<u64>,
        detail: impl Into<String>,
    ) -> Self {
        Error::Corrupt {
            path: path.as_ref().to_path_buf(),
            detail: detail.into(),
            record: Some(RecordAt {
                record,
                shard,
                offset,
            }),
        }
    }

    pub fn internal(msg: impl Into<String>) -> Self {
        Error::Internal(msg.into())
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
                // a plan's error carried through an Arrow stream
                Err(other) => match other.downcast::<DataFusionError>() {
                    Ok(datafusion) => Error::from(*datafusion),
                    Err(other) => Error::Arrow(ArrowError::ExternalError(other)),
                },
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
                // a task of the plan panicked: a bug (DataFusion's or ours),
                // never the query's fault
                Err(other) if other.to_string().contains("panicked") => {
                    Error::Internal(format!("a query task panicked: {other}"))
                }
                Err(other) => Error::DataFusion(DataFusionError::External(other)),
            },
            // a spill past its limit fails in the writer, as an I/O error
            DataFusionError::ArrowError(inner, _)
                if inner.to_string().contains("spilling process has exceeded") =>
            {
                let inner = inner.to_string();
                Error::DataFusion(DataFusionError::ResourcesExhausted(format!(
                    "{}. The query spilled more to disk than its limit: raise it \
                     (DATASETRT_SPILL_LIMIT=...) or make the query smaller",
                    inner.trim_end_matches('.')
                )))
            }
            // a value the query computes cannot be cast, divided or held:
            // the query's to change, as its other errors are
            DataFusionError::ArrowError(inner, context)
                if matches!(
                    *inner,
                    ArrowError::CastError(_)
                        | ArrowError::ParseError(_)
                        | ArrowError::DivideByZero
                        | ArrowError::ArithmeticOverflow(_)
                ) =>
            {
                Error::DataFusion(DataFusionError::ArrowError(inner, context))
            }
            DataFusionError::ArrowError(inner, _) => Error::from(*inner),
            DataFusionError::Context(_, inner) => Error::from(*inner),
            // a hash join's build side hands its error to every partition:
            // ours when this is the last holder, else DataFusion's
            DataFusionError::Shared(inner) => match std::sync::Arc::try_unwrap(inner) {
                Ok(owned) => Error::from(owned),
                Err(shared) => match (ours_within(&shared), exhausted_within(&shared)) {
                    (Some(ours), _) => ours.duplicate(),
                    (None, Some(msg)) => {
                        Error::from(DataFusionError::ResourcesExhausted(msg.clone()))
                    }
                    _ => Error::DataFusion(DataFusionError::Shared(shared)),
                },
            },
            DataFusionError::ResourcesExhausted(msg) if msg.contains("DATASETRT_") => {
                Error::DataFusion(DataFusionError::ResourcesExhausted(msg))
            }
            DataFusionError::ResourcesExhausted(msg) => {
                Error::DataFusion(DataFusionError::ResourcesExhausted(format!(
                    "{}. The query needs more memory than its limit even after spilling: \
                     raise the limit (DATASETRT_MEMORY_LIMIT=..., or open(memory_limit=...); \
                     DATASETRT_SPILL_LIMIT bounds the temporary files) or make the query \
                     smaller (a LIMIT, fewer columns, a filter before a join)",
                    msg.trim_end_matches('.')
                )))
            }
            // DataFusion's planner refusing a plan it built itself: the
            // query cannot run here, which the caller can change
            DataFusionError::Internal(msg) => Error::DataFusion(DataFusionError::Plan(format!(
                "DataFusion cannot run this query ({msg}); write it another way"
            ))),
            DataFusionError::ExecutionJoin(e) => Error::Internal(format!("a task failed: {e}")),
            other => Error::DataFusion(other),
        }
    }
}

/// Our error inside a DataFusion error that still has other holders (a hash
/// join's build side shares its error with every partition): which holder
/// converts it last is a race, so the kind must not depend on it.
fn ours_within(err: &DataFusionError) -> Option<&Error> {
    match err {
        DataFusionError::External(inner) => inner.downcast_ref::<Error>(),
        DataFusionError::ArrowError(inner, _) => match inner.as_ref() {
            ArrowError::ExternalError(inner) => inner.downcast_ref::<Error>(),
            _ => None,
        },
        DataFusionError::Context(_, inner) => ours_within(inner),
        DataFusionError::Shared(inner) => ours_within(inner),
        _ => None,
    }
}

/// The message of a memory refusal inside a DataFusion error still held
/// elsewhere (a sort's "Not enough memory to continue external sort" is
/// one in a context), so it gets the same hint as one held alone.
fn exhausted_within(err: &DataFusionError) -> Option<&String> {
    match err {
        DataFusionError::ResourcesExhausted(msg) => Some(msg),
        DataFusionError::Context(_, inner) => exhausted_within(inner),
        DataFusionError::Shared(inner) => exhausted_within(inner),
        _ => None,
    }
}

impl Error {
    /// A copy of an error held elsewhere, of the same kind and text. The
    /// wrapped Arrow and DataFusion errors cannot be copied: they keep
    /// their text as an internal error's.
    fn duplicate(&self) -> Error {
        match self {
            Error::InvalidInput { message, culprit } => Error::InvalidInput {
                message: message.clone(),
                culprit: culprit.clone(),
            },
            Error::NotFound { what, path } => Error::NotFound {
                what,
                path: path.clone(),
            },
            Error::Corrupt {
                path,
                detail,
                record,
            } => Error::Corrupt {
                path: path.clone(),
                detail: detail.clone(),
                record: *record,
            },
            Error::UnsupportedVersion {
                path,
                found,
                supported,
            } => Error::UnsupportedVersion {
                path: path.clone(),
                found: *found,
                supported: *supported,
            },
            Error::Remote { object, detail } => Error::Remote {
                object: object.clone(),
                detail: detail.clone(),
            },
            Error::Io { path, source } => Error::Io {
                path: path.clone(),
                source: std::io::Error::new(source.kind(), source.to_string()),
            },
            Error::Conflict { dir, base, head } => Error::Conflict {
                dir: dir.clone(),
                base: *base,
                head: *head,
            },
            Error::Internal(msg) => Error::Internal(msg.clone()),
            Error::Arrow(inner) => Error::Internal(format!("arrow: {inner}")),
            Error::DataFusion(inner) => Error::Internal(inner.to_string()),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whose_fault_each_datafusion_error_is() {
        // a plan DataFusion refuses is the query's to change, not our bug
        let refused = Error::from(DataFusionError::Internal("schema differs".into()));
        assert!(
            matches!(refused, Error::DataFusion(DataFusionError::Plan(_))),
            "{refused}"
        );
        // a literal the query casts, or a division by zero: the query's
        let cast = ArrowError::CastError("Cannot cast string 'Infinity' to UInt64".into());
        let cast = Error::from(DataFusionError::ArrowError(Box::new(cast), None));
        assert!(matches!(cast, Error::DataFusion(_)), "{cast}");
        let divided = DataFusionError::ArrowError(Box::new(ArrowError::DivideByZero), None);
        assert!(matches!(Error::from(divided), Error::DataFusion(_)));
        // a panicked task is a bug, whoever's
        let panicked: Box<dyn std::error::Error + Send + Sync> = "task 3 panicked".into();
        let panicked = Error::from(DataFusionError::External(panicked));
        assert!(matches!(panicked, Error::Internal(_)), "{panicked}");
        // past memory: the hint, once, however often the error is converted
        let once = Error::from(DataFusionError::ResourcesExhausted("no room.".into()));
        let twice = Error::from(DataFusionError::from(Error::from(DataFusionError::from(
            once,
        ))));
        let text = twice.to_string();
        assert_eq!(text.matches("DATASETRT_MEMORY_LIMIT").count(), 1, "{text}");
        assert!(
            text.starts_with("Resources exhausted: no room. The query"),
            "{text}"
        );
    }

    #[test]
    fn a_shared_error_keeps_its_kind_whoever_converts_it_last() {
        // a hash join hands one error to every partition; the partition that
        // is not the last holder must still see an invalid input, not a
        // DataFusion error (the kind a user catches decided by a race)
        let ours = DataFusionError::External(Box::new(
            Error::invalid("a score of NaN").at_column("il_loss", None),
        ));
        let shared = std::sync::Arc::new(DataFusionError::Context("join".into(), Box::new(ours)));
        let other_holder = std::sync::Arc::clone(&shared);
        let seen = Error::from(DataFusionError::Shared(shared));
        match &seen {
            Error::InvalidInput { message, culprit } => {
                assert_eq!(message, "a score of NaN");
                assert_eq!(culprit.column.as_deref(), Some("il_loss"));
            }
            other => panic!("expected an invalid input, got {other:?}"),
        }
        let last = Error::from(DataFusionError::Shared(other_holder));
        assert!(matches!(last, Error::InvalidInput { .. }), "{last}");
        // a sort's memory refusal, in a context and shared: the hint still
        let sort = DataFusionError::ResourcesExhausted("no room".into())
            .context("Not enough memory to continue external sort");
        let shared = std::sync::Arc::new(sort);
        let _other = std::sync::Arc::clone(&shared);
        let text = Error::from(DataFusionError::Shared(shared)).to_string();
        assert!(text.contains("DATASETRT_MEMORY_LIMIT"), "{text}");
    }
}
