"""Settings, each read from an ``OMNIWEB_*`` environment variable with a safe default.

With nothing set, omniweb serves on loopback with the embedded default: an in-memory channel layer
and an in-process engine worker pool. The README's configuration table lists every variable.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent


def env_str(name: str, default: str) -> str:
    return os.environ.get(f"OMNIWEB_{name}", default)


def env_int(name: str, default: int) -> int:
    return int(env_str(name, str(default)))


def env_float(name: str, default: float) -> float:
    return float(env_str(name, str(default)))


def env_bool(name: str, default: bool) -> bool:
    return env_str(name, "1" if default else "0").strip().lower() in {"1", "true", "yes", "on"}


def env_list(name: str, default: str) -> list[str]:
    return [item.strip() for item in env_str(name, default).split(",") if item.strip()]


# A fresh random key per process when none is configured: omniweb keeps no signed state between
# restarts, so this is safe; set OMNIWEB_SECRET_KEY for deployments with several processes.
SECRET_KEY = env_str("SECRET_KEY", "") or secrets.token_urlsafe(50)
DEBUG = env_bool("DEBUG", False)
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", "127.0.0.1,localhost,[::1]")
# Browser Origins allowed to open WebSockets, as full origins ("https://speech.example.org:8443"):
# scheme, host and port must all match. Empty: any port of an ALLOWED_HOSTS host (omniweb/web/security.py).
ALLOWED_ORIGINS = env_list("ALLOWED_ORIGINS", "")

INSTALLED_APPS = [
    "daphne",  # first: its runserver serves ASGI (WebSockets) with our message-size limits
    "django.contrib.staticfiles",
    "omniweb",  # before channels: its runworker (resilient engine worker) replaces channels' own
    "channels",
    "speech",
    "video",
    "omniweb.openai_api",  # OpenAI-compatible HTTP audio APIs (/v1/audio/speech, /v1/audio/transcriptions, /v1/models)
]

# Django's own middlewares, with their hooks run on the event loop (omniweb/web/middleware.py says why).
MIDDLEWARE = [
    "omniweb.web.middleware.RequestIdMiddleware",  # first: every response carries X-Request-Id
    "omniweb.web.middleware.SecurityMiddleware",
    "omniweb.web.middleware.CommonMiddleware",
    "omniweb.web.middleware.XFrameOptionsMiddleware",
    "omniweb.web.middleware.ChunkedBodyMiddleware",  # a chunked upload parsed as a sized one
]

ROOT_URLCONF = "omniweb.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {"context_processors": ["django.template.context_processors.request"]},
    }
]
ASGI_APPLICATION = "omniweb.asgi.application"
# The WebSocket routes, named here as ROOT_URLCONF names the HTTP ones: /v1/ws-token signs URLs for them.
WEBSOCKET_URLPATTERNS = "omniweb.routing.websocket_urlpatterns"
DATABASES: dict[str, dict[str, str]] = {}  # omniweb stores nothing

STATIC_URL = "static/"
# The pages' assets, and the codec table served from the package that loads it (one copy): the
# browser decoder fetches it next to itself, at /static/codec/.
STATICFILES_DIRS = [d for d in [BASE_DIR / "static"] if d.is_dir()] + [
    ("codec", BASE_DIR / "speech" / "codec" / "tables")
]
STATIC_ROOT = BASE_DIR / "staticfiles"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True

# The embedded default is one process with an in-memory layer and an in-process engine. Setting
# OMNIWEB_REDIS_URL switches to channels_redis: daphne processes send engine requests to the named
# channel ENGINE_CHANNEL and `manage.py runworker omniweb-engine` processes (any host) serve them.
REDIS_URL = env_str("REDIS_URL", "")
ENGINE_CHANNEL = env_str("ENGINE_CHANNEL", "omniweb-engine")
if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {
                "hosts": [REDIS_URL],
                # Per-channel message bound. All reply channels of one daphne process share one
                # Redis key, so it must hold every session's in-flight chunks; the worker channel
                # holds queued requests (the engine's own admission control refuses beyond that).
                "capacity": env_int("CHANNEL_CAPACITY", 2000),
                "channel_capacity": {ENGINE_CHANNEL: env_int("ENGINE_CHANNEL_CAPACITY", 500)},
                # Seconds a message waits to be read: anything older belongs to a client or worker
                # that is gone; leases end those requests well before this.
                "expiry": env_int("CHANNEL_EXPIRY", 30),
            },
        }
    }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
ENGINE_LEASE_SECONDS = env_float("ENGINE_LEASE_SECONDS", 3.0)  # silence from a worker → request lost
ENGINE_ACCEPT_TIMEOUT = env_float("ENGINE_ACCEPT_TIMEOUT", 5.0)  # no worker took the request
ENGINE_SEND_PATIENCE = env_float("ENGINE_SEND_PATIENCE", 2.0)  # wait out a full reply channel this long
WORKER_ID = env_str("WORKER_ID", "")  # default: hostname-pid
WORKER_METRICS_PORT = env_int("WORKER_METRICS_PORT", 0)  # runworker's own /metrics port (0: none)
# On SIGTERM a worker takes no new requests and lets running ones finish this long, then fails the rest.
WORKER_DRAIN_SECONDS = env_float("WORKER_DRAIN_SECONDS", 10.0)

# Daphne rejects incoming WebSocket messages over 1 MiB by default; the speech protocol's
# session.config may carry 4 MiB and video frames up to 10 MB, so admit 16 MiB at the transport and
# enforce the per-message-type limits in the protocol layer (which answers with a JSON error).
WEBSOCKET_MAX_MESSAGE_SIZE = env_int("WEBSOCKET_MAX_MESSAGE_SIZE", 16 * 1024 * 1024)
DAPHNE_WEBSOCKET_MAX_MESSAGE_SIZE = WEBSOCKET_MAX_MESSAGE_SIZE
DAPHNE_WEBSOCKET_MAX_FRAME_SIZE = WEBSOCKET_MAX_MESSAGE_SIZE

# Engine runtime.
DEVICE = env_str("DEVICE", "cpu")  # "cpu", "cuda" or "cuda:N"; see docs in README
# Per model (omniweb.base.devices): empty means DEVICE. A GPU worker may keep some models on the CPU.
TTS_DEVICE = env_str("TTS_DEVICE", "")
VOCODER_DEVICE = env_str("VOCODER_DEVICE", "")
ASR_DEVICE = env_str("ASR_DEVICE", "")
VISION_DEVICE = env_str("VISION_DEVICE", "")
ENGINE_WORKERS = env_int("ENGINE_WORKERS", min(2, os.cpu_count() or 1))
ENGINE_MAX_ACTIVE = env_int("ENGINE_MAX_ACTIVE", 128)
ENGINE_MAX_QUEUED = env_int("ENGINE_MAX_QUEUED", 256)
ENGINE_MAX_BATCH = env_int("ENGINE_MAX_BATCH", 16)
# Batching window: how long a worker holds a batchable step to gather more of the same shape from
# other sessions. 0 (the default) adds no latency at one session; under load batches fill anyway.
ENGINE_BATCH_WAIT_MS = env_float("ENGINE_BATCH_WAIT_MS", 0.0)
# Pacing: a stream's audio is produced at most this many seconds ahead of real-time playback (0:
# unpaced). A client that keeps up at 1x then never has more than this much queued, so the
# stalled-client cap below only ends sessions that really stopped reading.
ENGINE_MAX_AHEAD_SECONDS = env_float("ENGINE_MAX_AHEAD_SECONDS", 30.0)
# A new request's first audio is scheduled as if due this long after it arrives: streams already
# playing with less buffered audio than that are served first, so a burst of arrivals can't starve them.
ENGINE_FIRST_AUDIO_BUDGET_MS = env_int("ENGINE_FIRST_AUDIO_BUDGET_MS", 150)
# A request's steps pause this long after its first audio, leaving the CPUs to that audio's
# delivery (an HTTP body's encoder, socket writes) before its next vocoder chunk and sentences.
ENGINE_FIRST_AUDIO_SETTLE_MS = env_float("ENGINE_FIRST_AUDIO_SETTLE_MS", 5.0)
ENGINE_PRELOAD = env_bool("ENGINE_PRELOAD", not REDIS_URL)  # daphne hosts in Redis mode run no models
# Load shedding: a real-time request whose first audio the engine estimates (from its measured step
# costs and what is queued before it) would come later than this is refused at once (HTTP 503 with
# Retry-After, a WebSocket error of kind "capacity"), not queued. 0: admit by the counts alone.
ENGINE_ADMIT_BUDGET_MS = env_float("ENGINE_ADMIT_BUDGET_MS", 2000.0)
# The same for a turn in an ongoing conversation (/v1/realtime, the video endpoint): its speaker is
# already in the session, waiting, and a refusal drops what they said. Measured on 2 CPUs: 16
# spoken questions at once need ~3 s of work; at the 2 s budget 10 of them were refused.
ENGINE_TURN_ADMIT_BUDGET_MS = env_float("ENGINE_TURN_ADMIT_BUDGET_MS", 6000.0)
# While the models load, a request waits this long for the ones it needs, then is refused with
# kind "starting" (HTTP 503 with Retry-After); a WebSocket handshake never waits for them.
ENGINE_READY_WAIT_SECONDS = env_float("ENGINE_READY_WAIT_SECONDS", 10.0)

# Voice (hibari-tts).
TTS_MODEL_NAME = env_str("TTS_MODEL", "hibari-tts")
TTS_DEFAULT_VOICE = env_str("TTS_VOICE", "heart")
TTS_THREADS = env_int("TTS_THREADS", 1)
TALKER_LOOKAHEAD = env_int("TALKER_LOOKAHEAD", 2)  # sentences synthesized ahead of the vocoder
VOCODER_CHUNK_FRAMES = env_int("VOCODER_CHUNK_FRAMES", 16)  # 12.5 ms frames per vocoder work unit
VOCODER_FIRST_CHUNK_FRAMES = env_int("VOCODER_FIRST_CHUNK_FRAMES", 6)  # smaller first unit: earlier audio

# Codec-token streaming (issue 4): rows (12.5 ms frames) per codec_tokens packet; a sentence's first
# packet is smaller so it leaves as soon as its few frames are encoded.
CODEC_PACKET_FRAMES = env_int("CODEC_PACKET_FRAMES", 16)
CODEC_FIRST_PACKET_FRAMES = env_int("CODEC_FIRST_PACKET_FRAMES", 4)

# Speech protocol limits.
SPEECH_IDLE_TIMEOUT = env_float("SPEECH_IDLE_TIMEOUT", 30.0)
SPEECH_CONFIG_TIMEOUT = env_float("SPEECH_CONFIG_TIMEOUT", 10.0)
SPEECH_MAX_TEXT_CHARS = env_int("SPEECH_MAX_TEXT_CHARS", 100_000)  # buffered text per utterance
# What the talker synthesizes in one step (speech.tts.text.bound_units), so every step is short and
# cancellable whatever the text: at most this many characters, cut at clause marks...
TALKER_MAX_UNIT_CHARS = env_int("TALKER_MAX_UNIT_CHARS", 1500)
# ...and no run without a clause mark longer than this (hibari cannot cut one), cut between words.
TALKER_MAX_RUN_CHARS = env_int("TALKER_MAX_RUN_CHARS", 300)
# Bytes a session may have queued in daphne for a client that does not read (daphne applies no
# backpressure): beyond this the session ends with an error. 4 MiB is ~40 s of 24 kHz PCM.
SESSION_SEND_BUFFER_MAX = env_int("SESSION_SEND_BUFFER_MAX", 4 * 1024 * 1024)
# ...or when bytes wait and none reaches the client for this long: well before daphne's keepalive
# (a ping every 20 s, 30 s to answer) would drop the socket without an error message.
SESSION_SEND_STALL_SECONDS = env_float("SESSION_SEND_STALL_SECONDS", 10.0)

# Video transport (/v1/video/chat/stream).
VIDEO_IDLE_TIMEOUT = env_float("VIDEO_IDLE_TIMEOUT", 60.0)  # no client message this long (no turn active)
VIDEO_CONFIG_TIMEOUT = env_float("VIDEO_CONFIG_TIMEOUT", 10.0)
# Decompression-bomb guard: a frame whose header declares more pixels is refused before decoding.
# 4096x4096 covers 4K cameras; one decode then needs at most 48 MiB.
VIDEO_MAX_FRAME_PIXELS = env_int("VIDEO_MAX_FRAME_PIXELS", 4096 * 4096)
# Bytes all sessions of one process may hold together (frames, microphone audio, speech text, held
# messages and file audio, replies queued for slow clients): beyond it new work is refused with an
# error, or a client far behind is let go (omniweb/base/budget.py). Per-session caps still apply.
PROCESS_BUFFER_BUDGET = env_int("PROCESS_BUFFER_BUDGET", 2 * 1024 * 1024 * 1024)
# Threads of the frame decode pool (omniweb/media/decoding.py): client frame decodes run there only.
VIDEO_DECODE_THREADS = env_int("VIDEO_DECODE_THREADS", 2)
# Bytes of frames one session buffers; beyond it the oldest frames go, as beyond max_frames.
VIDEO_MAX_BUFFER_BYTES = env_int("VIDEO_MAX_BUFFER_BYTES", 256 * 1024 * 1024)
VIDEO_HISTORY_TURNS = env_int("VIDEO_HISTORY_TURNS", 8)  # earlier question/answer pairs sent with a query

# What answers (the video.turn pipeline: thinker -> talker -> vocoder), on the video endpoint and
# /v1/realtime: "scene" (offline: the perception models' measures, in fixed sentences) or "llm" (a
# language model, grounded in those measures, with instructions, history and tool calls).
THINKER = env_str("THINKER", "scene")
# llm: an OpenAI-compatible chat-completions server by its base URL (e.g. http://127.0.0.1:8000/v1;
# /chat/completions is appended), its model name and key; or a GGUF file run in the engine process
# by llama.cpp (xllamacpp), by path or as package:<module>/<file.gguf> for a model shipped in a wheel.
LLM_URL = env_str("LLM_URL", "")
LLM_MODEL = env_str("LLM_MODEL", "")  # the name sent (embedded: the file's name when empty)
LLM_API_KEY = env_str("LLM_API_KEY", "")
LLM_MODEL_PATH = env_str("LLM_MODEL_PATH", "")
LLM_IMAGES = env_str("LLM_IMAGES", "off")  # "on": the frames also go as image parts (a vision model)
LLM_TIMEOUT = env_float("LLM_TIMEOUT", 30.0)  # server: seconds to connect, and between two reads
LLM_MAX_TOKENS = env_int("LLM_MAX_TOKENS", 512)  # an answer's length cap (a client may ask for less)
LLM_CONTEXT = env_int("LLM_CONTEXT", 4096)  # tokens of context per answer: the oldest turns go past it
LLM_PARALLEL = env_int("LLM_PARALLEL", 4)  # embedded: answers decoded together (llama.cpp slots)
# embedded: CPU threads of the model; half the cores by default, the rest for the engine's workers
# (the model's threads are not the scheduler's: on 2 cores, two of them slowed speech recognition).
LLM_THREADS = env_int("LLM_THREADS", max(1, (os.cpu_count() or 2) // 2))
# How function calls and their outputs reach the model: "native" (tool messages), "text" (as
# sentences, for chat templates without tool support) or "auto" (asked of the model once).
LLM_TOOL_MESSAGES = env_str("LLM_TOOL_MESSAGES", "auto")
# The settings these replaced: one that asked for the old upstream thinker stops the start, naming
# the new ones, rather than silently leaving the scene thinker to answer (the others are ignored).
if os.environ.get("OMNIWEB_VIDEO_THINKER", "scene").strip().lower() not in ("", "scene") or os.environ.get(
    "OMNIWEB_VIDEO_UPSTREAM_URL"
):
    raise ImproperlyConfigured(
        "OMNIWEB_VIDEO_THINKER=upstream and OMNIWEB_VIDEO_UPSTREAM_* were replaced by OMNIWEB_THINKER=llm "
        "and OMNIWEB_LLM_URL, _MODEL, _API_KEY, _TIMEOUT, _MAX_TOKENS (with OMNIWEB_LLM_IMAGES=on for "
        "image input): docs/configuration.md"
    )
# Whisper tiny.en (every transcription: spoken questions, realtime input, the transcription API):
# CPU threads per model call, beam size (1: greedy, fastest), CTranslate2 compute type (empty: int8
# on the CPU, float16 on CUDA). (Named OMNIWEB_VIDEO_ASR_* before Whisper served every endpoint.)
ASR_THREADS = env_int("ASR_THREADS", 2)
ASR_BEAM_SIZE = env_int("ASR_BEAM_SIZE", 1)
ASR_COMPUTE_TYPE = env_str("ASR_COMPUTE_TYPE", "")
# Streaming recognition: while a realtime client speaks, its speech so far is transcribed every
# this many ms of new audio (when the engine has time to spare), so the transcript streams and only
# the tail is left at the turn's end. 0: off.
ASR_STREAM_INTERVAL_MS = env_int("ASR_STREAM_INTERVAL_MS", 480)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    # Times in UTC (ISO 8601 with a Z), whatever the machine's zone; " [req_…]" while serving an HTTP request.
    "formatters": {
        "plain": {
            "()": "omniweb.web.logs.UTCFormatter",
            "fmt": "%(asctime)s %(levelname)s %(name)s%(request)s: %(message)s",
        }
    },
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
}

# Operations (metrics, health, access control)
# API tokens (comma-separated secrets): when set, every WebSocket must present one (Bearer header,
# `omniweb.token.<token>` subprotocol, or a signed `?token=` from POST /v1/ws-token). Empty: open.
API_TOKENS = env_list("API_TOKENS", "")
SIGNED_URL_MAX_AGE = env_int("SIGNED_URL_MAX_AGE", 300)  # seconds a /v1/ws-token token stays valid
# Open WebSockets per client address, per daphne process (0: unlimited). Loopback clients without
# forwarding headers (this machine: the bench, local programs) are not limited.
MAX_SESSIONS_PER_CLIENT = env_int("MAX_SESSIONS_PER_CLIENT", 32)
WORKER_STALE_SECONDS = env_float("WORKER_STALE_SECONDS", 5.0)  # older heartbeat: worker down

# Browser pages (issue 6): static files. ServeStatic's async middleware serves /static/ from the app
# itself (DEBUG or not), so the README's runserver and a bare daphne serve the pages' scripts without
# pushing every HTTP request through a sync-middleware thread hop (WhiteNoise's middleware is sync
# only). Behind nginx, `location /static/` serves the collectstatic copy and never reaches daphne.
INSTALLED_APPS.append("servestatic")
MIDDLEWARE.insert(2, "servestatic.middleware.ServeStaticMiddleware")  # after RequestId and Security
SERVESTATIC_USE_FINDERS = True  # straight from static/: no collectstatic step to run the app

# Hardening (issue #11). The pages load only their own ES modules and stylesheet (no inline script
# or style anywhere in templates/), so the policy can be strict; both middlewares are async-capable.
MIDDLEWARE += ["omniweb.web.middleware.CSPMiddleware", "django_permissions_policy.PermissionsPolicyMiddleware"]
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": ["'self'"],
        "script-src": ["'self'"],  # AudioWorklet modules are scripts too: static/worklets/
        "style-src": ["'self'"],
        "img-src": ["'self'", "data:", "blob:"],
        "media-src": ["'self'", "blob:"],
        "connect-src": ["'self'"],  # same-origin fetch and ws:/wss: (CSP 3 'self' covers both)
        "object-src": ["'none'"],
        "base-uri": ["'self'"],
        "form-action": ["'self'"],
        "frame-ancestors": ["'none'"],
    }
}
PERMISSIONS_POLICY = {
    "camera": ["self"],
    "microphone": ["self"],
    "geolocation": [],
    "payment": [],
    "usb": [],
}
# The example key of deploy/omniweb.env.example (and Django's startproject prefix) must never sign
# tokens in production: refuse to start with one unless DEBUG is on.
EXAMPLE_SECRET_KEYS = {"change-me"}
if not DEBUG and (SECRET_KEY in EXAMPLE_SECRET_KEYS or SECRET_KEY.startswith("django-insecure-")):
    raise ImproperlyConfigured(
        "OMNIWEB_SECRET_KEY is the example value: set a secret of your own "
        "(python3 -c 'import secrets; print(secrets.token_urlsafe(50))'), or unset it for a random per-process key"
    )
# OpenAI-compatible HTTP audio APIs (issue 13; omniweb/openai_api/). OpenAI's voice names → a local voice,
# as "alloy=heart,echo=heart": every name not listed here (and not a local voice) is refused.
# Default: each OpenAI voice speaks with the default voice (OMNIWEB_TTS_VOICE).
OPENAI_VOICE_MAP = env_str("OPENAI_VOICE_MAP", "")
# Transcriptions: the largest upload (OpenAI's own limit is 25 MB) and the longest recording.
TRANSCRIBE_MAX_BYTES = env_int("TRANSCRIBE_MAX_BYTES", 25 * 1024 * 1024)
TRANSCRIBE_MAX_SECONDS = env_float("TRANSCRIBE_MAX_SECONDS", 600.0)
