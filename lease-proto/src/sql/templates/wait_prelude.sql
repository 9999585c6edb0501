DO $lease$BEGIN PERFORM pg_catalog.set_config('statement_timeout', '0', true);
  BEGIN PERFORM pg_catalog.set_config('client_connection_check_interval', '250', true);
  EXCEPTION WHEN OTHERS THEN NULL; END;
  BEGIN PERFORM pg_catalog.set_config('transaction_timeout', '0', true);
  EXCEPTION WHEN OTHERS THEN NULL; END; END$lease$;
