-- A page's parts kept apart sent beside its rows' payloads (ADR 0160, amendment 3), for a reader
-- who reads them (a developer's whole replay): the client joins each part to its row
-- (`codec.events_from_columns`), where `events_page_counted` (migration 15, still there for a
-- replica running the previous version) splices them on the server with a CASE, casts, two
-- `length`s, `substr`s and `||` over each event's text. The first nine columns are
-- `events_page_shown`'s (the rows' payloads only); `apart_seqs` are the numbers of the events that
-- have a part, in order, and `aparts` their parts joined by `,` (NULL when none has one).
CREATE FUNCTION events_page_parts(p_run_id text, p_after bigint, p_last bigint)
RETURNS TABLE (
    n bigint, last_seq bigint, task_ids text, null_tasks bigint[], types text,
    stamps double precision[], payloads bytea, v_min smallint, v_max smallint,
    apart_seqs bigint[], aparts bytea
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
           min(page.v), max(page.v),
           array_agg(page.seq) FILTER (WHERE page.apart IS NOT NULL),
           convert_to(string_agg(page.apart::text, ',') FILTER (WHERE page.apart IS NOT NULL), 'UTF8')
    FROM (
        SELECT e.seq, e.task_id, e.type, e.ts, e.payload, e.v, e.apart FROM events e
        WHERE e.run_id = p_run_id AND e.seq > p_after AND e.seq <= p_last
        ORDER BY e.seq
    ) AS page;
END
$$;
