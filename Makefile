# One entry point for people and CI. Everything runs inside .venv, made on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEMO := build/demo

.PHONY: install demo test bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test,bench]'
	touch $(STAMP)

install: $(STAMP)

# The main job on the embedded default: the sample crawl, deduplicated offline into an on-disk index.
demo: $(STAMP)
	rm -rf $(DEMO) && mkdir -p $(DEMO)
	$(BIN)/streamdedup sample --out $(DEMO)/crawl.jsonl
	$(BIN)/streamdedup dedup $(DEMO)/crawl.jsonl --config config.toml --state $(DEMO)/state \
		--out $(DEMO)/clean.jsonl --decisions $(DEMO)/decisions.jsonl
	$(BIN)/streamdedup stats --config config.toml --state $(DEMO)/state

test: $(STAMP)
	$(BIN)/python -m pytest

bench: $(STAMP)
	$(BIN)/python bench/offline.py

clean:
	rm -rf build .pytest_cache
