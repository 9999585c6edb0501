-- Statement::Members: a lease group's membership. Member locks are two-int
-- advisory locks (group id, backend pid), objsubid 2; one counts only when its
-- second half is the pid of the backend that holds it. Statements for claims,
-- announcements, joins and leaves come first when there are any; the last one
-- answers (tag, a, b) rows.

-- @claims
SELECT ${members.left}::pg_catalog.int8, c,
  pg_catalog.length(pg_catalog.concat(
  pg_catalog.pg_notify('${channel}',
  pg_catalog.concat('claim ', c, ' ', pg_catalog.pg_backend_pid()))))::pg_catalog.int8
  FROM pg_catalog.unnest(${claims}) AS c;

-- @announce
SELECT ${members.left}::pg_catalog.int8, j::pg_catalog.int8,
  pg_catalog.length(pg_catalog.concat(${group_notice}))::pg_catalog.int8
  FROM pg_catalog.unnest(${groups}) AS j;

-- @group_notice
pg_catalog.pg_notify('${channel}',
  pg_catalog.concat('group ', (j::pg_catalog.int8
  OPERATOR(pg_catalog.&) 4294967295)::pg_catalog.text))

-- @join
SELECT ${members.joined}::pg_catalog.int8, j::pg_catalog.int8,
  pg_catalog.length(pg_catalog.concat(pg_catalog.pg_try_advisory_lock(j,
  pg_catalog.pg_backend_pid())${announce}))::pg_catalog.int8
  FROM pg_catalog.unnest(${groups}) AS j;

-- @leave
SELECT ${members.left}::pg_catalog.int8, j::pg_catalog.int8,
  pg_catalog.pg_advisory_unlock(j, pg_catalog.pg_backend_pid())
  ::pg_catalog.int4::pg_catalog.int8
  FROM pg_catalog.unnest(${groups}) AS j;

-- @read
SELECT ${members.session}::pg_catalog.int8, pg_catalog.pg_backend_pid()::pg_catalog.int8,
  ${nonce_value}
UNION ALL
SELECT ${members.member}, m.classid::pg_catalog.int8, m.objid::pg_catalog.int8
  FROM pg_catalog.pg_locks AS m
  WHERE ${member_locks}
  AND m.classid::pg_catalog.int8 OPERATOR(pg_catalog.=) ANY (${group_ids})
UNION ALL
SELECT ${members.holder}, l.k, h.pid::pg_catalog.int8 FROM pg_catalog.unnest(${keys}) AS l(k)
  LEFT JOIN (${advisory_locks}) AS h
  ON h.k OPERATOR(pg_catalog.=) l.k

-- @member_locks
-- The granted member locks of this database (on pg_locks AS m).
m.locktype OPERATOR(pg_catalog.=) 'advisory'
  AND m.objsubid OPERATOR(pg_catalog.=) 2 AND m.granted
  AND m.objid::pg_catalog.int8 OPERATOR(pg_catalog.=) m.pid::pg_catalog.int8
  AND m.database OPERATOR(pg_catalog.=) ${this_database}
