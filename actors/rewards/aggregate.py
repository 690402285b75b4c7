"""The reward aggregation stage: per-source reward columns -> `reward` (and `token_rewards`).

Every reward source writes `reward.<source>` (float32, null where it has no value) and may write
`reward_error.<source>` (string, non-null where it failed). A null value with a null error means
the source did not score that sample by design (e.g. a verifier that labels only some prompts).
The `Aggregator` turns these into the aggregated `reward` (float32, never null) with a pipeline
driven by a plain-data spec; the pure functions it composes live in `actors.rewards.shaping`.

Spec (every key optional; `Aggregator(None)` is today's plain sum with weight 1 per source)::

    weights: {correct: 1.0, rm: 0.5, format: 0.1}   # default: every reward.<source>, weight 1.0;
                                                    # sources left out are not summed
    on_error: 0.0                      # what a failed sample contributes (before its weight)
    transform:                         # per source, before anything else
      rm: {par: {reference: running_mean}}   # PAR; reference: running_mean | group_mean |
                                             #   {column: <name> | [<name>, ...]} | {constant: x}
                                             # (+ momentum: m with running_mean)
    gate:                              # G-RA: source counts only where when >= threshold
      - {source: format, when: correct, threshold: 1.0}
    fill: {correct: self}              # where `correct` has no value by design, use `self`'s (LaSeR),
                                       # after transform and gate, before normalize
    normalize:                         # per source: none | group | running, or
      rm: group                        #   {kind: group|running, eps: 1e-6, momentum: m}
    select:                            # Parrot: batch-wise Pareto-optimal selection
      pareto: [correct, rm]
      scope: batch                     # batch (Parrot) | group (within each prompt group)
      dominated: mask                  # mask (Parrot: no update) | zero (reward 0)
    process:                           # process (per-step) rewards -> token_rewards
      prm: {transform: [clip, delta], eta: 0.5, drop_last: false, weight: 1.0}

Per sample and scalar source s, in this order:

1. read: value `v` = `reward.<s>` (null -> NaN). The sample *failed* for s when
   `reward_error.<s>` is non-null (its value, if any, is ignored) or the value is NaN/inf.
   Failed values are NaN from here on and are kept out of every statistic.
2. transform (PAR): `v = sigmoid(v - ref)`. A row whose reference is missing counts as failed.
   (A reference held in a `reward.<x>` column is itself a source: with default weights it is
   summed too, so list `weights` explicitly.)
3. gate (G-RA): `v = v if raw reward.<when> >= threshold else 0`; the threshold is compared with
   the *raw* `when` value (a failed/missing `when` shuts the gate). A failed sample behind a shut
   gate is no longer failed: it contributes 0 like every gated-off sample.
4. normalize: `group` -> `(v - mean) / (std + eps)` within the group (`group_id` column if
   present, else `prompt_id`); `running` -> the same with running statistics (updated with this
   batch first, unless `apply(..., update=False)`, e.g. for evaluation).
   fill (after the gate, before normalisation): where a source has no value by design (not
   failed), a stand-in source's value is used.
5. sum: `reward = sum_s w_s * c_s` with `c_s = on_error` if failed, 0 if missing by design,
   else `v` (so `on_error` is in the units of the processed value).
6. select (Parrot): the Pareto front is computed over the processed values of the listed sources
   (failed -> on_error, missing by design -> never on the front). Columns written: `pareto_front`
   (bool) and `reward_mask` (bool: the learner trains only on True rows; ANDed with an existing
   `reward_mask`). With `dominated: mask` the reward of a dominated sample is kept (the learner
   must exclude it); with `dominated: zero` its reward becomes 0 and it still trains. No row is
   ever removed.

Process sources write `token_rewards.<p>`: list<float32>, one entry per response token (same
length as `response_ids`), non-null at the last token of each reasoning step (that step's reward)
and null elsewhere; a null row means not scored / failed (then `reward_error.<p>` says why). Per
source, the step rewards go through the listed transforms in order (clip: `min(r - eta, 0)`;
delta: telescoping differences, see `shaping.delta_steps`), are weighted and summed into
`token_rewards` at the same token positions (0 elsewhere; a null row contributes nothing). The
scalar `reward` does not include process rewards: the advantage estimator adds `token_rewards`.

Metrics (a flat dict): per scalar source `reward/<s>/mean`, `/std` (over raw values of samples
that did not fail; omitted when there are none), `/null_frac` (rows with no usable value,
whatever the reason), `/errors` (non-null `reward_error.<s>`), `/timeouts` (of those, the time
limit), `/nonfinite` (only when > 0),
`/gate_open_frac` (gated sources); `reward/mean`, `reward/std`; with select
`reward/pareto/front_frac` and `reward/pareto/masked` (rows with `reward_mask` False); per process
source `token_rewards/<p>/step_mean`, `/step_std`, `/steps_mean` (steps per scored row),
`/null_frac`, and `token_rewards/return_mean` (mean per-row sum of `token_rewards`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from actors import batch as B
from actors.rewards import shaping as S

TOKEN_REWARD_PREFIX = "token_rewards."
GROUP_KEYS = ("group_id", "prompt_id")

NORMALIZE_KINDS = ("none", "group", "running")
PAR_REFERENCES = ("running_mean", "group_mean", "column", "constant")
SCOPES = ("batch", "group")
TOP_KEYS = ("weights", "on_error", "transform", "gate", "normalize", "select", "process", "fill")


class AggregateSpecError(ValueError):
    """The aggregation spec is invalid (or names a source the batch lacks); the message names the
    offending key and value."""


# ---- the parsed spec -----------------------------------------------------------------------------


@dataclass(frozen=True)
class NormalizeSpec:
    kind: str = "none"
    eps: float = 1e-6
    momentum: float | None = None


@dataclass(frozen=True)
class GateSpec:
    source: str
    when: str
    threshold: float


@dataclass(frozen=True)
class ParSpec:
    reference: str                     # one of PAR_REFERENCES
    columns: tuple[str, ...] = ()      # reference == "column"
    constant: float = 0.0              # reference == "constant"
    momentum: float | None = None      # reference == "running_mean"


@dataclass(frozen=True)
class SelectSpec:
    pareto: tuple[str, ...]
    scope: str = "batch"
    dominated: str = "mask"


@dataclass(frozen=True)
class ProcessSpec:
    transforms: tuple[str, ...] = ()
    eta: float | None = None
    drop_last: bool = False
    weight: float = 1.0


@dataclass(frozen=True)
class AggregateSpec:
    weights: dict[str, float] | None = None      # None: every source, weight 1.0
    on_error: float = 0.0
    transform: dict[str, ParSpec] = field(default_factory=dict)
    gate: tuple[GateSpec, ...] = ()
    normalize: dict[str, NormalizeSpec] = field(default_factory=dict)
    select: SelectSpec | None = None
    process: dict[str, ProcessSpec] = field(default_factory=dict)
    fill: dict[str, str] = field(default_factory=dict)  # source -> the source standing in where it has no value

    def scalar_sources(self) -> set[str]:
        """Scalar sources the spec names (must exist as `reward.<source>` columns)."""
        names = set(self.weights or ()) | set(self.transform) | set(self.normalize)
        names |= set(self.fill) | set(self.fill.values())
        names |= {g.source for g in self.gate} | {g.when for g in self.gate}
        if self.select:
            names |= set(self.select.pareto)
        return names


def parse_spec(spec: Mapping[str, Any] | None) -> AggregateSpec:
    """Validate plain data (dict from YAML, or an object with `model_dump()`) into an
    AggregateSpec; raise AggregateSpecError naming the offending key and value."""
    if spec is None:
        return AggregateSpec()
    if hasattr(spec, "model_dump"):
        spec = spec.model_dump()
    _mapping(spec, "aggregate")
    _known_keys(spec, TOP_KEYS, "aggregate")
    weights = None
    if spec.get("weights") is not None:
        weights = {_name(k, "aggregate.weights"): _number(v, f"aggregate.weights.{k}")
                   for k, v in _mapping(spec["weights"], "aggregate.weights").items()}
    on_error = _number(spec.get("on_error", 0.0), "aggregate.on_error")
    transform = {_name(k, "aggregate.transform"): _parse_transform(v, f"aggregate.transform.{k}")
                 for k, v in _mapping(spec.get("transform") or {}, "aggregate.transform").items()}
    gates = tuple(_parse_gate(g, f"aggregate.gate[{i}]")
                  for i, g in enumerate(_sequence(spec.get("gate") or [], "aggregate.gate")))
    normalize = {_name(k, "aggregate.normalize"): _parse_normalize(v, f"aggregate.normalize.{k}")
                 for k, v in _mapping(spec.get("normalize") or {}, "aggregate.normalize").items()}
    select = None
    if spec.get("select") is not None:
        select = _parse_select(spec["select"], "aggregate.select")
    process = {_name(k, "aggregate.process"): _parse_process(v, f"aggregate.process.{k}")
               for k, v in _mapping(spec.get("process") or {}, "aggregate.process").items()}
    fill = {_name(k, "aggregate.fill"): _name(v, f"aggregate.fill.{k}")
            for k, v in _mapping(spec.get("fill") or {}, "aggregate.fill").items()}
    return AggregateSpec(weights, on_error, transform, gates, normalize, select, process, fill)


def _parse_transform(value, path) -> ParSpec:
    value = _mapping(value, path)
    _known_keys(value, ("par",), path)
    if len(value) != 1:
        raise AggregateSpecError(f"{path} must name one transform (par); got {value!r}")
    path = f"{path}.par"
    opts = _mapping(value["par"] if value["par"] is not None else {}, path)
    _known_keys(opts, ("reference", "momentum"), path)
    if "reference" not in opts:
        raise AggregateSpecError(f"{path}.reference is required: running_mean, group_mean, "
                                 f"{{column: <name>}} or {{constant: <number>}}")
    ref, rpath = opts["reference"], f"{path}.reference"
    momentum = None
    if "momentum" in opts:
        if ref != "running_mean":
            raise AggregateSpecError(f"{path}.momentum applies only to reference: running_mean, "
                                     f"not {ref!r}")
        momentum = _momentum(opts["momentum"], f"{path}.momentum")
    if ref in ("running_mean", "group_mean"):
        return ParSpec(ref, momentum=momentum)
    if isinstance(ref, Mapping):
        _known_keys(ref, ("column", "constant"), rpath)
        if len(ref) != 1:
            raise AggregateSpecError(f"{rpath} must have exactly one of column/constant; got {ref!r}")
        if "column" in ref:
            cols = ref["column"]
            cols = [cols] if isinstance(cols, str) else _sequence(cols, f"{rpath}.column")
            if not cols:
                raise AggregateSpecError(f"{rpath}.column must name at least one column")
            return ParSpec("column", columns=tuple(_name(c, f"{rpath}.column") for c in cols))
        return ParSpec("constant", constant=_number(ref["constant"], f"{rpath}.constant"))
    raise AggregateSpecError(f"{rpath} is {ref!r}; expected running_mean, group_mean, "
                             f"{{column: <name>}} or {{constant: <number>}}")


def _parse_gate(value, path) -> GateSpec:
    value = _mapping(value, path)
    _known_keys(value, ("source", "when", "threshold"), path)
    missing = [k for k in ("source", "when", "threshold") if k not in value]
    if missing:
        raise AggregateSpecError(f"{path} is missing {missing}; a gate is "
                                 f"{{source: <lower>, when: <higher>, threshold: <number>}}")
    g = GateSpec(_name(value["source"], f"{path}.source"), _name(value["when"], f"{path}.when"),
                 _number(value["threshold"], f"{path}.threshold"))
    if g.source == g.when:
        raise AggregateSpecError(f"{path}: source and when are both {g.source!r}; a source "
                                 f"cannot gate itself")
    return g


def _parse_normalize(value, path) -> NormalizeSpec:
    if isinstance(value, str) or value is None:
        value = {"kind": value}
    value = _mapping(value, path)
    _known_keys(value, ("kind", "eps", "momentum"), path)
    kind = value.get("kind")
    if kind not in NORMALIZE_KINDS:
        raise AggregateSpecError(f"{path} is {kind!r}; expected one of {list(NORMALIZE_KINDS)}")
    eps = _number(value.get("eps", 1e-6), f"{path}.eps")
    if eps < 0:
        raise AggregateSpecError(f"{path}.eps must be >= 0, got {eps}")
    momentum = None
    if value.get("momentum") is not None:
        if kind != "running":
            raise AggregateSpecError(f"{path}.momentum applies only to kind running, not {kind!r}")
        momentum = _momentum(value["momentum"], f"{path}.momentum")
    return NormalizeSpec(kind, eps, momentum)


def _parse_select(value, path) -> SelectSpec:
    value = _mapping(value, path)
    _known_keys(value, ("pareto", "scope", "dominated"), path)
    if "pareto" not in value:
        raise AggregateSpecError(f"{path}.pareto is required: the reward sources to compare")
    names = [_name(n, f"{path}.pareto") for n in _sequence(value["pareto"], f"{path}.pareto")]
    if not names or len(set(names)) != len(names):
        raise AggregateSpecError(f"{path}.pareto must list distinct sources; got {names}")
    scope = value.get("scope", "batch")
    if scope not in SCOPES:
        raise AggregateSpecError(f"{path}.scope is {scope!r}; expected one of {list(SCOPES)}")
    dominated = value.get("dominated", "mask")
    if dominated not in S.DOMINATED_MODES:
        raise AggregateSpecError(f"{path}.dominated is {dominated!r}; expected one of "
                                 f"{list(S.DOMINATED_MODES)}")
    return SelectSpec(tuple(names), scope, dominated)


def _parse_process(value, path) -> ProcessSpec:
    value = _mapping(value if value is not None else {}, path)
    _known_keys(value, ("transform", "eta", "drop_last", "weight"), path)
    steps = value.get("transform") or []
    steps = [steps] if isinstance(steps, str) else _sequence(steps, f"{path}.transform")
    for t in steps:
        if t not in S.PROCESS_TRANSFORMS:
            raise AggregateSpecError(f"{path}.transform has {t!r}; expected a list of "
                                     f"{sorted(S.PROCESS_TRANSFORMS)}")
    eta = _number(value["eta"], f"{path}.eta") if value.get("eta") is not None else None
    if "clip" in steps and eta is None:
        raise AggregateSpecError(f"{path}.eta is required with the clip transform "
                                 f"(r -> min(r - eta, 0))")
    if eta is not None and "clip" not in steps:
        raise AggregateSpecError(f"{path}.eta applies only to the clip transform")
    drop_last = value.get("drop_last", False)
    if not isinstance(drop_last, bool):
        raise AggregateSpecError(f"{path}.drop_last must be true or false, got {drop_last!r}")
    if drop_last and "delta" not in steps:
        raise AggregateSpecError(f"{path}.drop_last applies only to the delta transform")
    weight = _number(value.get("weight", 1.0), f"{path}.weight")
    return ProcessSpec(tuple(steps), eta, drop_last, weight)


def _mapping(value, path) -> Mapping:
    if not isinstance(value, Mapping):
        raise AggregateSpecError(f"{path} must be a mapping, got {type(value).__name__}: {value!r}")
    return value


def _sequence(value, path) -> list:
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Iterable):
        raise AggregateSpecError(f"{path} must be a list, got {type(value).__name__}: {value!r}")
    return list(value)


def _known_keys(value: Mapping, allowed: Iterable[str], path: str) -> None:
    unknown = [k for k in value if k not in allowed]
    if unknown:
        raise AggregateSpecError(f"{path} has unknown key(s) {unknown}; allowed: {list(allowed)}")


def _name(value, path) -> str:
    if not isinstance(value, str) or not value:
        raise AggregateSpecError(f"{path}: a source name must be a non-empty string, got {value!r}")
    return value


def _number(value, path) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise AggregateSpecError(f"{path} must be a finite number, got {value!r}")
    return float(value)


def _momentum(value, path) -> float:
    m = _number(value, path)
    if not 0.0 < m <= 1.0:
        raise AggregateSpecError(f"{path} must be in (0, 1], got {m}")
    return m


# ---- the stage -----------------------------------------------------------------------------------


class Aggregator:
    """Config-driven reward aggregation over a rollout table (see the module docstring).

    `apply(table)` returns `(table, metrics)`: the same rows in the same order with `reward`
    (float32, never null) replaced or added, `token_rewards` when process sources are configured,
    `pareto_front`/`reward_mask` when selection is configured. It keeps running statistics
    (`normalize: running`, PAR `reference: running_mean`); `state_dict()`/`load_state_dict()`
    carry them through checkpoints.

    `sources`, if given, are the scalar reward sources the run will produce; the spec's names are
    then checked at construction instead of at the first batch.
    """

    def __init__(self, spec: Mapping[str, Any] | AggregateSpec | None = None,
                 sources: Iterable[str] | None = None):
        self.spec = spec if isinstance(spec, AggregateSpec) else parse_spec(spec)
        self.norms = {s: S.RunningNorm(n.momentum, n.eps) for s, n in self.spec.normalize.items()
                      if n.kind == "running"}
        self.par_means = {s: S.RunningNorm(p.momentum) for s, p in self.spec.transform.items()
                          if p.reference == "running_mean"}
        if sources is not None:
            self._check_sources(sorted(set(sources)))

    # -- state --
    def state_dict(self) -> dict:
        return {"normalize": {s: n.state_dict() for s, n in self.norms.items()},
                "par": {s: n.state_dict() for s, n in self.par_means.items()}}

    def load_state_dict(self, state: Mapping) -> None:
        for key, norms in (("normalize", self.norms), ("par", self.par_means)):
            got = dict(state.get(key) or {})
            if set(got) != set(norms):
                raise AggregateSpecError(
                    f"aggregator state[{key!r}] holds running statistics for {sorted(got)} but the "
                    f"spec keeps them for {sorted(norms)}")
            for s, norm in norms.items():
                norm.load_state_dict(got[s])

    # -- the pipeline --
    def __call__(self, table: pa.Table, update: bool = True) -> tuple[pa.Table, dict[str, float]]:
        return self.apply(table, update)

    def apply(self, table: pa.Table, update: bool = True) -> tuple[pa.Table, dict[str, float]]:
        spec = self.spec
        n = table.num_rows
        sources = B.reward_sources(table)
        self._check_sources(sources)
        metrics: dict[str, float] = {}

        raw, failed = {}, {}
        for s in sources:
            raw[s], failed[s], m = _read_source(table, s)
            metrics.update(m)
        for name in table.schema.names:  # error counts of sources that wrote no value column
            if name.startswith(B.REWARD_ERROR_PREFIX):
                s = name[len(B.REWARD_ERROR_PREFIX):]
                metrics.setdefault(f"reward/{s}/errors", _non_null(table, name))
                metrics.setdefault(f"reward/{s}/timeouts", _timeouts(table, name))
        values = {s: raw[s].copy() for s in sources}
        groups = self._groups(table) if self._needs_groups() else None

        for s, p in spec.transform.items():
            ref = self._par_reference(table, s, p, values[s], groups, update)
            shaped = S.par(values[s], ref)
            failed[s] |= np.isnan(shaped) & ~np.isnan(values[s])
            values[s] = shaped
        gate_open: dict[str, np.ndarray] = {}
        for g in spec.gate:
            with np.errstate(invalid="ignore"):
                is_open = raw[g.when] >= g.threshold
            values[g.source] = S.gate(values[g.source], raw[g.when], g.threshold)
            failed[g.source] &= is_open
            gate_open[g.source] = gate_open.get(g.source, np.ones(n, bool)) & is_open
        for s, gate_mask in gate_open.items():
            metrics[f"reward/{s}/gate_open_frac"] = float(gate_mask.mean()) if n else 0.0
        for s, standin in spec.fill.items():  # e.g. LaSeR: the self-reward where the verifier gave no label
            missing = np.isnan(values[s]) & ~failed[s]
            values[s] = np.where(missing, values[standin], values[s])
            failed[s] = failed[s] | (missing & failed[standin])
            metrics[f"reward/{s}/filled_frac"] = float(missing.mean()) if n else 0.0
        for s, norm in spec.normalize.items():
            if norm.kind == "group":
                values[s] = S.normalize_group(values[s], groups, norm.eps)
            elif norm.kind == "running":
                if update:
                    self.norms[s].update(values[s])
                values[s] = self.norms[s].normalize(values[s])

        weights = spec.weights if spec.weights is not None else {s: 1.0 for s in sources}
        reward = S.weighted_sum(values, weights, failed, spec.on_error)

        out = table
        if spec.select is not None:
            sel = spec.select
            matrix = np.stack([np.where(failed[s], spec.on_error, values[s]) for s in sel.pareto],
                              axis=1) if n else np.zeros((0, len(sel.pareto)))
            front = S.pareto_front(matrix, groups if sel.scope == "group" else None)
            reward, mask = S.apply_front(reward, front, sel.dominated)
            if "reward_mask" in out.schema.names:
                mask &= out.column("reward_mask").fill_null(True).to_numpy(zero_copy_only=False)
            out = _put(out, "pareto_front", pa.array(front, pa.bool_()))
            out = _put(out, "reward_mask", pa.array(mask, pa.bool_()))
            metrics["reward/pareto/front_frac"] = float(front.mean()) if n else 0.0
            metrics["reward/pareto/masked"] = int(n - mask.sum())

        if spec.process:
            token_rewards, m = self._process(table)
            out = _put(out, "token_rewards", token_rewards)
            metrics.update(m)

        out = _put(out, "reward", pa.array(reward.astype(np.float32), pa.float32()))
        if n:
            metrics["reward/mean"] = float(reward.mean())
            metrics["reward/std"] = float(reward.std())
        assert out.num_rows == n
        return B.with_version(out), metrics

    # -- helpers --
    def _check_sources(self, sources: list[str]) -> None:
        unknown = sorted(self.spec.scalar_sources() - set(sources))
        if unknown:
            raise AggregateSpecError(
                f"aggregate names reward source(s) {unknown} that the batch does not have; known "
                f"sources (columns 'reward.<source>'): {sorted(sources)}")

    def _needs_groups(self) -> bool:
        spec = self.spec
        return (any(n.kind == "group" for n in spec.normalize.values())
                or any(p.reference == "group_mean" for p in spec.transform.values())
                or (spec.select is not None and spec.select.scope == "group"))

    def _groups(self, table: pa.Table) -> np.ndarray:
        key = next((k for k in GROUP_KEYS if k in table.schema.names), None)
        if key is None:
            raise AggregateSpecError(f"group normalisation/selection needs a group key column "
                                     f"({' or '.join(GROUP_KEYS)}); the batch has "
                                     f"{table.schema.names}")
        col = table.column(key)
        if col.null_count:
            raise AggregateSpecError(f"group key column {key!r} has {col.null_count} null(s)")
        if pa.types.is_dictionary(col.type):
            col = pc.cast(col, col.type.value_type)
        return col.combine_chunks().dictionary_encode().indices.to_numpy().astype(np.int64)

    def _par_reference(self, table, source, p: ParSpec, v, groups, update):
        if p.reference == "constant":
            return p.constant
        if p.reference == "running_mean":
            if update:
                self.par_means[source].update(v)
            return self.par_means[source].mean
        if p.reference == "group_mean":
            n_groups = int(groups.max(initial=-1)) + 1
            valid = ~np.isnan(v)
            count = np.bincount(groups, weights=valid.astype(float), minlength=n_groups)
            total = np.bincount(groups, weights=np.where(valid, v, 0.0), minlength=n_groups)
            mean = np.divide(total, count, out=np.full(n_groups, np.nan), where=count > 0)
            return mean[groups]
        refs = []
        for c in p.columns:
            if c not in table.schema.names:
                raise AggregateSpecError(f"aggregate.transform.{source}.par.reference column {c!r} "
                                         f"is not in the batch; columns: {table.schema.names}")
            if not pa.types.is_floating(table.schema.field(c).type) and \
                    not pa.types.is_integer(table.schema.field(c).type):
                raise AggregateSpecError(f"PAR reference column {c!r} must be numeric, "
                                         f"got {table.schema.field(c).type}")
            refs.append(_floats(table.column(c)))
        return np.stack(refs, axis=1) if len(refs) > 1 else refs[0]

    def _process(self, table: pa.Table) -> tuple[pa.ListArray, dict[str, float]]:
        if "response_ids" not in table.schema.names:
            raise AggregateSpecError("aggregate.process needs the response_ids column (token "
                                     "rewards have one value per response token)")
        n = table.num_rows
        n_tokens = _lengths(table.column("response_ids"))
        starts = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(n_tokens, out=starts[1:])
        total = np.zeros(int(starts[-1]), dtype=np.float64)
        metrics: dict[str, float] = {}
        known = [c[len(TOKEN_REWARD_PREFIX):] for c in table.schema.names
                 if c.startswith(TOKEN_REWARD_PREFIX)]
        for src, p in self.spec.process.items():
            name = TOKEN_REWARD_PREFIX + src
            if name not in table.schema.names:
                raise AggregateSpecError(f"aggregate.process names source {src!r} but the batch has "
                                         f"no column {name!r}; process sources in the batch: {known}")
            col = _combined(table.column(name))
            if not (pa.types.is_list(col.type) and pa.types.is_floating(col.type.value_type)):
                raise AggregateSpecError(f"column {name!r} must be list<float32>, got {col.type}")
            lengths = _lengths(col)
            scored = col.is_valid().to_numpy(zero_copy_only=False)
            bad = np.nonzero(scored & (lengths != n_tokens))[0]
            if len(bad):
                r = int(bad[0])
                raise B.BatchError(f"column {name!r} row {r} has {lengths[r]} values but "
                                   f"response_ids has {n_tokens[r]} tokens")
            flat = col.flatten().to_numpy(zero_copy_only=False).astype(np.float64)
            row = np.repeat(np.arange(n), lengths)
            pos = np.arange(len(flat)) - np.repeat(_starts(lengths), lengths)  # token index
            is_step = ~np.isnan(flat)
            steps_per_row = np.bincount(row[is_step], minlength=n)
            # rank of each step within its row -> a padded [N, S] step matrix
            rank = np.arange(int(is_step.sum())) - np.repeat(_starts(steps_per_row), steps_per_row)
            width = int(steps_per_row.max(initial=0))
            steps = np.zeros((n, width))
            mask = np.zeros((n, width), dtype=bool)
            steps[row[is_step], rank] = flat[is_step]
            mask[row[is_step], rank] = True
            shaped = steps
            for t in p.transforms:
                if t == "clip":
                    shaped = S.clip_padded(shaped, mask, p.eta)
                else:
                    shaped = S.delta_padded(shaped, mask, p.drop_last)
            total[starts[row[is_step]] + pos[is_step]] += p.weight * shaped[row[is_step], rank]
            vals = flat[is_step]
            if len(vals):
                metrics[f"token_rewards/{src}/step_mean"] = float(vals.mean())
                metrics[f"token_rewards/{src}/step_std"] = float(vals.std())
            metrics[f"token_rewards/{src}/null_frac"] = float(1 - scored.mean()) if n else 0.0
            if scored.any():
                metrics[f"token_rewards/{src}/steps_mean"] = float(steps_per_row[scored].mean())
        if n:
            returns = np.bincount(np.repeat(np.arange(n), n_tokens), weights=total, minlength=n)
            metrics["token_rewards/return_mean"] = float(returns.mean())
        return B.list_column(total.astype(np.float32), n_tokens, pa.float32()), metrics


def _combined(column: pa.ChunkedArray | pa.Array) -> pa.Array:
    return column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column


def _lengths(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    return _combined(column).value_lengths().fill_null(0).to_numpy().astype(np.int64)


def _starts(lengths: np.ndarray) -> np.ndarray:
    """Start offset of each segment given segment lengths."""
    out = np.zeros(len(lengths), dtype=np.int64)
    np.cumsum(lengths[:-1], out=out[1:])
    return out


def _floats(column) -> np.ndarray:
    """Numeric Arrow column -> float64 numpy with NaN for null."""
    arr = _combined(column)
    return pc.cast(arr, pa.float64()).to_numpy(zero_copy_only=False)


def _non_null(table: pa.Table, name: str) -> int:
    return int(table.num_rows - table.column(name).null_count)


def _timeouts(table: pa.Table, name: str) -> int:
    """Errors that are the reward pool's time limit: "timed out after ...", or "timed out
    (skipped: ...)" for samples skipped because their source hung."""
    hits = pc.starts_with(_combined(table.column(name)).cast(pa.string()), "timed out")
    return int(pc.sum(hits.fill_null(False)).as_py() or 0)


def _read_source(table: pa.Table, s: str) -> tuple[np.ndarray, np.ndarray, dict[str, float]]:
    """(values with NaN for unusable, failed mask, metrics) of `reward.<s>`."""
    n = table.num_rows
    column = table.column(B.REWARD_PREFIX + s)
    v = _floats(column)
    null = ~_combined(column).is_valid().to_numpy(zero_copy_only=False)
    nonfinite = ~np.isfinite(v) & ~null
    err_name = B.REWARD_ERROR_PREFIX + s
    if err_name in table.schema.names:
        has_error = _combined(table.column(err_name)).is_valid().to_numpy(zero_copy_only=False)
    else:
        has_error = np.zeros(n, dtype=bool)
    failed = has_error | nonfinite
    v = np.where(failed | null, np.nan, v)
    usable = ~np.isnan(v)
    metrics: dict[str, float] = {f"reward/{s}/null_frac": float(1 - usable.mean()) if n else 0.0,
                                 f"reward/{s}/errors": int(has_error.sum()),
                                 f"reward/{s}/timeouts": _timeouts(table, err_name) if err_name in table.schema.names else 0}
    if usable.any():
        metrics[f"reward/{s}/mean"] = float(v[usable].mean())
        metrics[f"reward/{s}/std"] = float(v[usable].std())
    if nonfinite.any():
        metrics[f"reward/{s}/nonfinite"] = int(nonfinite.sum())
    return v, failed, metrics


def _put(table: pa.Table, name: str, array: pa.Array) -> pa.Table:
    if name in table.schema.names:
        return table.set_column(table.schema.get_field_index(name), name, array)
    return table.append_column(name, array)
