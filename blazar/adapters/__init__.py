"""THE OUTSIDE WORLD behind small seams: the device probe (gpu.py), engines, the hub, GGUF inspection."""
