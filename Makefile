# The two commands a new user needs (see README): `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run eval test setup system-deps perf-analyzer lint fmt clean fuzz soak

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ".[serve,export,dev,bench]"
	touch $(STAMP)

setup: $(STAMP)

# Main job: serve the shipped models on ONNX Runtime (CPU). The first run exports them into
# model_repository/ (about a minute); Ctrl-C / SIGTERM drains and stops the server.
run: $(STAMP)
	$(BIN)/attnserve serve --http-port 8080

# Held-out metrics of the shipped checkpoints (PyTorch).
eval: $(STAMP)
	$(BIN)/attnserve eval translator
	$(BIN)/attnserve eval vit
	$(BIN)/attnserve eval captioner

# Packages mypy checks in `make test` (all clean).
TYPED := serving contract export models benchmarks

test: $(STAMP) system-deps perf-analyzer
	$(BIN)/ruff check .
	$(BIN)/mypy $(TYPED)
	$(BIN)/python -m pytest -q -ra --durations=20

# Reliability (README "Reliability"): 12,000 fuzz cases over every RPC of a real server (random
# seeds, the hypothesis database in .hypothesis/ replays failures), then a 10-minute soak of the
# shipped models (mixed traffic; errors and server RSS growth after warm-up, JSON report).
FUZZ_EXAMPLES ?= 12000
SOAK_SECONDS ?= 600
NOW := $(shell date -u +%Y%m%dT%H%M%SZ)
fuzz: $(STAMP)
	ATTNSERVE_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) ATTNSERVE_FUZZ_SUMMARY=benchmarks/results/fuzz-$(NOW).json \
		$(BIN)/python -m pytest -q -s -p no:cacheprovider tests/reliability/fuzz

soak: $(STAMP)
	$(BIN)/python -m benchmarks.soak --duration $(SOAK_SECONDS) --warmup 120 \
		--out benchmarks/results/soak-$(NOW).json

# Debian tools some tests drive for real: docker-compose (validates docker-compose.yml),
# prometheus / promtool (checks the alert rules) and libb64 (perf_analyzer links it). Best effort:
# without root or apt-get those tests skip and say why.
SYSTEM_TOOLS := docker-compose promtool
SYSTEM_LIBS := libb64.so.0d
system-deps:
	@missing=""; for tool in $(SYSTEM_TOOLS); do command -v $$tool >/dev/null || missing="$$missing $$tool"; done; \
	for lib in $(SYSTEM_LIBS); do (ldconfig -p 2>/dev/null || /sbin/ldconfig -p) | grep -q $$lib || missing="$$missing $$lib"; done; \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "installing Debian packages for:$$missing"; \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker-compose prometheus libb64-0d >/dev/null) \
			|| echo "could not install docker-compose / prometheus / libb64-0d: their tests will skip"; \
	else echo "no root / apt-get: tests needing$$missing will skip"; fi

# Triton's perf_analyzer (tests/serving/kserve/test_perf_analyzer.py, `attnserve bench serve
# --perf-analyzer`): the binary ships in tritonclient 2.40.0, which cannot share the venv with the
# project's newer tritonclient, so it gets a folder of its own, with the CUDA runtime library it
# links (no GPU needed). Best effort: without it those tests skip and say why.
PERF_ANALYZER := $(VENV)/perf_analyzer
perf-analyzer: $(STAMP)
	@test -x $(PERF_ANALYZER)/bin/perf_analyzer || $(BIN)/pip install --quiet --no-deps \
		--target $(PERF_ANALYZER) tritonclient==2.40.0 nvidia-cuda-runtime-cu12==12.9.79 \
		|| echo "could not install perf_analyzer: its tests will skip"

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy $(TYPED)

fmt: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean:
	rm -rf $(VENV) build *.egg-info
