SELECT count(*), coalesce(max(updated_at), 'epoch'::timestamptz) FROM models
