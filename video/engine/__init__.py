"""The video.turn pipeline: thinker (scene analyser or upstream model) → talker → vocoder."""
