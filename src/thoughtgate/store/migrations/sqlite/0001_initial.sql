-- The event log and its records. JSON columns hold compact JSON text, written and read verbatim.

CREATE TABLE runs (
    run_id           TEXT PRIMARY KEY,
    prompt           TEXT NOT NULL,
    model            TEXT,
    chain_of_thought TEXT NOT NULL,
    worker_backend   TEXT NOT NULL,
    status           TEXT NOT NULL,
    created_at       REAL NOT NULL,
    updated_at       REAL NOT NULL,
    usage            TEXT NOT NULL,              -- JSON object
    error            TEXT,
    metadata         TEXT NOT NULL,              -- JSON object
    last_seq         INTEGER NOT NULL DEFAULT 0  -- highest event seq of the run; bumped by appends
);

CREATE TABLE tasks (
    run_id    TEXT NOT NULL,
    task_id   TEXT NOT NULL,
    idx       INTEGER NOT NULL,
    prompt    TEXT NOT NULL,
    status    TEXT NOT NULL,
    output    TEXT,
    reasoning TEXT,
    usage     TEXT NOT NULL,                     -- JSON object
    error     TEXT,
    model     TEXT,
    backend   TEXT,
    PRIMARY KEY (run_id, task_id)
);

-- Clustered by (run_id, seq): a replay is one contiguous range scan.
CREATE TABLE events (
    run_id  TEXT NOT NULL,
    seq     INTEGER NOT NULL,
    task_id TEXT,
    type    TEXT NOT NULL,
    ts      REAL NOT NULL,
    payload TEXT NOT NULL,                       -- JSON object
    PRIMARY KEY (run_id, seq)
) WITHOUT ROWID;

CREATE TABLE api_keys (
    key_id     TEXT PRIMARY KEY,
    name       TEXT NOT NULL,
    role       TEXT NOT NULL,
    key_hash   TEXT NOT NULL,
    created_at REAL NOT NULL,
    revoked_at REAL
);

CREATE TABLE secrets (
    name       TEXT PRIMARY KEY,
    value      TEXT NOT NULL,
    created_at REAL NOT NULL
);
