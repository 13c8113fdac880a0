# One install command, one test command (see README).
PY ?= python3
PIP = $(PY) -m pip
PINS_VENV ?= .venv-pins
VERL_VENV ?= .venv-verl
# verl's loss code runs on CPU; its package needs only these (ray is stubbed in the test, never called)
VERL_PKGS = verl==0.9.1 omegaconf hydra-core==1.3.8 antlr4-python3-runtime==4.9.3 tensordict==0.10.0 codetiming orjson cloudpickle pyvers

.PHONY: install demo test test-slow docs docs-shots test-pins test-verl test-verl-e2e lint figures bench mutation mutation-sample

install:
	$(PIP) install --quiet torch==2.13.0
	$(PIP) install --quiet -e ".[dev,llm]"

# the main job: check every theorem of the paper and write figures/paper/theorem_report.{md,json}
demo: install
	$(PY) -m sims.verify_theorems

test: install
	# AReaL's own M2PO functions, the oracle of m2po (tests/test_weighted_off_policy.py reads them from the installed
	# file and runs them with torch alone; its dependencies, which pin an older torch, are not needed and not installed)
	$(PIP) install --quiet --no-deps areal==1.0.4
	$(PY) -m ruff check .
	$(PY) -m pytest atr_theory tests -m "not slow"
	SITE=$$(mktemp -d) && $(PY) -m mkdocs build --strict --site-dir $$SITE && $(PY) -m tools.check_site $$SITE \
		&& $(PY) -m tools.site_layout $$SITE --if-browser  # no code block or table wider than its column at 1280 px

# the tests marked slow (end-to-end runs, killed-and-resumed runs, long compilations): CI runs them after make test
test-slow: install
	$(PY) -m pytest atr_theory tests -m slow

# the documentation site (docs/, mkdocs.yml) into site/; `mkdocs serve` to browse it
docs:
	$(PY) -m mkdocs build --strict

# screenshots of every page of the built site (headless Chromium, Debian's `chromium` package) into site-shots/, to
# look at by eye; not run in CI
docs-shots: docs
	$(PY) -m tools.docs_shots site site-shots

# the trainer tests again, with the trl/transformers/datasets versions unsloth pins (ci/unsloth-pins.txt)
test-pins:
	$(PY) -m venv $(PINS_VENV)
	$(PINS_VENV)/bin/python -m pip install --quiet torch==2.13.0
	$(PINS_VENV)/bin/python -m pip install --quiet -e ".[dev,llm]" -c ci/unsloth-pins.txt
	$(PINS_VENV)/bin/python -m pip install --quiet --no-deps unsloth_zoo==2026.10.9  # its GRPO scorer runs on CPU
	$(PINS_VENV)/bin/python -c "import trl, transformers, datasets; print('pinned:', trl.__version__, transformers.__version__, datasets.__version__)"
	UNSLOTH_ZOO_DISABLE_GPU_INIT=1 $(PINS_VENV)/bin/python -m pytest tests/test_llm.py tests/test_data.py tests/test_rewards.py tests/test_trl_options.py tests/test_trl_log_history.py tests/test_trainer_topk.py tests/test_trainer_full_distribution.py tests/test_loss.py tests/test_loss_refusals.py tests/test_unsloth_backend.py tests/test_compat.py tests/test_fast_generation.py -q -p no:cacheprovider

# verl 0.9.1's own policy losses as the oracle of atr_theory.policy_loss (tests/test_verl_oracle.py) and of the
# verl plugin (tests/test_verl_plugin.py)
# The verl venv sees this interpreter's packages (torch, pytest, this package) after its own: a .pth line adds this
# interpreter's site directories with site.addsitedir, which works from an active virtual environment too (venv's
# --system-site-packages would show the base interpreter's packages instead of the active environment's)
test-verl:
	$(PY) -m venv $(VERL_VENV)
	$(PY) -c "import site; print('import site; ' + '; '.join(f'site.addsitedir({d!r})' for d in site.getsitepackages()))" \
		> "$$($(VERL_VENV)/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/parent-environment.pth"
	$(VERL_VENV)/bin/python -m pip install --quiet --no-deps $(VERL_PKGS)
	$(VERL_VENV)/bin/python -m pytest tests/test_verl_oracle.py tests/test_verl_plugin.py -q -p no:cacheprovider

# verl itself on a CPU: python -m verl.trainer.main_ppo with Ray, legacy and v1 trainers (tests/test_verl_e2e.py, ~6 min)
# Its own virtualenv over this interpreter's packages (as test-verl): verl 0.9.1 and what its trainer imports, with
# TRL at the version verl pins (its FSDP engine imports trl.AutoModelForCausalLMWithValueHead, gone in TRL 1.x) and
# verl's transformers pin overridden by this interpreter's transformers
VERL_E2E_VENV ?= .venv-verl-e2e
VERL_E2E_NODEPS = verl==0.9.1 tensordict==0.10.0 pyvers torchdata==0.11.0 trl==0.27.0
VERL_E2E_PKGS = ray==2.52.0 transferqueue==0.1.11 hydra-core==1.3.8 omegaconf antlr4-python3-runtime==4.9.3 codetiming orjson \
	cloudpickle cachetools fastapi uvicorn dill pylatexenc msgspec pyzmq
test-verl-e2e:
	$(PY) -m venv $(VERL_E2E_VENV)
	$(PY) -c "import site; print('import site; ' + '; '.join(f'site.addsitedir({d!r})' for d in site.getsitepackages()))" \
		> "$$($(VERL_E2E_VENV)/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/parent-environment.pth"
	$(VERL_E2E_VENV)/bin/python -m pip install --quiet --no-deps $(VERL_E2E_NODEPS)
	$(VERL_E2E_VENV)/bin/python -m pip install --quiet $(VERL_E2E_PKGS)  # pip reports verl's transformers pin unmet; exit 0
	$(VERL_E2E_VENV)/bin/python -c "import verl, ray, trl, transformers; print('verl', verl.__version__, 'ray', ray.__version__, 'trl', trl.__version__, 'transformers', transformers.__version__)"
	$(VERL_E2E_VENV)/bin/python -m pytest tests/test_verl_e2e.py -q -p no:cacheprovider

figures: install
	for s in verify_theorems clip_ranges trust_regions gradient_weights entropy_diff bandit_training delta_sweep range_form contextual_bandit; do $(PY) -m sims.$$s || exit 1; done

bench: install
	$(PY) -m benchmarks.loss_overhead
	$(PY) -m benchmarks.bandit_throughput
	$(PY) -m benchmarks.trainer_step
	$(PY) -m benchmarks.decode_attention --generate-layers 2

# mutation testing of methods / registry / loss / ranges / divergence ([tool.mutmut] in pyproject.toml); hours on 2 cores
mutation:
	$(PIP) install --quiet mutmut==3.8.1
	rm -rf mutants figures/tools/mutation/mutation_fresh_process.txt  # fresh verdicts (the script keeps those in its --out)
	$(PY) -m mutmut run --max-children $$(nproc)
	$(PY) -m mutmut results --all true > figures/tools/mutation/mutation_results.txt || true
	# mutants of code that runs at import time, which mutmut cannot switch on: each judged in a fresh interpreter
	$(PY) -m tools.mutation_fresh_process --out figures/tools/mutation/mutation_fresh_process.txt

# an estimate of the score from a uniform sample of 100 mutants, each judged in a fresh interpreter (~1 h on 1 core)
# `make mutation-sample SEED=1` draws another sample (figures/tools/mutation/mutation_sample_seed1.txt)
SEED ?= 0
SAMPLE_OUT = figures/tools/mutation/mutation_sample$(if $(filter-out 0,$(SEED)),_seed$(SEED),).txt
mutation-sample:
	$(PIP) install --quiet mutmut==3.8.1
	rm -rf mutants $(SAMPLE_OUT)
	$(PY) -m tools.mutation_fresh_process --generate --sample 100 --seed $(SEED) --out $(SAMPLE_OUT)
