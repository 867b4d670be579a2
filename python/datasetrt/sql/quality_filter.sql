-- Quality filter: keep the rows whose stored quality score reaches a threshold.
-- Parameters: :min_quality (number).
SELECT *
FROM metadata
WHERE quality >= :min_quality
