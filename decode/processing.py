"""The target's generation settings, applied at every tree node with transformers' own processors.

**Settings.** A call's ``GenerationConfig`` is resolved as ``target.generate`` resolves its own,
with the decoder's config in between; highest first::

    the call's arguments > its generation_config= > DecodeConfig values that are set
    > target.generation_config > transformers' defaults (greedy; top_k 50, temperature 1, top_p 1)

**Processors.** The ``LogitsProcessorList`` that ``target.generate`` builds for those settings
(the model's ``_get_logits_processor``), in its order. A node's logits give the token after it,
so they are processed with the node's own history: the row's prompt (its real tokens), what the
row emitted so far (the root last) and the tree path down to the node. A repetition penalty,
``no_repeat_ngram_size`` or ``min_new_tokens`` then sees what plain decoding would have seen at
that point: greedy output stays the target's and sampling stays exact. A list whose processors
read the scores alone (temperature, top-k, top-p, suppressed tokens, ...) runs once over every
node of the batch.

**Refused**, one line each: beam search and the other modes (contrastive, DoLa, constrained,
assisted), more than one sequence per prompt, and any processor not known to be a function of
the history and the scores alone (classifier-free guidance, watermarking, ...).
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn
from transformers import GenerationConfig
from transformers.generation import logits_process as lp
from transformers.generation.configuration_utils import GenerationMode

from draftheads.conf.errors import UserError
from draftheads.conf.schema.decode import DecodeConfig

# processors that read the scores only: one call over every node of a batch
SCORES_ONLY = (
    lp.TemperatureLogitsWarper,
    lp.TopKLogitsWarper,
    lp.TopPLogitsWarper,
    lp.MinPLogitsWarper,
    lp.TypicalLogitsWarper,
    lp.EpsilonLogitsWarper,
    lp.EtaLogitsWarper,
    lp.SuppressTokensLogitsProcessor,
    lp.InfNanRemoveLogitsProcessor,
)
# processors that are functions of a row's token history (its length, its tokens) and the scores
HISTORY = (
    lp.RepetitionPenaltyLogitsProcessor,
    lp.NoRepeatNGramLogitsProcessor,
    lp.MinLengthLogitsProcessor,
    lp.MinNewTokensLengthLogitsProcessor,
    lp.NoBadWordsLogitsProcessor,
    lp.SequenceBiasLogitsProcessor,
    lp.SuppressTokensAtBeginLogitsProcessor,
    lp.ExponentialDecayLengthPenalty,
    lp.ForcedBOSTokenLogitsProcessor,
    lp.ForcedEOSTokenLogitsProcessor,
)
LOSSLESS_MODES = (GenerationMode.GREEDY_SEARCH, GenerationMode.SAMPLE)


def resolve(
    target: nn.Module, cfg: DecodeConfig, given: GenerationConfig | None, overrides: dict[str, Any]
) -> GenerationConfig:
    """The call's settings: ``overrides`` (the call's arguments; None = unset) over ``given`` over
    the set values of ``cfg`` over the target's generation config over transformers' defaults."""
    gc = copy.deepcopy(given) if given is not None else GenerationConfig()
    decoder = dict(
        max_new_tokens=cfg.max_new_tokens,
        do_sample=cfg.do_sample,
        temperature=cfg.temperature,
        top_p=cfg.top_p,
        top_k=cfg.top_k,
        stop_strings=cfg.stop,
    )
    model = getattr(target, "generation_config", None)
    try:
        gc.update(**{k: v for k, v in decoder.items() if v is not None}, defaults_only=True)
        if model is not None:
            gc.update(**model.to_dict(), defaults_only=True, allow_custom_entries=True)
        gc.update(**GenerationConfig._get_default_generation_params(), defaults_only=True)
        unknown = gc.update(**{k: v for k, v in overrides.items() if v is not None})
    except ValueError as e:
        raise UserError(f"generation settings: {str(e).splitlines()[0]} (change that setting)") from None
    if unknown:
        raise UserError(
            f"unknown generation setting(s) {', '.join(sorted(unknown))}; use GenerationConfig fields "
            "(e.g. repetition_penalty=1.2, top_k=50)"
        )
    return gc


def check_lossless(gc: GenerationConfig) -> None:
    """Refuse settings the decoder cannot verify against a draft tree without changing the output."""
    mode = gc.get_generation_mode()
    if mode not in LOSSLESS_MODES:
        raise UserError(
            f"generation mode {mode.value} (num_beams={gc.num_beams}) cannot be verified on a draft tree; "
            "the decoder does greedy decoding and sampling: use num_beams=1 without penalty_alpha, "
            "dola_layers or constraints (or call target.generate)"
        )
    if (gc.num_return_sequences or 1) > 1:
        raise UserError(
            f"num_return_sequences={gc.num_return_sequences}: the decoder answers once per prompt; "
            "repeat the prompt in the batch instead"
        )
    if gc.do_sample and (gc.temperature is None or gc.temperature <= 0):
        raise UserError(
            f"temperature={gc.temperature}: must be > 0 when sampling (use do_sample=False for greedy)"
        )


def build(
    target: nn.Module, gc: GenerationConfig, n_prompt: int, max_new: int, device: torch.device
) -> lp.LogitsProcessorList:
    """The processors ``target.generate`` would use for one row of ``n_prompt`` real tokens."""
    gc = copy.deepcopy(gc)
    gc.max_length = n_prompt + max_new  # where a forced EOS goes, as generate sets it
    target._prepare_special_tokens(gc, True, device)
    try:
        processors = target._get_logits_processor(gc, input_ids_seq_length=n_prompt, device=device)
    except ValueError as e:
        raise UserError(f"generation settings: {str(e).splitlines()[0]} (change that setting)") from None
    for p in processors:
        if not isinstance(p, SCORES_ONLY + HISTORY):
            raise UserError(
                f"the generation setting behind {type(p).__name__} cannot be applied losslessly on a "
                "draft tree; unset it (or call target.generate)"
            )
    return processors


def node_paths(tokens: list[int], parents: list[int]) -> list[list[int]]:
    """Per node of one row's tree, the tokens from below the root down to the node itself."""
    paths: list[list[int]] = [[]]
    for i in range(1, len(tokens)):
        paths.append([*paths[parents[i]], tokens[i]])
    return paths


def acceptance_setting(gc: GenerationConfig) -> tuple:
    """What of a call's settings the drafts' acceptance depends on: greedy, or sampling with the
    warpers that shape the distribution a draft is accepted from (a draft the target takes at
    temperature 0.7 it may well not at 1.0), as a key for what the planner learned."""
    if not gc.do_sample:
        return ("greedy",)
    return ("sampling", gc.temperature, gc.top_k, gc.top_p, gc.min_p, gc.typical_p)


class Processing:
    """The call's logits processors (one list per prompt length) and their application to a tree."""

    def __init__(
        self,
        target: nn.Module,
        gc: GenerationConfig,
        prompt_lens: list[int],
        max_new: int,
        device: torch.device,
    ) -> None:
        self.sample = bool(gc.do_sample)
        self.setting = acceptance_setting(gc)
        self.prompt_lens = prompt_lens  # per input row: its real prompt tokens
        self.lists = {n: build(target, gc, n, max_new, device) for n in sorted(set(prompt_lens))}
        every = [p for lst in self.lists.values() for p in lst]
        self.active = bool(every)
        self.scores_only = all(isinstance(p, SCORES_ONLY) for p in every)

    def __call__(
        self,
        logits: torch.Tensor,
        rows: list[int],
        histories: list[list[int]],
        tokens: torch.Tensor,
        parents: torch.Tensor,
    ) -> torch.Tensor:
        """Processed scores ``[B, T, V]`` of every node of a tree (``logits`` unchanged when no
        processor is set). ``rows``: each active row's input row; ``histories``: its prompt and
        emitted tokens, the root last; ``tokens``/``parents``: the tree ``[B, T]``."""
        if not self.active:
            return logits
        scores = logits.float()
        if self.scores_only:
            processors = next(iter(self.lists.values()))  # the same for every prompt length
            flat = processors(tokens.reshape(-1, 1), scores.reshape(-1, scores.shape[-1]))
            return flat.reshape(scores.shape)
        out = scores.clone()
        for i, (b, toks, pars) in enumerate(zip(rows, tokens.tolist(), parents.tolist())):
            processors = self.lists[self.prompt_lens[b]]
            paths = node_paths(toks, pars)
            for depth in sorted({len(p) for p in paths}):
                nodes = [j for j, p in enumerate(paths) if len(p) == depth]
                ids = torch.tensor([histories[i] + paths[j] for j in nodes], device=logits.device)
                out[i, nodes] = processors(ids, scores[i, nodes])
        return out
