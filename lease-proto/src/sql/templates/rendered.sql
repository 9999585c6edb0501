-- Every statement of lease-proto as sent, rendered from templates/*.sql by
-- the test every_statement_renders_as_the_golden_file (LEASE_BLESS=1 rewrites it).

-- Setup { nonce: -42, settings: [("search_path", "pg_catalog"), ("idle_session_timeout", "900")] }
DO $lease$BEGIN PERFORM pg_catalog.set_config('lease.checkpoint',
  (SELECT pg_catalog.concat(c.timeline_id, ',', pg_catalog.floor(1000 OPERATOR(pg_catalog.*)
    pg_catalog.date_part('epoch', pg_catalog.clock_timestamp() OPERATOR(pg_catalog.-)
    c.checkpoint_time))::pg_catalog.int8)
  FROM pg_catalog.pg_control_checkpoint() c), true);
  EXCEPTION WHEN insufficient_privilege THEN NULL; END$lease$;
DO $lease$BEGIN PERFORM pg_catalog.set_config('lease.history', COALESCE(
  (SELECT pg_catalog.floor(1000 OPERATOR(pg_catalog.*) pg_catalog.date_part('epoch',
    pg_catalog.clock_timestamp() OPERATOR(pg_catalog.-) w.modification))::pg_catalog.int8
    ::pg_catalog.text FROM pg_catalog.pg_ls_waldir() w
  WHERE w.name OPERATOR(pg_catalog.=) pg_catalog.concat(pg_catalog.substr(
    pg_catalog.pg_walfile_name(pg_catalog.pg_current_wal_lsn()), 1, 8), '.history')), ''),
  true);
  EXCEPTION WHEN insufficient_privilege OR object_not_in_prerequisite_state THEN NULL;
  END$lease$;
SELECT 0::pg_catalog.int8, pg_catalog.length(pg_catalog.concat(
  pg_catalog.set_config('lease.nonce', '-42', false)
  , pg_catalog.set_config('search_path', 'pg_catalog', false)
  , pg_catalog.set_config('idle_session_timeout', '900', false)))::pg_catalog.int8;
WITH lease_settings AS (SELECT name, setting FROM pg_catalog.pg_settings
  WHERE name OPERATOR(pg_catalog.=) ANY ('{idle_session_timeout,tcp_user_timeout,tcp_keepalives_idle,tcp_keepalives_interval,tcp_keepalives_count}'::pg_catalog.text[]))
SELECT 1::pg_catalog.int8,
  pg_catalog.current_setting('server_version_num')::pg_catalog.int8
UNION ALL SELECT 2, pg_catalog.pg_is_in_recovery()::pg_catalog.int4::pg_catalog.int8
UNION ALL SELECT 3, pg_catalog.pg_backend_pid()::pg_catalog.int8
UNION ALL SELECT 4, (SELECT setting::pg_catalog.int8 FROM lease_settings
  WHERE name OPERATOR(pg_catalog.=) 'idle_session_timeout')
UNION ALL SELECT 9,
  (pg_catalog.inet_client_addr() IS NULL)::pg_catalog.int4::pg_catalog.int8
UNION ALL SELECT 10, (SELECT CASE WHEN s OPERATOR(pg_catalog.<>) '' THEN s::pg_catalog.int8 END
  FROM pg_catalog.current_setting('lease.nonce', true) AS s)
UNION ALL SELECT 11, (pg_catalog.current_setting('search_path')
  OPERATOR(pg_catalog.=) 'pg_catalog')::pg_catalog.int4::pg_catalog.int8
UNION ALL SELECT 12, (extract(epoch FROM pg_catalog.clock_timestamp()) OPERATOR(pg_catalog.*) 1000000)::pg_catalog.int8
UNION ALL SELECT 5, (SELECT setting::pg_catalog.int8 FROM lease_settings
  WHERE name OPERATOR(pg_catalog.=) 'tcp_user_timeout')
UNION ALL SELECT 6, (SELECT setting::pg_catalog.int8 FROM lease_settings
  WHERE name OPERATOR(pg_catalog.=) 'tcp_keepalives_idle')
UNION ALL SELECT 7, (SELECT setting::pg_catalog.int8 FROM lease_settings
  WHERE name OPERATOR(pg_catalog.=) 'tcp_keepalives_interval')
UNION ALL SELECT 8, (SELECT setting::pg_catalog.int8 FROM lease_settings
  WHERE name OPERATOR(pg_catalog.=) 'tcp_keepalives_count')
UNION ALL SELECT 40, (pg_catalog.pg_last_wal_receive_lsn() IS NOT NULL
  OR pg_catalog.pg_last_xact_replay_timestamp() IS NOT NULL)::pg_catalog.int4::pg_catalog.int8
UNION ALL SELECT 41, CASE WHEN pg_catalog.pg_is_in_recovery() THEN NULL
  ELSE pg_catalog.concat('x', pg_catalog.substr(pg_catalog.pg_walfile_name(
    pg_catalog.pg_current_wal_lsn()), 1, 8))::pg_catalog.bit(32)::pg_catalog.int8 END
UNION ALL SELECT 42, (SELECT CASE WHEN s OPERATOR(pg_catalog.<>) '' THEN s::pg_catalog.int8 END
  FROM pg_catalog.split_part(pg_catalog.current_setting('lease.checkpoint', true),
  ',', 1) AS s)
UNION ALL SELECT 43, (SELECT CASE WHEN s OPERATOR(pg_catalog.<>) '' THEN s::pg_catalog.int8 END
  FROM pg_catalog.split_part(pg_catalog.current_setting('lease.checkpoint', true),
  ',', 2) AS s)
UNION ALL SELECT 44, (SELECT CASE WHEN s OPERATOR(pg_catalog.<>) ''
  THEN s::pg_catalog.int8 END FROM COALESCE(
  pg_catalog.current_setting('lease.history', true), '') AS s);

-- Setup { nonce: 1, settings: [] }
DO $lease$BEGIN PERFORM pg_catalog.set_config('lease.checkpoint',
  (SELECT pg_catalog.concat(c.timeline_id, ',', pg_catalog.floor(1000 OPERATOR(pg_catalog.*)
    pg_catalog.date_part('epoch', pg_catalog.clock_timestamp() OPERATOR(pg_catalog.-)
    c.checkpoint_time))::pg_catalog.int8)
  FROM pg_catalog.pg_control_checkpoint() c), true);
  EXCEPTION WHEN insufficient_privilege THEN NULL; END$lease$;
DO $lease$BEGIN PERFORM pg_catalog.set_config('lease.history', COALESCE(
  (SELECT pg_catalog.floor(1000 OPERATOR(pg_catalog.*) pg_catalog.date_part('epoch',
    pg_catalog.clock_timestamp() OPERATOR(pg_catalog.-) w.modification))::pg_catalog.int8
    ::pg_catalog.text FROM pg_catalog.pg_ls_waldir() w
  WHERE w.name OPERATOR(pg_catalog.=) pg_catalog.concat(pg_catalog.substr(
    pg_catalog.pg_walfile_name(pg_catalog.pg_current_wal_lsn()), 1, 8), '.history')), ''),
  true);
  EXCEPTION WHEN insufficient_privilege OR object_not_in_prerequisite_state THEN NULL;
  END$lease$;
SELECT 0::pg_catalog.int8, pg_catalog.length(pg_catalog.concat(
  pg_catalog.set_config('lease.nonce', '1', false)))::pg_catalog.int8;
WITH lease_settings AS (SELECT name, setting FROM pg_catalog.pg_settings
  WHERE name OPERATOR(pg_catalog.=) ANY ('{idle_session_timeout,tcp_user_timeout,tcp_keepalives_idle,tcp_keepalives_interval,tcp_keepalives_count}'::pg_catalog.text[]))
SELECT 1::pg_catalog.int8,
  pg_catalog.current_setting('server_version_num')::pg_catalog.int8
UNION ALL SELECT 2, pg_catalog.pg_is_in_recovery()::pg_catalog.int4::pg_catalog.int8
UNION ALL SELECT 3, pg_catalog.pg_backend_pid()::pg_catalog.int8
UNION ALL SELECT 4, (SELECT setting::pg_catalog.int8 FROM lease_settings
  WHERE name OPERATOR(pg_catalog.=) 'idle_session_timeout')
UNION ALL SELECT 9,
  (pg_catalog.inet_client_addr() IS NULL)::pg_catalog.int4::pg_catalog.int8
UNION ALL SELECT 10, (SELECT CASE WHEN s OPERATOR(pg_catalog.<>) '' THEN s::pg_catalog.int8 END
  FROM pg_catalog.current_setting('lease.nonce', true) AS s)
UNION ALL SELECT 11, (pg_catalog.current_setting('search_path')
  OPERATOR(pg_catalog.=) 'pg_catalog')::pg_catalog.int4::pg_catalog.int8
UNION ALL SELECT 12, (extract(epoch FROM pg_catalog.clock_timestamp()) OPERATOR(pg_catalog.*) 1000000)::pg_catalog.int8
UNION ALL SELECT 5, (SELECT setting::pg_catalog.int8 FROM lease_settings
  WHERE name OPERATOR(pg_catalog.=) 'tcp_user_timeout')
UNION ALL SELECT 6, (SELECT setting::pg_catalog.int8 FROM lease_settings
  WHERE name OPERATOR(pg_catalog.=) 'tcp_keepalives_idle')
UNION ALL SELECT 7, (SELECT setting::pg_catalog.int8 FROM lease_settings
  WHERE name OPERATOR(pg_catalog.=) 'tcp_keepalives_interval')
UNION ALL SELECT 8, (SELECT setting::pg_catalog.int8 FROM lease_settings
  WHERE name OPERATOR(pg_catalog.=) 'tcp_keepalives_count')
UNION ALL SELECT 40, (pg_catalog.pg_last_wal_receive_lsn() IS NOT NULL
  OR pg_catalog.pg_last_xact_replay_timestamp() IS NOT NULL)::pg_catalog.int4::pg_catalog.int8
UNION ALL SELECT 41, CASE WHEN pg_catalog.pg_is_in_recovery() THEN NULL
  ELSE pg_catalog.concat('x', pg_catalog.substr(pg_catalog.pg_walfile_name(
    pg_catalog.pg_current_wal_lsn()), 1, 8))::pg_catalog.bit(32)::pg_catalog.int8 END
UNION ALL SELECT 42, (SELECT CASE WHEN s OPERATOR(pg_catalog.<>) '' THEN s::pg_catalog.int8 END
  FROM pg_catalog.split_part(pg_catalog.current_setting('lease.checkpoint', true),
  ',', 1) AS s)
UNION ALL SELECT 43, (SELECT CASE WHEN s OPERATOR(pg_catalog.<>) '' THEN s::pg_catalog.int8 END
  FROM pg_catalog.split_part(pg_catalog.current_setting('lease.checkpoint', true),
  ',', 2) AS s)
UNION ALL SELECT 44, (SELECT CASE WHEN s OPERATOR(pg_catalog.<>) ''
  THEN s::pg_catalog.int8 END FROM COALESCE(
  pg_catalog.current_setting('lease.history', true), '') AS s);

-- Listen
LISTEN lease_handover_v1;

-- TryLock { keys: [-9223372036854775808, -1, 7], backend_pid: 99, nonce: -3 }
WITH t AS (SELECT pg_catalog.array_agg(k) AS won FROM pg_catalog.unnest('{-9223372036854775808,-1,7}'::pg_catalog.int8[]) AS k
  WHERE CASE WHEN pg_catalog.pg_backend_pid() OPERATOR(pg_catalog.<>) 99
    OR coalesce(pg_catalog.current_setting('lease.nonce', true)
      OPERATOR(pg_catalog.<>) '-3', true)
    OR pg_catalog.pg_is_in_recovery() THEN false
  WHEN k OPERATOR(pg_catalog.=) ANY (ARRAY(SELECT o.k
    FROM (SELECT ((classid::pg_catalog.int8 OPERATOR(pg_catalog.<<) 32) OPERATOR(pg_catalog.|) objid::pg_catalog.int8) AS k, pid FROM pg_catalog.pg_locks
  WHERE locktype OPERATOR(pg_catalog.=) 'advisory'
  AND objsubid OPERATOR(pg_catalog.=) 1 AND granted
  AND database OPERATOR(pg_catalog.=) (SELECT oid FROM pg_catalog.pg_database
  WHERE datname OPERATOR(pg_catalog.=) pg_catalog.current_database())) AS o
    WHERE o.pid OPERATOR(pg_catalog.=) pg_catalog.pg_backend_pid())) THEN false
  ELSE pg_catalog.pg_try_advisory_lock(k) END),
x AS (SELECT t.won, CASE WHEN t.won IS NOT NULL THEN 72057594037927936::pg_catalog.int8 OPERATOR(pg_catalog.+) (extract(epoch FROM pg_catalog.clock_timestamp()) OPERATOR(pg_catalog.*) 1000000)::pg_catalog.int8 END AS token FROM t)
SELECT NULL::pg_catalog.int8, pg_catalog.pg_backend_pid()::pg_catalog.int8, (SELECT CASE WHEN s OPERATOR(pg_catalog.<>) '' THEN s::pg_catalog.int8 END
  FROM pg_catalog.current_setting('lease.nonce', true) AS s)
UNION ALL
SELECT w.k, x.token, NULL FROM x, pg_catalog.unnest(x.won) AS w(k)
UNION ALL
SELECT l.k, NULL, h.pid::pg_catalog.int8 FROM x
  CROSS JOIN pg_catalog.unnest('{-9223372036854775808,-1,7}'::pg_catalog.int8[]) AS l(k)
  LEFT JOIN (SELECT ((classid::pg_catalog.int8 OPERATOR(pg_catalog.<<) 32) OPERATOR(pg_catalog.|) objid::pg_catalog.int8) AS k, pid FROM pg_catalog.pg_locks
  WHERE locktype OPERATOR(pg_catalog.=) 'advisory'
  AND objsubid OPERATOR(pg_catalog.=) 1 AND granted
  AND database OPERATOR(pg_catalog.=) (SELECT oid FROM pg_catalog.pg_database
  WHERE datname OPERATOR(pg_catalog.=) pg_catalog.current_database())) AS h ON h.k OPERATOR(pg_catalog.=) l.k
  WHERE NOT (l.k OPERATOR(pg_catalog.=) ANY (coalesce(x.won, '{}')));

-- Heartbeat
SELECT 0::pg_catalog.int8, pg_catalog.pg_backend_pid()::pg_catalog.int8
UNION ALL SELECT 2, (SELECT CASE WHEN s OPERATOR(pg_catalog.<>) '' THEN s::pg_catalog.int8 END
  FROM pg_catalog.current_setting('lease.nonce', true) AS s)
UNION ALL SELECT 6, (extract(epoch FROM pg_catalog.clock_timestamp()) OPERATOR(pg_catalog.*) 1000000)::pg_catalog.int8;

-- Verify
SELECT 0::pg_catalog.int8, pg_catalog.pg_backend_pid()::pg_catalog.int8
UNION ALL SELECT 2, (SELECT CASE WHEN s OPERATOR(pg_catalog.<>) '' THEN s::pg_catalog.int8 END
  FROM pg_catalog.current_setting('lease.nonce', true) AS s)
UNION ALL SELECT 6, (extract(epoch FROM pg_catalog.clock_timestamp()) OPERATOR(pg_catalog.*) 1000000)::pg_catalog.int8 UNION ALL
SELECT 1, s.k FROM (SELECT ((classid::pg_catalog.int8 OPERATOR(pg_catalog.<<) 32) OPERATOR(pg_catalog.|) objid::pg_catalog.int8) AS k, pid FROM pg_catalog.pg_locks
  WHERE locktype OPERATOR(pg_catalog.=) 'advisory'
  AND objsubid OPERATOR(pg_catalog.=) 1 AND granted
  AND database OPERATOR(pg_catalog.=) (SELECT oid FROM pg_catalog.pg_database
  WHERE datname OPERATOR(pg_catalog.=) pg_catalog.current_database())) AS s
  WHERE s.pid OPERATOR(pg_catalog.=) pg_catalog.pg_backend_pid();

-- Wait { key: -5, timeout_ms: 2000, crowd: None, watch_of: Some(77) }
DO $lease$BEGIN PERFORM pg_catalog.set_config('statement_timeout', '0', true);
  BEGIN PERFORM pg_catalog.set_config('client_connection_check_interval', '250', true);
  EXCEPTION WHEN OTHERS THEN NULL; END;
  BEGIN PERFORM pg_catalog.set_config('transaction_timeout', '0', true);
  EXCEPTION WHEN OTHERS THEN NULL; END; END$lease$;
DO $lease$BEGIN PERFORM pg_catalog.set_config('application_name', pg_catalog.concat('lease watch of 77: ',
  pg_catalog.current_setting('application_name')), true);PERFORM pg_catalog.set_config('lock_timeout',
  (SELECT (CASE WHEN l OPERATOR(pg_catalog.<) 2000 THEN l ELSE 2000 END)::pg_catalog.text
  FROM (SELECT CASE WHEN m OPERATOR(pg_catalog.<) 1 THEN 1 ELSE m END AS l
  FROM (SELECT d OPERATOR(pg_catalog.-) CASE WHEN d OPERATOR(pg_catalog./) 10
    OPERATOR(pg_catalog.>) 10 THEN d OPERATOR(pg_catalog./) 10 ELSE 10 END AS m
  FROM (SELECT (extract(epoch FROM pg_catalog.current_setting('deadlock_timeout')::pg_catalog.interval)
  OPERATOR(pg_catalog.*) 1000)::pg_catalog.int8 AS d) AS s) AS c) AS w), true);PERFORM pg_catalog.pg_advisory_xact_lock_shared(-5);
  PERFORM pg_catalog.set_config('lease.freed', '1', true);
  EXCEPTION WHEN lock_not_available THEN
  PERFORM pg_catalog.set_config('lease.freed', '0', true); END$lease$;
SELECT 0::pg_catalog.int8, pg_catalog.pg_backend_pid()::pg_catalog.int8
UNION ALL
SELECT 2, (SELECT CASE WHEN s OPERATOR(pg_catalog.<>) '' THEN s::pg_catalog.int8 END
  FROM pg_catalog.current_setting('lease.nonce', true) AS s)
UNION ALL
SELECT 3, pg_catalog.current_setting('lease.freed')::pg_catalog.int8
UNION ALL
SELECT 4, (extract(epoch FROM pg_catalog.current_setting('deadlock_timeout')::pg_catalog.interval)
  OPERATOR(pg_catalog.*) 1000)::pg_catalog.int8;

-- Wait { key: -5, timeout_ms: 2000, crowd: Some(2), watch_of: None }
DO $lease$BEGIN PERFORM pg_catalog.set_config('statement_timeout', '0', true);
  BEGIN PERFORM pg_catalog.set_config('client_connection_check_interval', '250', true);
  EXCEPTION WHEN OTHERS THEN NULL; END;
  BEGIN PERFORM pg_catalog.set_config('transaction_timeout', '0', true);
  EXCEPTION WHEN OTHERS THEN NULL; END; END$lease$;
DO $lease$BEGIN IF 2 OPERATOR(pg_catalog.<=) (SELECT pg_catalog.count(pid) FROM pg_catalog.pg_locks
  WHERE locktype OPERATOR(pg_catalog.=) 'advisory'
  AND objsubid OPERATOR(pg_catalog.=) 1 AND NOT granted
  AND database OPERATOR(pg_catalog.=) (SELECT oid FROM pg_catalog.pg_database
  WHERE datname OPERATOR(pg_catalog.=) pg_catalog.current_database())
  AND pid OPERATOR(pg_catalog.<) pg_catalog.pg_backend_pid()
  AND ((classid::pg_catalog.int8 OPERATOR(pg_catalog.<<) 32) OPERATOR(pg_catalog.|) objid::pg_catalog.int8) OPERATOR(pg_catalog.=) (-5)::pg_catalog.int8) THEN
  PERFORM pg_catalog.set_config('lease.freed', '2', true); RETURN; END IF;PERFORM pg_catalog.set_config('lock_timeout',
  (SELECT (CASE WHEN l OPERATOR(pg_catalog.<) 2000 THEN l ELSE 2000 END)::pg_catalog.text
  FROM (SELECT CASE WHEN m OPERATOR(pg_catalog.<) 1 THEN 1 ELSE m END AS l
  FROM (SELECT d OPERATOR(pg_catalog.-) CASE WHEN d OPERATOR(pg_catalog./) 10
    OPERATOR(pg_catalog.>) 10 THEN d OPERATOR(pg_catalog./) 10 ELSE 10 END AS m
  FROM (SELECT (extract(epoch FROM pg_catalog.current_setting('deadlock_timeout')::pg_catalog.interval)
  OPERATOR(pg_catalog.*) 1000)::pg_catalog.int8 AS d) AS s) AS c) AS w), true);PERFORM pg_catalog.pg_advisory_xact_lock_shared(-5);
  PERFORM pg_catalog.set_config('lease.freed', '1', true);
  EXCEPTION WHEN lock_not_available THEN
  PERFORM pg_catalog.set_config('lease.freed', '0', true); END$lease$;
SELECT 0::pg_catalog.int8, pg_catalog.pg_backend_pid()::pg_catalog.int8
UNION ALL
SELECT 2, (SELECT CASE WHEN s OPERATOR(pg_catalog.<>) '' THEN s::pg_catalog.int8 END
  FROM pg_catalog.current_setting('lease.nonce', true) AS s)
UNION ALL
SELECT 3, pg_catalog.current_setting('lease.freed')::pg_catalog.int8
UNION ALL
SELECT 4, (extract(epoch FROM pg_catalog.current_setting('deadlock_timeout')::pg_catalog.interval)
  OPERATOR(pg_catalog.*) 1000)::pg_catalog.int8;

-- Take { key: -5, timeout_ms: 900, crowd: Some(2), backend_pid: 99, nonce: -3 }
DO $lease$BEGIN PERFORM pg_catalog.set_config('statement_timeout', '0', true);
  BEGIN PERFORM pg_catalog.set_config('client_connection_check_interval', '250', true);
  EXCEPTION WHEN OTHERS THEN NULL; END;
  BEGIN PERFORM pg_catalog.set_config('transaction_timeout', '0', true);
  EXCEPTION WHEN OTHERS THEN NULL; END; END$lease$;
DO $lease$BEGIN IF 2 OPERATOR(pg_catalog.<=) (SELECT pg_catalog.count(pid) FROM pg_catalog.pg_locks
  WHERE locktype OPERATOR(pg_catalog.=) 'advisory'
  AND objsubid OPERATOR(pg_catalog.=) 1 AND NOT granted
  AND database OPERATOR(pg_catalog.=) (SELECT oid FROM pg_catalog.pg_database
  WHERE datname OPERATOR(pg_catalog.=) pg_catalog.current_database())
  AND pid OPERATOR(pg_catalog.<) pg_catalog.pg_backend_pid()
  AND ((classid::pg_catalog.int8 OPERATOR(pg_catalog.<<) 32) OPERATOR(pg_catalog.|) objid::pg_catalog.int8) OPERATOR(pg_catalog.=) (-5)::pg_catalog.int8) THEN
  PERFORM pg_catalog.set_config('lease.freed', '2', true); RETURN; END IF;
  IF pg_catalog.pg_backend_pid() OPERATOR(pg_catalog.<>) 99
  OR coalesce(pg_catalog.current_setting('lease.nonce', true)
    OPERATOR(pg_catalog.<>) '-3', true) OR pg_catalog.pg_is_in_recovery() THEN
  PERFORM pg_catalog.set_config('lease.freed', '0', true); RETURN; END IF;
  IF EXISTS (SELECT FROM pg_catalog.pg_locks WHERE locktype OPERATOR(pg_catalog.=) 'advisory'
  AND objsubid OPERATOR(pg_catalog.=) 1 AND granted 
  AND pid OPERATOR(pg_catalog.=) pg_catalog.pg_backend_pid()
  AND database OPERATOR(pg_catalog.=) (SELECT oid FROM pg_catalog.pg_database
  WHERE datname OPERATOR(pg_catalog.=) pg_catalog.current_database())
  AND ((classid::pg_catalog.int8 OPERATOR(pg_catalog.<<) 32) OPERATOR(pg_catalog.|) objid::pg_catalog.int8) OPERATOR(pg_catalog.=) (-5)::pg_catalog.int8) THEN
  PERFORM pg_catalog.set_config('lease.freed', '3', true); RETURN; END IF;
  PERFORM pg_catalog.set_config('lock_timeout',
  (SELECT (CASE WHEN l OPERATOR(pg_catalog.<) 900 THEN l ELSE 900 END)::pg_catalog.text
  FROM (SELECT CASE WHEN m OPERATOR(pg_catalog.<) 1 THEN 1 ELSE m END AS l
  FROM (SELECT d OPERATOR(pg_catalog.-) CASE WHEN d OPERATOR(pg_catalog./) 10
    OPERATOR(pg_catalog.>) 10 THEN d OPERATOR(pg_catalog./) 10 ELSE 10 END AS m
  FROM (SELECT (extract(epoch FROM pg_catalog.current_setting('deadlock_timeout')::pg_catalog.interval)
  OPERATOR(pg_catalog.*) 1000)::pg_catalog.int8 AS d) AS s) AS c) AS w), true);BEGIN PERFORM pg_catalog.pg_advisory_lock(-5);
  EXCEPTION WHEN lock_not_available THEN NULL; END;
  IF EXISTS (SELECT FROM pg_catalog.pg_locks WHERE locktype OPERATOR(pg_catalog.=) 'advisory'
  AND objsubid OPERATOR(pg_catalog.=) 1 AND granted AND mode OPERATOR(pg_catalog.<>) 'ShareLock'
  AND pid OPERATOR(pg_catalog.=) pg_catalog.pg_backend_pid()
  AND database OPERATOR(pg_catalog.=) (SELECT oid FROM pg_catalog.pg_database
  WHERE datname OPERATOR(pg_catalog.=) pg_catalog.current_database())
  AND ((classid::pg_catalog.int8 OPERATOR(pg_catalog.<<) 32) OPERATOR(pg_catalog.|) objid::pg_catalog.int8) OPERATOR(pg_catalog.=) (-5)::pg_catalog.int8) THEN
  PERFORM pg_catalog.set_config('lease.token', (72057594037927936::pg_catalog.int8 OPERATOR(pg_catalog.+) (extract(epoch FROM pg_catalog.clock_timestamp()) OPERATOR(pg_catalog.*) 1000000)::pg_catalog.int8)::pg_catalog.text, true);
  PERFORM pg_catalog.set_config('lease.freed', '1', true);
  ELSE PERFORM pg_catalog.set_config('lease.freed', '0', true); END IF;
  END$lease$;
SELECT 0::pg_catalog.int8, pg_catalog.pg_backend_pid()::pg_catalog.int8
UNION ALL
SELECT 2, (SELECT CASE WHEN s OPERATOR(pg_catalog.<>) '' THEN s::pg_catalog.int8 END
  FROM pg_catalog.current_setting('lease.nonce', true) AS s)
UNION ALL
SELECT 3, pg_catalog.current_setting('lease.freed')::pg_catalog.int8
UNION ALL
SELECT 4, (extract(epoch FROM pg_catalog.current_setting('deadlock_timeout')::pg_catalog.interval)
  OPERATOR(pg_catalog.*) 1000)::pg_catalog.int8
UNION ALL
SELECT 5, pg_catalog.current_setting('lease.token')::pg_catalog.int8
  WHERE pg_catalog.current_setting('lease.freed') OPERATOR(pg_catalog.=) '1';

-- Take { key: -9223372036854775808, timeout_ms: 1, crowd: None, backend_pid: 99, nonce: 3 }
DO $lease$BEGIN PERFORM pg_catalog.set_config('statement_timeout', '0', true);
  BEGIN PERFORM pg_catalog.set_config('client_connection_check_interval', '250', true);
  EXCEPTION WHEN OTHERS THEN NULL; END;
  BEGIN PERFORM pg_catalog.set_config('transaction_timeout', '0', true);
  EXCEPTION WHEN OTHERS THEN NULL; END; END$lease$;
DO $lease$BEGIN 
  IF pg_catalog.pg_backend_pid() OPERATOR(pg_catalog.<>) 99
  OR coalesce(pg_catalog.current_setting('lease.nonce', true)
    OPERATOR(pg_catalog.<>) '3', true) OR pg_catalog.pg_is_in_recovery() THEN
  PERFORM pg_catalog.set_config('lease.freed', '0', true); RETURN; END IF;
  IF EXISTS (SELECT FROM pg_catalog.pg_locks WHERE locktype OPERATOR(pg_catalog.=) 'advisory'
  AND objsubid OPERATOR(pg_catalog.=) 1 AND granted 
  AND pid OPERATOR(pg_catalog.=) pg_catalog.pg_backend_pid()
  AND database OPERATOR(pg_catalog.=) (SELECT oid FROM pg_catalog.pg_database
  WHERE datname OPERATOR(pg_catalog.=) pg_catalog.current_database())
  AND ((classid::pg_catalog.int8 OPERATOR(pg_catalog.<<) 32) OPERATOR(pg_catalog.|) objid::pg_catalog.int8) OPERATOR(pg_catalog.=) (-9223372036854775808)::pg_catalog.int8) THEN
  PERFORM pg_catalog.set_config('lease.freed', '3', true); RETURN; END IF;
  PERFORM pg_catalog.set_config('lock_timeout',
  (SELECT (CASE WHEN l OPERATOR(pg_catalog.<) 1 THEN l ELSE 1 END)::pg_catalog.text
  FROM (SELECT CASE WHEN m OPERATOR(pg_catalog.<) 1 THEN 1 ELSE m END AS l
  FROM (SELECT d OPERATOR(pg_catalog.-) CASE WHEN d OPERATOR(pg_catalog./) 10
    OPERATOR(pg_catalog.>) 10 THEN d OPERATOR(pg_catalog./) 10 ELSE 10 END AS m
  FROM (SELECT (extract(epoch FROM pg_catalog.current_setting('deadlock_timeout')::pg_catalog.interval)
  OPERATOR(pg_catalog.*) 1000)::pg_catalog.int8 AS d) AS s) AS c) AS w), true);BEGIN PERFORM pg_catalog.pg_advisory_lock(-9223372036854775808);
  EXCEPTION WHEN lock_not_available THEN NULL; END;
  IF EXISTS (SELECT FROM pg_catalog.pg_locks WHERE locktype OPERATOR(pg_catalog.=) 'advisory'
  AND objsubid OPERATOR(pg_catalog.=) 1 AND granted AND mode OPERATOR(pg_catalog.<>) 'ShareLock'
  AND pid OPERATOR(pg_catalog.=) pg_catalog.pg_backend_pid()
  AND database OPERATOR(pg_catalog.=) (SELECT oid FROM pg_catalog.pg_database
  WHERE datname OPERATOR(pg_catalog.=) pg_catalog.current_database())
  AND ((classid::pg_catalog.int8 OPERATOR(pg_catalog.<<) 32) OPERATOR(pg_catalog.|) objid::pg_catalog.int8) OPERATOR(pg_catalog.=) (-9223372036854775808)::pg_catalog.int8) THEN
  PERFORM pg_catalog.set_config('lease.token', (72057594037927936::pg_catalog.int8 OPERATOR(pg_catalog.+) (extract(epoch FROM pg_catalog.clock_timestamp()) OPERATOR(pg_catalog.*) 1000000)::pg_catalog.int8)::pg_catalog.text, true);
  PERFORM pg_catalog.set_config('lease.freed', '1', true);
  ELSE PERFORM pg_catalog.set_config('lease.freed', '0', true); END IF;
  END$lease$;
SELECT 0::pg_catalog.int8, pg_catalog.pg_backend_pid()::pg_catalog.int8
UNION ALL
SELECT 2, (SELECT CASE WHEN s OPERATOR(pg_catalog.<>) '' THEN s::pg_catalog.int8 END
  FROM pg_catalog.current_setting('lease.nonce', true) AS s)
UNION ALL
SELECT 3, pg_catalog.current_setting('lease.freed')::pg_catalog.int8
UNION ALL
SELECT 4, (extract(epoch FROM pg_catalog.current_setting('deadlock_timeout')::pg_catalog.interval)
  OPERATOR(pg_catalog.*) 1000)::pg_catalog.int8
UNION ALL
SELECT 5, pg_catalog.current_setting('lease.token')::pg_catalog.int8
  WHERE pg_catalog.current_setting('lease.freed') OPERATOR(pg_catalog.=) '1';

-- Release { keys: [-1, 2], notify: true, reserved: [] }
DO $lease$DECLARE t pg_catalog.int8[]; BEGIN
  SELECT pg_catalog.array_agg(CASE WHEN pg_catalog.pg_advisory_unlock(u.k)
    THEN c.t ELSE 0 END ORDER BY u.o)
  INTO t FROM pg_catalog.unnest('{-1,2}'::pg_catalog.int8[]) WITH ORDINALITY AS u(k, o),
    (SELECT 72057594037927936::pg_catalog.int8 OPERATOR(pg_catalog.+) (extract(epoch FROM pg_catalog.clock_timestamp()) OPERATOR(pg_catalog.*) 1000000)::pg_catalog.int8 AS t) AS c;
  PERFORM pg_catalog.pg_notify('lease_handover_v1', pg_catalog.concat(r.k, ' ', r.t,
    CASE WHEN v.k IS NULL THEN ' ' OPERATOR(pg_catalog.||) g.pid::pg_catalog.text
    ELSE pg_catalog.concat(' ', coalesce(g.pid, 0), ' ', v.p) END))
  FROM ROWS FROM (pg_catalog.unnest('{-1,2}'::pg_catalog.int8[]), pg_catalog.unnest(t)) AS r(k, t)
  LEFT JOIN (SELECT ((classid::pg_catalog.int8 OPERATOR(pg_catalog.<<) 32) OPERATOR(pg_catalog.|) objid::pg_catalog.int8) AS k, pid FROM pg_catalog.pg_locks
  WHERE locktype OPERATOR(pg_catalog.=) 'advisory'
  AND objsubid OPERATOR(pg_catalog.=) 1 AND granted
  AND database OPERATOR(pg_catalog.=) (SELECT oid FROM pg_catalog.pg_database
  WHERE datname OPERATOR(pg_catalog.=) pg_catalog.current_database()) AND mode OPERATOR(pg_catalog.<>) 'ShareLock'
    AND pid OPERATOR(pg_catalog.<>) pg_catalog.pg_backend_pid()) AS g
    ON g.k OPERATOR(pg_catalog.=) r.k
  LEFT JOIN (SELECT a.k, a.p FROM ROWS FROM (pg_catalog.unnest('{}'::pg_catalog.int8[]),
      pg_catalog.unnest('{}'::pg_catalog.int8[]), pg_catalog.unnest('{}'::pg_catalog.int8[])) AS a(k, p, q)
    WHERE EXISTS (SELECT FROM pg_catalog.pg_locks AS w WHERE w.locktype OPERATOR(pg_catalog.=) 'advisory'
  AND w.objsubid OPERATOR(pg_catalog.=) 1  AND w.pid OPERATOR(pg_catalog.=) a.p
  AND w.database OPERATOR(pg_catalog.=) (SELECT oid FROM pg_catalog.pg_database
  WHERE datname OPERATOR(pg_catalog.=) pg_catalog.current_database())
  AND ((w.classid::pg_catalog.int8 OPERATOR(pg_catalog.<<) 32)
    OPERATOR(pg_catalog.|) w.objid::pg_catalog.int8) OPERATOR(pg_catalog.=) a.k) OR (a.q OPERATOR(pg_catalog.=) 1 AND EXISTS (SELECT FROM
      pg_catalog.pg_stat_activity WHERE pid OPERATOR(pg_catalog.=) a.p))) AS v
    ON v.k OPERATOR(pg_catalog.=) r.k
  WHERE r.t OPERATOR(pg_catalog.>) 0;
  PERFORM pg_catalog.set_config('lease.released',
    coalesce(t, '{}')::pg_catalog.text, true);
  END$lease$;
SELECT r.k, (r.t OPERATOR(pg_catalog.>) 0)::pg_catalog.int4::pg_catalog.int8
  FROM ROWS FROM (pg_catalog.unnest('{-1,2}'::pg_catalog.int8[]), pg_catalog.unnest(
  pg_catalog.current_setting('lease.released')::pg_catalog.int8[])) AS r(k, t);

-- Release { keys: [-1, 2], notify: true, reserved: [(2, 77, 0), (-1, 78, 79)] }
DO $lease$DECLARE t pg_catalog.int8[]; BEGIN
  SELECT pg_catalog.array_agg(CASE WHEN pg_catalog.pg_advisory_unlock(u.k)
    THEN c.t ELSE 0 END ORDER BY u.o)
  INTO t FROM pg_catalog.unnest('{-1,2}'::pg_catalog.int8[]) WITH ORDINALITY AS u(k, o),
    (SELECT 72057594037927936::pg_catalog.int8 OPERATOR(pg_catalog.+) (extract(epoch FROM pg_catalog.clock_timestamp()) OPERATOR(pg_catalog.*) 1000000)::pg_catalog.int8 AS t) AS c;
  PERFORM pg_catalog.pg_notify('lease_handover_v1', pg_catalog.concat(r.k, ' ', r.t,
    CASE WHEN v.k IS NULL THEN ' ' OPERATOR(pg_catalog.||) g.pid::pg_catalog.text
    ELSE pg_catalog.concat(' ', coalesce(g.pid, 0), ' ', v.p) END))
  FROM ROWS FROM (pg_catalog.unnest('{-1,2}'::pg_catalog.int8[]), pg_catalog.unnest(t)) AS r(k, t)
  LEFT JOIN (SELECT ((classid::pg_catalog.int8 OPERATOR(pg_catalog.<<) 32) OPERATOR(pg_catalog.|) objid::pg_catalog.int8) AS k, pid FROM pg_catalog.pg_locks
  WHERE locktype OPERATOR(pg_catalog.=) 'advisory'
  AND objsubid OPERATOR(pg_catalog.=) 1 AND granted
  AND database OPERATOR(pg_catalog.=) (SELECT oid FROM pg_catalog.pg_database
  WHERE datname OPERATOR(pg_catalog.=) pg_catalog.current_database()) AND mode OPERATOR(pg_catalog.<>) 'ShareLock'
    AND pid OPERATOR(pg_catalog.<>) pg_catalog.pg_backend_pid()) AS g
    ON g.k OPERATOR(pg_catalog.=) r.k
  LEFT JOIN (SELECT a.k, a.p FROM ROWS FROM (pg_catalog.unnest('{2,-1}'::pg_catalog.int8[]),
      pg_catalog.unnest('{77,78}'::pg_catalog.int8[]), pg_catalog.unnest('{0,79}'::pg_catalog.int8[])) AS a(k, p, q)
    WHERE EXISTS (SELECT FROM pg_catalog.pg_locks AS w WHERE w.locktype OPERATOR(pg_catalog.=) 'advisory'
  AND w.objsubid OPERATOR(pg_catalog.=) 1  AND w.pid OPERATOR(pg_catalog.=) a.p
  AND w.database OPERATOR(pg_catalog.=) (SELECT oid FROM pg_catalog.pg_database
  WHERE datname OPERATOR(pg_catalog.=) pg_catalog.current_database())
  AND ((w.classid::pg_catalog.int8 OPERATOR(pg_catalog.<<) 32)
    OPERATOR(pg_catalog.|) w.objid::pg_catalog.int8) OPERATOR(pg_catalog.=) a.k) OR (a.q OPERATOR(pg_catalog.=) 1 AND EXISTS (SELECT FROM
      pg_catalog.pg_stat_activity WHERE pid OPERATOR(pg_catalog.=) a.p))) AS v
    ON v.k OPERATOR(pg_catalog.=) r.k
  WHERE r.t OPERATOR(pg_catalog.>) 0;
  PERFORM pg_catalog.set_config('lease.released',
    coalesce(t, '{}')::pg_catalog.text, true);
  END$lease$;
SELECT r.k, (r.t OPERATOR(pg_catalog.>) 0)::pg_catalog.int4::pg_catalog.int8
  FROM ROWS FROM (pg_catalog.unnest('{-1,2}'::pg_catalog.int8[]), pg_catalog.unnest(
  pg_catalog.current_setting('lease.released')::pg_catalog.int8[])) AS r(k, t);

-- Release { keys: [3], notify: false, reserved: [] }
SELECT k, pg_catalog.pg_advisory_unlock(k)::pg_catalog.int4::pg_catalog.int8
  FROM pg_catalog.unnest('{3}'::pg_catalog.int8[]) AS k;

-- Members { join: [7, 4294967295], leave: [9], groups: [7, 4294967295], keys: [-1, 2], notify: true, announce: [7], claims: [-3, 4] }
SELECT 4::pg_catalog.int8, c,
  pg_catalog.length(pg_catalog.concat(
  pg_catalog.pg_notify('lease_handover_v1',
  pg_catalog.concat('claim ', c, ' ', pg_catalog.pg_backend_pid()))))::pg_catalog.int8
  FROM pg_catalog.unnest('{-3,4}'::pg_catalog.int8[]) AS c;
SELECT 4::pg_catalog.int8, j::pg_catalog.int8,
  pg_catalog.length(pg_catalog.concat(pg_catalog.pg_notify('lease_handover_v1',
  pg_catalog.concat('group ', (j::pg_catalog.int8
  OPERATOR(pg_catalog.&) 4294967295)::pg_catalog.text))))::pg_catalog.int8
  FROM pg_catalog.unnest('{7}'::pg_catalog.int4[]) AS j;
SELECT 3::pg_catalog.int8, j::pg_catalog.int8,
  pg_catalog.length(pg_catalog.concat(pg_catalog.pg_try_advisory_lock(j,
  pg_catalog.pg_backend_pid()), pg_catalog.pg_notify('lease_handover_v1',
  pg_catalog.concat('group ', (j::pg_catalog.int8
  OPERATOR(pg_catalog.&) 4294967295)::pg_catalog.text))))::pg_catalog.int8
  FROM pg_catalog.unnest('{7,-1}'::pg_catalog.int4[]) AS j;
SELECT 4::pg_catalog.int8, j::pg_catalog.int8,
  pg_catalog.pg_advisory_unlock(j, pg_catalog.pg_backend_pid())
  ::pg_catalog.int4::pg_catalog.int8
  FROM pg_catalog.unnest('{9}'::pg_catalog.int4[]) AS j;
SELECT 0::pg_catalog.int8, pg_catalog.pg_backend_pid()::pg_catalog.int8,
  (SELECT CASE WHEN s OPERATOR(pg_catalog.<>) '' THEN s::pg_catalog.int8 END
  FROM pg_catalog.current_setting('lease.nonce', true) AS s)
UNION ALL
SELECT 1, m.classid::pg_catalog.int8, m.objid::pg_catalog.int8
  FROM pg_catalog.pg_locks AS m
  WHERE m.locktype OPERATOR(pg_catalog.=) 'advisory'
  AND m.objsubid OPERATOR(pg_catalog.=) 2 AND m.granted
  AND m.objid::pg_catalog.int8 OPERATOR(pg_catalog.=) m.pid::pg_catalog.int8
  AND m.database OPERATOR(pg_catalog.=) (SELECT oid FROM pg_catalog.pg_database
  WHERE datname OPERATOR(pg_catalog.=) pg_catalog.current_database())
  AND m.classid::pg_catalog.int8 OPERATOR(pg_catalog.=) ANY ('{7,4294967295}'::pg_catalog.int8[])
UNION ALL
SELECT 2, l.k, h.pid::pg_catalog.int8 FROM pg_catalog.unnest('{-1,2}'::pg_catalog.int8[]) AS l(k)
  LEFT JOIN (SELECT ((classid::pg_catalog.int8 OPERATOR(pg_catalog.<<) 32) OPERATOR(pg_catalog.|) objid::pg_catalog.int8) AS k, pid FROM pg_catalog.pg_locks
  WHERE locktype OPERATOR(pg_catalog.=) 'advisory'
  AND objsubid OPERATOR(pg_catalog.=) 1 AND granted
  AND database OPERATOR(pg_catalog.=) (SELECT oid FROM pg_catalog.pg_database
  WHERE datname OPERATOR(pg_catalog.=) pg_catalog.current_database())) AS h
  ON h.k OPERATOR(pg_catalog.=) l.k;

-- Prefer { key: -9223372036854775808, priority: 4294967295 }
SELECT 0::pg_catalog.int8, pg_catalog.pg_backend_pid()::pg_catalog.int8
  FROM (SELECT pg_catalog.pg_notify('lease_handover_v1', pg_catalog.concat(
    'prefer ', (-9223372036854775808)::pg_catalog.int8::pg_catalog.text, ' ',
    pg_catalog.pg_backend_pid()::pg_catalog.text, ' ',
    (4294967295)::pg_catalog.int8::pg_catalog.text))) AS n
UNION ALL SELECT 2, (SELECT CASE WHEN s OPERATOR(pg_catalog.<>) '' THEN s::pg_catalog.int8 END
  FROM pg_catalog.current_setting('lease.nonce', true) AS s);

-- CheckHandover { asks: [(5, 77), (-9223372036854775808, 78)] }
SELECT 0::pg_catalog.int8, pg_catalog.pg_backend_pid()::pg_catalog.int8
UNION ALL SELECT 2, (SELECT CASE WHEN s OPERATOR(pg_catalog.<>) '' THEN s::pg_catalog.int8 END
  FROM pg_catalog.current_setting('lease.nonce', true) AS s)
UNION ALL SELECT 6, (extract(epoch FROM pg_catalog.clock_timestamp()) OPERATOR(pg_catalog.*) 1000000)::pg_catalog.int8 UNION ALL SELECT 7, (c.o OPERATOR(pg_catalog.<<) 32) OPERATOR(pg_catalog.|) c.w
  FROM (SELECT a.o, a.w, pg_catalog.pg_notify('lease_handover_v1',
    pg_catalog.concat('to ', a.k, ' ', a.w))
  FROM (SELECT a.k, a.o, coalesce((SELECT a.p WHERE EXISTS (SELECT FROM pg_catalog.pg_locks AS w WHERE w.locktype OPERATOR(pg_catalog.=) 'advisory'
  AND w.objsubid OPERATOR(pg_catalog.=) 1 AND NOT w.granted AND w.pid OPERATOR(pg_catalog.=) a.p
  AND w.database OPERATOR(pg_catalog.=) (SELECT oid FROM pg_catalog.pg_database
  WHERE datname OPERATOR(pg_catalog.=) pg_catalog.current_database())
  AND ((w.classid::pg_catalog.int8 OPERATOR(pg_catalog.<<) 32)
    OPERATOR(pg_catalog.|) w.objid::pg_catalog.int8) OPERATOR(pg_catalog.=) a.k)), (SELECT w.pid::pg_catalog.int8
  FROM pg_catalog.pg_locks AS w JOIN pg_catalog.pg_stat_activity AS s
    ON s.pid OPERATOR(pg_catalog.=) w.pid
  WHERE w.locktype OPERATOR(pg_catalog.=) 'advisory'
  AND w.objsubid OPERATOR(pg_catalog.=) 1 AND NOT w.granted
  AND w.database OPERATOR(pg_catalog.=) (SELECT oid FROM pg_catalog.pg_database
  WHERE datname OPERATOR(pg_catalog.=) pg_catalog.current_database())
  AND ((w.classid::pg_catalog.int8 OPERATOR(pg_catalog.<<) 32)
    OPERATOR(pg_catalog.|) w.objid::pg_catalog.int8) OPERATOR(pg_catalog.=) a.k
  AND pg_catalog.starts_with(s.application_name,
    pg_catalog.concat('lease watch of ', a.p, ':')) LIMIT 1)) AS w FROM ROWS FROM (pg_catalog.unnest('{5,-9223372036854775808}'::pg_catalog.int8[]), pg_catalog.unnest('{77,78}'::pg_catalog.int8[])) WITH ORDINALITY AS a(k, p, o)) AS a
  WHERE a.w IS NOT NULL AND NOT EXISTS (SELECT FROM ROWS FROM (pg_catalog.unnest('{5,-9223372036854775808}'::pg_catalog.int8[]), pg_catalog.unnest('{77,78}'::pg_catalog.int8[])) WITH ORDINALITY AS b(k, p, o)
    WHERE b.k OPERATOR(pg_catalog.=) a.k AND b.o OPERATOR(pg_catalog.<) a.o
    AND coalesce((SELECT b.p WHERE EXISTS (SELECT FROM pg_catalog.pg_locks AS w WHERE w.locktype OPERATOR(pg_catalog.=) 'advisory'
  AND w.objsubid OPERATOR(pg_catalog.=) 1 AND NOT w.granted AND w.pid OPERATOR(pg_catalog.=) b.p
  AND w.database OPERATOR(pg_catalog.=) (SELECT oid FROM pg_catalog.pg_database
  WHERE datname OPERATOR(pg_catalog.=) pg_catalog.current_database())
  AND ((w.classid::pg_catalog.int8 OPERATOR(pg_catalog.<<) 32)
    OPERATOR(pg_catalog.|) w.objid::pg_catalog.int8) OPERATOR(pg_catalog.=) b.k)), (SELECT w.pid::pg_catalog.int8
  FROM pg_catalog.pg_locks AS w JOIN pg_catalog.pg_stat_activity AS s
    ON s.pid OPERATOR(pg_catalog.=) w.pid
  WHERE w.locktype OPERATOR(pg_catalog.=) 'advisory'
  AND w.objsubid OPERATOR(pg_catalog.=) 1 AND NOT w.granted
  AND w.database OPERATOR(pg_catalog.=) (SELECT oid FROM pg_catalog.pg_database
  WHERE datname OPERATOR(pg_catalog.=) pg_catalog.current_database())
  AND ((w.classid::pg_catalog.int8 OPERATOR(pg_catalog.<<) 32)
    OPERATOR(pg_catalog.|) w.objid::pg_catalog.int8) OPERATOR(pg_catalog.=) b.k
  AND pg_catalog.starts_with(s.application_name,
    pg_catalog.concat('lease watch of ', b.p, ':')) LIMIT 1)) IS NOT NULL)) AS c;

-- CheckHandover { asks: [] }
SELECT 0::pg_catalog.int8, pg_catalog.pg_backend_pid()::pg_catalog.int8
UNION ALL SELECT 2, (SELECT CASE WHEN s OPERATOR(pg_catalog.<>) '' THEN s::pg_catalog.int8 END
  FROM pg_catalog.current_setting('lease.nonce', true) AS s)
UNION ALL SELECT 6, (extract(epoch FROM pg_catalog.clock_timestamp()) OPERATOR(pg_catalog.*) 1000000)::pg_catalog.int8 UNION ALL SELECT 7, (c.o OPERATOR(pg_catalog.<<) 32) OPERATOR(pg_catalog.|) c.w
  FROM (SELECT a.o, a.w, pg_catalog.pg_notify('lease_handover_v1',
    pg_catalog.concat('to ', a.k, ' ', a.w))
  FROM (SELECT a.k, a.o, coalesce((SELECT a.p WHERE EXISTS (SELECT FROM pg_catalog.pg_locks AS w WHERE w.locktype OPERATOR(pg_catalog.=) 'advisory'
  AND w.objsubid OPERATOR(pg_catalog.=) 1 AND NOT w.granted AND w.pid OPERATOR(pg_catalog.=) a.p
  AND w.database OPERATOR(pg_catalog.=) (SELECT oid FROM pg_catalog.pg_database
  WHERE datname OPERATOR(pg_catalog.=) pg_catalog.current_database())
  AND ((w.classid::pg_catalog.int8 OPERATOR(pg_catalog.<<) 32)
    OPERATOR(pg_catalog.|) w.objid::pg_catalog.int8) OPERATOR(pg_catalog.=) a.k)), (SELECT w.pid::pg_catalog.int8
  FROM pg_catalog.pg_locks AS w JOIN pg_catalog.pg_stat_activity AS s
    ON s.pid OPERATOR(pg_catalog.=) w.pid
  WHERE w.locktype OPERATOR(pg_catalog.=) 'advisory'
  AND w.objsubid OPERATOR(pg_catalog.=) 1 AND NOT w.granted
  AND w.database OPERATOR(pg_catalog.=) (SELECT oid FROM pg_catalog.pg_database
  WHERE datname OPERATOR(pg_catalog.=) pg_catalog.current_database())
  AND ((w.classid::pg_catalog.int8 OPERATOR(pg_catalog.<<) 32)
    OPERATOR(pg_catalog.|) w.objid::pg_catalog.int8) OPERATOR(pg_catalog.=) a.k
  AND pg_catalog.starts_with(s.application_name,
    pg_catalog.concat('lease watch of ', a.p, ':')) LIMIT 1)) AS w FROM ROWS FROM (pg_catalog.unnest('{}'::pg_catalog.int8[]), pg_catalog.unnest('{}'::pg_catalog.int8[])) WITH ORDINALITY AS a(k, p, o)) AS a
  WHERE a.w IS NOT NULL AND NOT EXISTS (SELECT FROM ROWS FROM (pg_catalog.unnest('{}'::pg_catalog.int8[]), pg_catalog.unnest('{}'::pg_catalog.int8[])) WITH ORDINALITY AS b(k, p, o)
    WHERE b.k OPERATOR(pg_catalog.=) a.k AND b.o OPERATOR(pg_catalog.<) a.o
    AND coalesce((SELECT b.p WHERE EXISTS (SELECT FROM pg_catalog.pg_locks AS w WHERE w.locktype OPERATOR(pg_catalog.=) 'advisory'
  AND w.objsubid OPERATOR(pg_catalog.=) 1 AND NOT w.granted AND w.pid OPERATOR(pg_catalog.=) b.p
  AND w.database OPERATOR(pg_catalog.=) (SELECT oid FROM pg_catalog.pg_database
  WHERE datname OPERATOR(pg_catalog.=) pg_catalog.current_database())
  AND ((w.classid::pg_catalog.int8 OPERATOR(pg_catalog.<<) 32)
    OPERATOR(pg_catalog.|) w.objid::pg_catalog.int8) OPERATOR(pg_catalog.=) b.k)), (SELECT w.pid::pg_catalog.int8
  FROM pg_catalog.pg_locks AS w JOIN pg_catalog.pg_stat_activity AS s
    ON s.pid OPERATOR(pg_catalog.=) w.pid
  WHERE w.locktype OPERATOR(pg_catalog.=) 'advisory'
  AND w.objsubid OPERATOR(pg_catalog.=) 1 AND NOT w.granted
  AND w.database OPERATOR(pg_catalog.=) (SELECT oid FROM pg_catalog.pg_database
  WHERE datname OPERATOR(pg_catalog.=) pg_catalog.current_database())
  AND ((w.classid::pg_catalog.int8 OPERATOR(pg_catalog.<<) 32)
    OPERATOR(pg_catalog.|) w.objid::pg_catalog.int8) OPERATOR(pg_catalog.=) b.k
  AND pg_catalog.starts_with(s.application_name,
    pg_catalog.concat('lease watch of ', b.p, ':')) LIMIT 1)) IS NOT NULL)) AS c;

-- server::ADVISORY_KEY_SQL
SELECT ((classid::pg_catalog.int8 OPERATOR(pg_catalog.<<) 32) OPERATOR(pg_catalog.|) objid::pg_catalog.int8) FROM pg_catalog.pg_locks;

-- server::PRIMARY_TIMELINE_SQL
SELECT CASE WHEN pg_catalog.pg_is_in_recovery() THEN NULL
  ELSE pg_catalog.concat('x', pg_catalog.substr(pg_catalog.pg_walfile_name(
    pg_catalog.pg_current_wal_lsn()), 1, 8))::pg_catalog.bit(32)::pg_catalog.int8 END;

-- server::WAIT_PRELUDE_SQL
DO $lease$BEGIN PERFORM pg_catalog.set_config('statement_timeout', '0', true);
  BEGIN PERFORM pg_catalog.set_config('client_connection_check_interval', '250', true);
  EXCEPTION WHEN OTHERS THEN NULL; END;
  BEGIN PERFORM pg_catalog.set_config('transaction_timeout', '0', true);
  EXCEPTION WHEN OTHERS THEN NULL; END; END$lease$;;

-- inspect::holders_sql()
SELECT h.k AS key, h.pid, h.mode,
  a.application_name, pg_catalog.host(a.client_addr), a.client_port,
  pg_catalog.to_char((a.backend_start) AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'), pg_catalog.to_char((a.state_change) AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'), a.state, h.granted, pg_catalog.to_char((h.waitstart) AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')
  FROM (SELECT ((classid::pg_catalog.int8 OPERATOR(pg_catalog.<<) 32) OPERATOR(pg_catalog.|) objid::pg_catalog.int8) AS k, l.pid, l.mode, l.granted,
    (pg_catalog.to_jsonb(l) OPERATOR(pg_catalog.->>) 'waitstart')::pg_catalog.timestamptz
    AS waitstart FROM pg_catalog.pg_locks AS l
    WHERE l.locktype OPERATOR(pg_catalog.=) 'advisory' AND l.objsubid OPERATOR(pg_catalog.=) 1
    AND l.database OPERATOR(pg_catalog.=) (SELECT oid FROM pg_catalog.pg_database
  WHERE datname OPERATOR(pg_catalog.=) pg_catalog.current_database())) AS h
  LEFT JOIN pg_catalog.pg_stat_activity AS a ON a.pid OPERATOR(pg_catalog.=) h.pid
  ORDER BY h.k, h.granted DESC, h.waitstart NULLS FIRST, h.pid;

-- inspect::members_sql()
SELECT m.classid::pg_catalog.int8, m.pid, m.mode, a.application_name,
  pg_catalog.host(a.client_addr), a.client_port,
  pg_catalog.to_char((a.backend_start) AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'), pg_catalog.to_char((a.state_change) AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'), a.state, m.granted, NULL FROM pg_catalog.pg_locks AS m
  LEFT JOIN pg_catalog.pg_stat_activity AS a ON a.pid OPERATOR(pg_catalog.=) m.pid
  WHERE m.locktype OPERATOR(pg_catalog.=) 'advisory'
  AND m.objsubid OPERATOR(pg_catalog.=) 2 AND m.granted
  AND m.objid::pg_catalog.int8 OPERATOR(pg_catalog.=) m.pid::pg_catalog.int8
  AND m.database OPERATOR(pg_catalog.=) (SELECT oid FROM pg_catalog.pg_database
  WHERE datname OPERATOR(pg_catalog.=) pg_catalog.current_database())
  ORDER BY 1, a.backend_start, m.pid;

