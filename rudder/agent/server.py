"""The node's model server: OpenAI-compatible, one model, one answer at a time, choice decoding.

    python -m rudder.agent.server --model PATH [--host 127.0.0.1] [--port 8431] [--threads 1]
        [--threads-batch N] [--n-ctx 4096] [--n-batch 128] [--cache-mb 256] [--model-alias NAME]

What the trainers' HttpBackend needs of llama_cpp.server, answered faster (BENCHMARKS §5/§6):
  POST /v1/chat/completions  {"messages", "max_tokens", "response_format": {"type": "json_object",
        "schema": S} or {"type": "json_schema", "json_schema": {"schema": S}}}: when S compiles
        to a choice template (rudder.agent.choice: the default prompt variant's schema) the
        forced text is read in batches and only the choices are sampled; any other schema (free
        text) goes through llama.cpp's grammar, as llama_cpp.server would.
  GET /v1/models             readiness (answered when the model is free: after the warm-up).
Questions queue on one lock (one model). A client that hangs up (its deadline passed, or its run
ended) stops its answer at the next choice, so the next trainer is not kept waiting.

Per-client prompt state (--cache-mb, as llama_cpp.server's RAM cache): after each answer the
KV state is kept with its tokens; a question that shares more of its prefix with a kept state
than with the live KV cache (another trainer asked in between) resumes from that state.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import logging
import select
import signal
import socket
import sys
import threading
import time
import uuid
from collections import OrderedDict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np

from rudder.arg_types import positive

log = logging.getLogger("rudder.agent.server")

N_CTX = 4096
N_BATCH = 128


class StateCache:
    """Kept KV states (tokens, bytes), least recently used dropped past `max_bytes`."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.states: OrderedDict[int, tuple[np.ndarray, bytes]] = OrderedDict()
        self._next = 0

    def size(self) -> int:
        return sum(len(b) for _, b in self.states.values())

    def best(self, tokens: np.ndarray) -> tuple[int | None, int]:
        """The kept state sharing the longest prefix with `tokens`: (key, shared tokens)."""
        best, best_n = None, 0
        for key, (toks, _) in self.states.items():
            n = _common(toks, tokens)
            if n > best_n:
                best, best_n = key, n
        return best, best_n

    def put(self, tokens: np.ndarray, data: bytes) -> None:
        if len(data) > self.max_bytes:
            return
        # a state whose tokens are a prefix of the new one is superseded by it
        for key in [k for k, (t, _) in self.states.items() if _common(t, tokens) == len(t)]:
            del self.states[key]
        self.states[self._next] = (tokens, data)
        self._next += 1
        while self.size() > self.max_bytes:
            self.states.popitem(last=False)


def _common(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if diff.size else n


class Model:
    """One llama_cpp.Llama, its choice decoder and state cache; `answer` is serialised."""

    def __init__(self, path: str, threads: int = 1, threads_batch: int | None = None, n_ctx: int = N_CTX,
                 n_batch: int = N_BATCH, cache_mb: int = 0, chat_format: str | None = None,
                 alias: str | None = None):
        from llama_cpp import Llama

        from rudder.agent.choice import ChoiceDecoder, Unsupported

        self.alias = alias or Path(path).name
        self.llm = Llama(model_path=path, n_ctx=n_ctx, n_threads=threads,
                         n_threads_batch=threads_batch or threads, n_batch=n_batch, n_ubatch=n_batch,
                         chat_format=chat_format, seed=0, verbose=False)
        try:
            self.decoder = ChoiceDecoder(self.llm)
            _ = self.decoder.vocab  # the token trie now, not on the first question
        except Unsupported as exc:
            log.info("no choice decoding (%s): every answer through the grammar", exc)
            self.decoder = None
        self.cache = StateCache(cache_mb << 20) if cache_mb > 0 else None
        self.lock = threading.Lock()

    # -- prompt state ---------------------------------------------------------------------
    def _held(self) -> np.ndarray:
        return np.asarray(self.llm.input_ids[: self.llm.n_tokens], dtype=np.int64)

    def _save(self) -> None:
        ctx = self.llm._ctx.ctx
        import llama_cpp

        size = llama_cpp.llama_state_get_size(ctx)
        buf = (ctypes.c_uint8 * size)()
        n = llama_cpp.llama_state_get_data(ctx, buf, size)
        self.cache.put(self._held(), bytes(memoryview(buf)[:n]))

    def _restore(self, tokens: np.ndarray) -> None:
        """Loads the kept state that shares more of `tokens` than the live KV cache does."""
        import llama_cpp

        key, shared = self.cache.best(tokens)
        if key is None or shared <= _common(self._held(), tokens):
            return
        toks, data = self.cache.states[key]
        self.cache.states.move_to_end(key)
        buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        llama_cpp.llama_state_set_data(self.llm._ctx.ctx, buf, len(data))
        self.llm.input_ids[: len(toks)] = toks
        self.llm.n_tokens = len(toks)

    # -- answers --------------------------------------------------------------------------
    def answer(self, messages: list[dict], schema: dict | None, max_tokens: int, gone) -> dict:
        from rudder.agent.choice import template

        tpl = template(schema) if (schema and self.decoder is not None) else None
        with self.lock:
            t0 = time.monotonic()
            if tpl is None:
                return self._grammar(messages, schema, max_tokens, t0)
            tokens = self.decoder.prompt_tokens(messages)
            held = _common(self._held(), np.asarray(tokens))
            if self.cache is not None:
                self._restore(np.asarray(tokens, dtype=np.int64))
            text, finish, st = self.decoder.complete(messages, tpl, max_tokens, cancel=gone, tokens=tokens)
            if self.cache is not None and finish == "stop":
                self._save()
        total = time.monotonic() - t0
        # the lines bench_agent_node reads from llama_cpp.server's log, in its words
        log.info("%d prefix-match hit, remaining %d prompt tokens (live KV cache shared %d)",
                 st["prompt_tokens"] - st["read_tokens"], st["read_tokens"], held)
        log.info("prompt eval time = %.2f ms / %d tokens", 1000 * st["read_s"], st["read_tokens"])
        log.info("eval time = %.2f ms / %d runs (%d choices), total %.2f s, finish %s",
                 1000 * (total - st["read_s"]), st["generated_tokens"], st["choices"], total, finish)
        return self._response(text, finish, st["prompt_tokens"], st["generated_tokens"],
                              {"read_tokens": st["read_tokens"], "read_s": st["read_s"],
                               "choices": st["choices"], "total_s": total, "decoder": "choice"})

    def _grammar(self, messages, schema, max_tokens, t0) -> dict:
        fmt = {"type": "json_object", "schema": schema} if schema else None
        res = self.llm.create_chat_completion(messages=messages, max_tokens=max_tokens,
                                              temperature=0.0, response_format=fmt)
        choice = res["choices"][0]
        usage = res.get("usage") or {}
        return self._response(choice["message"].get("content") or "", choice.get("finish_reason"),
                              usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0),
                              {"total_s": time.monotonic() - t0, "decoder": "grammar"})

    def _response(self, text, finish, prompt_tokens, gen_tokens, timings) -> dict:
        return {"id": f"chatcmpl-{uuid.uuid4().hex[:12]}", "object": "chat.completion",
                "created": int(time.time()), "model": self.alias,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                             "finish_reason": finish}],
                "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": gen_tokens,
                          "total_tokens": prompt_tokens + gen_tokens},
                "timings": timings}

    def close(self) -> None:
        self.llm.close()


class _Gone:
    """is_set() when the client closed its connection (its deadline passed): checked between
    choices, so an abandoned answer stops early."""

    def __init__(self, sock: socket.socket):
        self.sock = sock

    def is_set(self) -> bool:
        try:
            ready, _, _ = select.select([self.sock], [], [], 0)
            return bool(ready) and self.sock.recv(1, socket.MSG_PEEK) == b""
        except (OSError, ValueError):
            return True


def schema_of(fmt: dict | None) -> dict | None:
    """The JSON schema of an OpenAI/llama.cpp response_format (either form), or None."""
    if not fmt:
        return None
    if fmt.get("type") == "json_schema":
        return (fmt.get("json_schema") or {}).get("schema")
    return fmt.get("schema")


def make_handler(model: Model):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *args):  # per-request lines only at debug level
            log.debug("%s " + fmt, self.address_string(), *args)

        def _send(self, code: int, payload: dict) -> None:
            body = json.dumps(payload).encode()
            try:
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            except OSError:  # the client left (deadline): nothing to tell it
                pass

        def do_GET(self):
            if self.path.rstrip("/") in ("/v1/models", "/models"):
                # as llama_cpp.server: it answers once the model is free, so a trainer that
                # waits for it starts after the service's prompt warm-up, not behind it
                with model.lock:
                    pass
                self._send(200, {"object": "list", "data": [
                    {"id": model.alias, "object": "model", "owned_by": "rudder"}]})
            else:
                self._send(404, {"error": {"message": f"no {self.path}"}})

        def do_POST(self):
            if self.path.rstrip("/") not in ("/v1/chat/completions", "/chat/completions"):
                self._send(404, {"error": {"message": f"no {self.path}"}})
                return
            try:
                req = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
                messages = req["messages"]
                max_tokens = int(req.get("max_tokens") or 160)
                schema = schema_of(req.get("response_format"))
            except (ValueError, KeyError, TypeError) as exc:
                self._send(400, {"error": {"message": f"bad request: {exc}"}})
                return
            try:
                out = model.answer(messages, schema, max_tokens, _Gone(self.connection))
            except Exception as exc:  # noqa: BLE001 - the server stays up for the next trainer
                log.exception("answer failed")
                self._send(500, {"error": {"message": f"{type(exc).__name__}: {exc}"}})
                return
            self._send(200, out)

    return Handler


def serve(model: Model, host: str, port: int) -> ThreadingHTTPServer:
    httpd = ThreadingHTTPServer((host, port), make_handler(model))
    httpd.daemon_threads = True
    return httpd


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rudder.agent.server", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="GGUF file")
    ap.add_argument("--model-alias", default=None)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8431)
    ap.add_argument("--threads", type=positive(int), default=1)
    ap.add_argument("--threads-batch", type=positive(int), default=None)
    ap.add_argument("--n-ctx", type=int, default=N_CTX)
    ap.add_argument("--n-batch", type=int, default=N_BATCH)
    ap.add_argument("--cache-mb", type=int, default=0, help="kept prompt states (MB), 0: none")
    ap.add_argument("--chat-format", default=None)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    model = Model(args.model, args.threads, args.threads_batch, args.n_ctx, args.n_batch,
                  args.cache_mb, args.chat_format, args.model_alias)
    httpd = serve(model, args.host, args.port)
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=httpd.shutdown).start())
    log.info("serving %s on http://%s:%d", model.alias, args.host, args.port)
    try:
        httpd.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        httpd.server_close()
        model.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
