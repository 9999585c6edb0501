-- The statements that prove the session is the same live one: the heartbeat,
-- and the statements that answer what it answers and more (the verify, the
-- prefer, the hand-over check). Rows are (tag, value).

-- @heartbeat
SELECT ${heartbeat.backend_pid}::pg_catalog.int8, pg_catalog.pg_backend_pid()::pg_catalog.int8
UNION ALL SELECT ${heartbeat.nonce}, ${nonce_value}
UNION ALL SELECT ${heartbeat.server_clock_us}, ${server_clock_us}

-- @verify
-- The heartbeat, and every key this backend holds.
${heartbeat} UNION ALL
SELECT ${heartbeat.held_key}, s.k FROM (${advisory_locks}) AS s
  WHERE s.pid OPERATOR(pg_catalog.=) pg_catalog.pg_backend_pid()

-- @prefer
-- A standby of a priority asks the holder of the key for it: `prefer KEY PID
-- PRIORITY` on the channel, from this backend.
SELECT ${heartbeat.backend_pid}::pg_catalog.int8, pg_catalog.pg_backend_pid()::pg_catalog.int8
  FROM (SELECT pg_catalog.pg_notify('${channel}', pg_catalog.concat(
    'prefer ', (${key})::pg_catalog.int8::pg_catalog.text, ' ',
    pg_catalog.pg_backend_pid()::pg_catalog.text, ' ',
    (${priority})::pg_catalog.int8::pg_catalog.text))) AS n
UNION ALL SELECT ${heartbeat.nonce}, ${nonce_value}

-- @check_handover
-- The heartbeat; then, for each key, the first ask (in the order given) whose
-- backend waits for it, answered by its ordinal and announced from this
-- backend as `to KEY PID`, at commit.
${heartbeat} UNION ALL SELECT ${heartbeat.waiting}, (c.o OPERATOR(pg_catalog.<<) 32) OPERATOR(pg_catalog.|) c.w
  FROM (SELECT a.o, a.w, pg_catalog.pg_notify('${channel}',
    pg_catalog.concat('to ', a.k, ' ', a.w))
  FROM (SELECT a.k, a.o, ${waiting_a} AS w FROM ${asks} AS a(k, p, o)) AS a
  WHERE a.w IS NOT NULL AND NOT EXISTS (SELECT FROM ${asks} AS b(k, p, o)
    WHERE b.k OPERATOR(pg_catalog.=) a.k AND b.o OPERATOR(pg_catalog.<) a.o
    AND ${waiting_b} IS NOT NULL)) AS c

-- @asks
ROWS FROM (pg_catalog.unnest(${keys}), pg_catalog.unnest(${pids})) WITH ORDINALITY

-- @waiting
-- Per ask `${a}`: the backend that waits for its key, the named one first,
-- else a watch session that names it (its application_name), or NULL.
coalesce((SELECT ${a}.p WHERE EXISTS (${waiter_named})), (SELECT w.pid::pg_catalog.int8
  FROM pg_catalog.pg_locks AS w JOIN pg_catalog.pg_stat_activity AS s
    ON s.pid OPERATOR(pg_catalog.=) w.pid
  WHERE w.locktype OPERATOR(pg_catalog.=) 'advisory'
  AND w.objsubid OPERATOR(pg_catalog.=) 1 AND NOT w.granted
  AND w.database OPERATOR(pg_catalog.=) ${this_database}
  AND ((w.classid::pg_catalog.int8 OPERATOR(pg_catalog.<<) 32)
    OPERATOR(pg_catalog.|) w.objid::pg_catalog.int8) OPERATOR(pg_catalog.=) ${a}.k
  AND pg_catalog.starts_with(s.application_name,
    pg_catalog.concat('${watch_of}', ${a}.p, ':')) LIMIT 1))
