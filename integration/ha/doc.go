// Package ha tests tokengate on a highly available Postgres: three Postgres
// 15 nodes under Patroni 3.0 in synchronous mode, with etcd 3.4 holding the
// leader key, and two tokengate replicas that reach them through a
// multi-host URL (target_session_attrs=read-write). Every part is a container
// on one Docker network: the nodes and etcd from the tc.local/patroni image
// (`make ha-image`), the replicas from tc.local/tokengate (`make image`). The
// tests kill the primary under load, switch it over, and bring an old primary
// back; they run with `make test-ha` (build tag ha).
package ha
