"""What a jetspec++ checkpoint holds: the draft head (`DraftHead`, block-causal) and the state adapter.

One directory written by `save_head`: `head.safetensors` with the draft head's weights under `draft.`
and the adapter's under `adapter.`, and `config.json` whose head config is the draft head's
`HeadConfig` (drafter "jetspec++") plus an "adapter" entry (`AdapterConfig`, or null for a head
trained without one). A plain `jetspec` head directory loads too (no adapter): that is how the
refinement passes are given to the plain JetSpec head (JetSpec++ Table 12).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import nn

from specbench.drafters.heads.backbone import DraftHead, HeadConfig
from specbench.drafters.heads.checkpoint import HeadCheckpointError, default_head_dir, load_head
from specbench.drafters.jetspecpp.adapter import AdapterConfig, StateAdapter
from specbench.models.target import TargetModel

NAME = "jetspec++"


class JetSpecPPModel(nn.Module):
    """The trainable parts: `draft` (the parallel draft head) and `adapter` (None: no adapter)."""

    def __init__(self, draft: DraftHead, adapter: StateAdapter | None) -> None:
        super().__init__()
        self.draft = draft
        self.adapter = adapter

    def config(self, train: dict[str, Any] | None = None) -> dict[str, Any]:
        cfg = self.draft.config.to_dict()
        if train is not None:
            cfg["train"] = train
        cfg["adapter"] = self.adapter.config.to_dict() if self.adapter is not None else None
        return cfg


def load_jetspecpp(target: TargetModel, checkpoint: str | Path | None = None) -> tuple[DraftHead, StateAdapter | None]:
    """(draft head, adapter or None) from a jetspec++ or jetspec checkpoint directory (default: the
    jetspec++ head shipped for this target)."""
    directory = Path(checkpoint) if checkpoint is not None else default_head_dir(NAME, target.name)
    if checkpoint is None and not directory.is_dir():
        raise HeadCheckpointError(
            f"no trained {NAME!r} head ships for target {target.name!r} (looked in {str(directory)!r}). Train one with "
            f"`specbench train --drafter {NAME} --target {target.name} --data DATA_DIR --out DIR` and pass "
            f"--drafter-arg checkpoint=DIR/heads/{NAME}")
    state, config = load_head(directory, target)
    head = DraftHead(target.config, HeadConfig.from_dict(config))
    if "adapter" not in config:  # a plain draft head (e.g. jetspec): no adapter
        head.load_state_dict(state)
        return head, None
    adapter = StateAdapter(target.config, AdapterConfig.from_dict(config["adapter"])) if config["adapter"] else None
    model = JetSpecPPModel(head, adapter)
    model.load_state_dict(state)
    return head, adapter
