-- Cap each label's share of the total weight at :cap (apply after a recipe that
-- reweights, e.g. focal_weights, so a few hard classes cannot take the run).
-- The labels over the cap are scaled down to exactly :cap of the new total;
-- the others keep their weights, so their shares grow in proportion (the
-- water-filling solution: the capped labels are the heaviest k, for the
-- smallest k that leaves the next label within the cap). Rows keep their
-- weights relative to their label. A :cap below 1 / (number of labels) cannot
-- be met; it is raised to that (every label then gets an equal share).
-- Parameters: :cap (number in (0, 1]).
WITH classes AS (
    SELECT label, sum(weight) AS w FROM metadata GROUP BY label
),
ranked AS (
    SELECT label, w,
           row_number() OVER (ORDER BY w DESC, label) - 1 AS heavier,
           sum(w) OVER (ORDER BY w DESC, label
                        ROWS BETWEEN CURRENT ROW AND UNBOUNDED FOLLOWING) AS rest,
           count(*) OVER () AS labels
    FROM classes
),
cap AS (
    SELECT greatest(CAST(:cap AS DOUBLE), 1.0 / max(labels)) AS c FROM ranked
),
cut AS (  -- k, the number of capped labels, and the new total weight
    SELECT r.heavier AS k, r.rest / (1.0 - r.heavier * cap.c) AS total
    FROM ranked r CROSS JOIN cap
    WHERE r.w * (1.0 - r.heavier * cap.c) <= cap.c * r.rest * (1.0 + 1e-12)
    ORDER BY r.heavier
    LIMIT 1
)
SELECT m.* EXCLUDE (weight),
       CASE WHEN r.heavier < cut.k THEN m.weight * (cap.c * cut.total / r.w)
            ELSE m.weight END AS weight
FROM metadata m
JOIN ranked r ON m.label IS NOT DISTINCT FROM r.label
CROSS JOIN cut
CROSS JOIN cap
