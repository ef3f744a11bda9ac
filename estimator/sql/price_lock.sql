-- Serializes price imports and inserts, so two importers compare against
-- the same table in effect and never both add the same change.
SELECT pg_advisory_xact_lock(hashtext('model_prices'))
