//! Loader states from Rust: the same states and checks Python gets.

use datasetrt::load::LoaderState;
use datasetrt::sample::{DrawPlan, Sampling};
use datasetrt::store::WriterOptions;
use datasetrt::{Dataset, Error, OpenOptions};

use crate::store::write_cache;

fn reader(batch_size: usize, world_size: u32, rank: u32) -> DrawPlan {
    DrawPlan {
        sampling: Sampling::Permutation,
        seed: 7,
        epoch: 2,
        epoch_len: 50,
        batch_size,
        start_block: 0,
        drop_last: false,
        rank,
        world_size,
        worker: 0,
        num_workers: 1,
        run: None,
    }
}

#[test]
fn a_state_resumes_the_rest_of_its_sequence_on_any_reader_count() {
    let dir = tempfile::tempdir().unwrap();
    write_cache(dir.path(), "l", 50, WriterOptions::default());
    let ds = Dataset::open(&[dir.path().to_path_buf()], OpenOptions::default()).unwrap();
    let snapshot = ds.snapshot();
    // two ranks in lockstep delivered 3 batches each: 6 blocks of 5 draws
    let state = LoaderState::after(&reader(5, 2, 1), &snapshot, 3);
    assert_eq!(state.position, 30);
    assert_eq!(state.snapshot, snapshot.number());
    // one reader continues at block 6, with the sequence of the state
    let (at, plan) = state.resume(&ds, &reader(5, 1, 0)).unwrap();
    assert_eq!(at.number(), snapshot.number());
    assert_eq!((plan.start_block, plan.seed, plan.epoch), (6, 7, 2));
    assert_eq!(
        plan.my_blocks().collect::<Vec<_>>(),
        (6..10).collect::<Vec<_>>()
    );
    // after the last batch the state is at the end: nothing is left
    let done = LoaderState::after(&reader(5, 1, 0), &snapshot, 10);
    let (_, plan) = done.resume(&ds, &reader(5, 1, 0)).unwrap();
    assert_eq!(plan.batches(), 0);
}

#[test]
fn a_state_that_no_longer_matches_is_refused_naming_why() {
    let dir = tempfile::tempdir().unwrap();
    write_cache(dir.path(), "l", 50, WriterOptions::default());
    let ds = Dataset::open(&[dir.path().to_path_buf()], OpenOptions::default()).unwrap();
    let state = LoaderState::after(&reader(5, 1, 0), &ds.snapshot(), 3);
    let refused = |s: LoaderState, batch_size: usize, needle: &str| {
        let err = s.resume(&ds, &reader(batch_size, 1, 0)).unwrap_err();
        assert!(matches!(err, Error::InvalidInput { .. }), "{err}");
        assert!(err.to_string().contains(needle), "{err}");
    };
    refused(
        LoaderState {
            fingerprint: "0".repeat(32),
            ..state.clone()
        },
        5,
        "fingerprint",
    );
    refused(
        LoaderState {
            snapshot: 99,
            ..state.clone()
        },
        5,
        "snapshot 99",
    );
    refused(state.clone(), 4, "multiple of batch_size 4");
    refused(
        LoaderState {
            epoch_len: 0,
            ..state
        },
        5,
        "epoch_len",
    );
}

#[test]
fn a_state_taken_inside_one_worker_resumes_that_worker_alone_and_is_global_for_the_last_one() {
    let dir = tempfile::tempdir().unwrap();
    write_cache(dir.path(), "l", 50, WriterOptions::default());
    let ds = Dataset::open(&[dir.path().to_path_buf()], OpenOptions::default()).unwrap();
    let snapshot = ds.snapshot();
    // 10 blocks of 5, three workers taken in turn: 0,3,6,9 / 1,4,7 / 2,5,8.
    let worker = |w: u32| DrawPlan {
        worker: w,
        num_workers: 3,
        ..reader(5, 1, 0)
    };
    // worker 1 delivered blocks 1 and 4; the consumer took it last: 5 blocks consumed
    let state = LoaderState::after_reader(&worker(1), &snapshot, 2);
    assert_eq!(state.position, 25);
    let (_, alone) = state.resume(&ds, &worker(1)).unwrap();
    assert_eq!(alone.my_blocks().collect::<Vec<_>>(), vec![7]);
    // its position is a global state: one reader continues at block 5
    let global = LoaderState {
        reader: None,
        ..state.clone()
    };
    let (_, one) = global.resume(&ds, &reader(5, 1, 0)).unwrap();
    assert_eq!(
        one.my_blocks().collect::<Vec<_>>(),
        (5..10).collect::<Vec<_>>()
    );
    // another worker, another layout or batch size is refused, naming the reader
    for other in [
        worker(2),
        reader(5, 1, 0),
        DrawPlan {
            batch_size: 10,
            ..worker(1)
        },
    ] {
        let err = state.resume(&ds, &other).unwrap_err();
        assert!(
            err.to_string().contains("rank 0 of 1, worker 1 of 3"),
            "{err}"
        );
    }
}

#[test]
fn a_state_of_the_flat_weighted_draws_is_refused_over_partitions_and_read_over_one() {
    let dir = tempfile::tempdir().unwrap();
    write_cache(dir.path(), "l", 50, WriterOptions::default());
    let weighted = DrawPlan {
        sampling: Sampling::Replacement,
        ..reader(5, 1, 0)
    };
    for (partition_rows, resumes) in [(None, true), (Some(7), false)] {
        let options = OpenOptions {
            snapshot_dir: Some(dir.path().join(format!("snap{partition_rows:?}"))),
            partition_rows,
            ..Default::default()
        };
        let ds = Dataset::open(&[dir.path().to_path_buf()], options).unwrap();
        // a state the build before partitioned draws took (version 1)
        let old = LoaderState {
            draws: 1,
            ..LoaderState::after(&weighted, &ds.snapshot(), 2)
        };
        match old.resume(&ds, &weighted) {
            Ok((_, plan)) => assert!(resumes && plan.start_block == 2),
            Err(err) => {
                assert!(!resumes, "{err}");
                assert!(matches!(err, Error::InvalidInput { .. }), "{err}");
                assert!(err.to_string().contains("draw scheme 1"), "{err}");
            }
        }
        // permutations were drawn the same way then
        let permutation = LoaderState {
            draws: 1,
            ..LoaderState::after(&reader(5, 1, 0), &ds.snapshot(), 2)
        };
        assert!(permutation.resume(&ds, &reader(5, 1, 0)).is_ok());
    }
}
