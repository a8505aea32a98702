-- The ticket signing secret no longer lives in the database: anyone who could read the store
-- could forge an owner ticket with it. It is now kept in a 0600 file beside the database
-- (<file>.ticket_hmac.secret, see docs/adr/0006-ticket-secret.md). The old secret is not moved
-- but dropped: it may already have been read, so a new one is generated (tickets live 60 s, so
-- only tickets issued just before the upgrade stop working). secure_delete overwrites the freed
-- pages, so the old value does not linger in the file either.
PRAGMA secure_delete = ON;
DROP TABLE secrets;
