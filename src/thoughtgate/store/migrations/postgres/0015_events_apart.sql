-- Reasoning kept apart from the rest of an event (ADR 0160). `apart` holds, as a JSON object, the
-- top-level payload fields the declarations class as reasoning or trace
-- (`access.filter.stored_apart`: a turn's reasoning, its parts, sizes and error details, a
-- telemetry_only turn's `trace`, a task's `system`/`history`/`tools`), and the whole payload of a
-- `reasoning.delta`; `payload` keeps the rest (`{}` for a delta). NULL: nothing apart (most
-- events, and every row written before this version, whose payload stays whole). A long value is
-- TOASTed out of the row, and detoasted only by a query that reads the column.
ALTER TABLE events ADD COLUMN apart json;

-- `events_page_counted` (migration 12) now returns whole payloads, the row's object with the part
-- kept apart spliced in (`codec.PAYLOAD_SQL`): the same columns, so a replica still running the
-- previous version reads every event whole through it. (Its row-by-row fallback and its
-- lifecycle reads name `payload` only: until it is restarted, such a replica reads no reasoning
-- of the events the new version writes.)
CREATE OR REPLACE FUNCTION events_page_counted(p_run_id text, p_after bigint, p_last bigint)
RETURNS TABLE (
    n bigint, last_seq bigint, task_ids text, null_tasks bigint[], types text,
    stamps double precision[], payloads bytea, v_min smallint, v_max smallint
)
LANGUAGE plpgsql STABLE ROWS 1
SET enable_bitmapscan = off
SET enable_sort = off
SET max_parallel_workers_per_gather = 0
AS $$
BEGIN
    RETURN QUERY
    SELECT count(*),
           max(page.seq),
           string_agg(coalesce(page.task_id, ''), E'\x1f'),
           array_agg(page.seq) FILTER (WHERE page.task_id IS NULL),
           string_agg(page.type, E'\x1f'),
           array_agg(page.ts),
           convert_to(string_agg(page.payload, ','), 'UTF8'),
           min(page.v), max(page.v)
    FROM (
        SELECT e.seq, e.task_id, e.type, e.ts,
               CASE WHEN e.apart IS NULL THEN CAST(e.payload AS TEXT)
                    WHEN CAST(e.payload AS TEXT) = '{}' THEN CAST(e.apart AS TEXT)
                    ELSE substr(CAST(e.payload AS TEXT), 1, length(CAST(e.payload AS TEXT)) - 1)
                         || ',' || substr(CAST(e.apart AS TEXT), 2)
               END AS payload,
               e.v
        FROM events e
        WHERE e.run_id = p_run_id AND e.seq > p_after AND e.seq <= p_last
        ORDER BY e.seq
    ) AS page;
END
$$;

-- The page for a reader who may see nothing kept apart (`access.filter.reads_apart`): the row's
-- payload only, `apart` never read.
CREATE FUNCTION events_page_shown(p_run_id text, p_after bigint, p_last bigint)
RETURNS TABLE (
    n bigint, last_seq bigint, task_ids text, null_tasks bigint[], types text,
    stamps double precision[], payloads bytea, v_min smallint, v_max smallint
)
LANGUAGE plpgsql STABLE ROWS 1
SET enable_bitmapscan = off
SET enable_sort = off
SET max_parallel_workers_per_gather = 0
AS $$
BEGIN
    RETURN QUERY
    SELECT count(*),
           max(page.seq),
           string_agg(coalesce(page.task_id, ''), E'\x1f'),
           array_agg(page.seq) FILTER (WHERE page.task_id IS NULL),
           string_agg(page.type, E'\x1f'),
           array_agg(page.ts),
           convert_to(string_agg(page.payload::text, ','), 'UTF8'),
           min(page.v), max(page.v)
    FROM (
        SELECT e.seq, e.task_id, e.type, e.ts, e.payload, e.v FROM events e
        WHERE e.run_id = p_run_id AND e.seq > p_after AND e.seq <= p_last
        ORDER BY e.seq
    ) AS page;
END
$$;
