"""The language model behind the ``llm`` thinker: chat completions streamed from a source.

Two sources, one stream above them (``chat``): an OpenAI-compatible server over HTTP (vLLM,
llama.cpp's server, Ollama, OpenAI) and a GGUF file run in this process by llama.cpp through the
``xllamacpp`` wheel (``embedded``). Both yield OpenAI's ``chat.completion.chunk`` objects, read by
one ``ChunkReader`` into text deltas, whole function calls checked against their schemas, and the
model's token counts. ``prompt`` builds what the model is given. Configured by the wiring (no
Django here): the video pipeline builds the source from the settings.
"""
