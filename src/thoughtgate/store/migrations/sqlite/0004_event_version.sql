-- The vocabulary version each event's payload was written in. Rows from before this migration
-- were written in version 0 (camelCase tool keys); readers upgrade them as they read them.

ALTER TABLE events ADD COLUMN v INTEGER NOT NULL DEFAULT 0;
