SELECT clock_timestamp()
