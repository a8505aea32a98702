-- The run list's newest-first index, ascending (ADR 0117). Every list page orders by
-- `created_at DESC, rowid DESC`. Declared `DESC` (schema version 2), the index held its entries as
-- (created_at descending, rowid ascending), so SQLite could read the times in order but had to
-- sort each group of equal times again in a temporary b-tree ("USE TEMP B-TREE FOR RIGHT PART OF
-- ORDER BY"). Ascending, its entries are (created_at, rowid), and read backwards they come in
-- exactly the list's order: no sort. The same name, so nothing else changes; PostgreSQL's index
-- already holds both columns in the list's order.
--
-- Built from the rows already there inside the migration's transaction (the file's write lock
-- is held while it is built; once, at the first start of this version).

DROP INDEX runs_by_created_at;
CREATE INDEX runs_by_created_at ON runs (created_at);
