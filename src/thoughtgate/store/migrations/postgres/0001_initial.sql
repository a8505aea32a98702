-- The event log and its records. Payload and record JSON use the `json` type (validated, stored as
-- the exact text we wrote: key order and number spelling survive, unlike `jsonb`).

CREATE TABLE runs (
    run_id           text PRIMARY KEY,
    prompt           text NOT NULL,
    model            text,
    chain_of_thought text NOT NULL,
    worker_backend   text NOT NULL,
    status           text NOT NULL,
    created_at       double precision NOT NULL,
    updated_at       double precision NOT NULL,
    usage            json NOT NULL,
    error            text,
    metadata         json NOT NULL,
    last_seq         bigint NOT NULL DEFAULT 0,  -- highest event seq; appends lock and bump it
    insert_order     bigint GENERATED ALWAYS AS IDENTITY  -- tie-break for runs created together
);

CREATE TABLE tasks (
    run_id    text NOT NULL,
    task_id   text NOT NULL,
    idx       integer NOT NULL,
    prompt    text NOT NULL,
    status    text NOT NULL,
    output    text,
    reasoning text,
    usage     json NOT NULL,
    error     text,
    model     text,
    backend   text,
    PRIMARY KEY (run_id, task_id)
);

CREATE TABLE events (
    run_id  text NOT NULL,
    seq     bigint NOT NULL,
    task_id text,
    type    text NOT NULL,
    ts      double precision NOT NULL,
    payload json NOT NULL,
    PRIMARY KEY (run_id, seq)
);

CREATE TABLE api_keys (
    key_id       text PRIMARY KEY,
    name         text NOT NULL,
    role         text NOT NULL,
    key_hash     text NOT NULL,
    created_at   double precision NOT NULL,
    revoked_at   double precision,
    insert_order bigint GENERATED ALWAYS AS IDENTITY
);

CREATE TABLE secrets (
    name       text PRIMARY KEY,
    value      text NOT NULL,
    created_at double precision NOT NULL
);
