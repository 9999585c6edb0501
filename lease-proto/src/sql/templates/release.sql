-- Statement::Release: unlock keys. Rows: (key, 1 if it was held else 0).

-- @release
SELECT k, pg_catalog.pg_advisory_unlock(k)::pg_catalog.int4::pg_catalog.int8
  FROM pg_catalog.unnest(${keys}) AS k

-- @release_notify
-- Two statements, one implicit transaction. A DO block unlocks every key,
-- with the release's moment read once before the first unlock (a token; 0:
-- not held; before, so that a take granted in an unlock reads its token after
-- it), then reads once who holds each key now (the first take in a key's
-- queue is granted it in the unlock) and notifies `KEY AT [GRANTEE
-- [RESERVED]]`, naming the backend a key is reserved for only if it holds or
-- waits for the key, or was confirmed moments ago and is still connected;
-- the rows come from what it left in the released setting.
DO $lease$DECLARE t pg_catalog.int8[]; BEGIN
  SELECT pg_catalog.array_agg(CASE WHEN pg_catalog.pg_advisory_unlock(u.k)
    THEN c.t ELSE 0 END ORDER BY u.o)
  INTO t FROM pg_catalog.unnest(${keys}) WITH ORDINALITY AS u(k, o),
    (SELECT ${token} AS t) AS c;
  PERFORM pg_catalog.pg_notify('${channel}', pg_catalog.concat(r.k, ' ', r.t,
    CASE WHEN v.k IS NULL THEN ' ' OPERATOR(pg_catalog.||) g.pid::pg_catalog.text
    ELSE pg_catalog.concat(' ', coalesce(g.pid, 0), ' ', v.p) END))
  FROM ROWS FROM (pg_catalog.unnest(${keys}), pg_catalog.unnest(t)) AS r(k, t)
  LEFT JOIN (${advisory_locks} AND mode OPERATOR(pg_catalog.<>) 'ShareLock'
    AND pid OPERATOR(pg_catalog.<>) pg_catalog.pg_backend_pid()) AS g
    ON g.k OPERATOR(pg_catalog.=) r.k
  LEFT JOIN (SELECT a.k, a.p FROM ROWS FROM (pg_catalog.unnest(${reserved_keys}),
      pg_catalog.unnest(${reserved_pids}), pg_catalog.unnest(${reserved_recent})) AS a(k, p, q)
    WHERE EXISTS (${asked}) OR (a.q OPERATOR(pg_catalog.=) 1 AND EXISTS (SELECT FROM
      pg_catalog.pg_stat_activity WHERE pid OPERATOR(pg_catalog.=) a.p))) AS v
    ON v.k OPERATOR(pg_catalog.=) r.k
  WHERE r.t OPERATOR(pg_catalog.>) 0;
  PERFORM pg_catalog.set_config('${released_setting}',
    coalesce(t, '{}')::pg_catalog.text, true);
  END$lease$;
SELECT r.k, (r.t OPERATOR(pg_catalog.>) 0)::pg_catalog.int4::pg_catalog.int8
  FROM ROWS FROM (pg_catalog.unnest(${keys}), pg_catalog.unnest(
  pg_catalog.current_setting('${released_setting}')::pg_catalog.int8[])) AS r(k, t)

-- @locks_of
-- The advisory locks on key ${a}.k in this database of backend ${pid}, as a
-- SELECT for EXISTS: the waiting ones, and the granted ones too unless
-- ${waiting} is `AND NOT w.granted`.
SELECT FROM pg_catalog.pg_locks AS w WHERE w.locktype OPERATOR(pg_catalog.=) 'advisory'
  AND w.objsubid OPERATOR(pg_catalog.=) 1 ${waiting} AND w.pid OPERATOR(pg_catalog.=) ${pid}
  AND w.database OPERATOR(pg_catalog.=) ${this_database}
  AND ((w.classid::pg_catalog.int8 OPERATOR(pg_catalog.<<) 32)
    OPERATOR(pg_catalog.|) w.objid::pg_catalog.int8) OPERATOR(pg_catalog.=) ${a}.k
