DELETE FROM rejection_counts WHERE minute < (SELECT clock_timestamp() - interval '1 day')
