-- Hard-example weighting: weight each row by its model loss, raised to a power
-- (1 = proportional to the loss, larger = harder examples dominate).
-- Needs a registered table `losses` with columns cache_id, sample_id, loss:
--     ds.register("losses", losses_frame)
-- Rows without a loss are dropped. Parameters: :power (number).
SELECT m.* EXCLUDE (weight),
       power(l.loss, :power) AS weight
FROM metadata m
JOIN losses l USING (cache_id, sample_id)
WHERE l.loss > 0
