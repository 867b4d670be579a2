-- Class balancing by inverse frequency: every label gets the same total weight,
-- so weighted draws see each class equally often.
-- Parameters: none (the class column is `label`).
SELECT * EXCLUDE (weight),
       1.0 / count(*) OVER (PARTITION BY label) AS weight
FROM metadata
