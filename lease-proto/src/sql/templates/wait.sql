-- The waits on the server: Statement::Wait (the watch session's, which never
-- takes anything) and Statement::Take (a standby's wait that takes the key).
-- Three statements, one implicit transaction: the prelude (wait_prelude.sql:
-- settings read when the next statement starts), the wait, whose lock timeout
-- is caught and recorded in the wait setting, and the reply, read after the
-- wait. Rows are (tag, value).

-- @wait
${prelude}
DO $lease$BEGIN ${crowded}${named}${cut}PERFORM pg_catalog.pg_advisory_xact_lock_shared(${key});
  PERFORM pg_catalog.set_config('${wait_setting}', '1', true);
  EXCEPTION WHEN lock_not_available THEN
  PERFORM pg_catalog.set_config('${wait_setting}', '0', true); END$lease$;
${wait_reply}

-- @take
-- The checks of a try before the lock (the session's backend and nonce, not
-- in recovery, not a key this backend holds already), then the lock, and the
-- token read right after the grant.
${prelude}
DO $lease$BEGIN ${crowded}
  IF pg_catalog.pg_backend_pid() OPERATOR(pg_catalog.<>) ${backend_pid}
  OR coalesce(pg_catalog.current_setting('${nonce_setting}', true)
    OPERATOR(pg_catalog.<>) '${nonce}', true) OR pg_catalog.pg_is_in_recovery() THEN
  PERFORM pg_catalog.set_config('${wait_setting}', '${wait.held}', true); RETURN; END IF;
  IF EXISTS (${any_here}) THEN
  PERFORM pg_catalog.set_config('${wait_setting}', '${wait.held_here}', true); RETURN; END IF;
  ${cut}BEGIN PERFORM pg_catalog.pg_advisory_lock(${key});
  EXCEPTION WHEN lock_not_available THEN NULL; END;
  IF EXISTS (${here}) THEN
  PERFORM pg_catalog.set_config('${token_setting}', (${token})::pg_catalog.text, true);
  PERFORM pg_catalog.set_config('${wait_setting}', '${wait.freed}', true);
  ELSE PERFORM pg_catalog.set_config('${wait_setting}', '${wait.held}', true); END IF;
  END$lease$;
${wait_reply}
UNION ALL
SELECT ${heartbeat.token}, pg_catalog.current_setting('${token_setting}')::pg_catalog.int8
  WHERE pg_catalog.current_setting('${wait_setting}') OPERATOR(pg_catalog.=) '${wait.freed}'

-- @wait_reply
-- The rows both answer: the session's backend and nonce, the outcome the wait
-- left in the wait setting, and the session's deadlock_timeout.
SELECT ${heartbeat.backend_pid}::pg_catalog.int8, pg_catalog.pg_backend_pid()::pg_catalog.int8
UNION ALL
SELECT ${heartbeat.nonce}, ${nonce_value}
UNION ALL
SELECT ${heartbeat.freed}, pg_catalog.current_setting('${wait_setting}')::pg_catalog.int8
UNION ALL
SELECT ${heartbeat.deadlock_timeout_ms}, ${deadlock_timeout_ms}

-- @crowd_check
-- With ${n} waiters of the key or more with a smaller backend pid queued
-- already, the block records "crowded" and returns without queueing.
IF ${n} OPERATOR(pg_catalog.<=) (SELECT pg_catalog.count(pid) FROM pg_catalog.pg_locks
  WHERE locktype OPERATOR(pg_catalog.=) 'advisory'
  AND objsubid OPERATOR(pg_catalog.=) 1 AND NOT granted
  AND database OPERATOR(pg_catalog.=) ${this_database}
  AND pid OPERATOR(pg_catalog.<) pg_catalog.pg_backend_pid()
  AND ${advisory_key} OPERATOR(pg_catalog.=) (${key})::pg_catalog.int8) THEN
  PERFORM pg_catalog.set_config('${wait_setting}', '${wait.crowded}', true); RETURN; END IF; 

-- @watch_of
-- The watch session names its lease session while it waits.
PERFORM pg_catalog.set_config('application_name', pg_catalog.concat('${watch_of}${pid}: ',
  pg_catalog.current_setting('application_name')), true); 

-- @cut_lock_timeout
-- A transaction-local lock_timeout of ${ms}, cut to the wait limit of the
-- session's deadlock_timeout (a tenth below it, at least 10 ms, at least 1 ms
-- in all: wait_limit_ms).
PERFORM pg_catalog.set_config('lock_timeout',
  (SELECT (CASE WHEN l OPERATOR(pg_catalog.<) ${ms} THEN l ELSE ${ms} END)::pg_catalog.text
  FROM (SELECT CASE WHEN m OPERATOR(pg_catalog.<) 1 THEN 1 ELSE m END AS l
  FROM (SELECT d OPERATOR(pg_catalog.-) CASE WHEN d OPERATOR(pg_catalog./) 10
    OPERATOR(pg_catalog.>) 10 THEN d OPERATOR(pg_catalog./) 10 ELSE 10 END AS m
  FROM (SELECT ${deadlock_timeout_ms} AS d) AS s) AS c) AS w), true); 

-- @locks_here
-- This backend's granted advisory locks on the key in this database (only the
-- exclusive ones with ${exclusive}), as a SELECT for EXISTS.
SELECT FROM pg_catalog.pg_locks WHERE locktype OPERATOR(pg_catalog.=) 'advisory'
  AND objsubid OPERATOR(pg_catalog.=) 1 AND granted ${exclusive}
  AND pid OPERATOR(pg_catalog.=) pg_catalog.pg_backend_pid()
  AND database OPERATOR(pg_catalog.=) ${this_database}
  AND ${advisory_key} OPERATOR(pg_catalog.=) (${key})::pg_catalog.int8

-- @exclusive
AND mode OPERATOR(pg_catalog.<>) 'ShareLock'
