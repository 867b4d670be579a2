-- Reducible-loss weights: draw the samples the model can still learn, not the
-- ones it cannot (label noise). A sample's score is its training loss minus a
-- reference loss (RHO-LOSS, Mindermann et al. 2022):
--     score = ema_loss - il_loss
-- ema_loss: the moving average over epochs of the sample's logged loss (table
-- `score_state`); il_loss: the loss of a model trained on clean held-out data
-- on this sample (a metadata column). A mislabelled sample has a high
-- reference loss, so its score is low even while its training loss is high.
--
-- The score is shaped so the weights cannot collapse onto a few rows, by the
-- window function drt_shape_weights (the rule ScoreLog.reweight computes
-- natively, with the same result):
--   1. a raw weight r >= 0 from the score, by :shape
--        'linear'    r = greatest(score, 0)
--        'rank'      r = percent_rank of the score (0 the lowest, 1 the highest)
--        'threshold' r = 1 where score > 0 (training loss above the reference), else 0
--   2. q = min(lambda * r, K), lambda such that q has mean 1 over the scored
--      rows (water-filling: the heaviest rows are capped, the rest scaled up),
--      K = (:cap - :floor) / (1 - :floor). When fewer than 1 / K of the rows
--      have r > 0, those get K and the rows with r = 0 share the rest equally;
--      when no row has r > 0, q = 1.
--   3. weight = :anneal + (1 - :anneal) * (:floor + (1 - :floor) * q)
-- So the weights have mean 1 (the mean weight) and every row's weight is at
-- least :floor and at most :cap times the mean weight; :anneal = 1 is uniform.
-- Rows without a score (not in `score_state`, or a null ema_loss or il_loss)
-- get the mean weight, 1; a NaN or infinite il_loss is refused. A :floor or
-- :anneal outside [0, 1], a :cap below 1 or an unknown :shape is refused
-- (InvalidInputError naming it).
--
-- Needs a table `score_state` with one row per sample: cache_id, sample_id,
-- ema_loss (log.register_state), and a metadata column il_loss
-- (ds.update_metadata joined on cache_id, sample_id).
-- Parameters: :shape ('linear', 'rank' or 'threshold'), :floor (share of the
-- mean weight, in [0, 1]), :cap (multiple of the mean weight, >= 1),
-- :anneal (in [0, 1]; 1 = uniform).
WITH state AS (  -- one row per sample, whatever was registered
    SELECT cache_id, sample_id, avg(ema_loss) AS ema_loss
    FROM score_state
    GROUP BY cache_id, sample_id
)
SELECT m.* EXCLUDE (weight),
       drt_shape_weights(s.ema_loss - m.il_loss, :shape, :floor, :cap, :anneal) OVER ()
           AS weight
FROM metadata m
LEFT JOIN state s USING (cache_id, sample_id)
