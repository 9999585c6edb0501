SELECT CASE WHEN pg_catalog.pg_is_in_recovery() THEN NULL
  ELSE pg_catalog.concat('x', pg_catalog.substr(pg_catalog.pg_walfile_name(
    pg_catalog.pg_current_wal_lsn()), 1, 8))::pg_catalog.bit(32)::pg_catalog.int8 END
