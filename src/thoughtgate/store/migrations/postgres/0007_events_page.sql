-- A replay page (ADR 0039): the events of one run numbered in (p_after, p_last], as one row of
-- columns in number order (store/postgres.py, codec.events_from_columns).
--
-- A function so that its plan does not depend on the table's statistics: with bitmap scans and
-- sorts switched off for this statement alone, the one sensible plan is the primary key's index
-- scanned in order. On a table never analyzed (a new schema, or a burst of appends before
-- autovacuum gets to it) the planner otherwise takes a bitmap heap scan and a sort.
--
-- Task ids and types come as two texts joined by the unit separator (U+001F), not as arrays: an
-- array of texts costs the server about a microsecond a value to build and send and the client
-- about 90 ns to load, a joined text one copy. A NULL task id is sent as '' and its sequence
-- number listed in null_tasks. The client splits the texts and checks that each has one value
-- per event: a value holding the separator (or a page out of order) makes it read the rows.
CREATE FUNCTION events_page(p_run_id text, p_after bigint, p_last bigint)
RETURNS TABLE (
    seqs bigint[], task_ids text, null_tasks bigint[], types text,
    stamps double precision[], payloads bytea, v_min smallint, v_max smallint
)
LANGUAGE plpgsql STABLE ROWS 1
SET enable_bitmapscan = off
SET enable_sort = off
AS $$
BEGIN
    RETURN QUERY
    SELECT array_agg(page.seq),
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
