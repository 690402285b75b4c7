"""Generator actor: samples n responses per prompt and returns an Arrow rollout batch."""

from __future__ import annotations

import inspect
import logging
import time
import uuid

import numpy as np
import pyarrow as pa
import ray

from actors import batch as B
from actors.judging import JudgingSpec
from actors.laser import LaserSpec, columns as laser_columns
from actors.weight_transport import Endpoint, Link
from actors.weights import StaleReplicaError, inference_copy


def shares_gpu(num_gpus: float) -> bool:
    """A replica with a fraction of a GPU shares it (with a learner that trains while it idles): it
    frees its KV cache between calls rather than keep the allocator's cached blocks."""
    return 0 < num_gpus < 1


class Generator:
    """Hosts one generation backend. Stateless about the loop: it samples what it is given with the
    weights of the last version it was sent, and stamps that version on every row."""

    def __init__(self, config, model_source: str | None, role: dict | None = None,
                 judging: JudgingSpec | None = None, laser: LaserSpec | None = None,
                 judge_vector: str | None = None):
        """`judging`: how `judge` scores (None: this generator judges nothing); `laser`: return LaSeR's
        `laser_logprob` with every sample (None: not). Both are role arguments its recipe builds
        (orchestrator.recipes.Recipe.generator_args), so the generator reads no recipe's section.
        `judge_vector`: a judge apart from the policy (actors/judge_vector.py), added to every
        version this replica loads."""
        from actors import modeling
        from actors.generation import BACKENDS
        from actors.runtime import setup_torch

        role = role or {}
        replica = role.get("replica", 0)
        device = setup_torch(role.get("threads", 0) or config.train.threads, config.seed + 1000 * (replica + 1),
                             want_gpu=role.get("num_gpus", 0) > 0)
        from actors import chat

        model, tokenizer = modeling.build(config.model, config.seed)
        # the template in force: its end-of-turn tokens stop generation (the backends' stop_token_ids)
        self.chat_template = chat.configure(tokenizer, config.data.chat_template)
        if model_source:  # a warm-up checkpoint
            model = modeling.load_model(model_source, attn=config.model.attn_implementation)
        # model.dtype (bfloat16 on a GPU by default); the learner's float32 updates are cast as they load
        model = inference_copy(model, modeling.inference_dtype(config.model.dtype, device))
        # the backend's options: sleep mode is set when the engine is built (vLLM); only
        # rollout.backend=vllm may ask for it
        options = {"sleep_mode": True} if config.rollout.vllm_sleep_level else {}
        backend = BACKENDS.get(config.rollout.backend)
        if shares_gpu(role.get("num_gpus", 0)) and "free_memory" in inspect.signature(backend).parameters:
            options["free_memory"] = True  # the HF backend: its KV cache goes back to the GPU after each call
        if "static_cache" in inspect.signature(backend).parameters:
            from actors.generation.static_cache import AUTO_MIN_NEW_TOKENS, wanted
            options["static_cache"] = wanted(config.rollout.hf_static_cache, device, config.rollout.max_new_tokens,
                                             episodes=config.env.name is not None)
            if config.rollout.hf_static_cache is None:  # auto: short calls (judges' verdicts) stay dynamic too
                options["static_min_new_tokens"] = AUTO_MIN_NEW_TOKENS
        context = getattr(model.config, "max_position_embeddings", None)
        self.backend = backend(model, tokenizer, device=device, **options)
        self.config = config.rollout
        self.episodes = None  # multi-turn episodes with an environment (env.name; actors/envs/rollout.py)
        if config.env.name is not None:
            from actors.envs.rollout import EpisodeRollouts
            self.episodes = EpisodeRollouts(config, self.backend, context)
        self.judging = judging
        self.judge_vector = None
        if judge_vector is not None:
            from actors import judge_vector as jv

            if not hasattr(self.backend, "model"):
                raise ValueError(f"judge.separate: the judge pool's backend {config.rollout.backend!r} cannot add a "
                                 "judge vector to the weights it loads; use rollout.backend=hf")
            self.judge_vector = jv.load(judge_vector)
            jv.add(self.backend.model, self.judge_vector)
        self.laser_token = None if laser is None else laser.token_id(tokenizer)
        self.seed = config.seed
        self.version = 0
        self.replica = replica
        self.weights_endpoint = Endpoint()  # its membership of the policy channel's weight group
        self.asleep = 0  # the sleep level the backend is at (rollout.vllm_sleep_level), 0: awake
        self.weights_lost = False  # woken from level 2: the weights are garbage until the next update
        level = config.rollout.vllm_sleep_level
        if level and not self.backend.can_sleep:
            logging.getLogger("coevo").warning(
                "rollout.vllm_sleep_level=%d: generator replica %d cannot sleep on %s (vLLM's CPU build ignores "
                "sleep/wake_up); it keeps its memory while the learner trains", level, replica, device)

    def sleep(self) -> bool:
        """Colocation: free the accelerator for the learner (strict on-policy, between a batch's last
        generation and the next weight update). Level 1 offloads the weights, level 2 discards them;
        the next update wakes the engine and loads its version, and a generation before it wakes
        the engine (level 1) or is refused (level 2: there is nothing to generate from). False
        where it does nothing (level 0, or a backend that cannot sleep)."""
        level = self.config.vllm_sleep_level
        if not level or not self.backend.can_sleep:
            return False
        if not self.asleep:
            self.backend.sleep(level)
            self.asleep = level
        return True

    def _wake(self) -> None:
        if self.asleep:
            self.backend.wake_up()
            self.weights_lost = self.weights_lost or self.asleep == 2
            self.asleep = 0

    def _usable(self) -> None:
        """Awake, with real weights: never generate from the garbage a level-2 wake leaves."""
        self._wake()
        if self.weights_lost:
            raise RuntimeError(f"generator replica {self.replica} slept at rollout.vllm_sleep_level=2, which discards "
                               f"its weights, and has not been sent a version since (it held {self.version}); it "
                               "generates again after the next weight update")

    def update_weights(self, version: int, payload: dict) -> int:
        self._wake()  # first: vLLM loads into the memory wake_up gives back
        self.backend.load_weights(payload, version)
        self._judge_apart()
        self.version, self.weights_lost = version, False
        return version

    def receive_weights(self, link: Link, rank: int, version: int, join: bool = True) -> int:
        """Take `version` from the channel's collective broadcast; all or nothing, like update_weights."""
        self._wake()
        self.backend.receive_weights(self.weights_endpoint, link, rank, version, join)
        self._judge_apart()
        self.version, self.weights_lost = version, False
        return version

    def _judge_apart(self) -> None:
        """A judge apart from the policy: the version just loaded plus the judge vector."""
        if self.judge_vector is not None:
            from actors import judge_vector as jv

            jv.add(self.backend.model, self.judge_vector)

    def update_weights_from(self, path: str, version: int) -> int:
        """Load a saved model directory (an iteration's snapshot) as weights `version`."""
        from actors import modeling
        from actors.weights import export_state

        return self.update_weights(version, export_state(modeling.load_model(path), version))

    def ping(self) -> int:
        return self.version

    @ray.method(num_returns=2)
    def generate(self, prompts: pa.Table, n: int | None = None, greedy: bool = False, seq: int | None = None,
                 expect_version: int | None = None) -> tuple[pa.Table, dict]:
        """`prompts` has prompt_id and prompt; other columns pass through to every sample.

        `seq` numbers the request within the run: it names the samples (uid `seq.prompt.sample`,
        group `seq.prompt`) and seeds the sampling, so a retried request reproduces its samples.
        Returns the rollout table and a small info dict for the orchestrator."""
        if expect_version is not None and expect_version != self.version:
            raise StaleReplicaError(f"generator replica {self.replica} holds weights version {self.version}, "
                                    f"asked for {expect_version}")
        self._usable()
        start = time.perf_counter()
        cfg = self.config
        n = 1 if greedy else (n or cfg.samples_per_prompt)
        if seq is not None and not greedy:
            import torch
            torch.manual_seed(hash((self.seed, seq)) % 2**63)
        tag = f"{seq}" if seq is not None else uuid.uuid4().hex[:12]
        if self.episodes is not None:  # each sample an episode with the environment
            table, info = self.episodes.generate(prompts, n, greedy, tag, self.version)
            return table, {"rows": table.num_rows, "version": self.version, "busy_s": time.perf_counter() - start, **info}
        texts = prompts.column("prompt").to_pylist()
        extra = {"next_token": self.laser_token} if self.laser_token is not None else {}
        if cfg.stop:
            extra["stop"] = cfg.stop
        out = self.backend.generate(texts, n=n, max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature,
                                    top_p=cfg.top_p, top_k=cfg.top_k, greedy=greedy, **extra)
        extra = laser_columns(out.next_logprobs)  # LaSeR: log pi(z | x, y), where it was asked for
        repeat = np.repeat(np.arange(prompts.num_rows), n)
        sample = np.tile(np.arange(n), prompts.num_rows)
        prompt_lengths = np.array([len(p) for p in out.prompt_ids], dtype=np.int64)
        prompt_ids = B.list_column(np.concatenate(out.prompt_ids) if len(out.prompt_ids) else
                                   np.zeros(0, np.int32), prompt_lengths, pa.int32())
        extra.update({name: prompts.column(name).take(repeat) for name in prompts.schema.names
                      if name not in ("prompt_id", "prompt")})
        table = B.rollout_table(
            uid=[f"{tag}.{g}.{s}" for g, s in zip(repeat, sample)],
            group_id=[f"{tag}.{g}" for g in repeat],
            prompt_id=prompts.column("prompt_id").take(repeat).to_pylist(),
            prompt=[texts[i] for i in repeat],
            response=self.backend.decode(out.response_ids, out.response_lengths) if out.texts is None else out.texts,
            prompt_ids=prompt_ids.take(pa.array(repeat)),
            response_ids=B.list_column(out.response_ids, out.response_lengths, pa.int32()),
            behavior_logprobs=B.list_column(out.logprobs, out.response_lengths, pa.float32()),
            policy_version=self.version,
            finish_reason=out.finish_reason,
            extra=extra,
        )
        info = {"rows": table.num_rows, "version": self.version, "busy_s": time.perf_counter() - start,
                "tokens": int(out.response_lengths.sum())}
        return table, info


    @ray.method(num_returns=2)
    def judge(self, table: pa.Table, expect_version: int | None = None) -> tuple[pa.Table, dict]:
        """The policy judges each (prompt, response) of `table` with the weights it holds, in the
        format of its JudgingSpec (actors/judge_modes.py): appends `reward.<name>`/`reward_error.<name>`
        for every judge reward source and `judge_version`."""
        from actors import judge_modes

        spec = self.judging
        if spec is None:
            raise RuntimeError(f"generator replica {self.replica} was built without a judging spec (its role's "
                               "`judging` argument, which a recipe gives where a reward source is `judge: true`); "
                               "it cannot judge")
        if expect_version is not None and expect_version != self.version:
            raise StaleReplicaError(f"judge replica {self.replica} holds version {self.version}, asked for {expect_version}")
        self._usable()
        start = time.perf_counter()
        prompts, p_err = B.decode_texts(table, "prompt")
        responses, r_err = B.decode_texts(table, "response")
        errors = [pe or re or ("empty response" if r == "" else None) for pe, re, r in zip(p_err, r_err, responses)]
        valid = [i for i, e in enumerate(errors) if e is None]
        groups = table.column("group_id").to_pylist() if "group_id" in table.schema.names else list(range(table.num_rows))
        values = np.full(table.num_rows, np.nan, dtype=np.float32)
        if valid:
            sampling = dict(temperature=self.config.temperature, top_p=self.config.top_p, top_k=self.config.top_k)
            values[valid], why = judge_modes.score(spec, self.backend, [prompts[i] for i in valid],
                                                   [responses[i] for i in valid], [groups[i] for i in valid], sampling)
            for j, i in enumerate(valid):
                errors[i] = why[j]
        info = {"rows": table.num_rows}
        for name in spec.sources:
            table = B.replace_column(table, B.REWARD_PREFIX + name, pa.array(values, pa.float32(), mask=np.isnan(values)))
            table = B.replace_column(table, B.REWARD_ERROR_PREFIX + name, pa.array(errors, pa.string()))
            info[f"errors/{name}"] = sum(e is not None for e in errors)
        table = B.replace_column(table, "judge_version", pa.array(np.full(table.num_rows, self.version, np.int64)))
        info["busy_s"] = time.perf_counter() - start
        for name in spec.sources:
            info[f"seconds/{name}"] = info["busy_s"] / max(len(spec.sources), 1)
        return B.with_version(table), info


GeneratorActor = ray.remote(Generator)
