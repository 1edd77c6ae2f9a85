"""Other tools' model stores (Ollama, LM Studio, the Hugging Face cache, llama.cpp's cache): each reader finds the
models a store holds and says what of each can be carried into Blazar's store (blazar/store/foreign/found.py)."""
