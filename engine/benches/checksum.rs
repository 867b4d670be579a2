//! Is verifying a CRC-32C on every read affordable? Prints checksum throughput
//! next to a plain read (xor of every 8 bytes) and a memory copy of the same
//! buffer: the floors of any read. In cache (4 KiB, 16 KiB) and from memory
//! (64 MiB).
//!
//! cargo bench --workspace --bench checksum

use std::hint::black_box;
use std::time::Instant;

use datasetrt::store::checksum::crc32c;

fn gib_per_s(bytes: usize, mut f: impl FnMut()) -> f64 {
    let mut best = f64::MAX;
    for _ in 0..7 {
        let t0 = Instant::now();
        f();
        best = best.min(t0.elapsed().as_secs_f64());
    }
    bytes as f64 / best / (1u64 << 30) as f64
}

fn main() {
    // `cargo bench` passes --bench; `cargo test --all-targets` (make test,
    // which builds the bench to lint it) runs it without: nothing to time
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    for size in [16usize, 4 << 10, 16 << 10, 64 << 20] {
        let buf: Vec<u8> = (0..size).map(|i| (i * 31 % 251) as u8).collect();
        let reps = (256 << 20) / size;
        let mut dst = vec![0u8; size];
        let copy = gib_per_s(size * reps, || {
            for _ in 0..reps {
                dst.copy_from_slice(black_box(&buf));
                black_box(&dst);
            }
        });
        let read = gib_per_s(size * reps, || {
            for _ in 0..reps {
                let words = black_box(&buf).chunks_exact(8);
                black_box(words.fold(0u64, |a, w| a ^ u64::from_le_bytes(w.try_into().unwrap())));
            }
        });
        let crc = gib_per_s(size * reps, || {
            for _ in 0..reps {
                black_box(crc32c(black_box(&buf)));
            }
        });
        println!(
            "{size:>9} B: crc32c {crc:6.2} GiB/s, read {read:6.2} GiB/s, memcpy {copy:6.2} GiB/s, \
             crc/read {:.2}",
            crc / read
        );
    }
}
