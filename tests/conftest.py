"""Shared fixtures: tiny random targets (one per architecture) and the real SmolLM2."""

from __future__ import annotations

import os
import tempfile

os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# verify-cost curves measured by tests stay out of the user's cache
os.environ.setdefault("DRAFTHEADS_COST_CACHE", tempfile.mkdtemp(prefix="draftheads-cost-"))

import pytest  # noqa: E402
import torch  # noqa: E402

# Tests run tiny models: many small ops, where one intra-op thread is up to 10x faster than
# two on a busy 2-core machine; under xdist two workers share the two cores anyway.
torch.set_num_threads(1)

from draftheads.conf.schema.heads import TargetConfig  # noqa: E402
from draftheads.heads.target.fingerprint import fingerprint  # noqa: E402
from draftheads.heads.target.load import load_target  # noqa: E402
from tests.engine_skips import pytest_runtest_makereport  # noqa: E402, F401  (CI: an engine skip fails)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The slow tests first (stable otherwise): under xdist the quick ones then fill both workers
    to the end, instead of one worker finishing a long test while the other idles."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


TINY_KINDS = ["llama", "mistral", "qwen2", "gpt2"]
_cache: dict[str, tuple] = {}


def get_target(kind: str):
    """(model, tokenizer) for ``tiny-<kind>`` or ``smollm2``, loaded once per process."""
    if kind not in _cache:
        cfg = TargetConfig() if kind == "smollm2" else TargetConfig(name_or_path=f"tiny-{kind}", tiny=kind)
        _cache[kind] = load_target(cfg)
    return _cache[kind]


@pytest.fixture(scope="session")
def tokenizer():
    return get_target("llama")[1]


@pytest.fixture(params=TINY_KINDS)
def tiny(request):
    """Each tiny architecture in turn: (kind, model, tokenizer, fingerprint)."""
    model, tok = get_target(request.param)
    return request.param, model, tok, fingerprint(model, tok)


@pytest.fixture(scope="session")
def tiny_llama():
    model, tok = get_target("llama")
    return model, tok, fingerprint(model, tok)


@pytest.fixture(scope="session")
def smollm2():
    return get_target("smollm2")
