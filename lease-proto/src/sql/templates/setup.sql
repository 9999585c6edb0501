-- The first statement of every session (Statement::Setup): five statements
-- in one simple query. Rows are (tag, value); SetupReply reads them.

-- @setup
${checkpoint}
${history}
-- The settings first, in a statement of their own: the read-back below sees them.
SELECT ${setup.applied}::pg_catalog.int8, pg_catalog.length(pg_catalog.concat(
  pg_catalog.set_config('${nonce_setting}', '${nonce}', false)${settings}))::pg_catalog.int8;
-- pg_settings builds a row for every setting of the server (about 1 ms a
-- read on PostgreSQL 15): read once, for all.
WITH lease_settings AS (SELECT name, setting FROM pg_catalog.pg_settings
  WHERE name OPERATOR(pg_catalog.=) ANY ('{${setting_names}}'::pg_catalog.text[]))
SELECT ${setup.server_version}::pg_catalog.int8,
  pg_catalog.current_setting('server_version_num')::pg_catalog.int8
UNION ALL SELECT ${setup.in_recovery}, pg_catalog.pg_is_in_recovery()::pg_catalog.int4::pg_catalog.int8
UNION ALL SELECT ${setup.backend_pid}, pg_catalog.pg_backend_pid()::pg_catalog.int8
UNION ALL SELECT ${setup.idle_session_timeout_ms}, ${idle_session_timeout}
UNION ALL SELECT ${setup.unix_socket},
  (pg_catalog.inet_client_addr() IS NULL)::pg_catalog.int4::pg_catalog.int8
UNION ALL SELECT ${setup.nonce}, ${nonce_value}
UNION ALL SELECT ${setup.search_path}, (pg_catalog.current_setting('search_path')
  OPERATOR(pg_catalog.=) '${search_path}')::pg_catalog.int4::pg_catalog.int8
UNION ALL SELECT ${setup.server_clock_us}, ${server_clock_us}
${tcp_rows}
${promotion}

-- @set
-- One setting applied by the setup (the startup options could not carry it).
, pg_catalog.set_config('${name}', '${value}', false)

-- @setting
-- One setting's value, from the statement's one read of pg_settings.
(SELECT setting::pg_catalog.int8 FROM lease_settings
  WHERE name OPERATOR(pg_catalog.=) '${name}')

-- @tcp_row
UNION ALL SELECT ${tag}, ${setting}

-- @checkpoint
-- pg_control_checkpoint() into the checkpoint setting. PUBLIC may execute it
-- by default, but a DBA or a managed service may revoke that, and a function
-- the role may not execute fails the whole statement that names it: the DO
-- block catches insufficient_privilege and leaves the setting unset.
DO $lease$BEGIN PERFORM pg_catalog.set_config('${checkpoint_setting}',
  (SELECT pg_catalog.concat(c.timeline_id, ',', pg_catalog.floor(1000 OPERATOR(pg_catalog.*)
    pg_catalog.date_part('epoch', pg_catalog.clock_timestamp() OPERATOR(pg_catalog.-)
    c.checkpoint_time))::pg_catalog.int8)
  FROM pg_catalog.pg_control_checkpoint() c), true);
  EXCEPTION WHEN insufficient_privilege THEN NULL; END$lease$;

-- @history
-- The age (ms) of the current timeline's history file (0000000N.history,
-- listed by pg_ls_waldir(): superusers and pg_monitor only) into the history
-- setting; empty on timeline 1. insufficient_privilege leaves it unset, and
-- so does pg_current_wal_lsn() in recovery, where the setup refuses anyway.
DO $lease$BEGIN PERFORM pg_catalog.set_config('${history_setting}', COALESCE(
  (SELECT pg_catalog.floor(1000 OPERATOR(pg_catalog.*) pg_catalog.date_part('epoch',
    pg_catalog.clock_timestamp() OPERATOR(pg_catalog.-) w.modification))::pg_catalog.int8
    ::pg_catalog.text FROM pg_catalog.pg_ls_waldir() w
  WHERE w.name OPERATOR(pg_catalog.=) pg_catalog.concat(pg_catalog.substr(
    pg_catalog.pg_walfile_name(pg_catalog.pg_current_wal_lsn()), 1, 8), '.history')), ''),
  true);
  EXCEPTION WHEN insufficient_privilege OR object_not_in_prerequisite_state THEN NULL;
  END$lease$;

-- @promotion
-- What the server shows of a recent promotion (PromotionState): WAL received
-- or a transaction replayed since the server started; the current WAL
-- timeline (NULL in recovery, where pg_current_wal_lsn() errors); the latest
-- checkpoint's timeline and age; the history file's age.
UNION ALL SELECT ${setup.replayed_since_start}, (pg_catalog.pg_last_wal_receive_lsn() IS NOT NULL
  OR pg_catalog.pg_last_xact_replay_timestamp() IS NOT NULL)::pg_catalog.int4::pg_catalog.int8
UNION ALL SELECT ${setup.wal_timeline}, CASE WHEN pg_catalog.pg_is_in_recovery() THEN NULL
  ELSE pg_catalog.concat('x', pg_catalog.substr(pg_catalog.pg_walfile_name(
    pg_catalog.pg_current_wal_lsn()), 1, 8))::pg_catalog.bit(32)::pg_catalog.int8 END
UNION ALL SELECT ${setup.checkpoint_timeline}, ${checkpoint_timeline}
UNION ALL SELECT ${setup.checkpoint_age_ms}, ${checkpoint_age}
UNION ALL SELECT ${setup.history_age_ms}, (SELECT CASE WHEN s OPERATOR(pg_catalog.<>) ''
  THEN s::pg_catalog.int8 END FROM COALESCE(
  pg_catalog.current_setting('${history_setting}', true), '') AS s)

-- @checkpoint_field
-- Field n (1: timeline, 2: age) of the checkpoint setting as an int8, NULL
-- when it is unset or empty.
(SELECT CASE WHEN s OPERATOR(pg_catalog.<>) '' THEN s::pg_catalog.int8 END
  FROM pg_catalog.split_part(pg_catalog.current_setting('${checkpoint_setting}', true),
  ',', ${n}) AS s)
