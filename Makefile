# The two commands a new user needs (see README): `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run eval test setup lint fmt clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ".[serve,export,dev]"
	touch $(STAMP)

setup: $(STAMP)

# Main job: serve the shipped models on ONNX Runtime (CPU). The first run exports them into
# model_repository/ (about a minute); Ctrl-C / SIGTERM drains and stops the server.
run: $(STAMP)
	$(BIN)/attnserve serve

# Held-out metrics of the shipped checkpoints (PyTorch).
eval: $(STAMP)
	$(BIN)/attnserve eval translator
	$(BIN)/attnserve eval vit
	$(BIN)/attnserve eval captioner

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q -ra

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

fmt: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean:
	rm -rf $(VENV) build *.egg-info
