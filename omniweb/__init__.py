"""omniweb: a Django Channels serving layer for streaming speech and video models."""
