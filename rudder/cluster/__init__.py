"""Emulated multi-machine DistDGL runs on one host.

Picture (2 machines, 1 trainer each, as root; <t> = prefix + 6 hex digits, e.g. rdr3fa9c1):

    host: bridge <t>br 10.a.b.254/24
      ├── veth <t>h0 ══ <t>n0 in netns <t>m0, 10.a.b.1   (machine 0)
      └── veth <t>h1 ══ <t>n1 in netns <t>m1, 10.a.b.2   (machine 1)
    in each namespace, in its own mount namespace with a private tmpfs /dev/shm:
        python -m rudder.cluster.machine PLAN   (the machine's supervisor)
          ├─ store       (machine 0: torch's rendezvous store, python -m rudder.cluster.store,
          │               on a socket the supervisor bound to the machine's address)
          ├─ DGL server  (python -m rudder.cluster.dist_server; partition -> /dev/shm)
          ├─ services    (optional, e.g. the agent's model server on the machine's loopback)
          └─ trainers    (the caller's argv; DGL client + torch.distributed gloo)

API:

    from rudder.cluster import ClusterSpec, LocalCluster

    spec = ClusterSpec(machines=2, trainers_per_machine=1, bandwidth="1gbit",
                       start_timeout_s=120, run_timeout_s=1800)   # or ClusterSpec.from_config(cfg)
    with LocalCluster(spec, run_dir) as cluster:          # builds the network (root) or loopback
        cluster.addresses                                  # ["10.a.b.1", "10.a.b.2"]
        result = cluster.run(
            part_config,                                   # partition_graph's JSON
            ["python", "-m", "rudder.train", "--run-dir", str(run_dir)],   # every trainer
            service_argv=["python", "-m", "rudder.agent.service"],  # optional, one per machine
            env={"EXTRA": "1"})                            # (a list of argv lists: several)
    result.ok, result.reason, result.exit_codes, result.logs, result.wall_s, result.startup_s
    print(result.summary())                                # reason + tails of failed logs

    cleanup_stale()        # remove namespaces/links of crashed runs (dead owner); returns names
    netns_available()      # (bool, why) for `rudder doctor`

`run()` never hangs and never raises for a failed run: any process exiting non-zero, a missed
start deadline (`start_timeout_s`: every server listening and every trainer started) or the run
timeout (`run_timeout_s`) ends it, every process is stopped (SIGTERM, SIGKILL after
`kill_grace_s`), and the ClusterResult says why ("trainer 1 on machine 0 exited with code 3",
"timeout after 30 s (still running: ...)"). KeyboardInterrupt and SIGTERM/SIGHUP (main thread)
tear the run down and are then re-raised. The network lives until `close()`/context exit/atexit.

What each process finds in its environment:
  all:      RUDDER_MACHINE_ID, RUDDER_NUM_MACHINES, RUDDER_MACHINE_ADDR, RUDDER_ADDRESSES
            (comma-separated), RUDDER_RUN_DIR, RUDDER_IP_CONFIG, the caller's `env`, DGLBACKEND,
            PYTHONUNBUFFERED=1, PATH with this interpreter's bin first, OMP_NUM_THREADS
            (cores / total trainers unless set)
  server:   DGL_ROLE=server DGL_SERVER_ID=<machine> DGL_IP_CONFIG DGL_NUM_SERVER=1
            DGL_NUM_CLIENT=<total trainers x (1 + samplers)> DGL_CONF_PATH DGL_GRAPH_FORMAT=csc
  service:  RUDDER_SERVICE_ID, RUDDER_READY_FILE (write it when ready, with the service's URL
            if it has one; waited for only with spec.wait_services)
  trainer:  DGL_ROLE=client DGL_DIST_MODE=distributed DGL_NUM_SERVER=1
            DGL_NUM_SAMPLER=<spec.samplers_per_trainer>
            DGL_NUM_CLIENT DGL_GROUP_ID=0 DGL_IP_CONFIG DGL_CONF_PATH, MASTER_ADDR (machine 0),
            MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GLOO_SOCKET_IFNAME,
            RUDDER_THREADS (torch threads: the machine's cores / its trainers),
            TORCHELASTIC_USE_AGENT_STORE=True (join machine 0's store as a client; with
            spec.rendezvous), RUDDER_AGENT_URL (service 0's URL, with spec.wait_services)
A trainer calls `dgl.distributed.initialize(os.environ["DGL_IP_CONFIG"])` before
`torch.distributed.init_process_group("gloo")` (env:// rendezvous).
How a run starts its machines is a value: `rudder.cluster.launch.make_cluster(spec, run_dir,
launch)` with launch {type: local | slurm, ifname, srun_args} (the execution config's `launch:`).

Files under run_dir: ip_config.txt ("addr port" per machine); logs/machine<m>.{supervisor,server,
service<j>,trainer<rank>}.log; cluster/machine<m>.{plan,status}.json; cluster/result.json.

Without namespaces (netns=False, or a host where they cannot be made, e.g. no iproute2) the
machines run on loopback: one on 127.0.0.1, several each on its own 127.A.B.m (one random /24
per cluster). Their ports are bound and held for the run (DGL's by the owner on every machine's
address, the store's by the supervisor); a server is ready when that very process listens. As
root each machine still gets a private /dev/shm, which several machines need (DGL names its
shared memory without the partition id); the trainers are told their machine's address
(RUDDER_DGL_MACHINE_ADDR), since no interface carries it. Several machines without root or
`unshare`, or bandwidth shaping without namespaces, fail with a ClusterError saying why.

Leftovers: every name carries the cluster's id and is registered (with the owner's pid) before it
is created, so `cleanup_stale()` (also run by every `start()`) removes what a killed owner left.
Supervisors die with their owner (PR_SET_PDEATHSIG), taking their children with them.
"""
from rudder.cluster.local import (
    ClusterError,
    ClusterResult,
    ClusterSpec,
    LocalCluster,
    ProcessResult,
)
from rudder.cluster.netns import cleanup_stale, netns_available

__all__ = ["ClusterError", "ClusterResult", "ClusterSpec", "LocalCluster", "ProcessResult",
           "cleanup_stale", "netns_available"]
