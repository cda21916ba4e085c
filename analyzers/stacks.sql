-- Module stacks: where the host CPU went, from py-spy samples (the `stacks`
-- table). Empty when the trace has no stacks table.

-- @table stacks_categories
-- One row per category (tokenize, model-forward, sampling, detokenize,
-- network-io, serialization, idle, other), most samples first.
-- @column category: Sample category.
-- @column samples: Samples in the category (sum of weight, count).
-- @column share: samples / all samples, 0..1.
-- @column busy_share: samples / non-idle samples, 0..1 (null for idle).
-- @column threads: Threads seen in the category (count).
CREATE OR REPLACE TEMP TABLE stacks_categories AS
WITH c AS (
    SELECT category, sum(weight)::BIGINT AS samples, count(DISTINCT thread) AS threads
    FROM stacks GROUP BY category
)
SELECT
    category, samples,
    samples / nullif((SELECT sum(samples) FROM c), 0) AS share,
    CASE WHEN category <> 'idle'
         THEN samples / nullif((SELECT sum(samples) FROM c WHERE category <> 'idle'), 0) END AS busy_share,
    threads
FROM c
ORDER BY samples DESC, category;
