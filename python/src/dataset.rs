//! `Dataset`: the native side of `datasetrt.Dataset`.

use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use std::time::Duration;

use arrow::array::{Int64Array, RecordBatch, UInt64Array};
use arrow::datatypes::{DataType, Field, Schema};
use datasetrt::catalog::{Mixture, Snapshot};
use datasetrt::load::{BatchMetadata, Loader};
use datasetrt::query::{LiveQuery, QuerySession};
use datasetrt::sample::Sampling;
use datasetrt::Unpoison;
use datasetrt::{Dataset, OpenOptions};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};
use pyo3_arrow::input::AnyRecordBatch;
use pyo3_arrow::PyTable;

use crate::arrow_in::collect;
use crate::batch::ShardMaps;
use crate::draws::PyDrawPlan;
use crate::error::{invalid, IntoPyResult};
use crate::loader::PyLoader;
use crate::remote::remote_options;
use crate::runtime::{detach, runtime, wait};
use crate::spec::PyLoaderSpec;

#[pyclass(frozen, module = "datasetrt._native", name = "Dataset")]
pub struct PyDataset {
    inner: Arc<Dataset>,
    /// The dataset with its SQL session kept on the active snapshot: every
    /// change of it goes through here.
    live: Arc<LiveQuery>,
    /// Shards mapped for Python's memoryviews (`Batch.views`), kept across
    /// loaders as the engine keeps its own mappings: a shard's pages fault
    /// in once per process, not once per epoch.
    maps: Arc<ShardMaps>,
}

/// `snapshot` whole as an Arrow table over the mapped files; the check of
/// every chunk not yet checked on this host runs without the GIL.
/// A mixture as Python sees it: the column, and each group's value and share.
type MixtureShares = (String, Vec<(String, f64)>);

fn table(py: Python<'_>, snapshot: &Snapshot) -> PyResult<PyTable> {
    let batches = detach(py, || snapshot.batches().map(<[_]>::to_vec))?.py()?;
    PyTable::try_new(batches, snapshot.schema())
}

impl PyDataset {
    fn pinned(&self, snapshot: Option<u64>) -> PyResult<Arc<Snapshot>> {
        match snapshot {
            None => Ok(self.inner.snapshot()),
            Some(n) => self.inner.snapshot_at(n).py(),
        }
    }

    /// The SQL session (waits for a change in progress without the GIL: a
    /// thread holding it while it waited would deadlock with the changer,
    /// which needs the GIL back to return).
    fn session(&self, py: Python<'_>) -> PyResult<Arc<QuerySession>> {
        detach(py, || self.live.session())?.py()
    }

    /// Make `change` (an engine call through `live`) without the GIL; the
    /// number of the snapshot it made active.
    pub(crate) fn change(
        &self,
        py: Python<'_>,
        change: impl FnOnce(&LiveQuery) -> datasetrt::Result<Arc<Snapshot>> + Send,
    ) -> PyResult<u64> {
        detach(py, || change(&self.live).map(|s| s.number()))?.py()
    }
}

#[pymethods]
impl PyDataset {
    #[new]
    #[pyo3(signature = (paths, snapshot_dir=None, storage_options=None, cache_dir=None, cache_bytes=None, requests=None, workers=vec![], memory_limit=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        paths: Vec<PathBuf>,
        snapshot_dir: Option<PathBuf>,
        storage_options: Option<Vec<(String, String)>>,
        cache_dir: Option<PathBuf>,
        cache_bytes: Option<u64>,
        requests: Option<usize>,
        workers: Vec<String>,
        memory_limit: Option<String>,
    ) -> PyResult<Self> {
        let memory_limit = match memory_limit {
            None => None,
            Some(text) => Some(datasetrt::query::memory::parse_bytes(&text).ok_or_else(|| {
                invalid(format!(
                    "memory_limit={text:?} is not a size: bytes (at least 1 MiB), or a number \
                     with K, M, G or T"
                ))
            })?),
        };
        // a bad worker URL is the caller's error now, not at the first query
        #[cfg(feature = "distributed")]
        datasetrt::query::distributed::check_workers(&workers).py()?;
        if !workers.is_empty() && !cfg!(feature = "distributed") {
            return Err(crate::error::to_py(datasetrt::Error::invalid(
                "datasetrt._native runs no SQL on workers: datasetrt_distributed does",
            )));
        }
        let remote = remote_options(storage_options, cache_dir, cache_bytes, requests);
        let inner = detach(py, move || {
            Dataset::open(
                &paths,
                OpenOptions {
                    snapshot_dir,
                    remote,
                    partition_rows: None,
                },
            )
        })?
        .py()?;
        let inner = Arc::new(inner);
        Ok(PyDataset {
            live: Arc::new(
                LiveQuery::with_workers(inner.clone(), workers).with_memory_limit(memory_limit),
            ),
            inner,
            maps: Arc::default(),
        })
    }

    /// One dict per cache: cache_id, name, path, records, codec.
    fn caches<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let list = PyList::empty(py);
        for c in self.inner.caches() {
            let d = PyDict::new(py);
            d.set_item("cache_id", c.id())?;
            d.set_item("name", c.name())?;
            d.set_item("path", c.dir())?;
            d.set_item("records", c.records())?;
            d.set_item("codec", c.manifest().codec.name())?;
            if let Some(r) = c.replica() {
                d.set_item("url", format!("{}/{}", r.remote().url(), c.name()))?;
            }
            list.append(d)?;
        }
        Ok(list)
    }

    /// Download counters of the remote caches: requests, bytes, hits,
    /// misses (records fetched when read), evicted_bytes; this process's or
    /// the host's.
    #[pyo3(signature = (host=false))]
    fn fetch_stats<'py>(&self, py: Python<'py>, host: bool) -> PyResult<Bound<'py, PyDict>> {
        let s = self.inner.fetch_stats(host);
        let d = PyDict::new(py);
        d.set_item("requests", s.requests)?;
        d.set_item("bytes", s.bytes)?;
        d.set_item("hits", s.hits)?;
        d.set_item("misses", s.misses)?;
        d.set_item("evicted_bytes", s.evicted_bytes)?;
        Ok(d)
    }

    #[getter]
    fn version(&self) -> u64 {
        self.inner.snapshot().number()
    }

    #[getter]
    fn snapshot_path(&self) -> PathBuf {
        self.inner.snapshot().path().to_path_buf()
    }

    #[getter]
    fn snapshot_dir(&self) -> PathBuf {
        self.inner.snapshot_dir().to_path_buf()
    }

    fn snapshots(&self) -> PyResult<Vec<u64>> {
        self.inner.snapshot_numbers().py()
    }

    #[getter]
    fn fingerprint(&self) -> String {
        self.inner.snapshot().fingerprint().to_string()
    }

    /// Rows of draws `start..start + count` of `epoch` as an Arrow table with
    /// one UInt32 column `row` (no payload is read).
    #[pyo3(signature = (seed, epoch, start, count, sampling="replacement", epoch_len=None, version=None))]
    #[allow(clippy::too_many_arguments)]
    fn draws(
        &self,
        py: Python<'_>,
        seed: u64,
        epoch: u64,
        start: u64,
        count: usize,
        sampling: &str,
        epoch_len: Option<u64>,
        version: Option<u64>,
    ) -> PyResult<PyTable> {
        let snapshot = self.pinned(version)?;
        let sampling = Sampling::parse(sampling).py()?;
        let rows = detach(py, move || -> datasetrt::Result<Vec<u64>> {
            let len = snapshot.epoch_len(sampling, epoch_len)?;
            let sampler = snapshot.sampler(sampling, seed, epoch, len)?;
            sampler.rows(start..start + count as u64, datasetrt::threads())
        })?
        .py()?;
        let schema = Arc::new(Schema::new(vec![Field::new(
            "row",
            DataType::UInt64,
            false,
        )]));
        let batch = RecordBatch::try_new(schema.clone(), vec![Arc::new(UInt64Array::from(rows))])
            .map_err(|e| invalid(e.to_string()))?;
        PyTable::try_new(vec![batch], schema)
    }

    /// Draws per epoch of `sampling` over snapshot `version` (else the
    /// active one): `epoch_len` when given, else the mode's default.
    #[pyo3(signature = (sampling="replacement", epoch_len=None, version=None))]
    fn epoch_len(
        &self,
        py: Python<'_>,
        sampling: &str,
        epoch_len: Option<u64>,
        version: Option<u64>,
    ) -> PyResult<u64> {
        let snapshot = self.pinned(version)?;
        let sampling = Sampling::parse(sampling).py()?;
        detach(py, move || snapshot.epoch_len(sampling, epoch_len))?.py()
    }

    /// Make what every epoch of `sampling` over snapshot `version` draws
    /// through (the stored alias tables of draws with replacement), so
    /// that forked workers map them instead of each building them.
    #[pyo3(signature = (sampling="replacement", version=None))]
    fn prepare_draws(&self, py: Python<'_>, sampling: &str, version: Option<u64>) -> PyResult<()> {
        let snapshot = self.pinned(version)?;
        let sampling = Sampling::parse(sampling).py()?;
        detach(py, move || snapshot.prepare_draws(sampling))?.py()
    }

    /// The snapshot and draws of the reader `spec` describes (a resume
    /// state in it is checked against this dataset).
    fn plan(&self, py: Python<'_>, spec: &PyLoaderSpec) -> PyResult<PyDrawPlan> {
        let request = spec.request.clone();
        let inner = self.inner.clone();
        let (snapshot, plan) = detach(py, move || request.plan(&inner))?.py()?;
        Ok(PyDrawPlan { plan, snapshot })
    }

    /// One dict per snapshot on disk, oldest first: version, created_unix_ms,
    /// rows, fingerprint, note, parent (the head it was committed on), and
    /// committed (false: a writer died before the head named it).
    fn history<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let inner = self.inner.clone();
        // the manifests only: no snapshot's column files are mapped
        let (snapshots, uncommitted) = detach(py, move || -> datasetrt::Result<_> {
            let dir = inner.snapshot_dir();
            let snapshots = inner
                .snapshot_numbers()?
                .into_iter()
                .map(|n| Ok((n, datasetrt::catalog::read_manifest(dir, n)?)))
                .collect::<datasetrt::Result<Vec<_>>>()?;
            Ok((snapshots, inner.uncommitted()?))
        })?
        .py()?;
        let list = PyList::empty(py);
        for (number, m) in snapshots {
            let d = PyDict::new(py);
            d.set_item("version", number)?;
            d.set_item("created_unix_ms", m.created_unix_ms)?;
            d.set_item("rows", m.rows)?;
            d.set_item("partitions", m.partitions.len())?;
            d.set_item("fingerprint", &m.fingerprint)?;
            d.set_item("note", &m.note)?;
            d.set_item("parent", m.parent)?;
            d.set_item("committed", !uncommitted.contains(&number))?;
            list.append(d)?;
        }
        Ok(list)
    }

    fn __len__(&self) -> usize {
        self.inner.snapshot().num_rows()
    }

    /// A snapshot (default: the active one) as an Arrow table over the mapped
    /// file (no copy).
    #[pyo3(signature = (version=None))]
    fn get_metadata(&self, py: Python<'_>, version: Option<u64>) -> PyResult<PyTable> {
        table(py, &*self.pinned(version)?)
    }

    /// Replace the population; returns the new snapshot number. `data` is
    /// the rows in pieces, in order (each an Arrow stream of one schema: a
    /// chunked polars frame is passed chunk by chunk, so that no piece is
    /// copied into one batch). `base` is the snapshot the data was derived
    /// from (default: the active one).
    #[pyo3(signature = (data, note="update_metadata".to_string(), base=None, force=false, nulls=vec![]))]
    fn update_metadata(
        &self,
        py: Python<'_>,
        data: Vec<AnyRecordBatch>,
        note: String,
        base: Option<u64>,
        force: bool,
        nulls: Vec<String>,
    ) -> PyResult<u64> {
        let mut schema = None;
        let mut batches = Vec::new();
        for piece in data {
            let (piece_schema, piece_batches) = collect(piece, &nulls, "Arrow stream")?;
            match &schema {
                Some(first) if *first != piece_schema => {
                    return Err(invalid(
                        "the pieces of a metadata update have different schemas".to_string(),
                    ))
                }
                Some(_) => {}
                None => schema = Some(piece_schema),
            }
            batches.extend(piece_batches);
        }
        let schema =
            schema.ok_or_else(|| invalid("a metadata update needs its rows".to_string()))?;
        self.change(py, |live| {
            live.update(&schema, &batches, &note, base, force)
        })
    }

    /// Commit the population of `base` (default: the active one) again,
    /// drawn by `shares` of the groups of `column` (none: by its weights
    /// alone); returns the new snapshot number.
    #[pyo3(signature = (column, shares, base=None, force=false))]
    fn set_mixture(
        &self,
        py: Python<'_>,
        column: Option<String>,
        shares: Vec<(String, f64)>,
        base: Option<u64>,
        force: bool,
    ) -> PyResult<u64> {
        let mixture = match column {
            Some(column) => Some(Mixture::new(&column, &shares).py()?),
            None => None,
        };
        self.change(py, |live| live.set_mixture(mixture, base, force))
    }

    /// Every sample drawn up to loader state `state`, with its count:
    /// `cache_id`, `sample_id`, `count` (see `datasetrt::load::exposures`).
    #[pyo3(signature = (state, first_epoch=0, snapshots=std::collections::BTreeMap::new(), world_size=1, drop_last=false, epoch_len=None))]
    #[allow(clippy::too_many_arguments)]
    fn exposures(
        &self,
        py: Python<'_>,
        state: &Bound<'_, PyAny>,
        first_epoch: u64,
        snapshots: std::collections::BTreeMap<u64, u64>,
        world_size: u32,
        drop_last: bool,
        epoch_len: Option<u64>,
    ) -> PyResult<PyTable> {
        let state = crate::draws::state_from_py(state)?;
        let shape = datasetrt::load::RunShape {
            first_epoch,
            snapshots,
            world_size,
            drop_last,
            epoch_len,
        };
        let inner = self.inner.clone();
        let counted = detach(py, move || {
            datasetrt::load::exposures(&inner, &state, &shape)
        })?
        .py()?;
        let schema = Arc::new(Schema::new(vec![
            Field::new("cache_id", DataType::Int64, false),
            Field::new("sample_id", DataType::Int64, false),
            Field::new("count", DataType::Int64, false),
        ]));
        let columns: Vec<arrow::array::ArrayRef> = vec![
            Arc::new(Int64Array::from_iter_values(counted.iter().map(|e| e.0))),
            Arc::new(Int64Array::from_iter_values(counted.iter().map(|e| e.1))),
            Arc::new(Int64Array::from_iter_values(
                counted.iter().map(|e| e.2 as i64),
            )),
        ];
        let batch =
            RecordBatch::try_new(schema.clone(), columns).map_err(|e| invalid(e.to_string()))?;
        PyTable::try_new(vec![batch], schema)
    }

    /// The mixture of snapshot `version` (default: the active one): its
    /// column and each group's value and share, or `None`.
    #[pyo3(signature = (version=None))]
    fn mixture(&self, version: Option<u64>) -> PyResult<Option<MixtureShares>> {
        let snapshot = self.pinned(version)?;
        Ok(snapshot.mixture().map(|m| {
            let shares = m
                .values()
                .iter()
                .enumerate()
                .map(|(g, v)| (v.clone(), m.shares().share(g)))
                .collect();
            (m.column().to_string(), shares)
        }))
    }

    /// The snapshot the head record names now (another process may have
    /// committed since this dataset was opened).
    fn head(&self, py: Python<'_>) -> PyResult<u64> {
        let inner = self.inner.clone();
        detach(py, move || inner.head())?.py()
    }

    /// Make the head's snapshot active; returns its number.
    fn refresh(&self, py: Python<'_>) -> PyResult<u64> {
        self.change(py, LiveQuery::refresh)
    }

    /// Make snapshot `number` active in this process only (the head stays).
    fn pin(&self, py: Python<'_>, number: u64) -> PyResult<u64> {
        self.change(py, |live| live.pin(number))
    }

    /// Register an Arrow table (any `__arrow_c_stream__` object) as `name`
    /// for SQL next to `metadata` and `payloads`.
    #[pyo3(signature = (name, data, nulls=vec![]))]
    fn register(
        &self,
        py: Python<'_>,
        name: String,
        data: AnyRecordBatch,
        nulls: Vec<String>,
    ) -> PyResult<()> {
        if matches!(name.as_str(), "metadata" | "payloads" | "mixture") || name.is_empty() {
            return Err(invalid(format!(
                "{name:?} is not a name a registered table can take"
            )));
        }
        let (schema, batches) = collect(data, &nulls, "Arrow stream")?;
        self.session(py)?.register(&name, schema, batches).py()
    }

    /// The active snapshot as a table for the `datafusion` Python package.
    #[cfg(feature = "ffi")]
    fn datafusion_table(&self) -> PyResult<crate::ffi::PyTableProvider> {
        let partitions = datasetrt::threads();
        let snapshot = self.inner.snapshot();
        let table = datasetrt::query::MetadataTable::new(snapshot, partitions);
        Ok(crate::ffi::PyTableProvider {
            provider: Arc::new(table),
        })
    }

    fn sql(&self, py: Python<'_>, query: String) -> PyResult<PyTable> {
        let session = self.session(py)?;
        let (schema, batches) = wait(py, async move { session.sql(&query).await })?.py()?;
        PyTable::try_new(batches, schema)
    }

    /// Set the population to the result of `query`; returns the snapshot
    /// number. The query runs against the active snapshot; if another writer
    /// moved the head meanwhile, it runs again on the new head (a few times)
    /// before the conflict is raised.
    #[pyo3(signature = (query, note=None, force=false))]
    fn select(
        &self,
        py: Python<'_>,
        query: String,
        note: Option<String>,
        force: bool,
    ) -> PyResult<u64> {
        let note = note.unwrap_or_else(|| format!("select: {query}"));
        let live = self.live.clone();
        wait(py, live.select(query, note, force))?.py()
    }

    /// Every problem of every stored file and record, as dicts: kind (the
    /// exception class), path, message. `progress(done, total)` is called
    /// from this thread now and then.
    #[pyo3(signature = (progress=None))]
    fn verify<'py>(
        &self,
        py: Python<'py>,
        progress: Option<Py<PyAny>>,
    ) -> PyResult<Bound<'py, PyList>> {
        let inner = self.inner.clone();
        let (tx, rx) = std::sync::mpsc::channel::<(u64, u64)>();
        let worker = std::thread::spawn(move || {
            crate::runtime::test_panic("verify");
            inner.verify(&|done, total| {
                let _ = tx.send((done, total));
            })
        });
        // report progress (and check for Ctrl-C) from this thread, with the
        // GIL; a Receiver is not Sync, so the detached closure borrows a Mutex
        let rx = Mutex::new(rx);
        loop {
            let next = py.detach(|| {
                rx.lock()
                    .unpoisoned()
                    .recv_timeout(Duration::from_millis(100))
            });
            match next {
                Ok((done, total)) => {
                    if let Some(callback) = &progress {
                        callback.call1(py, (done, total))?;
                    }
                }
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => py.check_signals()?,
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
            }
        }
        let problems = worker.join().map_err(|_| {
            crate::error::to_py(datasetrt::Error::internal(
                "verify() failed: its thread panicked",
            ))
        })?;
        let list = PyList::empty(py);
        for problem in problems {
            let err = crate::error::to_py(problem);
            let value = err.value(py);
            let d = PyDict::new(py);
            d.set_item("kind", value.get_type().name()?)?;
            d.set_item("path", value.getattr("path").ok())?;
            d.set_item("message", value.str()?)?;
            list.append(d)?;
        }
        Ok(list)
    }

    /// Name snapshot `number` (default: the active one).
    #[pyo3(signature = (name, number=None))]
    fn tag(&self, py: Python<'_>, name: &str, number: Option<u64>) -> PyResult<()> {
        let number = number.unwrap_or_else(|| self.inner.snapshot().number());
        // a bucket's tag is uploaded: without the GIL
        detach(py, || self.inner.tag(name, number))?.py()
    }

    fn tags(&self) -> PyResult<std::collections::BTreeMap<String, u64>> {
        self.inner.tags().py()
    }

    /// Keep the newest `keep` snapshots, the tagged ones and the active one.
    #[pyo3(signature = (keep, dry_run=false))]
    fn cleanup(&self, py: Python<'_>, keep: usize, dry_run: bool) -> PyResult<Vec<u64>> {
        detach(py, || self.live.cleanup(keep, dry_run))?.py()
    }

    fn checkout(&self, py: Python<'_>, number: u64) -> PyResult<u64> {
        self.change(py, |live| live.checkout(number)) // moves the head
    }

    /// Payload of one stored sample and its row in the active population
    /// (`None` when the sample is stored but not in the population).
    fn get_item<'py>(
        &self,
        py: Python<'py>,
        cache_id: i64,
        sample_id: i64,
    ) -> PyResult<(Bound<'py, PyBytes>, Option<usize>)> {
        let inner = self.inner.clone();
        let (bytes, row) = detach(py, move || -> datasetrt::Result<_> {
            let out = inner.read(cache_id, sample_id)?;
            let pos = inner.cache_position(cache_id)?;
            let row = inner
                .snapshot()
                .row_of(inner.caches(), pos, sample_id as u64)?;
            Ok((out, row))
        })?
        .py()?;
        Ok((PyBytes::new(py, &bytes), row))
    }

    /// Plan the reader `spec` describes and start reading ahead.
    fn start(&self, py: Python<'_>, spec: &PyLoaderSpec) -> PyResult<PyLoader> {
        let plan = self.plan(py, spec)?;
        let rt = runtime()?;
        let loader = Loader::start(
            rt.handle(),
            &self.inner,
            plan.snapshot.clone(),
            plan.plan.clone(),
            spec.request.prefetch(),
        )
        .py()?;
        Ok(PyLoader {
            inner: Mutex::new(loader),
            caches: self.inner.cache_set(),
            maps: self.maps.clone(),
            metadata: Arc::new(BatchMetadata::new(
                self.inner.clone(),
                plan.snapshot.clone(),
            )),
            plan,
            delivered: AtomicU64::new(0),
        })
    }
}
