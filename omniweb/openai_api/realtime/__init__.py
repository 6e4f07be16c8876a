"""OpenAI's Realtime API (GA protocol) at ``/v1/realtime``: ``protocol`` (pure) and ``consumer`` (Channels)."""
