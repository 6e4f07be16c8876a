"""The protocol-neutral conversation core: one session's state, buffers and turns, no Channels.

Each WebSocket endpoint is an adapter over this package: it parses its wire messages into the typed
values below, calls the core, and writes the core's typed events back in its own format. Nothing
here imports Channels or knows a wire format. What each adapter uses:

- ``/v1/video/chat/stream`` (video/consumers.py): ``Conversation`` with ``FrameBuffer``,
  ``AudioBuffer`` (16 kHz) and ``History``; a ``video.query`` is a ``TurnSpec`` turn; with
  ``turn_detection``, ``Listener`` over its ``audio.chunk``s.
- ``/v1/realtime`` (omniweb/openai_api/realtime/consumer.py): ``Conversation`` with ``FrameBuffer`` (the
  images) and ``AudioBuffer`` (24 kHz, the input audio buffer); ``Listener`` for every append
  (server VAD batched by ``feed_ms``, early transcription, ``commit`` / ``clear``, ``listen_with`` on
  ``session.update``); a response is a ``TurnSpec`` turn.
- ``/v1/audio/speech/stream`` (speech/consumers.py): ``Conversation`` alone (no buffers); an
  utterance is a ``SpeechTurn`` turn, fed pieces as the client writes them (state SPEAKING), then
  flushed (ANSWERING); ``input.cancel``, disconnect and close stop it through ``interrupt`` / ``close``.
- ``POST /v1/audio/speech`` and ``/v1/audio/transcriptions`` (omniweb/openai_api/views.py): no
  session; the text is a ``SpeechTurn`` with one piece (its ``run`` iterated directly), the upload
  goes to ``transcription.transcribe``.

Session (``session.py``)
    ``Conversation(engine, on_idle=...)``: ``state`` (``ConversationState``: AWAITING_CONFIG → READY
    ⇄ ANSWERING (or SPEAKING while the turn's input still arrives) → FINISHING → CLOSED),
    ``configure(frames=, audio=, history=)`` (each optional), ``start_turn(turn, emit, stopped=,
    ended=, input_open=) -> ActiveTurn`` (runs any ``Turn``, an object with ``request_id``, ``frames``
    and ``run(engine)``, as a task; each event is awaited through ``emit(turn, event)`` in order;
    ``ended`` is awaited when it ends on its own), ``input_closed()`` (SPEAKING → ANSWERING),
    ``interrupt()`` (the one way to stop a turn early: aborts the engine request at once, lets the
    event being written complete, cancels the task; the turn emits nothing more), ``finish()``
    (→ FINISHING), ``stop_input()`` (→ CLOSED before ``close``), ``wait()``, ``close()``. ``state`` is
    read-only: only these methods move it, and a move the state does not allow raises
    ``IllegalTransition``.
Inbox (``inbox.py``)
    ``Inbox(handle, InboxLimits(max_messages, max_bytes, full_message, budget_message), hold=, gate=,
    inline=)``: the session's one bounded queue between the socket's reader and one processor
    (``run()``): ``await deliver(item, size, urgent=)`` (raises ``InboxFull(message, kind)``; urgent:
    handled at once, overtaking what is queued), ``post(item)`` (the server's own, never refused),
    ``peek()``, ``reopen()`` (the gate may have opened), ``clear()``.
Frame buffer (``frames.py``)
    ``FrameBuffer(max_frames=, max_bytes=, max_pixels=, filter_threshold=, on_decode_failed=)``:
    ``await add(b64, received_ms=, frame_id=, pts_ms=, meta=) -> FrameAdded`` (raises
    ``omniweb.media.frames.FrameError`` with a client-safe message: the decoding guards, the similarity
    filter, eviction by count and bytes, the process budget), ``snapshot()``, ``remove_failed()``;
    frames decode ahead of any turn. ``FrameSelection(num_frames, strategy, window_seconds)`` picks
    the frames a turn shows the thinker (``"latest_frames"``: the latest N).
Audio buffer (``audio.py``)
    ``AudioBuffer(max_bytes, sample_rate)``: ``append(pcm) -> problem | None``, ``take()``, ``clear()``,
    cuts by stream position (``position(ms)``, ``take_before``, ``peek``, ``keep_last``);
    ``resample_pcm16(pcm, from_rate, to_rate)`` (a 24 kHz question → the turn's 16 kHz).
History (``history.py``)
    ``History(max_turns)``: ``remember(question, answer)``, ``messages()``.
Listening (``listening.py``): server VAD over the audio buffer
    ``Listener(VoiceActivity(engine, VadParams(...), rate) | None, audio, take_segments=, feed_ms=,
    early=EarlyTranscription(transcribe, stream_ms=…))``: ``await feed(pcm)`` returns ``SpeechStarted`` /
    ``SpeechStopped`` (``omniweb.conversation.vad``; 24 kHz input is resampled for the model by ``VoiceActivity``)
    and, after each stop, the turn's ``SpeechSegment(audio, audio_start_ms, audio_end_ms)`` (``await
    segment.transcript()``: the early transcription, or None); raises ``AudioRefused``.
    ``commit()``, ``clear()``, ``listen_with(vad)``, ``append_unheard(pcm)``, ``taken()``, ``close()``.
Turn runner (``turns.py``)
    ``TurnSpec(question=Question(text, audio, transcribe), frames, selection, history, instructions,
    modalities, voice, model, require_frames, request_id)``; ``run_turn(engine, spec)`` (its ``run``)
    yields ``FramesSelected`` (or ``NoUsableFrames``), then the typed engine chunks.
Speech turn (``utterance.py``)
    ``SpeechTurn(request, pieces, input_done=, max_ahead_seconds=, on_activity=)``: ``add(pieces)``,
    ``finish(pieces)``, ``played(seconds)``; its ``run`` sends one engine request per batch of pieces
    (``request(pieces)`` builds it; the noise generator's ``rng_state`` is carried across), paced to
    ``max_ahead_seconds`` ahead of playback, and yields their typed chunks, then one ``TurnEnd``.
Transcriptions (``transcription.py``)
    ``transcribe(engine, pcm16k, prompt=, temperature=, words=)``: a recording's ``Segment``s, then its
    ``End`` (batch priority past ``BULK_TRANSCRIBE_SECONDS``); ``segment_texts(engine, pcm16k,
    request_id, ...)``: a conversation's own input, its segment texts (None on failure).
Engine chunks (``chunks.py``), parsed from the engine's dicts in one place (``parse_chunk``; the
stateful ``ChunkParser`` for an answer's timeline)
    ``Transcript(text)`` (the question as heard, before any text), ``TextDelta(delta)``,
    ``TextEnd()``, ``SentenceStart(index, text)``, ``AudioChunk(pcm, words, start_ms)`` (PCM16
    24 kHz; ``words``: ``WordTiming(word, start_ms, end_ms)`` on the answer's audio timeline, each
    word with the chunk in which it starts, from the talker's own durations), ``SentenceEnd(index)``,
    ``TurnEnd(status, kind, message, text, transcript, usage, rng_state, retry_after)`` with ``Usage`` (estimated
    tokens); the speech endpoint's ``CodecCodes``.
Usage (``usage.py``): how every token count is made, one rule
    ``text_tokens``, ``audio_tokens(ms, spoken=)``, ``image_tokens``; ``given(request, frames)`` (what a
    turn's engine request gives the thinker: ``FramesSelected.given``); ``Tally(given)``: ``add`` each
    piece of the answer as it is sent, ``usage(end=None)`` (a turn cut short counts what was sent).

A minimal adapter::

    conversation = Conversation(engine)
    conversation.configure(frames=FrameBuffer(...), audio=AudioBuffer(...), history=History(8))
    await conversation.frames.add(jpeg_b64, received_ms=now_ms())
    spec = TurnSpec(Question(audio=conversation.audio.take()), frames=conversation.frames.snapshot(),
                    selection=FrameSelection(2, "latest_frames"), modalities=("text", "audio"))
    conversation.start_turn(spec, emit)  # async def emit(turn, event): write event in your format
"""

from .audio import AudioBuffer, resample_pcm16
from .chunks import (
    AudioChunk,
    ChunkParser,
    CodecCodes,
    EngineChunk,
    SentenceEnd,
    SentenceStart,
    TextDelta,
    TextEnd,
    ToolCall,
    Transcript,
    TurnEnd,
    Usage,
    WordTiming,
    parse_chunk,
)
from .frames import BufferedFrame, FrameAdded, FrameBuffer, FrameSelection
from .history import History
from .inbox import Inbox, InboxFull, InboxLimits
from .listening import AudioRefused, EarlyTranscription, Heard, Listener, ListenEvent, SpeechSegment
from .session import ActiveTurn, Conversation, ConversationState, Emit, Ended, IllegalTransition, Turn
from .turns import FramesSelected, NoUsableFrames, Question, TurnEvent, TurnSpec, now_ms, run_turn
from .utterance import SpeechTurn

__all__ = [
    "ActiveTurn",
    "AudioBuffer",
    "AudioChunk",
    "AudioRefused",
    "BufferedFrame",
    "ChunkParser",
    "CodecCodes",
    "Conversation",
    "ConversationState",
    "EarlyTranscription",
    "Emit",
    "Ended",
    "EngineChunk",
    "FrameAdded",
    "FrameBuffer",
    "FrameSelection",
    "FramesSelected",
    "Heard",
    "History",
    "IllegalTransition",
    "Inbox",
    "InboxFull",
    "InboxLimits",
    "ListenEvent",
    "Listener",
    "NoUsableFrames",
    "Question",
    "SentenceEnd",
    "SentenceStart",
    "SpeechSegment",
    "SpeechTurn",
    "TextDelta",
    "TextEnd",
    "ToolCall",
    "Transcript",
    "Turn",
    "TurnEnd",
    "TurnEvent",
    "TurnSpec",
    "Usage",
    "WordTiming",
    "now_ms",
    "parse_chunk",
    "resample_pcm16",
    "run_turn",
]
