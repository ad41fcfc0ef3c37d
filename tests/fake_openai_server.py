"""A scripted OpenAI-compatible HTTP server for tests (127.0.0.1 only, no internet needed).

Tests queue ``Reply`` entries and point a real ``ChatOpenAI`` at ``server.base_url``. Each
POST /v1/chat/completions takes the next entry. A JSON reply is delivered the way the request
asks for structured output: as a tool call when the request has ``tools`` (function calling),
otherwise as the message content (``response_format`` json_schema / json_object, or plain
prompting). A text reply is always plain content, which is how a server that ignores
``response_format`` behaves. Every request body is kept in ``server.requests``.

    with FakeOpenAIServer([Reply.json({"x": 1}), Reply.error(500)]) as server:
        ChatOpenAI(base_url=server.base_url, api_key="x", model=server.model) ...

or use the ``fake_openai`` pytest fixture (import it into a test module or a conftest).
"""

from __future__ import annotations

import json
import threading
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest


@dataclass(frozen=True)
class Reply:
    """One scripted answer; build it with the class methods."""

    text: str | None = None
    data: Any = None  # JSON answer (content or tool-call arguments)
    status: int = 200
    delay_s: float = 0.0  # wait this long before answering (client timeouts)
    finish_reason: str = "stop"
    prompt_tokens: int = 11
    completion_tokens: int = 7
    cached_tokens: int | None = None  # reported as usage.prompt_tokens_details.cached_tokens (OpenAI's prompt cache)

    @classmethod
    def content(cls, text: str, **kw: Any) -> Reply:
        return cls(text=text, **kw)

    @classmethod
    def json(cls, data: Any, **kw: Any) -> Reply:
        return cls(data=data, **kw)

    @classmethod
    def error(cls, status: int, message: str = "scripted error") -> Reply:
        return cls(text=message, status=status)

    @classmethod
    def hang(cls, seconds: float, then: Reply | None = None) -> Reply:
        """Answer only after ``seconds`` (``then``, or an empty text answer)."""
        return replace(then or cls(text=""), delay_s=seconds)


class FakeOpenAIServer:
    def __init__(self, script: Iterable[Reply] = (), model: str = "fake-model") -> None:
        self.model = model
        self.requests: list[dict] = []
        self._script: deque[Reply] = deque(script)
        self._lock = threading.Lock()
        # Set on stop so that a handler in the middle of a "hang" gives up at once.
        self._stopping = threading.Event()
        self._httpd: ThreadingHTTPServer | None = None

    # ---- script -------------------------------------------------------------------------
    def push(self, *replies: Reply) -> None:
        with self._lock:
            self._script.extend(replies)

    @property
    def remaining(self) -> int:
        with self._lock:
            return len(self._script)

    def _next(self, body: dict) -> Reply:
        with self._lock:
            self.requests.append(body)
            if self._script:
                return self._script.popleft()
        return Reply.error(500, "fake server: no scripted reply left")

    # ---- lifecycle ----------------------------------------------------------------------
    @property
    def base_url(self) -> str:
        assert self._httpd is not None, "server not started"
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    def start(self) -> FakeOpenAIServer:
        handler = type("Handler", (_Handler,), {"fake": self})
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)  # port 0: a free port
        self._httpd.daemon_threads = True
        # A short poll interval makes stop() quick (the default 0.5 s adds up over many tests).
        threading.Thread(target=self._httpd.serve_forever, args=(0.02,), daemon=True).start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._stopping.set()
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    def __enter__(self) -> FakeOpenAIServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- answers ------------------------------------------------------------------------
    def completion(self, body: dict, reply: Reply) -> dict:
        message: dict[str, Any] = {"role": "assistant", "content": reply.text}
        if reply.data is not None:
            arguments = json.dumps(reply.data)
            if body.get("tools"):
                name = _forced_tool(body) or body["tools"][0]["function"]["name"]
                message["content"] = None
                message["tool_calls"] = [
                    {
                        "id": f"call_{len(self.requests)}",
                        "type": "function",
                        "function": {"name": name, "arguments": arguments},
                    }
                ]
            else:
                message["content"] = arguments
        return {
            "id": f"chatcmpl-{len(self.requests)}",
            "object": "chat.completion",
            "created": 0,
            "model": body.get("model", self.model),
            "choices": [{"index": 0, "message": message, "finish_reason": reply.finish_reason}],
            "usage": {
                "prompt_tokens": reply.prompt_tokens,
                "completion_tokens": reply.completion_tokens,
                "total_tokens": reply.prompt_tokens + reply.completion_tokens,
                **({"prompt_tokens_details": {"cached_tokens": reply.cached_tokens}}
                   if reply.cached_tokens is not None else {}),
            },
        }


def _forced_tool(body: dict) -> str | None:
    choice = body.get("tool_choice")
    return choice.get("function", {}).get("name") if isinstance(choice, dict) else None


class _Handler(BaseHTTPRequestHandler):
    fake: FakeOpenAIServer
    protocol_version = "HTTP/1.1"  # keep-alive, like a real server behind the openai client

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass  # keep pytest output clean

    def do_GET(self) -> None:
        if self.path.rstrip("/") == "/v1/models":
            self._send(200, {"object": "list", "data": [
                {"id": self.fake.model, "object": "model", "created": 0, "owned_by": "fake"}]})
        else:
            self._send(404, _error_body("not found", 404))

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        if self.path.rstrip("/") != "/v1/chat/completions":
            self._send(404, _error_body(f"unknown path {self.path}", 404))
            return
        reply = self.fake._next(body)
        if reply.delay_s and self.fake._stopping.wait(reply.delay_s):
            return
        if reply.status != 200:
            self._send(reply.status, _error_body(reply.text or "error", reply.status))
        else:
            self._send(200, self.fake.completion(body, reply))

    def _send(self, status: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client timed out and went away during a scripted hang


def _error_body(message: str, status: int) -> dict:
    return {"error": {"message": message, "type": "fake_error", "code": status}}


@pytest.fixture
def fake_openai():
    """A started ``FakeOpenAIServer`` with an empty script; ``push`` replies onto it."""
    with FakeOpenAIServer() as server:
        yield server
