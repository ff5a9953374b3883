"""AgentService: one model server per node, shared by every trainer on that node.

It is rudder's own OpenAI-compatible server (`python -m rudder.agent.server`: llama.cpp through
llama-cpp-python, sampling only the answer's choices), or llama-cpp-python's (`--server
llama_cpp`: `python -m llama_cpp.server`), started as a
subprocess in its own process group, bound only to the node's address (or loopback), ready when
GET /v1/models answers (bounded wait), and stopped by its pid (TERM, then KILL). The trainers
reach it through the http backend: the cluster exports RUDDER_AGENT_URL=<service url>.

The paper's reference ran one Ollama server per rank on the trainer's GPU; one per node on spare
cores keeps the model's memory and threads off the trainers.

Per node, for a whole study (`ensure_node_service`): the first agent run that lands on a node
starts one detached service there (a file lock keeps it to one), bound to every interface so
that each run's emulated machines reach it at their own bridge address; later agent runs find
it running and ready, so the model load is paid once per node per study; the study stops it at
its end (`stop_node_services`). Its llama.cpp threads are pinned to the node's last cores when
the node has cores to spare (`spare_cpus`); on a 2-core host they share the trainers' cores.

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
from typing import Iterable

from rudder.arg_types import positive

log = logging.getLogger(__name__)

DEFAULT_PORT = 8431
# The per-node service of a study: its trainers take turns, so it keeps each one's state
# (rudder.agent.server --cache-mb, as llama_cpp.server --cache: KV state, ~12 kB a token for
# Qwen2.5-0.5B, ~30 MB a state) with a small batch (llama_cpp.server's kept states also copy
# n_batch x n_vocab float scores: 78 MB at 128 for Qwen's 151,936-token vocabulary, 311 MB at 512).
NODE_CACHE_MB = 256
NODE_N_BATCH = 128
N_CTX = 4096  # as the inproc backend (decision.N_CTX)
SERVERS = ("rudder", "llama_cpp")  # the model server a service runs (AgentService.argv)


def tcp_port(value: str) -> int:
    """argparse type of --port: 1-65535, or 0 for a free one chosen at start."""
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a port number") from None
    if not 0 <= n <= 65535:
        raise argparse.ArgumentTypeError(f"{n}: a TCP port is 1-65535 (0: a free one)")
    return n


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
    """Starts/stops one model server (rudder.agent.server or llama_cpp.server); a context manager. `url` is what trainers use."""

    def __init__(self, model_path: str | Path, host: str = "127.0.0.1", port: int | None = None,
                 threads: int = 1, n_ctx: int = N_CTX, chat_format: str | None = None,
                 ready_timeout_s: float = 60.0, log_path: str | Path | None = None,
                 inherit_output: bool = False,
                 model_alias: str | None = None, all_interfaces: bool = False,
                 cpus: list[int] | None = None, logits_all: bool = False,
                 cache_mb: int = 0, n_batch: int | None = None,
                 threads_batch: int | None = None, server: str = "rudder"):
        if server not in SERVERS:
            raise ValueError(f"agent server {server!r}: one of {', '.join(SERVERS)}")
        # rudder: rudder.agent.server (choice decoding: only the answer's choices are sampled,
        # BENCHMARKS §5); llama_cpp: llama-cpp-python's own server (grammar, every token sampled)
        self.server = server
        if host in ("0.0.0.0", "::", "") and not all_interfaces:
            raise ValueError("AgentService binds to one address (the node's or loopback), not all"
                             " (all_interfaces=True: the per-node service of a local study)")
        self.cpus = list(cpus) if cpus else None  # pin the server's threads to these cores
        # llama_cpp.server defaults to logits for every prompt token (for logprobs, which the
        # agent never asks for): projecting each one onto the vocabulary (151k for Qwen) and
        # copying it into numpy made the warm-up 158 s instead of 54 s (BENCHMARKS §5)
        self.logits_all = logits_all
        # cache_mb > 0: llama_cpp.server's RAM prompt-state cache (--cache): after each answer
        # the server keeps its state, and a question that shares more of its prefix with a kept
        # state than with what the KV cache holds now (the other trainer's question) resumes
        # from that state instead of reading it again. n_batch: the server's batch (its state
        # copies carry n_batch x n_vocab floats of scores besides the KV cache).
        self.cache_mb = cache_mb
        self.n_batch = n_batch
        self.threads_batch = threads_batch or threads  # threads that read a prompt
        self.model_path = str(model_path)
        self.host = host
        self._auto_port = not port  # chosen here: another may take it before the server binds
        self.port = port or free_port(host)
        self.threads = threads
        self.n_ctx = n_ctx
        self.chat_format = chat_format
        self.ready_timeout_s = ready_timeout_s
        self.log_path = Path(log_path) if log_path else None
        # no log file: the server's output is dropped, or (inherit_output) goes to our stderr
        self.inherit_output = inherit_output
        self.model_alias = model_alias
        self.proc: subprocess.Popen | None = None
        self._log_file = None

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"http://{host}:{self.port}"

    def argv(self) -> list[str]:
        if self.server == "rudder":
            cmd = [sys.executable, "-m", "rudder.agent.server", "--model", self.model_path,
                   "--host", self.host, "--port", str(self.port), "--threads", str(self.threads),
                   "--threads-batch", str(self.threads_batch), "--n-ctx", str(self.n_ctx),
                   "--n-batch", str(self.n_batch or NODE_N_BATCH), "--cache-mb", str(self.cache_mb)]
            cmd += ["--chat-format", self.chat_format] if self.chat_format else []
            return cmd + (["--model-alias", self.model_alias] if self.model_alias else [])
        cmd = [sys.executable, "-m", "llama_cpp.server", "--model", self.model_path,
               "--host", self.host, "--port", str(self.port), "--n_threads", str(self.threads),
               "--n_threads_batch", str(self.threads_batch), "--n_ctx", str(self.n_ctx),
               "--logits_all", "true" if self.logits_all else "false"]
        if self.cache_mb > 0:
            cmd += ["--cache", "true", "--cache_type", "ram", "--cache_size", str(self.cache_mb << 20)]
        if self.n_batch:
            cmd += ["--n_batch", str(self.n_batch), "--n_ubatch", str(self.n_batch)]
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
                # inherited: onto our stderr, so our stdout carries only the READY line
                out = sys.stderr if self.inherit_output else subprocess.DEVNULL
            log.info("starting agent service %s on %s", Path(self.model_path).name, self.url)
            # Own process group: stop() takes the server and anything it spawned.
            cpus = self.cpus
            pin = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
            self.proc = subprocess.Popen(self.argv(), stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True,
                                         preexec_fn=pin)
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
    ap.add_argument("--port", type=tcp_port, default=DEFAULT_PORT, help=f"default {DEFAULT_PORT}; 0: a free one")
    ap.add_argument("--threads", type=positive(int), default=1)
    ap.add_argument("--chat-format", default=None)
    ap.add_argument("--ready-timeout", type=float, default=120.0)
    ap.add_argument("--log", default=None, help="the model server's log file (default: its "
                    "output goes to this service's stderr)")
    ap.add_argument("--no-warm", action="store_true", help="skip caching the prompt prefix at start")
    ap.add_argument("--prompt", default="default", help="prompt variant whose prefix is warmed")
    ap.add_argument("--all-interfaces", action="store_true",
                    help="bind 0.0.0.0 (the per-node service of a local study: each run's "
                    "emulated machines reach it at their bridge address)")
    ap.add_argument("--cpus", default=None, help="pin the model's threads to these cores, "
                    "e.g. 6,7 (default: not pinned)")
    ap.add_argument("--cache-mb", type=int, default=0, help="keep each trainer's state after "
                    "its answer (llama_cpp.server's RAM prompt cache, this many MB of KV "
                    "state): trainers taking turns on the server resume from their own "
                    "(default 0: none)")
    ap.add_argument("--n-batch", type=int, default=None, help="the server's batch (default "
                    f"{NODE_N_BATCH} with --cache-mb or --server rudder, else llama_cpp.server's)")
    ap.add_argument("--server", choices=SERVERS, default="rudder", help="rudder: "
                    "rudder.agent.server (choice decoding; default); llama_cpp: llama_cpp.server")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from rudder.agent.models import resolve

    path = resolve(args.model, args.model_path)
    host = "0.0.0.0" if args.all_interfaces else (args.host or node_address())
    cpus = [int(c) for c in args.cpus.split(",")] if args.cpus else None
    # the server's own output is kept (a log file, or ours), so a server that fails says why
    svc = AgentService(path, host=host, port=args.port or None, threads=args.threads,
                       chat_format=args.chat_format, ready_timeout_s=args.ready_timeout,
                       log_path=args.log, inherit_output=True, model_alias=args.model,
                       all_interfaces=args.all_interfaces, cpus=cpus, cache_mb=args.cache_mb,
                       n_batch=args.n_batch or (NODE_N_BATCH if args.cache_mb else None),
                       server=args.server)
    done = threading.Event()

    def on_signal(*_) -> None:
        # Stop the model server now, not after a start-up or prompt warm-up that may take
        # minutes: whoever stops us by pid (and then SIGKILLs a slow exit) never reaches the
        # server, which runs in its own session, so leaving it to the end would orphan it.
        done.set()
        svc.stop()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    try:
        with svc:
            if not args.no_warm and not done.is_set():
                log.info("prompt prefix warmed in %.1f s", svc.warm(args.prompt))
            ready_file = os.environ.get("RUDDER_READY_FILE")  # the cluster waits for it
            if ready_file and not done.is_set():
                Path(ready_file).parent.mkdir(parents=True, exist_ok=True)
                Path(ready_file).write_text(svc.url + "\n")
            if not done.is_set():
                print(f"READY {svc.url}", flush=True)
            while not done.is_set():
                if svc.proc is None or svc.proc.poll() is not None:
                    log.error("agent service died")
                    return 1
                done.wait(1.0)
    except AgentServiceError as exc:  # the server did not come up: its output says why
        if not done.is_set():
            print(f"agent service: error: {exc}", file=sys.stderr)
            return 1
        log.info("stopped while starting or warming up")
    except Exception:
        if not done.is_set():
            raise
        log.info("stopped while starting or warming up")  # what failed was the stop itself
    return 0


# -- the per-node service of a study ------------------------------------------------------------

SPARE_RESERVE = 1  # a core left besides the trainers' and the model's: DistDGL's servers, the OS


def spare_cpus(threads: int, trainers: int, cpus: Iterable[int] | None = None,
               reserve: int = SPARE_RESERVE) -> list[int] | None:
    """The cores to pin the model's threads to: the node's last `threads` of `cpus` (default:
    the cores this process may use) when the node has a core per trainer and `reserve` more
    besides them; else None (not pinned: on a small host the model shares the trainers' cores,
    and pinning it to one of them would only take that core's time from a trainer)."""
    if threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    cores = sorted(set(os.sched_getaffinity(0) if cpus is None else cpus))
    if len(cores) < threads + max(1, trainers) + reserve:
        return None
    return cores[-threads:]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def _wait_gone(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:  # reap it if it is our child (a zombie still answers kill(pid, 0))
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return True
        except ChildProcessError:
            pass
        if not _alive(pid):
            return True
        time.sleep(0.1)
    return not _alive(pid)


def ensure_node_service(state_dir: str | Path, model: str, model_path: str | None = None,
                        threads: int = 1, prompt: str = "default", trainers: int = 1,
                        ready_timeout_s: float = 600.0, cpus: list[int] | None = None,
                        cache_mb: int = NODE_CACHE_MB) -> dict:
    """The study's agent service on this node: started by the first caller (detached, its own
    session, so it outlives the run that started it), found running by the next ones. Returns
    its record {pid, port, model, ready_file, started_at, cpus, turn_file}; the trainers
    take turns on turn_file (rudder.agent.policy.NodeTurn: each asks with its newest window
    when the server is free). Does not wait for the model:
    trainers wait for it to answer (agent.ready_timeout_s). `cpus`: the cores its threads are
    pinned to (default: `spare_cpus`, none on a node without cores to spare)."""
    import fcntl

    state_dir = Path(state_dir)
    state_dir.mkdir(parents=True, exist_ok=True)
    node = socket.gethostname()
    state = state_dir / f"{node}.json"
    with open(state_dir / f"{node}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if state.exists():
            rec = json.loads(state.read_text())
            if _alive(int(rec["pid"])) and rec.get("model") == model:
                rec["reused"] = True
                return rec
            stop_node_services(state_dir, only=state)  # dead, or another model: replace it
        port = free_port("0.0.0.0")
        ready = state_dir / f"{node}.ready"
        ready.unlink(missing_ok=True)
        cpus = list(cpus) if cpus else spare_cpus(threads, trainers)
        argv = [sys.executable, "-m", "rudder.agent.service", "--model", model,
                *(["--path", model_path] if model_path else []), "--all-interfaces",
                "--port", str(port), "--threads", str(threads), "--prompt", prompt,
                "--ready-timeout", str(ready_timeout_s),
                *(["--cpus", ",".join(map(str, cpus))] if cpus else []),
                *(["--cache-mb", str(cache_mb)] if cache_mb else [])]
        env = {**os.environ, "RUDDER_READY_FILE": str(ready)}
        for k in ("RUDDER_MACHINE_ADDR", "RUDDER_SERVICE_ID"):
            env.pop(k, None)
        with open(state_dir / f"{node}.log", "ab") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env=env, start_new_session=True)
        rec = {"pid": proc.pid, "port": port, "model": model, "node": node,
               "ready_file": str(ready), "started_at": time.time(), "cpus": cpus,
               "log": str(state_dir / f"{node}.log"), "reused": False,
               "turn_file": str(state_dir / f"{node}.turn")}  # NodeTurn: one question at a time
        state.write_text(json.dumps(rec))
        log.info("agent node service for %s starting on port %d (pid %d)%s", model, port,
                 proc.pid, f", pinned to cores {cpus}" if cpus else "")
        return rec


def stop_node_services(state_dir: str | Path, only: Path | None = None,
                       timeout_s: float = 10.0) -> int:
    """Stops the node services recorded in `state_dir` (by pid: TERM to its process group, then
    KILL) and removes their records; returns how many were running."""
    stopped = 0
    for state in ([only] if only else sorted(Path(state_dir).glob("*.json"))):
        try:
            rec = json.loads(state.read_text())
        except (OSError, ValueError):
            continue
        pid = int(rec.get("pid", 0))
        if pid and _alive(pid):
            stopped += 1
            try:
                os.killpg(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            if not _wait_gone(pid, timeout_s):
                try:
                    os.killpg(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                _wait_gone(pid, 5.0)
        state.unlink(missing_ok=True)
        Path(rec.get("ready_file", "")).unlink(missing_ok=True) if rec.get("ready_file") else None
    return stopped


if __name__ == "__main__":
    sys.exit(main())
