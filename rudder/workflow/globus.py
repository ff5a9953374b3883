"""Globus Compute: submit a study's apps to an endpoint (e.g. on Perlmutter, configs/perlmutter/)
through `globus_compute_sdk.Executor(endpoint_id=...)`, wrapped in Parsl's GlobusComputeExecutor
so the same DAG runs unchanged.

The endpoint is in the 4.x layout: `config.yaml` (the endpoint, no engine) and
`user_config_template.yaml.j2` (the engine and its Slurm provider), rendered by the endpoint for
each distinct set of variables a submission carries (its user endpoint config), after checking
them against `user_config_schema.json`. `user_endpoint_config(model)` makes that set from an
executor of the execution file (account, qos, walltime, nodes, worker_init, ...): the runs get
the GPU executor's, stage/partition the CPU one's, each app its own (rudder.workflow.execution
.with_endpoint), so the site values live in one place, the execution file.

Fail fast, never prompt: before anything is built, `check_login()` asks the SDK's GlobusApp
whether a login is needed (no network, instant) and `check_endpoint()` asks the service for the
endpoint's status with a bounded HTTP timeout (GLOBUS_SDK_HTTP_TIMEOUT). Either failing raises
GlobusUnavailable with what to do.

`LocalEngineExecutor` stands in for the service in tests: it packs each submission exactly as
the SDK and the web service do (ComputeSerializer for function, args and kwargs, pack_buffers,
a messagepack Task) and hands it to a real GlobusComputeEngine (HTEX inside, LocalProvider or
SlurmProvider) started on this machine; results come back as messagepack Results and are
unpacked as the SDK does. Given `TemplateEngines(endpoint_dir)` instead of one engine, it does
what the endpoint does with a submission's user endpoint config: renders the template with the
endpoint package's own code and starts one engine per distinct config. Everything from
serialisation to the engine's workers is real; only the web service (AMQP queues, function
registry) is skipped.
"""
from __future__ import annotations

import concurrent.futures as cf
import os
import threading
import uuid
from pathlib import Path
from typing import Any

HTTP_TIMEOUT_S = "20"  # GLOBUS_SDK_HTTP_TIMEOUT: an unreachable service fails in seconds


class GlobusUnavailable(RuntimeError):
    """No usable Globus Compute: not logged in, service unreachable, endpoint offline."""


LOGIN_HINT = ("log in once on a terminal: `python -c 'from globus_compute_sdk import Client; "
              "Client()'` (or `globus-compute-endpoint login`), or set GLOBUS_COMPUTE_CLIENT_ID "
              "and GLOBUS_COMPUTE_CLIENT_SECRET for a client identity")


def check_login() -> None:
    """Raises GlobusUnavailable if the SDK would need an interactive login (no network used)."""
    os.environ.setdefault("GLOBUS_SDK_HTTP_TIMEOUT", HTTP_TIMEOUT_S)
    try:
        from globus_compute_sdk.sdk.auth.globus_app import get_globus_app
    except ImportError as exc:  # pragma: no cover - pinned in requirements.txt
        raise GlobusUnavailable(f"globus-compute-sdk is not installed ({exc})") from None
    try:
        app = get_globus_app()
        needed = app.login_required()  # a client identity fetches its tokens here (network)
    except Exception as exc:
        if _is_network_error(exc):
            raise GlobusUnavailable(f"cannot reach the Globus service to check credentials "
                                    f"({_one_line(exc)}); check this machine's network") from None
        # bad client env vars, unreadable token storage, rejected client secret
        raise GlobusUnavailable(f"Globus Compute credentials unusable ({_one_line(exc)}); "
                                f"{LOGIN_HINT}") from None
    if needed:
        raise GlobusUnavailable(f"Globus Compute needs a login on this machine; {LOGIN_HINT}")


def _is_network_error(exc: BaseException) -> bool:
    try:
        from globus_sdk import NetworkError
    except ImportError:  # pragma: no cover
        NetworkError = ()  # type: ignore[assignment]
    return isinstance(exc, NetworkError) or isinstance(exc, (ConnectionError, TimeoutError))


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[-1]}" if text else type(exc).__name__


def check_endpoint(endpoint_id: str) -> dict:
    """The endpoint's status from the service; raises GlobusUnavailable when the service cannot
    be reached (bounded by GLOBUS_SDK_HTTP_TIMEOUT) or the endpoint is not online."""
    os.environ.setdefault("GLOBUS_SDK_HTTP_TIMEOUT", HTTP_TIMEOUT_S)
    from globus_compute_sdk import Client

    try:
        client = Client(do_version_check=False)
        status = client.get_endpoint_status(endpoint_id)
    except Exception as exc:  # globus_sdk.NetworkError, GlobusAPIError (404, 403), ...
        what = "cannot reach Globus Compute" if _is_network_error(exc) else "Globus Compute refused"
        raise GlobusUnavailable(f"{what} for endpoint {endpoint_id} ({_one_line(exc)})") from None
    state = (status or {}).get("status")
    if state != "online":
        raise GlobusUnavailable(f"endpoint {endpoint_id} is {state or 'unknown'}: start it "
                                "(`globus-compute-endpoint start <name>` on the login node)")
    return status


def sdk_executor(endpoint_id: str):
    """The SDK executor for Parsl's GlobusComputeExecutor, after the fail-fast checks."""
    check_login()
    check_endpoint(endpoint_id)
    from globus_compute_sdk import Executor

    return Executor(endpoint_id=endpoint_id)


# -- the endpoint's template variables ------------------------------------------------------------

def user_endpoint_config(model) -> dict | None:
    """The template variables (configs/perlmutter/user_config_template.yaml.j2) that reproduce
    an execution-file executor (HighThroughputExecutor or MPIExecutor + SlurmProvider) on the
    endpoint; None for anything else (it has no Slurm values to send)."""
    from rudder.workflow.execution import AddressByInterface, MpiModel, SlurmProviderModel

    provider = getattr(model, "provider", None)
    if not isinstance(provider, SlurmProviderModel):
        return None
    if not provider.account or not provider.qos:
        raise ValueError("an endpoint submission needs provider.account and provider.qos")
    out = {"account": provider.account, "qos": provider.qos, "walltime": provider.walltime,
           "nodes": provider.nodes_per_block, "worker_init": provider.worker_init,
           "exclusive": provider.exclusive, "max_blocks": provider.max_blocks,
           "max_runs": model.max_workers if isinstance(model, MpiModel) else 1,
           "constraint": provider.constraint or None,
           "gpus_per_node": provider.gpus_per_node,
           "drain_period": getattr(model, "drain_period", None),
           "ifname": model.address.ifname if isinstance(model.address, AddressByInterface)
           else None}
    return {k: v for k, v in out.items() if v is not None}


def render_user_config(endpoint_dir: str | Path, user_opts: dict):
    """What the endpoint builds for a submission carrying `user_opts`: config.yaml loaded as the
    parent (it must be the 4.x endpoint-only kind), the template rendered after the schema
    check, loaded into a UserEndpointConfig whose engine is built, not started. Uses the
    endpoint package's own loaders (globus_compute_endpoint.endpoint.config.utils)."""
    import pwd

    from globus_compute_endpoint.endpoint.config import CoreEndpointConfig
    from globus_compute_endpoint.endpoint.config.utils import (
        get_config, load_config_yaml, load_user_config_schema, load_user_config_template,
        render_config_user_template)
    from globus_compute_endpoint.endpoint.identity_mapper import MappedPosixIdentity

    endpoint_dir = Path(endpoint_dir)
    parent = get_config(endpoint_dir)
    if not isinstance(parent, CoreEndpointConfig):
        raise ValueError(f"{endpoint_dir}/config.yaml has an engine: the 4.x endpoint refuses "
                         "it (the engine belongs in user_config_template.yaml.j2)")
    template_path = endpoint_dir / "user_config_template.yaml.j2"
    template = load_user_config_template(template_path)
    schema = load_user_config_schema(endpoint_dir / "user_config_schema.json")
    identity = MappedPosixIdentity(pwd.getpwuid(os.getuid()), [], None)
    text = render_config_user_template(parent, template, template_path, identity, schema,
                                       user_opts, {})
    return load_config_yaml(text)


# -- the local stand-in for the service ---------------------------------------------------------

def pack_task(fn, args: tuple, kwargs: dict, task_id: uuid.UUID | None = None,
              serde=None) -> tuple[uuid.UUID, bytes]:
    """A task exactly as the endpoint receives it: a messagepack Task whose buffer holds the
    function, args and kwargs, each serialised by the SDK's ComputeSerializer."""
    from globus_compute_common import messagepack
    from globus_compute_common.messagepack.message_types import Task
    from globus_compute_sdk.serialize import ComputeSerializer

    serde = serde or ComputeSerializer()
    task_id = task_id or uuid.uuid4()
    buf = serde.pack_buffers([serde.serialize(fn), serde.serialize(args), serde.serialize(kwargs)])
    return task_id, messagepack.pack(Task(task_id=task_id, task_buffer=buf))


def unpack_result(packed: bytes, serde=None) -> Any:
    """The SDK's view of a Result: the value, or TaskExecutionFailed for an error."""
    from globus_compute_common import messagepack
    from globus_compute_sdk.errors import TaskExecutionFailed
    from globus_compute_sdk.serialize import ComputeSerializer

    res = messagepack.unpack(packed)
    if res.is_error:
        raise TaskExecutionFailed(res.data)
    return (serde or ComputeSerializer()).deserialize(res.data)


def start_local_engine(run_dir: str | Path, provider=None, max_workers: int = 1,
                       engine_cls=None, **engine_kwargs):
    """A real GlobusComputeEngine on this machine (LocalProvider unless `provider` given)."""
    from globus_compute_endpoint.engines import GlobusComputeEngine
    from parsl.providers import LocalProvider

    engine_cls = engine_cls or GlobusComputeEngine
    provider = provider or LocalProvider(init_blocks=1, min_blocks=0, max_blocks=1)
    kwargs = dict(address="127.0.0.1", provider=provider, encrypted=False, **engine_kwargs)
    if engine_cls is GlobusComputeEngine:
        kwargs.setdefault("max_workers_per_node", max_workers)
    engine = engine_cls(**kwargs)
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    engine.start(endpoint_id=uuid.uuid4(), run_dir=str(run_dir))
    return engine


def _sdk_executor_base():
    from globus_compute_sdk import Executor

    return Executor


class TemplateEngines:
    """The endpoint's side of templating, on this machine: one engine per distinct user endpoint
    config, rendered from `endpoint_dir` by render_user_config and started under `run_dir`.
    `adapt(engine, user_opts)` may change the built engine before it starts (tests swap the
    SlurmProvider for a LocalProvider where no Slurm runs)."""

    def __init__(self, endpoint_dir: str | Path, run_dir: str | Path, adapt=None):
        self.endpoint_dir = Path(endpoint_dir)
        self.run_dir = Path(run_dir)
        self.adapt = adapt
        self.engines: dict[str, Any] = {}
        self.configs: dict[str, Any] = {}  # the rendered UserEndpointConfig per key
        self._lock = threading.Lock()

    def engine_for(self, user_opts: dict | None):
        import json

        key = json.dumps(user_opts or {}, sort_keys=True)
        with self._lock:
            if key not in self.engines:
                cfg = render_user_config(self.endpoint_dir, dict(user_opts or {}))
                engine = cfg.engine
                if self.adapt is not None:
                    self.adapt(engine, user_opts or {})
                run_dir = self.run_dir / f"uep{len(self.engines)}"
                run_dir.mkdir(parents=True, exist_ok=True)
                engine.start(endpoint_id=uuid.uuid4(), run_dir=str(run_dir))
                self.engines[key], self.configs[key] = engine, cfg
            return self.engines[key]

    def shutdown(self) -> None:
        with self._lock:
            for engine in self.engines.values():
                engine.shutdown()
            self.engines.clear()


class LocalEngineExecutor(_sdk_executor_base()):  # type: ignore[misc]
    """globus_compute_sdk.Executor look-alike that submits to a local engine (no service), or to
    the engine a TemplateEngines renders for the submission's user_endpoint_config. Parsl's
    GlobusComputeExecutor accepts it (it is an SDK Executor subclass)."""

    def __init__(self, engine, serde=None):  # noqa: D107 - the SDK's __init__ needs a login
        from globus_compute_sdk.serialize import ComputeSerializer

        self.engine = engine
        self.serde = serde or ComputeSerializer()
        self.resource_specification: dict | None = None
        self.user_endpoint_config: dict | None = None
        self.endpoint_id = uuid.uuid4()
        self._lock = threading.Lock()
        self._futures: set[cf.Future] = set()
        self.submitted = 0
        self.user_configs_seen: list[dict | None] = []  # per submission, in order

    def __repr__(self) -> str:  # the SDK's reads attributes its __init__ (skipped here) sets
        return f"LocalEngineExecutor(endpoint_id={self.endpoint_id})"

    def submit(self, fn, *args, **kwargs):  # type: ignore[override]
        from globus_compute_endpoint.engines.base import GCFuture

        task_id, packed = pack_task(fn, args, kwargs, serde=self.serde)
        out: cf.Future = cf.Future()
        engine_f = GCFuture(task_id)

        def done(f: cf.Future) -> None:
            try:
                out.set_result(unpack_result(f.result(), self.serde))
            except BaseException as exc:  # TaskExecutionFailed, engine failures
                out.set_exception(exc)
            with self._lock:
                self._futures.discard(out)

        engine_f.add_done_callback(done)
        uec = dict(self.user_endpoint_config) if self.user_endpoint_config else None
        with self._lock:
            self._futures.add(out)
            self.submitted += 1
            self.user_configs_seen.append(uec)
        engine = self.engine.engine_for(uec) if isinstance(self.engine, TemplateEngines) \
            else self.engine
        engine.submit(engine_f, packed, resource_specification=dict(
            self.resource_specification or {}))
        return out

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:  # type: ignore[override]
        with self._lock:
            futs = list(self._futures)
        for f in futs:
            if cancel_futures:
                f.cancel()

    def _get_result_watcher(self):  # Parsl's GlobusComputeExecutor.shutdown calls this
        return _NoWatcher()


class _NoWatcher:
    def shutdown(self, wait: bool = True, cancel_futures: bool = False) -> None:
        pass
