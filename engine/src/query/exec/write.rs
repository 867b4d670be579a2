//! `PopulationWriteExec`: each plan partition of a query's result stored
//! as partitions of an update where it is computed (on the worker that
//! runs it, in a distributed plan), and described by one small row per
//! partition stored: what the caller commits ([`describe`] reads them).
//!
//! A plan partition that reads one slice of the base snapshot through
//! nodes that keep its rows in order (a projection, a filter) is cut as
//! that slice, so a reweight shares the columns it does not change, and
//! its rows come first in the order of its slice. Other plan partitions
//! (after a shuffle) are cut every partition's rows and ordered by what
//! they hold. An invalid row is not an error of the task (an error's type
//! does not cross the wire): the plan partition reports it as its last
//! row and stops, and the caller raises it with the row's number in the
//! whole update.

use std::fmt;
use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, AsArray, RecordBatch, StringArray, StringBuilder, UInt64Array, UInt64Builder,
};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef, UInt64Type};
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::{EquivalenceProperties, Partitioning, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, PlanProperties,
};
use futures::StreamExt;

use super::metadata_scan::{MetadataScanExec, Slice};
use crate::catalog::stream::{parse_partition, partition_text};
use crate::catalog::{PartitionEntry, Snapshot, StreamRecipe, StreamWriter};
use crate::query::blocking;
use crate::{Culprit, Error, Result};

/// The rows of `input` stored by `recipe`, one row out per partition.
#[derive(Debug)]
pub struct PopulationWriteExec {
    input: Arc<dyn ExecutionPlan>,
    recipe: Arc<StreamRecipe>,
    /// The snapshot `recipe` names, opened where the node runs.
    base: Arc<Snapshot>,
    properties: Arc<PlanProperties>,
}

/// A plan partition's place in the update: the slice of the base it reads
/// (`part`, `start`), or `u64::MAX` and a hash of its first partition.
const KEY_PART: &str = "part";
const KEY_AT: &str = "at";
/// The partition's place among its plan partition's.
const SEQ: &str = "seq";
/// Its manifest lines ([`partition_text`]), or null on a problem row.
const LINES: &str = "partition";
/// A problem row: the message, row (in this plan partition), column and
/// value of the first invalid row.
const PROBLEM: &str = "problem";
const ROW: &str = "row";
const COLUMN: &str = "column";
const VALUE: &str = "value";

/// The rows a `PopulationWriteExec` returns.
pub fn described_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new(KEY_PART, DataType::UInt64, false),
        Field::new(KEY_AT, DataType::UInt64, false),
        Field::new(SEQ, DataType::UInt64, false),
        Field::new(LINES, DataType::Utf8, true),
        Field::new(PROBLEM, DataType::Utf8, true),
        Field::new(ROW, DataType::UInt64, true),
        Field::new(COLUMN, DataType::Utf8, true),
        Field::new(VALUE, DataType::Utf8, true),
    ]))
}

impl PopulationWriteExec {
    pub fn new(
        input: Arc<dyn ExecutionPlan>,
        recipe: Arc<StreamRecipe>,
        base: Arc<Snapshot>,
    ) -> Self {
        let properties = PlanProperties::new(
            EquivalenceProperties::new(described_schema()),
            Partitioning::UnknownPartitioning(input.output_partitioning().partition_count()),
            EmissionType::Final,
            Boundedness::Bounded,
        );
        PopulationWriteExec {
            input,
            recipe,
            base,
            properties: Arc::new(properties),
        }
    }

    pub fn recipe(&self) -> &StreamRecipe {
        &self.recipe
    }
}

/// The slice of the base that plan partition `partition` of `plan` reads
/// with its rows in order, if it reads one (through nodes of one input
/// that keep its partitions and their order).
fn slice_of(plan: &Arc<dyn ExecutionPlan>, partition: usize) -> Option<Slice> {
    if let Some(scan) = plan.downcast_ref::<MetadataScanExec>() {
        return scan.slices().get(partition).copied();
    }
    let [child] = plan.children()[..] else {
        return None;
    };
    let keeps = plan.maintains_input_order().first() == Some(&true)
        && plan.output_partitioning().partition_count()
            == child.output_partitioning().partition_count();
    keeps.then(|| slice_of(child, partition)).flatten()
}

impl DisplayAs for PopulationWriteExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "PopulationWriteExec: derived from snapshot {}, partitions of {} rows",
            self.recipe.base, self.recipe.per
        )
    }
}

impl ExecutionPlan for PopulationWriteExec {
    fn name(&self) -> &'static str {
        "PopulationWriteExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> DfResult<TreeNodeRecursion>,
    ) -> DfResult<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let [input] = <[_; 1]>::try_from(children)
            .map_err(|_| DataFusionError::Internal("PopulationWriteExec has one input".into()))?;
        Ok(Arc::new(PopulationWriteExec::new(
            input,
            self.recipe.clone(),
            self.base.clone(),
        )))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> DfResult<SendableRecordBatchStream> {
        let slice = slice_of(&self.input, partition);
        let mut input = self.input.execute(partition, context)?;
        let (recipe, base) = (self.recipe.clone(), self.base.clone());
        let schema = self.input.schema();
        let first = slice.map(|s| s.len);
        let write = async move {
            let mut writer = StreamWriter::new(&recipe, base, &schema, first)?;
            // hashing and storing are CPU and file work: off the async workers
            let stored = loop {
                let Some(batch) = input.next().await else {
                    break blocking(move || writer.finish()).await;
                };
                let batch = batch?;
                match blocking(move || writer.push(&batch).map(|()| writer)).await {
                    Ok(back) => writer = back,
                    Err(e) => break Err(e),
                }
            };
            let (stored, problem) = match stored {
                Ok(stored) => (stored, None),
                Err(e @ Error::InvalidInput { .. }) => (Vec::new(), Some(e)),
                Err(e) => return Err(e.into()),
            };
            Ok::<_, DataFusionError>(described(slice, &stored, problem)?)
        };
        let stream = futures::stream::once(write);
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            described_schema(),
            stream,
        )))
    }
}

/// The rows that describe what a plan partition stored (and its problem).
fn described(
    slice: Option<Slice>,
    stored: &[PartitionEntry],
    problem: Option<Error>,
) -> Result<RecordBatch> {
    let key = match slice {
        Some(s) => (s.part as u64, s.start as u64),
        None => {
            let first = stored.first().map(partition_text).unwrap_or_default();
            (u64::MAX, xxhash_rust::xxh3::xxh3_64(first.as_bytes()))
        }
    };
    let n = stored.len() + usize::from(problem.is_some());
    let mut lines = StringBuilder::new();
    for part in stored {
        lines.append_value(partition_text(part));
    }
    let (mut message, mut row, mut column, mut value) = (
        StringBuilder::new(),
        UInt64Builder::new(),
        StringBuilder::new(),
        StringBuilder::new(),
    );
    for _ in stored {
        message.append_null();
        row.append_null();
        column.append_null();
        value.append_null();
    }
    if let Some(Error::InvalidInput {
        message: m,
        culprit,
    }) = problem
    {
        lines.append_null();
        message.append_value(m);
        row.append_option(culprit.row);
        column.append_option(culprit.column);
        value.append_option(culprit.value);
    }
    let columns: Vec<ArrayRef> = vec![
        Arc::new(UInt64Array::from(vec![key.0; n])),
        Arc::new(UInt64Array::from(vec![key.1; n])),
        Arc::new(UInt64Array::from_iter_values(0..n as u64)),
        Arc::new(lines.finish()),
        Arc::new(message.finish()),
        Arc::new(row.finish()),
        Arc::new(column.finish()),
        Arc::new(value.finish()),
    ];
    Ok(RecordBatch::try_new(described_schema(), columns)?)
}

/// The partitions `batches` (rows of [`described_schema`]) describe, in
/// the update's order, or the first invalid row they report as an
/// [`Error::InvalidInput`] whose row counts from the update's first.
pub fn describe(batches: &[RecordBatch]) -> Result<Vec<PartitionEntry>> {
    struct Row {
        key: (u64, u64, u64),
        lines: Option<String>,
        problem: Option<(String, Culprit)>,
    }
    let mut rows = Vec::new();
    for batch in batches {
        let ints = |name| ints_of(batch, name);
        let texts = |name| texts_of(batch, name);
        let (part, at, seq) = (ints(KEY_PART)?, ints(KEY_AT)?, ints(SEQ)?);
        let (lines, problem, row) = (texts(LINES)?, texts(PROBLEM)?, ints(ROW)?);
        let (column, value) = (texts(COLUMN)?, texts(VALUE)?);
        let text = |a: &StringArray, i: usize| a.is_valid(i).then(|| a.value(i).to_string());
        for i in 0..batch.num_rows() {
            rows.push(Row {
                key: (part.value(i), at.value(i), seq.value(i)),
                lines: text(lines, i),
                problem: text(problem, i).map(|m| {
                    let culprit = Culprit {
                        row: row.is_valid(i).then(|| row.value(i)),
                        column: text(column, i),
                        value: text(value, i),
                    };
                    (m, culprit)
                }),
            });
        }
    }
    rows.sort_by_key(|r| r.key);
    let mut partitions = Vec::with_capacity(rows.len());
    // rows of the plan partitions before the current one, and of its
    // partitions before the current row
    let (mut before, mut within, mut stream) = (0u64, 0u64, None);
    for r in rows {
        if stream != Some((r.key.0, r.key.1)) {
            (stream, before, within) = (Some((r.key.0, r.key.1)), before + within, 0);
        }
        if let Some((message, culprit)) = r.problem {
            let at = culprit.row.map(|n| n + before);
            return Err(Error::InvalidInput {
                message: match (culprit.row, at) {
                    (Some(n), Some(at)) => renumber(&message, n, at),
                    _ => message,
                },
                culprit: Box::new(Culprit { row: at, ..culprit }),
            });
        }
        let part = parse_partition(r.lines.as_deref().unwrap_or(""), "a worker")?;
        within += part.rows as u64;
        partitions.push(part);
    }
    Ok(partitions)
}

fn ints_of<'a>(batch: &'a RecordBatch, name: &str) -> Result<&'a UInt64Array> {
    batch
        .column_by_name(name)
        .and_then(|c| c.as_primitive_opt::<UInt64Type>())
        .ok_or_else(|| Error::internal(format!("a write's description has no {name}")))
}

fn texts_of<'a>(batch: &'a RecordBatch, name: &str) -> Result<&'a StringArray> {
    batch
        .column_by_name(name)
        .and_then(|c| c.as_string_opt::<i32>())
        .ok_or_else(|| Error::internal(format!("a write's description has no {name}")))
}

/// `message` with its first "row `n`" (not a prefix of a longer number)
/// saying "row `at`".
fn renumber(message: &str, n: u64, at: u64) -> String {
    let from = format!("row {n}");
    let mut search = 0;
    while let Some(i) = message[search..].find(&from).map(|i| i + search) {
        let end = i + from.len();
        if !message[end..].starts_with(|c: char| c.is_ascii_digit()) {
            return format!("{}row {at}{}", &message[..i], &message[end..]);
        }
        search = end;
    }
    message.to_string()
}

/// A session's order to store what the plan it makes next produces: set on
/// a copy of the session's state by [`crate::query::QuerySession::write`].
#[derive(Debug)]
pub struct WriteTo {
    recipe: Arc<StreamRecipe>,
    base: Arc<Snapshot>,
}

impl WriteTo {
    pub fn new(recipe: StreamRecipe, base: Arc<Snapshot>) -> Self {
        WriteTo {
            recipe: Arc::new(recipe),
            base,
        }
    }
}

/// DataFusion's planner, and a [`PopulationWriteExec`] on top of the plan
/// when the session says [`WriteTo`]: below the distributed planner, which
/// then cuts the plan with the write in the stages that compute its rows.
#[derive(Debug)]
pub struct WritingPlanner;

#[async_trait::async_trait]
impl datafusion::execution::context::QueryPlanner for WritingPlanner {
    async fn create_physical_plan(
        &self,
        logical_plan: &datafusion::logical_expr::LogicalPlan,
        session: &dyn datafusion::catalog::Session,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        use datafusion::physical_planner::PhysicalPlanner;
        let planner = datafusion::physical_planner::DefaultPhysicalPlanner::default();
        let plan = planner.create_physical_plan(logical_plan, session).await?;
        let Some(to) = session.config().get_extension::<WriteTo>() else {
            return Ok(plan);
        };
        crate::catalog::stream::check_schema(&plan.schema())?;
        Ok(Arc::new(PopulationWriteExec::new(
            plan,
            to.recipe.clone(),
            to.base.clone(),
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::renumber;

    #[test]
    fn a_problem_is_renumbered_at_its_row_not_at_a_longer_number() {
        assert_eq!(
            renumber("row 55 (cache_id 5): row 5 is bad", 5, 12),
            "row 55 (cache_id 5): row 12 is bad"
        );
        assert_eq!(
            renumber("column \"weight\" is null at row 3", 3, 40),
            "column \"weight\" is null at row 40"
        );
        assert_eq!(renumber("no row here", 3, 40), "no row here");
    }
}
