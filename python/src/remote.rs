//! Functions over a bucket URL (`build` to a URL and listing its caches),
//! and `RemoteOptions` from Python's arguments.

use std::path::PathBuf;

use datasetrt::store::remote::{self, Remote, RemoteOptions};
use pyo3::prelude::*;

use crate::error::IntoPyResult;
use crate::runtime::detach;

/// `RemoteOptions` from the Python arguments (defaults for what is `None`).
pub fn remote_options(
    storage_options: Option<Vec<(String, String)>>,
    cache_dir: Option<PathBuf>,
    cache_bytes: Option<u64>,
    requests: Option<usize>,
) -> RemoteOptions {
    let defaults = RemoteOptions::default();
    RemoteOptions {
        storage_options: storage_options.unwrap_or_default(),
        cache_dir: cache_dir.unwrap_or(defaults.cache_dir),
        cache_bytes,
        requests: requests.unwrap_or(defaults.requests),
    }
}

/// Where `build` writes the caches it uploads to `url` (never a replica).
#[pyfunction]
#[pyo3(signature = (url, cache_dir=None))]
pub fn staging_root(url: &str, cache_dir: Option<PathBuf>) -> PyResult<PathBuf> {
    let options = remote_options(None, cache_dir, None, None);
    Ok(Remote::new(url, options).py()?.staging_root())
}

/// Upload the cache `name` that `build` staged for `url`, then keep it as
/// the replica (or remove it).
#[pyfunction]
#[pyo3(signature = (url, name, storage_options=None, cache_dir=None))]
pub fn publish_staged(
    py: Python<'_>,
    url: String,
    name: String,
    storage_options: Option<Vec<(String, String)>>,
    cache_dir: Option<PathBuf>,
) -> PyResult<()> {
    detach(py, move || {
        let remote = Remote::new(&url, remote_options(storage_options, cache_dir, None, None))?;
        remote::block_on(async move { remote.publish_staged(&name).await })?
    })?
    .py()
}

/// Names of the caches published at `url`.
#[pyfunction]
#[pyo3(signature = (url, storage_options=None))]
pub fn remote_caches(
    py: Python<'_>,
    url: String,
    storage_options: Option<Vec<(String, String)>>,
) -> PyResult<Vec<String>> {
    detach(py, move || {
        let remote = Remote::new(&url, remote_options(storage_options, None, None, None))?;
        remote::block_on(async move { remote.list_caches().await })?
    })?
    .py()
}

/// Upload the published local cache `dir` to `url` as `name`: data first, the
/// MANIFEST last (created only if absent).
#[pyfunction]
#[pyo3(signature = (url, dir, name, storage_options=None))]
pub fn publish_remote(
    py: Python<'_>,
    url: String,
    dir: PathBuf,
    name: String,
    storage_options: Option<Vec<(String, String)>>,
) -> PyResult<()> {
    detach(py, move || {
        let remote = Remote::new(&url, remote_options(storage_options, None, None, None))?;
        remote::block_on(async move { remote.publish(&dir, &name).await })?
    })?
    .py()
}
