"""The deploy stack end to end, as docs/deploy.md lays it out: nginx (TLS) → daphne → Redis → workers.

Every piece is started the way an operator starts it: nginx from the rendered
``deploy/nginx/*.template`` files (``deploy/render.py``), daphne from ``deploy/daphne.sh``, engine
workers from ``deploy/worker.sh`` (``manage.py runworker omniweb-engine``), and a throwaway
``redis-server``, all on free ports of 127.0.0.1 under the test's temporary directory, with a
self-signed certificate. Clients connect with ``wss://`` through nginx.

- the templates render, refuse missing values and pass ``nginx -t``;
- the embedded default (no Redis) behind nginx: a streamed session, the HTTP→HTTPS redirect, static
  files from nginx, a 3 MiB session.config, /healthz;
- scale-out over Redis with two workers: a streamed session; then long flushes on several sessions,
  SIGKILL of a worker that serves some of them: its sessions get ``error`` + ``audio.done`` with
  ``error: true`` + ``session.done`` within 5 s, the other worker's sessions finish normally, and new
  work runs on the survivor.

Services' logs are printed at teardown (pytest shows them when a test fails). Skipped only when the
redis-server or nginx binary is missing (``.ci/run`` installs both).
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import importlib.util
import io
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import websockets
from support.servers import free_port

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
SPEECH_PATH = "/v1/audio/speech/stream"
WORKER_KEY_PREFIX = "omniweb:worker:"
KILL_DEADLINE = 5.0  # seconds from SIGKILL to the affected sessions' session.done (the lease is 3 s)


def _binary(name: str, *fallbacks: str) -> str | None:
    import shutil

    found = shutil.which(name)
    if found:
        return found
    return next((path for path in fallbacks if os.access(path, os.X_OK)), None)


NGINX = _binary("nginx", "/usr/sbin/nginx", "/usr/local/sbin/nginx")
REDIS_SERVER = _binary("redis-server", "/usr/bin/redis-server", "/usr/local/bin/redis-server")

pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.skipif(
        NGINX is None or REDIS_SERVER is None,
        reason=f"needs the nginx and redis-server binaries (nginx: {NGINX}, redis-server: {REDIS_SERVER}); "
        ".ci/run installs them with apt-get",
    ),
]


def _load_render() -> Any:
    spec = importlib.util.spec_from_file_location("omniweb_deploy_render", DEPLOY / "render.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


render = _load_render()


# -- services ------------------------------------------------------------------------------------


@dataclass
class Service:
    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log(self, limit: int = 30_000) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return text if len(text) <= limit else "...\n" + text[-limit:]


@dataclass
class Stack:
    """The processes of one test, stopped (terminate, then kill their process group) at teardown."""

    tmp: Path
    services: list[Service] = field(default_factory=list)

    def start(self, name: str, cmd: list[str], env: dict[str, str]) -> Service:
        log_path = self.tmp / f"{name}.log"
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        service = Service(name, proc, log_path)
        self.services.append(service)
        return service

    def wait_port(self, service: Service, port: int, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                return
            except OSError:
                if not service.alive():
                    pytest.fail(f"{service.name} exited ({service.proc.returncode}):\n{service.log()}")
                if time.monotonic() > deadline:
                    pytest.fail(f"{service.name} did not listen on {port} within {timeout} s:\n{service.log()}")
                time.sleep(0.1)

    def stop(self) -> None:
        for service in reversed(self.services):
            if service.alive():
                with contextlib.suppress(ProcessLookupError):
                    service.proc.terminate()
        deadline = time.monotonic() + 10
        for service in reversed(self.services):
            with contextlib.suppress(subprocess.TimeoutExpired):
                service.proc.wait(max(0.1, deadline - time.monotonic()))
            # The whole group: nginx's workers, anything a service forked (our own processes only).
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(service.proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                service.proc.wait(5)

    def print_logs(self) -> None:
        for service in self.services:
            print(f"\n===== {service.name} (pid {service.proc.pid}, exit {service.proc.returncode}) =====")
            print(service.log())


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    s = Stack(tmp_path)
    try:
        yield s
    finally:
        s.stop()
        s.print_logs()  # captured: pytest shows it with a failure


def base_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMNIWEB_")}
    env.update(
        DJANGO_SETTINGS_MODULE="omniweb.settings",
        PYTHONUNBUFFERED="1",
        OMNIWEB_PYTHON=sys.executable,
        OMNIWEB_SECRET_KEY="deploy-stack-test-key-the-same-on-every-process",
        OMNIWEB_LOG_LEVEL="INFO",
    )
    env.update(extra)
    return env


# -- TLS and nginx -------------------------------------------------------------------------------


def make_certificate(directory: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 (openssl, else the cryptography package)."""
    cert, key = directory / "cert.pem", directory / "key.pem"
    openssl = _binary("openssl", "/usr/bin/openssl")
    if openssl:
        subprocess.run(
            [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=127.0.0.1",
             "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
            check=True, capture_output=True,
        )  # fmt: skip
        return cert, key
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import NameOID

    pkey = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(pkey.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
        .sign(pkey, hashes.SHA256())
    )
    cert.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key.write_bytes(
        pkey.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert, key


@dataclass
class Nginx:
    prefix: Path
    conf: Path
    http_port: int
    https_port: int
    cert: Path
    static_root: Path

    def client_ssl(self) -> ssl.SSLContext:
        """Trusts exactly the throwaway certificate (and checks it names 127.0.0.1)."""
        ctx = ssl.create_default_context(cafile=str(self.cert))
        return ctx

    @property
    def ws_url(self) -> str:
        return f"wss://127.0.0.1:{self.https_port}{SPEECH_PATH}"


def _nginx_has_e_flag() -> bool:
    out = subprocess.run([NGINX, "-h"], capture_output=True, text=True)
    return "-e filename" in out.stdout + out.stderr  # nginx >= 1.19.5


def nginx_command(n: Nginx, *extra: str) -> list[str]:
    directives = f"daemon off; pid {n.prefix / 'nginx.pid'};"
    if os.geteuid() == 0:
        # Workers would switch to "nobody", who cannot read the test's 0700 temporary directory.
        import pwd

        directives += f" user {pwd.getpwuid(0).pw_name};"
    cmd = [NGINX, "-p", f"{n.prefix}/", "-c", str(n.conf)]
    if _nginx_has_e_flag():
        cmd += ["-e", "stderr"]
    return [*cmd, "-g", directives, *extra]


def render_nginx(tmp: Path, daphne_ports: list[int]) -> Nginx:
    """Render both templates the way docs/deploy.md does, for an unprivileged nginx under ``tmp``."""
    prefix = tmp / "nginx"
    (prefix / "acme").mkdir(parents=True)
    static_root = tmp / "staticfiles"
    static_root.mkdir()
    cert, key = make_certificate(tmp)
    http_port, https_port = free_port(), free_port()
    values = {
        "SERVER_NAME": "127.0.0.1 localhost",
        "HTTP_PORT": str(http_port),
        "HTTPS_PORT": str(https_port),
        "SSL_CERTIFICATE": str(cert),
        "SSL_CERTIFICATE_KEY": str(key),
        "ACME_WEBROOT": str(prefix / "acme"),
        "DAPHNE_UPSTREAMS": ",".join(f"127.0.0.1:{p}" for p in daphne_ports),
        "STATIC_ROOT": str(static_root),
        "NGINX_ACCESS_LOG": str(prefix / "access.log"),
    }
    site = prefix / "omniweb.conf"
    cli = [sys.executable, str(DEPLOY / "render.py"), str(DEPLOY / "nginx" / "omniweb.conf.template"), "-o", str(site)]
    result = subprocess.run(
        [*cli, *(f"--set={k}={v}" for k, v in values.items())], capture_output=True, text=True, env=base_env()
    )
    assert result.returncode == 0, result.stderr
    conf = prefix / "nginx.conf"
    mime_types = Path("/etc/nginx/mime.types")
    if not mime_types.exists():  # an nginx built without the usual layout: the types this test needs
        mime_types = prefix / "mime.types"
        mime_types.write_text("types { text/html html; text/css css; application/javascript js mjs; }\n")
    conf.write_text(
        render.render(
            (DEPLOY / "nginx" / "nginx.conf.template").read_text(),
            {"NGINX_MIME_TYPES": str(mime_types), "OMNIWEB_SITE_CONF": str(site)},
        )
    )
    n = Nginx(prefix, conf, http_port, https_port, cert, static_root)
    check = subprocess.run(nginx_command(n, "-t"), capture_output=True, text=True)
    assert check.returncode == 0, f"nginx -t failed:\n{check.stdout}{check.stderr}\n{site.read_text()}"
    return n


def start_nginx(stack: Stack, n: Nginx) -> None:
    service = stack.start("nginx", nginx_command(n), base_env())
    stack.wait_port(service, n.https_port, timeout=20)


def start_daphne(stack: Stack, env: dict[str, str], name: str = "daphne") -> int:
    port = free_port()
    service = stack.start(name, ["bash", str(DEPLOY / "daphne.sh"), str(port)], env)
    stack.wait_port(service, port, timeout=90)
    if not env.get("OMNIWEB_REDIS_URL"):
        wait_engine_loaded(port)
    return port


def wait_engine_loaded(port: int, timeout: float = 120.0) -> None:
    """An embedded engine loads its models after the port opens (the perception models take some
    seconds), and daphne drops a WebSocket handshake that waits over 5 s: wait as a load balancer's
    health check would, on /healthz."""
    deadline = time.monotonic() + timeout
    while True:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        try:
            conn.request("GET", "/healthz")
            if json.loads(conn.getresponse().read())["ready"]:  # 503 and not ready while the models load
                return
        except (OSError, ValueError, KeyError):
            pass
        finally:
            conn.close()
        assert time.monotonic() < deadline, "the embedded engine did not load its models"
        time.sleep(0.2)


def https_get(n: Nginx, path: str) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPSConnection("127.0.0.1", n.https_port, context=n.client_ssl(), timeout=20)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        conn.close()


# -- sessions ------------------------------------------------------------------------------------


@dataclass
class Session:
    """Utterances on one socket; events are (monotonic time, utterance index, JSON dict or binary length)."""

    events: list[tuple[float, int, dict[str, Any] | int]] = field(default_factory=list)
    got_audio: asyncio.Event = field(default_factory=asyncio.Event)

    def of(self, utterance: int) -> list[tuple[float, dict[str, Any] | int]]:
        return [(t, e) for t, u, e in self.events if u == utterance]

    def json(self, kind: str | None = None, utterance: int = 0) -> list[dict[str, Any]]:
        return [e for _, e in self.of(utterance) if isinstance(e, dict) and (kind is None or e.get("type") == kind)]

    def first(self, kind: str, utterance: int = 0) -> tuple[float, dict[str, Any]]:
        found = [(t, e) for t, e in self.of(utterance) if isinstance(e, dict) and e.get("type") == kind]
        assert found, f"no {kind} in utterance {utterance}: {self.summary(utterance)}"
        return found[0]

    def audio_bytes(self, utterance: int = 0) -> int:
        return sum(e for _, e in self.of(utterance) if isinstance(e, int))

    def types(self, utterance: int = 0) -> list[str]:
        return [e["type"] if isinstance(e, dict) else "<binary>" for _, e in self.of(utterance)]

    def summary(self, utterance: int = 0) -> str:
        kinds = [k for k in self.types(utterance) if k != "<binary>"]
        return (
            f"utterance {utterance}: {len(kinds)} JSON messages, {self.audio_bytes(utterance)} audio bytes; "
            f"last: {self.json(utterance=utterance)[-3:]}"
        )


async def run_session(
    n: Nginx,
    session: Session,
    texts: list[str],
    config: dict[str, Any] | None = None,
    *,
    then: list[list[str]] | None = None,
    timeout: float = 60.0,
) -> None:
    """Speak ``texts`` through nginx, then each of ``then`` as further utterances on the same socket."""
    # Sentence by sentence: these tests count sentences through the stack (the default is one per flush).
    default = {"response_format": "pcm", "stream_audio": True, "split_granularity": "sentence"}
    config = default if config is None else config
    async with websockets.connect(n.ws_url, ssl=n.client_ssl(), max_size=None, open_timeout=20) as ws:
        await ws.send(json.dumps({"type": "session.config", **config}))
        for utterance, parts in enumerate([texts, *(then or [])]):
            for text in parts:
                await ws.send(json.dumps({"type": "input.text", "text": text}))
            await ws.send(json.dumps({"type": "input.done"}))
            while True:
                raw = await asyncio.wait_for(ws.recv(), timeout)
                now = time.monotonic()
                if isinstance(raw, bytes):
                    session.events.append((now, utterance, len(raw)))
                    session.got_audio.set()
                    continue
                msg = json.loads(raw)
                session.events.append((now, utterance, msg))
                if msg["type"] == "session.done":
                    break
        await ws.send(json.dumps({"type": "session.close"}))


def assert_clean_utterance(session: Session, sentences: int, utterance: int = 0) -> None:
    done = session.json("session.done", utterance)
    assert done and done[-1]["total_sentences"] == sentences, session.summary(utterance)
    assert not session.json("error", utterance), session.json("error", utterance)
    audio_done = session.json("audio.done", utterance)
    assert len(audio_done) == sentences and not any(d["error"] for d in audio_done), audio_done
    assert sum(d["total_bytes"] for d in audio_done) == session.audio_bytes(utterance) > 0


def speak_once(n: Nginx, texts: list[str]) -> Session:
    session = Session()
    asyncio.run(run_session(n, session, texts))
    return session


# -- templates -----------------------------------------------------------------------------------


def test_templates_render_strictly_and_pass_nginx_t(tmp_path):
    template = (DEPLOY / "nginx" / "omniweb.conf.template").read_text()
    names = render.placeholders(template)
    assert {"HTTPS_PORT", "SSL_CERTIFICATE", "SSL_CERTIFICATE_KEY", "DAPHNE_UPSTREAMS", "STATIC_ROOT"} <= set(names)
    # nginx's own variables are not placeholders and pass through.
    assert "$http_upgrade" in template and "http_upgrade" not in names

    with pytest.raises(render.MissingVariables) as missing:
        render.render(template, {"HTTPS_PORT": "443"})
    assert "SSL_CERTIFICATE" in missing.value.names and "HTTPS_PORT" not in missing.value.names
    result = subprocess.run(
        [sys.executable, str(DEPLOY / "render.py"), str(DEPLOY / "nginx" / "omniweb.conf.template")],
        capture_output=True,
        text=True,
        env=base_env(),
    )
    assert result.returncode == 2 and "no value for" in result.stderr and not result.stdout

    assert render.upstream_servers("127.0.0.1:8001, 127.0.0.1:8002") == "server 127.0.0.1:8001; server 127.0.0.1:8002;"
    assert render.upstream_servers("server a:1 max_fails=2;") == "server a:1 max_fails=2;"

    # The documented example values render too (render_nginx runs nginx -t on the test's own).
    example = render.read_env_file(DEPLOY / "nginx" / "nginx.env.example")
    rendered = render.render(template, example)
    assert "${" not in rendered and "server 127.0.0.1:8004;" in rendered
    n = render_nginx(tmp_path, [free_port(), free_port()])
    site = (n.prefix / "omniweb.conf").read_text()
    assert f"listen {n.https_port} ssl;" in site and "proxy_read_timeout 75s;" in site


def test_env_example_lists_every_setting():
    """deploy/omniweb.env.example documents every OMNIWEB_* variable that settings.py reads."""
    import re

    read = set(
        re.findall(r'env_(?:str|int|float|bool|list)\("([A-Z0-9_]+)"', (ROOT / "omniweb/settings.py").read_text())
    )
    example = (DEPLOY / "omniweb.env.example").read_text()
    listed = set(re.findall(r"^#?OMNIWEB_([A-Z0-9_]+)=", example, re.MULTILINE))
    assert read and not read - listed, f"add to deploy/omniweb.env.example: {sorted(read - listed)}"


# -- embedded default behind nginx -----------------------------------------------------------------


def test_access_log_keeps_no_query_strings(stack, tmp_path):
    """Signed tokens ride query strings (and so Referers): nginx logs the path only (issue #11)."""
    n = render_nginx(tmp_path, [free_port()])  # no daphne behind it: the 502 is logged all the same
    start_nginx(stack, n)
    https_get(n, "/speech/?token=secret-token-must-not-be-logged")
    conn = http.client.HTTPConnection("127.0.0.1", n.http_port, timeout=10)
    conn.request("GET", "/v1/ws-token?token=another-secret", headers={"Referer": "https://x/?token=third-secret"})
    conn.getresponse().read()
    conn.close()
    # nginx logs a request after its response has gone: the client can read the file first.
    deadline = time.monotonic() + 5
    while True:
        log = (n.prefix / "access.log").read_text()
        both = '"GET /speech/ HTTP/1.1" 502' in log and '"GET /v1/ws-token HTTP/1.1" 301' in log
        if both or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert both, log
    assert "secret" not in log, log


def test_embedded_daphne_behind_nginx(stack, tmp_path):
    """No Redis: one daphne runs the engine itself; nginx terminates TLS in front of it."""
    daphne_port = start_daphne(stack, base_env())
    n = render_nginx(tmp_path, [daphne_port])
    (n.static_root / "probe.css").write_text("body { color: black; }\n")
    start_nginx(stack, n)

    session = speak_once(n, ["Hello there. ", "How are you today?"])
    starts = session.json("audio.start")
    assert [s["sentence_text"] for s in starts] == ["Hello there.", "How are you today?"], session.summary()
    assert all(s["sample_rate"] == 24000 for s in starts)
    assert_clean_utterance(session, 2)
    assert 1.5 < session.audio_bytes() / 2 / 24000 < 5.0  # seconds of 16-bit mono 24 kHz

    # The protocol's largest message (3 MiB of config) passes nginx and daphne.
    big = Session()
    asyncio.run(run_session(n, big, ["Still fine."], {"client_note": "x" * (3 * 1024 * 1024)}))
    assert big.json("session.done")[-1]["total_sentences"] == 1, big.summary()

    # Plain HTTP redirects to HTTPS.
    conn = http.client.HTTPConnection("127.0.0.1", n.http_port, timeout=10)
    conn.request("GET", "/some/page?x=1")
    response = conn.getresponse()
    assert response.status == 301
    assert response.getheader("Location") == f"https://127.0.0.1:{n.https_port}/some/page?x=1"
    conn.close()

    # Static files come from nginx (daphne serves none with DEBUG off), with a CSS content type.
    status, headers, body = https_get(n, "/static/probe.css")
    assert (status, body) == (200, b"body { color: black; }\n")
    assert headers["content-type"].startswith("text/css")
    assert "max-age=31536000" in headers.get("strict-transport-security", "")

    status, _, body = https_get(n, "/healthz")
    assert status == 200, body
    assert json.loads(body)["ok"] is True

    _openai_sdk_speech_through_nginx(n)


def _openai_sdk_speech_through_nginx(n: Nginx) -> None:
    """The official SDK's streamed speech through nginx: the first bytes reach the client while the
    engine is still synthesizing (nginx does not buffer the stream), and the whole file decodes."""
    import openai

    # 12 sentences (~30 s of speech): within the 30 s the engine runs ahead of playback, so unpaced.
    text = " ".join(f"Sentence number {i} streams through the proxy." for i in range(12))
    http_client = openai.DefaultHttpx2Client(verify=n.client_ssl())
    with (
        openai.OpenAI(
            api_key="unused", base_url=f"https://127.0.0.1:{n.https_port}/v1", max_retries=0, http_client=http_client
        ) as client,
        client.audio.speech.with_streaming_response.create(
            model="tts-1", voice="alloy", input=text, response_format="wav"
        ) as response,
    ):
        chunks = response.iter_bytes()
        first = next(chunks)
        _, _, health = https_get(n, "/healthz")
        busy = json.loads(health)["engine"]["active"]
        rest = b"".join(chunks)
    assert first[:4] == b"RIFF" and busy == 1, (first[:16], busy)  # streamed, not buffered by the proxy
    assert (len(first) + len(rest) - 44) / 2 / 24000 > 20  # every sentence arrived
    _openai_sdk_calls_through_nginx(n)


def _openai_sdk_calls_through_nginx(n: Nginx) -> None:
    """The SDK's other calls through the proxy: every speech format streamed and decoded, our own
    voice transcribed back to its text, and the model list."""
    import av
    import openai

    text = "The proxy passes every format."
    http_client = openai.DefaultHttpx2Client(verify=n.client_ssl())
    base_url = f"https://127.0.0.1:{n.https_port}/v1"
    with openai.OpenAI(api_key="unused", base_url=base_url, max_retries=0, http_client=http_client) as client:
        wav = b""
        for fmt in ("mp3", "opus", "aac", "flac", "wav", "pcm"):
            with client.audio.speech.with_streaming_response.create(
                model="tts-1", voice="alloy", input=text, response_format=fmt
            ) as response:
                body = b"".join(response.iter_bytes())
            if fmt == "pcm":
                seconds = len(body) / 2 / 24000
            else:
                with av.open(io.BytesIO(body)) as container:
                    seconds = sum(f.samples for f in container.decode(audio=0)) / container.streams.audio[0].rate
            assert 1.0 < seconds < 4.0, (fmt, seconds)
            wav = body if fmt == "wav" else wav
        heard = client.audio.transcriptions.create(model="whisper-1", file=("speech.wav", io.BytesIO(wav)))
        assert heard.text.strip().lower().rstrip(".") == text.lower().rstrip("."), heard.text
        assert {"tts-1", "whisper-1", "hibari-tts"} <= {m.id for m in client.models.list()}


# -- scale-out over Redis ------------------------------------------------------------------------

SENTENCE = (
    "Sentence number {i} of a long flush keeps the engine busy with a good many words, "
    "so that the worker is still speaking when it is stopped."
)


def long_flush(sentences: int) -> list[str]:
    words = ["one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"]
    return [SENTENCE.format(i=f"{words[i % 10]} {words[(i // 10) % 10]}") + " " for i in range(sentences)]


def start_redis(stack: Stack) -> str:
    port = free_port()
    data = stack.tmp / "redis"
    data.mkdir()
    service = stack.start(
        "redis",
        [REDIS_SERVER, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", str(data)],
        base_env(),
    )  # fmt: skip
    stack.wait_port(service, port, timeout=20)
    return f"redis://127.0.0.1:{port}/0"


def heartbeats(redis_url: str) -> dict[int, dict[str, Any]]:
    """The live workers' heartbeat values, by pid."""
    import redis

    client = redis.Redis.from_url(redis_url, socket_timeout=5)
    try:
        out = {}
        for key in client.scan_iter(match=WORKER_KEY_PREFIX + "*"):
            raw = client.get(key)
            if raw:
                value = json.loads(raw)
                out[int(value["pid"])] = value
        return out
    finally:
        client.close()


def wait_for_workers(stack: Stack, redis_url: str, workers: list[Service], timeout: float = 120.0) -> None:
    pids = {w.proc.pid for w in workers}
    deadline = time.monotonic() + timeout
    while not pids <= {pid for pid, beat in heartbeats(redis_url).items() if beat.get("ready")}:  # models loaded
        for w in workers:
            if not w.alive():
                pytest.fail(f"{w.name} exited ({w.proc.returncode}):\n{w.log()}")
        if time.monotonic() > deadline:
            pytest.fail(f"workers {pids} not all ready after {timeout} s: {heartbeats(redis_url)}")
        time.sleep(0.2)


SESSIONS = 6
# With the production pacing (30 s of audio ahead of playback) a flush of this length streams for
# ~20 s, so the kill lands mid-stream and the survivors finish well inside the test's timeout.
FLUSH_SENTENCES = 10


def test_scale_out_over_redis_survives_a_killed_worker(stack, tmp_path):
    redis_url = start_redis(stack)
    env = base_env(OMNIWEB_REDIS_URL=redis_url, OMNIWEB_ENGINE_LEASE_SECONDS="3")
    workers = [stack.start(f"worker-{i}", ["bash", str(DEPLOY / "worker.sh")], env) for i in range(2)]
    daphne_port = start_daphne(stack, env)
    n = render_nginx(tmp_path, [daphne_port])
    start_nginx(stack, n)
    wait_for_workers(stack, redis_url, workers)

    # (a) a session through nginx → daphne → Redis → a worker streams real audio.
    session = speak_once(n, ["Hello there. ", "How are you today?"])
    assert_clean_utterance(session, 2)
    assert 1.5 < session.audio_bytes() / 2 / 24000 < 5.0
    status, _, body = https_get(n, "/healthz")
    health = json.loads(body)
    assert status == 200 and health["ok"] is True, health
    assert {w.proc.pid for w in workers} <= {int(w["pid"]) for w in health["workers"] if w.get("pid")}, health

    # (b) a video turn on a frame over the Redis message limit (it travels as a Redis key).
    asyncio.run(_video_turn_through_nginx(n))

    # (c) long flushes on several sessions; SIGKILL a worker that serves some of them.
    asyncio.run(_kill_a_worker_mid_stream(stack, n, redis_url, workers))


async def _video_turn_through_nginx(n: Nginx) -> None:
    import base64

    import cv2
    import numpy as np

    rng = np.random.default_rng(3)
    image = np.clip(np.full((900, 1200, 3), (40, 40, 200), np.int16) + rng.integers(-30, 31, (900, 1200, 3)), 0, 255)
    ok, png = cv2.imencode(".png", image.astype(np.uint8))
    assert ok and len(png) > 2_000_000  # well over channels_redis' 1 MB message limit
    url = n.ws_url.replace("/v1/audio/speech/stream", "/v1/video/chat/stream")
    async with websockets.connect(url, ssl=n.client_ssl(), max_size=None, open_timeout=20) as ws:
        await ws.send(json.dumps({"type": "session.config"}))
        frame = {"type": "video.frame", "data": base64.b64encode(png.tobytes()).decode(), "frame_id": "big"}
        await ws.send(json.dumps(frame))
        ack = json.loads(await asyncio.wait_for(ws.recv(), 30))
        assert ack["type"] == "video.frame.ack" and ack["accepted"], ack
        await ws.send(json.dumps({"type": "video.query", "text": "What colour is it?"}))
        kinds: list[str] = []
        while not kinds or kinds[-1] != "response.audio.done":
            msg = json.loads(await asyncio.wait_for(ws.recv(), 30))
            assert msg["type"] != "error", msg
            kinds.append(msg["type"])
            if msg["type"] == "response.text.done":
                assert "red" in msg["text"].lower(), msg  # the worker saw the picture itself
        assert kinds[:2] == ["response.start", "video.frames.consumed"] and "response.audio.delta" in kinds, kinds


async def _kill_a_worker_mid_stream(stack: Stack, n: Nginx, redis_url: str, workers: list[Service]) -> None:
    flush = long_flush(FLUSH_SENTENCES)
    sessions = [Session() for _ in range(SESSIONS)]
    started = time.monotonic()
    # Each socket then speaks once more: a session whose worker died goes on with a live one.
    again = [["One more sentence on the same socket."]]
    tasks = [asyncio.ensure_future(run_session(n, s, flush, then=again)) for s in sessions]
    try:
        await asyncio.wait_for(asyncio.gather(*(s.got_audio.wait() for s in sessions)), 60)
        print(f"every session has audio {time.monotonic() - started:.1f} s after the first connect")
        await asyncio.sleep(1.5)  # every worker has published a heartbeat since the last session started
        ours = {w.proc.pid: w for w in workers}
        # A heartbeat is a snapshot taken every 0.5 s by a worker busy synthesizing (one read in CI
        # once counted 5 of the 6 running flushes): read until the counts agree, for a few seconds.
        deadline = time.monotonic() + 5.0
        while True:
            beats = await asyncio.to_thread(heartbeats, redis_url)
            active = {pid: int(beats[pid]["active"]) for pid in ours if pid in beats}
            if (set(active) == set(ours) and sum(active.values()) == SESSIONS) or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.25)
        assert set(active) == set(ours), f"a worker stopped heartbeating: {beats}"
        unfinished = [i for i, s in enumerate(sessions) if not s.json("session.done")]
        finished = {i: s.summary() for i, s in enumerate(sessions) if i not in unfinished}
        assert sum(active.values()) == len(unfinished) == SESSIONS, (
            f"the flushes must still be running when the worker is killed (make FLUSH_SENTENCES larger): "
            f"active by worker {active}, unfinished sessions {unfinished}, the finished ones: {finished}, "
            f"heartbeats: {beats}"
        )
        # The busier worker: its peer then serves any others (both outcomes checked whenever the
        # sessions are split at all) and is left with the fewest flushes to finish.
        victim_pid = max(active, key=lambda pid: active[pid])
        victim = ours[victim_pid]
        victim_sessions = active[victim_pid]
        victim.proc.send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        print(
            f"killed {victim.name} (pid {victim_pid}) {killed_at - started:.1f} s in, serving {victim_sessions} "
            f"of {SESSIONS} sessions; active by worker {active}"
        )
        results = await asyncio.gather(*tasks, return_exceptions=True)
        print(f"flushes ended {time.monotonic() - killed_at:.1f} s after the kill")
    finally:
        for task in tasks:
            task.cancel()
    problems = [r for r in results if isinstance(r, BaseException)]
    assert not problems, f"sessions failed: {problems!r}"

    lost = [s for s in sessions if s.json("error")]
    kept = [s for s in sessions if not s.json("error")]
    assert len(lost) == victim_sessions, (
        f"{len(lost)} sessions got an error, the killed worker served {victim_sessions}: {[s.summary() for s in lost]}"
    )
    for s in lost:
        (error_at, error), (done_at, done) = s.first("error"), s.first("session.done")
        failed_at, failed = next(
            ((t, d) for t, d in s.of(0) if isinstance(d, dict) and d["type"] == "audio.done" and d["error"]),
            (None, None),
        )
        assert failed is not None, f"no audio.done with error: true: {s.summary()}"
        for what, at in (("error", error_at), ("audio.done with error", failed_at), ("session.done", done_at)):
            assert 0 <= at - killed_at <= KILL_DEADLINE, f"{what} {at - killed_at:.2f} s after the kill: {s.summary()}"
        assert f"sentence {failed['sentence_index']}" in error["message"], (error, failed)
        assert s.types(0)[-1] == "session.done" and done["total_sentences"] == len(s.json("audio.done"))
        assert sum(d["total_bytes"] for d in s.json("audio.done")) == s.audio_bytes()
        assert_clean_utterance(s, 1, utterance=1)  # the same socket, served by the survivor
    for s in kept:
        assert_clean_utterance(s, FLUSH_SENTENCES)
        assert_clean_utterance(s, 1, utterance=1)

    # (d) new work after the kill completes on the surviving worker.
    survivor = next(w for w in workers if w is not victim)
    assert survivor.alive(), survivor.log()
    fresh = Session()
    await run_session(n, fresh, ["After the worker was lost, this still works. ", "And so does this."])
    assert_clean_utterance(fresh, 2)
    beats = await asyncio.to_thread(heartbeats, redis_url)
    assert survivor.proc.pid in beats, beats
    await asyncio.sleep(KILL_DEADLINE)  # the dead worker's key expires (its TTL is the lease + 2 s)
    beats = await asyncio.to_thread(heartbeats, redis_url)
    assert victim_pid not in beats and survivor.proc.pid in beats, beats
    status, _, body = await asyncio.to_thread(https_get, n, "/healthz")
    health = json.loads(body)
    assert status == 200 and health["ok"] is True, health
    assert {int(w["pid"]) for w in health["workers"] if w.get("up") and w.get("pid")} == {survivor.proc.pid}, health
