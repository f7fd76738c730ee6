"""A fault-injecting model server on loopback: OpenAI Chat Completions and Anthropic Messages
on the wire, one fault chosen per request, requests counted per scenario.

Why our own: a provider's bad days (rate limits, 500s, malformed bodies, cut streams, hangs)
cannot be ordered from a real server, and the tests must say how many requests robot-lab
made. A scenario is a list of faults, one per request in order, the last one repeating::

    base = fault_server.scenario("429", "ok")      # http://127.0.0.1:PORT/s3/v1
    robot = build("r", model="openai/m", api_base=base, api_key="x")
    fault_server.count(base)                        # requests the scenario received

Faults: ``ok`` (text, or with tools offered and no tool result yet, a call of the first
tool), ``text`` (text even with tools), ``429`` / ``429:SECONDS`` (with ``Retry-After``),
``500``, ``bad_json`` (a body that is not JSON), ``empty_choices``, ``no_usage``,
``unknown_tool``, ``bad_args`` (tool arguments that are not JSON), ``cut`` (a stream that
stops after two text chunks; a non-streamed request is cut mid-body), ``hang`` (no answer
until the server stops), ``trickle`` (one text chunk every 0.3 s) and ``length``
(``finish_reason: "length"`` / ``stop_reason: "max_tokens"``).
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

REPLY = "the quick brown fox"
USAGE = {"prompt_tokens": 11, "completion_tokens": 4, "total_tokens": 15}


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def do_POST(self) -> None:
        parts = self.path.strip("/").split("/")
        name = parts[0]
        body = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)) or b"{}")
        fault = self.server.owner.take(name, {k.lower(): v for k, v in self.headers.items()})
        anthropic = self.path.rstrip("/").endswith("/messages")
        try:
            self._answer(fault, body, anthropic)
        except (BrokenPipeError, ConnectionResetError):
            pass

    # --- the answers ----------------------------------------------------------------------
    def _answer(self, fault: str, body: dict[str, Any], anthropic: bool) -> None:
        code, _, arg = fault.partition(":")
        if code == "429":
            self._json(429, {"error": {"message": "rate limited", "type": "rate_limit_error"}},
                       {"Retry-After": arg or "1"})
            return
        if code == "500":
            self._json(500, {"error": {"message": "internal error", "type": "server_error"}})
            return
        if code == "bad_json":
            self._raw(200, b"{this is not json", "application/json")
            return
        if code == "hang":
            self.server.owner.stopping.wait(float(arg or 600))
            return
        stream = bool(body.get("stream"))
        kind, payload = self._decide(code, body)
        if anthropic:
            self._anthropic(code, kind, payload, stream)
        else:
            self._openai(code, kind, payload, stream)

    def _decide(self, code: str, body: dict[str, Any]) -> tuple[str, Any]:
        """('text', str) or ('tool', (name, arguments text))."""
        tools = body.get("tools") or []
        answered = any(m.get("role") == "tool" or _has_tool_result(m) for m in body.get("messages") or [])
        if code in {"unknown_tool", "bad_args"} or (code == "ok" and tools and not answered):
            first = tools[0] if tools else {}
            name = first.get("function", {}).get("name") or first.get("name") or "tool"
            if code == "unknown_tool":
                name = "no_such_tool"
            return "tool", (name, "{not json" if code == "bad_args" else "{}")
        return "text", REPLY

    def _openai(self, code: str, kind: str, payload: Any, stream: bool) -> None:
        finish = "length" if code == "length" else ("tool_calls" if kind == "tool" else "stop")
        message: dict[str, Any] = {"role": "assistant", "content": payload if kind == "text" else None}
        if kind == "tool":
            message["tool_calls"] = [{"id": "call_1", "type": "function",
                                      "function": {"name": payload[0], "arguments": payload[1]}}]
        if not stream:
            reply: dict[str, Any] = {"id": "chatcmpl-1", "object": "chat.completion", "created": int(time.time()),
                                     "model": "fault", "choices": [{"index": 0, "message": message,
                                                                    "finish_reason": finish}]}
            if code == "empty_choices":
                reply["choices"] = []
            if code != "no_usage":
                reply["usage"] = USAGE
            if code == "cut":
                data = json.dumps(reply).encode()
                self._raw(200, data[: len(data) // 2], "application/json", length=len(data))
                return
            self._json(200, reply)
            return
        self._start_stream()
        base = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": int(time.time()), "model": "fault"}
        if code == "empty_choices":
            self._event({**base, "choices": []})
        elif kind == "text":
            words = payload.split(" ")
            for i, word in enumerate(words):
                if code == "cut" and i == 2:
                    self.close_connection = True
                    return
                if code == "trickle":
                    time.sleep(0.3)
                text = word if i == 0 else " " + word
                self._event({**base, "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]})
        else:
            name, args = payload
            self._event({**base, "choices": [{"index": 0, "delta": {"role": "assistant", "tool_calls": [
                {"index": 0, "id": "call_1", "type": "function", "function": {"name": name, "arguments": ""}}]},
                "finish_reason": None}]})
            for ch in args:
                self._event({**base, "choices": [{"index": 0, "delta": {"tool_calls": [
                    {"index": 0, "function": {"arguments": ch}}]}, "finish_reason": None}]})
        if code != "empty_choices":
            self._event({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
        if code != "no_usage":
            self._event({**base, "choices": [], "usage": USAGE})
        self._chunk(b"data: [DONE]\n\n")
        self._chunk(b"")

    def _anthropic(self, code: str, kind: str, payload: Any, stream: bool) -> None:
        stop = "max_tokens" if code == "length" else ("tool_use" if kind == "tool" else "end_turn")
        usage = {"input_tokens": USAGE["prompt_tokens"], "output_tokens": USAGE["completion_tokens"]}
        block: dict[str, Any] = ({"type": "text", "text": payload} if kind == "text" else
                                 {"type": "tool_use", "id": "toolu_1", "name": payload[0], "input": {}})
        if not stream:
            self._json(200, {"id": "msg_1", "type": "message", "role": "assistant", "model": "fault",
                             "content": [block], "stop_reason": stop, "stop_sequence": None, "usage": usage})
            return
        self._start_stream()
        self._event({"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant",
                     "model": "fault", "content": [], "stop_reason": None,
                     "usage": {"input_tokens": usage["input_tokens"], "output_tokens": 0}}}, "message_start")
        self._event({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
                    "content_block_start")
        for i, word in enumerate(REPLY.split(" ")):
            if code == "cut" and i == 2:
                self.close_connection = True
                return
            if code == "trickle":
                time.sleep(0.3)
            self._event({"type": "content_block_delta", "index": 0,
                         "delta": {"type": "text_delta", "text": word if i == 0 else " " + word}},
                        "content_block_delta")
        self._event({"type": "content_block_stop", "index": 0}, "content_block_stop")
        self._event({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
                     "usage": {"output_tokens": usage["output_tokens"]}}, "message_delta")
        self._event({"type": "message_stop"}, "message_stop")
        self._chunk(b"")

    # --- the wire -------------------------------------------------------------------------
    def _json(self, status: int, value: Any, headers: dict[str, str] | None = None) -> None:
        self._raw(status, json.dumps(value).encode(), "application/json", headers=headers)

    def _raw(self, status: int, data: bytes, ctype: str, *, headers: dict[str, str] | None = None,
             length: int | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data) if length is None else length))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)
        if length is not None:
            self.close_connection = True

    def _start_stream(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _event(self, value: Any, event: str | None = None) -> None:
        prefix = f"event: {event}\n".encode() if event else b""
        self._chunk(prefix + b"data: " + json.dumps(value).encode() + b"\n\n")


def _has_tool_result(message: dict[str, Any]) -> bool:
    content = message.get("content")
    return isinstance(content, list) and any(isinstance(b, dict) and b.get("type") == "tool_result" for b in content)


def _scenario_of(base_url: str) -> str:
    """``s3`` of ``http://127.0.0.1:PORT/s3/v1`` (or of the Anthropic root, without ``/v1``)."""
    parts = base_url.rstrip("/").split("/")
    return parts[-2] if parts[-1] == "v1" else parts[-1]


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    owner: FaultServer


class FaultServer:
    """The server and its scenarios; thread-safe counters."""

    def __init__(self) -> None:
        self.stopping = threading.Event()
        self._httpd = _Server(("127.0.0.1", 0), _Handler)
        self._httpd.owner = self
        self.port = self._httpd.server_address[1]
        self._lock = threading.Lock()
        self._scenarios: dict[str, list[str]] = {}
        self._counts: dict[str, int] = {}
        self._headers: dict[str, list[dict[str, str]]] = {}
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="fault-server", daemon=True)
        self._thread.start()

    def scenario(self, *faults: str) -> str:
        """A new scenario answering ``faults`` in order (the last repeats); its base URL."""
        with self._lock:
            name = f"s{len(self._scenarios) + 1}"
            self._scenarios[name] = list(faults) or ["ok"]
            self._counts[name] = 0
        return f"http://127.0.0.1:{self.port}/{name}/v1"

    def take(self, name: str, headers: dict[str, str] | None = None) -> str:
        with self._lock:
            self._headers.setdefault(name, []).append(headers or {})
            faults = self._scenarios.get(name, ["500"])
            n = self._counts.get(name, 0)
            self._counts[name] = n + 1
        return faults[min(n, len(faults) - 1)]

    def count(self, base_url: str) -> int:
        """Requests the scenario of ``base_url`` received so far."""
        with self._lock:
            return self._counts.get(_scenario_of(base_url), 0)

    def headers(self, base_url: str) -> list[dict[str, str]]:
        """The request headers the scenario of ``base_url`` received, in order (lower case)."""
        with self._lock:
            return list(self._headers.get(_scenario_of(base_url), []))

    def close(self) -> None:
        self.stopping.set()
        self._httpd.shutdown()
        self._httpd.server_close()
