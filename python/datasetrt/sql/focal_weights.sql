-- Focal-style weights from the score log: weight = (mean logged loss) ^ :gamma,
-- the mean over every row of the sample in table `scores` (all epochs). 0 =
-- uniform, 1 = proportional to the loss, larger = hard samples dominate.
-- Needs a table `scores` (run, epoch, position, cache_id, sample_id, value):
--     ds.score_log("loss", run="exp1").register("scores")
-- Rows the log has no score for get the weight of the mean loss of the
-- scored samples. Losses must be non-negative.
-- Parameters: :gamma (number >= 0).
WITH mean_loss AS (
    SELECT cache_id, sample_id, avg(value) AS loss
    FROM scores
    GROUP BY cache_id, sample_id
),
fallback AS (
    SELECT avg(loss) AS loss FROM mean_loss
)
SELECT m.* EXCLUDE (weight),
       power(coalesce(l.loss, f.loss), :gamma) AS weight
FROM metadata m
LEFT JOIN mean_loss l USING (cache_id, sample_id)
CROSS JOIN fallback f
