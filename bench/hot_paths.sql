-- The hot paths' reads of the two largest tables, at whatever size the schema's study has
-- (docs/SCALING.md, section 3): pages read and time, with a cold cache for the rows.
--   psql -h 127.0.0.1 -U postgres -d DB -c 'SET search_path = sizes_10000' -f bench/hot_paths.sql
SELECT 'a conversation''s turns (the history a turn reads)' AS path;
EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, SUMMARY ON)
SELECT id, seq, speaker, content, stance FROM turns
WHERE conversation_id = (SELECT max(id) / 2 FROM conversations) ORDER BY seq;
SELECT 'a participant''s reassurance-seeking messages (the monitors)' AS path;
EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, SUMMARY ON)
SELECT count(*) FROM turns WHERE participant_id = (SELECT max(id) / 2 FROM participants) AND reassurance_seeking;
SELECT 'deliveries due (the dispatcher''s claim)' AS path;
EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, SUMMARY ON)
SELECT id FROM deliveries WHERE status = 'pending' AND next_attempt_at <= now()
ORDER BY next_attempt_at LIMIT 500 FOR UPDATE SKIP LOCKED;
