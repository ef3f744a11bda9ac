# tokengate: `make help` lists the targets.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PG_IMAGE     ?= tc.local/postgres:15-bookworm
HA_IMAGE     ?= tc.local/patroni:15-bookworm
PG_CONTAINER ?= tokengate-pg
PG_VOLUME    ?= tokengate-pgdata
PG_PORT      ?= 55432
PG_PASSWORD  ?= tokengate
ADDR         ?= :8080
DATABASE_URL ?= postgres://tokengate:$(PG_PASSWORD)@localhost:$(PG_PORT)/tokengate?sslmode=disable
GO_TEST_FLAGS ?=

# testcontainers: the reaper image cannot be pulled here, and /.dockerenv
# would otherwise make it dial the bridge gateway instead of localhost.
export TESTCONTAINERS_RYUK_DISABLED   = true
export TESTCONTAINERS_HOST_OVERRIDE  ?= localhost
export PG_IMAGE HA_IMAGE

.PHONY: help
help: ## List the targets.
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  \033[36m%-12s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: pg-image
pg-image: ## Build the Postgres image from Debian packages (no registry); no-op if present.
	@if docker image inspect $(PG_IMAGE) >/dev/null 2>&1; then \
		echo "pg-image: $(PG_IMAGE) present"; \
	elif [[ "$(PG_IMAGE)" == tc.local/* ]]; then \
		integration/pgimage/build.sh $(PG_IMAGE); \
	else \
		docker pull $(PG_IMAGE); \
	fi

.PHONY: ha-image
ha-image: ## Build the Patroni + etcd image (Postgres 15 under Patroni 3.0, etcd 3.4) from Debian packages; no-op if present.
	@if docker image inspect $(HA_IMAGE) >/dev/null 2>&1; then \
		echo "ha-image: $(HA_IMAGE) present"; \
	elif [[ "$(HA_IMAGE)" == tc.local/* ]]; then \
		integration/haimage/build.sh $(HA_IMAGE); \
	else \
		docker pull $(HA_IMAGE); \
	fi

# The dashboard tests drive a real browser: Debian's chromium, headless, with
# a font so that pages render legible text. Installed with apt when missing.
CHROMIUM_PACKAGES ?= chromium fonts-dejavu-core

.PHONY: chromium
chromium: ## Install Debian's chromium (for the dashboard's browser tests) with apt; no-op if present.
	@if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || command -v google-chrome >/dev/null 2>&1; then \
		echo "chromium: present"; \
	else \
		sudo=""; [ "$$(id -u)" = 0 ] || sudo="sudo"; \
		echo "chromium: installing $(CHROMIUM_PACKAGES) with apt (about a minute, once)"; \
		$$sudo apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -qq --no-install-recommends $(CHROMIUM_PACKAGES) >/dev/null && \
		echo "chromium: installed $$(command -v chromium || command -v chromium-browser)"; \
	fi

.PHONY: build
build: ## Build bin/tokengate.
	go build -o bin/tokengate ./cmd/tokengate

IMAGE ?= tc.local/tokengate:latest

.PHONY: image
image: ## Build $(IMAGE) FROM scratch with a static binary (CGO_ENABLED=0); no registry needed.
	@tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && \
	CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o "$$tmp/tokengate" ./cmd/tokengate && \
	cp integration/image/Dockerfile "$$tmp/" && mkdir "$$tmp/spool" && \
	docker build -q -t $(IMAGE) "$$tmp" >/dev/null && echo "image: built $(IMAGE)"

.PHONY: db
db: pg-image ## Start (or reuse) the named Postgres container for `make run`; data lives in a named volume.
	@if [ -n "$$(docker ps -q --filter name=^/$(PG_CONTAINER)$$)" ]; then \
		echo "db: $(PG_CONTAINER) running"; \
	elif [ -n "$$(docker ps -aq --filter name=^/$(PG_CONTAINER)$$)" ]; then \
		docker start $(PG_CONTAINER) >/dev/null && echo "db: $(PG_CONTAINER) restarted"; \
	else \
		docker run -d --name $(PG_CONTAINER) --shm-size=1g -v $(PG_VOLUME):/var/lib/postgresql/data \
			-p 127.0.0.1:$(PG_PORT):5432 -e POSTGRES_USER=tokengate -e POSTGRES_PASSWORD=$(PG_PASSWORD) \
			-e POSTGRES_DB=tokengate $(PG_IMAGE) >/dev/null && echo "db: $(PG_CONTAINER) started"; \
	fi

.PHONY: run
run: db build ## Run tokengate on $(ADDR) against the local Postgres container.
	@export TOKENGATE_DATABASE_URL='$(DATABASE_URL)'; \
	bin/tokengate migrate --wait 60s && \
	bin/tokengate demo --addr '$(ADDR)' && \
	echo "tokengate: http://localhost$(ADDR) (Ctrl-C stops it; the database keeps running, \`make db-stop\` stops it)" && \
	exec bin/tokengate serve --addr '$(ADDR)'

.PHONY: db-stop
db-stop: ## Stop the `make run` Postgres container (its volume keeps the data).
	-docker stop $(PG_CONTAINER)

.PHONY: db-reset
db-reset: ## Remove the `make run` Postgres container and its volume.
	-docker rm -f $(PG_CONTAINER)
	-docker volume rm $(PG_VOLUME)

.PHONY: test
test: pg-image chromium ## Run unit and integration tests with -race against real Postgres and a real browser.
	go test -race -count=1 -timeout 15m $(GO_TEST_FLAGS) ./...

SOAK_SECONDS ?= 60
SOAK_SEED ?=
.PHONY: soak
soak: pg-image image ## A randomized workload over 3 replicas with faults, checked against a model (SOAK_SECONDS, SOAK_SEED).
	TOKENGATE_IMAGE=$(IMAGE) SOAK_SECONDS=$(SOAK_SECONDS) SOAK_SEED=$(SOAK_SEED) go test -tags cluster,soak -run '^TestSoak$$' -count=1 -v -timeout 0 ./integration/cluster/

.PHONY: soak-ha
soak-ha: ha-image image ## The soak on three Postgres under Patroni: the primary killed, restarted, switched over, checked by the same model (SOAK_SECONDS, SOAK_SEED).
	TOKENGATE_IMAGE=$(IMAGE) SOAK_SECONDS=$(SOAK_SECONDS) SOAK_SEED=$(SOAK_SEED) go test -tags cluster,soak -run '^TestSoakHA$$' -count=1 -v -timeout 0 ./integration/cluster/

FUZZ_TIME ?= 15s
.PHONY: fuzz
fuzz: pg-image ## Run every fuzz target for FUZZ_TIME each (default 15s): the API's and the proxy's bodies (OpenAI's and Anthropic's, Gemini's) on real servers, the estimator, the tokenizer.
	integration/fuzz.sh FuzzAPIBodies ./api/ $(FUZZ_TIME)
	integration/fuzz.sh FuzzProxyBodies ./api/proxy/ $(FUZZ_TIME)
	integration/fuzz.sh FuzzBatchBodies ./api/proxy/ $(FUZZ_TIME)
	integration/fuzz.sh FuzzGeminiBodies ./api/proxy/ $(FUZZ_TIME)
	integration/fuzz.sh FuzzEstimate ./estimator/ $(FUZZ_TIME)
	integration/fuzz.sh FuzzEmbeddings ./estimator/ $(FUZZ_TIME)
	integration/fuzz.sh FuzzEstimateMessages ./estimator/ $(FUZZ_TIME)
	integration/fuzz.sh FuzzCountText ./estimator/ $(FUZZ_TIME)
	integration/fuzz.sh FuzzPriceCost ./estimator/ $(FUZZ_TIME)
	integration/fuzz.sh FuzzPriceBookTier ./estimator/ $(FUZZ_TIME)

COMPOSE ?= $(shell docker compose version >/dev/null 2>&1 && echo "docker compose" || echo docker-compose)

.PHONY: run-cluster
run-cluster: pg-image image ## Postgres and three replicas (ports 8081-8083) with compose, in the foreground.
	$(COMPOSE) -f integration/cluster/compose.yaml -p tokengate-cluster up

.PHONY: cluster-down
cluster-down: ## Stop the run-cluster topology and remove its volumes.
	$(COMPOSE) -f integration/cluster/compose.yaml -p tokengate-cluster down -v

.PHONY: test-cluster
test-cluster: pg-image image ## Replicas as containers on one network: aggregate quota, Postgres paused and restarted, a replica killed.
	go test -tags cluster -race -count=1 -timeout 20m -v $(GO_TEST_FLAGS) ./integration/cluster/ 2>&1 | grep -E '^(=== RUN|--- |PASS|FAIL|ok|panic|\s+\S+_test.go)'; exit $${PIPESTATUS[0]}

.PHONY: run-ha
run-ha: ha-image image ## etcd, three Postgres nodes under Patroni and two replicas (ports 8091-8092) with compose, in the foreground.
	$(COMPOSE) -f integration/ha/compose.yaml -p tokengate-ha up

.PHONY: ha-down
ha-down: ## Stop the run-ha topology and remove its volumes.
	$(COMPOSE) -f integration/ha/compose.yaml -p tokengate-ha down -v

.PHONY: test-ha
test-ha: ha-image image ## Patroni failover under load: the primary killed, a switchover, the old primary rejoining, a read-only primary.
	go test -tags ha -race -count=1 -timeout 10m -v $(GO_TEST_FLAGS) ./integration/ha/ 2>&1 | grep -E '^(=== RUN|--- |PASS|FAIL|ok|panic|\s+\S+_test.go|\s+\{"time")'; exit $${PIPESTATUS[0]}

.PHONY: lint
lint: ## go vet, staticcheck and gofmt (the cluster tests too).
	go vet ./...
	go vet -tags cluster,soak ./integration/cluster/
	go vet -tags ha ./integration/ha/
	go tool staticcheck ./...
	go tool staticcheck -tags cluster,soak ./integration/cluster/
	go tool staticcheck -tags ha ./integration/ha/
	@out="$$(gofmt -l $$(git ls-files '*.go'))"; if [ -n "$$out" ]; then echo "gofmt:"; echo "$$out"; exit 1; fi

.PHONY: bench
bench: pg-image ## Benchmarks: estimator, and the reserve path against Postgres with durable commits.
	TOKENGATE_TEST_PG_DURABLE=1 go test -run '^$$' -bench . -benchtime 3s -count 1 ./estimator/ ./integration/

.PHONY: bench-proxy
bench-proxy: pg-image ## The OpenAI-compatible proxy's added latency (p50/p99) over a fast emulated upstream, durable commits.
	set -o pipefail; TOKENGATE_TEST_PG_DURABLE=1 go test -run '^$$' -bench BenchmarkProxyAddedLatency -benchtime 2000x -count 1 ./integration/ 2>&1 | grep -E '^(Benchmark|ok|FAIL|---)'

.PHONY: bench-compare
bench-compare: pg-image build ## tokengate over HTTP against pgbench's one-statement admission, on one durable Postgres, in one run (BENCH_SECONDS=15).
	integration/bench/compare.sh

.PHONY: bench-compare-lease
bench-compare-lease: pg-image build ## bench-compare with every tenant in lease mode auto (LEASE=auto): admissions from leases.
	LEASE=auto integration/bench/compare.sh

.PHONY: bench-faces
bench-faces: pg-image build ## The same load through the HTTP API and the rate limit service (gRPC) of one replica, in turns (ROUNDS=3, BENCH_SECONDS=15).
	integration/bench/faces.sh

.PHONY: bench-peer
bench-peer: pg-image build ## The rate limit service against envoyproxy/ratelimit on Redis (with and without fsync per write), same gRPC load, in turns (ROUNDS=2, BENCH_SECONDS=15).
	integration/bench/peer.sh

.PHONY: bench-peer-lease
bench-peer-lease: pg-image build ## bench-peer with every tenant in lease mode auto (LEASE=auto): the rate limit service's admissions from leases, its settles in the leases' journal.
	LEASE=auto integration/bench/peer.sh

.PHONY: bench-profile
bench-profile: pg-image build ## Where a decision's cost goes for one load of the rate limit service: Postgres statements, WAL, CPU and the server's pprof (LOAD=spread-settle, BENCH_SECONDS=15).
	integration/bench/profile.sh

.PHONY: bench-pgcost
bench-pgcost: pg-image build ## Postgres's CPU per part of a leased admission's writes, one part at a time on a quiet Postgres: transaction, journal insert by group size, ledger entries (PGCOST_GROUPS=400).
	integration/bench/pgcost.sh

.PHONY: demo-traffic
demo-traffic: build ## Drive the demo tenant past its limits for 60 s (TG_KEY=key from make run), to watch throttling on the dashboard.
	@test -n "$(TG_KEY)" || { echo "set TG_KEY to the demo key make run printed (or: bin/tokengate key create demo)"; exit 1; }
	bin/tokengate loadgen --url http://localhost$(ADDR) --key '$(TG_KEY)' --concurrency 16 --rate 60 --duration 60s

.PHONY: bench-ledger
bench-ledger: pg-image ## Load 10M ledger rows with generate_series; time a query, exports and a full verification (about 15 min).
	set -o pipefail; TOKENGATE_TEST_PG_DURABLE=1 go test -run '^$$' -bench BenchmarkLedgerScale -benchtime 1x -timeout 90m -v ./ledger/ 2>&1 | grep -Ev '^(20[0-9][0-9]/|  [A-Z])'
