"""Link rates in tc's syntax, and bandwidth schedules (`cluster.bandwidth_schedule`): one
parser for the config, the cluster that applies them with tc (rudder.cluster.netns) and the
replay's time model (rudder.sim.timemodel)."""
from __future__ import annotations

import bisect
import re

# tc's rate units (tc(8)): a bare number or `bit` = bits/s, `bps` = bytes/s, with k/m/g/t
# prefixes (decimal, as tc reads them) or ki/mi/gi/ti (binary).
_RATE_RE = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*(?:([kmgt]i?)?(bit|bps))?")
_PREFIX = {None: 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12,
           "ki": 1024, "mi": 1024 ** 2, "gi": 1024 ** 3, "ti": 1024 ** 4}


def parse_rate(rate) -> float:
    """Bits per second of a tc rate ("1gbit", "25mbit", "500kbit", "10mbps", as `tc` prints it:
    "100Mbit"); ValueError naming the value when it is not one."""
    m = _RATE_RE.fullmatch(str(rate).strip().lower()) if isinstance(rate, (str, int, float)) else None
    if m is None or (m.group(2) and not m.group(3)):
        raise ValueError(f"bad link rate {rate!r}: a tc rate is needed, e.g. 1gbit, 25mbit, 500kbit "
                         "(bit/s) or 10mbps (bytes/s)")
    bits = float(m.group(1)) * _PREFIX[m.group(2)] * (8 if m.group(3) == "bps" else 1)
    if bits <= 0:
        raise ValueError(f"bad link rate {rate!r}: must be > 0")
    return bits


def check_schedule(schedule) -> list[tuple[float, str]]:
    """`[[t_s, rate], ...]` (cluster.bandwidth_schedule) as [(seconds, rate)]: times >= 0 and
    strictly increasing, each rate a tc rate (parse_rate). ValueError naming the bad entry."""
    if not isinstance(schedule, (list, tuple)) or not schedule:
        raise ValueError(f"bandwidth schedule must be a non-empty list of [t_s, rate] pairs, got {schedule!r}")
    out: list[tuple[float, str]] = []
    for k, entry in enumerate(schedule):
        if not isinstance(entry, (list, tuple)) or len(entry) != 2:
            raise ValueError(f"bandwidth schedule entry {k} {entry!r}: expected [t_s, rate], e.g. [30, 25mbit]")
        t, rate = entry
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not t >= 0:
            raise ValueError(f"bandwidth schedule entry {k} {list(entry)!r}: time {t!r} must be a number "
                             ">= 0 (seconds after the run's machines are launched)")
        if out and t <= out[-1][0]:
            raise ValueError(f"bandwidth schedule entry {k} {list(entry)!r}: times must increase "
                             f"({t!r} after {out[-1][0]!r})")
        try:
            parse_rate(rate)
        except ValueError as exc:
            raise ValueError(f"bandwidth schedule entry {k} {list(entry)!r}: {exc}") from None
        out.append((float(t), str(rate)))
    return out




def rate_at(schedule: list[tuple[float, str]] | None, base: str | None, t: float) -> float | None:
    """Bits per second of the link at time t under `schedule` (checked), `base` before its first
    entry; None = unshaped."""
    rate = base
    if schedule:
        k = bisect.bisect_right([e[0] for e in schedule], t) - 1
        if k >= 0:
            rate = schedule[k][1]
    return None if rate is None else parse_rate(rate)
