"""OpenAI's Realtime API (GA protocol) at ``/v1/realtime``: the wire format (pure) and ``consumer`` (Channels).

The wire format is pure data and functions (no sockets, no engine), so every rule is testable on its
own; field names and shapes are the GA event types of the official ``openai`` SDK
(``openai.types.realtime``). One module per job: ``errors`` (ids, refusals and the ``error`` event),
``audio`` (PCM16 at 24 kHz), ``session`` (the effective session and ``session.update``), ``events``
(client events), ``items`` (the conversation's items, with truncation) and ``server_events`` (the events
this server sends, the response in flight, usage).
"""
