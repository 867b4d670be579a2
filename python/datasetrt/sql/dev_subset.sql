-- Seeded dev subset: the same fraction of rows on every run and in every process
-- (drt_uniform is a stable hash of seed and identity in [0, 1)).
-- Parameters: :seed (integer), :fraction (number in [0, 1]).
SELECT *
FROM metadata
WHERE drt_uniform(:seed, cache_id, sample_id) < :fraction
