-- Durable runs (ADR 0010): what another process needs to execute a run, how often it was started,
-- whether it waits in a queue, and which key started it (per-key quotas).

CREATE TABLE run_specs (
    run_id     TEXT PRIMARY KEY,
    spec       TEXT NOT NULL,              -- JSON: tasks (prompt, model, system, history, worker), tools
    key_id     TEXT,                       -- the API key that started the run; NULL for local runs
    durable    INTEGER NOT NULL,           -- 1: executed as a durable workflow, so it can resume
    resume     TEXT NOT NULL,              -- 'queue': a replica with its tools resumes it; 'manual'
    queue      TEXT,                       -- the work queue of a 'queue' run
    attempts   INTEGER NOT NULL DEFAULT 0, -- executions started: 1 the first, more when resumed
    queued_at  REAL,                       -- set while the run waits for a replica to take it
    created_at REAL NOT NULL
);

-- Quotas count a key's open runs and its starts in the last minute.
CREATE INDEX run_specs_by_key ON run_specs (key_id, created_at) WHERE key_id IS NOT NULL;

-- The work queues replicas listen to, with the tools each has (a run goes to one that has all of
-- its tools); seen_at is refreshed while a replica lives.
CREATE TABLE run_queues (
    name        TEXT PRIMARY KEY,
    tools       TEXT NOT NULL,             -- JSON list of tool names
    concurrency INTEGER NOT NULL,
    seen_at     REAL NOT NULL
);
