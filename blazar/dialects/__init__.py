"""Translation between the API dialects clients speak (OpenAI, Anthropic, Ollama) and the engine's OpenAI API."""
