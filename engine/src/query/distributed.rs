//! SQL across processes and machines on `datafusion-distributed`: the
//! coordinator's session cuts a plan into stages at its repartitions and
//! sends each stage's tasks to workers over Arrow Flight (gRPC); a worker
//! runs what it is sent and streams the rows back.
//!
//! Only recipes cross the wire. A scan of `metadata` names its snapshot's
//! directory and number, the columns and its slices of partitions, and a
//! worker opens that snapshot itself (the same host, or a file system every
//! worker mounts), checking what it reads as any reader does. The scan is
//! spread over the workers, its slices dealt to them in turn; the stages
//! above it (partial aggregates, repartitions) follow, and the last one
//! returns to the coordinator. A `select` adds a `PopulationWriteExec` on
//! top (a recipe too: the snapshot directory, the base, the partition
//! rows, the caches' sizes), so the workers store the partitions of the
//! rows they compute and the coordinator commits what they describe. The
//! other nodes of the engine (`payloads`, the loader's draws) run on the
//! coordinator: their stages are not sent anywhere.

use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::execution::{SessionStateBuilder, TaskContext};
use datafusion::functions_aggregate::min_max;
use datafusion::physical_plan::ExecutionPlan;
use datafusion_distributed::{
    DesiredTaskCountEvent, DesiredTaskCountEventResponse, DistributedExt, DistributedLeafExec,
    ScaleUpLeafNodeEvent, ScaleUpLeafNodeEventResponse, SessionStateBuilderExt, Worker,
    WorkerQueryContext, WorkerResolver,
};
use datafusion_proto::physical_plan::{PhysicalExtensionCodec, PhysicalProtoConverterExtension};

use super::exec::{
    MetadataScanExec, PayloadScanExec, PayloadTakeExec, PopulationWriteExec, SampleExec, Slice,
};
use crate::catalog::{CacheBounds, Snapshot, StreamRecipe};
use crate::Unpoison;
use crate::{Error, Result};

/// The workers a coordinator sends tasks to.
#[derive(Debug, Clone)]
struct Workers(Vec<url::Url>);

impl WorkerResolver for Workers {
    fn get_urls(&self) -> DfResult<Vec<url::Url>> {
        Ok(self.0.clone())
    }
}

/// `builder` as a coordinator that plans across `workers` (URLs such as
/// `http://10.0.0.7:7070`).
pub fn coordinate(builder: SessionStateBuilder, workers: &[String]) -> Result<SessionStateBuilder> {
    if workers.is_empty() {
        return Err(Error::invalid(
            "a distributed session needs at least one worker URL",
        ));
    }
    let urls = check_workers(workers)?;
    Ok(builder
        .with_distributed_worker_resolver(Workers(urls))
        .with_distributed_planner()
        .with_distributed_user_codec(RecipeCodec)
        .with_distributed_desired_task_count_handler(desired_tasks)
        .with_distributed_scale_up_leaf_node_handler(spread))
}

/// `workers` as URLs, or an [`Error::InvalidInput`] naming the one that is
/// not an `http://host:port` URL.
pub fn check_workers(workers: &[String]) -> Result<Vec<url::Url>> {
    workers
        .iter()
        .map(|w| {
            url::Url::parse(w)
                .ok()
                .filter(|u| matches!(u.scheme(), "http" | "https") && u.host().is_some())
                .ok_or_else(|| {
                    Error::invalid(format!(
                        "worker URL {w:?} is not an http://host:port URL (what a worker's url is)"
                    ))
                })
        })
        .collect()
}

/// A worker: it plans nothing, and runs the tasks coordinators send it.
pub fn worker() -> Worker {
    Worker::from_session_builder(|ctx: WorkerQueryContext| async move {
        let mut state = ctx.builder.with_distributed_user_codec(RecipeCodec).build();
        datafusion::execution::FunctionRegistry::register_udf(
            &mut state,
            Arc::new(super::udf::drt_uniform()),
        )?;
        datafusion::execution::FunctionRegistry::register_udwf(
            &mut state,
            Arc::new(super::udf::drt_shape_weights()),
        )?;
        for udf in [
            super::udf::drt_canonical(),
            super::udf::md5(),
            super::udf::sha256(),
        ] {
            datafusion::execution::FunctionRegistry::register_udf(&mut state, Arc::new(udf))?;
        }
        for builtin in [min_max::min_udaf(), min_max::max_udaf()] {
            let udaf = Arc::new(super::udf::nan_ordered(builtin));
            datafusion::execution::FunctionRegistry::register_udaf(&mut state, udaf)?;
        }
        Ok(state)
    })
}

/// Serve a worker on `listener` until the process ends (or the future is
/// dropped).
pub async fn serve(listener: tokio::net::TcpListener) -> Result<()> {
    serve_until(listener, std::future::pending()).await
}

/// Serve a worker on `listener` until `stop` completes: then it takes no
/// new connection, tells the coordinators connected to it to go away, and
/// ends when the requests in flight have.
pub async fn serve_until(
    listener: tokio::net::TcpListener,
    stop: impl std::future::Future<Output = ()>,
) -> Result<()> {
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
    tonic::transport::Server::builder()
        .add_service(worker().into_worker_server())
        .serve_with_incoming_shutdown(incoming, stop)
        .await
        .map_err(|e| Error::internal(format!("the worker's server stopped: {e}")))
}

/// A scan of `metadata` asks for one task per snapshot partition it reads
/// (the planner gives it at most one per worker).
fn desired_tasks(ev: DesiredTaskCountEvent) -> Option<DfResult<DesiredTaskCountEventResponse>> {
    let scan = ev.plan.downcast_ref::<MetadataScanExec>()?;
    let mut parts: Vec<usize> = scan
        .slices()
        .iter()
        .filter(|s| s.len > 0)
        .map(|s| s.part)
        .collect();
    parts.dedup();
    Some(Ok(DesiredTaskCountEventResponse::desired(
        parts.len().max(1),
    )))
}

/// A scan of `metadata` in a stage of `task_count` tasks: its slices dealt
/// to them in turn.
fn spread(ev: ScaleUpLeafNodeEvent) -> Option<DfResult<ScaleUpLeafNodeEventResponse>> {
    let scan = ev.plan.downcast_ref::<MetadataScanExec>()?;
    let leaf = scan.spread(ev.task_count).and_then(|variants| {
        let variants = variants
            .into_iter()
            .map(|v| Arc::new(v) as Arc<dyn ExecutionPlan>);
        DistributedLeafExec::try_new(ev.plan.clone(), variants)
    });
    Some(leaf.map(|leaf| ScaleUpLeafNodeEventResponse::new(Arc::new(leaf))))
}

/// The engine's nodes as recipes on the wire.
#[derive(Debug)]
pub struct RecipeCodec;

const METADATA_SCAN: &[u8] = b"datasetrt metadata scan 1\n";
const POPULATION_WRITE: &[u8] = b"datasetrt population write 1\n";

impl PhysicalExtensionCodec for RecipeCodec {
    fn try_decode(
        &self,
        buf: &[u8],
        inputs: &[Arc<dyn ExecutionPlan>],
        _ctx: &TaskContext,
        _proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        if let Some(recipe) = buf.strip_prefix(POPULATION_WRITE) {
            let [input] = inputs else {
                return Err(DataFusionError::Internal(
                    "a population write has one input".into(),
                ));
            };
            let mut r = Reader(recipe);
            let dir = PathBuf::from(std::ffi::OsStr::from_bytes(r.bytes()?));
            let (base, per) = (r.u64()?, r.u64()? as usize);
            let samples = (0..r.u64()?)
                .map(|_| {
                    let id = r.u64()? as i64;
                    let records = r.u64()?;
                    let name = String::from_utf8_lossy(r.bytes()?).into_owned();
                    Ok((id, name, records))
                })
                .collect::<DfResult<Vec<_>>>()?;
            let snapshot = opened(dir.clone(), base)?;
            let recipe = StreamRecipe {
                dir,
                base,
                per,
                samples: CacheBounds(samples),
            };
            return Ok(Arc::new(PopulationWriteExec::new(
                input.clone(),
                Arc::new(recipe),
                snapshot,
            )));
        }
        let recipe = buf.strip_prefix(METADATA_SCAN).ok_or_else(|| {
            DataFusionError::Internal("not a node this build of datasetrt encodes".into())
        })?;
        if !inputs.is_empty() {
            return Err(DataFusionError::Internal(
                "a metadata scan has no inputs".into(),
            ));
        }
        let mut r = Reader(recipe);
        let dir = PathBuf::from(std::ffi::OsStr::from_bytes(r.bytes()?));
        let number = r.u64()?;
        let columns = (0..r.u64()?)
            .map(|_| r.u64().map(|c| c as usize))
            .collect::<DfResult<Vec<_>>>()?;
        let slices = (0..r.u64()?)
            .map(|_| {
                Ok(Slice {
                    part: r.u64()? as usize,
                    start: r.u64()? as usize,
                    len: r.u64()? as usize,
                })
            })
            .collect::<DfResult<Vec<_>>>()?;
        let snapshot = opened(dir, number)?;
        Ok(Arc::new(MetadataScanExec::new(snapshot, columns, slices)?))
    }

    fn try_encode(
        &self,
        node: Arc<dyn ExecutionPlan>,
        buf: &mut Vec<u8>,
        _proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> DfResult<()> {
        if let Some(write) = node.downcast_ref::<PopulationWriteExec>() {
            let recipe = write.recipe();
            buf.extend_from_slice(POPULATION_WRITE);
            put_bytes(buf, recipe.dir.as_os_str().as_bytes());
            put(buf, recipe.base);
            put(buf, recipe.per as u64);
            put(buf, recipe.samples.0.len() as u64);
            for (id, name, records) in &recipe.samples.0 {
                put(buf, *id as u64);
                put(buf, *records);
                put_bytes(buf, name.as_bytes());
            }
            return Ok(());
        }
        let Some(scan) = node.downcast_ref::<MetadataScanExec>() else {
            let local = node.downcast_ref::<PayloadScanExec>().is_some()
                || node.downcast_ref::<PayloadTakeExec>().is_some()
                || node.downcast_ref::<SampleExec>().is_some();
            return Err(DataFusionError::NotImplemented(match local {
                true => format!(
                    "{} runs on the coordinator only: a query that reads payloads or draws runs \
                     in one process (a session without workers)",
                    node.name()
                ),
                false => format!("{} has no recipe to send to a worker", node.name()),
            }));
        };
        let (dir, number) = scan.snapshot_at();
        buf.extend_from_slice(METADATA_SCAN);
        put_bytes(buf, dir.as_os_str().as_bytes());
        put(buf, number);
        put(buf, scan.columns().len() as u64);
        for &c in scan.columns() {
            put(buf, c as u64);
        }
        put(buf, scan.slices().len() as u64);
        for s in scan.slices() {
            put(buf, s.part as u64);
            put(buf, s.start as u64);
            put(buf, s.len as u64);
        }
        Ok(())
    }
}

fn put(buf: &mut Vec<u8>, v: u64) {
    buf.extend_from_slice(&v.to_le_bytes());
}

fn put_bytes(buf: &mut Vec<u8>, bytes: &[u8]) {
    put(buf, bytes.len() as u64);
    buf.extend_from_slice(bytes);
}

/// Reads what [`put`] wrote; a short or malformed recipe is an error.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> DfResult<&'a [u8]> {
        if self.0.len() < n {
            return Err(DataFusionError::Internal(
                "a recipe of a datasetrt node ends early".into(),
            ));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn u64(&mut self) -> DfResult<u64> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }

    fn bytes(&mut self) -> DfResult<&'a [u8]> {
        let n = usize::try_from(self.u64()?).unwrap_or(usize::MAX);
        self.take(n)
    }
}

/// Snapshots a worker opened lately: the tasks of one query (and of the
/// queries after it) open each one once.
fn opened(dir: PathBuf, number: u64) -> Result<Arc<Snapshot>> {
    const KEEP: usize = 4;
    static OPENED: Mutex<Vec<(PathBuf, u64, Arc<Snapshot>)>> = Mutex::new(Vec::new());
    let mut opened = OPENED.lock().unpoisoned();
    if let Some(at) = opened
        .iter()
        .position(|(d, n, _)| *d == dir && *n == number)
    {
        let entry = opened.remove(at);
        let snapshot = entry.2.clone();
        opened.push(entry);
        return Ok(snapshot);
    }
    let snapshot = Arc::new(Snapshot::open(&dir, number)?);
    if opened.len() == KEEP {
        opened.remove(0);
    }
    opened.push((dir, number, snapshot.clone()));
    Ok(snapshot)
}
