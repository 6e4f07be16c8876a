"""OpenAI-compatible HTTP audio APIs: a third wire format over the engine's pipelines."""
