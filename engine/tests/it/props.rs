//! Property tests where there is arithmetic: which draws each reader of an
//! epoch takes (ranks, workers, padding, resume points), the samplers'
//! sequences, and the take that turns identities into bytes.

use std::sync::Arc;

use arrow::array::{Array, AsArray, Int64Array, RecordBatch};
use arrow::datatypes::{DataType, Field, Int64Type, Schema, UInt64Type};
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::execution::TaskContext;
use datafusion::physical_plan::collect;
use datasetrt::query::exec::{PayloadColumn, PayloadTakeExec, SampleExec, Unmatched};
use datasetrt::sample::{DrawPlan, EpochSampler, Sampling};
use datasetrt::store::codec::MIN_COMPRESS_LEN;
use datasetrt::store::{CacheWriter, Codec, WriterOptions};
use datasetrt::{Dataset, OpenOptions};
use proptest::prelude::*;
use proptest::test_runner::TestRunner;

use crate::store::{attributes, write_cache};

const CASES: u32 = 64;

// ---- draws ------------------------------------------------------------------

fn sampling() -> impl Strategy<Value = Sampling> {
    prop_oneof![
        Just(Sampling::Replacement),
        Just(Sampling::Permutation),
        Just(Sampling::WeightedWithoutReplacement),
        Just(Sampling::Balanced),
    ]
}

/// Reader (0, 0) of a random epoch split; `start_block` runs up to two
/// blocks past the end.
fn draw_plans() -> impl Strategy<Value = DrawPlan> {
    (
        sampling(),
        any::<u64>(),
        0u64..3,
        1u64..300,
        1usize..=40,
        1u32..=4,
        1u32..=3,
        any::<bool>(),
        any::<u64>(),
    )
        .prop_map(
            |(
                sampling,
                seed,
                epoch,
                epoch_len,
                batch_size,
                world_size,
                num_workers,
                drop_last,
                pick,
            )| {
                let blocks = epoch_len.div_ceil(batch_size as u64);
                DrawPlan {
                    sampling,
                    seed,
                    epoch,
                    epoch_len,
                    batch_size,
                    start_block: pick % (blocks + 3),
                    drop_last,
                    rank: 0,
                    world_size,
                    worker: 0,
                    num_workers,
                    run: None,
                }
            },
        )
}

/// Sampling weights, zeros included, at least one positive.
fn weights() -> impl Strategy<Value = Vec<f64>> {
    prop::collection::vec(
        prop_oneof![Just(0.0), Just(1.0), Just(3.0), 0.01f64..10.0],
        1..40,
    )
    .prop_filter("a positive weight", |w| w.iter().any(|&x| x > 0.0))
}

/// Every reader of `plan`'s split, rank by rank, worker by worker.
fn readers(plan: &DrawPlan) -> Vec<DrawPlan> {
    let mut all = Vec::new();
    for rank in 0..plan.world_size {
        for worker in 0..plan.num_workers {
            all.push(DrawPlan {
                rank,
                worker,
                ..plan.clone()
            });
        }
    }
    all
}

/// `plan` read by one process alone.
fn alone(plan: &DrawPlan) -> DrawPlan {
    DrawPlan {
        world_size: 1,
        num_workers: 1,
        ..plan.clone()
    }
}

/// The rows drawn for `blocks` of `plan`, in that order.
fn rows_of(plan: &DrawPlan, sampler: &EpochSampler, blocks: &[u64]) -> Vec<u64> {
    blocks
        .iter()
        .flat_map(|&b| {
            let (start, end) = plan.block_range(b);
            (start..end).map(|k| sampler.row(k).unwrap())
        })
        .collect()
}

/// The real sampler of `plan`'s epoch over `weights`.
fn sampler(plan: &DrawPlan, weights: &[f64]) -> EpochSampler {
    EpochSampler::new(
        plan.sampling,
        weights.len(),
        &|| Ok(weights.into()),
        None,
        plan.seed,
        plan.epoch,
        plan.epoch_len,
    )
    .unwrap()
}

/// The blocks of all readers, in global order.
fn all_blocks(plan: &DrawPlan) -> Vec<u64> {
    let mut blocks: Vec<u64> = readers(plan).iter().flat_map(|r| r.my_blocks()).collect();
    blocks.sort_unstable();
    blocks
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(CASES))]

    #[test]
    fn readers_split_the_blocks_from_the_resume_point_without_overlap_or_gap(plan in draw_plans()) {
        let all = readers(&plan);
        for r in &all {
            prop_assert!(r.validate().is_ok());
            prop_assert_eq!(r.blocks(), plan.blocks());
            prop_assert_eq!(r.total_draws(), plan.total_draws());
        }
        let mut blocks: Vec<u64> = all.iter().flat_map(|r| r.my_blocks()).collect();
        let delivered = blocks.len();
        blocks.sort_unstable();
        blocks.dedup();
        prop_assert_eq!(blocks.len(), delivered, "a block went to two readers");
        prop_assert_eq!(&blocks, &(plan.start_block..plan.blocks()).collect::<Vec<_>>());

        let bs = plan.batch_size as u64;
        let draws: u64 = blocks.iter().map(|&b| { let (s, e) = plan.block_range(b); e - s }).sum();
        prop_assert_eq!(draws, plan.total_draws().saturating_sub(plan.start_block * bs));

        if plan.world_size > 1 {
            // every rank the same number of full batches
            let per_rank: Vec<usize> = (0..plan.world_size)
                .map(|rank| {
                    let mine = all.iter().filter(|r| r.rank == rank);
                    mine.map(|r| r.my_blocks().count()).sum()
                })
                .collect();
            prop_assert!(per_rank.iter().all(|&n| n == per_rank[0]), "{:?}", per_rank);
            for &b in &blocks {
                let (s, e) = plan.block_range(b);
                prop_assert_eq!(e - s, bs, "block {} is not full", b);
            }
        }

        // a rank's DataLoader, taking one batch from each worker in turn,
        // yields that rank's blocks in global order
        for rank in 0..plan.world_size {
            let mut lists: Vec<std::vec::IntoIter<u64>> = all
                .iter()
                .filter(|r| r.rank == rank)
                .map(|r| r.my_blocks().collect::<Vec<_>>().into_iter())
                .collect();
            let mut in_turn = Vec::new();
            'turns: loop {
                for list in lists.iter_mut() {
                    match list.next() {
                        Some(b) => in_turn.push(b),
                        None => break 'turns,
                    }
                }
            }
            prop_assert!(lists.iter_mut().all(|l| l.next().is_none()), "a worker has blocks left");
            let expected: Vec<u64> = (plan.start_block + rank as u64..plan.blocks())
                .step_by(plan.world_size as usize)
                .collect();
            prop_assert_eq!(in_turn, expected);
        }
    }

    #[test]
    fn together_the_readers_draw_what_one_reader_draws(plan in draw_plans(), weights in weights()) {
        let sampler = sampler(&plan, &weights);
        let group = rows_of(&plan, &sampler, &all_blocks(&plan));
        let one = alone(&plan);
        let single = rows_of(&one, &sampler, &one.my_blocks().collect::<Vec<_>>());
        // ranks are evened out by dropping or padding less than one round
        // of blocks; the draws they share are the same
        let round = plan.world_size as usize * plan.batch_size;
        let (short, long) = if plan.drop_last { (&group, &single) } else { (&single, &group) };
        prop_assert!(
            long.len() >= short.len() && long.len() - short.len() < round,
            "group {} draws, alone {}", group.len(), single.len()
        );
        prop_assert_eq!(&long[..short.len()], &short[..]);
        if plan.world_size == 1 {
            prop_assert_eq!(&group, &single);
        }
        for &row in &single {
            prop_assert!((row as usize) < weights.len());
            if plan.sampling == Sampling::WeightedWithoutReplacement {
                prop_assert!(weights[row as usize] > 0.0, "row {} has weight 0", row);
            }
        }
    }

    #[test]
    fn resuming_at_any_block_boundary_gives_the_rest_of_the_sequence(
        plan in draw_plans(),
        weights in weights(),
    ) {
        // one rank and its workers: the padding does not depend on the
        // resume point, so a resumed epoch is exactly the rest of it
        let plan = DrawPlan { world_size: 1, start_block: 0, ..plan };
        let sampler = sampler(&plan, &weights);
        let full = rows_of(&plan, &sampler, &all_blocks(&plan));
        prop_assert_eq!(full.len() as u64, plan.total_draws());
        for start_block in 0..=plan.blocks() + 1 {
            let resumed = DrawPlan { start_block, ..plan.clone() };
            let rest = rows_of(&resumed, &sampler, &all_blocks(&resumed));
            let at = (start_block as usize * plan.batch_size).min(full.len());
            prop_assert_eq!(&rest[..], &full[at..], "resumed at block {}", start_block);
        }
    }

    #[test]
    fn the_modes_without_replacement_draw_every_row_once_per_epoch_whatever_the_split(
        plan in draw_plans(),
        weights in weights(),
        weighted in any::<bool>(),
    ) {
        let sampling = match weighted {
            true => Sampling::WeightedWithoutReplacement,
            false => Sampling::Permutation,
        };
        let epoch_len = sampling.default_epoch_len(weights.len(), &|| Ok((&weights[..]).into())).unwrap();
        let plan = DrawPlan {
            sampling, epoch_len, start_block: 0, drop_last: false, world_size: 1, ..plan
        };
        let sampler = sampler(&plan, &weights);
        let mut rows = rows_of(&plan, &sampler, &all_blocks(&plan));
        rows.sort_unstable();
        let expected: Vec<u64> = (0..weights.len() as u64)
            .filter(|&r| !weighted || weights[r as usize] > 0.0)
            .collect();
        prop_assert_eq!(rows, expected);
    }
}

#[test]
fn the_sample_node_emits_exactly_the_planned_draws_of_a_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    write_cache(dir.path(), "alpha", 40, WriterOptions::default());
    write_cache(dir.path(), "beta", 25, WriterOptions::default());
    let ds = Dataset::open(&[dir.path().to_path_buf()], OpenOptions::default()).unwrap();
    // weights 0, 0.5, ... 3.0 (every seventh row never drawn without replacement)
    let base = ds.snapshot();
    let weights: Vec<f64> = (0..base.num_rows()).map(|i| (i % 7) as f64 * 0.5).collect();
    let schema = Arc::new(Schema::new(vec![
        Field::new("cache_id", DataType::Int64, false),
        Field::new("sample_id", DataType::Int64, false),
        Field::new("weight", DataType::Float64, false),
    ]));
    let batch = RecordBatch::try_new(
        schema.clone(),
        vec![
            Arc::new(arrow::array::Int64Array::from(crate::identity_column(
                &base, 0,
            ))),
            Arc::new(arrow::array::Int64Array::from(crate::identity_column(
                &base, 1,
            ))),
            Arc::new(arrow::array::Float64Array::from(weights.clone())),
        ],
    )
    .unwrap();
    let snapshot = ds
        .update(&schema, &[batch], "weights", None, false)
        .unwrap();
    assert_eq!(snapshot.weights().unwrap().to_vec(), weights);

    let readers = (draw_plans(), any::<u32>(), any::<u32>()).prop_map(|(plan, r, w)| DrawPlan {
        rank: r % plan.world_size,
        worker: w % plan.num_workers,
        ..plan
    });
    let mut runner = TestRunner::new(ProptestConfig::with_cases(CASES));
    runner
        .run(&readers, |plan| {
            // built from the weights, not from the snapshot's mapped alias table
            let sampler = sampler(&plan, &weights);
            let node = Arc::new(SampleExec::try_new(snapshot.clone(), plan.clone()).unwrap());
            let batches =
                futures::executor::block_on(collect(node, Arc::new(TaskContext::default())))
                    .unwrap();
            let blocks: Vec<u64> = plan.my_blocks().collect();
            prop_assert_eq!(batches.len(), blocks.len(), "one batch per block");
            for (batch, &b) in batches.iter().zip(&blocks) {
                let (start, end) = plan.block_range(b);
                let draws = batch.column(0).as_primitive::<UInt64Type>().values();
                let rows = batch.column(1).as_primitive::<UInt64Type>().values();
                let cache_ids = batch.column(2).as_primitive::<Int64Type>().values();
                let sample_ids = batch.column(3).as_primitive::<Int64Type>().values();
                prop_assert_eq!(draws.to_vec(), (start..end).collect::<Vec<_>>());
                for (i, &k) in draws.iter().enumerate() {
                    let row = sampler.row(k).unwrap() as usize;
                    prop_assert_eq!(rows[i] as usize, row, "draw {}", k);
                    let (cache_id, sample_id) = snapshot.identity(row).unwrap();
                    prop_assert_eq!(cache_ids[i], cache_id);
                    prop_assert_eq!(sample_ids[i], sample_id);
                }
            }
            Ok(())
        })
        .unwrap();
}

// ---- take -------------------------------------------------------------------

/// One record: its length (0, inline in a view, small, or several KiB),
/// whether its bytes repeat (so a codec shrinks it), and a seed for them.
type Record = (usize, bool, u64);

/// A cache: its codec and records.
type CacheSpec = (Codec, Vec<Record>);

fn records() -> impl Strategy<Value = Vec<Record>> {
    let len = prop_oneof![Just(0usize), 1usize..=12, 13usize..200, 200usize..5000];
    prop::collection::vec((len, any::<bool>(), any::<u64>()), 1..30)
}

fn codec() -> impl Strategy<Value = Codec> {
    prop_oneof![Just(Codec::None), Just(Codec::Zstd), Just(Codec::Lz4)]
}

fn bytes(&(len, repeat, seed): &Record) -> Vec<u8> {
    let mut rng = crate::fuzz::Rng(seed);
    let period = 1 + rng.below(7);
    let pattern: Vec<u8> = (0..period).map(|_| rng.next() as u8).collect();
    (0..len)
        .map(|j| {
            if repeat {
                pattern[j % period]
            } else {
                rng.next() as u8
            }
        })
        .collect()
}

/// Written caches opened as a dataset (which keeps them sorted by id), and
/// each one's codec and records, in the dataset's order.
struct Written {
    _dir: tempfile::TempDir,
    ds: Dataset,
    codecs: Vec<Codec>,
    records: Vec<Vec<Vec<u8>>>,
}

fn write(specs: &[CacheSpec]) -> Written {
    let dir = tempfile::tempdir().unwrap();
    let mut written: Vec<(String, Codec, Vec<Vec<u8>>)> = Vec::new();
    for (c, (codec, spec)) in specs.iter().enumerate() {
        let options = WriterOptions {
            codec: *codec,
            shard_target_bytes: 8 << 10, // several shards
            threads: 1,
            ..WriterOptions::default()
        };
        let name = format!("c{c}");
        let records: Vec<Vec<u8>> = spec.iter().map(bytes).collect();
        let mut w = CacheWriter::create(dir.path(), &name, options).unwrap();
        let (mut data, mut ends) = (Vec::new(), Vec::new());
        for r in &records {
            data.extend_from_slice(r);
            ends.push(data.len());
        }
        w.add_chunk(data, ends).unwrap();
        w.finish(attributes(records.len())).unwrap();
        written.push((name, *codec, records));
    }
    let ds = Dataset::open(&[dir.path().to_path_buf()], OpenOptions::default()).unwrap();
    let mut codecs = Vec::new();
    let mut records = Vec::new();
    for cache in ds.caches() {
        let at = written.iter().position(|w| w.0 == cache.name()).unwrap();
        let (_, codec, r) = written.swap_remove(at);
        codecs.push(codec);
        records.push(r);
    }
    Written {
        _dir: dir,
        ds,
        codecs,
        records,
    }
}

/// What one input row names: a stored sample, an unknown cache, a sample
/// past the end of its cache, a negative sample id, or a null.
#[derive(Debug, Clone, Copy)]
enum Pick {
    Stored(usize, usize),
    UnknownCache(usize),
    PastEnd(usize, usize),
    Negative(usize),
    Null(usize),
}

fn picks() -> impl Strategy<Value = Vec<Pick>> {
    let pick = prop_oneof![
        6 => (any::<usize>(), any::<usize>()).prop_map(|(c, s)| Pick::Stored(c, s)),
        1 => any::<usize>().prop_map(Pick::UnknownCache),
        1 => (any::<usize>(), 0usize..3).prop_map(|(c, s)| Pick::PastEnd(c, s)),
        1 => any::<usize>().prop_map(Pick::Negative),
        1 => any::<usize>().prop_map(Pick::Null),
    ];
    prop::collection::vec(pick, 0..80)
}

/// `(cache_id, sample_id)` of each pick (None for a null) and, for a
/// stored sample, its (cache position, sample).
type Identity = (Option<i64>, Option<i64>, Option<(usize, usize)>);

fn identities(w: &Written, picks: &[Pick]) -> Vec<Identity> {
    let n = w.records.len();
    let ids: Vec<i64> = w.ds.caches().iter().map(|c| c.id()).collect();
    let unknown = ids.iter().max().unwrap().wrapping_add(1);
    picks
        .iter()
        .map(|&p| match p {
            Pick::Stored(c, s) => {
                let (c, s) = (c % n, s % w.records[c % n].len());
                (Some(ids[c]), Some(s as i64), Some((c, s)))
            }
            Pick::UnknownCache(s) => (Some(unknown), Some((s % 4) as i64), None),
            Pick::PastEnd(c, extra) => {
                let c = c % n;
                let s = w.records[c].len() + extra;
                (Some(ids[c]), Some(s as i64), None)
            }
            Pick::Negative(c) => (Some(ids[c % n]), Some(-1), None),
            Pick::Null(c) if c % 2 == 0 => (None, Some(0), None),
            Pick::Null(c) => (Some(ids[c % n]), None, None),
        })
        .collect()
}

fn caches() -> impl Strategy<Value = Vec<CacheSpec>> {
    prop::collection::vec((codec(), records()), 1..=3)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(CASES))]

    #[test]
    fn take_returns_the_written_bytes_of_every_identity_in_input_order(
        specs in caches(),
        picks in picks(),
        concurrency in 1usize..=4,
    ) {
        let w = write(&specs);
        let ids = identities(&w, &picks);
        // CacheSet::take is the loader's read: rows name stored samples (a
        // null has no place in its input); one that does not is an error
        let named: Vec<&Identity> =
            ids.iter().filter(|(c, s, _)| c.is_some() && s.is_some()).collect();
        let take = |ids: &[&Identity]| {
            let cache_ids: Vec<i64> = ids.iter().map(|i| i.0.unwrap()).collect();
            let sample_ids: Vec<i64> = ids.iter().map(|i| i.1.unwrap()).collect();
            w.ds.caches().take(&cache_ids, &sample_ids, concurrency)
        };
        let got = take(&named);
        if named.iter().any(|i| i.2.is_none()) {
            prop_assert!(got.is_err(), "a row names no stored sample, yet bytes came back");
        }
        let stored: Vec<&Identity> = named.into_iter().filter(|i| i.2.is_some()).collect();
        let got = take(&stored).unwrap();
        prop_assert_eq!(got.len(), stored.len());
        for (row, id) in stored.iter().enumerate() {
            let (c, s) = id.2.unwrap();
            prop_assert_eq!(got.value(row), &w.records[c][s][..], "row {}", row);
        }
    }

    #[test]
    fn the_sql_take_drops_or_nulls_rows_that_name_no_stored_sample(
        specs in caches(),
        picks in picks(),
        null in any::<bool>(),
        concurrency in 1usize..=4,
    ) {
        let w = write(&specs);
        let ids = identities(&w, &picks);
        let schema = Arc::new(Schema::new(vec![
            Field::new("cache_id", DataType::Int64, true),
            Field::new("sample_id", DataType::Int64, true),
            Field::new("row", DataType::Int64, false),
        ]));
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(ids.iter().map(|i| i.0).collect::<Int64Array>()),
                Arc::new(ids.iter().map(|i| i.1).collect::<Int64Array>()),
                Arc::new(Int64Array::from_iter_values(0..ids.len() as i64)),
            ],
        )
        .unwrap();
        let input = MemorySourceConfig::try_new_exec(&[vec![batch]], schema, None).unwrap();
        let unmatched = if null { Unmatched::Null } else { Unmatched::Drop };
        let columns = vec![PayloadColumn::Data, PayloadColumn::RawLen, PayloadColumn::Codec];
        let take = PayloadTakeExec::with_columns(
            input,
            w.ds.cache_set(),
            (0, 1),
            columns,
            unmatched,
            concurrency,
        )
        .unwrap();
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let batches = runtime
            .block_on(collect(Arc::new(take), Arc::new(TaskContext::default())))
            .unwrap();
        let expected: Vec<usize> = (0..ids.len()).filter(|&i| null || ids[i].2.is_some()).collect();
        let mut got = Vec::new();
        for b in &batches {
            let rows = b.column(2).as_primitive::<Int64Type>();
            let data = b.column(3).as_binary_view();
            let raw_len = b.column(4).as_primitive::<Int64Type>();
            let codec = b.column(5).as_string::<i32>();
            for i in 0..b.num_rows() {
                let row = rows.value(i) as usize;
                got.push(row);
                match ids[row].2 {
                    Some((c, s)) => {
                        let record = &w.records[c][s];
                        prop_assert_eq!(data.value(i), &record[..], "row {}", row);
                        prop_assert_eq!(raw_len.value(i), record.len() as i64);
                        // stored raw when short or when the codec did not shrink it
                        let stored = codec.value(i);
                        let compressed =
                            record.len() >= MIN_COMPRESS_LEN && stored == w.codecs[c].name();
                        prop_assert!(stored == "none" || compressed,
                            "row {} stored as {}", row, stored);
                    }
                    None => {
                        let nulls = data.is_null(i) && raw_len.is_null(i) && codec.is_null(i);
                        prop_assert!(nulls, "row {}", row);
                    }
                }
            }
        }
        prop_assert_eq!(got, expected, "rows out of input order, or the wrong ones kept");
    }
}
