"""AgentService: one model server per node, shared by every trainer on that node.

It is llama-cpp-python's own OpenAI-compatible server (`python -m llama_cpp.server`), started as a
subprocess in its own process group, bound only to the node's address (or loopback), ready when
GET /v1/models answers (bounded wait), and stopped by its pid (TERM, then KILL). The trainers
reach it through the http backend: the cluster exports RUDDER_AGENT_URL=<service url>.

The paper's reference ran one Ollama server per rank on the trainer's GPU; one per node on spare
cores keeps the model's memory and threads off the trainers.

Per machine (what the cluster launcher runs; RUDDER_MACHINE_ADDR is the node's address):
    python -m rudder.agent.service --model qwen2.5-coder-0.5b [--port 8431] [--threads 1]
Once the server answers (and its prompt prefix is warmed) it writes its URL to
$RUDDER_READY_FILE (when set) and prints `READY <url>`; SIGTERM/SIGINT stop the server. The
trainers' AgentPolicy finds it at $RUDDER_AGENT_URL, or else at http://$RUDDER_MACHINE_ADDR:8431.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

log = logging.getLogger(__name__)

DEFAULT_PORT = 8431
N_CTX = 4096  # as the inproc backend (decision.N_CTX)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def node_address() -> str:
    """The address to bind: the node's (RUDDER_MACHINE_ADDR, set by the cluster) else loopback."""
    return os.environ.get("RUDDER_MACHINE_ADDR") or "127.0.0.1"


class AgentServiceError(RuntimeError):
    pass


class AgentService:
    """Starts/stops one llama_cpp.server; a context manager. `url` is what trainers use."""

    def __init__(self, model_path: str | Path, host: str = "127.0.0.1", port: int | None = None,
                 threads: int = 1, n_ctx: int = N_CTX, chat_format: str | None = None,
                 ready_timeout_s: float = 60.0, log_path: str | Path | None = None,
                 model_alias: str | None = None):
        if host in ("0.0.0.0", "::", ""):
            raise ValueError("AgentService binds to one address (the node's or loopback), not all")
        self.model_path = str(model_path)
        self.host = host
        self._auto_port = not port  # chosen here: another may take it before the server binds
        self.port = port or free_port(host)
        self.threads = threads
        self.n_ctx = n_ctx
        self.chat_format = chat_format
        self.ready_timeout_s = ready_timeout_s
        self.log_path = Path(log_path) if log_path else None
        self.model_alias = model_alias
        self.proc: subprocess.Popen | None = None
        self._log_file = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def argv(self) -> list[str]:
        cmd = [sys.executable, "-m", "llama_cpp.server", "--model", self.model_path,
               "--host", self.host, "--port", str(self.port), "--n_threads", str(self.threads),
               "--n_threads_batch", str(self.threads), "--n_ctx", str(self.n_ctx)]
        if self.chat_format:
            cmd += ["--chat_format", self.chat_format]
        if self.model_alias:
            cmd += ["--model_alias", self.model_alias]
        return cmd

    def start(self) -> "AgentService":
        if self.proc is not None:
            return self
        tries = 3 if self._auto_port else 1
        for attempt in range(1, tries + 1):
            if self.log_path:
                self.log_path.parent.mkdir(parents=True, exist_ok=True)
                self._log_file = open(self.log_path, "ab")
                out = self._log_file
            else:
                out = subprocess.DEVNULL
            log.info("starting agent service %s on %s", Path(self.model_path).name, self.url)
            # Own process group: stop() takes the server and anything it spawned.
            self.proc = subprocess.Popen(self.argv(), stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
            try:
                self._wait_ready()
                return self
            except AgentServiceError:
                from rudder.listeners import listen_inodes

                # the free port was taken between choosing and binding it: choose again
                taken = self.proc.poll() is not None and listen_inodes(self.port)
                self.stop()
                if not taken or attempt == tries:
                    raise
                log.warning("port %d was taken before the server bound it; trying another",
                            self.port)
                self.port = free_port(self.host)
            except BaseException:
                self.stop()
                raise
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline:
            rc = self.proc.poll()
            if rc is not None:
                raise AgentServiceError(f"agent service exited with code {rc} before it was ready"
                                        + self._log_tail())
            if self.ready():
                log.info("agent service ready at %s (pid %d)", self.url, self.proc.pid)
                return
            time.sleep(0.2)
        raise AgentServiceError(f"agent service not ready within {self.ready_timeout_s:.0f} s at {self.url}"
                                + self._log_tail())

    def _log_tail(self) -> str:
        if self.log_path and self.log_path.exists():
            tail = self.log_path.read_bytes()[-1500:].decode(errors="replace")
            return f"; log tail ({self.log_path}):\n{tail}"
        return ""

    def ready(self) -> bool:
        """Our server answers: its own process listens on the port (not another run's server
        that took it) and /v1/models responds."""
        from rudder.listeners import listens

        if self.proc is None or not listens(self.proc.pid, self.port):
            return False
        try:
            with urllib.request.urlopen(self.url + "/v1/models", timeout=1.0) as resp:
                json.loads(resp.read())
                return resp.status == 200
        except (OSError, ValueError, urllib.error.URLError):
            return False

    def warm(self, variant: str = "default", timeout_s: float = 300.0) -> float:
        """One short request with the agent's constant prompt prefix, so the server's KV cache
        holds it before the first trainer asks. Returns seconds spent (failures are logged)."""
        from rudder.agent.decision import DecisionMaker, HttpBackend, warm_prompt

        maker = DecisionMaker(HttpBackend(self.url, model=self.model_alias or ""), self.model_alias or "",
                              timeout_s=timeout_s)
        return maker.warm(warm_prompt(variant))

    def stop(self, timeout_s: float = 10.0) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)  # pgid == pid (start_new_session)
            except ProcessLookupError:
                pass
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait(5)
        if self._log_file:
            self._log_file.close()
            self._log_file = None

    def __enter__(self) -> "AgentService":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rudder.agent.service",
                                 description="Serve one agent model for the trainers of this node.")
    ap.add_argument("--model", default="smollm2-135m", help="registry name (rudder.agent.models)")
    ap.add_argument("--model-path", "--path", dest="model_path", default=None, help="GGUF file (user models)")
    ap.add_argument("--host", default=None, help="bind address (default $RUDDER_MACHINE_ADDR or 127.0.0.1)")
    ap.add_argument("--port", type=int, default=DEFAULT_PORT)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--chat-format", default=None)
    ap.add_argument("--ready-timeout", type=float, default=120.0)
    ap.add_argument("--log", default=None, help="server log file")
    ap.add_argument("--no-warm", action="store_true", help="skip caching the prompt prefix at start")
    ap.add_argument("--prompt", default="default", help="prompt variant whose prefix is warmed")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from rudder.agent.models import resolve

    path = resolve(args.model, args.model_path)
    svc = AgentService(path, host=args.host or node_address(), port=args.port, threads=args.threads,
                       chat_format=args.chat_format, ready_timeout_s=args.ready_timeout,
                       log_path=args.log, model_alias=args.model)
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    with svc:
        if not args.no_warm and not done.is_set():
            log.info("prompt prefix warmed in %.1f s", svc.warm(args.prompt))
        ready_file = os.environ.get("RUDDER_READY_FILE")  # the cluster waits for it (wait_services)
        if ready_file:
            Path(ready_file).parent.mkdir(parents=True, exist_ok=True)
            Path(ready_file).write_text(svc.url + "\n")
        print(f"READY {svc.url}", flush=True)
        while not done.is_set():
            if svc.proc is None or svc.proc.poll() is not None:
                log.error("agent service died")
                return 1
            done.wait(1.0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
