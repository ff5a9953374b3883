"""One minibatch through the buffer: the shared algorithm, written once.

Training (rudder.prefetch.features) and the simulator (rudder.sim) both call `begin_step` then
`finish_step`; only training moves feature rows in between. Order inside a step, and why:
  1. lookup          split remote ids into hits (slots) and misses
  2. record          decay scores, count misses (not on a replacement minibatch: the reference)
  3. plan            the policy's Replace, if any, picks (victim slots, newcomer ids)
  4. commit_step     puts the newcomers into the index (which id is in which slot)
  5. [caller]        pulls misses + newcomers in ONE pull, gathers hit rows from the buffer
  6. finish_step     writes the newcomers' rows into their slots (commits first if 4 was skipped)
Hit rows are copied out (5) before slots are overwritten (6), and the buffer is touched only by
the thread that runs steps, so a minibatch never reads a buffer that changes under it.

With two pulls in flight (train.pulls_in_flight) the next minibatch's steps 1-4 run while this
one's rows are on the wire: its lookup and plan see this one's newcomers already (4), and since
the rows arrive in order, this one's 5-6 run before the next one's, so every hit reads the row
its slot held when it was looked up (a slot the next round evicts keeps its old row until then).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from rudder.prefetch.buffer import HaloBuffer
from rudder.prefetch.policy import Replace


@dataclass
class StepPlan:
    hit_mask: torch.Tensor  # over remote ids
    hit_slots: torch.Tensor  # slots of the hits, in remote-id order
    miss_ids: torch.Tensor  # remote ids not buffered (pulled)
    victims: torch.Tensor  # slots to overwrite
    newcomers: torch.Tensor  # halo ids to put there
    extra_ids: torch.Tensor  # newcomers not among the misses: pulled only for the buffer
    t_buffer: float  # seconds spent in lookup + bookkeeping + planning
    missed_pos: torch.Tensor | None = None  # halo positions of the misses that are halo nodes
    is_halo: torch.Tensor | None = None  # over remote ids: which are halo nodes
    committed: bool = False  # the newcomers are in the index (commit_step)
    newcomer_rows: torch.Tensor | None = None  # each newcomer's index in pull_ids (commit_step)

    @property
    def pull_ids(self) -> torch.Tensor:
        return torch.cat([self.miss_ids, self.extra_ids])

    @property
    def hits(self) -> int:
        return int(self.hit_slots.numel())

    @property
    def misses(self) -> int:
        return int(self.miss_ids.numel())


def begin_step(
    buffer: HaloBuffer, remote_ids: torch.Tensor, plan: Replace | None, future: list[torch.Tensor] = ()
) -> StepPlan:
    t0 = time.perf_counter()
    # remote ids are unique in a minibatch
    is_halo, _, hit_mask, hit_slots, miss_ids, missed_pos = buffer.split(remote_ids)
    buffer.record(hit_slots, missed_pos, count_misses=plan is None)
    victims = newcomers = extra = torch.empty(0, dtype=torch.int64)
    if plan is not None:
        if plan.mechanism == "massivegnn":
            victims, newcomers = buffer.plan_massivegnn(plan.max_rows, plan.stale_after)
        elif plan.mechanism == "lookahead":
            victims, newcomers = buffer.plan_lookahead(list(future), plan.max_rows, missed_pos, plan.admit)
        else:
            raise ValueError(f"unknown replacement mechanism {plan.mechanism!r}")
        if plan.mechanism == "lookahead" and plan.admit == "misses":
            extra = newcomers[:0]  # every newcomer is a miss of this minibatch
        else:
            extra = newcomers[~torch.isin(newcomers, miss_ids)]
    return StepPlan(hit_mask, hit_slots, miss_ids, victims, newcomers, extra, time.perf_counter() - t0,
                    missed_pos, is_halo)


def commit_step(buffer: HaloBuffer, step: StepPlan) -> None:
    """Puts the newcomers into the buffer's index (their rows come with the pull: finish_step):
    from here a lookup finds them. Once per step."""
    if step.committed:
        return
    step.committed = True
    if step.newcomers.numel():
        if buffer.store_features:  # before apply: it consumes the plan's memo of their positions
            step.newcomer_rows = _rows_in_pull(buffer, step)
        buffer.apply(step.victims, step.newcomers)


def finish_step(
    buffer: HaloBuffer, step: StepPlan, pulled: torch.Tensor | None = None, rows_of: torch.Tensor | None = None
) -> float:
    """Writes the newcomers (committing them first if the caller has not); `pulled` holds the
    rows of step.pull_ids (None in simulation), at positions `rows_of` (default: in pull_ids order)."""
    t0 = time.perf_counter()
    commit_step(buffer, step)
    if pulled is not None and step.newcomer_rows is not None:
        where = step.newcomer_rows
        buffer.write_rows(step.victims, pulled.index_select(0, where if rows_of is None else rows_of[where]))
    return time.perf_counter() - t0


def _rows_in_pull(buffer: HaloBuffer, step: StepPlan) -> torch.Tensor:
    """Index of each newcomer in step.pull_ids (pull ids are unique)."""
    new_pos = buffer.planned_positions(step.newcomers)
    if new_pos is not None and step.extra_ids.numel() == 0 and step.missed_pos is not None:
        # every newcomer is a miss (demand admission): from its halo position, no sort
        rows = torch.nonzero(step.is_halo.masked_select(~step.hit_mask)).flatten()  # missed_pos's rows in miss_ids
        return buffer.rows_at(step.missed_pos, rows, new_pos)
    pull_ids = step.pull_ids
    order = torch.argsort(pull_ids)
    return order[torch.searchsorted(pull_ids[order], step.newcomers)]
