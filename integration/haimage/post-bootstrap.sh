#!/bin/bash
# Patroni runs this once, on the node that initialised the cluster, with a
# connection string for the superuser as its argument: it creates the
# application's role and database (the replicas get them by cloning).
set -Eeuo pipefail
psql -v ON_ERROR_STOP=1 --dbname "$1" --set user="$HA_DB_USER" --set pw="$HA_DB_PASSWORD" --set db="$HA_DB" <<'SQL'
CREATE ROLE :"user" LOGIN PASSWORD :'pw';
CREATE DATABASE :"db" OWNER :"user";
SQL
