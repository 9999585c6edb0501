-- Fragments the statements share. A section starts at its `-- @name` line;
-- `${name}` is a parameter, a constant or another section (see template.rs).

-- @this_database
-- The current database's oid (pg_locks rows of other databases never count).
(SELECT oid FROM pg_catalog.pg_database
  WHERE datname OPERATOR(pg_catalog.=) pg_catalog.current_database())

-- @advisory_locks
-- Granted single-bigint advisory locks of the current database: columns k
-- (the key) and pid (the holder's backend).
SELECT ${advisory_key} AS k, pid FROM pg_catalog.pg_locks
  WHERE locktype OPERATOR(pg_catalog.=) 'advisory'
  AND objsubid OPERATOR(pg_catalog.=) 1 AND granted
  AND database OPERATOR(pg_catalog.=) ${this_database}

-- @nonce_value
-- The session's nonce as an int8, NULL when unset or empty (a placeholder
-- reset by RESET ALL reads as the empty string).
(SELECT CASE WHEN s OPERATOR(pg_catalog.<>) '' THEN s::pg_catalog.int8 END
  FROM pg_catalog.current_setting('${nonce_setting}', true) AS s)

-- @server_clock_us
-- clock_timestamp() in microseconds since the Unix epoch (extract is
-- grammar, which qualifies it itself).
(extract(epoch FROM pg_catalog.clock_timestamp()) OPERATOR(pg_catalog.*) 1000000)::pg_catalog.int8

-- @token
-- A fencing token: the server's clock plus the offset above the old scheme.
${token_offset}::pg_catalog.int8 OPERATOR(pg_catalog.+) ${server_clock_us}

-- @deadlock_timeout_ms
-- The session's deadlock_timeout in ms: its shown value carries its unit,
-- which the interval input reads under any IntervalStyle (not pg_settings,
-- which builds a row for every setting).
(extract(epoch FROM pg_catalog.current_setting('deadlock_timeout')::pg_catalog.interval)
  OPERATOR(pg_catalog.*) 1000)::pg_catalog.int8
