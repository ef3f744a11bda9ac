DELETE FROM rejection_counts WHERE minute < clock_timestamp() - interval '1 day'
