-- Statement::TryLock: one batched try of every key a standby wants.
--
-- The aggregate consumes every try before the outer query runs, so the token
-- (the server's clock) is read after the last lock of the batch was granted,
-- and only if one was. CASE fixes the order of the checks before each try:
-- the session's own backend and nonce, not in recovery, and not a key this
-- backend holds already (another client's, behind a transaction pooler; read
-- once, by an uncorrelated subquery: a per-key EXISTS over pg_locks made the
-- try quadratic in the number of keys).
-- Rows: (NULL, backend pid, nonce); (key, token, NULL) per key won;
-- (key, NULL, holder pid or NULL) per key not won.

-- @try_lock
WITH t AS (SELECT pg_catalog.array_agg(k) AS won FROM pg_catalog.unnest(${keys}) AS k
  WHERE CASE WHEN pg_catalog.pg_backend_pid() OPERATOR(pg_catalog.<>) ${backend_pid}
    OR coalesce(pg_catalog.current_setting('${nonce_setting}', true)
      OPERATOR(pg_catalog.<>) '${nonce}', true)
    OR pg_catalog.pg_is_in_recovery() THEN false
  WHEN k OPERATOR(pg_catalog.=) ANY (ARRAY(SELECT o.k
    FROM (${advisory_locks}) AS o
    WHERE o.pid OPERATOR(pg_catalog.=) pg_catalog.pg_backend_pid())) THEN false
  ELSE pg_catalog.pg_try_advisory_lock(k) END),
x AS (SELECT t.won, CASE WHEN t.won IS NOT NULL THEN ${token} END AS token FROM t)
SELECT NULL::pg_catalog.int8, pg_catalog.pg_backend_pid()::pg_catalog.int8, ${nonce_value}
UNION ALL
SELECT w.k, x.token, NULL FROM x, pg_catalog.unnest(x.won) AS w(k)
UNION ALL
SELECT l.k, NULL, h.pid::pg_catalog.int8 FROM x
  CROSS JOIN pg_catalog.unnest(${keys}) AS l(k)
  LEFT JOIN (${advisory_locks}) AS h ON h.k OPERATOR(pg_catalog.=) l.k
  WHERE NOT (l.k OPERATOR(pg_catalog.=) ANY (coalesce(x.won, '{}')))
