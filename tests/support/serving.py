"""A real `blazar serve` for a test module: a home with the real engine installed and the real Gemma imported, the
given settings, a free port; stopped with SIGTERM (then SIGKILL) at the end."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

from tests.support import cli_zygote
from tests.support.blazar_home import home_paths
from tests.support.daemon import free_port, healthy, start_serve, wait_for
from tests.support.homes import configure_all, model_home


def blazar_cli(home: Path, *args: str, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess:
    """The real `blazar ARGS` on `home` (through tests/support/cli_zygote.py: a forked child, not a fresh import)."""
    env = {**os.environ, "BLAZAR_HOME": str(home), "NO_COLOR": "1", "COLUMNS": "200"}
    if not cli_zygote.enabled():
        return subprocess.run([sys.executable, "-m", "blazar.cli.main", *args], env=env, capture_output=True,
                              text=True, timeout=timeout, check=check)
    done = cli_zygote.run(list(args), env=env, timeout=timeout)
    if check:
        done.check_returncode()
    return done


# ChatML as a Jinja text: what llama-server used for the demo GGUF (it has no template) before Blazar gave a GGUF
# without one its architecture's template. The dialect tests were written against it: under Gemma's turns the base
# model pads grammar-bound JSON with whitespace and runs out of tokens (tests/integration/test_first_answer.py covers
# the architecture template itself).
CHATML = ("{%- for m in messages -%}{{ '<|im_start|>' + m['role'] + '\\n' + (m['content'] or '') + '<|im_end|>\\n' }}"
          "{%- endfor -%}{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}")


@contextlib.contextmanager
def serving_gemma(home: Path, engine_binary: Path, gemma_path: Path, model: str,
                  settings: dict[str, object], output: Path | None = None, *,
                  template: str | None = CHATML, mmproj: Path | None = None,
                  before_serve: Callable[[Path], None] | None = None, probed: bool = True
                  ) -> Iterator[tuple[int, subprocess.Popen]]:
    """`output`: a file the daemon's stdout and stderr both go to (granian writes its own lines to stdout).
    `template`: a Jinja text the model is served with; None serves it as Blazar serves an imported GGUF.
    `mmproj`: a projector imported with the model (`blazar import --mmproj`: tests/support/tiny_mmproj.py).
    `before_serve`: called with the home once it is set up, before the daemon starts (to record a profile...).
    `probed`: the model's template probe already recorded (tests/support/homes.py); False: its first load probes."""
    if home_paths(home).db.exists():  # a home the test began itself: set up in it, through the CLI
        blazar_cli(home, "engine", "install", "--path", str(engine_binary))
        blazar_cli(home, "import", str(gemma_path), "--name", model, *(["--mmproj", str(mmproj)] if mmproj else []))
        if template is not None:
            (home / "test-template.jinja").write_text(template)
            blazar_cli(home, "model", "set", model, "--template", str(home / "test-template.jinja"))
    else:
        model_home(home, engine_binary, gemma_path, model, template_text=template, mmproj=mmproj, probed=probed)
    configure_all(home, settings)
    if before_serve is not None:
        before_serve(home)
    log_path = output if output is not None else home.parent / f"{home.name}-daemon.log"
    with serving_on_a_free_port(home, log_path, stdout=output is not None) as started:
        yield started


@contextlib.contextmanager
def serving_on_a_free_port(home: Path, log: Path, *, stdout: bool = False) -> Iterator[tuple[int, subprocess.Popen]]:
    """`blazar serve` on `home` at a free port, its log in `log` (and its stdout too with `stdout`), once /health
    answers (else the log's tail is in the failure); stopped at the end."""
    port = free_port()
    proc = start_serve(home, "--port", str(port), log=log, stdout=stdout)
    try:
        try:
            wait_for(lambda: healthy(port), "/health", proc=proc)
        except AssertionError as e:
            raise AssertionError(f"{e}\n{log.read_text(errors='replace')[-8000:]}") from None
        yield port, proc
    finally:
        stop_daemon(proc)


def stop_daemon(proc: subprocess.Popen, timeout_s: float = 60) -> None:
    """SIGTERM (the daemon's clean stop), then SIGKILL if it has not exited within `timeout_s`."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)
