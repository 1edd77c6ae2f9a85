"""What `blazar import` was given, told by its files: a GGUF (kind llama-server), a CTranslate2 whisper model directory
(model.bin, config.json, tokenizer.json, vocabulary.*: kind whisper) or a piper voice (VOICE.onnx with VOICE.onnx.json
beside it: kind piper). A whisper model or a voice is stored as a directory of its own under the models directory,
its files recorded one by one (`ModelImported.shards`, each with its sha256) and the model's `sha256` is the
directory digest below."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from blazar.errors import ModelFileError
from blazar.events.models import ModelKind, ModelMetadata, ShardFile

# A CTranslate2 whisper model's files (faster-whisper's download_model list): the first four are required,
# preprocessor_config.json (the feature extractor's settings) is read when present. Nothing else is taken.
WHISPER_REQUIRED = ("model.bin", "config.json", "tokenizer.json")
WHISPER_VOCABULARY = ("vocabulary.txt", "vocabulary.json")
WHISPER_OPTIONAL = ("preprocessor_config.json",)


@dataclass(frozen=True)
class Found:
    """A model that is no GGUF: its kind, its files in store order (the one the child opens first) and its summary."""

    kind: ModelKind
    files: tuple[Path, ...]
    metadata: ModelMetadata


def detect(src: Path) -> Found | None:
    """The whisper model or piper voice at `src`; None for anything else (a GGUF, checked as one by the caller).
    ModelFileError when `src` looks like one but lacks what it needs (the message lists it)."""
    if src.is_dir():
        return _whisper(src)
    if src.name.endswith(".onnx"):
        return _piper(src)
    return None


def _whisper(src: Path) -> Found:
    missing = [f for f in WHISPER_REQUIRED if not (src / f).is_file()]
    vocab = next((src / v for v in WHISPER_VOCABULARY if (src / v).is_file()), None)
    if vocab is None:
        missing.append(" or ".join(WHISPER_VOCABULARY))
    if missing:
        raise ModelFileError(f"{src} is a directory but not a CTranslate2 whisper model: it lacks {', '.join(missing)}"
                             " (blazar import takes a GGUF file, a whisper model directory, or a piper VOICE.onnx)")
    config = _json(src / "config.json")
    if not isinstance(config, dict) or ("lang_ids" not in config and "alignment_heads" not in config):
        raise ModelFileError(f"{src / 'config.json'} is not a whisper model's config (no lang_ids, no alignment_heads)")
    assert vocab is not None
    files = [src / "model.bin", src / "config.json", src / "tokenizer.json", vocab]
    files += [src / f for f in WHISPER_OPTIONAL if (src / f).is_file()]
    return Found("whisper", tuple(files), ModelMetadata(architecture="whisper", name=src.name))


def _piper(src: Path) -> Found:
    config_path = src.with_name(src.name + ".json")
    if not src.is_file():
        raise ModelFileError(f"{src}: no such file")
    if not config_path.is_file():
        raise ModelFileError(f"{src} is an ONNX file without its piper voice config {config_path.name} beside it")
    config = _json(config_path)
    audio = config.get("audio") if isinstance(config, dict) else None
    if not isinstance(audio, dict) or not isinstance(audio.get("sample_rate"), int):
        raise ModelFileError(f"{config_path} is not a piper voice config (no audio.sample_rate)")
    return Found("piper", (src, config_path), ModelMetadata(architecture="piper", name=src.name.removesuffix(".onnx")))


def _json(path: Path) -> object:
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelFileError(f"{path}: not readable as JSON ({e})") from None


def directory_digest(files: list[ShardFile]) -> str:
    """A directory model's sha256: the sha256 of its files' `sha256sum` lines ("<sha256>  <file name>\\n"), sorted
    by file name. `sha256sum -c` over the same lines checks the files one by one."""
    lines = [f"{f.sha256}  {Path(f.path).name}\n" for f in sorted(files, key=lambda f: Path(f.path).name)]
    return hashlib.sha256("".join(lines).encode()).hexdigest()
