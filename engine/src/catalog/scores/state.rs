//! The per-sample state of one run of a score log, folded from its
//! segments as they are published: what score recipes read instead of
//! every logged row. One row per sample scored: `count` (rows logged),
//! `first_epoch`, `last_epoch`, `last_loss` (the mean of the sample's rows
//! in its newest epoch) and `ema_loss` (the exponential moving average,
//! newest epoch weighted `alpha`, of its per-epoch means, over the epochs
//! it was scored in: `ema = loss` at the first, then
//! `ema = alpha * loss + (1 - alpha) * ema`).
//!
//! A refresh reads only the segments it has not folded. The newest two
//! epochs seen stay open (their per-sample sums, and which draws they
//! hold); an older epoch is sealed into each sample's average. A segment
//! that brings a draw already folded (a step replayed after a resume,
//! which replaces the earlier row), a row of a sealed epoch, or a listing
//! that lost a folded segment makes the state fold the whole run again,
//! as [`read_run`] reads it: the answer is always that of the whole log
//! read at once.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::hash::BuildHasherDefault;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, Float64Array, Int64Array, RecordBatch, UInt64Array};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};

use super::read::KeyHasher;
use super::{read_run, read_segment, segments};
use crate::{Error, Result};

type Fast = BuildHasherDefault<KeyHasher>;

/// The columns of a score state.
pub fn state_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("cache_id", DataType::Int64, false),
        Field::new("sample_id", DataType::Int64, false),
        Field::new("count", DataType::UInt64, false),
        Field::new("first_epoch", DataType::UInt64, false),
        Field::new("last_epoch", DataType::UInt64, false),
        Field::new("last_loss", DataType::Float64, false),
        Field::new("ema_loss", DataType::Float64, false),
    ]))
}

/// One sample's state over the sealed epochs.
#[derive(Debug, Clone, Copy, Default)]
struct Sealed {
    count: u64,
    /// Epochs scored (0: none sealed yet).
    epochs: u64,
    first_epoch: u64,
    last_epoch: u64,
    last_loss: f64,
    ema: f64,
}

impl Sealed {
    /// Fold one more epoch's mean loss (epochs come in increasing order).
    fn fold(&mut self, alpha: f64, epoch: u64, loss: f64, rows: u64) {
        if self.epochs == 0 {
            self.first_epoch = epoch;
        }
        self.ema = next_ema(alpha, (self.epochs > 0).then_some(self.ema), loss);
        self.epochs += 1;
        self.last_epoch = epoch;
        self.last_loss = loss;
        self.count += rows;
    }
}

/// The moving average after one more epoch's mean `loss`: the loss itself
/// for a sample's first epoch (`previous` None).
fn next_ema(alpha: f64, previous: Option<f64>, loss: f64) -> f64 {
    previous.map_or(loss, |ema| alpha * loss + (1.0 - alpha) * ema)
}

/// Positions below this are kept in a bit set, others in a hash set.
const DENSE: u64 = 1 << 28;

/// One open epoch: the draws folded, and each sample's sum and rows.
#[derive(Debug, Default)]
struct Open {
    bits: Vec<u64>,
    far: HashSet<u64, Fast>,
    sum: Vec<f64>,
    rows: Vec<u32>,
}

impl Open {
    /// Mark draw `position` folded; false if it already was.
    fn mark(&mut self, position: u64) -> bool {
        if position >= DENSE {
            return self.far.insert(position);
        }
        let (word, bit) = ((position / 64) as usize, position % 64);
        if word >= self.bits.len() {
            self.bits.resize(word + 1, 0);
        }
        let fresh = self.bits[word] >> bit & 1 == 0;
        self.bits[word] |= 1 << bit;
        fresh
    }

    fn add(&mut self, sample: usize, value: f64) {
        if sample >= self.sum.len() {
            self.sum.resize(sample + 1, 0.0);
            self.rows.resize(sample + 1, 0);
        }
        self.sum[sample] += value;
        self.rows[sample] += 1;
    }

    /// Sample `i`'s mean loss in this epoch and its rows, if it has any.
    fn mean(&self, i: usize) -> Option<(f64, u64)> {
        let rows = *self.rows.get(i)?;
        (rows > 0).then(|| (self.sum[i] / f64::from(rows), u64::from(rows)))
    }
}

/// Sample ids below this index a per-cache array; others a hash map.
const DENSE_SAMPLES: i64 = 1 << 25;

/// Each sample's index in the state, by `(cache_id, sample_id)`: an array
/// per cache for the ids a cache holds (dense from 0), a hash map for others.
#[derive(Debug, Default)]
struct Index {
    dense: HashMap<i64, Vec<u32>, Fast>,
    sparse: HashMap<(i64, i64), u32, Fast>,
}

impl Index {
    /// The index of `(cache_id, sample_id)`, `next` if it has none yet.
    fn get_or(&mut self, cache_id: i64, sample_id: i64, next: u32) -> u32 {
        if !(0..DENSE_SAMPLES).contains(&sample_id) {
            return *self.sparse.entry((cache_id, sample_id)).or_insert(next);
        }
        let slots = self.dense.entry(cache_id).or_default();
        let at = sample_id as usize;
        if at >= slots.len() {
            let grown = (at + 1).max(2 * slots.len()).min(DENSE_SAMPLES as usize);
            slots.resize(grown, u32::MAX);
        }
        if slots[at] == u32::MAX {
            slots[at] = next;
        }
        slots[at]
    }

    /// The index of a `(cache_id, sample_id)`, if it has one: a lookup
    /// for rows that keep a cache's samples together (its slots are found
    /// once per run of its rows).
    fn lookup(&self) -> impl FnMut(i64, i64) -> Option<u32> + '_ {
        let mut last: Option<(i64, Option<&Vec<u32>>)> = None;
        move |cache_id, sample_id| {
            let found = if (0..DENSE_SAMPLES).contains(&sample_id) {
                let dense = match last {
                    Some((cache, dense)) if cache == cache_id => dense,
                    _ => {
                        let dense = self.dense.get(&cache_id);
                        last = Some((cache_id, dense));
                        dense
                    }
                };
                *dense?.get(sample_id as usize)?
            } else {
                *self.sparse.get(&(cache_id, sample_id))?
            };
            (found != u32::MAX).then_some(found)
        }
    }
}

/// Why folding a segment incrementally cannot give the whole log's answer.
struct Refold;

/// The state of one run's folder, refreshed incrementally.
#[derive(Debug)]
pub struct ScoreState {
    run_dir: PathBuf,
    alpha: f64,
    folded: BTreeSet<PathBuf>,
    index: Index,
    ids: Vec<(i64, i64)>,
    sealed: Vec<Sealed>,
    /// The open epochs, at most two.
    open: BTreeMap<u64, Open>,
    /// Epochs below this are sealed.
    sealed_below: u64,
}

impl ScoreState {
    /// The state of the run in `run_dir`, with moving-average weight `alpha`
    /// (in (0, 1]); nothing is read until [`ScoreState::refresh`].
    pub fn new(run_dir: PathBuf, alpha: f64) -> Result<ScoreState> {
        if !(alpha > 0.0 && alpha <= 1.0) {
            return Err(
                Error::invalid(format!("alpha must be a number in (0, 1], not {alpha}"))
                    .at_column("alpha", Some(alpha.to_string())),
            );
        }
        Ok(ScoreState {
            run_dir,
            alpha,
            folded: BTreeSet::new(),
            index: Index::default(),
            ids: Vec::new(),
            sealed: Vec::new(),
            open: BTreeMap::new(),
            sealed_below: 0,
        })
    }

    /// Fold the segments published since the last refresh; the state.
    pub fn refresh(&mut self) -> Result<RecordBatch> {
        self.update()?;
        self.batch()
    }

    /// Fold the segments published since the last refresh.
    pub fn update(&mut self) -> Result<()> {
        let listed = segments(&self.run_dir)?;
        let now: BTreeSet<&Path> = listed.iter().map(PathBuf::as_path).collect();
        let lost = self.folded.iter().any(|p| !now.contains(p.as_path()));
        let fresh: Vec<&PathBuf> = listed
            .iter()
            .filter(|p| !self.folded.contains(*p))
            .collect();
        if lost {
            self.refold(&listed)?;
        } else {
            for path in fresh {
                let rows = read_segment(path)?;
                if self.fold(&rows).is_err() {
                    self.refold(&listed)?;
                    break;
                }
                self.folded.insert(path.clone());
            }
        }
        Ok(())
    }

    /// Forget everything and fold the whole run as [`read_run`] reads it.
    fn refold(&mut self, listed: &[PathBuf]) -> Result<()> {
        let run_dir = std::mem::take(&mut self.run_dir);
        *self = ScoreState::new(run_dir, self.alpha)?;
        if let Some(rows) = read_run(&self.run_dir)? {
            // one row per draw: nothing here is a replay
            if self.fold(&rows).is_err() {
                return Err(Error::internal(
                    "a score run read whole still repeats a draw",
                ));
            }
        }
        self.folded = listed.iter().cloned().collect();
        Ok(())
    }

    /// Fold one segment's rows, or say the whole run must be folded again
    /// (some of them may then be folded already: the caller starts over).
    fn fold(&mut self, rows: &RecordBatch) -> std::result::Result<(), Refold> {
        let u64s = |i: usize| column::<UInt64Array>(rows, i).values();
        let i64s = |i: usize| column::<Int64Array>(rows, i).values();
        let (epochs, positions) = (u64s(0), u64s(1));
        let (cache_ids, sample_ids) = (i64s(2), i64s(3));
        let values = column::<Float64Array>(rows, 4).values();
        // an epoch too old to fold, or a draw folded before: the newest row
        // must replace the older one, which only a whole read can tell
        if epochs.iter().any(|&e| e < self.sealed_below) {
            return Err(Refold);
        }
        let mut samples = Vec::new();
        let mut start = 0;
        while start < rows.num_rows() {
            // a run of rows of one epoch (a segment is mostly one)
            let epoch = epochs[start];
            let end = start + epochs[start..].iter().take_while(|&&e| e == epoch).count();
            samples.clear();
            samples.extend((start..end).map(|i| self.sample(cache_ids[i], sample_ids[i])));
            let open = self.open.entry(epoch).or_default();
            for (k, i) in (start..end).enumerate() {
                if !open.mark(positions[i]) {
                    return Err(Refold);
                }
                open.add(samples[k], values[i]);
            }
            start = end;
        }
        self.seal();
        Ok(())
    }

    /// Keep the newest two epochs open; fold the older ones into `sealed`.
    fn seal(&mut self) {
        while self.open.len() > 2 {
            let (epoch, open) = self.open.pop_first().expect("more than two");
            for (i, state) in self.sealed.iter_mut().enumerate() {
                if let Some((loss, rows)) = open.mean(i) {
                    state.fold(self.alpha, epoch, loss, rows);
                }
            }
            self.sealed_below = epoch + 1;
        }
    }

    /// The index of sample `(cache_id, sample_id)`, added if new.
    fn sample(&mut self, cache_id: i64, sample_id: i64) -> usize {
        let next = self.ids.len() as u32;
        let i = self.index.get_or(cache_id, sample_id, next);
        if i == next {
            self.ids.push((cache_id, sample_id));
            self.sealed.push(Sealed::default());
        }
        i as usize
    }

    /// Each sample's state as of the last refresh: the sealed state with
    /// the open epochs folded in, epoch by epoch.
    fn current(&self) -> Vec<Sealed> {
        let mut states = self.sealed.clone();
        for (&epoch, open) in &self.open {
            for (i, (&rows, &sum)) in open.rows.iter().zip(&open.sum).enumerate() {
                if rows > 0 {
                    let rows = u64::from(rows);
                    states[i].fold(self.alpha, epoch, sum / rows as f64, rows);
                }
            }
        }
        states
    }

    /// The `ema_loss` of each sample `(cache_ids[i], sample_ids[i])` as of
    /// the last refresh, `NaN` for a sample the run has not scored.
    pub fn ema_of(&self, cache_ids: &[i64], sample_ids: &[i64]) -> Vec<f64> {
        let emas = self.current_ema();
        let mut index = self.index.lookup();
        cache_ids
            .iter()
            .zip(sample_ids)
            .map(|(&c, &s)| index(c, s).map_or(f64::NAN, |i| emas[i as usize]))
            .collect()
    }

    /// Each sample's `ema_loss` as of the last refresh (NaN: not scored):
    /// what [`Self::current`] gives of it, without the other fields (a
    /// tenth of the memory at 10^7 samples).
    fn current_ema(&self) -> Vec<f64> {
        let mut emas: Vec<f64> = self
            .sealed
            .iter()
            .map(|s| if s.epochs > 0 { s.ema } else { f64::NAN })
            .collect();
        for open in self.open.values() {
            for (ema, (&rows, &sum)) in emas.iter_mut().zip(open.rows.iter().zip(&open.sum)) {
                if rows > 0 {
                    // losses are finite: NaN is only "not scored"
                    let previous = (!ema.is_nan()).then_some(*ema);
                    *ema = next_ema(self.alpha, previous, sum / f64::from(rows));
                }
            }
        }
        emas
    }

    /// One row per sample scored, in the order samples were first seen.
    fn batch(&self) -> Result<RecordBatch> {
        let states = self.current();
        let n = states.iter().filter(|s| s.epochs > 0).count();
        let (mut cache_id, mut sample_id) = (Vec::with_capacity(n), Vec::with_capacity(n));
        let (mut count, mut first) = (Vec::with_capacity(n), Vec::with_capacity(n));
        let (mut last, mut last_loss) = (Vec::with_capacity(n), Vec::with_capacity(n));
        let mut ema = Vec::with_capacity(n);
        for (state, &(c, s)) in states.iter().zip(&self.ids) {
            if state.epochs > 0 {
                cache_id.push(c);
                sample_id.push(s);
                count.push(state.count);
                first.push(state.first_epoch);
                last.push(state.last_epoch);
                last_loss.push(state.last_loss);
                ema.push(state.ema);
            }
        }
        let columns: Vec<ArrayRef> = vec![
            Arc::new(Int64Array::from(cache_id)),
            Arc::new(Int64Array::from(sample_id)),
            Arc::new(UInt64Array::from(count)),
            Arc::new(UInt64Array::from(first)),
            Arc::new(UInt64Array::from(last)),
            Arc::new(Float64Array::from(last_loss)),
            Arc::new(Float64Array::from(ema)),
        ];
        Ok(RecordBatch::try_new(state_schema(), columns)?)
    }
}

/// Column `i` of a segment's rows (the reader checked their types).
fn column<T: Array + 'static>(rows: &RecordBatch, i: usize) -> &T {
    rows.column(i)
        .as_any()
        .downcast_ref::<T>()
        .expect("segment columns are checked")
}

#[cfg(test)]
mod tests {
    use super::super::{Positions, ScoreWriter};
    use super::*;
    use arrow::array::AsArray;
    use arrow::datatypes::{Float64Type, Int64Type, UInt64Type};

    /// Flush one segment of `(epoch, position, sample_id, value)` rows.
    fn log(dir: &Path, rows: &[(u64, u64, i64, f64)]) {
        let writer = ScoreWriter::new(dir.to_path_buf(), 0, "0", 1 << 20).unwrap();
        for &(epoch, position, sample, value) in rows {
            writer
                .append(epoch, Positions::From(position), &[1], &[sample], &[value])
                .unwrap();
        }
        writer.flush().unwrap();
    }

    /// sample_id -> (count, first, last, last_loss, ema), from a state batch.
    type Row = (u64, u64, u64, f64, f64);

    fn rows(batch: &RecordBatch) -> BTreeMap<i64, Row> {
        let ids = batch.column(1).as_primitive::<Int64Type>();
        let u = |i: usize| batch.column(i).as_primitive::<UInt64Type>().clone();
        let f = |i: usize| batch.column(i).as_primitive::<Float64Type>().clone();
        let (count, first, last, loss, ema) = (u(2), u(3), u(4), f(5), f(6));
        (0..batch.num_rows())
            .map(|i| {
                let row = (
                    count.value(i),
                    first.value(i),
                    last.value(i),
                    loss.value(i),
                    ema.value(i),
                );
                (ids.value(i), row)
            })
            .collect()
    }

    /// The state computed from every row at once, as the recipe defines it.
    fn whole(all: &[(u64, u64, i64, f64)], alpha: f64) -> BTreeMap<i64, Row> {
        // the newest row of each draw, then per sample and epoch the mean
        let mut newest: BTreeMap<(u64, u64), (i64, f64)> = BTreeMap::new();
        for &(e, p, s, v) in all {
            newest.insert((e, p), (s, v));
        }
        let mut per: BTreeMap<i64, BTreeMap<u64, (f64, u64)>> = BTreeMap::new();
        for (&(e, _), &(s, v)) in &newest {
            let at = per.entry(s).or_default().entry(e).or_default();
            at.0 += v;
            at.1 += 1;
        }
        per.into_iter()
            .map(|(s, epochs)| {
                let mut st = Sealed::default();
                for (e, (sum, n)) in epochs {
                    st.fold(alpha, e, sum / n as f64, n);
                }
                (
                    s,
                    (
                        st.count,
                        st.first_epoch,
                        st.last_epoch,
                        st.last_loss,
                        st.ema,
                    ),
                )
            })
            .collect()
    }

    fn close(a: &BTreeMap<i64, Row>, b: &BTreeMap<i64, Row>) {
        assert_eq!(a.len(), b.len(), "{a:?} vs {b:?}");
        for (k, x) in a {
            let y = &b[k];
            assert_eq!((x.0, x.1, x.2), (y.0, y.1, y.2), "sample {k}");
            assert!(
                (x.3 - y.3).abs() < 1e-12 && (x.4 - y.4).abs() < 1e-12,
                "{k}: {x:?} {y:?}"
            );
        }
    }

    #[test]
    fn each_refresh_equals_the_whole_log_read_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let mut state = ScoreState::new(dir.path().to_path_buf(), 0.5).unwrap();
        assert_eq!(state.refresh().unwrap().num_rows(), 0);
        let mut all = Vec::new();
        let mut step = |state: &mut ScoreState, rows: Vec<(u64, u64, i64, f64)>| {
            log(dir.path(), &rows);
            all.extend(rows);
            let want = whole(&all, 0.5);
            close(&rows_of(state), &want);
            // each sample's ema as a reweight reads it: NaN where unscored,
            // in any order, caches apart (cache 2 has no scores)
            let samples = [4, 0, 5, 3, 1, 2, 40, 4];
            let emas = state.ema_of(&[1, 1, 1, 2, 1, 1, 1, 1], &samples);
            for (k, (&sample, ema)) in samples.iter().zip(emas).enumerate() {
                match want.get(&sample) {
                    Some(row) if k != 3 => assert!((row.4 - ema).abs() < 1e-12, "{sample}"),
                    _ => assert!(ema.is_nan(), "{sample}"),
                }
            }
        };
        fn rows_of(state: &mut ScoreState) -> BTreeMap<i64, Row> {
            rows(&state.refresh().unwrap())
        }
        // four epochs of draws over five samples, two segments an epoch
        for epoch in 0..4u64 {
            for half in 0..2u64 {
                let seg = (0..6)
                    .map(|k| {
                        let p = half * 6 + k;
                        (
                            epoch,
                            p,
                            (p * 7 + epoch) as i64 % 5,
                            (p + epoch * 3) as f64 / 4.0,
                        )
                    })
                    .collect();
                step(&mut state, seg);
            }
        }
        assert_eq!(state.sealed_below, 2); // epochs 0 and 1 sealed, 2 and 3 open
                                           // a replayed step of the open epoch 3 (newest row wins), then a
                                           // late row of sealed epoch 0: both make a whole fold, still exact
        step(&mut state, vec![(3, 2, 4, 100.0), (3, 3, 4, 50.0)]);
        step(&mut state, vec![(0, 40, 1, 9.0)]);
        // a segment removed: folded again without it
        let last = segments(dir.path()).unwrap().pop().unwrap();
        std::fs::remove_file(&last).unwrap();
        all.pop();
        close(&rows_of(&mut state), &whole(&all, 0.5));
    }

    #[test]
    fn alpha_is_checked() {
        for alpha in [0.0, -1.0, 1.5, f64::NAN] {
            assert!(matches!(
                ScoreState::new(PathBuf::from("x"), alpha),
                Err(Error::InvalidInput { .. })
            ));
        }
    }
}
