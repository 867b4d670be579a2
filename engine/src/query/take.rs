//! `PayloadTakeExec`: rows carrying `(cache_id, sample_id)` come in, the same
//! rows leave, in the same order, with a `data` column read from the mapped
//! shards.
//!
//! Per input batch it looks up every index entry, sorts the addresses by
//! (cache, shard, offset) for locality, and reads them in up to `concurrency`
//! groups (checksums verified, records decoded) straight into their places in
//! input order. `execute()` does no I/O; dropping the stream cancels
//! the work that has not started.

use std::fmt;
use std::sync::Arc;

use arrow::array::builder::BinaryViewBuilder;
use arrow::array::{
    Array, ArrayRef, AsArray, BinaryViewArray, Int64Array, RecordBatch, StringArray,
};
use arrow::buffer::Buffer;
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
/// (cache, shard, offset) for locality and split into up to `concurrency`
/// groups on scoped threads.
pub fn take_payloads(
    caches: &[Arc<Cache>],
    cache_ids: &[i64],
    sample_ids: &[i64],
    concurrency: usize,
) -> Result<BinaryViewArray> {
    let n = cache_ids.len();
    let reads = locate(caches, cache_ids, sample_ids)?;
    let total: usize = reads.iter().map(|r| r.entry.raw_len as usize).sum();
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_unstable_by_key(|&i| (reads[i].cache, reads[i].entry.shard, reads[i].entry.offset));
    let groups = concurrency
        .min(n.div_ceil(MIN_ROWS_PER_GROUP))
        .min(total.div_ceil(MIN_BYTES_PER_GROUP))
        .max(1);
    let per = n.div_ceil(groups).max(1);
    let run = |rows: &[usize]| -> Result<GroupOutput> {
        let mut out = GroupOutput {
            owned: Vec::new(),
            pieces: Vec::with_capacity(rows.len()),
        };
        for &row in rows {
            let r = &reads[row];
            let cache = &caches[r.cache as usize];
            let (shard, start, end) = cache.stored(r.sample, &r.entry, true)?;
            let piece = if r.entry.codec == Codec::None && shard.len() < u32::MAX as usize {
                Piece::Shard {
                    start: start as u32,
                    len: (end - start) as u32,
                }
            } else {
                let at = out.owned.len();
                out.owned.resize(at + r.entry.raw_len as usize, 0);
                cache.read_entry(r.sample, &r.entry, &mut out.owned[at..], false)?;
                Piece::Owned {
                    start: at,
                    len: r.entry.raw_len as usize,
                }
            };
            out.pieces.push((row as u32, piece));
        }
        Ok(out)
    };
    let chunks: Vec<&[usize]> = order.chunks(per).collect();
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

    // Assemble in input order: shard blocks once per (cache, shard), one block per group.
    let mut builder = BinaryViewBuilder::with_capacity(n);
    let mut shard_blocks: std::collections::HashMap<(u32, u32), u32> =
        std::collections::HashMap::new();
    let mut placed: Vec<(u32, u32, u32)> = vec![(0, 0, 0); n]; // (block, offset, len)
    for out in outputs {
        let group_block =
            (!out.owned.is_empty()).then(|| builder.append_block(Buffer::from_vec(out.owned)));
        for (row, piece) in out.pieces {
            let r = &reads[row as usize];
            placed[row as usize] = match piece {
                Piece::Shard { start, len } => {
                    let key = (r.cache, r.entry.shard);
                    let block = match shard_blocks.get(&key) {
                        Some(&b) => b,
                        None => {
                            let (shard, _, _) =
                                caches[r.cache as usize].stored(r.sample, &r.entry, false)?;
                            let b = builder.append_block(shard.clone());
                            shard_blocks.insert(key, b);
                            b
                        }
                    };
                    (block, start, len)
                }
                Piece::Owned { start, len } => {
                    (group_block.expect("owned bytes"), start as u32, len as u32)
                }
            };
        }
    }
    for (block, offset, len) in placed {
        builder
            .try_append_view(block, offset, len)
            .map_err(|e| Error::invalid(format!("payload view: {e}")))?;
    }
    Ok(builder.finish())
}

/// Where a record's decoded bytes are.
enum Piece {
    /// Stored raw: a range of its (mapped) shard.
    Shard { start: u32, len: u32 },
    /// Decoded into the group's own buffer.
    Owned { start: usize, len: usize },
}

struct GroupOutput {
    owned: Vec<u8>,
    pieces: Vec<(u32, Piece)>,
}

/// Find each `(cache_id, sample_id)`: its cache and its index entry.
fn locate(caches: &[Arc<Cache>], cache_ids: &[i64], sample_ids: &[i64]) -> Result<Vec<Read>> {
    let mut pos = 0usize;
    cache_ids
        .iter()
        .zip(sample_ids)
        .enumerate()
        .map(|(i, (&cid, &sid))| {
            if caches.get(pos).map(|c| c.id()) != Some(cid) {
                pos = caches.binary_search_by_key(&cid, |c| c.id()).map_err(|_| {
                    Error::invalid(format!(
                        "row {i}: cache_id {cid} is not a cache of this dataset"
                    ))
                })?;
            }
            let sample = u64::try_from(sid)
                .map_err(|_| Error::invalid(format!("row {i}: sample_id {sid} is negative")))?;
            Ok(Read {
                cache: pos as u32,
                sample,
                entry: caches[pos].entry(sample)?,
            })
        })
        .collect()
}

/// One record to read: where it is and how it is stored.
struct Read {
    cache: u32,
    sample: u64,
    entry: IndexEntry,
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
        locate(caches, cache_ids, sample_ids)?
            .into_iter()
            .map(|r| r.entry)
            .collect()
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

/// The custom DataFusion node that turns identities into payload bytes: the
/// same rows leave, in the same order, with `columns` appended.
#[derive(Debug)]
pub struct PayloadTakeExec {
    input: Arc<dyn ExecutionPlan>,
    caches: Arc<[Arc<Cache>]>,
    /// Positions of the Int64 identity columns in the input.
    identity: (usize, usize),
    columns: Vec<PayloadColumn>,
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
            concurrency,
        )
    }

    /// Append `columns` to `input`, whose identity is in the Int64 columns at
    /// positions `identity = (cache_id, sample_id)`.
    pub fn with_columns(
        input: Arc<dyn ExecutionPlan>,
        caches: Arc<[Arc<Cache>]>,
        identity: (usize, usize),
        columns: Vec<PayloadColumn>,
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
        fields.extend(columns.iter().map(|c| Arc::new(c.field())));
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
            "PayloadTakeExec: caches={}, columns=[{}], concurrency={}, verify_checksums=true",
            self.caches.len(),
            names.join(", "),
            self.concurrency
        )
    }
}

struct TakeMetrics {
    rows: Count,
    bytes: Count,
    read_time: Time,
}

async fn take_batch(
    batch: RecordBatch,
    caches: Arc<[Arc<Cache>]>,
    identity: (usize, usize),
    columns: Arc<[PayloadColumn]>,
    concurrency: usize,
    schema: SchemaRef,
    metrics: &TakeMetrics,
) -> DfResult<RecordBatch> {
    let timer = metrics.read_time.timer();
    let cache_ids = column_i64(&batch, identity.0)?;
    let sample_ids = column_i64(&batch, identity.1)?;
    let cols = columns.clone();
    let added = tokio::task::spawn_blocking(move || {
        payload_columns(&caches, &cache_ids, &sample_ids, &cols, concurrency)
    })
    .await
    .map_err(|e| DataFusionError::Execution(format!("payload read task failed: {e}")))??;
    metrics.rows.add(batch.num_rows());
    for (c, a) in columns.iter().zip(&added) {
        if *c == PayloadColumn::Data {
            metrics.bytes.add(binary_view_bytes(a.as_ref()));
        }
    }
    timer.done();
    let mut all: Vec<ArrayRef> = batch.columns().to_vec();
    all.extend(added);
    Ok(RecordBatch::try_new(schema, all)?)
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
        let metrics = Arc::new(TakeMetrics {
            rows: MetricBuilder::new(&self.metrics).output_rows(partition),
            bytes: MetricBuilder::new(&self.metrics).counter("payload_bytes", partition),
            read_time: MetricBuilder::new(&self.metrics).subset_time("read_time", partition),
        });
        let caches = self.caches.clone();
        let columns: Arc<[PayloadColumn]> = self.columns.clone().into();
        let (identity, concurrency, schema) =
            (self.identity, self.concurrency, self.schema.clone());
        let stream = input.then(move |batch| {
            let (caches, columns, schema, metrics) = (
                caches.clone(),
                columns.clone(),
                schema.clone(),
                metrics.clone(),
            );
            async move {
                take_batch(
                    batch?,
                    caches,
                    identity,
                    columns,
                    concurrency,
                    schema,
                    &metrics,
                )
                .await
            }
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
