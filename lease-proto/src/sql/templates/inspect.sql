-- For people and tools (`lease status`), not the machine: columns of several
-- types, sent with the simple-query protocol and parsed from text
-- (inspect::HolderRow). Times are UTC in RFC 3339 with microseconds.

-- @holders
-- Every advisory lock request on a single-bigint key in this database, granted
-- or waiting, with its session: by key, the holder first, then the waiters in
-- queue order. waitstart needs PostgreSQL 14 (read through to_jsonb, so the
-- statement runs on older servers too, with NULL).
SELECT h.k AS key, h.pid, h.mode,
  a.application_name, pg_catalog.host(a.client_addr), a.client_port,
  ${backend_start}, ${state_change}, a.state, h.granted, ${waitstart}
  FROM (SELECT ${advisory_key} AS k, l.pid, l.mode, l.granted,
    (pg_catalog.to_jsonb(l) OPERATOR(pg_catalog.->>) 'waitstart')::pg_catalog.timestamptz
    AS waitstart FROM pg_catalog.pg_locks AS l
    WHERE l.locktype OPERATOR(pg_catalog.=) 'advisory' AND l.objsubid OPERATOR(pg_catalog.=) 1
    AND l.database OPERATOR(pg_catalog.=) ${this_database}) AS h
  LEFT JOIN pg_catalog.pg_stat_activity AS a ON a.pid OPERATOR(pg_catalog.=) h.pid
  ORDER BY h.k, h.granted DESC, h.waitstart NULLS FIRST, h.pid

-- @members
-- Every lease group member in this database, in the holders' columns with the
-- group id as the key, by group and backend start.
SELECT m.classid::pg_catalog.int8, m.pid, m.mode, a.application_name,
  pg_catalog.host(a.client_addr), a.client_port,
  ${backend_start}, ${state_change}, a.state, m.granted, NULL FROM pg_catalog.pg_locks AS m
  LEFT JOIN pg_catalog.pg_stat_activity AS a ON a.pid OPERATOR(pg_catalog.=) m.pid
  WHERE ${member_locks}
  ORDER BY 1, a.backend_start, m.pid

-- @utc_text
pg_catalog.to_char((${e}) AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')
