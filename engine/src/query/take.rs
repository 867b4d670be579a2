//! `PayloadTakeExec`: rows carrying `(cache_id, sample_id)` come in and leave
//! in input order with payload columns (`data`, or index columns such as
//! `raw_len`) read from the mapped caches. A row that names no stored sample
//! is an error, dropped or given nulls, as its [`Unmatched`] says.
//!
//! Per input batch it sorts the rows by (cache, sample), the order records
//! were written, and reads them in up to `concurrency` groups (index entry,
//! checksum verified, record decoded or referenced in place), then puts them
//! in input order. Partitions split `concurrency` between them (at least one
//! thread each). `execute()` does no I/O; dropping the stream cancels the
//! work that has not started.

use std::fmt;
use std::sync::Arc;

use arrow::array::{
    make_view, Array, ArrayRef, AsArray, BinaryViewArray, BooleanArray, ByteView, Int64Array,
    RecordBatch, StringArray, UInt32Array, MAX_INLINE_VIEW_LEN,
};
use arrow::buffer::{Buffer, ScalarBuffer};
use arrow::compute::{filter_record_batch, take};
use arrow::datatypes::{DataType, Field, Int64Type, Schema, SchemaRef};
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::metrics::{
    Count, ExecutionPlanMetricsSet, MetricBuilder, MetricsSet, Time,
};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, PlanProperties,
    ReplaceChildrenOptions,
};
use futures::StreamExt;

use crate::store::{Cache, Codec, IndexEntry};
use crate::{Error, Result};

/// Name of the payload column the node appends.
pub const DATA_COLUMN: &str = "data";

/// Splitting a batch over threads only pays off for large reads: every group
/// holds at least this many rows and this many payload bytes.
const MIN_ROWS_PER_GROUP: usize = 32;
const MIN_BYTES_PER_GROUP: usize = 4 << 20;

/// Decoded payloads of a list of `(cache_id, sample_id)`, in input order, as
/// a `BinaryView` array.
///
/// Records stored raw are not copied: after their checksum is verified the
/// array's views point straight into the mapped shard (page cache). Compressed
/// records are decoded into one buffer per read group. Reads are sorted by
/// (cache, sample) — the order records were written, so shard by shard,
/// offset by offset — and split into up to `concurrency` groups on scoped
/// threads. Everything that touches a record (index entry, checksum, decode,
/// the view's 4-byte prefix) happens in its group while the bytes are hot;
/// putting the views in input order afterwards reads no payload memory.
pub fn take_payloads(
    caches: &[Arc<Cache>],
    cache_ids: &[i64],
    sample_ids: &[i64],
    concurrency: usize,
) -> Result<BinaryViewArray> {
    let n = cache_ids.len();
    let rows = resolve(caches, cache_ids, sample_ids)?;
    let mut order: Vec<u32> = (0..n as u32).collect();
    order.sort_unstable_by_key(|&i| rows[i as usize]);
    // Splitting is decided on the caches' mean record size (the entries are
    // read inside the groups); a compressed record costs about its decoded
    // size, some 4x what is stored.
    let mean: Vec<usize> = caches
        .iter()
        .map(|c| {
            let stored = c.manifest().shard_bytes.iter().sum::<u64>() / c.records().max(1);
            let decode = if c.manifest().codec == Codec::None {
                1
            } else {
                4
            };
            (stored * decode) as usize
        })
        .collect();
    let estimate: usize = rows.iter().map(|&(c, _)| mean[c as usize]).sum();
    let groups = concurrency
        .min(n.div_ceil(MIN_ROWS_PER_GROUP))
        .min(estimate.div_ceil(MIN_BYTES_PER_GROUP))
        .max(1);
    let per = n.div_ceil(groups).max(1);
    let run = |chunk: &[u32]| read_group(caches, &rows, chunk);
    let chunks: Vec<&[u32]> = order.chunks(per).collect();
    let outputs: Vec<GroupOutput> = if chunks.len() <= 1 {
        chunks.into_iter().map(run).collect::<Result<_>>()?
    } else {
        std::thread::scope(|scope| {
            let handles: Vec<_> = chunks[1..].iter().map(|c| scope.spawn(|| run(c))).collect();
            let mut outs = vec![run(chunks[0])];
            outs.extend(handles.into_iter().map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(Error::invalid("payload read thread panicked")))
            }));
            outs.into_iter().collect::<Result<Vec<_>>>()
        })?
    };

    // Input order; each group's local buffer numbers become the array's.
    let mut buffers: Vec<Buffer> = Vec::new();
    let mut block_of: std::collections::HashMap<(u32, u32), u32> = std::collections::HashMap::new();
    let mut views = vec![0u128; n];
    for out in outputs {
        let blocks: Vec<u32> = out
            .buffers
            .into_iter()
            .map(|local| match local {
                Local::Shard(key, buffer) => *block_of.entry(key).or_insert_with(|| {
                    buffers.push(buffer.clone());
                    buffers.len() as u32 - 1
                }),
                Local::Owned(bytes) => {
                    buffers.push(Buffer::from_vec(bytes));
                    buffers.len() as u32 - 1
                }
            })
            .collect();
        for (row, view) in out.views {
            let view = ByteView::from(view);
            views[row as usize] = if view.length <= MAX_INLINE_VIEW_LEN {
                view.as_u128() // the bytes are in the view itself
            } else {
                view.with_buffer_index(blocks[view.buffer_index as usize])
                    .as_u128()
            };
        }
    }
    let views = ScalarBuffer::from(views);
    debug_assert!(
        <arrow::datatypes::BinaryViewType as arrow::datatypes::ByteViewType>::validate(
            &views, &buffers
        )
        .is_ok()
    );
    // SAFETY: every view was made by `make_view` from the exact bytes it
    // describes (so its length and prefix match); a non-inline view's offset
    // and length lie within the buffer it names, because that buffer is the
    // shard or the group buffer the bytes were taken from, renumbered above
    // to its position in `buffers`. Binary views need no UTF-8 check.
    Ok(unsafe { BinaryViewArray::new_unchecked(views, buffers, None) })
}

/// A buffer a read group's views point into.
enum Local<'a> {
    /// A mapped shard, keyed by (cache position, shard number).
    Shard((u32, u32), &'a Buffer),
    /// Decoded bytes of compressed records (at most 4 GiB: view offsets are u32).
    Owned(Vec<u8>),
}

/// What one read group produced: views numbered against its own buffers.
struct GroupOutput<'a> {
    buffers: Vec<Local<'a>>,
    /// (input row, view)
    views: Vec<(u32, u128)>,
}

fn read_group<'a>(
    caches: &'a [Arc<Cache>],
    rows: &[(u32, u64)],
    chunk: &[u32],
) -> Result<GroupOutput<'a>> {
    let mut buffers: Vec<Local<'a>> = Vec::new();
    let mut views = Vec::with_capacity(chunk.len());
    let mut owned: Option<usize> = None; // the Owned buffer being filled
    for &row in chunk {
        let (c, sample) = rows[row as usize];
        let cache = &caches[c as usize];
        let entry = cache.entry(sample)?;
        let (shard, start, end) = cache.stored(sample, &entry, true)?;
        let view = if entry.raw_len <= MAX_INLINE_VIEW_LEN {
            // at most 12 bytes: they live in the view itself
            let mut small = [0u8; MAX_INLINE_VIEW_LEN as usize];
            let small = &mut small[..entry.raw_len as usize];
            cache.read_entry(sample, &entry, small, false)?;
            make_view(small, 0, 0)
        } else if entry.codec == Codec::None && shard.len() <= u32::MAX as usize {
            let key = (c, entry.shard);
            // rows are in (cache, sample) order: mostly the last shard again
            let found = buffers
                .iter()
                .rposition(|b| matches!(b, Local::Shard(k, _) if *k == key));
            let local = found.unwrap_or_else(|| {
                buffers.push(Local::Shard(key, shard));
                buffers.len() - 1
            });
            make_view(&shard[start..end], local as u32, start as u32)
        } else {
            let len = entry.raw_len as usize;
            let fits =
                |b: &Local| matches!(b, Local::Owned(v) if v.len() + len <= u32::MAX as usize);
            let local = match owned {
                Some(i) if fits(&buffers[i]) => i,
                _ => {
                    buffers.push(Local::Owned(Vec::new()));
                    buffers.len() - 1
                }
            };
            owned = Some(local);
            let Local::Owned(bytes) = &mut buffers[local] else {
                unreachable!("an owned buffer")
            };
            let at = bytes.len();
            bytes.resize(at + len, 0);
            cache.read_entry(sample, &entry, &mut bytes[at..], false)?;
            make_view(&bytes[at..], local as u32, at as u32)
        };
        views.push((row, view));
    }
    Ok(GroupOutput { buffers, views })
}

/// The cache (by position) and sample of each `(cache_id, sample_id)`, with
/// the row named in the error for an unknown cache or a negative sample id.
fn resolve(
    caches: &[Arc<Cache>],
    cache_ids: &[i64],
    sample_ids: &[i64],
) -> Result<Vec<(u32, u64)>> {
    let mut pos = 0usize;
    cache_ids
        .iter()
        .zip(sample_ids)
        .enumerate()
        .map(|(i, (&cid, &sid))| {
            pos = cache_position(caches, cid, pos).ok_or_else(|| {
                Error::invalid(format!(
                    "row {i}: cache_id {cid} is not a cache of this dataset"
                ))
            })?;
            let sample = u64::try_from(sid)
                .map_err(|_| Error::invalid(format!("row {i}: sample_id {sid} is negative")))?;
            Ok((pos as u32, sample))
        })
        .collect()
}

/// Position of cache `cache_id` among `caches` (sorted by id), trying `hint`
/// first: consecutive rows mostly name the same cache.
fn cache_position(caches: &[Arc<Cache>], cache_id: i64, hint: usize) -> Option<usize> {
    if caches.get(hint).is_some_and(|c| c.id() == cache_id) {
        return Some(hint);
    }
    caches.binary_search_by_key(&cache_id, |c| c.id()).ok()
}

/// Total value bytes of a `BinaryView` payload column.
pub fn binary_view_bytes(array: &dyn Array) -> usize {
    let views = array.as_binary_view();
    views.views().iter().map(|v| *v as u32 as usize).sum()
}

/// A column the payload store can add to a row, given its identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PayloadColumn {
    CacheId,
    SampleId,
    /// Bytes on disk (index only).
    StoredLen,
    /// Bytes after decoding (index only).
    RawLen,
    /// "none", "zstd" or "lz4" (index only).
    Codec,
    /// CRC-32C of the stored bytes (index only).
    Checksum,
    /// The decoded payload: the only column that reads payload bytes.
    Data,
}

impl PayloadColumn {
    pub const ALL: [PayloadColumn; 7] = [
        PayloadColumn::CacheId,
        PayloadColumn::SampleId,
        PayloadColumn::StoredLen,
        PayloadColumn::RawLen,
        PayloadColumn::Codec,
        PayloadColumn::Checksum,
        PayloadColumn::Data,
    ];

    pub fn name(self) -> &'static str {
        match self {
            PayloadColumn::CacheId => "cache_id",
            PayloadColumn::SampleId => "sample_id",
            PayloadColumn::StoredLen => "stored_len",
            PayloadColumn::RawLen => "raw_len",
            PayloadColumn::Codec => "codec",
            PayloadColumn::Checksum => "checksum",
            PayloadColumn::Data => DATA_COLUMN,
        }
    }

    pub fn field(self) -> Field {
        let ty = match self {
            PayloadColumn::Codec => DataType::Utf8,
            PayloadColumn::Data => DataType::BinaryView,
            _ => DataType::Int64,
        };
        Field::new(self.name(), ty, false)
    }
}

/// The payload columns for rows `(cache_ids[i], sample_ids[i])`, in order.
/// Only [`PayloadColumn::Data`] reads payload bytes; the rest come from the index.
pub fn payload_columns(
    caches: &[Arc<Cache>],
    cache_ids: &[i64],
    sample_ids: &[i64],
    columns: &[PayloadColumn],
    concurrency: usize,
) -> Result<Vec<ArrayRef>> {
    let needs_index = columns.iter().any(|c| {
        matches!(
            c,
            PayloadColumn::StoredLen
                | PayloadColumn::RawLen
                | PayloadColumn::Codec
                | PayloadColumn::Checksum
        )
    });
    let entries: Vec<IndexEntry> = if needs_index {
        resolve(caches, cache_ids, sample_ids)?
            .into_iter()
            .map(|(c, sample)| caches[c as usize].entry(sample))
            .collect::<Result<_>>()?
    } else {
        Vec::new()
    };
    let mut out: Vec<ArrayRef> = Vec::with_capacity(columns.len());
    for column in columns {
        let array: ArrayRef = match column {
            PayloadColumn::CacheId => Arc::new(Int64Array::from(cache_ids.to_vec())),
            PayloadColumn::SampleId => Arc::new(Int64Array::from(sample_ids.to_vec())),
            PayloadColumn::StoredLen => Arc::new(Int64Array::from_iter_values(
                entries.iter().map(|e| e.stored_len as i64),
            )),
            PayloadColumn::RawLen => Arc::new(Int64Array::from_iter_values(
                entries.iter().map(|e| e.raw_len as i64),
            )),
            PayloadColumn::Codec => Arc::new(StringArray::from_iter_values(
                entries.iter().map(|e| e.codec.name()),
            )),
            PayloadColumn::Checksum => Arc::new(Int64Array::from_iter_values(
                entries.iter().map(|e| e.checksum as i64),
            )),
            PayloadColumn::Data => {
                Arc::new(take_payloads(caches, cache_ids, sample_ids, concurrency)?)
            }
        };
        out.push(array);
    }
    Ok(out)
}

/// What becomes of an input row whose identity is not a stored sample
/// (an unknown cache, a sample id out of range, or a null).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unmatched {
    /// An error naming the row: every row must be a stored sample (the
    /// loader's draws).
    Error,
    /// The row is left out, as an inner join with `payloads` does.
    Drop,
    /// The row stays, its payload columns null, as an outer join does.
    Null,
}

/// The custom DataFusion node that turns identities into payload bytes: rows
/// leave in input order with `columns` appended (see [`Unmatched`] for rows
/// that name no stored sample).
#[derive(Debug)]
pub struct PayloadTakeExec {
    input: Arc<dyn ExecutionPlan>,
    caches: Arc<[Arc<Cache>]>,
    /// Positions of the Int64 identity columns in the input.
    identity: (usize, usize),
    columns: Vec<PayloadColumn>,
    unmatched: Unmatched,
    concurrency: usize,
    schema: SchemaRef,
    properties: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
}

impl PayloadTakeExec {
    /// Append `data` to an input with Int64 columns `cache_id` and `sample_id`.
    pub fn try_new(
        input: Arc<dyn ExecutionPlan>,
        caches: Arc<[Arc<Cache>]>,
        concurrency: usize,
    ) -> Result<Self> {
        let schema = input.schema();
        let find = |name: &str| {
            schema.index_of(name).map_err(|_| {
                Error::invalid(format!(
                    "PayloadTakeExec needs a column {name:?} in its input"
                ))
            })
        };
        let identity = (find("cache_id")?, find("sample_id")?);
        Self::with_columns(
            input,
            caches,
            identity,
            vec![PayloadColumn::Data],
            Unmatched::Error,
            concurrency,
        )
    }

    /// Append `columns` to `input`, whose identity is in the Int64 columns at
    /// positions `identity = (cache_id, sample_id)`; rows that name no stored
    /// sample are treated as `unmatched` says.
    pub fn with_columns(
        input: Arc<dyn ExecutionPlan>,
        caches: Arc<[Arc<Cache>]>,
        identity: (usize, usize),
        columns: Vec<PayloadColumn>,
        unmatched: Unmatched,
        concurrency: usize,
    ) -> Result<Self> {
        let in_schema = input.schema();
        for i in [identity.0, identity.1] {
            match in_schema.fields().get(i) {
                Some(f) if *f.data_type() == DataType::Int64 => {}
                other => {
                    return Err(Error::invalid(format!(
                        "PayloadTakeExec needs Int64 identity columns, found {:?}",
                        other.map(|f| (f.name(), f.data_type()))
                    )))
                }
            }
        }
        let mut fields: Vec<Arc<Field>> = in_schema.fields().iter().cloned().collect();
        let nullable = unmatched == Unmatched::Null;
        fields.extend(
            columns
                .iter()
                .map(|c| Arc::new(c.field().with_nullable(nullable))),
        );
        let schema = Arc::new(Schema::new(fields));
        let properties = PlanProperties::new(
            EquivalenceProperties::new(schema.clone()),
            input.output_partitioning().clone(),
            EmissionType::Incremental,
            Boundedness::Bounded,
        );
        Ok(PayloadTakeExec {
            input,
            caches,
            identity,
            columns,
            unmatched,
            concurrency: concurrency.max(1),
            schema,
            properties: Arc::new(properties),
            metrics: ExecutionPlanMetricsSet::new(),
        })
    }

    pub fn concurrency(&self) -> usize {
        self.concurrency
    }
}

impl DisplayAs for PayloadTakeExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let names: Vec<&str> = self.columns.iter().map(|c| c.name()).collect();
        write!(
            f,
            "PayloadTakeExec: caches={}, columns=[{}], unmatched={:?}, concurrency={}, \
             verify_checksums=true",
            self.caches.len(),
            names.join(", "),
            self.unmatched,
            self.concurrency
        )
    }
}

/// What every batch of one partition's stream needs.
struct PartitionTake {
    caches: Arc<[Arc<Cache>]>,
    identity: (usize, usize),
    columns: Arc<[PayloadColumn]>,
    unmatched: Unmatched,
    concurrency: usize,
    schema: SchemaRef,
    rows: Count,
    bytes: Count,
    read_time: Time,
}

impl PartitionTake {
    async fn batch(self: Arc<Self>, batch: RecordBatch) -> DfResult<RecordBatch> {
        let timer = self.read_time.timer();
        // Under a join, rows naming no stored sample are left out first; an
        // outer join puts them back below with null payload columns.
        let stored = match self.unmatched {
            Unmatched::Error => None,
            Unmatched::Drop | Unmatched::Null => {
                Some(stored_mask(&batch, self.identity, &self.caches))
            }
        };
        let matched = match &stored {
            Some(mask) if mask.true_count() < batch.num_rows() => {
                filter_record_batch(&batch, mask)?
            }
            _ => batch.clone(),
        };
        let cache_ids = column_i64(&matched, self.identity.0)?;
        let sample_ids = column_i64(&matched, self.identity.1)?;
        let this = self.clone();
        let mut added = tokio::task::spawn_blocking(move || {
            payload_columns(
                &this.caches,
                &cache_ids,
                &sample_ids,
                &this.columns,
                this.concurrency,
            )
        })
        .await
        .map_err(|e| DataFusionError::Execution(format!("payload read task failed: {e}")))??;
        for (c, a) in self.columns.iter().zip(&added) {
            if *c == PayloadColumn::Data {
                self.bytes.add(binary_view_bytes(a.as_ref()));
            }
        }
        let base = match (self.unmatched, &stored) {
            (Unmatched::Null, Some(mask)) if mask.true_count() < batch.num_rows() => {
                // row i takes added row k (its rank among the stored), or null
                let mut k = 0u32;
                let at: UInt32Array = mask
                    .iter()
                    .map(|stored| {
                        stored.unwrap_or(false).then(|| {
                            k += 1;
                            k - 1
                        })
                    })
                    .collect();
                added = added
                    .iter()
                    .map(|a| take(a.as_ref(), &at, None))
                    .collect::<std::result::Result<_, _>>()?;
                batch
            }
            _ => matched,
        };
        self.rows.add(base.num_rows());
        timer.done();
        let mut all: Vec<ArrayRef> = base.columns().to_vec();
        all.extend(added);
        Ok(RecordBatch::try_new(self.schema.clone(), all)?)
    }
}

/// Which rows name a stored sample: both identity values present, a cache
/// of this dataset, a sample id in its range.
fn stored_mask(
    batch: &RecordBatch,
    identity: (usize, usize),
    caches: &[Arc<Cache>],
) -> BooleanArray {
    let cache_ids = batch.column(identity.0).as_primitive::<Int64Type>();
    let sample_ids = batch.column(identity.1).as_primitive::<Int64Type>();
    let mut pos = 0usize;
    cache_ids
        .iter()
        .zip(sample_ids.iter())
        .map(|(cid, sid)| {
            let (Some(cid), Some(sid)) = (cid, sid) else {
                return Some(false);
            };
            let Some(at) = cache_position(caches, cid, pos) else {
                return Some(false);
            };
            pos = at;
            Some(u64::try_from(sid).is_ok_and(|s| s < caches[at].records()))
        })
        .collect()
}

fn column_i64(batch: &RecordBatch, index: usize) -> DfResult<Arc<[i64]>> {
    let col = batch.column(index);
    if col.null_count() > 0 {
        let name = batch.schema().field(index).name().clone();
        return Err(Error::invalid(format!(
            "column {name:?} has nulls; every row needs an identity"
        ))
        .into());
    }
    Ok(col.as_primitive::<Int64Type>().values().to_vec().into())
}

impl ExecutionPlan for PayloadTakeExec {
    fn name(&self) -> &'static str {
        "PayloadTakeExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![true]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> DfResult<TreeNodeRecursion>,
    ) -> DfResult<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn replace_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
        _options: ReplaceChildrenOptions,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        if children.len() != 1 {
            return Err(DataFusionError::Internal(
                "PayloadTakeExec takes one child".into(),
            ));
        }
        Ok(Arc::new(PayloadTakeExec::with_columns(
            children.swap_remove(0),
            self.caches.clone(),
            self.identity,
            self.columns.clone(),
            self.unmatched,
            self.concurrency,
        )?))
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        self.replace_children(
            children,
            ReplaceChildrenOptions::new(
                datafusion::physical_plan::ChildrenPropertiesMode::Recompute,
            ),
        )
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> DfResult<SendableRecordBatchStream> {
        let input = self.input.execute(partition, context)?;
        // Partitions run at once: they split `concurrency`, one thread at least.
        let partitions = self.properties.output_partitioning().partition_count();
        let take = Arc::new(PartitionTake {
            caches: self.caches.clone(),
            identity: self.identity,
            columns: self.columns.clone().into(),
            unmatched: self.unmatched,
            concurrency: self.concurrency.div_ceil(partitions.max(1)).max(1),
            schema: self.schema.clone(),
            rows: MetricBuilder::new(&self.metrics).output_rows(partition),
            bytes: MetricBuilder::new(&self.metrics).counter("payload_bytes", partition),
            read_time: MetricBuilder::new(&self.metrics).subset_time("read_time", partition),
        });
        let stream = input.then(move |batch| {
            let take = take.clone();
            async move { take.batch(batch?).await }
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            self.schema.clone(),
            stream,
        )))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }
}
