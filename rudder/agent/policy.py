"""The "agent" policy: an LLM decides *when* the buffer replaces and how much, without ever
blocking the training loop. `LLMDecider` is the decider the steering skeleton
(rudder.agent.steering: windows, regime, apply, judge) asks; `AgentPolicy` is that skeleton
with it.

  trainer (loader thread)                     agent thread (daemon)
  observe(metrics, window) --inbox (bounded)--> ContextBuilder.build -> DecisionMaker.decide
  plan(step)              <--outbox---------- Decision (agent#n)

- observe() puts every closed window without blocking; when the inbox is full the oldest window
  is dropped (only the newest state matters to a late agent), and when the agent thread is free
  it asks about the newest window waiting (the older ones are recorded as dropped). Trainers
  that share a node's model server (the study's per-node service, $RUDDER_AGENT_TURN) ask it in
  turn, first come first served (NodeTurn), each building its question when its turn comes.
- plan() only polls the outbox: it never waits for the model. The newest arrived decision is
  applied at that step (older ones that arrived together are recorded as superseded, never
  applied); staleness = applied global step - last step of the window it judged.
- A decision sets a regime that holds until the next decision arrives:
  - lookahead mechanism (ctx.depth > 0: lookahead or schedule_ahead): replace=true runs a replacement round on EVERY
    minibatch, Replace("lookahead", budget rows, "agent#n"), as the `lookahead` policy does;
    replace=false runs none. So the agent chooses when the lookahead policy is on and how many
    rows each of its rounds may change.
  - massivegnn mechanism (no lookahead): replace=true runs one round when the decision arrives
    (a MassiveGNN round swaps every stale slot at once: repeating it each minibatch would only
    churn); replace=false runs none.
- The start decision (agent.start_decision, runs that sample ahead): start() queues one request
  before the first minibatch, judged on the initial buffer and what the minibatches sampled ahead
  lack (window START_WINDOW, no metrics yet); it applies when it arrives like any other.
- The fallback policy (agent.fallback; auto = lookahead when the run samples ahead, else static)
  steers until the first answer arrives, and after a fallback decision (bad/late answer) until
  the next valid one (a fallback also ends a replace regime).
- Self-reflection (the skeleton's judge, by prediction): when the next window after an applied
  decision closes, the predicted directions are compared with the measured ones (hit rate:
  flat = |delta| < 1 pt; fetched rows per minibatch: flat = |relative delta| < 2%);
  `correct` = both came true. The record keeps both
  the directions (outcome_hit_rate / outcome_remote_rows: up|down|flat) and the numbers
  (outcome_hit_delta: hit-rate change in fraction units, 0.01 = 1 pt; outcome_rows_delta:
  relative change of fetched rows per minibatch). The entry goes back into the history the next
  prompts show. Pass@1 = mean(correct) over judged decisions.
"""
from __future__ import annotations

import logging
import os
import queue
import threading
import time
from typing import Any, Callable

from rudder.agent.context import PAST_VARIANTS, ContextBuilder
from rudder.agent.decision import DecisionMaker, resolve_fallback, warm_prompt
from rudder.agent.judge import measure, reflect  # noqa: F401 (re-exported)
from rudder.agent.messages import START_WINDOW, Decision, HistoryEntry, budget_rows
from rudder.agent.steering import Decider, Steering, Verdict
from rudder.agent.windows import DecisionPoint
from rudder.config import AgentConfig, PrefetchConfig
from rudder.prefetch.past import settle
from rudder.prefetch.policy import Policy, RunContext
from rudder.records import DecisionRecord

log = logging.getLogger(__name__)

INBOX_SIZE = 2  # windows waiting for the agent; older ones are dropped when it falls behind
TURN_ENV = "RUDDER_AGENT_TURN"  # the node's turn file: the trainers sharing one server ask in turn
TURN_POLL_S = 0.02  # how often a trainer waiting for its turn looks again


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


class NodeTurn:
    """One question at a time on a node's shared model server, across the trainers (processes)
    of the node, first come first served: an exclusive flock on the node's turn file
    ($RUDDER_AGENT_TURN, set by the study's per-node service), taken in the order the trainers
    asked for it (each waiter's entry in `<turn file>.q/`, named by the time it came; entries
    of dead processes are removed). A trainer's agent thread takes the turn before it builds
    its question, so it asks with its newest window when the server is free; without it the
    question, built at once, queued inside the server behind the other trainers' and was
    answered about a window 39-50 minibatches old (BENCHMARKS.md section 6). Waiting for the
    turn never blocks training (the agent thread waits) and ends when the run ends."""

    def __init__(self, path: str | os.PathLike):
        self.path = str(path)
        self.queue = self.path + ".q"
        self._fd: int | None = None

    def _first(self, mine: str) -> bool:
        """Whether `mine` is the oldest entry of a live waiter (dead ones are removed)."""
        for name in sorted(os.listdir(self.queue)):
            if name == mine:
                return True
            try:
                pid = int(name.split("-")[1])
            except (IndexError, ValueError):
                pid = 0
            if pid and _pid_alive(pid):
                return False
            try:
                os.unlink(os.path.join(self.queue, name))  # left by a trainer that died
            except FileNotFoundError:
                pass
        return True

    def acquire(self, stop: threading.Event | None = None, poll_s: float = TURN_POLL_S) -> bool:
        import fcntl

        os.makedirs(self.queue, exist_ok=True)
        mine = f"{time.time_ns():020d}-{os.getpid()}-{threading.get_ident()}"
        entry = os.path.join(self.queue, mine)
        open(entry, "w").close()
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            while stop is None or not stop.is_set():
                if self._first(mine):
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        self._fd = fd
                        return True
                    except BlockingIOError:
                        pass
                if stop is not None:
                    stop.wait(poll_s)
                else:
                    time.sleep(poll_s)
            os.close(fd)
            return False
        finally:
            try:
                os.unlink(entry)
            except FileNotFoundError:
                pass

    def release(self) -> None:
        import fcntl

        fd, self._fd = self._fd, None
        if fd is not None:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)


CLOSE_WAIT_S = 1.0  # close() waits this long for the agent thread, never a model's timeout
HISTORY_KEEP = 32  # judged decisions kept for prompts (the prompt shows AgentConfig.history)


def service_url(cfg: AgentConfig) -> str | None:
    """Where this trainer's model answers over HTTP, or None for in-process:
    $RUDDER_AGENT_URL (the cluster's node service) wins; else agent.url; else, for backend=http,
    the node's AgentService at its default port on $RUDDER_MACHINE_ADDR. backend=script or
    last-example: None (no model: the recorded answers, rudder.agent.script; the last example's)."""
    if cfg.backend in ("script", "last-example"):
        return None
    url = os.environ.get("RUDDER_AGENT_URL") or (cfg.url if cfg.backend == "http" else None)
    if url is None and cfg.backend == "http" and os.environ.get("RUDDER_MACHINE_ADDR"):
        from rudder.agent.service import DEFAULT_PORT

        url = f"http://{os.environ['RUDDER_MACHINE_ADDR']}:{DEFAULT_PORT}"
    return url


def wait_http(url: str, timeout_s: float, stop: threading.Event | None = None) -> float:
    """Waits until the OpenAI-compatible service at `url` lists its models, at most timeout_s in
    all (each probe has a total deadline); returns the seconds waited."""
    from rudder.agent.decision import http_ok

    t0 = time.monotonic()
    while not (stop is not None and stop.is_set()):
        left = timeout_s - (time.monotonic() - t0)
        if left <= 0 or http_ok(url.rstrip("/") + "/v1/models", min(2.0, left)):
            break
        time.sleep(min(0.5, max(0.0, timeout_s - (time.monotonic() - t0))))
    return time.monotonic() - t0


def fallback_policy(name: str, cfg: PrefetchConfig, ctx: RunContext) -> Policy:
    """The policy that steers before the first answer and after bad ones (`name` as in
    AgentConfig.fallback, "auto" resolved for this run), set up: AgentPolicy uses it, and the
    hindsight replay builds the same one to reproduce a run."""
    from rudder.prefetch.policies import make_policy

    pol = make_policy(cfg.model_copy(update={"policy": resolve_fallback(name, ctx.depth)}))
    pol.setup(ctx)
    return pol


class LLMDecider(Decider):
    """Asks the model on its own thread: submit() queues the window (the oldest is dropped when
    the inbox is full), poll() takes what arrived. Neither ever waits for the model."""

    label = "agent"
    predicts = True  # judged on its predicted directions (rudder.agent.judge.reflect)

    def __init__(self, cfg: PrefetchConfig, agent: AgentConfig | None = None,
                 decision_maker: DecisionMaker | None = None, inbox_size: int = INBOX_SIZE):
        super().__init__()
        self.cfg = cfg
        self.agent_cfg = agent or AgentConfig()
        self._maker = decision_maker
        self._url = service_url(self.agent_cfg)
        self._inbox: queue.Queue = queue.Queue(maxsize=inbox_size)
        self._outbox: queue.Queue = queue.Queue()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._history: list[HistoryEntry] = []  # applied decisions, oldest first (shown in prompts)
        self._asked: dict[int, str] = {}  # decision -> its question's text (HistoryEntry.asked)
        self._n = 0
        self.dropped_windows = 0
        self._load_error: str | None = None
        self._ready = threading.Event()  # set when the model is loaded and warmed (or failed to)
        self._wait_service = False  # setup(): our maker talks to a service that may be loading

    def setup(self, steer: Steering) -> None:
        super().setup(steer)
        ctx = steer.ctx
        fb = resolve_fallback(self.agent_cfg.fallback, ctx.depth)
        self.agent_cfg = a = self.agent_cfg.model_copy(update={"fallback": fb})
        if self._maker is not None:
            self._maker.fallback = fb  # its records name the policy that actually steers
        self.builder = ContextBuilder(ctx, a.prompt, a.history)
        self.wants_past = self.builder.variant.name in PAST_VARIANTS  # the past counterfactual shown
        self.fallback = fallback_policy(fb, self.cfg, ctx)
        if self._maker is None:
            if a.backend == "script":  # the recorded answers; fails here, naming the missing file
                from rudder.agent.script import ScriptedMaker

                self._maker = ScriptedMaker.from_dir(a.script, ctx.rank, fb)
            elif self._url or a.backend != "inproc":  # no model loads here: a service's, or none
                self._maker = DecisionMaker.from_config(a, url=self._url)
                self._wait_service = self._url is not None  # it may still be loading its model
            else:
                from rudder.agent.models import resolve_model

                resolve_model(a.model)  # fail now, with the fix in the message, not in the thread
        self._thread = threading.Thread(target=self._run, name=f"agent-r{ctx.rank}", daemon=True)
        self._thread.start()

    def start(self, state: Callable[[], dict]) -> bool:
        if self.steer.mechanism != "lookahead" or not self.agent_cfg.start_decision:
            return False  # without lookahead nothing is known before the first window
        start = {"window": START_WINDOW, "first_step": None, "last_step": -1, "minibatches": 0, **state()}
        self.submit(DecisionPoint(start))
        return True

    def submit(self, point: DecisionPoint) -> None:
        """Queues the point for the agent thread without blocking; when the inbox is full the
        oldest request is dropped (recorded: a window the model never saw)."""
        while True:
            try:
                self._inbox.put_nowait(point)
                break
            except queue.Full:
                try:
                    dropped = self._inbox.get_nowait()
                    self.dropped_windows += 1
                    self.steer.finish(self._record(Decision(  # -1, -2, ...: a key of its own in the store
                        decision=-self.dropped_windows, window=dropped.raw.get("window"), model=self.agent_cfg.model.name,
                        backend=self.agent_cfg.backend, fallback=self.agent_cfg.fallback,
                        reason="dropped: the agent was still busy with an earlier window")))
                except queue.Empty:
                    pass

    def poll(self) -> list[Verdict]:
        out = []
        while True:
            try:
                d, point = self._outbox.get_nowait()
            except queue.Empty:
                return out
            rows = budget_rows(d.budget, self.steer.ctx.capacity) if d.budget else 0
            # the answer's admission (judge prompt), else prefetch.admit as the lookahead policy's
            out.append(Verdict(self._record(d), point, rows, f"agent#{d.decision}", d.admit, evict=d.evict))

    def applied(self, v: Verdict) -> None:
        d = v.record
        with self._lock:
            asked = self._asked.pop(d.decision, None)
        v.memo = entry = HistoryEntry(
            decision=d.decision, window=d.window, replace=d.replace, budget=d.budget, admit=d.admit,
            evict=d.evict, rows=v.rows or None, expected_hit_rate=d.expected_hit_rate,
            expected_remote_rows=d.expected_remote_rows, fallback=d.fallback, staleness=d.staleness,
            judged=v.point.raw, asked=asked)
        with self._lock:
            self._history.append(entry)
            del self._history[:-HISTORY_KEEP]
        log.info("agent#%d (window %s, staleness %s): %s%s", d.decision, d.window, d.staleness,
                 f"fallback {d.fallback}" if d.fallback else ("replace " + str(d.budget) if d.replace else "keep"),
                 f" in {d.latency_s:.2f} s" if d.latency_s is not None else "")

    def judged(self, v: Verdict, post: DecisionPoint, hit: float | None, rows: float | None) -> None:
        d, entry = v.record, v.memo
        with self._lock:  # the next prompts show the outcome
            entry.hit_delta, entry.rows_delta = hit, rows
            entry.outcome_hit_rate, entry.outcome_remote_rows = d.outcome_hit_rate, d.outcome_remote_rows
            entry.correct = d.correct

    def wait(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while self._outbox.empty():
            if self._thread is None or not self._thread.is_alive() or time.monotonic() > deadline:
                return False
            time.sleep(0.005)
        return True

    def wait_ready(self, timeout_s: float) -> float:
        t0 = time.monotonic()
        if not self._ready.wait(timeout_s):
            log.warning("agent model not ready after %.0f s; training starts without it", timeout_s)
        return time.monotonic() - t0

    def history(self) -> list[HistoryEntry]:
        with self._lock:
            return [h.model_copy() for h in self._history]

    def close(self) -> list[Verdict]:
        self._stop.set()
        try:
            self._inbox.put_nowait(None)
        except queue.Full:
            pass
        if self._thread is not None:
            # _stop cancels a call in flight (http: its socket is shut; inproc: after a token)
            self._thread.join(CLOSE_WAIT_S)
            if self._thread.is_alive():
                log.warning("agent thread still busy at close; left behind (daemon)")
            elif self._maker is not None:
                self._maker.close()  # llm.close(): frees the model before interpreter exit
        late = self.poll()
        for v in late:
            v.record.reason = f"{v.record.reason} [arrived after the run, never applied]"
        if self.fallback is not None:
            self.fallback.close()
        return late

    # ---- the agent thread -------------------------------------------------------------------
    @staticmethod
    def _record(d: Decision) -> DecisionRecord:
        return DecisionRecord(**d.to_record())

    def _load(self) -> DecisionMaker | None:
        try:
            return DecisionMaker.from_config(self.agent_cfg, url=self._url)
        except Exception as exc:  # recorded on every decision as the fallback's reason
            log.error("agent model failed to load: %s", exc)
            self._load_error = f"{type(exc).__name__}: {exc}"
            return None

    def _run(self) -> None:
        if self._maker is None:
            self._maker = self._load()  # in this thread: loading never delays training
            if self._maker is not None and self._maker.backend.name == "inproc":
                dt = self._maker.warm(warm_prompt(self.agent_cfg.prompt))
                log.info("agent model loaded and warmed in %.1f s", dt)
        if self._wait_service:  # a service may still be loading its model
            dt = wait_http(self._url, self.agent_cfg.ready_timeout_s, self._stop)
            if dt > 0.05:
                log.info("agent service at %s answered after %.1f s", self._url, dt)
        self._ready.set()
        turn = NodeTurn(os.environ[TURN_ENV]) if os.environ.get(TURN_ENV) else None
        while not self._stop.is_set():
            try:
                point = self._inbox.get(timeout=0.2)
            except queue.Empty:
                continue
            if point is None:
                break
            if turn is not None and not turn.acquire(self._stop):
                break  # the run ended while the other trainers' questions held the server
            try:
                point = self._newest(point)
                if point is None:
                    break
                self._ask(point)
            finally:
                if turn is not None:
                    turn.release()  # a trainer that waited longer goes first (NodeTurn)

    def _newest(self, point: DecisionPoint | None) -> DecisionPoint | None:
        """The newest window waiting (None: close() asked the thread to end): the windows that
        closed while this trainer's previous question (or the other trainers', see NodeTurn)
        held the model are recorded as dropped, never asked: an answer about an outdated window
        would be applied many minibatches after it (staleness)."""
        while True:
            try:
                newer = self._inbox.get_nowait()
            except queue.Empty:
                return point
            if newer is None:
                return None
            self.dropped_windows += 1
            self.steer.finish(self._record(Decision(  # -1, -2, ...: a key of its own in the store
                decision=-self.dropped_windows, window=point.raw.get("window"), model=self.agent_cfg.model.name,
                backend=self.agent_cfg.backend, fallback=self.agent_cfg.fallback,
                reason="dropped: a newer window closed before the agent asked")))
            point = newer

    def _ask(self, point: DecisionPoint) -> None:
        self._n += 1
        try:
            for w in (point.raw, *point.recent):  # measured off the loader: wait for it here
                settle(w)
            prompt = self.builder.build(point.raw, self.history(), point.recent)
            with self._lock:  # its own example later repeats the question exactly (prefix-stable)
                self._asked[self._n] = prompt.asked
                for k in [k for k in self._asked if k < self._n - HISTORY_KEEP]:
                    del self._asked[k]  # never applied (superseded, or the run ended)
            if self._maker is None:
                d = Decision(reason=f"fallback: model load failed: {self._load_error}"[:2000],
                             fallback=self.agent_cfg.fallback, model=self.agent_cfg.model.name,
                             backend=self.agent_cfg.backend, prompt_hash=prompt.hash)
            else:
                d = self._maker.decide(prompt, cancel=self._stop)
        except Exception as exc:  # never let the agent thread die silently
            log.exception("agent decision failed")
            d = Decision(reason=f"fallback: error: {type(exc).__name__}: {exc}"[:2000],
                         fallback=self.agent_cfg.fallback, model=self.agent_cfg.model.name)
        d.decision = self._n
        d.window = point.raw.get("window")
        d.decided_step = self.steer.last_step
        self._outbox.put((d, point))


class AgentPolicy(Steering):
    """`agent`: the steering skeleton with the LLM deciding."""

    name = "agent"

    def __init__(self, cfg: PrefetchConfig, agent: AgentConfig | None = None,
                 decision_maker: DecisionMaker | None = None, inbox_size: int = INBOX_SIZE, **extra: Any):
        super().__init__(cfg, LLMDecider(cfg, agent, decision_maker, inbox_size))

    @property
    def agent_cfg(self) -> AgentConfig:
        return self.decider.agent_cfg

    @property
    def dropped_windows(self) -> int:
        return self.decider.dropped_windows

    @property
    def pass_at_1(self) -> float | None:
        """Share of judged decisions whose predicted effect matched the outcome."""
        j = self.judged_correct
        return sum(j) / len(j) if j else None

    def history(self) -> list[HistoryEntry]:
        return self.decider.history()
