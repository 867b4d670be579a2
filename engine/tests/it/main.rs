#![allow(
    clippy::too_many_lines,
    reason = "a test reads as one scenario from set-up to the property it checks"
)]

mod catalog;
#[cfg(feature = "distributed")]
mod distributed;
mod fuzz;
mod layers;
mod load;
mod props;
mod query;
mod rules;
mod store;
mod take;

/// A snapshot's rows as one batch (its partitions concatenated).
pub fn whole(s: &datasetrt::Snapshot) -> datasetrt::Result<arrow::array::RecordBatch> {
    Ok(arrow::compute::concat_batches(&s.schema(), s.batches()?)?)
}

/// A snapshot's `cache_id` or (`which` 1) `sample_id` column.
pub fn identity_column(s: &datasetrt::Snapshot, which: usize) -> Vec<i64> {
    s.identities()
        .unwrap()
        .iter()
        .flat_map(|p| if which == 0 { p.0 } else { p.1 }.iter().copied())
        .collect()
}
