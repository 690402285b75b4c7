"""Verifier actor: rule-based reward functions over a rollout batch.

Each function (a registry name or `module:function`) writes `reward.<source>`. A function that
raises, returns a non-number or exceeds its time limit gives that sample a null `reward.<source>`
and a `reward_error.<source>` message; the run goes on. Functions run in sandboxed worker
processes (actors.sandbox.pool). Rows whose prompt the verifier does not label
(`verifier.fraction` < 1: column `labelled` false) get a null reward and no error, except from a
label-free function (`@label_free_reward`: majority vote, Co-Reward), which reads no reference and scores
every row.
"""

from __future__ import annotations

import hashlib
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import ray

from actors import batch as B
from actors.rewards.aggregate import TOKEN_REWARD_PREFIX
from actors.rewards.process import split_steps, step_rewards_row, token_positions

# Columns a reward function does not get: prompt, response and dataset columns pass through.
NOT_DATASET = (set(B.CORE_FIELDS) | set(B.OPTIONAL_FIELDS)) - {"prompt", "response"}


def _allow_env(specs) -> dict[str, str]:
    """code_tests' `allow_missing_layers` args, for the pool's start-up check (docs/security.md)."""
    from actors.sandbox import ALLOW_ENV, allowed_missing

    allowed = set()
    for r in specs:
        if (r.fn or r.name) == "code_tests" and r.args.get("allow_missing_layers"):
            allowed |= allowed_missing(r.args["allow_missing_layers"])
    return {ALLOW_ENV: ",".join(sorted(allowed))} if allowed else {}


class Verifier:
    def __init__(self, config, role: dict | None = None):
        from actors.sandbox import RewardPool

        self.specs = config.fn_rewards() + config.process_rewards()
        self.process = {r.name: r.delimiter for r in config.process_rewards()}
        self.label_free = {r.name for r in self.specs if r.label_free}  # scored on unlabelled prompts too
        self.tokenizer = _tokenizer(config.model) if self.process else None  # steps -> token positions
        self.on_error = config.verifier.on_error
        self.accuracy_source = config.accuracy_source()
        v = config.verifier
        self.sandbox = RewardPool({r.name: r.fn or r.name for r in self.specs}, workers=v.workers,
                                  max_workers=v.max_workers, memory_mb=v.memory_mb, cpu_time_s=v.cpu_time_s,
                                  env=_allow_env(self.specs))
        self.timeouts = {r.name: r.timeout_s for r in self.specs}
        self.state: dict = {}  # stateful verifiers (e.g. VeRPO's test weights) keep theirs here

    def ping(self) -> int:
        return 0

    def _scope(self, source: str) -> str:
        scope = getattr(self.sandbox, "scope", None)
        return scope(source) if scope else "sample"

    def _score(self, table: pa.Table, held: dict | None = None) -> tuple[pa.Table, dict]:
        """Append `reward.<source>` and `reward_error.<source>` for every fn source. `held`: the
        driver's merged statistics (orchestrator.held_state); then this replica keeps none and
        info[B.DELTA_KEY] carries what the batch adds."""
        B.validate(table)
        start = time.perf_counter()
        columns = [n for n in table.schema.names
                   if n not in NOT_DATASET and not n.startswith((B.REWARD_PREFIX, B.REWARD_ERROR_PREFIX))]
        rows = table.select(columns).to_pylist()
        labelled = (np.asarray(table.column("labelled").to_numpy(zero_copy_only=False), dtype=bool)
                    if "labelled" in table.schema.names else np.ones(table.num_rows, dtype=bool))
        every = np.ones(table.num_rows, dtype=bool)
        scored = {spec.name: every if spec.name in self.label_free else labelled for spec in self.specs}
        items, slots = [], []  # slots: (source, row indices the item's value(s) go to)
        steps_at: dict[str, dict[int, np.ndarray]] = {}  # process source -> row -> step token positions
        pieces: dict[int, list[str]] = {}  # row -> its response tokens decoded one by one (shared by sources)
        step_errors: dict[str, dict[int, str]] = {}
        for spec in self.specs:
            if spec.name in self.process:
                steps_at[spec.name], step_errors[spec.name] = {}, {}
                for i in np.nonzero(scored[spec.name])[0]:
                    steps, where = self._steps(table, int(i), rows[i]["response"], self.process[spec.name], pieces)
                    if where is None:
                        step_errors[spec.name][int(i)] = steps
                        continue
                    steps_at[spec.name][int(i)] = where
                    items.append((spec.name, {**rows[i], "steps": steps, **spec.args}))
                    slots.append((spec.name, np.array([i])))
            elif self._scope(spec.name) == "group":
                rows_of = scored[spec.name]
                groups = (B.group_index(table) if spec.group_by is None else
                          pc.dictionary_encode(table.column(spec.group_by)).combine_chunks().indices.to_numpy())
                for g in np.unique(groups[rows_of]):
                    idx = np.nonzero((groups == g) & rows_of)[0]
                    first = rows[idx[0]]
                    kwargs = {**{k: v for k, v in first.items() if k != "response"},
                              "responses": [rows[i]["response"] for i in idx],
                              "prompts": [rows[i]["prompt"] for i in idx], **spec.args}
                    items.append((spec.name, kwargs))
                    slots.append((spec.name, idx))
            else:
                for i in np.nonzero(scored[spec.name])[0]:
                    items.append((spec.name, {**rows[i], **spec.args}))
                    slots.append((spec.name, np.array([i])))
        before = self.sandbox.stats()["sources"] if items else {}
        results = self.sandbox.score(items, self.timeouts) if items else []
        after = self.sandbox.stats()["sources"] if items else {}
        values = {s.name: np.full(table.num_rows, np.nan, dtype=np.float64) for s in self.specs}
        errors: dict[str, list] = {s.name: [None] * table.num_rows for s in self.specs}
        tokens: dict[str, list] = {s: [None] * table.num_rows for s in self.process}
        for source, why in step_errors.items():
            for i, e in why.items():
                errors[source][i] = e
        for (source, idx), (value, error) in zip(slots, results):
            if error is not None:
                for i in idx:
                    errors[source][i] = error
            elif source in self.process:
                i = int(idx[0])
                n_tokens = len(table.column("response_ids")[i])
                tokens[source][i] = step_rewards_row(value, steps_at[source][i], n_tokens)
            elif len(idx) == 1 and not isinstance(value, (list, tuple)):
                values[source][idx[0]] = value
            else:
                values[source][idx] = value
        info = {"busy_s": 0.0, "rows": table.num_rows}
        for spec in self.specs:
            if spec.name in self.process:  # step rewards at token positions; no scalar reward column
                table = B.replace_column(table, TOKEN_REWARD_PREFIX + spec.name,
                                         pa.array(tokens[spec.name], pa.list_(pa.float32())))
                table = B.replace_column(table, B.REWARD_ERROR_PREFIX + spec.name,
                                         pa.array(errors[spec.name], pa.string()))
                info[f"errors/{spec.name}"] = sum(e is not None for e in errors[spec.name])
                continue
            v = values[spec.name]
            table = B.replace_column(table, B.REWARD_PREFIX + spec.name, pa.array(v, pa.float32(), mask=np.isnan(v)))
            table = B.replace_column(table, B.REWARD_ERROR_PREFIX + spec.name, pa.array(errors[spec.name], pa.string()))
            info[f"errors/{spec.name}"] = sum(e is not None for e in errors[spec.name])
            spent = after.get(spec.name, {}).get("seconds", 0.0) - before.get(spec.name, {}).get("seconds", 0.0)
            info[f"seconds/{spec.name}"] = spent  # time the source's function ran, summed over items
            missing = self.sandbox.stats()["isolation"].get("checks", {}).get(spec.name, {}).get("missing")
            if missing:  # an opted-in weaker sandbox shows in every step's metrics
                info[f"missing_layers/{spec.name}"] = len(missing)
        for spec in self.specs:  # for the run's check on failing sources (orchestrator.reward_health)
            info[f"scored/{spec.name}"] = int(scored[spec.name].sum())
            info[f"first_error/{spec.name}"] = next((e for e in errors[spec.name] if e is not None), None)
        table, delta = self._scored_details(table, slots, results, held)  # reasons, VeRPO weights: see below
        if held is not None:
            info[B.DELTA_KEY] = delta
        info["busy_s"] = time.perf_counter() - start
        return B.with_version(table), info

    def _steps(self, table: pa.Table, i: int, response, delimiter: str, cache: dict):
        """(step texts, their last tokens' positions) of row i, or (reason, None) when the response
        cannot be split and mapped onto its tokens."""
        if not isinstance(response, str) or response == "":
            return "empty or undecodable response: no steps", None
        if i not in cache:
            cache[i] = [self.tokenizer.decode([t], skip_special_tokens=True)
                        for t in table.column("response_ids")[i].as_py()]
        pieces = cache[i]
        if delimiter == "":  # every token is a step
            keep = [k for k, p in enumerate(pieces) if p]
            return [pieces[k] for k in keep], np.array(keep, dtype=np.int64)
        ends = np.cumsum([len(p) for p in pieces])
        if not len(ends) or ends[-1] != len(response):
            return ("the response text does not match its tokens' decoded text, so steps cannot be "
                    "placed on tokens"), None
        steps = split_steps(response, delimiter)
        if not steps:
            return [], np.zeros(0, dtype=np.int64)
        return [s for s, _ in steps], token_positions(ends, [e for _, e in steps])

    @ray.method(num_returns=2)
    def score(self, table: pa.Table, state: dict | None = None) -> tuple[pa.Table, dict]:
        return self._score(table, state)

    def evaluate(self, table: pa.Table, state: dict | None = None) -> dict[str, float]:
        """Score a greedy held-out batch; accuracy is the mean of the accuracy source, failed
        samples counting as `verifier.on_error`."""
        scored, info = self._score(table.drop_columns(["labelled"]) if "labelled" in table.schema.names
                                   else table, state)
        column = scored.column(B.REWARD_PREFIX + self.accuracy_source).fill_null(self.on_error)
        out = {"accuracy": float(np.mean(column.to_numpy())), "samples": scored.num_rows,
               **B.reward_error_counts(scored)}
        if B.DELTA_KEY in info:
            out[B.DELTA_KEY] = info[B.DELTA_KEY]
        return out

    @staticmethod
    def merge_state(state: dict, delta: dict) -> dict:
        """The driver's merged statistics plus one batch's delta (see _verpo_delta)."""
        verpo = dict(state.get("verpo", {}))
        for source, entries in delta.get("verpo", {}).items():
            stats = dict(verpo.get(source, {}))
            for pid, (key, decay, attempts, passes) in entries.items():
                cur = stats.get(pid)
                if _verpo_entry_fits(cur, key, len(attempts)):
                    attempts = [decay * float(a) + x for a, x in zip(cur[1], attempts)]
                    passes = [decay * float(p) + x for p, x in zip(cur[2], passes)]
                stats[pid] = [key, list(attempts), list(passes)]
            verpo[source] = stats
        return {**state, "verpo": verpo}

    def state_dict(self) -> dict:
        return dict(self.state)

    def load_state_dict(self, state: dict) -> None:
        self.state = dict(state)

    def close(self) -> None:
        self.sandbox.close()

    # ---- hook: results with a reason and details (actors.rewards.code) -----------------------------
    # A sample function may return {"value", "reason", "details"} (the pool gives a sandbox.Scored
    # float). Its reasons go to `reward_reason.<source>` (why a sample lost marks, e.g. which test
    # failed and how; null where none). Samples whose details carry "verpo" (code_tests in mode
    # verpo) get VeRPO's difficulty-weighted pass sum instead of their value. The per-(prompt_id,
    # test) pass counts are the driver's (`held`, returned as a delta) in a run, else they live in
    # self.state["verpo"][source] (a Verifier used on its own).
    def _scored_details(self, table: pa.Table, slots: list, results: list,
                        held: dict | None) -> tuple[pa.Table, dict | None]:
        from actors.rewards.code import verpo_rewards
        from actors.sandbox import Scored

        reasons: dict[str, list] = {}
        verpo: dict[str, list] = {}
        for (source, idx), (value, error) in zip(slots, results):
            if error is not None or not isinstance(value, Scored) or len(idx) != 1:
                continue
            i = int(idx[0])
            reasons.setdefault(source, [None] * table.num_rows)[i] = value.reason
            details = value.details if isinstance(value.details, dict) else {}
            if isinstance(details.get("verpo"), dict) and isinstance(details.get("passed"), list):
                verpo.setdefault(source, []).append((i, details))
        delta: dict = {"batch": None, "state": {}}
        if verpo:
            prompt_ids = table.column("prompt_id").to_pylist()
            base = (self.state if held is None else held).get("verpo", {})
            state = dict(base)
            for source, rows in verpo.items():
                state[source], rewards = verpo_rewards(base.get(source, {}),
                                                       [(prompt_ids[i], d) for i, d in rows])
                by_prompt: dict[str, list] = {}
                for i, d in rows:
                    by_prompt.setdefault(str(prompt_ids[i]), []).append(d)
                delta["state"].setdefault("verpo", {})[source] = _verpo_delta(base.get(source, {}), state[source],
                                                                              by_prompt)
                name = B.REWARD_PREFIX + source
                v = table.column(name).to_numpy(zero_copy_only=False).astype(np.float64)
                for (i, _), reward in zip(rows, rewards):
                    if reward is not None:  # None: malformed details, the sample keeps its value
                        v[i] = reward
                table = B.replace_column(table, name, pa.array(v, pa.float32(), mask=np.isnan(v)))
            if held is None:
                self.state = {**self.state, "verpo": state}
            if "uid" in table.schema.names:  # names the batch, so a retried one is merged once
                uids = table.column("uid").to_pylist()
                counted = sorted({str(uids[i]) for rows in verpo.values() for i, _ in rows})
                delta["batch"] = hashlib.sha256("\n".join(counted).encode()).hexdigest()
        for source, why in reasons.items():
            table = B.replace_column(table, "reward_reason." + source, pa.array(why, pa.string()))
        return table, delta


def _verpo_row(details):
    from actors.rewards.code import _verpo_row as parse  # the parser verpo_rewards uses
    return parse(details)


def _verpo_entry_fits(entry, key, n: int) -> bool:
    """Whether a stored [key, attempts, passes] entry counts the same tests (else it restarts)."""
    try:
        return entry[0] == key and len(entry[1]) == n and len(entry[2]) == n
    except (TypeError, IndexError, KeyError):
        return False


def _verpo_delta(before: dict, after: dict, details: dict[str, list]) -> dict:
    """What one batch added per prompt: {prompt_id: [key, decay, attempts, passes]}, so that
    decay * (the driver's current counts) + added equals verpo_rewards' own update when nothing
    else changed the prompt meanwhile, and adds this batch to another replica's update otherwise."""
    delta = {}
    for pid, entry in after.items():
        if entry == before.get(pid) or pid not in details:
            continue
        key, attempts, passes = entry
        confs = [c for c in (_verpo_row(d) for d in details[pid]) if c is not None and c[1]["key"] == key]
        if not confs:
            continue
        decay = confs[0][1]["decay"]
        old = before.get(pid)
        if _verpo_entry_fits(old, key, len(attempts)):
            attempts = [a - decay * float(o) for a, o in zip(attempts, old[1])]
            passes = [p - decay * float(o) for p, o in zip(passes, old[2])]
        delta[pid] = [key, decay, list(attempts), list(passes)]
    return delta


def _tokenizer(model_cfg):
    """The policy's tokenizer (to place step rewards on response tokens)."""
    from actors import modeling

    if model_cfg.path:
        return modeling.load_tokenizer(model_cfg.path)
    return modeling.char_tokenizer()


VerifierActor = ray.remote(Verifier)
