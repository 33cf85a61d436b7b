# One entry point for people and CI. Everything runs inside .venv, made on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEMO := build/demo

.PHONY: install test-deps demo demo-sharded demo-secure demo-offline test test-fast docs bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test,bench]'
	touch $(STAMP)

install: $(STAMP)

# The main job on the embedded default: the sample crawl through the live worker on a local Apache Kafka broker.
demo: $(STAMP)
	$(BIN)/python deploy/demo.py

# The same crawl through a sharded deployment (band tables split by key over 8 virtual shards in 2 processes, 2
# signing processes) on a local broker, checked record by record against the single worker on the same input.
demo-sharded: $(STAMP)
	$(BIN)/python deploy/demo_sharded.py

# The same, on a broker with TLS, SASL/SCRAM-SHA-512 and ACLs (deploy/kafka/start.sh --secure); the worker has only its ACLs.
demo-secure: $(STAMP)
	$(BIN)/python deploy/demo.py --secure

# The same crawl, offline: JSONL in, JSONL out, no broker.
demo-offline: $(STAMP)
	rm -rf $(DEMO)-offline && mkdir -p $(DEMO)-offline
	$(BIN)/streamdedup sample --out $(DEMO)-offline/crawl.jsonl
	$(BIN)/streamdedup dedup $(DEMO)-offline/crawl.jsonl --config config.toml --state $(DEMO)-offline/state \
		--out $(DEMO)-offline/clean.jsonl --decisions $(DEMO)-offline/decisions.jsonl

# System packages the tests drive, from Debian: chromium renders the report, prometheus and promtool
# scrape a worker and check the alert rules. Nothing happens once they are installed.
test-deps:
	deploy/report/install-chromium.sh
	deploy/prometheus/install.sh

# Every tier (docs/pages/contributing.md, "Tests"): the fast one, the system tests (processes: the command line, kills, packaging, a
# browser, Prometheus) and the broker tests (a local Apache Kafka). The slowest 25 are listed at the end.
test: $(STAMP) test-deps
	$(BIN)/python -m pytest --durations=25

# The fast tier: pure logic and real LMDB files, no broker, no other process (about a minute here).
test-fast: $(STAMP)
	$(BIN)/python -m pytest -m "not kafka and not system" --durations=10

# The documentation site (docs/pages, docs/mkdocs.yml) into build/docs; strict: a broken link or reference fails.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict -f docs/mkdocs.yml

# All benchmarks (not part of the tests): offline engine, live worker on a local broker, growth to 1M documents, the report.
bench: $(STAMP)
	$(BIN)/python -m bench.offline
	$(BIN)/python -m bench.live
	$(BIN)/python -m bench.growth
	$(BIN)/python -m bench.realtext --compare
	$(BIN)/python -m bench.report

clean:
	rm -rf build .pytest_cache
