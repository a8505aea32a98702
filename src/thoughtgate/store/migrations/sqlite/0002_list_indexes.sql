-- Indexes for the list and lookup paths: newest runs first, and API-key checks on every request.

CREATE INDEX runs_by_created_at ON runs (created_at DESC);
CREATE INDEX active_api_keys_by_hash ON api_keys (key_hash) WHERE revoked_at IS NULL;
