-- Rate-limit leases. An instance takes a slice of a key's current burst (1 s) and daily (UTC day)
-- windows at once and admits requests from it without writing; it comes back only when its slice is
-- spent or the window has moved on. The counters here are the tokens handed out to all instances, so
-- no window ever admits more than its limit across instances. Slices are 1% of the limit (at least
-- one), so a key with a small limit still counts every request here, exactly.
--
-- Called only from the access check (api-keys.repository.ts), when the instance holds no usable
-- tokens for a window it needs (wanted > 0). A request that one window refuses takes nothing from
-- the other, so requests refused by the burst limit do not use up the daily quota.
CREATE OR REPLACE FUNCTION api_key_usage_lease(
  p_key uuid,
  p_org uuid,
  p_burst_window bigint,
  p_burst_limit integer,
  p_burst_wanted integer,
  p_day_window integer,
  p_daily_limit integer,
  p_day_wanted integer
) RETURNS TABLE (burst_window bigint, burst_total integer, burst_granted integer, day_window integer, day_total integer, day_granted integer)
LANGUAGE plpgsql AS $$
DECLARE
  usage api_key_usage%ROWTYPE;
  burst_used integer;
  day_used integer;
  burst_free integer;
  day_free integer;
  admitted boolean;
BEGIN
  INSERT INTO api_key_usage AS u (api_key_id, org_id, burst_window, burst_count, day_window, day_count)
  VALUES (p_key, p_org, p_burst_window, 0, p_day_window, 0)
  ON CONFLICT (api_key_id) DO NOTHING;
  SELECT * INTO usage FROM api_key_usage AS u WHERE u.api_key_id = p_key FOR UPDATE;

  -- A statement that started a moment before another one committed may read an older clock: it
  -- counts in the newer window rather than resetting it.
  burst_window := greatest(usage.burst_window, p_burst_window);
  day_window := greatest(usage.day_window, p_day_window);
  burst_used := CASE WHEN usage.burst_window = burst_window THEN usage.burst_count ELSE 0 END;
  day_used := CASE WHEN usage.day_window = day_window THEN usage.day_count ELSE 0 END;
  burst_free := greatest(0, p_burst_limit - burst_used);
  day_free := greatest(0, p_daily_limit - day_used);
  admitted := (p_burst_wanted = 0 OR burst_free > 0) AND (p_day_wanted = 0 OR day_free > 0);
  burst_granted := CASE WHEN admitted THEN least(p_burst_wanted, burst_free) ELSE 0 END;
  day_granted := CASE WHEN admitted THEN least(p_day_wanted, day_free) ELSE 0 END;
  burst_total := burst_used + burst_granted;
  day_total := day_used + day_granted;

  UPDATE api_key_usage AS u
     SET burst_window = api_key_usage_lease.burst_window,
         burst_count = burst_total,
         day_window = api_key_usage_lease.day_window,
         day_count = day_total
   WHERE u.api_key_id = p_key;
  RETURN NEXT;
END;
$$;
