//! Cutting a new population into partitions and hashing each partition's
//! columns (stored by `write`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use arrow::array::{Array, ArrayData, ArrayRef, AsArray, RecordBatch};
use arrow::datatypes::{DataType, SchemaRef};

use super::columns::{column_hash, fixed_width};
use super::manifest::MAX_PARTITION_ROWS;
use crate::Unpoison;
use crate::{Error, Result};

/// Rows per partition a writer cuts a population into, unless told
/// otherwise: `DATASETRT_PARTITION_ROWS`, else 2^22 (a 32 MiB weight column
/// per partition: an update that changes a few partitions writes only
/// those). Readers take any partitioning.
pub fn default_partition_rows() -> usize {
    std::env::var("DATASETRT_PARTITION_ROWS")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .filter(|&n: &usize| n > 0)
        .unwrap_or(1 << 22)
        .min(MAX_PARTITION_ROWS)
}

/// What cutting a new population knows of the active snapshot (see
/// [`Partitioned::new`]): the rows of each of its partitions, and the
/// content hash of each of its mapped fixed-width arrays by the address of
/// its values.
#[derive(Debug, Default)]
pub struct Prior<'a> {
    pub(super) partition_rows: Vec<usize>,
    pub(super) hashes: KnownHashes<'a>,
}

/// A new population cut into partitions, each column of each hashed: what
/// `publish` stores. It holds the rows as given and where each partition
/// ends, never the partitions themselves: a partition cut from several
/// batches is made (copied into one) when it is hashed and again when it is
/// stored, a window of partitions at a time, so that an update holds its
/// input and a few partitions, not a second copy of the population (40 GB
/// at 10^9 rows of five columns).
#[derive(Debug)]
pub struct Partitioned {
    schema: SchemaRef,
    batches: Vec<RecordBatch>,
    /// The rows of each partition, in order.
    sizes: Vec<usize>,
    /// Per partition, the content hash of each column.
    hashes: Vec<Vec<String>>,
}

impl Partitioned {
    /// Cut `batches` (of `schema`) into partitions: when they hold no more
    /// rows than `known` (the active snapshot) and its partitions are no
    /// larger than `per`, as many rows as each of them has, in order; then,
    /// or else, `per` rows each (the last may be shorter). A partition cut from one batch keeps views of its
    /// fixed-width arrays (hashed and written from the range they cover);
    /// its other arrays, and every array of a partition cut from several
    /// batches, are copied into fresh arrays (so that its hash and file
    /// cover only its rows).
    ///
    /// A fixed-width column that is one of `known`'s own mapped arrays (a
    /// column of the active snapshot handed back unchanged, say through
    /// `get_metadata` and polars) takes that array's hash without reading
    /// its bytes.
    ///
    /// `check(first_row, partition, hashes)` is called on each partition
    /// once it is hashed, while it is held (the first error is returned).
    pub fn new(
        schema: &SchemaRef,
        batches: &[RecordBatch],
        per: usize,
        known: Option<&Prior<'_>>,
        check: impl FnMut(usize, &RecordBatch, &[String]) -> Result<()>,
    ) -> Result<Partitioned> {
        let sizes = cut(batches, per, known);
        Self::with_sizes(schema, batches, sizes, known, check)
    }

    /// Cut `batches` into partitions of `sizes` rows (which sum to their
    /// rows), hashed and checked as [`Partitioned::new`] says.
    pub(in crate::catalog) fn with_sizes(
        schema: &SchemaRef,
        batches: &[RecordBatch],
        sizes: Vec<usize>,
        known: Option<&Prior<'_>>,
        mut check: impl FnMut(usize, &RecordBatch, &[String]) -> Result<()>,
    ) -> Result<Partitioned> {
        let empty = KnownHashes::new();
        let by_address = known.map_or(&empty, |k| &k.hashes);
        // a window of partitions is hashed on the engine's threads together
        let window = crate::threads().clamp(1, 4);
        let mut parts = Cuts::new(schema, batches, &sizes);
        let mut hashes = Vec::with_capacity(sizes.len());
        let mut first_row = 0;
        loop {
            let made = parts.by_ref().take(window).collect::<Result<Vec<_>>>()?;
            if made.is_empty() {
                break;
            }
            for (part, h) in made.iter().zip(hash_partitions(&made, by_address)) {
                check(first_row, part, &h)?;
                first_row += part.num_rows();
                hashes.push(h);
            }
        }
        Ok(Partitioned {
            schema: schema.clone(),
            batches: batches.to_vec(),
            sizes,
            hashes,
        })
    }

    pub fn num_rows(&self) -> usize {
        self.sizes.iter().sum()
    }

    /// Each partition, made again, with the content hash of each of its
    /// columns, in row order.
    pub(in crate::catalog) fn parts(
        &self,
    ) -> impl Iterator<Item = Result<(RecordBatch, &[String])>> + '_ {
        Cuts::new(&self.schema, &self.batches, &self.sizes)
            .zip(&self.hashes)
            .map(|(part, h)| Ok((part?, h.as_slice())))
    }
}

/// The rows of each partition of `batches` (see [`Partitioned::new`]).
fn cut(batches: &[RecordBatch], per: usize, known: Option<&Prior<'_>>) -> Vec<usize> {
    let per = per.max(1);
    // a population no larger than `known` (a reweight, a filter) is cut
    // as `known` is, then in partitions of `per` rows: a reweight then
    // shares every partition's other columns, and a filter those before
    // its first removed row, whatever cut snapshot 0's groups of caches
    // made; a larger one, or one whose partitions are larger than `per`
    // (the setting was lowered), is cut every `per` rows
    let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
    let known: &[usize] = match known {
        Some(k)
            if rows <= k.partition_rows.iter().sum()
                && k.partition_rows.iter().all(|&r| r <= per) =>
        {
            &k.partition_rows
        }
        _ => &[],
    };
    let mut sizes = Vec::new();
    let mut left = rows;
    while left > 0 {
        let take = known
            .get(sizes.len())
            .copied()
            .unwrap_or(per)
            .max(1)
            .min(left);
        sizes.push(take);
        left -= take;
    }
    sizes
}

/// The partitions of `batches` at `sizes`, made one at a time.
struct Cuts<'a> {
    schema: &'a SchemaRef,
    batches: &'a [RecordBatch],
    sizes: std::slice::Iter<'a, usize>,
    /// The batch the next partition starts in, and its row there.
    batch: usize,
    at: usize,
}

impl<'a> Cuts<'a> {
    fn new(schema: &'a SchemaRef, batches: &'a [RecordBatch], sizes: &'a [usize]) -> Self {
        Cuts {
            schema,
            batches,
            sizes: sizes.iter(),
            batch: 0,
            at: 0,
        }
    }

    fn make(&mut self, rows: usize) -> Result<RecordBatch> {
        let mut pieces = Vec::new();
        // whether the one piece is a whole batch as given
        let mut whole = false;
        let mut need = rows;
        while need > 0 {
            let Some(batch) = self.batches.get(self.batch) else {
                return Err(Error::internal("a partition was cut past the rows given"));
            };
            let take = need.min(batch.num_rows() - self.at);
            whole = pieces.is_empty() && take == batch.num_rows();
            if take > 0 {
                pieces.push(batch.slice(self.at, take));
            }
            self.at += take;
            need -= take;
            if self.at == batch.num_rows() {
                self.batch += 1;
                self.at = 0;
            }
        }
        let part = match pieces.as_slice() {
            [one] if whole => one.clone(),
            [one] => compact_variable(one)?,
            _ => compact(self.schema, &pieces)?,
        };
        tighten(part)
    }
}

impl Iterator for Cuts<'_> {
    type Item = Result<RecordBatch>;

    fn next(&mut self) -> Option<Self::Item> {
        let rows = *self.sizes.next()?;
        Some(self.make(rows))
    }
}

/// `slice` (part of a batch) with its columns that are not fixed-width
/// copied into fresh arrays (their hash would cover their whole buffers);
/// fixed-width ones stay views of the batch (see [`hash_fixed`]).
pub(in crate::catalog) fn compact_variable(slice: &RecordBatch) -> Result<RecordBatch> {
    let columns = slice
        .columns()
        .iter()
        .map(|c| match fixed_width(&c.to_data()) {
            Some(_) => Ok(c.clone()),
            None => compact_one(&c.to_data()),
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(RecordBatch::try_new(slice.schema(), columns)?)
}

/// `data` (a slice) as one fresh array of its values.
fn compact_one(data: &ArrayData) -> Result<ArrayRef> {
    use arrow::array::{make_array, MutableArrayData};
    let mut out = MutableArrayData::new(vec![data], false, data.len());
    out.try_extend(0, 0, data.len())?;
    Ok(make_array(out.freeze()))
}

/// `pieces` (of `schema`) as one batch of fresh arrays that start at 0
/// (`concat`: dictionaries are merged, and one too large for its key type
/// is an error).
fn compact(schema: &SchemaRef, pieces: &[RecordBatch]) -> Result<RecordBatch> {
    let columns = (0..schema.fields().len())
        .map(|i| {
            let arrays: Vec<&dyn Array> = pieces.iter().map(|p| p.column(i).as_ref()).collect();
            Ok(arrow::compute::concat(&arrays)?)
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(RecordBatch::try_new(schema.clone(), columns)?)
}

/// `batch` with every string or binary view column that holds more than
/// twice the bytes its rows refer to (a slice of a larger column, or a
/// copy of one: view arrays keep their source's data buffers) copied down
/// to those bytes, so that a partition's file and hash cover only its rows.
fn tighten(batch: RecordBatch) -> Result<RecordBatch> {
    fn loose(used: usize, buffers: &[arrow::buffer::Buffer]) -> bool {
        buffers.iter().map(|b| b.len()).sum::<usize>() > 2 * used + 1024
    }
    let mut changed = false;
    let columns = batch
        .columns()
        .iter()
        .map(|c| -> ArrayRef {
            match c.data_type() {
                DataType::Utf8View => {
                    let a = c.as_string_view();
                    if loose(a.total_buffer_bytes_used(), a.data_buffers()) {
                        changed = true;
                        return Arc::new(a.gc());
                    }
                }
                DataType::BinaryView => {
                    let a = c.as_binary_view();
                    if loose(a.total_buffer_bytes_used(), a.data_buffers()) {
                        changed = true;
                        return Arc::new(a.gc());
                    }
                }
                _ => {}
            }
            c.clone()
        })
        .collect();
    if !changed {
        return Ok(batch);
    }
    Ok(RecordBatch::try_new(batch.schema(), columns)?)
}

/// Where a fixed-width array without nulls keeps its values: address of
/// the first, length, type, and its field's nullability (part of the hash).
pub(super) type Address = (usize, usize, DataType, bool);

/// Content hashes of mapped column files by the address of their values.
pub(super) type KnownHashes<'a> = HashMap<Address, &'a str>;

pub(super) fn address(data: &ArrayData, nullable: bool) -> Address {
    match fixed_width(data) {
        Some(width) if data.nulls().is_none() => (
            data.buffers()[0].as_ptr() as usize + data.offset() * width,
            data.len(),
            data.data_type().clone(),
            nullable,
        ),
        _ => (0, 0, DataType::Null, nullable), // never a known address
    }
}

/// The content hash of every column of every partition, partitions hashed
/// on `crate::threads()` threads.
fn hash_partitions(parts: &[RecordBatch], known: &KnownHashes<'_>) -> Vec<Vec<String>> {
    let hash = |batch: &RecordBatch| -> Vec<String> {
        batch
            .schema()
            .fields()
            .iter()
            .zip(batch.columns())
            .map(
                |(f, a)| match known.get(&address(&a.to_data(), f.is_nullable())) {
                    Some(hash) => hash.to_string(),
                    None => column_hash(f, a),
                },
            )
            .collect()
    };
    let threads = crate::threads().min(parts.len()).max(1);
    if threads == 1 {
        return parts.iter().map(hash).collect();
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    let mut out: Vec<Option<Vec<String>>> = vec![None; parts.len()];
    let done = Mutex::new(&mut out);
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(part) = parts.get(i) else { break };
                let hashes = hash(part);
                done.lock().unpoisoned()[i] = Some(hashes);
            });
        }
    });
    out.into_iter()
        .map(|h| h.expect("every partition hashed"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Float64Array, Int64Array, StringArray};
    use arrow::datatypes::{Field, Int64Type, Schema};

    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("cache_id", DataType::Int64, false),
            Field::new("sample_id", DataType::Int64, false),
            Field::new("weight", DataType::Float64, false),
        ]))
    }

    /// Samples `range` of cache 7, sample `i` weighing `i + 1`.
    fn rows(range: std::ops::Range<i64>) -> RecordBatch {
        let samples: Vec<i64> = range.collect();
        let weights: Vec<f64> = samples.iter().map(|&s| (s + 1) as f64).collect();
        RecordBatch::try_new(
            schema(),
            vec![
                Arc::new(Int64Array::from(vec![7i64; samples.len()])),
                Arc::new(Int64Array::from(samples)),
                Arc::new(Float64Array::from(weights)),
            ],
        )
        .unwrap()
    }

    /// The content hashes of each partition of `batches` cut at `sizes`.
    fn part_hashes(batches: &[RecordBatch], sizes: &[usize]) -> Vec<Vec<String>> {
        let made =
            Partitioned::with_sizes(&schema(), batches, sizes.to_vec(), None, |_, _, _| Ok(()))
                .unwrap();
        made.parts().map(|p| p.unwrap().1.to_vec()).collect()
    }

    #[test]
    fn a_population_is_cut_every_per_rows_with_a_shorter_last_partition() {
        let batches = [rows(0..4), rows(4..9), rows(9..10)];
        assert_eq!(cut(&batches, 4, None), [4, 4, 2]);
        assert_eq!(cut(&batches, 5, None), [5, 5]);
        assert_eq!(cut(&batches, 10, None), [10]);
        assert_eq!(cut(&batches, MAX_PARTITION_ROWS, None), [10]);
        // a partition holds a row at least
        assert_eq!(cut(&batches, 0, None), [1; 10]);
        assert!(cut(&[], 4, None).is_empty());
        assert!((1..=MAX_PARTITION_ROWS).contains(&default_partition_rows()));
    }

    #[test]
    fn partitions_cut_across_batches_keep_every_row_in_order() {
        let batches = [rows(0..4), rows(4..9), rows(9..10)];
        let mut seen = Vec::new();
        let made = Partitioned::with_sizes(
            &schema(),
            &batches,
            vec![3, 5, 2],
            None,
            |first, part, hashes| {
                assert_eq!(hashes.len(), part.num_columns());
                seen.push((first, part.num_rows()));
                Ok(())
            },
        )
        .unwrap();
        // each partition is checked once hashed, told its first row
        assert_eq!(seen, [(0, 3), (3, 5), (8, 2)]);
        assert_eq!(made.num_rows(), 10);
        let mut samples = Vec::new();
        for part in made.parts() {
            let (part, hashes) = part.unwrap();
            assert_eq!(hashes.len(), 3);
            let values = part.column(1).as_primitive::<Int64Type>().values();
            samples.extend(values.iter().copied());
        }
        assert_eq!(samples, (0..10).collect::<Vec<i64>>());
        // a cut past the rows given is a bug, reported
        let past = Partitioned::with_sizes(&schema(), &batches, vec![8, 8], None, |_, _, _| Ok(()));
        assert!(matches!(past, Err(Error::Internal(_))), "{past:?}");
    }

    #[test]
    fn equal_rows_hash_equal_however_the_input_was_batched() {
        let one = [rows(0..10)];
        let three = [rows(0..4), rows(4..9), rows(9..10)];
        let fresh = [rows(0..6), rows(6..10)];
        assert_eq!(part_hashes(&one, &[6, 4]), part_hashes(&three, &[6, 4]));
        assert_eq!(
            part_hashes(&one, &[6, 4]),
            hash_partitions(&fresh, &HashMap::new())
        );
        assert_ne!(part_hashes(&one, &[6, 4]), part_hashes(&one, &[5, 5]));
    }

    #[test]
    fn compaction_keeps_the_values_and_copies_only_what_is_not_fixed_width() {
        let schema: SchemaRef = Arc::new(Schema::new(vec![
            Field::new("n", DataType::Int64, true),
            Field::new("s", DataType::Utf8, true),
        ]));
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(Int64Array::from(vec![
                    Some(1),
                    None,
                    Some(3),
                    Some(4),
                    None,
                ])),
                Arc::new(StringArray::from(vec![
                    Some("a"),
                    Some("bb"),
                    None,
                    Some("dddd"),
                    Some("e"),
                ])),
            ],
        )
        .unwrap();
        let slice = batch.slice(1, 3);
        let compacted = compact_variable(&slice).unwrap();
        assert_eq!(compacted, slice);
        // the fixed-width column stays a view of the batch
        assert!(Arc::ptr_eq(compacted.column(0), slice.column(0)));
        // the string column holds its rows' bytes only ("bb", "", "dddd")
        assert_eq!(slice.column(1).as_string::<i32>().values().len(), 8);
        assert_eq!(compacted.column(1).as_string::<i32>().values().len(), 6);
        // the hashes of equal slices of other columns are equal once compacted
        let other = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(Int64Array::from(vec![
                    Some(0),
                    None,
                    Some(3),
                    Some(4),
                    Some(9),
                ])),
                Arc::new(StringArray::from(vec![
                    Some("zzzzzz"),
                    Some("bb"),
                    None,
                    Some("dddd"),
                    None,
                ])),
            ],
        )
        .unwrap();
        let hash = |b: &RecordBatch| column_hash(&schema.fields()[1], b.column(1));
        let (a, b) = (slice, other.slice(1, 3));
        assert_ne!(hash(&a), hash(&b));
        let (a, b) = (compact_variable(&a).unwrap(), compact_variable(&b).unwrap());
        assert_eq!(hash(&a), hash(&b));

        // pieces of several batches: one batch of fresh arrays
        let pieces = [batch.slice(0, 2), batch.slice(3, 2)];
        let joined = compact(&schema, &pieces).unwrap();
        let n = joined.column(0).as_primitive::<Int64Type>();
        assert_eq!(n.iter().collect::<Vec<_>>(), [Some(1), None, Some(4), None]);
        let s = joined.column(1).as_string::<i32>();
        assert_eq!(
            s.iter().collect::<Vec<_>>(),
            [Some("a"), Some("bb"), Some("dddd"), Some("e")]
        );
    }
}
