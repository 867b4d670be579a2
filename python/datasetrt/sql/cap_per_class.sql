-- Capped samples per class: at most :cap rows of each label, chosen by a seeded
-- stable hash (the same rows on every run).
-- Parameters: :cap (integer), :seed (integer).
SELECT * EXCLUDE (rank_in_class)
FROM (
    SELECT *,
           row_number() OVER (
               PARTITION BY label
               ORDER BY drt_uniform(:seed, cache_id, sample_id), cache_id, sample_id
           ) AS rank_in_class
    FROM metadata
)
WHERE rank_in_class <= :cap
