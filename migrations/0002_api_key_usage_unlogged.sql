-- Rate-limit counters are rewritten on every request. As an unlogged table they cost no WAL and no
-- fsync per request; a crash resets the current windows, which only forgives a few requests.
ALTER TABLE api_key_usage SET UNLOGGED;
