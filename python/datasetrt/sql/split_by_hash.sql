-- Train/validation split by stable hash: a row is in 'val' when its seeded hash
-- falls below :val_fraction, else in 'train'. The two splits never overlap and
-- together cover the population, on every run.
-- Parameters: :seed (integer), :val_fraction (number), :split ('train' or 'val').
SELECT *
FROM metadata
WHERE (drt_uniform(:seed, cache_id, sample_id) < :val_fraction) = (:split = 'val')
