"""The fit with a multimodal projector: its weights and compute buffer priced from the header summary, charged to
the device it runs on, and the decision (with fake devices) to keep it on the GPU or move it to the host
(--no-mmproj-offload) when VRAM is tight."""

from __future__ import annotations

from blazar.events.projectors import EncoderShape, ProjectorMetadata
from blazar.fit import FitRequest, plan
from blazar.fit.projector import ProjectorCost, decide_placement, projector_cost, tokens_per_image
from tests.support.fit_models import GiB, MiB, gemma3_270m, gpu, host, transformer

# The tiny test projector (tests/support/tiny_mmproj.py), as its header reads.
TINY = ProjectorMetadata(projector_type="gemma3", modalities=["vision"], weights_bytes=242_944, tensor_count=23,
                         vision=EncoderShape(embedding_length=64, feed_forward_length=128, block_count=1,
                                             head_count=1, projection_dim=640, image_size=112, patch_size=14,
                                             scale_factor=2))
# Gemma 3's real SigLIP projector (mmproj-model-f16: 896 px, patch 14, width 1152, 27 blocks, 16 heads).
SIGLIP = ProjectorMetadata(projector_type="gemma3", modalities=["vision"], weights_bytes=851 * MiB,
                           vision=EncoderShape(embedding_length=1152, feed_forward_length=4304, block_count=27,
                                               head_count=16, projection_dim=2560, image_size=896, patch_size=14))


def test_the_tiny_projectors_compute_buffer_follows_the_formula_and_stays_above_the_engines() -> None:
    cost = projector_cost(TINY, flash_attn=True)
    assert cost.weights_bytes == 242_944
    # 3*112^2 + 3*14^2*64 + 64*(4*64+128) + 16*640 floats
    assert cost.compute_bytes == 4 * (37_632 + 37_632 + 24_576 + 10_240) == 440_320
    engine_reserved = round(0.22 * MiB)  # "CLIP compute buffer size = 0.22 MiB" (llama-server 11434, CPU)
    assert engine_reserved <= cost.compute_bytes <= 2 * engine_reserved + 1


def test_without_flash_attention_the_projectors_kq_is_counted() -> None:
    fa, no_fa = (projector_cost(SIGLIP, flash_attn=f).compute_bytes for f in (True, False))
    assert no_fa - fa == 4 * 4096 * 4096 * 16  # P^2 H floats: 1 GiB for Gemma 3's 4096 patches


def test_a_cpu_plan_charges_the_projector_to_the_host() -> None:
    meta = gemma3_270m()
    without = plan(meta, [host(8 * GiB)], FitRequest(ctx=4096))
    with_p = plan(meta, [host(8 * GiB)], FitRequest(ctx=4096, projector=TINY))
    cost = projector_cost(TINY, flash_attn=True).total_bytes
    assert with_p.total_bytes - without.total_bytes == cost == with_p.projector_bytes
    assert with_p.projector_device == "host" and with_p.projector_offload
    assert with_p.devices[-1].projector_bytes == cost


def test_a_gpu_with_room_keeps_the_projector_and_says_so() -> None:
    meta = transformer(n_layer=8, layer_bytes=100 * MiB)
    p = plan(meta, [gpu(16 * GiB), host(16 * GiB)], FitRequest(ctx=4096, projector=SIGLIP))
    assert p.fits and p.gpu_layers == 9 and p.projector_offload and p.projector_device == "cuda:0"
    assert p.devices[0].projector_bytes > 851 * MiB
    assert any("projector on cuda:0" in n for n in p.notes)


def test_tight_vram_moves_the_projector_to_the_host_when_that_keeps_more_layers_on_the_gpu() -> None:
    meta = transformer(n_layer=8, layer_bytes=200 * MiB, input_bytes=10 * MiB, output_bytes=10 * MiB)
    proj = projector_cost(SIGLIP, flash_attn=True).total_bytes
    # Room for every layer, but not for every layer and the projector too.
    all_layers = plan(meta, [gpu(8 * GiB), host(32 * GiB)], FitRequest(ctx=4096)).devices[0].total_bytes
    vram = all_layers + 256 * MiB + proj // 2  # the GPU reserve is max(256 MiB, 3%)
    p = plan(meta, [gpu(vram), host(32 * GiB)], FitRequest(ctx=4096, projector=SIGLIP))
    assert p.fits and p.gpu_layers == 9
    assert not p.projector_offload and p.projector_device == "host"
    assert p.devices[-1].projector_bytes == proj and p.devices[0].projector_bytes == 0
    why = next(n for n in p.notes if "--no-mmproj-offload" in n)
    assert "VRAM is tight" in why and "of 9 layers" in why


def test_the_projector_stays_on_the_gpu_when_the_host_would_not_gain_a_layer() -> None:
    # A GPU that holds no block either way (only the small output layer): the projector on the host buys nothing.
    meta = transformer(n_layer=4, layer_bytes=4 * GiB)
    p = plan(meta, [gpu(3 * GiB), host(64 * GiB)], FitRequest(ctx=2048, projector=SIGLIP))
    assert p.gpu_layers == 1 and p.projector_offload and p.projector_device == "cuda:0"
    assert any("would not put more" in n for n in p.notes)


def test_decide_placement_prefers_the_layers_and_names_the_numbers() -> None:
    cost = ProjectorCost(800 * MiB, 200 * MiB)
    keep = decide_placement(cost, gpu="cuda:0", layers_total=33, on_gpu=(True, 33), on_host=None)
    assert keep.on_gpu and "1000.0 MiB" in keep.why
    move = decide_placement(cost, gpu="cuda:0", layers_total=33, on_gpu=(True, 30), on_host=(True, 33))
    assert not move.on_gpu and "30 of 33 layers" in move.why and "against 33" in move.why
    rescue = decide_placement(cost, gpu="cuda:0", layers_total=33, on_gpu=(False, 33), on_host=(True, 33))
    assert not rescue.on_gpu and "no plan that fits" in rescue.why
    neither = decide_placement(cost, gpu="cuda:0", layers_total=33, on_gpu=(False, 10), on_host=(False, 12))
    assert neither.on_gpu


def test_an_audio_projector_is_priced_by_frames() -> None:
    audio = ProjectorMetadata(projector_type="ultravox", modalities=["audio"], weights_bytes=600 * MiB,
                              audio=EncoderShape(embedding_length=1280, feed_forward_length=5120, head_count=20,
                                                 projection_dim=2048, mel_bins=128))
    cost = projector_cost(audio, flash_attn=True)
    assert cost.compute_bytes == 4 * (1500 * 2 * 128 + 1500 * (4 * 1280 + 5120) + 1500 * 2048)


def test_the_argv_carries_the_projector_and_no_offload_only_when_planned_on_the_host() -> None:
    from pathlib import Path

    from blazar.adapters.engines.llama_server import build_argv, parse_help

    caps = parse_help((Path(__file__).resolve().parents[2] / "fixtures" / "llama_server" / "help.txt").read_text())
    proj = Path("/home/models/mmproj/ab.gguf")
    meta = transformer(n_layer=8, layer_bytes=200 * MiB, input_bytes=10 * MiB, output_bytes=10 * MiB)
    roomy = plan(meta, [gpu(16 * GiB), host(32 * GiB)], FitRequest(ctx=4096, projector=SIGLIP))
    argv = build_argv(Path("/bin/llama-server"), Path("/m.gguf"), roomy, caps, port=1, projector=proj)
    assert argv[argv.index("-mm") + 1] == str(proj) and "--no-mmproj-offload" not in argv
    all_layers = plan(meta, [gpu(8 * GiB), host(32 * GiB)], FitRequest(ctx=4096)).devices[0].total_bytes
    tight = plan(meta, [gpu(all_layers + 256 * MiB + 100 * MiB), host(32 * GiB)],
                 FitRequest(ctx=4096, projector=SIGLIP))
    argv = build_argv(Path("/bin/llama-server"), Path("/m.gguf"), tight, caps, port=1, projector=proj)
    assert "--no-mmproj-offload" in argv
    text_only = build_argv(Path("/bin/llama-server"), Path("/m.gguf"), roomy, caps, port=1)
    assert "--mmproj" not in text_only and "-mm" not in text_only


def test_an_image_becomes_a_fixed_number_of_prompt_tokens_only_where_the_projector_resizes_every_image() -> None:
    assert tokens_per_image(TINY) == 16  # 112 px / 14 = 8x8 patches, pooled by 2: 4x4 (+2 markers: 18 measured)
    assert tokens_per_image(SIGLIP) == 256  # Gemma 3: 64x64 patches pooled by llama.cpp's default 4
    dynamic = ProjectorMetadata(projector_type="qwen2vl_merger", modalities=["vision"],
                                vision=EncoderShape(image_size=560, patch_size=14))
    assert tokens_per_image(dynamic) is None  # its images keep their own size: only the engine knows
    assert tokens_per_image(ProjectorMetadata(projector_type="ultravox", modalities=["audio"])) is None
