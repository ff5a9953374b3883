"""DecisionMaker: asks an LLM "replace now?" under a JSON schema and validates the answer.

Backends (the one I/O seam to the model; tests put a fake or a garbage server there):
  inproc  llama_cpp.Llama in this process; greedy decoding. A schema that compiles to a choice
          template (rudder.agent.choice: the default variant's) is decoded by reading its forced
          text in batches and sampling only its choices; any other schema becomes a llama.cpp
          grammar (response_format={"type": "json_object", "schema": ...}). Either way the output
          is JSON by construction.
  http    any OpenAI-compatible /v1/chat/completions (llama_cpp.server, the node's AgentService,
          vLLM, Ollama) with the schema in response_format; stdlib http.client under one total
          deadline per decision (connect, send, every read), enforced from outside the call.

An answer that is empty, not JSON, not valid under the Answer model, cut off
(finish_reason != "stop"), or later than `timeout_s` never steers: the decision carries
`fallback=<AgentConfig.fallback>` and the reason says what went wrong. Nothing is ever read from
free text by substring search.
"""
from __future__ import annotations

import http.client
import json
import logging
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlsplit

from pydantic import ValidationError

from rudder.agent.context import Prompt
from rudder.agent.messages import Answer, Decision

if TYPE_CHECKING:
    from rudder.config import AgentConfig

log = logging.getLogger(__name__)

RAW_MAX = 2000  # chars of raw model output kept in a decision record
N_CTX = 4096  # prompt (~1.9-2.7k tokens with examples) + answer fit with room to spare

# Policies that can stand in when the agent has no valid answer (they need no model).
FALLBACKS = ("static", "fixed", "lookahead")


def resolve_fallback(name: str, lookahead: int = 0) -> str:
    """AgentConfig.fallback "auto": the lookahead policy when the run samples ahead (the best
    known baseline there), else static (a MassiveGNN round without a model seldom pays)."""
    if name == "auto":
        from rudder.prefetch.policy import mechanism_for  # torch: not for every importer

        return "lookahead" if mechanism_for(lookahead) == "lookahead" else "static"
    if name not in FALLBACKS:
        raise ValueError(f"agent fallback {name!r} not usable; valid: auto, {', '.join(FALLBACKS)}")
    return name


@dataclass
class Completion:
    text: str
    finish_reason: str | None


class BackendError(RuntimeError):
    """The backend gave no usable completion; `kind` is a short word for records and tests."""

    def __init__(self, kind: str, msg: str):
        super().__init__(msg)
        self.kind = kind


class Backend(Protocol):
    name: str

    def complete(self, messages: list[dict], schema: dict, max_tokens: int, timeout_s: float,
                 cancel: threading.Event | None = None) -> Completion: ...

    def close(self) -> None: ...


class InprocBackend:
    """llama.cpp in this process. Not thread-safe: one call at a time (lock)."""

    name = "inproc"

    def __init__(self, model_path: str | Path, threads: int = 1, chat_format: str | None = None,
                 n_ctx: int = N_CTX, seed: int = 0):
        from llama_cpp import Llama

        self.model_path = str(model_path)
        self.llm = Llama(model_path=self.model_path, n_ctx=n_ctx, n_threads=threads,
                         n_threads_batch=threads, chat_format=chat_format, seed=seed, verbose=False)
        self._lock = threading.Lock()
        self._choice = None  # the choice decoder, made at its first use (its token trie: ~1 s)

    def _decoder(self):
        from rudder.agent.choice import ChoiceDecoder, Unsupported

        if self._choice is None:
            try:
                self._choice = ChoiceDecoder(self.llm)
            except Unsupported:  # a chat format other than the model's own template
                self._choice = False
        return self._choice

    def complete(self, messages, schema, max_tokens, timeout_s, cancel=None) -> Completion:
        deadline = time.monotonic() + timeout_s
        parts: list[str] = []
        finish = None
        with self._lock:
            if self.llm is None:
                raise BackendError("closed", "model closed")
            from rudder.agent.choice import template

            tpl = template(schema)
            decoder = self._decoder() if tpl is not None else None
            if decoder:
                text, finish, _ = decoder.complete(messages, tpl, max_tokens, deadline, cancel)
                return Completion(text, finish)
            # Streamed so a late answer (or close()) stops generating after the current token;
            # the answer is then judged late/cut off and the fallback applies.
            stream = self.llm.create_chat_completion(
                messages=messages, response_format={"type": "json_object", "schema": schema},
                max_tokens=max_tokens, temperature=0.0, stream=True,
            )
            try:
                for chunk in stream:
                    choice = chunk["choices"][0]
                    parts.append(choice.get("delta", {}).get("content") or "")
                    finish = choice.get("finish_reason") or finish
                    if cancel is not None and cancel.is_set():  # close(): the run is over
                        finish = finish or "cancelled"
                        break
                    if time.monotonic() > deadline:
                        finish = finish or "timeout"
                        break
            finally:
                stream.close()
        return Completion("".join(parts), finish)

    def close(self) -> None:
        with self._lock:
            if self.llm is not None:
                self.llm.close()  # frees the model now (avoids a TypeError in __del__ at exit)
                self.llm = None


def chat_url(url: str) -> str:
    """Accepts http://h:p, http://h:p/v1 or the full /v1/chat/completions address."""
    url = url.rstrip("/")
    if url.endswith("/chat/completions"):
        return url
    if url.endswith("/v1"):
        return url + "/chat/completions"
    return url + "/v1/chat/completions"


class HttpBackend:
    """An OpenAI-compatible server. schema_style: "json_object" (llama.cpp's form:
    {"type": "json_object", "schema": S}) or "json_schema" (OpenAI/vLLM/Ollama's form)."""

    name = "http"

    def __init__(self, url: str, model: str = "", schema_style: str = "json_object"):
        self.url = chat_url(url)
        self.model = model
        self.schema_style = schema_style

    def _response_format(self, schema: dict) -> dict:
        if self.schema_style == "json_schema":
            return {"type": "json_schema", "json_schema": {"name": "decision", "schema": schema, "strict": True}}
        return {"type": "json_object", "schema": schema}

    def complete(self, messages, schema, max_tokens, timeout_s, cancel=None) -> Completion:
        """One request under a total deadline of `timeout_s` (connect, send and every read
        together): the exchange runs in a worker thread; this thread waits for it and, past the
        deadline or on `cancel`, shuts the socket, which ends the worker's blocking call at once.
        (urlopen's timeout bounds each read only: a server trickling bytes would hold it.)"""
        body = json.dumps({
            "model": self.model, "messages": messages, "max_tokens": max_tokens, "temperature": 0.0,
            "response_format": self._response_format(schema), "stream": False,
        }).encode()
        deadline = time.monotonic() + timeout_s
        call = _HttpCall(self.url, body, deadline)
        worker = threading.Thread(target=call.run, name="agent-http", daemon=True)
        worker.start()
        while not call.done.wait(min(0.1, max(0.0, deadline - time.monotonic()))):
            if cancel is not None and cancel.is_set():
                call.abort()
                raise BackendError("cancelled", "the run ended before the answer")
            if time.monotonic() >= deadline:
                call.abort()
                raise BackendError("timeout", f"no complete answer from {self.url} within "
                                   f"{timeout_s:.1f} s (total deadline)")
        if call.error is not None:
            raise call.error
        payload = call.payload
        try:
            data = json.loads(payload)
            choice = data["choices"][0]
            return Completion(choice["message"].get("content") or "", choice.get("finish_reason"))
        except (ValueError, KeyError, IndexError, TypeError, AttributeError):
            raise BackendError("bad-response", f"not an OpenAI chat completion: {payload[:200]!r}") from None

    def close(self) -> None:
        pass


class _HttpCall:
    """One request (POST with a body, else GET) on its own connection, every step bounded by one
    deadline; run by a worker thread (abort() shuts its socket) or inline."""

    MAX_BYTES = 1 << 20  # an answer is a few hundred bytes; a runaway server is cut off

    def __init__(self, url: str, body: bytes | None, deadline: float):
        self.url, self.body, self.deadline = url, body, deadline
        self.done = threading.Event()
        self.payload = b""
        self.error: BackendError | None = None
        self._conn: http.client.HTTPConnection | None = None
        self._aborted = False

    def _left(self) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0 or self._aborted:
            raise TimeoutError("deadline passed")
        return left

    def run(self) -> None:
        parts = urlsplit(self.url)
        cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        try:
            self._conn = conn = cls(parts.hostname, parts.port, timeout=self._left())
            if self.body is None:
                conn.request("GET", parts.path or "/")
            else:
                conn.request("POST", parts.path or "/", body=self.body,
                             headers={"Content-Type": "application/json"})
            conn.sock.settimeout(self._left())
            resp = conn.getresponse()
            chunks, size = [], 0
            while True:  # each read bounded by what is left of the deadline
                conn.sock.settimeout(self._left()) if conn.sock else None
                chunk = resp.read1(65536)
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
                if size > self.MAX_BYTES:
                    raise BackendError("bad-response", f"answer from {self.url} over {self.MAX_BYTES} bytes")
            if resp.status != 200:
                raise BackendError("http", f"HTTP {resp.status} from {self.url}")
            self.payload = b"".join(chunks)
        except BackendError as exc:
            self.error = exc
        except (TimeoutError, socket.timeout):
            self.error = BackendError("timeout", f"no answer from {self.url} in time")
        except (OSError, http.client.HTTPException) as exc:
            kind = "timeout" if self._aborted else "connect"
            self.error = BackendError(kind, f"connection to {self.url} failed: {exc}")
        finally:
            if self._conn is not None:
                self._conn.close()
            self.done.set()

    def abort(self) -> None:
        self._aborted = True
        conn = self._conn
        sock = conn.sock if conn is not None else None
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)  # wakes the worker's recv/send now
            except OSError:
                pass


def http_ok(url: str, timeout_s: float) -> bool:
    """True when GET `url` answers 200 within timeout_s in all (a server that trickles bytes
    cannot hold the caller longer)."""
    call = _HttpCall(url, None, time.monotonic() + timeout_s)
    call.run()
    return call.error is None


class DecisionMaker:
    """One call per closed window: prompt in, validated Decision (or a recorded fallback) out."""

    def __init__(self, backend: Backend, model: str, fallback: str = "static", max_tokens: int = 160,
                 timeout_s: float = 20.0):
        fallback = resolve_fallback(fallback)
        self.backend = backend
        self.model = model
        self.fallback = fallback
        self.max_tokens = max_tokens
        self.timeout_s = timeout_s

    @classmethod
    def from_config(cls, cfg: "AgentConfig", url: str | None = None) -> "DecisionMaker":
        """Backend per config; `url` (e.g. $RUDDER_AGENT_URL, the node's service) forces http."""
        url = url or (cfg.url if cfg.backend == "http" else None)
        if url:
            backend: Backend = HttpBackend(url, model=cfg.model.name)
        elif cfg.backend == "http":
            raise ValueError("agent.backend=http needs agent.url (or RUDDER_AGENT_URL)")
        elif cfg.backend == "last-example":
            from rudder.agent.last_example import LastExampleBackend

            return cls(LastExampleBackend(), "last-example", cfg.fallback, cfg.max_tokens, cfg.timeout_s)
        else:
            from rudder.agent.models import resolve_model

            backend = InprocBackend(resolve_model(cfg.model), threads=cfg.threads,
                                    chat_format=cfg.model.chat_format)
        return cls(backend, cfg.model.name, cfg.fallback, cfg.max_tokens, cfg.timeout_s)

    def _fallback(self, why: str, raw: str, latency: float, prompt: Prompt) -> Decision:
        log.info("agent answer unusable (%s): %s applies", why, self.fallback)
        return Decision(model=self.model, backend=self.backend.name, prompt_hash=prompt.hash,
                        raw=raw[:RAW_MAX], reason=f"fallback: {why}"[:RAW_MAX], latency_s=latency,
                        fallback=self.fallback)

    def decide(self, prompt: Prompt, cancel: threading.Event | None = None) -> Decision:
        t0 = time.monotonic()
        try:
            comp = self.backend.complete(prompt.messages, prompt.schema, self.max_tokens, self.timeout_s, cancel)
        except BackendError as exc:
            why = f"late: {exc.kind}: {exc}" if exc.kind == "timeout" else f"{exc.kind}: {exc}"
            return self._fallback(why, "", time.monotonic() - t0, prompt)
        except Exception as exc:  # a backend bug must not kill the agent thread
            log.exception("agent backend failed")
            return self._fallback(f"error: {type(exc).__name__}: {exc}", "", time.monotonic() - t0, prompt)
        latency = time.monotonic() - t0
        return self.validate(comp, latency, prompt)

    def validate(self, comp: Completion, latency: float, prompt: Prompt) -> Decision:
        text = comp.text.strip()
        if latency > self.timeout_s:
            return self._fallback(f"late: {latency:.1f} s > {self.timeout_s:.1f} s", text, latency, prompt)
        if comp.finish_reason == "cancelled":
            return self._fallback("cancelled: the run ended before the answer", text, latency, prompt)
        if comp.finish_reason != "stop":
            return self._fallback(f"truncated: finish_reason={comp.finish_reason}", text, latency, prompt)
        if not text:
            return self._fallback("empty answer", text, latency, prompt)
        try:
            ans = Answer.model_validate_json(text)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(map(str, first.get("loc", ()))) or "<json>"
            return self._fallback(f"invalid: {where}: {first.get('msg')}", text, latency, prompt)
        return Decision.from_answer(ans, model=self.model, backend=self.backend.name,
                                    prompt_hash=prompt.hash, raw=text[:RAW_MAX], latency_s=latency)

    def warm(self, prompt: Prompt, strict: bool = False) -> float:
        """Evaluates a prompt once (one token) so its constant prefix sits in the KV cache; the
        first real decision then pays only for its own last message. Returns seconds spent.
        In a run warming is an optimisation, never fatal (the agent falls back); strict (a
        command pointed at a server, whose fallbacks would read as results): a failure is a
        ValueError naming the server."""
        t0 = time.monotonic()
        try:
            self.backend.complete(prompt.messages, prompt.schema, 1, max(self.timeout_s, 60.0))
        except Exception as exc:
            if strict:
                where = getattr(self.backend, "url", self.backend.name)
                raise ValueError(f"{where}: no usable server ({exc})") from None
            log.info("agent warm-up failed: %s", exc)
        return time.monotonic() - t0

    def close(self) -> None:
        self.backend.close()


def warm_prompt(variant: str = "default") -> Prompt:
    """A prompt whose prefix (system + canned examples) every real prompt of `variant` shares."""
    from rudder.agent.context import ContextBuilder
    from rudder.agent.prompt_texts import CANNED, CANNED_CONTEXT

    return ContextBuilder(CANNED_CONTEXT, variant).build(CANNED[0]["window"], [], CANNED[0]["recent"])


def answer_json(ans: dict[str, Any]) -> str:
    return json.dumps(Answer.model_validate(ans).model_dump())
