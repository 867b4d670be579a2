//! A loader's place in an epoch as plain data: what `state_dict()` returns and
//! `resume=` takes. It names the snapshot by number and fingerprint, so a
//! state saved before later updates still resumes the population it was
//! drawing from, and a state that no longer matches is refused.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::catalog::{Dataset, Snapshot};
use crate::sample::{DrawPlan, Sampling, DRAW_SCHEME};
use crate::{Error, Result};

/// The `format` key of every loader state.
pub const STATE_FORMAT: &str = "datasetrt-loader-state";

/// The layout of the state this build writes (it reads this and versions 1
/// and 2). Version 2 adds `draws`, the draw scheme ([`DRAW_SCHEME`]); a
/// version-1 state drew by scheme 1. Version 3 adds `run`, the run whose
/// schedule the epoch follows (written only by such a state, so that a
/// build that would resume it without the schedule refuses it).
pub const STATE_VERSION: u64 = 3;

/// The keys a state must have (`batch_size` is informational).
const STATE_KEYS: [&str; 7] = [
    "epoch",
    "epoch_len",
    "fingerprint",
    "position",
    "sampling",
    "seed",
    "snapshot",
];

/// One value of a state as plain data: what a Python dict or JSON holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StateValue {
    /// A non-negative integer that fits 64 bits.
    Int(u64),
    Str(String),
    Map(BTreeMap<String, StateValue>),
    /// Anything else (a bool, a negative or wider int, a float, a list...),
    /// as the caller's language shows it, for the error message.
    Other(String),
}

impl std::fmt::Display for StateValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StateValue::Int(v) => write!(f, "{v}"),
            StateValue::Str(s) => write!(f, "{s:?}"),
            StateValue::Map(_) => write!(f, "a mapping"),
            StateValue::Other(shown) => write!(f, "{shown}"),
        }
    }
}

/// Where an epoch of draws stands: the global sequence (seed, epoch,
/// sampling, epoch_len over snapshot `snapshot`) and the draws consumed.
///
/// A state taken inside one reader (a DataLoader worker, as torchdata's
/// `StatefulDataLoader` takes them) also names that reader in `reader`: its
/// `position` is then global as if the consumer took this reader's batch
/// last (true of the worker it took a batch from last), and the reader
/// resumed alone continues with its own next batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoaderState {
    pub seed: u64,
    pub epoch: u64,
    pub sampling: Sampling,
    pub epoch_len: u64,
    pub batch_size: usize,
    pub snapshot: u64,
    pub fingerprint: String,
    /// Draws of the global sequence consumed so far.
    pub position: u64,
    /// The draw scheme of the sequence ([`DRAW_SCHEME`] for states this
    /// build takes).
    pub draws: u64,
    /// The reader that took this state, for a state taken inside one.
    pub reader: Option<ReaderPlace>,
    /// The run whose schedule the epoch follows ([`crate::catalog::schedule`]).
    pub run: Option<String>,
}

/// One reader of a loader layout and where it continues on its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReaderPlace {
    pub rank: u32,
    pub world_size: u32,
    pub worker: u32,
    pub num_workers: u32,
    /// The start block of the plan in which this reader continues alone.
    pub resume_block: u64,
}

impl LoaderState {
    /// This state as plain data (`format` and `version` first): what
    /// `state_dict()` returns.
    pub fn to_fields(&self) -> Vec<(&'static str, StateValue)> {
        let int = |v: u64| StateValue::Int(v);
        let mut fields = vec![
            ("format", StateValue::Str(STATE_FORMAT.into())),
            (
                "version",
                int(if self.run.is_some() { STATE_VERSION } else { 2 }),
            ),
            ("seed", int(self.seed)),
            ("epoch", int(self.epoch)),
            ("sampling", StateValue::Str(self.sampling.name().into())),
            ("epoch_len", int(self.epoch_len)),
            ("batch_size", int(self.batch_size as u64)),
            ("snapshot", int(self.snapshot)),
            ("fingerprint", StateValue::Str(self.fingerprint.clone())),
            ("position", int(self.position)),
            ("draws", int(self.draws)),
        ];
        if let Some(run) = &self.run {
            fields.push(("run", StateValue::Str(run.clone())));
        }
        if let Some(place) = &self.reader {
            let reader = [
                ("rank", u64::from(place.rank)),
                ("world_size", u64::from(place.world_size)),
                ("worker", u64::from(place.worker)),
                ("num_workers", u64::from(place.num_workers)),
                ("resume_block", place.resume_block),
            ];
            let map = reader
                .into_iter()
                .map(|(k, v)| (k.to_string(), int(v)))
                .collect();
            fields.push(("reader", StateValue::Map(map)));
        }
        fields
    }

    /// A state from plain data ([`LoaderState::to_fields`], after JSON too);
    /// anything else is [`Error::InvalidInput`] naming what is wrong.
    /// `shown` is how the caller shows the whole value, for a value that is
    /// not a state at all.
    pub fn from_fields(fields: &BTreeMap<String, StateValue>, shown: &str) -> Result<Self> {
        let version = state_version(fields, shown)?;
        let missing: Vec<&str> = STATE_KEYS
            .into_iter()
            .filter(|k| !fields.contains_key(*k))
            .collect();
        if !missing.is_empty() {
            return Err(Error::invalid(format!(
                "the loader state lacks {missing:?}"
            )));
        }
        let int = |key: &str, high: u64| -> Result<u64> {
            match fields.get(key) {
                Some(StateValue::Int(v)) if *v <= high => Ok(*v),
                other => Err(Error::invalid(format!(
                    "the state's {key} must be an int in [0, {high}], got {}",
                    other.map_or("nothing".into(), ToString::to_string)
                ))),
            }
        };
        let text = |key: &str| -> Result<&str> {
            match fields.get(key) {
                Some(StateValue::Str(s)) => Ok(s),
                _ => Err(Error::invalid(format!(
                    "the state's {key} must be a string"
                ))),
            }
        };
        let small = u64::from(u32::MAX);
        let batch_size = match fields.get("batch_size") {
            Some(_) => int("batch_size", small)? as usize,
            None => 0,
        };
        let reader = reader_place(fields)?;
        Ok(LoaderState {
            seed: int("seed", u64::MAX)?,
            epoch: int("epoch", u64::MAX)?,
            sampling: Sampling::parse(text("sampling")?)?,
            epoch_len: int("epoch_len", u64::MAX)?,
            batch_size,
            snapshot: int("snapshot", i64::MAX as u64)?,
            fingerprint: text("fingerprint")?.to_string(),
            position: int("position", u64::MAX)?,
            draws: match version {
                1 => 1,
                _ => int("draws", u64::MAX)?,
            },
            reader,
            run: state_run(fields, version)?,
        })
    }

    /// The state of `plan` over `snapshot` once this reader has delivered
    /// `batches` batches (see [`DrawPlan::position_after`]).
    pub fn after(plan: &DrawPlan, snapshot: &Snapshot, batches: u64) -> Self {
        LoaderState {
            seed: plan.seed,
            epoch: plan.epoch,
            sampling: plan.sampling,
            epoch_len: plan.epoch_len,
            batch_size: plan.batch_size,
            snapshot: snapshot.number(),
            fingerprint: snapshot.fingerprint().to_string(),
            position: plan.position_after(batches),
            draws: DRAW_SCHEME,
            reader: None,
            run: plan.run.clone(),
        }
    }

    /// The state inside one reader of `plan` once it delivered `batches`
    /// batches of its own (see [`LoaderState::reader`]).
    pub fn after_reader(plan: &DrawPlan, snapshot: &Snapshot, batches: u64) -> Self {
        LoaderState {
            position: plan.position_through(batches),
            reader: Some(ReaderPlace {
                rank: plan.rank,
                world_size: plan.world_size,
                worker: plan.worker,
                num_workers: plan.num_workers,
                resume_block: plan.reader_resume_block(batches),
            }),
            ..Self::after(plan, snapshot, 0)
        }
    }

    /// Check this state against `dataset` and return the snapshot it was
    /// drawing from and the plan that continues it: `reader`'s rank, workers,
    /// `batch_size` and `drop_last`, this state's sequence and position.
    pub fn resume(
        &self,
        dataset: &Dataset,
        reader: &DrawPlan,
    ) -> Result<(Arc<Snapshot>, DrawPlan)> {
        let snapshot = self.snapshot_to_resume(dataset)?;
        reader.validate()?;
        let mut plan = DrawPlan {
            sampling: self.sampling,
            seed: self.seed,
            epoch: self.epoch,
            epoch_len: self.epoch_len,
            start_block: 0,
            run: self.run.clone(),
            ..reader.clone()
        };
        if let Some(place) = &self.reader {
            self.check_layout(place, reader)?;
            plan.start_block = place.resume_block;
            plan.validate()?;
            return Ok((snapshot, plan));
        }
        plan.start_block = plan.resume_block(self.position).map_err(|_| {
            Error::invalid(format!(
                "position {} is not a multiple of batch_size {}; resume with batch_size={}",
                self.position, plan.batch_size, self.batch_size
            ))
        })?;
        plan.validate()?;
        Ok((snapshot, plan))
    }

    /// The snapshot this state was drawing from, if `dataset` still has it
    /// as it was and this build draws the same sequence over it.
    fn snapshot_to_resume(&self, dataset: &Dataset) -> Result<Arc<Snapshot>> {
        if self.epoch_len == 0 {
            return Err(Error::invalid("the state's epoch_len must be positive"));
        }
        let snapshot = dataset.snapshot_at(self.snapshot).map_err(|e| {
            Error::invalid(format!(
                "the state was saved at snapshot {}, which this dataset does not have ({e})",
                self.snapshot
            ))
        })?;
        if snapshot.fingerprint() != self.fingerprint {
            return Err(Error::invalid(format!(
                "the state was saved at snapshot {} with fingerprint {}, but that snapshot now \
                 has fingerprint {}",
                self.snapshot,
                self.fingerprint,
                snapshot.fingerprint()
            )));
        }
        if !self.sampling.draws_as_scheme(
            self.draws,
            snapshot.num_partitions(),
            snapshot.mixture().is_some(),
        ) {
            return Err(Error::invalid(format!(
                "the state was taken by a build that drew {} samples by draw scheme {}; this \
                 build draws scheme {DRAW_SCHEME} (see DRAW_SCHEME: 2 weighted a partition by \
                 its mass, then a row of it; 3 walks balanced blocks in a seeded order; 4 \
                 rounds balanced counts over a mixture group's draws in the epoch), a \
                 different sequence over snapshot {}'s {} partitions, so resuming would repeat \
                 and skip samples. Start the epoch anew (or resume with the build that took the \
                 state)",
                self.sampling.name(),
                self.draws,
                self.snapshot,
                snapshot.num_partitions()
            )));
        }
        Ok(snapshot)
    }

    /// A state taken inside one reader (at `place`) resumes only that
    /// reader, with its batch size: `reader` must be it.
    fn check_layout(&self, place: &ReaderPlace, reader: &DrawPlan) -> Result<()> {
        let layout =
            |r: u32, rs: u32, w: u32, ws: u32| format!("rank {r} of {rs}, worker {w} of {ws}");
        let saved = layout(
            place.rank,
            place.world_size,
            place.worker,
            place.num_workers,
        );
        let here = layout(
            reader.rank,
            reader.world_size,
            reader.worker,
            reader.num_workers,
        );
        if saved != here || self.batch_size != reader.batch_size {
            return Err(Error::invalid(format!(
                "this state was taken inside one reader ({saved}, batch_size {}) and \
                 resumes only that reader, not {here} with batch_size {}; for another \
                 layout resume from the state of the whole loader (a StatefulDataLoader's \
                 state_dict(), or state_dict(batches_seen))",
                self.batch_size, reader.batch_size
            )));
        }
        Ok(())
    }
}

/// The layout version of a state's `fields`, which must be a loader state
/// (`shown`: how the caller shows the value).
fn state_version(fields: &BTreeMap<String, StateValue>, shown: &str) -> Result<u64> {
    if fields.get("format") != Some(&StateValue::Str(STATE_FORMAT.into())) {
        return Err(Error::invalid(format!(
            "resume takes a Loader.state_dict(), not {shown}"
        )));
    }
    match fields.get("version") {
        None => Ok(STATE_VERSION),
        Some(StateValue::Int(v)) if (1..=STATE_VERSION).contains(v) => Ok(*v),
        Some(version) => Err(Error::invalid(format!(
            "the loader state has format version {version}; this build reads versions \
             1 to {STATE_VERSION}"
        ))),
    }
}

/// The reader a state was taken inside, if it names one.
fn reader_place(fields: &BTreeMap<String, StateValue>) -> Result<Option<ReaderPlace>> {
    let small = u64::from(u32::MAX);
    match fields.get("reader") {
        None => Ok(None),
        Some(StateValue::Map(place)) => {
            let field = |key: &str, high: u64| -> Result<u64> {
                match place.get(key) {
                    Some(StateValue::Int(v)) if *v <= high => Ok(*v),
                    _ => Err(Error::invalid(format!(
                        "the state's reader needs {key:?}, an int in [0, {high}]"
                    ))),
                }
            };
            Ok(Some(ReaderPlace {
                rank: field("rank", small)? as u32,
                world_size: field("world_size", small)? as u32,
                worker: field("worker", small)? as u32,
                num_workers: field("num_workers", small)? as u32,
                resume_block: field("resume_block", u64::MAX)?,
            }))
        }
        Some(_) => Err(Error::invalid("the state's reader must be a dict")),
    }
}

/// The run whose schedule a state (of layout `version`) follows, if any.
fn state_run(fields: &BTreeMap<String, StateValue>, version: u64) -> Result<Option<String>> {
    match fields.get("run") {
        None => Ok(None),
        Some(StateValue::Str(run)) if version >= 3 => {
            crate::catalog::schedule::check_run(run)?;
            Ok(Some(run.clone()))
        }
        Some(_) => Err(Error::invalid(
            "the state's run must be a string (in a state of version 3)",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(reader: bool) -> LoaderState {
        LoaderState {
            seed: 7,
            epoch: 2,
            sampling: Sampling::Permutation,
            epoch_len: 1000,
            batch_size: 64,
            snapshot: 3,
            fingerprint: "abc".into(),
            position: 128,
            draws: DRAW_SCHEME,
            run: None,
            reader: reader.then_some(ReaderPlace {
                rank: 1,
                world_size: 2,
                worker: 0,
                num_workers: 3,
                resume_block: 5,
            }),
        }
    }

    fn fields(s: &LoaderState) -> BTreeMap<String, StateValue> {
        s.to_fields()
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect()
    }

    #[test]
    fn a_state_round_trips_through_its_fields() {
        for reader in [false, true] {
            let s = state(reader);
            let f = s.to_fields();
            assert_eq!(f[0], ("format", StateValue::Str(STATE_FORMAT.into())));
            assert_eq!(f[1], ("version", StateValue::Int(2)));
            assert_eq!(LoaderState::from_fields(&fields(&s), "?").unwrap(), s);
        }
        // a state that follows a run's schedule is version 3: older builds refuse it
        let s = LoaderState {
            run: Some("exp-7".into()),
            ..state(false)
        };
        let f = s.to_fields();
        assert_eq!(f[1], ("version", StateValue::Int(3)));
        assert_eq!(LoaderState::from_fields(&fields(&s), "?").unwrap(), s);
        let mut bad = fields(&s);
        bad.insert("run".into(), StateValue::Str("../x".into()));
        assert!(LoaderState::from_fields(&bad, "?").is_err());
    }

    #[test]
    fn a_state_of_version_1_drew_by_the_flat_scheme() {
        let mut f = fields(&state(false));
        f.insert("version".into(), StateValue::Int(1));
        f.remove("draws");
        let old = LoaderState::from_fields(&f, "?").unwrap();
        assert_eq!(old.draws, 1);
        // its draws are this build's except weighted ones over partitions
        assert!(Sampling::Permutation.draws_as_scheme(old.draws, 40, false));
        assert!(Sampling::Replacement.draws_as_scheme(old.draws, 1, false));
        assert!(!Sampling::Replacement.draws_as_scheme(old.draws, 2, false));
        assert!(!Sampling::Balanced.draws_as_scheme(old.draws, 2, false));
        // balanced lookups walk their blocks in a seeded order since scheme 3
        assert!(!Sampling::Balanced.draws_as_scheme(old.draws, 1, false));
        assert!(!Sampling::Balanced.draws_as_scheme(2, 1, false));
        assert!(Sampling::Replacement.draws_as_scheme(2, 40, false));
        assert!(Sampling::WeightedWithoutReplacement.draws_as_scheme(2, 40, false));
        assert!(!Sampling::Permutation.draws_as_scheme(5, 1, false));
        // scheme 4 changed balanced draws inside a mixture only
        assert!(Sampling::Balanced.draws_as_scheme(3, 2, false));
        assert!(!Sampling::Balanced.draws_as_scheme(3, 2, true));
        assert!(Sampling::Replacement.draws_as_scheme(3, 2, true));
    }

    #[test]
    fn a_tampered_state_is_refused_with_what_is_wrong() {
        let good = fields(&state(true));
        let refused = |change: &dyn Fn(&mut BTreeMap<String, StateValue>), says: &str| {
            let mut f = good.clone();
            change(&mut f);
            let err = LoaderState::from_fields(&f, "{...}")
                .unwrap_err()
                .to_string();
            assert!(err.contains(says), "{err:?} lacks {says:?}");
        };
        let set = |k: &'static str, v: StateValue| {
            move |f: &mut BTreeMap<String, StateValue>| {
                f.insert(k.into(), v.clone());
            }
        };
        refused(&set("format", StateValue::Str("x".into())), "not {...}");
        refused(&set("version", StateValue::Int(4)), "format version 4");
        refused(&set("run", StateValue::Int(1)), "run must be a string");
        refused(&|f| drop(f.remove("draws")), "draws must be an int");
        refused(
            &|f| drop(f.remove("fingerprint")),
            "lacks [\"fingerprint\"]",
        );
        refused(&set("position", StateValue::Other("-64".into())), "got -64");
        refused(
            &set("snapshot", StateValue::Int(u64::MAX)),
            "snapshot must be an int",
        );
        refused(&set("seed", StateValue::Str("7".into())), "got \"7\"");
        refused(
            &set("sampling", StateValue::Int(1)),
            "sampling must be a string",
        );
        refused(&set("sampling", StateValue::Str("nope".into())), "nope");
        refused(&set("reader", StateValue::Int(1)), "reader must be a dict");
        refused(
            &|f| {
                if let Some(StateValue::Map(m)) = f.get_mut("reader") {
                    m.insert("rank".into(), StateValue::Other("True".into()));
                }
            },
            "reader needs \"rank\"",
        );
        // batch_size is informational: a state without it still reads
        let mut f = good.clone();
        f.remove("batch_size");
        assert_eq!(LoaderState::from_fields(&f, "?").unwrap().batch_size, 0);
    }
}
