"""Pure media helpers every endpoint shares: video frames (checks, decoding, the decode pool) and audio containers."""
