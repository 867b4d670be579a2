-- Weight by the moving average of each sample's logged loss, shaped so the
-- weights cannot collapse onto a few rows: loss_ema_weights with a floor, a
-- cap and a mix toward uniform. The score is ema_loss, the moving average over
-- epochs of the sample's mean logged loss (table `score_state`). High loss is
-- also where label noise sits: with a reference loss per row,
-- reducible_loss_weights draws what can still be learned instead.
--
-- Shaped by the window function drt_shape_weights (the rule of
-- reducible_loss_weights.sql and ScoreLog.reweight):
--   1. a raw weight r >= 0 from the score, by :shape
--        'linear'    r = greatest(score, 0) (loss_ema_weights, before shaping)
--        'rank'      r = percent_rank of the score (0 the lowest, 1 the highest)
--        'threshold' r = 1 where the score is above the mean score of the
--                    scored rows, else 0
--   2. q = min(lambda * r, K), lambda such that q has mean 1 over the scored
--      rows, K = (:cap - :floor) / (1 - :floor) (see reducible_loss_weights);
--   3. weight = :anneal + (1 - :anneal) * (:floor + (1 - :floor) * q)
-- So the weights have mean 1 and every row's weight is at least :floor and at
-- most :cap times the mean weight; :anneal = 1 is uniform. Rows without a
-- score (not in `score_state`, or a null ema_loss) get the mean weight, 1.
-- A :floor or :anneal outside [0, 1], a :cap below 1 or an unknown :shape is
-- refused (InvalidInputError naming it).
--
-- Helper columns are named _drt_* (a metadata column of such a name clashes).
-- Needs a table `score_state` with one row per sample: cache_id, sample_id,
-- ema_loss (log.register_state). (loss_ema_weights.sql reads the raw log,
-- table `scores`, unshaped.)
-- Parameters: :shape ('linear', 'rank' or 'threshold'), :floor (share of the
-- mean weight, in [0, 1]), :cap (multiple of the mean weight, >= 1),
-- :anneal (in [0, 1]; 1 = uniform).
WITH state AS (  -- one row per sample, whatever was registered
    SELECT cache_id, sample_id, avg(ema_loss) AS ema_loss
    FROM score_state
    GROUP BY cache_id, sample_id
),
scored AS (
    SELECT m.*, s.ema_loss AS _drt_loss, avg(s.ema_loss) OVER () AS _drt_mean
    FROM metadata m
    LEFT JOIN state s USING (cache_id, sample_id)
)
SELECT * EXCLUDE (weight, _drt_loss, _drt_mean),
       drt_shape_weights(
           CASE WHEN :shape = 'threshold' THEN _drt_loss - _drt_mean ELSE _drt_loss END,
           :shape, :floor, :cap, :anneal
       ) OVER () AS weight
FROM scored
