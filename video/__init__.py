"""Streaming video understanding (``/v1/video/chat/stream``); its consumer and loops land with their issue."""
