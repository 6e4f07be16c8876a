"""Transport for OpenAI's HTTP audio API: async Django views over the conversation core.

Each view decodes its request (``protocol.py``), runs it on the core and encodes what comes back.
``POST /v1/audio/speech`` speaks the text as the WebSocket's flush does (the core's ``SpeechTurn``,
one engine request) and streams the body (chunked) while it is synthesized;
``POST /v1/audio/transcriptions`` decodes the upload and transcribes it (the core's ``transcribe``,
the ``audio.transcribe`` pipeline); ``GET /v1/models`` lists what this server serves.

Streaming and disconnects: Django's ASGI handler (daphne, also under ``runserver``) listens for
``http.disconnect`` while a response streams and cancels the response task; the body generator
then closes the core's iterator, which aborts the request in the engine at once. The first chunk
is awaited before the status line is sent, so admission control can still answer 503.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import time
import weakref
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from hibari import dsp

from omniweb.base import clocks, metrics
from omniweb.base.errors import ErrorKind
from omniweb.conversation import AudioChunk, EngineChunk, SpeechTurn, TurnEnd
from omniweb.conversation.transcription import transcribe
from omniweb.engine.messages import End, Segment, Status
from omniweb.engine.requests import SPEECH
from omniweb.engine.runtime import get_engine_client, loaded_engine_client
from omniweb.engine.voice import voice
from omniweb.media.containers import StreamEncoder, encoding_cost, first_bytes_samples
from omniweb.web import auth
from speech.protocol import SAMPLE_RATE, SessionConfig, tts_request
from speech.tts.vocoder import HOP

from . import protocol
from .asgi import SCOPE_KEY as ABORT_KEY
from .protocol import APIError
from .uploads import decode_upload

logger = logging.getLogger(__name__)

SPEECH_ENDPOINT = "/v1/audio/speech"
TRANSCRIBE_ENDPOINT = "/v1/audio/transcriptions"
_STARTED = int(time.time())  # "created" of every model in /v1/models
_ERROR_KINDS = {401: "auth", 429: "limit", 503: "busy", 500: "generation"}
STARTING_TEXT = "The server is starting (its models are still loading); retry shortly"
T = TypeVar("T")


# -- shared pieces -----------------------------------------------------------------------------------
def error_response(error: APIError) -> JsonResponse:
    metrics.count_error(_ERROR_KINDS.get(error.status, "protocol"))
    response = JsonResponse(error.body(), status=error.status)
    if error.retry_after is not None:
        response["Retry-After"] = str(error.retry_after)
    if error.status == 503:  # load shedding or a start-up: counted, not logged per request as an error
        response._has_been_logged = True  # type: ignore[attr-defined]
    if error.status == 401:
        response["WWW-Authenticate"] = 'Bearer realm="omniweb"'
    response["Cache-Control"] = "no-store"
    return response


def check_access(request: HttpRequest, method: str) -> None:
    """The method, then the API token (``OMNIWEB_API_TOKENS``, as for the WebSockets)."""
    if request.method != method:
        raise APIError(405, f"{request.path} accepts {method} only", code="method_not_allowed")
    tokens = auth.api_tokens()
    if tokens:
        presented = auth.parse_bearer(request.headers.get("Authorization", ""))
        if presented is None or auth.match_token(presented, tokens) is None:
            raise protocol.unauthorized()


def _end_error(end: End | TurnEnd) -> APIError:
    """A request's failed end (the engine's ``End``, or the speech turn's ``TurnEnd``) as the API's error."""
    kind = end.kind  # an older worker's End has none: its status says all that is read here
    if end.status is Status.BUSY:
        retry = end.retry_after  # load shedding's estimate of when a retry may be admitted
        return protocol.busy(retry_after=max(1, math.ceil(retry)) if retry is not None else 1)
    if kind is ErrorKind.STARTING:
        return APIError(503, STARTING_TEXT, type="server_error", code="server_starting", retry_after=1)
    if kind is ErrorKind.UNAVAILABLE:
        return APIError(503, str(end.message), type="server_error", code="model_unavailable")
    if end.status is Status.INVALID:
        return protocol.invalid(end.message or "The request cannot be served")
    logger.warning("engine request ended with %s: %s", end.status, end.message)
    return APIError(500, "The request failed on the server", type="server_error", code="generation_failed")


async def _first_chunk(stream: AsyncIterator[T]) -> T:
    """The stream's first chunk; a request cancelled meanwhile (client gone) closes the stream."""
    try:
        return await anext(stream)
    except BaseException:
        await stream.aclose()  # type: ignore[attr-defined]
        raise


def first_chunk_frames(response_format: str) -> int | None:
    """A first vocoder step big enough for the encoder's first frame, so the first bytes leave
    after one engine step, not two (None: the setting's size is used)."""
    # A sentence's first vocoder step holds back half an FFT window for the overlap-add.
    held_back = (dsp.N_FFT // 2) // HOP
    frames = -(-first_bytes_samples(response_format) // HOP) + held_back
    default = settings.VOCODER_FIRST_CHUNK_FRAMES or settings.VOCODER_CHUNK_FRAMES
    return frames if frames > default else None


class _SpareEncoders:
    """One encoder per FFmpeg format, opened before a request needs it.

    FFmpeg's set-up runs with the GIL held (``avcodec_open2``, ``avformat_write_header``: ~1 ms
    for LAME). Opened as a request starts, it stalled the talker's Python front end and came out
    of the first audio; opened once a stream's first bytes have left, it costs nobody's first
    audio. Concurrent streams of one format beyond the spare open their own, as before.
    """

    def __init__(self) -> None:
        self._ready: dict[str, StreamEncoder] = {}

    def take(self, response_format: str) -> StreamEncoder | None:
        return self._ready.pop(response_format, None)

    def refill(self, response_format: str) -> None:
        """Open a spare unless one is waiting (in a thread: never on the event loop)."""
        try:
            if response_format in self._ready:
                return
            encoder = StreamEncoder(response_format)
            if self._ready.setdefault(response_format, encoder) is not encoder:  # another refill won
                encoder.close()
        except Exception:  # only a lost head start: the next request opens its own
            logger.warning("cannot open a spare %s encoder", response_format, exc_info=True)


_SPARES = _SpareEncoders()
# After a stream's first bytes, how long the spare's set-up waits: past daphne's socket write of
# them (a thread holding the GIL then delayed that write by 0.1 ms), well before the next request.
SPARE_DELAY = 0.01


def first_pieces(pcm: bytes, need: int) -> tuple[bytes, ...]:
    """The first audio cut where the encoder's first bytes are complete (``need`` samples), so
    they leave before the rest is encoded: Opus's first vocoder step holds 2.5 of its frames, and
    encoding the 1.5 it does not need first cost 0.3 ms of the first byte."""
    cut = need * 2
    return (pcm[:cut], pcm[cut:]) if 0 < cut < len(pcm) else (pcm,)


@functools.cache
def _voice_table() -> dict[str, str]:
    caps = voice().capabilities()
    return protocol.voice_table(settings.OPENAI_VOICE_MAP, caps.voices, caps.default_voice)


def _body(request: HttpRequest) -> bytes:
    try:
        return request.body
    except RequestDataTooBig:
        raise APIError(
            413,
            f"The request body is larger than {settings.DATA_UPLOAD_MAX_MEMORY_SIZE} bytes",
            code="request_too_large",
        ) from None


# -- POST /v1/audio/speech ---------------------------------------------------------------------------
async def speech(request: HttpRequest) -> HttpResponse:
    clock = clocks.RequestClock()  # ops: request → first audio bytes (omniweb_audio_speech_first_audio_seconds)
    try:
        check_access(request, "POST")
        data = protocol.parse_json_body(request.content_type or "", _body(request))
        caps = voice().capabilities()
        params = protocol.parse_speech(data, caps, _voice_table(), settings.SPEECH_MAX_TEXT_CHARS)
    except APIError as exc:
        return error_response(exc)
    # The WebSocket's engine request for one flush, spoken sentence by sentence whatever the
    # WebSocket's split default: each sentence streams while the next is synthesized.
    config = SessionConfig(
        model=caps.model_names[0],
        voice=params.voice,
        response_format="pcm",
        speed=params.speed,
        split_granularity="sentence",
        initial_codec_chunk_frames=first_chunk_frames(params.response_format),
    )
    scope = getattr(request, "scope", {})
    release = auth.claim_session(scope)  # a stream holds one of the client's sessions, as a WebSocket does
    if release is None:
        limit = settings.MAX_SESSIONS_PER_CLIENT
        return error_response(
            APIError(
                429,
                f"Too many concurrent streams from this client (at most {limit})",
                code="too_many_streams",
                retry_after=1,
            )
        )
    try:
        # First use may load the models (a thread); later, no thread hop on the way to the first audio.
        engine = loaded_engine_client()
        if engine is None:
            engine = await asyncio.to_thread(get_engine_client)
        # The core's speech turn with one piece: one engine request, as the WebSocket's flush (a body
        # has one request, so nothing holds it for playback across requests).
        delivery = encoding_cost(params.response_format)  # the encoder shares the engine's cores
        stream = SpeechTurn(
            lambda pieces: tts_request(pieces[0], config, SPEECH, delivery=delivery), [params.input]
        ).run(engine)
        if params.response_format in ("pcm", "wav"):  # nothing to set up
            first, encoder = await _first_chunk(stream), StreamEncoder(params.response_format)
        elif (spare := _SPARES.take(params.response_format)) is not None:
            first, encoder = await _first_chunk(stream), spare
        else:  # the format's first stream (or a concurrent one): set up while the engine works
            first, encoder = await asyncio.gather(
                _first_chunk(stream), asyncio.to_thread(StreamEncoder, params.response_format)
            )
    except BaseException:
        release()
        raise
    if isinstance(first, TurnEnd):
        release()
        encoder.close()
        await stream.aclose()  # type: ignore[attr-defined]
        return error_response(_end_error(first))
    sse = params.stream_format == "sse"
    body = _speech_body(stream, first, encoder, params, sse, clock, scope, release)
    # The slot is given back when the body ends, and also if the body is dropped unstarted (a client
    # gone between the status line and the first chunk).
    weakref.finalize(body, release)
    response = StreamingHttpResponse(body, content_type="text/event-stream" if sse else encoder.content_type)
    response["Cache-Control"] = "no-store"
    response["X-Accel-Buffering"] = "no"  # nginx: pass the stream on as it comes
    response["X-Omniweb-Voice"] = params.voice  # the local voice that speaks (OpenAI names are mapped)
    if params.ignored:  # fields accepted without effect (instructions: the voice cannot follow them)
        response["X-Omniweb-Ignored"] = ", ".join(params.ignored)
    if params.response_format == "pcm":
        response["X-Omniweb-Sample-Rate"] = str(SAMPLE_RATE)
    return response


async def _speech_body(
    stream: AsyncIterator[EngineChunk],
    first: EngineChunk,
    encoder: StreamEncoder,
    params: protocol.SpeechParams,
    sse: bool,
    clock: clocks.RequestClock,
    scope: dict[str, Any],
    release: Callable[[], None],
) -> AsyncIterator[bytes]:
    """The body: container bytes as the turn's PCM arrives (or SSE deltas of them)."""
    loop = asyncio.get_running_loop()
    pending: asyncio.Future[bytes] | None = None  # an encoder call running in a thread
    fmt = params.response_format
    offload = fmt not in ("pcm", "wav")  # FFmpeg encoders: in a thread, off the event loop
    seconds = 0.0  # of audio made
    sent = False  # audio bytes have left
    gauge = metrics.SESSIONS_OPEN.labels(endpoint=SPEECH_ENDPOINT)
    gauge.inc()

    def wrap(data: bytes) -> bytes:
        return protocol.speech_delta(data) if sse else data

    try:
        async with contextlib.aclosing(stream):  # type: ignore[type-var]
            header = encoder.header()
            if header:
                yield wrap(header)
                await asyncio.sleep(0)
            chunk = first
            while True:
                if isinstance(chunk, AudioChunk):
                    pcm = chunk.pcm
                    seconds += chunk.seconds
                    for piece in first_pieces(pcm, encoder.first_bytes_samples) if not sent else (pcm,):
                        if offload and sent:  # until the first bytes leave, encode here: no thread hop
                            pending = loop.run_in_executor(None, encoder.feed, piece)
                            out = await asyncio.shield(pending)
                            pending = None
                        else:
                            out = encoder.feed(piece)
                        if out:
                            if offload and not sent:  # the next stream's encoder, once these bytes are out
                                loop.call_later(SPARE_DELAY, loop.run_in_executor, None, _SPARES.refill, fmt)
                            sent = True
                            clock.audio_sent()  # ops
                            yield wrap(out)
                            # Let the server write it out now: while the engine is ahead, the next
                            # chunks are already queued and nothing else here would yield to the loop.
                            await asyncio.sleep(0)
                elif isinstance(chunk, TurnEnd):
                    if not chunk.ok:
                        error = _end_error(chunk)
                        metrics.count_error("generation")
                        if sse:
                            yield protocol.sse_error(error)
                            return
                        # The status line has gone: break the body off (no terminating chunk) so
                        # the client sees a truncated response, never a short file that looks whole.
                        abort = scope.get(ABORT_KEY)
                        if abort is None:
                            raise RuntimeError(f"speech synthesis failed mid-stream: {chunk.message}")
                        logger.warning("speech failed mid-stream (%s): connection aborted", chunk.message)
                        abort()
                        return
                    tail = await loop.run_in_executor(None, encoder.finish) if offload else encoder.finish()
                    if tail:
                        yield wrap(tail)
                    if sse:
                        yield protocol.speech_done(len(params.input), seconds)
                    return
                chunk = await anext(stream)
    finally:
        gauge.dec()
        release()
        if pending is not None and not pending.done():
            pending.add_done_callback(lambda _: encoder.close())  # FFmpeg is still busy in the thread
        else:
            encoder.close()


# -- POST /v1/audio/transcriptions -------------------------------------------------------------------
async def transcriptions(request: HttpRequest) -> HttpResponse:
    try:
        check_access(request, "POST")
        length = int(request.META.get("CONTENT_LENGTH") or 0)
        if length > settings.TRANSCRIBE_MAX_BYTES + 64 * 1024:  # room for the other form fields
            raise APIError(
                413,
                f"The upload is larger than {settings.TRANSCRIBE_MAX_BYTES} bytes",
                param="file",
                code="file_too_large",
            )
        if (request.content_type or "").lower() != "multipart/form-data":
            raise protocol.invalid(
                f"Unsupported content type '{request.content_type or '(none)'}'; send multipart/form-data",
                code="unsupported_content_type",
            )
        try:  # parsing writes a large upload to a temporary file: not on the event loop
            fields, upload = await asyncio.to_thread(_form, request)
        except RequestDataTooBig:
            raise APIError(413, "The form fields are too large", code="request_too_large") from None
        params = protocol.parse_transcription(fields)
        if upload is None:
            raise protocol.invalid(
                "'file' is required (the recording, as a multipart file)", "file", "missing_required_parameter"
            )
        if upload.size > settings.TRANSCRIBE_MAX_BYTES:
            raise APIError(
                413,
                f"The upload is larger than {settings.TRANSCRIBE_MAX_BYTES} bytes",
                param="file",
                code="file_too_large",
            )
        data = await asyncio.to_thread(upload.read)
        pcm = await asyncio.to_thread(decode_upload, data, settings.TRANSCRIBE_MAX_SECONDS)
    except APIError as exc:
        return error_response(exc)
    engine = await asyncio.to_thread(get_engine_client)
    stream = transcribe(engine, pcm, prompt=params.prompt, temperature=params.temperature, words=params.words)
    first = await _first_chunk(stream)
    if isinstance(first, End) and not first.ok:
        await stream.aclose()  # type: ignore[attr-defined]
        return error_response(_end_error(first))
    if params.stream:
        response = StreamingHttpResponse(_transcript_events(stream, first), content_type="text/event-stream")
        response["Cache-Control"] = "no-store"
        response["X-Accel-Buffering"] = "no"
        return response
    segments: list[dict[str, Any]] = []
    words: list[dict[str, Any]] = []
    chunk = first
    async with contextlib.aclosing(stream):  # type: ignore[type-var]
        while not isinstance(chunk, End):
            if isinstance(chunk, Segment):
                segments.append(chunk.fields)
                words.extend(chunk.words or ())
            chunk = await anext(stream)
    if not chunk.ok:
        return error_response(_end_error(chunk))
    body, content_type = protocol.format_transcript(params, segments, words, chunk.duration or 0.0)
    response = HttpResponse(body, content_type=content_type)
    response["Cache-Control"] = "no-store"
    return response


def _form(request: HttpRequest) -> tuple[dict[str, list[str]], Any]:
    return {k: request.POST.getlist(k) for k in request.POST}, request.FILES.get("file")


async def _transcript_events(stream: AsyncIterator[Segment | End], first: Segment | End) -> AsyncIterator[bytes]:
    """stream=true: one ``transcript.text.delta`` per segment, then ``transcript.text.done``."""
    texts: list[str] = []
    chunk = first
    async with contextlib.aclosing(stream):  # type: ignore[type-var]
        while not isinstance(chunk, End):
            if isinstance(chunk, Segment):
                text = chunk.text.strip()
                if text:
                    yield protocol.transcript_delta(text if not texts else " " + text)
                    texts.append(text)
            chunk = await anext(stream)
    if not chunk.ok:
        metrics.count_error("generation")
        yield protocol.sse_error(_end_error(chunk))
        return
    yield protocol.transcript_done(" ".join(texts), chunk.duration or 0.0)


# -- GET /v1/models ----------------------------------------------------------------------------------
# OpenAI's names: listed undated; their dated snapshots are retrieved too (protocol.is_alias).
_OPENAI_ALIASES = (*protocol.SPEECH_MODEL_ALIASES, *protocol.TRANSCRIBE_MODEL_ALIASES, *protocol.REALTIME_MODEL_ALIASES)


def _served() -> list[tuple[str, str]]:
    """Every model name this server answers to: the voice, the transcriber, the realtime
    conversation, the video thinker."""
    caps = voice().capabilities()
    names = [caps.model_names[0], *protocol.SPEECH_MODEL_ALIASES, protocol.TRANSCRIBE_MODEL]
    names += [*protocol.TRANSCRIBE_MODEL_ALIASES, *protocol.REALTIME_MODEL_ALIASES]
    # The thinker (video endpoint and /v1/realtime): the built-in scene analyser, or the language model.
    named = settings.THINKER == "llm" and settings.LLM_MODEL
    names.append(settings.LLM_MODEL if named else f"omniweb-video-{settings.THINKER}")
    return [(name, "omniweb") for name in names]


async def models(request: HttpRequest) -> HttpResponse:
    try:
        check_access(request, "GET")
    except APIError as exc:
        return error_response(exc)
    response = JsonResponse(protocol.model_list(_served(), _STARTED))
    response["Cache-Control"] = "no-store"
    return response


async def model(request: HttpRequest, model_id: str) -> HttpResponse:
    try:
        check_access(request, "GET")
        served = _served()
        if model_id not in dict(served) and not protocol.is_alias(model_id, _OPENAI_ALIASES):
            raise protocol.unknown_model(model_id, [name for name, _ in served])
    except APIError as exc:
        return error_response(exc)
    response = JsonResponse(protocol.model_list([(model_id, "omniweb")], _STARTED)["data"][0])
    response["Cache-Control"] = "no-store"
    return response
