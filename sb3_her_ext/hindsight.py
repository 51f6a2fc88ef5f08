"""Hindsight state of the replay buffer and the glue that turns one env step into candidate rows.

Three kinds of synthetic transitions are made from the env's trade information (see docs/DESIGN.md):

* backward (kind 1): on a trade close, if the trade's peak PnL beat ``threshold`` x the realised PnL,
  a row paying the peak PnL (``cuda_ext.hindsight_inject``, fed by ``cuda_ext.hindsight_track``);
* forward (kind 2): ``lookahead`` steps after a close, if holding on would have paid more than
  ``threshold`` x the realised PnL, a row paying that (``cuda_ext.hindsight_forward``);
* magnitude relabel (kind 3): on a close, the same step with the other position magnitudes and the
  reward scaled accordingly (``cuda_ext.magnitude_relabel``).

An action of one branch of joint codes (``HindsightConfig.joint_nvec``: a mixed-radix code over the branches,
the first most significant) is decoded into its branches for the ops and their rows are encoded again
(:class:`JointCodes`), so a joint face gets exactly the rows its branched face would, as codes.

:class:`HindsightState` holds every per-book tracker, the forward ring and the cumulative counters as
device tensors; :meth:`HindsightState.candidates` returns the candidate row blocks that the replay buffer
joins with the real rows into its single ``per_push`` (:class:`cuda_ext.replay_storage.PushJoiner`), and
:meth:`HindsightState.after_push` advances the trackers with the real rows' slots. Nothing here loops over
books or rows in Python and nothing reads a device value on the host.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Literal, NamedTuple

import torch

import cuda_ext
from cuda_ext.replay_storage import PushBlock
from sb3_her_ext.validation import is_whole

#: Ring length of the per-book mid tracker (``cuda_ext.hindsight_track`` takes any length >= 1).
TRACK_RING = 512

#: Replay ``kind`` codes.
KIND_REAL, KIND_BACKWARD, KIND_FORWARD, KIND_RELABEL = 0, 1, 2, 3

#: Info keys the hindsight glue reads from the env (docs/DESIGN.md, "The action and the step").
REQUIRED_INFO_KEYS: tuple[str, ...] = (
    "mid", "best_bid", "best_ask", "position", "trade_closed", "trade_pnl", "trade_lots", "entry_mid",
)

_ANCHORS = {"close": 0, "peak": 1}


@dataclass
class HindsightConfig:
    """Which hindsight transitions the replay buffer injects, and how.

    :param backward: inject backward (peak) hindsight rows on trade close (kind 1).
    :param forward: inject forward hindsight rows ``lookahead`` steps after a close (kind 2).
    :param relabel: inject magnitude-relabel rows on trade close (kind 3). Off by default: the plan's
        relabel ``reward * m_k / m_a`` is not the reward the other magnitude would have earned (fees, fills
        and a move to flat do not scale with size; issue 35 measured the true counterfactual reward on 2 of
        2,808 rows). Exact counterfactual targets (``BranchingIQN(counterfactual=True)``) replace it.
    :param threshold: a hindsight row is made when the alternative PnL exceeds ``threshold`` x the
        realised one; >= 0.
    :param priority_boost: backward rows enter with ``priority_boost`` x the running max priority; > 0.
    :param lookahead: steps after a close at which the forward check runs (slots expire at twice that); >= 1.
    :param anchor: ``"close"``: a backward row uses the closing step's transition; ``"peak"``: the
        transition into the peak step (its ``next_obs`` as state) with the exit action. The peak row is
        read from the replay at close time: if the ring wrapped past it during a very long trade, that
        slot holds a newer row (size the buffer well above ``n_envs`` x the longest trade).
    :param forward_capacity: closed trades the forward ring holds; >= 1.
    :param reward_scale: the env's reward per unit of currency (the algorithm takes it from the env); > 0.
    :param direction_branch: index of the direction branch of the action.
    :param magnitude_branch: index of the magnitude branch of the action.
    :param flat_action: value of the direction branch meaning "flat" (the exit action).
    :param magnitudes: position fraction of each value of the magnitude branch; each > 0.
    :param joint_nvec: ``None``: the action's branches are the ones above. Else the action is one branch of
        joint codes ``sum_i a_i * prod(joint_nvec[i + 1:])`` over branches of these sizes (the branch
        indices above count among them): the relabels decode the code, relabel the branches and encode
        again. ``BranchingIQN`` reads it from an env that publishes ``joint_nvec``.

    The branch defaults (``direction_branch=0``, ``magnitude_branch=1``, ``flat_action=1``, ``magnitudes``
    ``(0.25, 0.5, 1.0)``) are a convenience for foxenv's action, not assumptions of the algorithm: pass your
    action's own. An env that publishes them supplies them: ``BranchingIQN`` (``resolve_hindsight``) reads
    ``reward_scale`` and ``magnitudes`` from the env, and the branch indices are the positions of
    ``"direction"`` and ``"magnitude"`` in its ``branch_names``. ``flat_action=1`` matches the direction
    encoding (0 short, 1 flat, 2 long) that ``cuda_ext.hindsight_forward`` writes for "stay in the trade".
    """

    backward: bool = True
    forward: bool = True
    relabel: bool = False
    threshold: float = 1.5
    priority_boost: float = 3.0
    lookahead: int = 50
    anchor: Literal["close", "peak"] = "close"
    forward_capacity: int = 256
    reward_scale: float = 1.0
    direction_branch: int = 0
    magnitude_branch: int = 1
    flat_action: int = 1
    magnitudes: tuple[float, ...] = (0.25, 0.5, 1.0)
    joint_nvec: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        self.magnitudes = tuple(float(m) for m in self.magnitudes)
        if self.joint_nvec is not None:
            nvec = tuple(self.joint_nvec)
            if len(nvec) < 1 or not all(is_whole(n) and n >= 1 for n in nvec):
                raise ValueError(f"joint_nvec={self.joint_nvec} must be a non-empty tuple of integers >= 1")
            self.joint_nvec = tuple(int(n) for n in nvec)
        if not self.threshold >= 0:
            raise ValueError(f"threshold={self.threshold} must be >= 0")
        if not self.priority_boost > 0:
            raise ValueError(f"priority_boost={self.priority_boost} must be > 0")
        if not is_whole(self.lookahead) or self.lookahead < 1:
            raise ValueError(f"lookahead={self.lookahead} must be an integer >= 1")
        if self.anchor not in _ANCHORS:
            raise ValueError(f"anchor={self.anchor!r} must be one of {sorted(_ANCHORS)}")
        if not is_whole(self.forward_capacity) or self.forward_capacity < 1:
            raise ValueError(f"forward_capacity={self.forward_capacity} must be an integer >= 1")
        if not self.reward_scale > 0:
            raise ValueError(f"reward_scale={self.reward_scale} must be > 0")
        for name in ("direction_branch", "magnitude_branch", "flat_action"):
            value = getattr(self, name)
            if not is_whole(value) or value < 0:
                raise ValueError(f"{name}={value} must be an integer >= 0")
        if self.direction_branch == self.magnitude_branch:
            raise ValueError(
                f"magnitude_branch={self.magnitude_branch} must differ from "
                f"direction_branch={self.direction_branch}"
            )
        if len(self.magnitudes) < 1 or not all(m > 0 for m in self.magnitudes):
            raise ValueError(f"magnitudes={self.magnitudes} must be a non-empty tuple of values > 0")

    def relabelled_sizes(self, action_sizes: list[int] | tuple[int, ...]) -> tuple[int, ...]:
        """The branch sizes the relabels act on, for an action of branches ``action_sizes``: those, or on
        a joint action (one branch of ``prod(joint_nvec)`` codes) ``joint_nvec``.

        :raises ValueError: naming ``joint_nvec`` when the action is not one branch of that many codes.
        """
        if self.joint_nvec is None:
            return tuple(int(n) for n in action_sizes)
        codes = 1
        for n in self.joint_nvec:
            codes *= n
        if len(action_sizes) != 1 or int(action_sizes[0]) != codes:
            raise ValueError(f"joint_nvec={self.joint_nvec} needs one action branch of {codes} codes; the "
                             f"action has branches {list(action_sizes)}")
        return self.joint_nvec

    @classmethod
    def from_value(cls, value: HindsightConfig | dict | None) -> HindsightConfig | None:
        """Build a config from a config, a dict of its fields, or ``None`` (hindsight off).

        :param value: the user's setting.
        :return: the config, or ``None`` when hindsight is off.
        """
        if value is None or isinstance(value, HindsightConfig):
            return value
        if isinstance(value, dict):
            known = {f.name for f in fields(cls)}
            unknown = sorted(set(value) - known)
            if unknown:
                raise ValueError(f"hindsight has unknown keys {unknown}; known keys are {sorted(known)}")
            return cls(**value)
        raise ValueError(f"hindsight={value!r} must be a HindsightConfig, a dict or None")


class JointCodes:
    """Joint codes ``sum_i a_i * prod(nvec[i + 1:])`` to branches and back, on one device (no host sync).

    :param nvec: the branches' sizes.
    :param device: where the tables live.
    """

    def __init__(self, nvec: tuple[int, ...], device: torch.device | str) -> None:
        weights = [1] * len(nvec)
        for i in range(len(nvec) - 2, -1, -1):
            weights[i] = weights[i + 1] * int(nvec[i + 1])
        self.nvec = torch.tensor(nvec, dtype=torch.int64, device=device)
        self.weights = torch.tensor(weights, dtype=torch.int64, device=device)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """``[n, 1]`` codes to ``[n, len(nvec)]`` branches."""
        return (codes[:, :1] // self.weights) % self.nvec

    def encode(self, actions: torch.Tensor) -> torch.Tensor:
        """``[n, len(nvec)]`` branches to ``[n, 1]`` codes."""
        return (actions * self.weights).sum(1, keepdim=True)

    def to(self, device: torch.device | str) -> JointCodes:
        """A copy on ``device``."""
        moved = object.__new__(JointCodes)
        moved.nvec, moved.weights = self.nvec.to(device), self.weights.to(device)
        return moved


class StepBatch(NamedTuple):
    """One env step of ``B`` books as device tensors (what the replay buffer's ``add`` received).

    :param obs: ``[B, D]`` float32 observations.
    :param next_obs: ``[B, D]`` float32 next observations.
    :param action: ``[B, NB]`` int64 actions.
    :param reward: ``[B]`` float32 rewards.
    :param episode_end: ``[B]`` bool, the env's done (terminated or truncated): the book resets.
    :param terminal: ``[B]`` bool, the done stored in replay (``done`` and not a timeout).
    :param info: ``{key: [B] tensor}`` with :data:`REQUIRED_INFO_KEYS` (float32; ``trade_closed`` bool),
        empty when hindsight is off.
    """

    obs: torch.Tensor
    next_obs: torch.Tensor
    action: torch.Tensor
    reward: torch.Tensor
    episode_end: torch.Tensor
    terminal: torch.Tensor
    info: dict[str, torch.Tensor]


class HindsightState:
    """Per-book trackers, the forward ring and the counters of the hindsight injection, on one device.

    :param config: the hindsight settings.
    :param n_envs: number of books ``B`` per step.
    :param obs_dim: observation size ``D``.
    :param n_branches: action branches ``NB`` (1 with ``config.joint_nvec``: the joint code).
    :param device: where the state lives.
    """

    def __init__(self, config: HindsightConfig, n_envs: int, obs_dim: int, n_branches: int,
                 device: torch.device | str) -> None:
        self.config = config
        self.n_envs = n_envs
        self.obs_dim = obs_dim
        self.n_branches = n_branches
        dev = torch.device(device)
        f32, i64 = torch.float32, torch.int64
        b, s = n_envs, config.forward_capacity
        # backward tracker (cuda_ext.hindsight_track / hindsight_inject)
        self.ring = torch.zeros(b, TRACK_RING, dtype=f32, device=dev)
        self.ring_len = torch.zeros(b, dtype=i64, device=dev)
        self.entry_mid = torch.zeros(b, dtype=f32, device=dev)
        self.direction = torch.zeros(b, dtype=i64, device=dev)
        self.peak = torch.zeros(b, dtype=f32, device=dev)
        self.peak_row = torch.full((b,), -1, dtype=i64, device=dev)
        # forward ring (cuda_ext.hindsight_forward)
        self.slot_valid = torch.zeros(s, dtype=torch.bool, device=dev)
        self.slot_entry = torch.zeros(s, dtype=f32, device=dev)
        self.slot_close_step = torch.zeros(s, dtype=i64, device=dev)
        self.slot_direction = torch.zeros(s, dtype=i64, device=dev)
        self.slot_actual = torch.zeros(s, dtype=f32, device=dev)
        self.slot_lots = torch.zeros(s, dtype=f32, device=dev)
        self.slot_book = torch.zeros(s, dtype=i64, device=dev)
        self.slot_obs = torch.zeros(s, obs_dim, dtype=f32, device=dev)
        self.joint = None if config.joint_nvec is None else JointCodes(config.joint_nvec, dev)
        relabelled = n_branches if config.joint_nvec is None else len(config.joint_nvec)
        self.slot_action = torch.zeros(s, relabelled, dtype=i64, device=dev)  # the branches, decoded
        self.ring_head = torch.zeros(1, dtype=i64, device=dev)
        self.step = torch.zeros(1, dtype=i64, device=dev)
        # per-book memory of the previous step
        self.prev_position = torch.zeros(b, dtype=f32, device=dev)
        self.book_reset = torch.zeros(b, dtype=torch.bool, device=dev)
        self.magnitudes = torch.tensor(config.magnitudes, dtype=f32, device=dev)
        # cumulative rows wanted per kind (read at log time only)
        self.counts = {name: torch.zeros((), dtype=i64, device=dev)
                       for name in ("backward", "forward", "relabel")}

    def tensors(self) -> dict[str, torch.Tensor]:
        """Every state tensor by attribute name (counters as ``counts.<name>``).

        :return: name -> tensor.
        """
        state = {k: v for k, v in vars(self).items() if isinstance(v, torch.Tensor)}
        state.update({f"counts.{k}": v for k, v in self.counts.items()})
        return state

    def to(self, device: torch.device | str) -> HindsightState:
        """Return a shallow copy whose tensors live on ``device`` (the original is not modified).

        :param device: target device.
        :return: the moved state.
        """
        moved = object.__new__(HindsightState)
        for key, value in vars(self).items():
            setattr(moved, key, value.to(device) if isinstance(value, torch.Tensor) else value)
        moved.counts = {k: v.to(device) for k, v in self.counts.items()}
        joint = getattr(self, "joint", None)  # a state pickled before joint codes has none
        moved.joint = None if joint is None else joint.to(device)
        return moved

    def candidates(self, batch: StepBatch, replay_next_obs: torch.Tensor) -> list[PushBlock]:
        """Run the enabled hindsight ops for this step and return their candidate rows.

        Order: backward (``hindsight_inject``, which also resets the trackers of closed books), forward
        (``hindsight_forward``), magnitude relabel. Call before the step's ``per_push``; call
        :meth:`after_push` with the real rows' slots afterwards.

        :param batch: the step.
        :param replay_next_obs: ``[C, D]`` the replay's ``next_obs`` (the ``peak`` anchor reads it).
        :return: the candidate blocks of the enabled kinds, in the order backward, forward, relabel.
        """
        cfg, info = self.config, batch.info
        closed = info["trade_closed"]
        joint = getattr(self, "joint", None)
        action = batch.action if joint is None else joint.decode(batch.action)
        codes = (lambda rows: rows) if joint is None else joint.encode  # the rows' actions as stored
        blocks: list[PushBlock] = []
        counted: list[tuple[str, torch.Tensor]] = []  # (kind, rows wanted): added to the counters at once
        if cfg.backward:
            rows = cuda_ext.hindsight_inject(
                ring_len=self.ring_len, entry_mid=self.entry_mid, direction=self.direction, peak=self.peak,
                peak_row=self.peak_row, trade_closed=closed, raw_reward=info["trade_pnl"] * cfg.reward_scale,
                lots=info["trade_lots"], obs=batch.obs, next_obs=batch.next_obs, action=action,
                replay_next_obs=replay_next_obs, reward_scale=float(cfg.reward_scale),
                threshold=float(cfg.threshold), anchor=_ANCHORS[cfg.anchor],
                direction_branch=int(cfg.direction_branch), flat_action=int(cfg.flat_action),
            )
            counted.append(("backward", rows.count[0]))
            blocks.append(PushBlock(rows.obs, rows.next_obs, codes(rows.action), rows.reward, rows.wants,
                                    KIND_BACKWARD, done=1.0, priority=0.0,
                                    max_multiplier=float(cfg.priority_boost)))
        if cfg.forward:
            rows = cuda_ext.hindsight_forward(
                slot_valid=self.slot_valid, slot_entry=self.slot_entry, slot_close_step=self.slot_close_step,
                slot_direction=self.slot_direction, slot_actual=self.slot_actual, slot_lots=self.slot_lots,
                slot_book=self.slot_book, slot_obs=self.slot_obs, slot_action=self.slot_action,
                ring_head=self.ring_head, step=self.step, mid=info["mid"], book_reset=self.book_reset,
                trade_closed=closed, entry_mid=info["entry_mid"],
                closed_direction=torch.sign(self.prev_position).to(torch.int64),
                actual=info["trade_pnl"].abs(), lots=info["trade_lots"], obs=batch.obs, action=action,
                lookahead=int(cfg.lookahead), threshold=float(cfg.threshold),
                reward_scale=float(cfg.reward_scale), direction_branch=int(cfg.direction_branch),
            )
            counted.append(("forward", rows.count[0]))
            blocks.append(PushBlock(rows.obs, rows.next_obs, codes(rows.action), rows.reward, rows.wants,
                                    KIND_FORWARD, done=1.0, priority=0.0, max_multiplier=1.0))
        if cfg.relabel:
            relabel = cuda_ext.magnitude_relabel(
                trade_closed=closed, obs=batch.obs, next_obs=batch.next_obs, action=action,
                reward=batch.reward, magnitudes=self.magnitudes, magnitude_branch=int(cfg.magnitude_branch),
            )
            counted.append(("relabel", relabel.count[0]))
            blocks.append(PushBlock(relabel.obs, relabel.next_obs, codes(relabel.action), relabel.reward,
                                    relabel.wants, KIND_RELABEL, done=1.0, priority=relabel.priority,
                                    max_multiplier=0.0))
        if counted:  # one multi-tensor add (one kernel on a GPU) for every enabled kind
            torch._foreach_add_([self.counts[kind] for kind, _ in counted], [count for _, count in counted])
        return blocks

    def after_push(self, batch: StepBatch, real_slots: torch.Tensor) -> None:
        """Advance the trackers after the step's ``per_push``.

        The backward tracker sees the step's position and bid/ask with ``row`` = the real rows' slots;
        books whose episode ended are tracked as flat (their tracker resets: the next episode starts a
        new trade). The previous position (the closed trade's direction next step) and the forward op's
        ``book_reset`` flags are kept, and the step counter advances.

        :param batch: the step.
        :param real_slots: ``[B]`` int64 replay slots of the step's real rows (-1 where not written).
        """
        info = batch.info
        position = info["position"].masked_fill(batch.episode_end, 0.0)
        if self.config.backward:
            cuda_ext.hindsight_track(
                ring=self.ring, ring_len=self.ring_len, entry_mid=self.entry_mid, direction=self.direction,
                peak=self.peak, peak_row=self.peak_row, position=position, best_bid=info["best_bid"],
                best_ask=info["best_ask"], row=real_slots,
            )
        self.prev_position.copy_(position)
        self.book_reset.copy_(batch.episode_end)
        self.step += 1
