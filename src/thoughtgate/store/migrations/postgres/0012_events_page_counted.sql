-- A replay page without the array of its sequence numbers (ADR 0127): `events_page` (migration
-- 7, ADR 0039) with `count(*)` and `max(seq)` in place of `array_agg(seq)`. The numbers are
-- unique (the primary key) and all in (p_after, p_last], so the page holds every one of
-- p_after + 1 .. p_after + n exactly when its largest is p_after + n: the client checks that
-- (codec.page_range), as SQLite's page already does (ADR 0037). A page with a gap fails it and is
-- read row by row. Building and sending the array cost about a tenth of a page (ADR 0123).
--
-- The other columns still come in the order the subquery gives them: an aggregate without a
-- join takes its input in the order of a sorted subquery beneath it, and this statement has one
-- plan (the primary key's index read in order, ADR 0039). Parallel plans are switched off too:
-- PostgreSQL 16 gave `string_agg` and `array_agg` a combine function, with which workers'
-- partial aggregates would be joined in the order they finish. A test reads the plan of this
-- body under these settings.
--
-- A new function beside `events_page`, not a replacement: a replica still running the previous
-- version keeps reading through `events_page` until it is restarted (ADR 0039's consequence).
CREATE FUNCTION events_page_counted(p_run_id text, p_after bigint, p_last bigint)
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
