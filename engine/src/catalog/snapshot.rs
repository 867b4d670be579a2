//! Numbered, immutable metadata snapshots: one uncompressed Arrow IPC file
//! each, mapped read-only and shared by every process that opens it.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use arrow::array::{Array, AsArray, Float64Array, Int64Array, RecordBatch};
use arrow::compute::concat_batches;
use arrow::datatypes::{DataType, Float64Type, Int64Type, SchemaRef};

use crate::sample::AliasTable;
use crate::store::{ipc, Cache};
use crate::{Error, Result};

/// One immutable population: `cache_id`, `sample_id`, user columns, `weight`.
#[derive(Debug)]
pub struct Snapshot {
    number: u64,
    path: PathBuf,
    batch: RecordBatch,
    rows_by_sample: OnceLock<Vec<Vec<u32>>>,
    alias: OnceLock<AliasTable>,
}

pub const NO_ROW: u32 = u32::MAX;

impl Snapshot {
    pub fn file_name(number: u64) -> String {
        format!("{number:08}.arrow")
    }

    pub fn parse_file_name(name: &str) -> Option<u64> {
        let stem = name.strip_suffix(".arrow")?;
        (stem.len() == 8 && stem.bytes().all(|b| b.is_ascii_digit())).then(|| stem.parse().ok())?
    }

    /// Map snapshot `number` from `dir` and check its identity columns.
    pub fn open(dir: &Path, number: u64) -> Result<Snapshot> {
        let path = dir.join(Self::file_name(number));
        let (schema, batches) = ipc::read_mapped(&path, "metadata snapshot")?;
        let batch = match batches.len() {
            1 => batches.into_iter().next().expect("one batch"),
            _ => concat_batches(&schema, &batches)?,
        };
        for (name, ty) in [
            ("cache_id", DataType::Int64),
            ("sample_id", DataType::Int64),
            ("weight", DataType::Float64),
        ] {
            match batch.column_by_name(name) {
                Some(col) if *col.data_type() == ty && col.null_count() == 0 => {}
                _ => {
                    return Err(Error::corrupt(
                        &path,
                        format!("snapshot lacks a non-null {ty} column {name:?}"),
                    ))
                }
            }
        }
        if batch.num_rows() > u32::MAX as usize - 1 {
            return Err(Error::corrupt(&path, "more rows than a snapshot can hold"));
        }
        Ok(Snapshot {
            number,
            path,
            batch,
            rows_by_sample: OnceLock::new(),
            alias: OnceLock::new(),
        })
    }

    pub fn number(&self) -> u64 {
        self.number
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn schema(&self) -> SchemaRef {
        self.batch.schema()
    }

    /// The whole population as one record batch over the mapped file.
    pub fn batch(&self) -> &RecordBatch {
        &self.batch
    }

    pub fn num_rows(&self) -> usize {
        self.batch.num_rows()
    }

    fn int64(&self, name: &str) -> &Int64Array {
        self.batch
            .column_by_name(name)
            .expect("identity column checked on open")
            .as_primitive::<Int64Type>()
    }

    pub fn cache_ids(&self) -> &Int64Array {
        self.int64("cache_id")
    }

    pub fn sample_ids(&self) -> &Int64Array {
        self.int64("sample_id")
    }

    pub fn weights(&self) -> &Float64Array {
        self.batch
            .column_by_name("weight")
            .expect("weight column checked on open")
            .as_primitive::<Float64Type>()
    }

    /// Alias table over the weights, built once per snapshot.
    pub fn alias_table(&self) -> &AliasTable {
        self.alias.get_or_init(|| {
            AliasTable::new(self.weights().values()).expect("weights validated on update")
        })
    }

    /// The first row of `(cache position, sample_id)` in this population, if any.
    /// `caches` must be the dataset's caches, sorted by id.
    pub fn row_of(&self, caches: &[Arc<Cache>], cache_pos: usize, sample_id: u64) -> Option<usize> {
        let table = self.rows_by_sample.get_or_init(|| {
            let mut table: Vec<Vec<u32>> = caches
                .iter()
                .map(|c| vec![NO_ROW; c.records() as usize])
                .collect();
            let ids = self.cache_ids().values();
            let samples = self.sample_ids().values();
            let mut pos = 0usize;
            for row in (0..ids.len()).rev() {
                if caches[pos].id() != ids[row] {
                    pos = caches
                        .binary_search_by_key(&ids[row], |c| c.id())
                        .expect("validated on update");
                }
                table[pos][samples[row] as usize] = row as u32;
            }
            table
        });
        match table.get(cache_pos)?.get(sample_id as usize) {
            Some(&row) if row != NO_ROW => Some(row as usize),
            _ => None,
        }
    }
}
