SELECT * FROM models ORDER BY name
