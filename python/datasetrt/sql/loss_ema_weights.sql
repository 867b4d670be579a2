-- Weight by a moving average of each sample's logged loss over epochs:
-- weight = the exponential moving average, newest epoch weighted :alpha,
-- of the sample's mean loss per epoch (in the epochs it was scored in):
--     ema_first = loss_first, then ema_e = :alpha * loss_e + (1 - :alpha) * ema_previous
-- written in closed form, the epoch `age` epochs back (0 = newest) weighted
-- :alpha * (1 - :alpha)^age, the oldest (1 - :alpha)^age.
-- Needs a table `scores` (run, epoch, position, cache_id, sample_id, value):
--     ds.score_log("loss", run="exp1").register("scores")
-- Rows the log has no score for get the mean moving average of the scored
-- samples. Losses must be non-negative (a negative weight is refused).
-- Parameters: :alpha (number in (0, 1]; 1 = the latest epoch only).
WITH per_epoch AS (
    SELECT cache_id, sample_id, epoch, avg(value) AS loss
    FROM scores
    GROUP BY cache_id, sample_id, epoch
),
aged AS (
    SELECT cache_id, sample_id, loss,
           row_number() OVER (PARTITION BY cache_id, sample_id ORDER BY epoch DESC) - 1 AS age,
           count(*) OVER (PARTITION BY cache_id, sample_id) AS seen
    FROM per_epoch
),
ema AS (
    SELECT cache_id, sample_id,
           sum(loss * CASE WHEN age = seen - 1 THEN power(1.0 - :alpha, age)
                           ELSE :alpha * power(1.0 - :alpha, age) END) AS ema
    FROM aged
    GROUP BY cache_id, sample_id
),
fallback AS (
    SELECT avg(ema) AS ema FROM ema
)
SELECT m.* EXCLUDE (weight),
       coalesce(e.ema, f.ema) AS weight
FROM metadata m
LEFT JOIN ema e USING (cache_id, sample_id)
CROSS JOIN fallback f
