SELECT count(*) FROM admissions WHERE id = $1
