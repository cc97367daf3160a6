# nsqworker developer entry points. `make test` and `make run` need only
# python3 >= 3.11 and Go 1.21+ (or nsqd/nsqlookupd v1.3.0 on PATH); the deploy
# tests need Go 1.26+ for helm, etcd and kube-apiserver (skipped without them).
SHELL := bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := test

UV_VERSION := 0.13.9
UV := .tools/uv/bin/uv
UV_STAMP := .tools/uv/.uv-$(UV_VERSION)
VENV_STAMP := .venv/.synced
EXTRAS := --extra dev --extra snappy --extra uvloop --extra spark --extra kubernetes --extra reload --extra nats --extra rabbitmq --extra postgres --extra console
PYTEST_ARGS ?=
# Processes running the tests (pytest-xdist), one test file each at a time: most tests
# wait on servers, so three keep two cores busy. 0 runs them in this process (-s, --pdb).
PYTEST_WORKERS ?= 3
RUN_ARGS ?=

# uv uses the local python3 and never downloads an interpreter.
export UV_PYTHON := python3
export UV_PYTHON_DOWNLOADS := never
export UV_PROJECT_ENVIRONMENT := $(CURDIR)/.venv
unexport VIRTUAL_ENV

# The NSQ binaries built by `make tools` come first for every recipe.
export PATH := $(CURDIR)/.tools/bin:$(PATH)
LINT_DIRS := $(wildcard nsqworker tests bench examples)

.PHONY: venv tools tools-nsq test lint bench soak run run-spark clean lock image screenshots

$(UV_STAMP): scripts/bootstrap-uv
	@scripts/bootstrap-uv $(UV_VERSION)
	@touch $@

# Re-syncs when uv.lock or pyproject.toml change, and after .venv was deleted.
$(VENV_STAMP): pyproject.toml uv.lock $(UV_STAMP)
	$(UV) sync --frozen $(EXTRAS)
	@touch $@

venv: $(VENV_STAMP)

# Re-resolve uv.lock after editing dependencies in pyproject.toml.
lock: $(UV_STAMP)
	$(UV) lock

# NSQ, then helm, etcd and kube-apiserver (a first build: about 12 min on 2 cores).
tools:
	@scripts/install-tools

# NSQ only: what `make run` and `make bench` need.
tools-nsq:
	@scripts/install-tools nsq

# The image of the root Dockerfile, built with podman (scripts/build-image) on the local
# Debian python base `scripts/install-tools image` makes: docs/kubernetes.md, The image.
IMAGE ?= nsqworker:$(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
# The Spark job image (deploy/spark/Dockerfile: a JRE and pyspark at uv.lock's versions)
# for the driver and executor pods of Spark on Kubernetes: docs/spark.md, The job image.
SPARK_IMAGE ?= nsqworker-spark:$(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
lock_version = $(shell sed -n '/^name = "$(1)"$$/{n;s/^version = "\(.*\)"/\1/p;}' uv.lock)
image:
	@scripts/install-tools image
	scripts/build-image $(IMAGE)
	scripts/build-image $(SPARK_IMAGE) -f deploy/spark/Dockerfile \
		--build-arg PYSPARK_VERSION=$(call lock_version,pyspark) \
		--build-arg PY4J_VERSION=$(call lock_version,py4j) deploy/spark

test: venv tools
	.venv/bin/pytest -n $(PYTEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

lint: venv
	.venv/bin/ruff check $(LINT_DIRS)
	.venv/bin/ruff format --check $(LINT_DIRS)
	.venv/bin/mypy nsqworker bench
	.venv/bin/hadolint Dockerfile examples/docker/Dockerfile deploy/spark/Dockerfile

# The sections of docs/benchmarks.md (NATS among them: nats-server is installed too), then
# RPC (bench/rpc.py), schedules (bench/schedules.py), the console (bench/console.py) and
# Spark (bench/spark.py), which print their own tables (docs/rpc.md, docs/schedules.md,
# docs/operations.md and docs/spark.md explain them).
bench: venv tools-nsq
	@scripts/install-tools nats
	.venv/bin/python -m bench
	.venv/bin/python -m bench.rpc
	.venv/bin/python -m bench.schedules
	.venv/bin/python -m bench.console
	@scripts/install-tools spark
	.venv/bin/python -m bench.spark

# docs/console-*.png: the console's browser test on nsqd, writing its screenshots to docs/.
screenshots: venv tools-nsq
	@scripts/install-tools browser
	NSQWORKER_SCREENSHOTS=$(CURDIR)/docs .venv/bin/pytest -q "tests/e2e/test_console_browser.py::test_the_console_in_a_browser[nsq]"

# Not part of `make test`: nsqworker run for SOAK_MINUTES while nsqd restart and workers
# are killed; writes its figures and plot under .run/soak/ (SOAK_DOC=1: into
# docs/reliability.md and docs/soak.png, to publish the run).
# TRANSPORT=nats or rabbitmq-stream soaks that broker instead of NSQ.
SOAK_MINUTES ?= 30
SOAK_DOC ?=
TRANSPORT ?= nsq
soak: venv tools-nsq
	@case "$(TRANSPORT)" in nats) scripts/install-tools nats;; rabbitmq-stream) scripts/install-tools rabbitmq;; esac
	SOAK_MINUTES=$(SOAK_MINUTES) TRANSPORT=$(TRANSPORT) SOAK_DOC=$(SOAK_DOC) .venv/bin/python -m bench.soak

run: venv tools-nsq
	.venv/bin/python scripts/run-local $(RUN_ARGS)

# The Spark example end to end: nsqd, a worker with the local runner, three batches;
# then the same with a Spark session in the worker, the job times side by side; then the
# streaming job (JetStream into Parquet), its rows and rate.
run-spark: venv tools-nsq
	@scripts/install-tools nats spark
	.venv/bin/python -m examples.spark_pipeline.run

clean:
	rm -rf .run
