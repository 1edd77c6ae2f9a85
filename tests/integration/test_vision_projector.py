"""A model that sees: the real Gemma 3 270M imported with a projector written at test time (tests/support/
tiny_mmproj.py: gemma3 style, random weights), served by `blazar serve` with the real llama-server. What its answers
say means nothing; the path is real: the projector in the store (events, sha256, confined path), `--mmproj` on the
engine's argv, the image decoded, encoded and projected, its tokens counted in `prompt_tokens`; the capabilities
`blazar show`, Ollama's /api/show and /v1/models report; and a model whose projector is removed is text only again."""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import ollama
import openai
import pytest
from PIL import Image

from tests.support.blazar_home import read_events
from tests.support.serving import blazar_cli, serving_gemma
from tests.support.tiny_mmproj import IMAGE_TOKENS, write_tiny_mmproj

MODEL = "gemma"


def jpeg_data_url(width: int = 64, height: int = 48) -> str:
    """A JPEG made now with Pillow: a gradient, so the encoder sees more than one colour."""
    img = Image.new("RGB", (width, height))
    img.putdata([(x * 4 % 256, y * 5 % 256, 128) for y in range(height) for x in range(width)])
    buf = io.BytesIO()
    img.save(buf, "JPEG")
    return "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode()


class Served:
    def __init__(self, home: Path, port: int) -> None:
        self.home, self.port = home, port
        self.base = f"http://127.0.0.1:{port}"

    def openai(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.base}/v1", api_key="unused", max_retries=0, timeout=120)

    def chat(self, content: object) -> openai.types.chat.ChatCompletion:
        return self.openai().chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": content}], max_tokens=4, temperature=0)  # type: ignore[list-item]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, engine_binary: Path, gemma_path: Path) -> Iterator[Served]:
    home = tmp_path_factory.mktemp("vision-home")
    proj = write_tiny_mmproj(tmp_path_factory.mktemp("mmproj") / "mmproj-tiny.gguf")
    with serving_gemma(home, engine_binary, gemma_path, MODEL, {"ctx": 2048, "slots": 1}, mmproj=proj) as (port, _):
        yield Served(home, port)


def test_the_import_records_the_projector_hashed_and_confined_in_the_store(served: Served) -> None:
    (ev,) = read_events(served.home, "model.projector_set")
    data = ev["data"]
    assert data["name"] == MODEL and data["metadata"]["modalities"] == ["vision"]
    assert data["path"] == f"mmproj/{data['sha256']}.gguf"
    stored = served.home / "models" / data["path"]
    assert stored.is_file() and stored.stat().st_size == data["bytes"]


def test_blazar_show_lists_vision_and_the_projector(served: Served) -> None:
    shown = json.loads(blazar_cli(served.home, "show", MODEL, "--json").stdout)
    assert "vision" in shown["capabilities"]
    assert shown["projector"]["modalities"] == ["vision"] and shown["fit"]["projector_bytes"] > 0
    text = blazar_cli(served.home, "show", MODEL).stdout
    assert "vision" in text and "gemma3 (vision)" in text


def test_ollama_show_and_openai_models_list_vision(served: Served) -> None:
    shown = ollama.Client(host=served.base).show(MODEL)
    assert "vision" in (shown.capabilities or []) and "completion" in (shown.capabilities or [])
    # Ollama's answer also carries `projector_info` (the SDK's model drops it): read it from the body itself.
    raw = httpx.post(f"{served.base}/api/show", json={"model": MODEL}, timeout=30).json()
    assert raw["projector_info"]["clip.has_vision_encoder"] is True
    assert raw["projector_info"]["clip.projector_type"] == "gemma3"
    listed = next(m for m in served.openai().models.list() if m.id == MODEL)
    assert "vision" in listed.capabilities  # type: ignore[attr-defined]


def test_a_chat_with_an_image_costs_the_images_tokens(served: Served) -> None:
    question = {"type": "text", "text": "What is in this picture?"}
    without = served.chat([question])
    with_image = served.chat([question, {"type": "image_url", "image_url": {"url": jpeg_data_url()}}])
    assert without.usage is not None and with_image.usage is not None
    # the image's embeddings, and the <start_of_image>/<end_of_image> text around them
    assert with_image.usage.prompt_tokens - without.usage.prompt_tokens >= IMAGE_TOKENS
    starting = read_events(served.home, "instance.starting")[-1]["data"]
    argv = starting["argv"]
    flag = "-mm" if "-mm" in argv else "--mmproj"
    assert argv[argv.index(flag) + 1].endswith(".gguf") and "/mmproj/" in argv[argv.index(flag) + 1]


def test_a_removed_projector_makes_the_model_text_only_and_another_load_shape(served: Served) -> None:
    out = blazar_cli(served.home, "model", "set", MODEL, "--no-mmproj")
    assert "projector removed" in out.stdout and "its file deleted" in out.stdout
    (removed,) = read_events(served.home, "model.projector_removed")
    assert not (served.home / "models" / removed["data"]["path"]).exists()
    shown = json.loads(blazar_cli(served.home, "show", MODEL, "--json").stdout)
    assert "vision" not in shown["capabilities"] and "projector" not in shown
    before = len(read_events(served.home, "instance.starting"))
    served.chat([{"type": "text", "text": "Hello"}])  # the instance with the projector gives way to one without
    starts = read_events(served.home, "instance.starting")
    assert len(starts) == before + 1
    assert "-mm" not in starts[-1]["data"]["argv"] and "--mmproj" not in starts[-1]["data"]["argv"]
