-- leaseline watch postgres: the trigger that notifies the watcher of every
-- change to a lease table (name text primary key, holder text, token bigint,
-- expires_at timestamptz). Printed for a table by
-- `leaseline watch postgres --table T --print-install-sql`, or run by the
-- watcher at each connect with `--install`. Running it again replaces the
-- function and the trigger.
--
-- Each row change sends, after its transaction commits, a NOTIFY on the
-- channel {{channel}} whose payload is JSON:
--   op          how the grant the row held before the change ended, if it did:
--               'write'    nothing ended (an acquire of a free or lapsed row,
--                          a renewal, the removal of a lapsed row);
--               'release'  a live grant was deleted, or cleared (holder set to
--                          NULL, or expires_at set to now or earlier);
--               'revoke'   the same, in a transaction that set
--                          leaseline.revoke (SET LOCAL leaseline.revoke = 'on');
--               'takeover' a live grant replaced by another holder or token
--                          before its expires_at: only a forced acquire does it;
--   name        the lease;
--   token, expires_ms   the row after the change (null after a delete);
--   at_ms       clock_timestamp() of the change, Unix ms.
-- A name over 1,024 bytes (more than a lease event can carry) sends nothing,
-- so that no notification can fail and with it the client's transaction.
CREATE OR REPLACE FUNCTION {{function}}() RETURNS trigger
LANGUAGE plpgsql AS $leaseline$
DECLARE
  changed timestamptz := clock_timestamp();
  revoking boolean := coalesce(current_setting('leaseline.revoke', true), '')
                        NOT IN ('', 'off', 'false', '0');
  op text := 'write';
  lease text;
  token bigint;
  expires_ms bigint;
BEGIN
  IF TG_OP = 'DELETE' THEN
    lease := OLD.name;
  ELSE
    lease := NEW.name;
    token := NEW.token;
    expires_ms := floor(extract(epoch FROM NEW.expires_at) * 1000)::bigint;
  END IF;
  IF TG_OP <> 'INSERT' AND OLD.holder IS NOT NULL AND OLD.expires_at > changed THEN
    IF TG_OP = 'DELETE' OR NEW.name IS DISTINCT FROM OLD.name
       OR NEW.holder IS NULL OR NEW.expires_at IS NULL OR NEW.expires_at <= changed THEN
      op := CASE WHEN revoking THEN 'revoke' ELSE 'release' END;
    ELSIF NEW.holder IS DISTINCT FROM OLD.holder OR NEW.token IS DISTINCT FROM OLD.token THEN
      op := 'takeover';
    END IF;
  END IF;
  IF octet_length(lease) <= 1024 THEN
    PERFORM pg_notify({{channel}}, json_build_object(
      'op', op, 'name', lease, 'token', token, 'expires_ms', expires_ms,
      'at_ms', floor(extract(epoch FROM changed) * 1000)::bigint)::text);
  END IF;
  RETURN NULL;
END
$leaseline$;

DROP TRIGGER IF EXISTS leaseline_notify ON {{table}};
CREATE TRIGGER leaseline_notify
  AFTER INSERT OR UPDATE OR DELETE ON {{table}}
  FOR EACH ROW EXECUTE FUNCTION {{function}}();
