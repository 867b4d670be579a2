-- Weight by the moving average of each sample's logged loss, shaped so the
-- weights cannot collapse onto a few rows: loss_ema_weights with a floor, a
-- cap and a mix toward uniform. The score is ema_loss, the moving average over
-- epochs of the sample's mean logged loss (table `score_state`).
--
--   1. a raw weight r >= 0 from the score, by :shape
--        'linear'    r = greatest(score, 0) (loss_ema_weights, before shaping)
--        'rank'      r = percent_rank of the score (0 the lowest, 1 the highest)
--        'threshold' r = 1 where the score is above the mean score of the
--                    scored rows, else 0
--   2. q = min(lambda * r, K), lambda such that q has mean 1 over the scored
--      rows (water-filling: the heaviest rows are capped, the rest scaled up),
--      K = (:cap - :floor) / (1 - :floor). When fewer than 1 / K of the rows
--      have r > 0, those get K and the rows with r = 0 share the rest equally;
--      when no row has r > 0, q = 1.
--   3. weight = :anneal + (1 - :anneal) * (:floor + (1 - :floor) * q)
-- So the weights have mean 1 (the mean weight) and every row's weight is at
-- least :floor and at most :cap times the mean weight; :anneal = 1 is uniform.
-- Rows without a score (not in `score_state`, or a null ema_loss) get the
-- mean weight, 1. A :floor outside [0, 1] or :anneal outside [0, 1] is
-- clamped to it, a :cap below 1 is raised to 1 (uniform). An unknown :shape
-- is an error.
--
-- Helper columns are named _drt_* (a metadata column of such a name clashes).
-- Needs a table `score_state` with one row per sample: cache_id, sample_id,
-- ema_loss (and count, first_epoch, last_epoch, last_loss, unused here).
-- Losses are non-negative. (loss_ema_weights.sql reads the raw log, table
-- `scores`, unshaped.)
-- Parameters: :shape ('linear', 'rank' or 'threshold'), :floor (share of the
-- mean weight, in [0, 1]), :cap (multiple of the mean weight, >= 1),
-- :anneal (in [0, 1]; 1 = uniform).
WITH bounds AS (
    SELECT f, c, a, shape, CASE WHEN f < 1.0 THEN (c - f) / (1.0 - f) ELSE 1.0 END AS k_cap
    FROM (
        SELECT greatest(least(CAST(:floor AS DOUBLE), 1.0), 0.0) AS f,
               greatest(CAST(:cap AS DOUBLE), 1.0) AS c,
               greatest(least(CAST(:anneal AS DOUBLE), 1.0), 0.0) AS a,
               CAST(:shape AS VARCHAR) AS shape
    )
),
state AS (  -- one row per sample, whatever was registered
    SELECT cache_id, sample_id, avg(ema_loss) AS ema_loss
    FROM score_state
    GROUP BY cache_id, sample_id
),
scored AS (  -- every row of the population; _drt_score null: no score
    SELECT m.*, s.ema_loss AS _drt_score,
           b.f AS _drt_f, b.a AS _drt_a, b.k_cap AS _drt_k_cap, b.shape AS _drt_shape
    FROM metadata m
    LEFT JOIN state s USING (cache_id, sample_id)
    CROSS JOIN bounds b
),
raw AS (  -- the raw weight r of each scored row
    SELECT *,
           CASE WHEN _drt_score IS NULL THEN NULL
                WHEN _drt_shape = 'linear' THEN greatest(_drt_score, 0.0)
                WHEN _drt_shape = 'rank' THEN _drt_rank
                WHEN _drt_shape = 'threshold' THEN
                    CASE WHEN _drt_score > _drt_mean THEN 1.0 ELSE 0.0 END
                ELSE CAST(concat('unknown shape ', _drt_shape) AS DOUBLE)
           END AS _drt_r
    FROM (
        SELECT *,
               percent_rank() OVER (PARTITION BY _drt_score IS NULL ORDER BY _drt_score)
                   AS _drt_rank,
               avg(_drt_score) OVER () AS _drt_mean
        FROM scored
    )
),
ranked AS (  -- j: rows before this one by r (heaviest first); rest: r of it and those after
    SELECT *,
           CAST(row_number() OVER (PARTITION BY _drt_r IS NULL
                                   ORDER BY _drt_r DESC, cache_id, sample_id) AS BIGINT) - 1
               AS _drt_j,
           sum(_drt_r) OVER (PARTITION BY _drt_r IS NULL
                             ORDER BY _drt_r DESC, cache_id, sample_id
                             ROWS BETWEEN CURRENT ROW AND UNBOUNDED FOLLOWING) AS _drt_rest,
           count(_drt_r) OVER () AS _drt_n,
           count(CASE WHEN _drt_r > 0.0 THEN 1 END) OVER () AS _drt_pos
    FROM raw
),
cut AS (  -- k, the capped rows, is the first j whose row is within the cap under
          -- lambda_j = (n - j K) / rest_j; lambda falls from there on, so lambda_k is
          -- the largest of those. Both null when the cap cannot hold the mean.
    SELECT *,
           min(CASE WHEN _drt_fits THEN _drt_j END) OVER () AS _drt_k,
           max(CASE WHEN _drt_fits THEN (_drt_n - _drt_j * _drt_k_cap) / _drt_rest END) OVER ()
               AS _drt_lambda
    FROM (
        SELECT *,
               _drt_r > 0.0 AND _drt_r * (_drt_n - _drt_j * _drt_k_cap)
                   <= _drt_k_cap * _drt_rest * (1.0 + 1e-12) AS _drt_fits
        FROM ranked
    )
)
SELECT * EXCLUDE (weight, _drt_fits, _drt_score, _drt_rank, _drt_mean, _drt_f, _drt_a,
                  _drt_k_cap, _drt_shape, _drt_r, _drt_j, _drt_rest, _drt_n, _drt_pos,
                  _drt_k, _drt_lambda),
       CASE WHEN _drt_r IS NULL THEN 1.0
            ELSE _drt_a + (1.0 - _drt_a) * (_drt_f + (1.0 - _drt_f) * (
                CASE WHEN _drt_pos = 0 OR _drt_f >= 1.0 THEN 1.0
                     WHEN _drt_k IS NULL THEN
                         CASE WHEN _drt_r > 0.0 THEN _drt_k_cap
                              ELSE (_drt_n - _drt_pos * _drt_k_cap) / (_drt_n - _drt_pos) END
                     WHEN _drt_j < _drt_k THEN _drt_k_cap
                     ELSE _drt_lambda * _drt_r
                END))
       END AS weight
FROM cut
