-- Per-group mean loss over the recent rows of a score log: the signal of
-- online data mixing (datasetrt.mixing.MixtureController). One row per value
-- of the grouping column among the scored samples, with the mean logged value
-- of its rows and how many rows that mean is of.
-- A query, not a population edit: datasetrt.mixing.group_losses renders it
-- and runs it with ds.sql (apply_sql would try to make it the population).
-- Needs a table `scores` (run, epoch, position, cache_id, sample_id, value):
--     ds.score_log("loss", run="exp1").register("scores", run="exp1")
-- The rows read: those of run :run at or after draw :since_position of epoch
-- :since_epoch, in (epoch, position) order, and of those the newest :window.
-- A row naming no sample of the population, or a sample whose group is null,
-- counts for no group.
-- Columns: value (the group as text, CAST AS VARCHAR: how set_mixture matches
-- groups), loss (mean), n (rows), and last_epoch, last_position: the newest
-- row read, grouped or not (the same on every row).
-- Parameters: :run (text), :since_epoch, :since_position, :window (integers).
-- The grouping column is the identifier placeholder {column}, written as a
-- quoted identifier by datasetrt.mixing.group_losses (a parameter is a value,
-- never a column name).
WITH recent AS (
    SELECT cache_id, sample_id, value, epoch, position,
           row_number() OVER (ORDER BY epoch DESC, position DESC) AS age
    FROM scores
    WHERE run = :run
      AND (epoch > :since_epoch OR (epoch = :since_epoch AND position >= :since_position))
),
kept AS (
    SELECT * FROM recent WHERE age <= :window
),
newest AS (
    SELECT epoch AS last_epoch, position AS last_position FROM kept WHERE age = 1
)
SELECT CAST(m.{column} AS VARCHAR) AS value,
       avg(k.value) AS loss,
       count(*) AS n,
       max(w.last_epoch) AS last_epoch,
       max(w.last_position) AS last_position
FROM kept k
JOIN metadata m USING (cache_id, sample_id)
CROSS JOIN newest w
WHERE m.{column} IS NOT NULL
GROUP BY CAST(m.{column} AS VARCHAR)
ORDER BY value
